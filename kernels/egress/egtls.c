/*
 * egtls.c — the SNI of a TLS ClientHello (see egtls.h).
 */
#include "kernels/egress/egtls.h"

#include <string.h>

typedef struct rd {
    const unsigned char *p;
    size_t left;
} rd;

static int take(rd *r, size_t n, const unsigned char **out)
{
    if (r->left < n)
        return -1;
    if (out)
        *out = r->p;
    r->p += n;
    r->left -= n;
    return 0;
}

static int u8(rd *r, size_t *v)
{
    const unsigned char *b;
    if (take(r, 1, &b))
        return -1;
    *v = b[0];
    return 0;
}

static int u16(rd *r, size_t *v)
{
    const unsigned char *b;
    if (take(r, 2, &b))
        return -1;
    *v = (size_t)b[0] << 8 | b[1];
    return 0;
}

/* A sub-reader over the next n bytes of r. */
static int sub(rd *r, size_t n, rd *s)
{
    const unsigned char *b;
    if (take(r, n, &b))
        return -1;
    s->p = b;
    s->left = n;
    return 0;
}

egtls_rc egtls_client_hello_sni(const unsigned char *buf, size_t len, char *sni, size_t snilen)
{
    if (len >= 1 && buf[0] != 0x16)
        return EGTLS_NOT_TLS;
    if (len >= 2 && buf[1] != 0x03)
        return EGTLS_NOT_TLS;
    if (len < 5)
        return EGTLS_MORE;
    size_t rlen = (size_t)buf[3] << 8 | buf[4];
    if (rlen < 4 || rlen > EGTLS_RECORD_MAX - 5)
        return EGTLS_NOT_TLS;
    if (len < 5 + rlen)
        return EGTLS_MORE;
    rd rec = {buf + 5, rlen}, hs;
    size_t type, l1, l2, hlen;
    if (u8(&rec, &type) || type != 1)
        return EGTLS_NOT_TLS;
    if (u8(&rec, &l1) || u16(&rec, &l2))
        return EGTLS_BAD;
    hlen = l1 << 16 | l2;
    if (sub(&rec, hlen, &hs))
        return EGTLS_BAD; /* the ClientHello does not fit in the first record */
    size_t n;
    if (take(&hs, 2 + 32, NULL) || u8(&hs, &n) || take(&hs, n, NULL) || u16(&hs, &n) ||
        take(&hs, n, NULL) || u8(&hs, &n) || take(&hs, n, NULL))
        return EGTLS_BAD;
    if (hs.left == 0)
        return EGTLS_NO_SNI; /* no extensions at all */
    rd exts;
    if (u16(&hs, &n) || sub(&hs, n, &exts))
        return EGTLS_BAD;
    int seen = 0;
    while (exts.left) {
        size_t et, el;
        rd ext;
        if (u16(&exts, &et) || u16(&exts, &el) || sub(&exts, el, &ext))
            return EGTLS_BAD;
        if (et != 0)
            continue;
        if (seen++)
            return EGTLS_BAD; /* two server_name extensions */
        rd list;
        if (u16(&ext, &n) || sub(&ext, n, &list) || ext.left)
            return EGTLS_BAD;
        int names = 0;
        while (list.left) {
            size_t nt, nl;
            const unsigned char *name;
            if (u8(&list, &nt) || u16(&list, &nl) || take(&list, nl, &name))
                return EGTLS_BAD;
            if (nt != 0)
                continue;
            if (names++ || nl == 0 || nl >= snilen || memchr(name, 0, nl))
                return EGTLS_BAD; /* one host_name, not empty, no NUL */
            memcpy(sni, name, nl);
            sni[nl] = 0;
        }
        if (!names)
            return EGTLS_BAD;
    }
    return seen ? EGTLS_SNI : EGTLS_NO_SNI;
}

const char *egtls_rc_text(egtls_rc rc)
{
    switch (rc) {
    case EGTLS_SNI:
        return "a TLS ClientHello with a server name";
    case EGTLS_NO_SNI:
        return "a TLS ClientHello without a server name";
    case EGTLS_MORE:
        return "an incomplete TLS record";
    case EGTLS_NOT_TLS:
        return "not a TLS ClientHello";
    case EGTLS_BAD:
        return "a malformed TLS ClientHello";
    }
    return "?";
}
