/*
 * cm_utf8.c — UTF-8 validation, decoding and repair (cm_utf8.h).
 */
#include "common/cm_utf8.h"

#include <stdlib.h>
#include <string.h>

/* Length of the sequence that lead byte c starts (0 when c cannot start one),
 * and the allowed range of the second byte, which is where overlongs,
 * surrogates and code points above U+10FFFF are excluded (RFC 3629 table). */
static int utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xbf;
    if (c < 0x80)
        return 1;
    if (c < 0xc2)
        return 0; /* continuation byte or overlong 2-byte lead */
    if (c < 0xe0)
        return 2;
    if (c < 0xf0) {
        if (c == 0xe0)
            *lo = 0xa0;
        else if (c == 0xed)
            *hi = 0x9f;
        return 3;
    }
    if (c < 0xf5) {
        if (c == 0xf0)
            *lo = 0x90;
        else if (c == 0xf4)
            *hi = 0x8f;
        return 4;
    }
    return 0;
}

/* Number of bytes at p[0..len) that form a valid prefix of the sequence
 * started at p[0]; *need gets the full length (0 for an invalid lead). */
static size_t utf8_match(const unsigned char *p, size_t len, int *need)
{
    unsigned char lo, hi;
    int n = utf8_lead(p[0], &lo, &hi);
    *need = n;
    if (n <= 1)
        return (size_t)n;
    size_t got = 1;
    while (got < (size_t)n && got < len) {
        unsigned char c = p[got];
        if (got == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf))
            break;
        got++;
    }
    return got;
}

size_t cm_utf8_decode(const void *buf, size_t len, uint32_t *cp)
{
    const unsigned char *p = buf;
    int need;
    if (!buf || !len)
        return 0;
    if (utf8_match(p, len, &need) != (size_t)need || need == 0)
        return 0;
    uint32_t v = need == 1 ? p[0] : (uint32_t)(p[0] & (0xff >> (need + 1)));
    for (int i = 1; i < need; i++)
        v = (v << 6) | (p[i] & 0x3f);
    if (cp)
        *cp = v;
    return (size_t)need;
}

int cm_utf8_valid(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    size_t i = 0;
    if (!buf && len)
        return 0;
    while (i < len) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int need;
        size_t got = utf8_match(p + i, len - i, &need);
        if (need == 0 || got != (size_t)need)
            return 0;
        i += got;
    }
    return 1;
}

char *cm_utf8_sanitize(const void *buf, size_t len, size_t *out_len)
{
    const unsigned char *p = buf;
    if (!buf)
        len = 0;
    /* Worst case: every byte becomes a 3-byte U+FFFD. */
    if (len > (SIZE_MAX - 1) / 3)
        return NULL;
    char *out = malloc(len * 3 + 1);
    if (!out)
        return NULL;
    size_t o = 0, i = 0;
    while (i < len) {
        if (p[i] != 0 && p[i] < 0x80) {
            out[o++] = (char)p[i++];
            continue;
        }
        int need;
        size_t got = p[i] == 0 ? 1 : utf8_match(p + i, len - i, &need);
        if (p[i] != 0 && need != 0 && got == (size_t)need) {
            memcpy(out + o, p + i, got);
            o += got;
            i += got;
            continue;
        }
        /* One U+FFFD per maximal invalid subpart, as Python's
         * errors="replace" does, so both sides agree on the text. */
        out[o++] = (char)0xef;
        out[o++] = (char)0xbf;
        out[o++] = (char)0xbd;
        i += got ? got : 1;
    }
    out[o] = '\0';
    if (out_len)
        *out_len = o;
    return out;
}

size_t cm_utf8_complete_prefix(const void *buf, size_t len)
{
    const unsigned char *p = buf;
    if (!buf || len == 0)
        return 0;
    /* Find the last byte that is not a continuation byte, at most 3 back. */
    size_t back = 0;
    while (back < 4 && back < len) {
        unsigned char c = p[len - 1 - back];
        if ((c & 0xc0) != 0x80)
            break;
        back++;
    }
    if (back == len || back == 4)
        return len; /* only continuation bytes: invalid, never completes */
    size_t start = len - 1 - back;
    int need;
    size_t got = utf8_match(p + start, len - start, &need);
    /* Cut only when the tail is a valid but unfinished sequence: that is the
     * only case where more bytes can complete it. */
    if (need > 1 && got == len - start && got < (size_t)need)
        return start;
    return len;
}
