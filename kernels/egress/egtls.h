/*
 * egtls.h — the server name (SNI) of a TLS ClientHello, read by the egress
 * proxy from the first bytes a client sends through a CONNECT tunnel, so
 * that a tunnel opened to an allowed name cannot carry a handshake for
 * another one.
 *
 * Only what the proxy needs: the first TLS record must be a handshake record
 * holding the whole ClientHello (every client sends it that way; one record
 * carries up to 16 KiB); the host_name of the server_name extension is
 * returned as sent. Pure C, no I/O (tests/unit/test_eg_policy.c).
 */
#ifndef KERNELS_EGRESS_EGTLS_H
#define KERNELS_EGRESS_EGTLS_H

#include <stddef.h>

/* The most bytes the first record may take (header + 16 KiB + slack). */
#define EGTLS_RECORD_MAX (5 + 16384 + 2048)

typedef enum egtls_rc {
    EGTLS_SNI = 1,      /* a ClientHello with a host_name: written to sni */
    EGTLS_NO_SNI = 0,   /* a ClientHello without one */
    EGTLS_MORE = -1,    /* not all of the first record yet */
    EGTLS_NOT_TLS = -2, /* not a TLS handshake record holding a ClientHello */
    EGTLS_BAD = -3,     /* a malformed ClientHello or server_name */
} egtls_rc;

/* Parses len bytes from the start of a TLS stream. sni gets the host name
 * (NUL-terminated; at most snilen - 1 bytes, else EGTLS_BAD). */
egtls_rc egtls_client_hello_sni(const unsigned char *buf, size_t len, char *sni, size_t snilen);

/* borrowed static: a few words for rc, for logs and refusals. */
const char *egtls_rc_text(egtls_rc rc);

#endif
