/*
 * jp_util.c — errors, uuids, timestamps, UTF-8 and frame helpers of the
 * Jupyter wire-protocol library.
 */
#include "jp_internal.h"
#include "common/cm_io.h"

#include <errno.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- errors */

static const char *const jp_status_names[JP_ERR__COUNT] = {
    [JP_OK] = "ok",
    [JP_ERR_NOMEM] = "out of memory",
    [JP_ERR_ARG] = "invalid argument",
    [JP_ERR_AGAIN] = "resource temporarily unavailable",
    [JP_ERR_ZMQ] = "zeromq error",
    [JP_ERR_IO] = "i/o error",
    [JP_ERR_TOO_MANY_FRAMES] = "too many frames",
    [JP_ERR_TOO_LARGE] = "message too large",
    [JP_ERR_NO_DELIMITER] = "no <IDS|MSG> delimiter",
    [JP_ERR_FRAME_COUNT] = "too few frames",
    [JP_ERR_SIG_LENGTH] = "malformed signature",
    [JP_ERR_SIG_MISMATCH] = "signature mismatch",
    [JP_ERR_REPLAY] = "replayed message",
    [JP_ERR_UTF8] = "invalid utf-8",
    [JP_ERR_JSON] = "malformed json",
    [JP_ERR_FIELD_MISSING] = "missing field",
    [JP_ERR_FIELD_TYPE] = "field has wrong type",
    [JP_ERR_SCHEME] = "unsupported signature scheme",
    [JP_ERR_CONNFILE] = "invalid connection file",
};

const char *jp_strerror(jp_status code)
{
    if ((int)code < 0 || code >= JP_ERR__COUNT)
        return "unknown error";
    return jp_status_names[code];
}

jp_status jp_error_set(jp_error *err, jp_status code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err->reason, sizeof err->reason, fmt, ap);
    va_end(ap);
    /* The header promises a non-empty reason on error. */
    if (n <= 0 || err->reason[0] == '\0')
        snprintf(err->reason, sizeof err->reason, "%s", jp_strerror(code));
    return code;
}

void jp_error_clear(jp_error *err)
{
    if (err) {
        err->code = JP_OK;
        err->reason[0] = '\0';
    }
}

int jp_sodium_ready(void)
{
    /* sodium_init() is idempotent and thread-safe; 1 means "already done". */
    return sodium_init() < 0 ? -1 : 0;
}

/* ---------------------------------------------------------------- ids, time */

/* Message ids are made for every message sent: take them from a per-thread
 * pool of random bytes (one getrandom() per 64 ids instead of one per id).
 * A forked child empties the pool, so parent and child never share ids. */
#define JP_UUID_POOL 1024
static __thread unsigned char jp_uuid_pool[JP_UUID_POOL];
static __thread size_t jp_uuid_left;
static pthread_once_t jp_uuid_once = PTHREAD_ONCE_INIT;

static void jp_uuid_after_fork(void)
{
    sodium_memzero(jp_uuid_pool, sizeof jp_uuid_pool);
    jp_uuid_left = 0;
}

static void jp_uuid_init(void)
{
    pthread_atfork(NULL, NULL, jp_uuid_after_fork);
}

static void jp_uuid_random(unsigned char b[16])
{
    pthread_once(&jp_uuid_once, jp_uuid_init);
    if (jp_uuid_left < 16) {
        randombytes_buf(jp_uuid_pool, sizeof jp_uuid_pool);
        jp_uuid_left = sizeof jp_uuid_pool;
    }
    unsigned char *p = jp_uuid_pool + sizeof jp_uuid_pool - jp_uuid_left;
    memcpy(b, p, 16);
    sodium_memzero(p, 16); /* an id once handed out is not kept */
    jp_uuid_left -= 16;
}

void jp_uuid4(char out[37])
{
    unsigned char b[16];
    if (jp_sodium_ready() == 0) {
        jp_uuid_random(b);
    } else {
        /* Without libsodium there is no CSPRNG we trust; ids only need to be
         * unique, so fall back to the clock and address entropy. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long x = (unsigned long long)ts.tv_nsec ^
                               ((unsigned long long)ts.tv_sec << 20) ^
                               (unsigned long long)(uintptr_t)out;
        for (size_t i = 0; i < sizeof b; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            b[i] = (unsigned char)(x >> 56);
        }
    }
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* version 4 */
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[o++] = '-';
        out[o++] = hex[b[i] >> 4];
        out[o++] = hex[b[i] & 0x0f];
    }
    out[o] = '\0';
}

void jp_now_iso8601(char out[32])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    /* jupyter_client's extract_dates accepts exactly this shape (microseconds
     * and "Z"); dateutil turns it into an aware UTC datetime. */
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    if (n != 19) /* years beyond 9999: not a date anyone will parse */
        snprintf(out, 32, "9999-12-31T23:59:59");
    unsigned us = (unsigned)(ts.tv_nsec / 1000) % 1000000u;
    snprintf(out + 19, 32 - 19, ".%06uZ", us);
}

/* n decimal digits at s into *v; 0 or -1 */
static int iso_digits(const char *s, int n, int *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        *v = *v * 10 + (s[i] - '0');
    }
    return 0;
}

int jp_iso8601_parse(const char *s, double *epoch_s)
{
    int y, mo, d, h, mi, sec;
    if (!s || strlen(s) < 19 || iso_digits(s, 4, &y) || s[4] != '-' || iso_digits(s + 5, 2, &mo) ||
        s[7] != '-' || iso_digits(s + 8, 2, &d) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
        iso_digits(s + 11, 2, &h) || s[13] != ':' || iso_digits(s + 14, 2, &mi) || s[16] != ':' ||
        iso_digits(s + 17, 2, &sec))
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    const char *p = s + 19;
    double frac = 0;
    if (*p == '.' || *p == ',') {
        double scale = 0.1;
        if (p[1] < '0' || p[1] > '9')
            return -1;
        for (p++; *p >= '0' && *p <= '9'; p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    int offset = 0; /* seconds east of UTC */
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om;
        int sign = *p == '-' ? -1 : 1;
        if (iso_digits(p + 1, 2, &oh))
            return -1;
        p += 3;
        if (*p == ':')
            p++;
        if (iso_digits(p, 2, &om) || oh > 23 || om > 59)
            return -1;
        p += 2;
        offset = sign * (oh * 3600 + om * 60);
    }
    if (*p)
        return -1;
    struct tm tm = {.tm_year = y - 1900,
                    .tm_mon = mo - 1,
                    .tm_mday = d,
                    .tm_hour = h,
                    .tm_min = mi,
                    .tm_sec = sec};
    time_t t = timegm(&tm);
    *epoch_s = (double)t - offset + frac;
    return 0;
}

int jp_write_all(int fd, const void *buf, size_t len)
{
    return cm_write_all(fd, buf, len);
}

/* ---------------------------------------------------------------- frames */

void jp_frames_free(jp_frame **frames, size_t n)
{
    if (!frames || !*frames)
        return;
    for (size_t i = 0; i < n; i++)
        free((*frames)[i].data);
    free(*frames);
    *frames = NULL;
}
