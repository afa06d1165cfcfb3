/*
 * cm_termsafe.c — the terminal escaper, see cm_termsafe.h.
 */
#include "common/cm_termsafe.h"
#include "common/cm_utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SGR_MAX 64

typedef struct obuf {
    char *p;
    size_t len, cap;
    int oom;
} obuf;

static void put(obuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* Length of an SGR sequence ESC [ [0-9;:]* m at s[0..n), or 0. */
static size_t sgr_len(const char *s, size_t n)
{
    if (n < 3 || s[0] != '\033' || s[1] != '[')
        return 0;
    for (size_t i = 2; i < n && i < SGR_MAX; i++) {
        if (s[i] == 'm')
            return i + 1;
        if (!((s[i] >= '0' && s[i] <= '9') || s[i] == ';' || s[i] == ':'))
            return 0;
    }
    return 0;
}

char *termsafe_escape(const char *s, size_t len, int flags, size_t *outlen, int *kept_sgr)
{
    obuf b = {NULL, 0, 0, 0};
    put(&b, "", 0);
    if (kept_sgr)
        *kept_sgr = 0;
    size_t i = 0;
    char esc[16];
    while (i < len && !b.oom) {
        /* a run of plain printable ASCII goes out in one piece */
        size_t j = i;
        while (j < len && (unsigned char)s[j] >= 0x20 && (unsigned char)s[j] < 0x7f &&
               !(s[j] == '\\' && (flags & TERMSAFE_NAME)))
            j++;
        if (j > i) {
            put(&b, s + i, j - i);
            i = j;
            continue;
        }
        unsigned char c = (unsigned char)s[i];
        if (c == '\033' && (flags & TERMSAFE_KEEP_SGR)) {
            size_t n = sgr_len(s + i, len - i);
            if (n) {
                put(&b, s + i, n);
                if (kept_sgr)
                    *kept_sgr = 1;
                i += n;
                continue;
            }
        }
        if (c == '\\') { /* only reached with TERMSAFE_NAME */
            put(&b, "\\\\", 2);
            i++;
            continue;
        }
        if ((c == '\n' || c == '\t') && !(flags & TERMSAFE_NAME)) {
            put(&b, s + i, 1);
            i++;
            continue;
        }
        if (c < 0x80) {
            const char *name = c == '\033' ? "\\e"
                               : c == '\n' ? "\\n"
                               : c == '\t' ? "\\t"
                               : c == '\r' ? "\\r"
                               : c == '\b' ? "\\b"
                                           : NULL;
            if (name) {
                put(&b, name, 2);
            } else {
                snprintf(esc, sizeof esc, "\\x%02x", c);
                put(&b, esc, 4);
            }
            i++;
            continue;
        }
        uint32_t cp = 0;
        size_t n = cm_utf8_decode(s + i, len - i, &cp);
        if (!n) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            put(&b, esc, 4);
            i++;
            continue;
        }
        if (cp <= 0x9f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) {
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
            put(&b, esc, 6);
        } else {
            put(&b, s + i, n);
        }
        i += n;
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (outlen)
        *outlen = b.len;
    return b.p;
}

int termsafe_fputs(FILE *f, const char *s, int flags)
{
    if (!s)
        return 0;
    int sgr = 0;
    size_t n = 0;
    char *e = termsafe_escape(s, strlen(s), flags, &n, &sgr);
    if (!e) {
        fputs("[kernelmgr: output not shown: out of memory]", f);
        return 0;
    }
    fwrite(e, 1, n, f);
    free(e);
    return sgr;
}
