/*
 * test_km_egproxy.c — the installer's proxy (kernels/egress/egproxy.c) reaches
 * only its allowed host:port: CONNECT tunnels and absolute-URI forwarding to
 * it work; anything else gets 403 or 400 and is reported. Everything runs
 * on 127.0.0.1 with an in-process upstream server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernels/egress/egproxy.h"
#include "kernels/egress/egpolicy.h"

static int listen_any(unsigned short *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 16), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}

static int dial_port(unsigned short port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {
        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

/* The upstream "index": answers every request with "hi" and remembers the
 * last request head it saw. */
typedef struct upstream {
    int lfd;
    volatile int stop;
    char seen[4096];
    pthread_t th;
} upstream;

static void *upstream_main(void *arg)
{
    upstream *u = arg;
    while (!u->stop) {
        struct pollfd p = {.fd = u->lfd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        int c = accept(u->lfd, NULL, NULL);
        if (c < 0)
            continue;
        size_t got = 0;
        char buf[4096];
        while (got < sizeof buf - 1) {
            struct pollfd q = {.fd = c, .events = POLLIN};
            if (poll(&q, 1, 5000) <= 0)
                break;
            ssize_t n = read(c, buf + got, sizeof buf - 1 - got);
            if (n <= 0)
                break;
            got += (size_t)n;
            buf[got] = '\0';
            if (strstr(buf, "\r\n\r\n"))
                break;
        }
        buf[got] = '\0';
        memcpy(u->seen, buf, got + 1);
        const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi";
        ssize_t w = write(c, resp, sizeof resp - 1);
        (void)w;
        close(c);
    }
    return NULL;
}

/* Sends req, reads until the peer closes (or 5 s), returns the answer. */
static void roundtrip(int fd, const char *req, char *out, size_t outlen)
{
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t got = 0;
    while (got < outlen - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0)
            break;
        ssize_t n = read(fd, out + got, outlen - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
}

typedef struct fixture {
    upstream up;
    unsigned short up_port, px_port;
    egproxy *px;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    f->up.lfd = listen_any(&f->up_port);
    pthread_create(&f->up.th, NULL, upstream_main, &f->up);
    int plfd = listen_any(&f->px_port);
    char allowed[64], err[256];
    snprintf(allowed, sizeof allowed, "127.0.0.1:%u", f->up_port);
    const char *list[] = {allowed, NULL};
    f->px = egproxy_start(plfd, list, err, sizeof err);
    assert_non_null(f->px);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    egproxy_stop(&f->px);
    assert_null(f->px);
    f->up.stop = 1;
    pthread_join(f->up.th, NULL);
    close(f->up.lfd);
    free(f);
    return 0;
}

static void test_connect_allowed(void **state)
{
    fixture *f = *state;
    int fd = dial_port(f->px_port);
    char req[256], out[4096];
    snprintf(req, sizeof req, "CONNECT 127.0.0.1:%u HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n",
             f->up_port, f->up_port);
    assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    /* The tunnel is up: what we send now reaches the upstream verbatim. */
    char line[128];
    ssize_t n = read(fd, line, sizeof line - 1);
    assert_true(n > 0);
    line[n] = '\0';
    assert_non_null(strstr(line, "200 Connection established"));
    roundtrip(fd, "GET /tunnelled HTTP/1.1\r\nHost: x\r\n\r\n", out, sizeof out);
    assert_non_null(strstr(out, "\r\n\r\nhi"));
    assert_non_null(strstr(f->up.seen, "GET /tunnelled HTTP/1.1"));
    close(fd);
}

static void test_forward_allowed(void **state)
{
    fixture *f = *state;
    int fd = dial_port(f->px_port);
    char req[512], out[4096];
    snprintf(req, sizeof req,
             "GET http://127.0.0.1:%u/simple/tinypkg/ HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n"
             "Proxy-Connection: keep-alive\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n",
             f->up_port, f->up_port);
    roundtrip(fd, req, out, sizeof out);
    close(fd);
    assert_non_null(strstr(out, "200 OK"));
    assert_non_null(strstr(out, "\r\n\r\nhi"));
    /* Origin form, hop-by-hop headers replaced, the rest kept. */
    assert_true(strncmp(f->up.seen, "GET /simple/tinypkg/ HTTP/1.1\r\n", 31) == 0);
    assert_non_null(strstr(f->up.seen, "Connection: close\r\n"));
    assert_null(strstr(f->up.seen, "Proxy-Connection"));
    assert_null(strstr(f->up.seen, "keep-alive"));
    assert_non_null(strstr(f->up.seen, "Accept: */*\r\n"));
}

static void test_refusals(void **state)
{
    fixture *f = *state;
    char req[512], out[4096];
    unsigned up = f->up_port, other = f->up_port == 65535 ? 1 : f->up_port + 1u;
    const char *want[] = {"403", "403", "403", "403", "400", "400", "400", "400"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        switch (i) {
        case 0: /* another port */
            snprintf(req, sizeof req, "CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\n", other);
            break;
        case 1: /* another host */
            snprintf(req, sizeof req, "CONNECT pypi.org:443 HTTP/1.1\r\n\r\n");
            break;
        case 2: /* another host, right port */
            snprintf(req, sizeof req, "GET http://evil.example:%u/ HTTP/1.1\r\nHost: e\r\n\r\n",
                     up);
            break;
        case 3: /* another port */
            snprintf(req, sizeof req, "GET http://127.0.0.1:%u/ HTTP/1.1\r\n\r\n", other);
            break;
        case 4: /* credentials */
            snprintf(req, sizeof req, "GET http://user@127.0.0.1:%u/ HTTP/1.1\r\n\r\n", up);
            break;
        case 5: /* not a proxy request */
            snprintf(req, sizeof req, "GET /relative HTTP/1.1\r\n\r\n");
            break;
        case 6:
            snprintf(req, sizeof req, "garbage\r\n\r\n");
            break;
        default: /* no port */
            snprintf(req, sizeof req, "CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n");
            break;
        }
        int fd = dial_port(f->px_port);
        f->up.seen[0] = '\0';
        roundtrip(fd, req, out, sizeof out);
        close(fd);
        if (!strstr(out, want[i]))
            fail_msg("request %zu (%s): got '%.80s', expected %s", i, req, out, want[i]);
        assert_int_equal(f->up.seen[0], '\0'); /* the upstream saw nothing */
    }
    json_t *rep = egproxy_report(f->px);
    assert_true(json_array_size(json_object_get(rep, "refused")) >= 4);
    json_decref(rep);
}

static void test_oversized_head(void **state)
{
    fixture *f = *state;
    size_t n = 40000;
    char *big = malloc(n + 1);
    memset(big, 'a', n);
    memcpy(big, "GET http://x/ HTTP/1.1\r\nX: ", 27);
    big[n] = '\0';
    int fd = dial_port(f->px_port);
    char out[1024];
    /* The proxy stops reading at its limit and answers 400. */
    ssize_t w = send(fd, big, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
    size_t got = 0;
    while (got < sizeof out - 1) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0)
            break;
        ssize_t r = read(fd, out + got, sizeof out - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    out[got] = '\0';
    close(fd);
    free(big);
    assert_non_null(strstr(out, "400"));
}

/* A proxy of its own over f's upstream, for the allowed entry "HOST:port". */
static egproxy *proxy_for(fixture *f, const char *host, unsigned short *port)
{
    int plfd = listen_any(port);
    char allowed[300], err[256];
    snprintf(allowed, sizeof allowed, "%s:%u", host, f->up_port);
    const char *list[] = {allowed, NULL};
    egproxy *px = egproxy_start(plfd, list, err, sizeof err);
    assert_non_null(px);
    return px;
}

/* This host's own name resolves to an address of this host (here through
 * /etc/hosts, as a rebinding DNS answer would): listed by name, it is
 * refused by policy — the upstream hears nothing — while "localhost" and
 * the address literal, which name the host itself, keep working. */
static void test_host_only_addresses(void **state)
{
    fixture *f = *state;
    char name[256] = "";
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    if (gethostname(name, sizeof name - 1) < 0 || getaddrinfo(name, NULL, &hints, &res) != 0)
        skip();
    /* only where every address is loopback (/etc/hosts' usual 127.0.1.1):
     * anything else would be dialled, which this test must not depend on */
    int loopback = 1;
    for (struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET)
            loopback &= (ntohl(((struct sockaddr_in *)a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (a->ai_family == AF_INET6)
            loopback &= IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)a->ai_addr)->sin6_addr);
    freeaddrinfo(res);
    if (!loopback)
        skip();
    char req[512], out[4096];
    unsigned short port;
    egproxy *px = proxy_for(f, name, &port);
    for (size_t i = 0; i < 2; i++) {
        if (i == 0)
            snprintf(req, sizeof req, "CONNECT %s:%u HTTP/1.1\r\n\r\n", name, f->up_port);
        else
            snprintf(req, sizeof req, "GET http://%s:%u/simple/ HTTP/1.1\r\nHost: x\r\n\r\n", name,
                     f->up_port);
        int fd = dial_port(port);
        f->up.seen[0] = '\0';
        roundtrip(fd, req, out, sizeof out);
        close(fd);
        if (!strstr(out, "403") || !strstr(out, "refused by policy"))
            fail_msg("%s: got '%.200s', expected a 403 naming the policy", req, out);
        assert_int_equal(f->up.seen[0], '\0');
    }
    json_t *rep = egproxy_report(px);
    json_t *r0 = json_array_get(json_object_get(rep, "refused"), 0);
    assert_string_equal(json_string_value(json_object_get(r0, "reason")), EGPROXY_HOST_ONLY);
    json_decref(rep);
    egproxy_stop(&px);

    px = proxy_for(f, "localhost", &port);
    snprintf(req, sizeof req, "GET http://localhost:%u/simple/ HTTP/1.1\r\nHost: x\r\n\r\n",
             f->up_port);
    int fd = dial_port(port);
    roundtrip(fd, req, out, sizeof out);
    close(fd);
    assert_non_null(strstr(out, "\r\n\r\nhi"));
    egproxy_stop(&px);
}

/* Policy mode: the allowed forward request, a named 403, a tunnel whose
 * first bytes are no ClientHello (an alert, the upstream hears nothing),
 * a Host header naming another host; the counters and the report. */
static void test_policy_mode(void **state)
{
    fixture *f = *state;
    egproxy_stop(&f->px);
    unsigned short port;
    int plfd = listen_any(&port);
    char text[64], err[600], req[512], out[4096];
    snprintf(text, sizeof text, "allow:127.0.0.1:%u", f->up_port);
    egpolicy pol;
    assert_int_equal(egpolicy_parse_text(&pol, text, err, sizeof err), 0);
    f->px = egproxy_start_policy(plfd, &pol, err, sizeof err);
    assert_non_null(f->px);
    int fd = dial_port(port);
    snprintf(req, sizeof req, "GET http://127.0.0.1:%u/p HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
             f->up_port);
    roundtrip(fd, req, out, sizeof out);
    close(fd);
    assert_non_null(strstr(out, "\r\n\r\nhi"));
    assert_non_null(strstr(f->up.seen, "Host: 127.0.0.1:"));
    assert_null(strstr(f->up.seen, "Upgrade"));
    f->up.seen[0] = 0;
    fd = dial_port(port);
    roundtrip(fd, "GET http://pypi.org/ HTTP/1.1\r\n\r\n", out, sizeof out);
    close(fd);
    assert_non_null(strstr(out, "403 Forbidden"));
    assert_non_null(strstr(out, "kernelmgr: network policy allow-list: host pypi.org:80 is not "
                                "allowed (allowed: 127.0.0.1:"));
    fd = dial_port(port);
    snprintf(req, sizeof req, "CONNECT 127.0.0.1:%u HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n",
             f->up_port);
    roundtrip(fd, req, out, sizeof out);
    close(fd);
    assert_non_null(strstr(out, "200 Connection established"));
    assert_null(strstr(out, "hi"));
    fd = dial_port(port);
    snprintf(req, sizeof req, "GET http://127.0.0.1:%u/ HTTP/1.1\r\nHost: evil\r\n\r\n",
             f->up_port);
    roundtrip(fd, req, out, sizeof out);
    close(fd);
    assert_non_null(strstr(out, "does not name the request's host"));
    assert_string_equal(f->up.seen, "");
    char last[600];
    assert_int_equal(egproxy_refusals(f->px, last, sizeof last), 3);
    assert_non_null(strstr(last, "Host header"));
    json_t *r = egproxy_report(f->px);
    assert_int_equal(json_integer_value(json_object_get(r, "allowed")), 1);
    assert_int_equal(json_array_size(json_object_get(r, "refused")), 3);
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_connect_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_allowed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_head, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_only_addresses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policy_mode, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
