/*
 * egproxy.c — an HTTP CONNECT / forward proxy restricted to a list of
 * host:port pairs (see header). One thread accepts; one thread per client
 * connection relays. Bounded: head size, connection count, idle time.
 */
#include "kernels/egress/egproxy.h"
#include "kernels/egress/egdns.h"
#include "kernels/egress/egpolicy.h"
#include "kernels/egress/egtls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROXY_HEAD_MAX 16384
#define PROXY_MAX_CONN 64
#define PROXY_IDLE_MS 120000
#define PROXY_CONNECT_MS 15000
#define PROXY_ALLOWED_MAX 16

struct egproxy {
    int listen_fd;
    int stop_pipe[2]; /* written by egproxy_stop: wakes every poll */
    pthread_t acceptor;
    pthread_mutex_t lock;
    pthread_cond_t done;
    int n_conn;
    int n_allowed_conn;
    char *allowed[PROXY_ALLOWED_MAX + 1];
    json_t *refused;  /* array, guarded by lock */
    egpolicy *policy; /* owned; NULL: the installer's exact host:port list */
    /* decision log (policy mode), guarded by lock: a token bucket
     * (EGPROXY_LOG_BURST, EGPROXY_LOG_RATE a second), at most
     * EGPROXY_LOG_LINES lines in all, suppressed lines counted */
    double log_tokens, log_last;
    unsigned long long log_max; /* egproxy_log_limit; 0: none */
    long long n_refused;        /* every refusal (policy mode) */
    char last_refused[600];     /* the last one's reason */
    unsigned long log_lines, log_suppressed;
    int use_dns;            /* policy mode: names resolved by dns (egdns.h), not the host */
    struct sockaddr_in dns; /* the operator's EGDNS_ENV server */
};

typedef struct proxy_conn {
    egproxy *px;
    int fd;
} proxy_conn;

static void refuse_log(egproxy *px, const char *target, const char *reason)
{
    pthread_mutex_lock(&px->lock);
    px->n_refused++;
    {
        const char *pre = "kernelmgr: network policy allow-list: ";
        snprintf(px->last_refused, sizeof px->last_refused, "%s",
                 strncmp(reason, pre, strlen(pre)) ? reason : reason + strlen(pre));
    }
    if (json_array_size(px->refused) < EGPROXY_REFUSED_MAX)
        json_array_append_new(px->refused,
                              json_pack("{s:s,s:s}", "target", target, "reason", reason));
    pthread_mutex_unlock(&px->lock);
}

static int is_allowed(egproxy *px, const char *host, const char *port)
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
 * *got is the total read. -1 on error or timeout, -2 for an oversized head. */
static ssize_t read_head(egproxy *px, int fd, char *buf, size_t cap, size_t *got)
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
        char *end = memmem(buf, *got, "\r\n\r\n", 4); /* a NUL does not hide it */
        if (end)
            return (end - buf) + 4;
        if (*got >= cap - 1)
            return -2;
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
 * name one (EGPROXY_HOST_ONLY); -1 when unreachable. */
static int connect_bounded(const egproxy *px, int fd, const struct sockaddr *a, socklen_t len);

static int dial(const egproxy *px, const char *host, const char *port)
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
        if (connect_bounded(px, fd, a->ai_addr, a->ai_addrlen) == 0)
            break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd < 0 && refused && !tried ? -2 : fd;
}

/* Copies both ways until both sides are done, the proxy stops, or nothing
 * moves for PROXY_IDLE_MS. */
static void relay(egproxy *px, int a, int b)
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
static int open_upstream(egproxy *px, int fd, const char *target, const char *host,
                         const char *port)
{
    if (!is_allowed(px, host, port)) {
        refuse_log(px, target, "not the configured index");
        http_error(fd, 403, "Forbidden", "only the configured package index is reachable");
        return -1;
    }
    int up = dial(px, host, port);
    if (up == -2) {
        refuse_log(px, target, EGPROXY_HOST_ONLY);
        http_error(fd, 403, "Forbidden", EGPROXY_HOST_ONLY);
        return -1;
    }
    if (up < 0)
        http_error(fd, 502, "Bad Gateway", "cannot connect to the index");
    return up;
}

static void serve(egproxy *px, int fd)
{
    char head[PROXY_HEAD_MAX + 1];
    size_t got;
    ssize_t hlen = read_head(px, fd, head, sizeof head, &got);
    if (hlen < 0) {
        http_error(fd, 400, "Bad Request", "incomplete or oversized request head");
        return;
    }
    if (memchr(head, 0, (size_t)hlen)) {
        http_error(fd, 400, "Bad Request", "a NUL in the request head");
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

/* ------------------------------------------------ session egress (policy) */

/* 1 when the IPv4 address h (host order) is one of a private or special
 * network: RFC 1918, shared address space 100.64.0.0/10, benchmarking
 * 198.18.0.0/15, IETF protocol assignments 192.0.0.0/24, multicast and
 * reserved 224.0.0.0/3 (broadcast included). */
static int private_v4(uint32_t h)
{
    return (h >> 24) == 10 || (h >> 20) == 0xac1 || (h >> 16) == 0xc0a8 ||
           (h >> 22) == (100u << 2 | 1) || (h >> 17) == (0xc612u >> 1) || (h >> 8) == 0xc00000 ||
           (h >> 29) == 7;
}

/* 1 when sa may be dialled only when the list names it as a literal: every
 * address of host_only_addr, the private networks of private_v4 (also
 * IPv4-mapped, -compatible and in NAT64's 64:ff9b::/96), IPv6 unique local
 * fc00::/7, site-local fec0::/10 and multicast ff00::/8. */
static int restricted_addr(const struct sockaddr *sa)
{
    if (host_only_addr(sa))
        return 1;
    if (sa->sa_family == AF_INET)
        return private_v4(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
    const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    const unsigned char *b = a6->s6_addr;
    static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b};
    uint32_t v4;
    memcpy(&v4, b + 12, 4);
    if (IN6_IS_ADDR_V4MAPPED(a6) || IN6_IS_ADDR_V4COMPAT(a6) || !memcmp(b, nat64, 12))
        return host_only_v4(v4) || private_v4(ntohl(v4));
    return (b[0] & 0xfe) == 0xfc || (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) || b[0] == 0xff;
}
/* One decision line on stderr, rate-limited and bounded (see the struct);
 * a line that follows suppressed ones says how many. */
static void plog(egproxy *px, const char *verdict, const char *method, const char *target,
                 const char *why)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double now = (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
    char line[900];
    int n = 0;
    pthread_mutex_lock(&px->lock);
    px->log_tokens += (now - px->log_last) * EGPROXY_LOG_RATE;
    if (px->log_tokens > EGPROXY_LOG_BURST)
        px->log_tokens = EGPROXY_LOG_BURST;
    px->log_last = now;
    if (px->log_tokens < 1 || px->log_lines >= EGPROXY_LOG_LINES) {
        px->log_suppressed++;
    } else {
        px->log_tokens -= 1;
        px->log_lines++;
        char sup[64] = "";
        if (px->log_suppressed)
            snprintf(sup, sizeof sup, " (%lu earlier decisions not logged)", px->log_suppressed);
        px->log_suppressed = 0;
        n = snprintf(line, sizeof line, "kernelmgr egress: %s %s %.300s%s%.400s%s%s\n", verdict,
                     method, target, why ? ": " : "", why ? why : "", sup,
                     px->log_lines == EGPROXY_LOG_LINES ? " (the decision log is full)" : "");
    }
    if (n > 0 && px->log_max) {
        struct stat st;
        size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
        if (fstat(STDERR_FILENO, &st) == 0 && S_ISREG(st.st_mode) &&
            (unsigned long long)st.st_size + len + 100 > px->log_max) {
            n = snprintf(line, sizeof line,
                         "kernelmgr egress: the log is near its size limit (%llu bytes): "
                         "further decisions are not logged\n",
                         px->log_max);
            px->log_lines = EGPROXY_LOG_LINES;
            if ((unsigned long long)st.st_size + (unsigned long long)n > px->log_max)
                n = 0;
        }
    }
    pthread_mutex_unlock(&px->lock);
    if (n > 0 &&
        write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1) < 0) {
        /* nowhere else to say it */
    }
}

/* 403 naming the policy, logged and reported. */
static void deny(egproxy *px, int fd, const char *method, const char *target, const char *why)
{
    char body[1200];
    snprintf(body, sizeof body, "kernelmgr: network policy allow-list: %s", why);
    refuse_log(px, target, body);
    plog(px, "refused", method, target, why);
    http_error(fd, 403, "Forbidden", body);
}

static void deny_host(egproxy *px, int fd, const char *method, const char *target, const char *host,
                      const char *port)
{
    char list[600], why[1000];
    egpolicy_describe(px->policy, list, sizeof list);
    int v6 = strchr(host, ':') != NULL;
    snprintf(why, sizeof why, "host %s%.260s%s:%s is not allowed (allowed: %s)", v6 ? "[" : "",
             host, v6 ? "]" : "", port, list);
    deny(px, fd, method, target, why);
}

/* The addresses one name may be dialled at (resolve_policy). */
#define EGPROXY_ADDRS_MAX 16
typedef struct egaddrs {
    int n;
    struct sockaddr_storage a[EGPROXY_ADDRS_MAX];
    socklen_t len[EGPROXY_ADDRS_MAX];
} egaddrs;

static void norm_host(const char *h, char *out, size_t outlen);

/* Resolves name (here, never in the sandbox) and keeps the addresses the
 * policy admits, in the resolver's order: a restricted address
 * (restricted_addr) only when the entry that matched is that address
 * literal. The count (> 0); -2 when every address was restricted (*bad gets
 * the first, as text); -1 when the name does not resolve. The proxy then
 * connects to exactly these (connect_pinned): nothing can rebind the name
 * between the check and the connect. */
/* The operator's test resolver (egdns.h) as getaddrinfo would answer:
 * *res (free with free_dns_answer), 0, or -1. */
static int dns_answer(const struct sockaddr_in *dns, const char *host, const char *port,
                      struct addrinfo **res)
{
    struct in_addr a[EGDNS_MAX_ADDRS];
    int n = egdns_resolve(dns, host, a, EGDNS_MAX_ADDRS);
    *res = NULL;
    for (int i = n - 1; i >= 0; i--) {
        struct addrinfo *ai = calloc(1, sizeof *ai + sizeof(struct sockaddr_in));
        if (!ai)
            break;
        struct sockaddr_in *sin = (struct sockaddr_in *)(ai + 1);
        sin->sin_family = AF_INET;
        sin->sin_port = htons((unsigned short)atoi(port));
        sin->sin_addr = a[i];
        ai->ai_family = AF_INET;
        ai->ai_socktype = SOCK_STREAM;
        ai->ai_addr = (struct sockaddr *)sin;
        ai->ai_addrlen = sizeof *sin;
        ai->ai_next = *res;
        *res = ai;
    }
    return *res ? 0 : -1;
}

static void free_dns_answer(struct addrinfo *res)
{
    while (res) {
        struct addrinfo *next = res->ai_next;
        free(res);
        res = next;
    }
}

static int resolve_policy(const egproxy *px, const char *name, const char *port, int literal,
                          egaddrs *out, char *bad, size_t badlen)
{
    char host[EGPOLICY_HOST_MAX + 2];
    norm_host(name, host, sizeof host); /* what the list matched */
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (literal ? AI_NUMERICHOST : 0);
    out->n = 0;
    int own = px->use_dns && !literal;
    if (own ? dns_answer(&px->dns, host, port, &res) != 0
            : getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    int refused = 0;
    for (struct addrinfo *a = res; a && out->n < EGPROXY_ADDRS_MAX; a = a->ai_next) {
        if ((a->ai_family != AF_INET && a->ai_family != AF_INET6) ||
            a->ai_addrlen > sizeof out->a[0])
            continue;
        if (!literal && restricted_addr(a->ai_addr)) {
            if (!refused++) {
                const void *ad =
                    a->ai_family == AF_INET
                        ? (const void *)&((struct sockaddr_in *)a->ai_addr)->sin_addr
                        : (const void *)&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr;
                inet_ntop(a->ai_family, ad, bad, (socklen_t)badlen);
            }
            continue;
        }
        memcpy(&out->a[out->n], a->ai_addr, a->ai_addrlen);
        out->len[out->n++] = a->ai_addrlen;
    }
    if (own)
        free_dns_answer(res);
    else
        freeaddrinfo(res);
    return out->n ? out->n : refused ? -2 : -1;
}

/* connect() that gives up after PROXY_CONNECT_MS or when the proxy stops
 * (an address that never answers must not hold egproxy_stop). 0 or -1. */
static int connect_bounded(const egproxy *px, int fd, const struct sockaddr *a, socklen_t len)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -1;
    if (connect(fd, a, len) < 0) {
        if (errno != EINPROGRESS)
            return -1;
        struct pollfd p[2] = {{fd, POLLOUT, 0}, {px->stop_pipe[0], POLLIN, 0}};
        int r;
        do {
            r = poll(p, 2, PROXY_CONNECT_MS);
        } while (r < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (r <= 0 || p[1].revents || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 ||
            soerr)
            return -1;
    }
    return fcntl(fd, F_SETFL, fl);
}

/* A connected socket to the first of addrs that answers, or -1. */
static int connect_pinned(const egproxy *px, const egaddrs *addrs)
{
    for (int i = 0; i < addrs->n; i++) {
        int fd = socket(addrs->a[i].ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        if (connect_bounded(px, fd, (const struct sockaddr *)&addrs->a[i], addrs->len[i]) == 0)
            return fd;
        close(fd);
    }
    return -1;
}

static int dial_policy(const egproxy *px, const char *name, const char *port, int literal,
                       char *bad, size_t badlen)
{
    egaddrs addrs;
    int n = resolve_policy(px, name, port, literal, &addrs, bad, badlen);
    return n < 0 ? n : connect_pinned(px, &addrs);
}

/* The upstream for host:port under the policy, or -1 after answering the
 * client (403 naming the policy; 502 unreachable). */
static int open_policy(egproxy *px, int fd, const char *method, const char *target,
                       const char *host, const char *port)
{
    int e = egpolicy_match(px->policy, host, (unsigned)atoi(port));
    if (e < 0) {
        deny_host(px, fd, method, target, host, port);
        return -1;
    }
    char bad[INET6_ADDRSTRLEN] = "?", why[700];
    int up = dial_policy(px, host, port, egpolicy_is_literal(px->policy, e), bad, sizeof bad);
    if (up == -2) {
        snprintf(why, sizeof why,
                 "host %.260s resolves to %s, an address of this host or of a private network, "
                 "which only an allow entry naming that address itself may reach",
                 host, bad);
        deny(px, fd, method, target, why);
        return -1;
    }
    if (up < 0) {
        plog(px, "failed", method, target, "cannot connect");
        snprintf(why, sizeof why, "kernelmgr: network policy allow-list: cannot connect to %.260s",
                 target);
        http_error(fd, 502, "Bad Gateway", why);
        return -1;
    }
    plog(px, "allowed", method, target, NULL);
    pthread_mutex_lock(&px->lock);
    px->n_allowed_conn++;
    pthread_mutex_unlock(&px->lock);
    return up;
}

/* Lower case, one trailing dot dropped, into out (outlen bytes). */
static void norm_host(const char *h, char *out, size_t outlen)
{
    size_t i = 0;
    for (; h[i] && i + 1 < outlen; i++)
        out[i] = (char)(h[i] >= 'A' && h[i] <= 'Z' ? h[i] + 32 : h[i]);
    out[i] = 0;
    if (i && out[i - 1] == '.')
        out[i - 1] = 0;
}

/* The TLS alert access_denied, then the connection ends. */
static void tls_refuse(int fd)
{
    static const unsigned char alert[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31};
    send_all(fd, alert, sizeof alert);
}

/* CONNECT under the policy: the target checked, 200, then the client's
 * first TLS record read here (bounded, EGPROXY_HELLO_MS) and its server
 * name checked against the CONNECT host before any upstream connection. */
static void connect_policy(egproxy *px, int fd, const char *target, char *host, const char *port,
                           const char *extra, size_t nextra)
{
    int e = egpolicy_match(px->policy, host, (unsigned)atoi(port));
    if (e < 0) {
        deny_host(px, fd, "CONNECT", target, host, port);
        return;
    }
    /* resolved and checked now, so that a refused address still gets its
     * 403; connected only after the ClientHello passed */
    char bad[INET6_ADDRSTRLEN] = "?", why[800];
    egaddrs *addrs = malloc(sizeof *addrs);
    if (!addrs)
        return;
    int nres =
        resolve_policy(px, host, port, egpolicy_is_literal(px->policy, e), addrs, bad, sizeof bad);
    if (nres < 0) {
        if (nres == -2) {
            snprintf(why, sizeof why,
                     "host %.260s resolves to %s, an address of this host or of a private "
                     "network, which only an allow entry naming that address itself may reach",
                     host, bad);
            deny(px, fd, "CONNECT", target, why);
        } else {
            plog(px, "failed", "CONNECT", target, "the name does not resolve");
            snprintf(why, sizeof why,
                     "kernelmgr: network policy allow-list: %.260s does not resolve", host);
            http_error(fd, 502, "Bad Gateway", why);
        }
        free(addrs);
        return;
    }
    const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    unsigned char *hello = NULL;
    if (send_all(fd, ok, sizeof ok - 1) < 0 || !(hello = malloc(EGTLS_RECORD_MAX))) {
        free(addrs);
        return;
    }
    size_t got = nextra < EGTLS_RECORD_MAX ? nextra : EGTLS_RECORD_MAX;
    memcpy(hello, extra, got);
    char sni[EGPOLICY_HOST_MAX + 2];
    egtls_rc rc;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while ((rc = egtls_client_hello_sni(hello, got, sni, sizeof sni)) == EGTLS_MORE) {
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long left = EGPROXY_HELLO_MS -
                    ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN},
                              {.fd = px->stop_pipe[0], .events = POLLIN}};
        if (got >= EGTLS_RECORD_MAX || left <= 0 || poll(p, 2, (int)left) <= 0 || p[1].revents)
            break;
        ssize_t n = recv(fd, hello + got, EGTLS_RECORD_MAX - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    char want[EGPOLICY_HOST_MAX + 2], seen[EGPOLICY_HOST_MAX + 2];
    unsigned char lit[sizeof(struct in6_addr)];
    int is_lit = inet_pton(AF_INET, host, lit) == 1 || inet_pton(AF_INET6, host, lit) == 1;
    norm_host(host, want, sizeof want);
    why[0] = 0;
    if (rc == EGTLS_SNI) {
        norm_host(sni, seen, sizeof seen);
        if (strcmp(seen, want))
            snprintf(why, sizeof why,
                     "the TLS server name \"%.260s\" is not the CONNECT host %.260s (a tunnel "
                     "carries only the host it was opened for)",
                     sni, host);
    } else if (rc == EGTLS_NO_SNI) {
        if (!is_lit)
            snprintf(why, sizeof why,
                     "the TLS ClientHello names no server; a tunnel to %.260s must name it", host);
    } else {
        snprintf(why, sizeof why,
                 "the tunnel carries %s (the egress proxy passes TLS only, the ClientHello in "
                 "its first record, within %d s)",
                 egtls_rc_text(rc), EGPROXY_HELLO_MS / 1000);
    }
    if (why[0]) {
        char body[1000];
        snprintf(body, sizeof body, "kernelmgr: network policy allow-list: %s", why);
        refuse_log(px, target, body);
        plog(px, "refused", "CONNECT", target, why);
        tls_refuse(fd);
        free(hello);
        free(addrs);
        return;
    }
    int up = connect_pinned(px, addrs);
    free(addrs);
    if (up < 0) {
        snprintf(why, sizeof why, "cannot connect to %.260s", target);
        plog(px, "failed", "CONNECT", target, why);
        tls_refuse(fd);
        free(hello);
        return;
    }
    plog(px, "allowed", "CONNECT", target, NULL);
    pthread_mutex_lock(&px->lock);
    px->n_allowed_conn++;
    pthread_mutex_unlock(&px->lock);
    if (send_all(up, hello, got) == 0)
        relay(px, fd, up);
    free(hello);
    close(up);
}

/* The value of header name (with its colon, e.g. "Host:") in the head's
 * header lines [h, end): the count of such lines, the first value (trimmed)
 * in val. */
static int header_value(const char *h, const char *end, const char *name, char *val, size_t n)
{
    size_t nl = strlen(name);
    int count = 0;
    val[0] = 0;
    while (h < end) {
        const char *e = strstr(h, "\r\n");
        if (!e || e > end)
            break;
        if ((size_t)(e - h) >= nl && strncasecmp(h, name, nl) == 0) {
            if (!count++) {
                const char *v = h + nl;
                while (v < e && (*v == ' ' || *v == '\t'))
                    v++;
                size_t l = (size_t)(e - v);
                while (l && (v[l - 1] == ' ' || v[l - 1] == '\t'))
                    l--;
                snprintf(val, n, "%.*s", (int)(l < n ? l : n - 1), v);
            }
        }
        h = e + 2;
    }
    return count;
}

/* A reason when the head's header lines [h, end) are not plain HTTP/1.1
 * ones the proxy can forward unambiguously, else NULL: a bare CR or LF, a
 * NUL, a folded (continued) line, a line without a colon, Content-Length
 * and Transfer-Encoding together or repeated (request smuggling). */
static const char *head_smuggles(const char *head, size_t hlen, const char *h, const char *end)
{
    if (memchr(head, 0, hlen))
        return "a NUL in the request head";
    for (const char *p = head; p < head + hlen; p++)
        if ((*p == '\n' && (p == head || p[-1] != '\r')) || (*p == '\r' && p[1] != '\n'))
            return "a bare CR or LF in the request head";
    while (h < end) {
        const char *e = strstr(h, "\r\n");
        if (!e || e > end)
            break;
        if (e == h)
            break;
        if (*h == ' ' || *h == '\t')
            return "a folded header line";
        const char *colon = memchr(h, ':', (size_t)(e - h));
        if (!colon || colon == h)
            return "a header line without a name";
        for (const char *c = h; c < colon; c++)
            if (*c == ' ' || *c == '\t')
                return "white space in a header name";
        h = e + 2;
    }
    return NULL;
}

static void serve_policy(egproxy *px, int fd)
{
    char head[PROXY_HEAD_MAX + 1];
    size_t got;
    ssize_t hlen = read_head(px, fd, head, sizeof head, &got);
    if (hlen == -2) {
        char why[200];
        snprintf(why, sizeof why,
                 "kernelmgr: network policy allow-list: the request head is larger than %d bytes "
                 "(the proxy's limit)",
                 PROXY_HEAD_MAX);
        refuse_log(px, "-", why);
        plog(px, "refused", "-", "-", "request head over the size limit");
        http_error(fd, 431, "Request Header Fields Too Large", why);
        return;
    }
    if (hlen < 0) {
        http_error(fd, 400, "Bad Request", "incomplete request head");
        return;
    }
    if (memchr(head, 0, (size_t)hlen)) {
        deny(px, fd, "-", "-", "a NUL in the request head");
        return;
    }
    char *line_end = strstr(head, "\r\n");
    const char *hdrs = line_end + 2, *hend = head + hlen - 2;
    const char *smug = head_smuggles(head, (size_t)hlen, hdrs, hend);
    *line_end = '\0';
    char method[16], target[2048], version[16], rest[8];
    int fields = sscanf(head, "%15s %2047s %15s %7s", method, target, version, rest);
    if (fields != 3 || strncmp(version, "HTTP/1.", 7) != 0 || strlen(head) > 2100) {
        http_error(fd, 400, "Bad Request", "malformed request line");
        return;
    }
    if (smug) {
        deny(px, fd, method, target, smug);
        return;
    }
    char val[512];
    int ncl = header_value(hdrs, hend, "Content-Length:", val, sizeof val);
    int nte = header_value(hdrs, hend, "Transfer-Encoding:", val, sizeof val);
    if (ncl > 1 || nte > 1 || (ncl && nte)) {
        deny(px, fd, method, target,
             "Content-Length and Transfer-Encoding together or repeated (a request that could "
             "be read two ways)");
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
        connect_policy(px, fd, target, host, port, head + hlen, got - (size_t)hlen);
        return;
    }
    if (strncasecmp(tcopy, "http://", 7) != 0) {
        deny(px, fd, method, target,
             "a request through the proxy needs an absolute http:// URI (https: use CONNECT)");
        return;
    }
    char *auth = tcopy + 7;
    char *path = strchr(auth, '/');
    char pathbuf[2048];
    if (path && path != auth && strchr(auth, '?') && strchr(auth, '?') < path)
        path = NULL; /* "http://a?b/c": the authority ends at '?' */
    snprintf(pathbuf, sizeof pathbuf, "%s", path ? path : "/");
    if (path)
        *path = '\0';
    if (strpbrk(auth, "@?#\\%") || split_hostport(auth, "80", &host, &port) < 0) {
        deny(px, fd, method, target, "the URI's authority is not a plain host[:port]");
        return;
    }
    /* the Host header, when given, names the same host and port as the
     * request line (an upstream that routes by Host must see the checked
     * name) */
    int nhost = header_value(hdrs, hend, "Host:", val, sizeof val);
    if (nhost > 1) {
        deny(px, fd, method, target, "more than one Host header");
        return;
    }
    if (nhost == 1) {
        char hv[512], *hh, *hp, a[300], b[300];
        snprintf(hv, sizeof hv, "%s", val);
        if (split_hostport(hv, "80", &hh, &hp) < 0) {
            deny(px, fd, method, target, "the Host header is not a plain host[:port]");
            return;
        }
        norm_host(hh, a, sizeof a);
        norm_host(host, b, sizeof b);
        if (strcmp(a, b) || atoi(hp) != atoi(port)) {
            char why[700];
            snprintf(why, sizeof why, "the Host header (%.260s) does not name the request's host",
                     val);
            deny(px, fd, method, target, why);
            return;
        }
    }
    int up = open_policy(px, fd, method, target, host, port);
    if (up < 0)
        return;
    char *out = malloc(PROXY_HEAD_MAX + 4200);
    if (!out) {
        close(up);
        return;
    }
    int o = snprintf(out, 4200, "%s %s %s\r\n", method, pathbuf, version);
    if (!nhost) {
        int v6 = strchr(host, ':') != NULL;
        o += snprintf(out + o, 300, "Host: %s%.260s%s%s%s\r\n", v6 ? "[" : "", host, v6 ? "]" : "",
                      strcmp(port, "80") ? ":" : "", strcmp(port, "80") ? port : "");
    }
    const char *h = hdrs;
    while (h < hend) {
        const char *e = strstr(h, "\r\n");
        if (!e)
            break;
        size_t l = (size_t)(e - h);
        if (strncasecmp(h, "Proxy-", 6) != 0 && strncasecmp(h, "Connection:", 11) != 0 &&
            strncasecmp(h, "Keep-Alive:", 11) != 0 && strncasecmp(h, "Upgrade:", 8) != 0) {
            memcpy(out + o, h, l + 2);
            o += (int)l + 2;
        }
        h = e + 2;
    }
    o += snprintf(out + o, 40, "Connection: close\r\n\r\n");
    if (send_all(up, out, (size_t)o) == 0) {
        if ((size_t)hlen < got)
            send_all(up, head + hlen, got - (size_t)hlen);
        relay(px, fd, up);
    }
    free(out);
    close(up);
}

static void *conn_thread(void *arg)
{
    proxy_conn *c = arg;
    egproxy *px = c->px;
    if (px->policy)
        serve_policy(px, c->fd);
    else
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
    egproxy *px = arg;
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

/* policy: owned by the proxy from here (NULL: the exact list). */
static egproxy *start(int listen_fd, const char *const *allowed, egpolicy *policy, char *err,
                      size_t errlen)
{
    egproxy *px = calloc(1, sizeof *px);
    if (!px || pipe2(px->stop_pipe, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "egproxy: %s", strerror(errno));
        free(px);
        free(policy);
        close(listen_fd);
        return NULL;
    }
    px->listen_fd = listen_fd;
    for (int i = 0; allowed && allowed[i] && i < PROXY_ALLOWED_MAX; i++)
        px->allowed[i] = strdup(allowed[i]);
    px->refused = json_array();
    px->policy = policy;
    px->log_tokens = EGPROXY_LOG_BURST;
    pthread_mutex_init(&px->lock, NULL);
    pthread_cond_init(&px->done, NULL);
    /* the operator's test resolver (egdns.h) */
    const char *dns = policy ? getenv(EGDNS_ENV) : NULL;
    px->use_dns = dns && *dns;
    if (px->use_dns && egdns_parse_server(dns, &px->dns) < 0) {
        snprintf(err, errlen, "egproxy: %s=\"%.80s\" is not an IPv4 address and port", EGDNS_ENV,
                 dns);
        egproxy_stop(&px);
        return NULL;
    }
    /* the proxy's threads (the acceptor and every connection's, which
     * inherit its mask) take no signal: the host process's handlers and
     * its event loop keep them all */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&px->acceptor, NULL, accept_thread, px);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        snprintf(err, errlen, "egproxy: cannot start its thread");
        px->acceptor = 0;
        egproxy_stop(&px);
        return NULL;
    }
    return px;
}

egproxy *egproxy_start(int listen_fd, const char *const *allowed, char *err, size_t errlen)
{
    return start(listen_fd, allowed, NULL, err, errlen);
}

egproxy *egproxy_start_policy(int listen_fd, const egpolicy *policy, char *err, size_t errlen)
{
    egpolicy *copy = malloc(sizeof *copy);
    if (!copy) {
        snprintf(err, errlen, "egress proxy: out of memory");
        close(listen_fd);
        return NULL;
    }
    *copy = *policy;
    return start(listen_fd, NULL, copy, err, errlen);
}

void egproxy_stop(egproxy **pp)
{
    if (!pp || !*pp)
        return;
    egproxy *px = *pp;
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
    free(px->policy);
    pthread_mutex_destroy(&px->lock);
    pthread_cond_destroy(&px->done);
    free(px);
    *pp = NULL;
}

json_t *egproxy_report(egproxy *px)
{
    pthread_mutex_lock(&px->lock);
    json_t *r = json_pack("{s:i,s:O}", "allowed", px->n_allowed_conn, "refused", px->refused);
    pthread_mutex_unlock(&px->lock);
    return r;
}

void egproxy_log_limit(egproxy *px, unsigned long long bytes)
{
    pthread_mutex_lock(&px->lock);
    px->log_max = bytes;
    pthread_mutex_unlock(&px->lock);
}

long long egproxy_refusals(egproxy *px, char *last, size_t lastlen)
{
    pthread_mutex_lock(&px->lock);
    long long n = px->n_refused;
    if (last)
        snprintf(last, lastlen, "%s", px->last_refused);
    pthread_mutex_unlock(&px->lock);
    return n;
}

int egproxy_restricted_literal(const char *lit)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, lit, &in->sin_addr) == 1)
        in->sin_family = AF_INET;
    else if (inet_pton(AF_INET6, lit, &in6->sin6_addr) == 1)
        in6->sin6_family = AF_INET6;
    else
        return -1;
    return restricted_addr((struct sockaddr *)&ss);
}
