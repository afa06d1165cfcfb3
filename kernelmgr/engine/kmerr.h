/*
 * kmerr.h — kernelmgr's one error type: a KM_E* code and its message. Every
 * kernelmgr/ function that can fail with a reason takes a km_err * and fills
 * it with km_err_set; the daemon maps the code to its JSON-RPC error in one
 * place (rpc_error_km, service/rpc.c) and the CLI exits with it.
 */
#ifndef KERNELMGR_KMERR_H
#define KERNELMGR_KMERR_H

/* Error codes; also the CLI's exit status for them. 1 is "a block failed". */
enum {
    KM_OK = 0,
    KM_EUSAGE = 2,     /* bad arguments or configuration */
    KM_ENOSESSION = 3, /* no such session */
    KM_EKERNEL = 4,    /* a kernel could not be started */
    KM_EDAEMON = 5,    /* the daemon could not be reached / started */
    KM_EINTERNAL = 6,  /* I/O error, out of memory */
    KM_EOUTPUT = 7,    /* the CLI's output could not be written (EPIPE, ENOSPC, EIO) */
};

typedef struct km_err {
    int code;
    char msg[1024];
} km_err;

/* Sets *e (when e is not NULL) to code and the formatted message, cut to
 * its buffer; returns code. The one way to fill a km_err. */
int km_err_set(km_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
