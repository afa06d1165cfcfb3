/*
 * cm_size.c — sizes in bytes: one grammar (see cm_size.h).
 */
#include "common/cm_size.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define SHOWN 40 /* bytes of the offending text an error quotes */

static int fail(char *err, size_t errlen, int e, const char *s, const char *why)
{
    if (err && errlen)
        snprintf(err, errlen, "size '%.*s%s': %s", SHOWN, s ? s : "",
                 s && strlen(s) > SHOWN ? "..." : "", why);
    errno = e;
    return -1;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static char upper(char c)
{
    return c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
}

int cm_size_parse(const char *s, uint64_t *out, char *err, size_t errlen)
{
    static const char *const usage =
        "not a size (a number with an optional unit B, K, M, G or T, e.g. 512M, 1.5G, 2 GB)";
    if (!s || !is_digit(*s))
        return fail(err, errlen, EINVAL, s, usage);
    const char *p = s;
    uint64_t whole = 0;
    for (; is_digit(*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return fail(err, errlen, ERANGE, s, "too large (at most 16 EiB - 1 bytes)");
        whole = whole * 10 + d;
    }
    /* the fraction as num / den, its digits beyond 10^18 dropped (below a byte) */
    uint64_t num = 0, den = 1;
    int has_frac = 0;
    if (*p == '.') {
        p++;
        if (!is_digit(*p))
            return fail(err, errlen, EINVAL, s, usage);
        has_frac = 1;
        for (; is_digit(*p); p++)
            if (den < 1000000000000000000ull) {
                num = num * 10 + (uint64_t)(*p - '0');
                den *= 10;
            }
    }
    const char *num_end = p;
    while (*p == ' ')
        p++;
    unsigned shift = 0;
    if (*p) {
        switch (upper(*p)) {
        case 'B':
            break;
        case 'K':
            shift = 10;
            break;
        case 'M':
            shift = 20;
            break;
        case 'G':
            shift = 30;
            break;
        case 'T':
            shift = 40;
            break;
        default:
            return fail(err, errlen, EINVAL, s, "unknown unit (B, K, M, G or T, e.g. 512M)");
        }
        p++;
        if (shift && (*p == 'i' || *p == 'I'))
            p++;
        if (shift && upper(*p) == 'B')
            p++;
        if (*p)
            return fail(err, errlen, EINVAL, s, "text after the unit");
    } else if (p != num_end) {
        return fail(err, errlen, EINVAL, s, "a space with no unit after it");
    }
    if (has_frac && !shift)
        return fail(err, errlen, EINVAL, s, "a fraction of a byte (give a unit: K, M, G or T)");
    if (shift && whole > (UINT64_MAX >> shift))
        return fail(err, errlen, ERANGE, s, "too large (at most 16 EiB - 1 bytes)");
    uint64_t bytes = whole << shift;
    /* num < 10^18 < 2^60 and shift <= 40: the product fits in 128 bits */
    uint64_t part = (uint64_t)(((unsigned __int128)num << shift) / den);
    if (bytes > UINT64_MAX - part)
        return fail(err, errlen, ERANGE, s, "too large (at most 16 EiB - 1 bytes)");
    *out = bytes + part;
    return 0;
}

const char *cm_size_format(uint64_t n, char *buf, size_t len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (!buf || !len)
        return buf;
    if (n < 1024) {
        snprintf(buf, len, "%llu bytes", (unsigned long long)n);
        return buf;
    }
    double v = (double)n;
    int u = -1;
    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (v == (double)(uint64_t)v)
        snprintf(buf, len, "%llu %s", (unsigned long long)v, units[u]);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}
