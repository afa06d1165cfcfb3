/*
 * sbx_util.c — small helpers shared by the sandbox files: error strings that
 * carry strerror(errno), byte counts for limit messages, one-line writes to
 * procfs/cgroupfs files.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

int sbx_util_fail(char *err, size_t len, const char *fmt, ...)
{
    int saved = errno;
    if (!err || len == 0)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(err, len, fmt, ap);
    va_end(ap);
    if (saved != 0 && n >= 0 && (size_t)n < len)
        snprintf(err + n, len - (size_t)n, ": %s", strerror(saved));
    errno = saved;
    return -1;
}

const char *sbx_util_bytes(uint64_t n, char *buf, size_t size)
{
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    /* Only exact multiples move up a unit, so a message never rounds a limit. */
    while (u + 1 < sizeof units / sizeof *units && n >= 1024 && n % 1024 == 0) {
        n /= 1024;
        u++;
    }
    snprintf(buf, size, "%llu %s", (unsigned long long)n, units[u]);
    return buf;
}

int sbx_util_write_file(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t n = strlen(s);
    ssize_t w = write(fd, s, n);
    int saved = errno;
    close(fd);
    if (w != (ssize_t)n) {
        errno = w < 0 ? saved : EIO;
        return -1;
    }
    return 0;
}

void sbx_util_close_except(const int *keep, int n)
{
    unsigned from = 0;
    for (;;) {
        /* the smallest kept fd >= from */
        int next = -1;
        for (int i = 0; i < n; i++)
            if (keep[i] >= (int)from && (next < 0 || keep[i] < next))
                next = keep[i];
        unsigned to = next < 0 ? ~0U : (unsigned)next - 1;
        if (next < 0 || (unsigned)next > from) {
            if (syscall(SYS_close_range, from, to, 0) < 0)
                for (unsigned fd = from; fd <= to && fd < 65536; fd++)
                    close((int)fd);
        }
        if (next < 0)
            break;
        from = (unsigned)next + 1;
    }
}

int sbx_util_send_fd(int sock, int fd)
{
    char byte = 'F';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    ssize_t n;
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == 1 ? 0 : -1;
}

int sbx_util_recv_fd(int sock)
{
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n;
    do
        n = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n != 1)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
        c->cmsg_len != CMSG_LEN(sizeof(int)) || (msg.msg_flags & MSG_CTRUNC)) {
        errno = EPROTO;
        return -1;
    }
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

int sbx_util_path_under(const char *p, const char *dir)
{
    if (!p || !dir || !*dir)
        return 0;
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    if (n == 1 && dir[0] == '/')
        return 1;
    return !strncmp(p, dir, n) && (p[n] == '/' || p[n] == 0);
}
