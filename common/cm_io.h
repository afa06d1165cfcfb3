/*
 * cm_io.h — whole reads and writes on file descriptors: short transfers
 * continued, EINTR retried.
 */
#ifndef CM_IO_H
#define CM_IO_H

#include <stddef.h>
#include <sys/types.h>

/* Writes all len bytes of buf to fd. 0, or -1 with errno set (ENOSPC for a
 * write that made no progress). A socket peer that has gone raises SIGPIPE
 * unless the caller ignores it (use send(MSG_NOSIGNAL) for sockets). */
int cm_write_all(int fd, const void *buf, size_t len);

/* Reads from fd into buf until len bytes or end of file. The bytes read
 * (less than len only at end of file), or -1 with errno set, the bytes read
 * before the error being lost. EAGAIN on a non-blocking fd is an error. */
ssize_t cm_read_full(int fd, void *buf, size_t len);

/* Reads fd to end of file into *data (malloc'd, NUL-terminated, owned by the
 * caller; its length in *len, which does not count the NUL). At most max
 * bytes: a longer file fails with EFBIG (one byte past max is read to tell).
 * 0, or -1 with errno set and *data NULL. */
int cm_read_all(int fd, size_t max, char **data, size_t *len);

#endif
