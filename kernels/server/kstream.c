/*
 * kstream.c — output coalescing, see kstream.h.
 */
#include "kernels/server/kstream.h"
#include "common/cm_utf8.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jp.h"

int kstream_init(kstream *s, const char *name)
{
    memset(s, 0, sizeof *s);
    s->name = name;
    s->buf = malloc(KSTREAM_CHUNK + 4);
    return s->buf ? 0 : -1;
}

void kstream_clear(kstream *s)
{
    free(s->buf);
    memset(s, 0, sizeof *s);
}

long kstream_read(kstream *s, int fd, uint64_t now_ns)
{
    if (s->len >= KSTREAM_CHUNK)
        return -1;
    ssize_t n;
    do {
        n = read(fd, s->buf + s->len, KSTREAM_CHUNK - s->len);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? -1 : -2;
    if (n > 0 && s->len == 0)
        s->first_ns = now_ns;
    s->len += (size_t)n;
    return (long)n;
}

int kstream_due(const kstream *s, uint64_t now_ns)
{
    if (s->len == 0)
        return 0;
    return s->len >= KSTREAM_CHUNK || now_ns >= s->first_ns + KSTREAM_DELAY_NS;
}

uint64_t kstream_deadline(const kstream *s)
{
    if (s->len == 0)
        return 0;
    return s->len >= KSTREAM_CHUNK ? s->first_ns : s->first_ns + KSTREAM_DELAY_NS;
}

char *kstream_take(kstream *s, int final, uint64_t now_ns)
{
    size_t n = final ? s->len : cm_utf8_complete_prefix(s->buf, s->len);
    if (n == 0) {
        /* Only the start of a character cut in two is left: hold it for the
         * rest (a final flush publishes it as U+FFFD if the rest never
         * comes), and restart the clock so the timer does not spin. */
        if (s->len)
            s->first_ns = now_ns;
        return NULL;
    }
    char *text = cm_utf8_sanitize(s->buf, n, NULL);
    if (!text)
        return NULL; /* out of memory: keep the bytes, try again later */
    memmove(s->buf, s->buf + n, s->len - n);
    s->len -= n;
    if (s->len)
        s->first_ns = now_ns;
    return text;
}
