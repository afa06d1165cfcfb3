/*
 * cm_io.c — whole reads and writes on file descriptors (see cm_io.h).
 */
#include "common/cm_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

int cm_read_regular(const char *path, size_t max, unsigned flags, char **data, size_t *len,
                    const char **why)
{
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        *why = errno == ELOOP ? "is a symbolic link" : strerror(errno);
        return -1;
    }
    struct stat st;
    int e = 0;
    if (fstat(fd, &st)) {
        e = errno;
        *why = strerror(e);
    } else if (!S_ISREG(st.st_mode)) {
        e = EINVAL;
        *why = "is not a regular file";
    } else if ((uint64_t)st.st_size > (uint64_t)max) {
        e = EFBIG;
        *why = "is larger than the limit";
    } else if ((flags & CM_RR_OWNED) && st.st_uid != geteuid()) {
        e = EPERM;
        *why = "is not owned by this user";
    } else if ((flags & CM_RR_OWNED) && (st.st_mode & (S_IWGRP | S_IWOTH))) {
        e = EPERM;
        *why = "is writable by group or others";
    }
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    /* a regular file: O_NONBLOCK does not apply to its reads; it may still
     * grow after the fstat, which cm_read_all's bound catches */
    if (cm_read_all(fd, max, data, len)) {
        e = errno;
        *why = e == EFBIG ? "is larger than the limit" : strerror(e);
        close(fd);
        errno = e;
        return -1;
    }
    close(fd);
    return 0;
}
