/*
 * cm_io.c — whole reads and writes on file descriptors (see cm_io.h).
 */
#include "common/cm_io.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

int cm_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

ssize_t cm_read_full(int fd, void *buf, size_t len)
{
    char *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t r = read(fd, p + got, len - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

int cm_read_all(int fd, size_t max, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    if (max >= (size_t)SSIZE_MAX - 1) {
        errno = EINVAL;
        return -1;
    }
    size_t cap = max + 2 < 4096 ? max + 2 : 4096, got = 0;
    char *buf = malloc(cap);
    if (!buf) {
        errno = ENOMEM;
        return -1;
    }
    for (;;) {
        if (got == cap - 1) { /* room for the NUL and at least one byte */
            size_t ncap = cap * 2 < max + 2 ? cap * 2 : max + 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                errno = ENOMEM;
                return -1;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + got, cap - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            errno = e;
            return -1;
        }
        if (r == 0)
            break;
        got += (size_t)r;
        if (got > max) {
            free(buf);
            errno = EFBIG;
            return -1;
        }
    }
    buf[got] = '\0';
    *data = buf;
    *len = got;
    return 0;
}
