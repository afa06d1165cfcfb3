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

/* What cm_read_regular checks beyond "a regular file of at most max bytes". */
enum {
    CM_RR_OWNED = 1u << 0, /* owned by the effective uid, not group- or world-writable */
};

/* Reads a whole file that a less-trusted party may have named or made (a
 * client's path, a file in a home another user could have planted): opened
 * O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC, so a symbolic link is refused and
 * a FIFO or device never blocks the caller; fstat on the open fd must show a
 * regular file of at most max bytes (and, with CM_RR_OWNED, the ownership
 * above) before a byte is read. On success 0 with *data (malloc'd,
 * NUL-terminated, the caller's) and *len. On failure -1, errno set, *data
 * NULL and *why a static phrase naming the reason ("is a symbolic link", "is
 * not a regular file", "is larger than the limit", "is not owned by this
 * user", "is writable by group or others", or strerror(errno)): the caller
 * prefixes the path. The file's contents are never part of a reason. */
int cm_read_regular(const char *path, size_t max, unsigned flags, char **data, size_t *len,
                    const char **why);

#endif
