/*
 * klib_b64.c — base64 (RFC 4648, standard alphabet, padded), for
 * files.read and files.write with "encoding": "base64".
 */
#include "libkernelmgr/klib_int.h"

#include <stdlib.h>

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *klib_b64_encode(const void *data, size_t n)
{
    const unsigned char *p = data;
    if (n > ((size_t)-1) / 4 * 3 - 3)
        return NULL;
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (!out)
        return NULL;
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        out[o++] = alphabet[v >> 18 & 63];
        out[o++] = alphabet[v >> 12 & 63];
        out[o++] = alphabet[v >> 6 & 63];
        out[o++] = alphabet[v & 63];
    }
    if (n - i == 1) {
        unsigned v = (unsigned)p[i] << 16;
        out[o++] = alphabet[v >> 18 & 63];
        out[o++] = alphabet[v >> 12 & 63];
        out[o++] = '=';
        out[o++] = '=';
    } else if (n - i == 2) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8;
        out[o++] = alphabet[v >> 18 & 63];
        out[o++] = alphabet[v >> 12 & 63];
        out[o++] = alphabet[v >> 6 & 63];
        out[o++] = '=';
    }
    out[o] = 0;
    return out;
}

static int value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

long long klib_b64_decode(const char *s, size_t n, unsigned char *out)
{
    if (n % 4)
        return -1;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 4) {
        int last = i + 4 == n;
        int pad = last && s[i + 3] == '=' ? (s[i + 2] == '=' ? 2 : 1) : 0;
        int a = value(s[i]), b = value(s[i + 1]);
        int c = pad == 2 ? 0 : value(s[i + 2]);
        int d = pad ? 0 : value(s[i + 3]);
        if (a < 0 || b < 0 || c < 0 || d < 0)
            return -1;
        unsigned v = (unsigned)a << 18 | (unsigned)b << 12 | (unsigned)c << 6 | (unsigned)d;
        /* the bits padding leaves over must be zero (canonical form) */
        if ((pad == 2 && (v & 0xffff)) || (pad == 1 && (v & 0xff)))
            return -1;
        out[o++] = (unsigned char)(v >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(v >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)v;
    }
    return (long long)o;
}
