/*
 * egdns.c — the egress proxy's test resolver, see egdns.h.
 */
#include "kernels/egress/egdns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define EGDNS_HDR 12

int egdns_parse_server(const char *text, struct sockaddr_in *server)
{
    char ip[INET_ADDRSTRLEN];
    const char *colon = text ? strrchr(text, ':') : NULL;
    if (!colon || (size_t)(colon - text) >= sizeof ip)
        return -1;
    memcpy(ip, text, (size_t)(colon - text));
    ip[colon - text] = 0;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || end == colon + 1 || *end || port < 1 || port > 65535)
        return -1;
    memset(server, 0, sizeof *server);
    server->sin_family = AF_INET;
    server->sin_port = htons((unsigned short)port);
    return inet_pton(AF_INET, ip, &server->sin_addr) == 1 ? 0 : -1;
}

int egdns_query(const char *name, unsigned short id, unsigned char *buf, size_t size)
{
    size_t n = strlen(name), off = EGDNS_HDR;
    if (n && name[n - 1] == '.')
        n--;
    if (n == 0 || n > 253 || size < EGDNS_HDR + n + 2 + 4)
        return -1;
    memset(buf, 0, EGDNS_HDR);
    buf[0] = (unsigned char)(id >> 8);
    buf[1] = (unsigned char)id;
    buf[2] = 0x01; /* RD */
    buf[5] = 1;    /* one question */
    for (size_t i = 0; i < n;) {
        size_t l = strcspn(name + i, ".");
        if (l == 0 || l > 63 || i + l > n)
            return -1;
        buf[off++] = (unsigned char)l;
        memcpy(buf + off, name + i, l);
        off += l;
        i += l + 1;
    }
    buf[off++] = 0;
    buf[off++] = 0;
    buf[off++] = 1; /* A */
    buf[off++] = 0;
    buf[off++] = 1; /* IN */
    return (int)off;
}

/* The offset after the name at off in r (len bytes), or -1. A pointer
 * ends a name, and is not followed: only its length matters here. */
static long skip_name(const unsigned char *r, size_t len, size_t off)
{
    for (;;) {
        if (off >= len)
            return -1;
        unsigned l = r[off];
        if (l == 0)
            return (long)off + 1;
        if ((l & 0xc0) == 0xc0)
            return off + 2 <= len ? (long)off + 2 : -1;
        if (l > 63)
            return -1;
        off += l + 1;
    }
}

int egdns_answer(const unsigned char *q, size_t qlen, const unsigned char *r, size_t len,
                 struct in_addr *out, int max)
{
    if (len < EGDNS_HDR || qlen < EGDNS_HDR || len < qlen)
        return -1;
    /* the same id, a response (QR), no error (RCODE 0), our question */
    if (r[0] != q[0] || r[1] != q[1] || !(r[2] & 0x80) || (r[3] & 0x0f) || r[4] != 0 || r[5] != 1 ||
        memcmp(r + EGDNS_HDR, q + EGDNS_HDR, qlen - EGDNS_HDR))
        return -1;
    unsigned an = (unsigned)r[6] << 8 | r[7];
    size_t off = qlen;
    int n = 0;
    for (unsigned i = 0; i < an && n < max; i++) {
        long o = skip_name(r, len, off);
        if (o < 0 || (size_t)o + 10 > len)
            return -1;
        off = (size_t)o;
        unsigned type = (unsigned)r[off] << 8 | r[off + 1];
        unsigned cls = (unsigned)r[off + 2] << 8 | r[off + 3];
        size_t rdlen = (size_t)r[off + 8] << 8 | r[off + 9];
        off += 10;
        if (off + rdlen > len)
            return -1;
        if (type == 1 && cls == 1 && rdlen == 4)
            memcpy(&out[n++], r + off, 4);
        off += rdlen;
    }
    return n;
}

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int egdns_resolve(const struct sockaddr_in *server, const char *name, struct in_addr *out, int max)
{
    unsigned char q[512], r[1500];
    unsigned short id;
    if (getrandom(&id, sizeof id, 0) != sizeof id)
        id = (unsigned short)(mono_ms() ^ getpid());
    int qlen = egdns_query(name, id, q, sizeof q);
    if (qlen < 0)
        return -1;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int n = -1;
    /* connected: replies from any other address are dropped by the kernel */
    if (connect(fd, (const struct sockaddr *)server, sizeof *server) == 0 &&
        send(fd, q, (size_t)qlen, 0) == qlen) {
        long long deadline = mono_ms() + EGDNS_TIMEOUT_MS;
        for (;;) {
            long long left = deadline - mono_ms();
            struct pollfd p = {fd, POLLIN, 0};
            if (left <= 0 || poll(&p, 1, (int)left) <= 0)
                break;
            ssize_t k = recv(fd, r, sizeof r, 0);
            if (k < 0)
                break;
            n = egdns_answer(q, (size_t)qlen, r, (size_t)k, out, max);
            if (n >= 0)
                break; /* else: another query's, or garbage: wait on */
        }
    }
    close(fd);
    return n > 0 ? n : -1;
}
