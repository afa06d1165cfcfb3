/*
 * pkgproxy.c — an HTTP CONNECT / forward proxy restricted to a list of
 * host:port pairs (see header). One thread accepts; one thread per client
 * connection relays. Bounded: head size, connection count, idle time.
 */
#include "kernelmgr/packages/pkgproxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROXY_HEAD_MAX 16384
#define PROXY_MAX_CONN 64
#define PROXY_IDLE_MS 120000
#define PROXY_ALLOWED_MAX 16

struct pkgproxy {
    int listen_fd;
    int stop_pipe[2]; /* written by pkgproxy_stop: wakes every poll */
    pthread_t acceptor;
    pthread_mutex_t lock;
    pthread_cond_t done;
    int n_conn;
    int n_allowed_conn;
    char *allowed[PROXY_ALLOWED_MAX + 1];
    json_t *refused; /* array, guarded by lock */
};

typedef struct proxy_conn {
    pkgproxy *px;
    int fd;
} proxy_conn;

static void refuse_log(pkgproxy *px, const char *target, const char *reason)
{
    pthread_mutex_lock(&px->lock);
    if (json_array_size(px->refused) < 100)
        json_array_append_new(px->refused,
                              json_pack("{s:s,s:s}", "target", target, "reason", reason));
    pthread_mutex_unlock(&px->lock);
}

static int is_allowed(pkgproxy *px, const char *host, const char *port)
{
    char want[300];
    int v6 = strchr(host, ':') != NULL;
    snprintf(want, sizeof want, v6 ? "[%s]:%s" : "%s:%s", host, port);
    for (int i = 0; px->allowed[i]; i++)
        if (strcasecmp(px->allowed[i], want) == 0)
            return 1;
    return 0;
}

static int send_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static void http_error(int fd, int code, const char *status, const char *why)
{
    char buf[600];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\n"
                     "Content-Length: %zu\r\n\r\n%s\n",
                     code, status, strlen(why) + 1, why);
    if (n > 0)
        send_all(fd, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

/* Reads until the end of the request head. Returns its length (bytes up to
 * and including the blank line), leaving any extra bytes after it in buf;
 * *got is the total read. -1 on error, timeout or an oversized head. */
static ssize_t read_head(pkgproxy *px, int fd, char *buf, size_t cap, size_t *got)
{
    *got = 0;
    for (;;) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN},
                              {.fd = px->stop_pipe[0], .events = POLLIN}};
        int r = poll(p, 2, 30000);
        if (r <= 0 || p[1].revents)
            return -1;
        ssize_t n = recv(fd, buf + *got, cap - 1 - *got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        *got += (size_t)n;
        buf[*got] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        if (end)
            return (end - buf) + 4;
        if (*got >= cap - 1)
            return -1;
    }
}

/* 1 when the IPv4 address a (network order) is reachable only on this
 * host: "this network" 0.0.0.0/8 (0.0.0.0 is the host itself), loopback
 * 127.0.0.0/8, link-local 169.254.0.0/16. */
static int host_only_v4(uint32_t a)
{
    uint32_t h = ntohl(a);
    return (h >> 24) == 0 || (h >> 24) == 127 || (h >> 16) == 0xa9fe;
}

/* 1 when sa is an address only this host answers on: host_only_v4 (also in
 * its IPv4-mapped and -compatible IPv6 forms), ::, ::1, link-local
 * fe80::/10, or an address of one of the host's own interfaces (whatever
 * its range: connecting to it reaches this host's services). */
static int host_only_addr(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        if (host_only_v4(in->sin_addr.s_addr))
            return 1;
    } else if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        uint32_t v4;
        memcpy(&v4, a6->s6_addr + 12, 4);
        if (IN6_IS_ADDR_UNSPECIFIED(a6) || IN6_IS_ADDR_LOOPBACK(a6) || IN6_IS_ADDR_LINKLOCAL(a6) ||
            ((IN6_IS_ADDR_V4MAPPED(a6) || IN6_IS_ADDR_V4COMPAT(a6)) && host_only_v4(v4)))
            return 1;
    } else {
        return 1; /* not an internet address: never dialled */
    }
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0)
        return 1; /* cannot tell: refuse */
    int own = 0;
    for (struct ifaddrs *i = ifs; i && !own; i = i->ifa_next) {
        const struct sockaddr *ia = i->ifa_addr;
        if (!ia)
            continue;
        if (ia->sa_family == AF_INET && sa->sa_family == AF_INET)
            own = ((const struct sockaddr_in *)ia)->sin_addr.s_addr ==
                  ((const struct sockaddr_in *)sa)->sin_addr.s_addr;
        else if (ia->sa_family == AF_INET && sa->sa_family == AF_INET6) {
            const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
            own = IN6_IS_ADDR_V4MAPPED(a6) &&
                  memcmp(a6->s6_addr + 12, &((const struct sockaddr_in *)ia)->sin_addr, 4) == 0;
        } else if (ia->sa_family == AF_INET6 && sa->sa_family == AF_INET6)
            own =
                memcmp(&((const struct sockaddr_in6 *)ia)->sin6_addr,
                       &((const struct sockaddr_in6 *)sa)->sin6_addr, sizeof(struct in6_addr)) == 0;
    }
    freeifaddrs(ifs);
    return own;
}

/* 1 when the operator named a host-only destination itself: an address
 * literal (it is on the list as written) or "localhost". A name that merely
 * resolves to such an address (DNS the operator does not control, a
 * rebinding answer, the host's own name) does not. */
static int names_host_only(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return strcasecmp(host, "localhost") == 0 || inet_pton(AF_INET, host, buf) == 1 ||
           inet_pton(AF_INET6, host, buf) == 1;
}

/* Resolves host once and connects to the first address that passes the
 * policy — the very sockaddr checked, so no second lookup can change it.
 * The socket; -2 when every address was host-only and the operator did not
 * name one (PKGPROXY_HOST_ONLY); -1 when unreachable. */
static int dial(const char *host, const char *port)
{
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    int named = names_host_only(host), fd = -1, refused = 0, tried = 0;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        if (a->ai_family != AF_INET && a->ai_family != AF_INET6)
            continue;
        if (!named && host_only_addr(a->ai_addr)) {
            refused++;
            continue;
        }
        tried++;
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd < 0 && refused && !tried ? -2 : fd;
}

/* Copies both ways until both sides are done, the proxy stops, or nothing
 * moves for PROXY_IDLE_MS. */
static void relay(pkgproxy *px, int a, int b)
{
    char buf[65536];
    int a_open = 1, b_open = 1;
    while (a_open || b_open) {
        struct pollfd p[3] = {{.fd = a_open ? a : -1, .events = POLLIN},
                              {.fd = b_open ? b : -1, .events = POLLIN},
                              {.fd = px->stop_pipe[0], .events = POLLIN}};
        int r = poll(p, 3, PROXY_IDLE_MS);
        if (r <= 0 || p[2].revents)
            return;
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents)
                continue;
            int from = i == 0 ? a : b, to = i == 0 ? b : a;
            ssize_t n = recv(from, buf, sizeof buf, 0);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                shutdown(to, SHUT_WR);
                if (i == 0)
                    a_open = 0;
                else
                    b_open = 0;
                continue;
            }
            if (send_all(to, buf, (size_t)n) < 0)
                return;
        }
    }
}

/* Splits "host:port" / "[v6]:port" (port required when need_port). */
static int split_hostport(char *s, const char *dflt_port, char **host, char **port)
{
    if (s[0] == '[') {
        char *close = strchr(s, ']');
        if (!close)
            return -1;
        *close = '\0';
        *host = s + 1;
        if (close[1] == ':')
            *port = close + 2;
        else if (close[1] == '\0' && dflt_port)
            *port = (char *)dflt_port;
        else
            return -1;
    } else {
        char *colon = strrchr(s, ':');
        *host = s;
        if (colon) {
            *colon = '\0';
            *port = colon + 1;
        } else if (dflt_port) {
            *port = (char *)dflt_port;
        } else {
            return -1;
        }
    }
    if (!**host || !**port || strspn(*port, "0123456789") != strlen(*port) || strlen(*port) > 5)
        return -1;
    return 0;
}

/* A connection to host:port for the client on fd, or -1 after answering it
 * (403: not a target the proxy serves; 502: unreachable). */
static int open_upstream(pkgproxy *px, int fd, const char *target, const char *host,
                         const char *port)
{
    if (!is_allowed(px, host, port)) {
        refuse_log(px, target, "not the configured index");
        http_error(fd, 403, "Forbidden", "only the configured package index is reachable");
        return -1;
    }
    int up = dial(host, port);
    if (up == -2) {
        refuse_log(px, target, PKGPROXY_HOST_ONLY);
        http_error(fd, 403, "Forbidden", PKGPROXY_HOST_ONLY);
        return -1;
    }
    if (up < 0)
        http_error(fd, 502, "Bad Gateway", "cannot connect to the index");
    return up;
}

static void serve(pkgproxy *px, int fd)
{
    char head[PROXY_HEAD_MAX + 1];
    size_t got;
    ssize_t hlen = read_head(px, fd, head, sizeof head, &got);
    if (hlen < 0) {
        http_error(fd, 400, "Bad Request", "incomplete or oversized request head");
        return;
    }
    char *line_end = strstr(head, "\r\n");
    *line_end = '\0';
    char method[16], target[2048], version[16];
    if (sscanf(head, "%15s %2047s %15s", method, target, version) != 3 ||
        strncmp(version, "HTTP/1.", 7) != 0) {
        http_error(fd, 400, "Bad Request", "malformed request line");
        return;
    }
    char tcopy[2048];
    snprintf(tcopy, sizeof tcopy, "%s", target);
    char *host, *port;
    if (strcmp(method, "CONNECT") == 0) {
        if (split_hostport(tcopy, NULL, &host, &port) < 0) {
            http_error(fd, 400, "Bad Request", "CONNECT needs host:port");
            return;
        }
        int up = open_upstream(px, fd, target, host, port);
        if (up < 0)
            return;
        const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
        if (send_all(fd, ok, sizeof ok - 1) == 0) {
            /* Bytes the client sent after the head (a TLS hello) go first. */
            if ((size_t)hlen < got)
                send_all(up, head + hlen, got - (size_t)hlen);
            relay(px, fd, up);
        }
        close(up);
        return;
    }
    /* Forward proxying of plain http: absolute URI required. */
    if (strncasecmp(tcopy, "http://", 7) != 0) {
        refuse_log(px, target, "not an absolute http:// URI");
        http_error(fd, 400, "Bad Request", "a proxy request needs an absolute http:// URI");
        return;
    }
    char *auth = tcopy + 7;
    char *path = strchr(auth, '/');
    char pathbuf[2048];
    snprintf(pathbuf, sizeof pathbuf, "%s", path ? path : "/");
    if (path)
        *path = '\0';
    if (strchr(auth, '@') || split_hostport(auth, "80", &host, &port) < 0) {
        http_error(fd, 400, "Bad Request", "bad host in the URI");
        return;
    }
    int up = open_upstream(px, fd, target, host, port);
    if (up < 0)
        return;
    /* Request line in origin form, then the headers without hop-by-hop
     * ones, then Connection: close so one client connection is one request
     * (a second request on it cannot go to another host). */
    char *out = malloc(PROXY_HEAD_MAX + 4200);
    if (!out) {
        close(up);
        return;
    }
    int o = snprintf(out, 4200, "%s %s %s\r\n", method, pathbuf, version);
    char *h = line_end + 2;
    while (h < head + hlen - 2) {
        char *e = strstr(h, "\r\n");
        if (!e)
            break;
        size_t l = (size_t)(e - h);
        if (strncasecmp(h, "Proxy-", 6) != 0 && strncasecmp(h, "Connection:", 11) != 0 &&
            strncasecmp(h, "Keep-Alive:", 11) != 0) {
            memcpy(out + o, h, l + 2);
            o += (int)l + 2;
        }
        h = e + 2;
    }
    o += snprintf(out + o, 40, "Connection: close\r\n\r\n");
    if (send_all(up, out, (size_t)o) == 0) {
        if ((size_t)hlen < got)
            send_all(up, head + hlen, got - (size_t)hlen);
        pthread_mutex_lock(&px->lock);
        px->n_allowed_conn++;
        pthread_mutex_unlock(&px->lock);
        relay(px, fd, up);
    }
    free(out);
    close(up);
}

static void *conn_thread(void *arg)
{
    proxy_conn *c = arg;
    pkgproxy *px = c->px;
    serve(px, c->fd);
    close(c->fd);
    free(c);
    pthread_mutex_lock(&px->lock);
    px->n_conn--;
    pthread_cond_broadcast(&px->done);
    pthread_mutex_unlock(&px->lock);
    return NULL;
}

static void *accept_thread(void *arg)
{
    pkgproxy *px = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = px->listen_fd, .events = POLLIN},
                              {.fd = px->stop_pipe[0], .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        if (!p[0].revents)
            continue;
        int fd = accept4(px->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&px->lock);
        int full = px->n_conn >= PROXY_MAX_CONN;
        if (!full)
            px->n_conn++;
        pthread_mutex_unlock(&px->lock);
        if (full) {
            http_error(fd, 503, "Service Unavailable", "too many connections");
            close(fd);
            continue;
        }
        proxy_conn *c = malloc(sizeof *c);
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (!c || (c->px = px, c->fd = fd, pthread_create(&th, &attr, conn_thread, c) != 0)) {
            free(c);
            close(fd);
            pthread_mutex_lock(&px->lock);
            px->n_conn--;
            pthread_mutex_unlock(&px->lock);
        }
        pthread_attr_destroy(&attr);
    }
    return NULL;
}

pkgproxy *pkgproxy_start(int listen_fd, const char *const *allowed, char *err, size_t errlen)
{
    pkgproxy *px = calloc(1, sizeof *px);
    if (!px || pipe2(px->stop_pipe, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "pkgproxy: %s", strerror(errno));
        free(px);
        close(listen_fd);
        return NULL;
    }
    px->listen_fd = listen_fd;
    for (int i = 0; allowed && allowed[i] && i < PROXY_ALLOWED_MAX; i++)
        px->allowed[i] = strdup(allowed[i]);
    px->refused = json_array();
    pthread_mutex_init(&px->lock, NULL);
    pthread_cond_init(&px->done, NULL);
    if (pthread_create(&px->acceptor, NULL, accept_thread, px) != 0) {
        snprintf(err, errlen, "pkgproxy: cannot start its thread");
        px->acceptor = 0;
        pkgproxy_stop(&px);
        return NULL;
    }
    return px;
}

void pkgproxy_stop(pkgproxy **pp)
{
    if (!pp || !*pp)
        return;
    pkgproxy *px = *pp;
    if (write(px->stop_pipe[1], "x", 1) < 0) {
        /* the pipe cannot be full: one byte, written once */
    }
    if (px->acceptor)
        pthread_join(px->acceptor, NULL);
    pthread_mutex_lock(&px->lock);
    while (px->n_conn > 0)
        pthread_cond_wait(&px->done, &px->lock);
    pthread_mutex_unlock(&px->lock);
    close(px->listen_fd);
    close(px->stop_pipe[0]);
    close(px->stop_pipe[1]);
    for (int i = 0; px->allowed[i]; i++)
        free(px->allowed[i]);
    json_decref(px->refused);
    pthread_mutex_destroy(&px->lock);
    pthread_cond_destroy(&px->done);
    free(px);
    *pp = NULL;
}

json_t *pkgproxy_report(pkgproxy *px)
{
    pthread_mutex_lock(&px->lock);
    json_t *r = json_pack("{s:i,s:O}", "allowed", px->n_allowed_conn, "refused", px->refused);
    pthread_mutex_unlock(&px->lock);
    return r;
}
