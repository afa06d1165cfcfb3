/*
 * test_gateway.c — the HTTP gateway (kernelmgr/frontends/gateway.c and the
 * lws files beside it) in a real daemon serving HTTP as `serve --http` does
 * (fake_daemon.h), in front of the fake kernel, on 127.0.0.1 with a fixed
 * token, spoken to over plain sockets as HTTP/1.1 with "Connection: close":
 * health without the token, the token and Host checks, the Jupyter kernels
 * REST API (specs, start, list, get, interrupt, restart, delete, 404s), the
 * kernelmgr JSON-RPC endpoint (exec into a session, errors in JSON-RPC's own
 * form, a malformed body, a method a remote client may not call), the
 * body limit, and its WebSockets with a client of our own (RFC 6455): a
 * kernel's channels (a malformed message dropped, kernel_info and a cell
 * answered, a foreign Origin refused) and the JSON-RPC socket (a streamed
 * exec's events, then its response).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include "common/cm_clock.h"
#include "kernelmgr/frontends/gateway.h"
#include "kernelmgr/frontends/gwdaemon.h"
#include "tests/unit/fake_daemon.h"
#include "tests/unit/fake_kernel.h"

#define WATCHDOG_S 120
#define TOKEN "unit-test-token-0123456789abcdef"

typedef struct world {
    char home[64];
    char link[PATH_MAX];
    pid_t daemon;
    int port; /* its gateway's */
} world;

/* One HTTP exchange: the status, the response's headers and body (owned). */
typedef struct response {
    int status;
    char *headers;
    char *body;
} response;

static void response_free(response *r)
{
    free(r->headers);
    free(r->body);
}

/* Decodes a chunked body in place. */
static void dechunk(char *b)
{
    char *in = b, *out = b;
    for (;;) {
        char *end;
        unsigned long n = strtoul(in, &end, 16);
        if (end == in || strncmp(end, "\r\n", 2))
            break;
        in = end + 2;
        if (!n)
            break;
        memmove(out, in, n);
        out += n;
        in += n + 2;
    }
    *out = 0;
}

/* METHOD path with extra header lines (each ending in \r\n; NULL: none)
 * and a body (NULL: none). auth: send the token. host: the Host header
 * (NULL: 127.0.0.1:PORT). */
static response http_ex(world *w, const char *method, const char *path, int auth, const char *host,
                        const char *extra, const char *body)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)w->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char hostbuf[64];
    snprintf(hostbuf, sizeof hostbuf, "127.0.0.1:%d", w->port);
    char *req = NULL;
    size_t blen = body ? strlen(body) : 0;
    assert_true(asprintf(&req,
                         "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n%s%s"
                         "Content-Length: %zu\r\n%s\r\n",
                         method, path, host ? host : hostbuf,
                         auth ? "Authorization: token " TOKEN "\r\n" : "",
                         body ? "Content-Type: application/json\r\n" : "", blen,
                         extra ? extra : "") > 0);
    size_t rlen = strlen(req);
    assert_true(write(fd, req, rlen) == (ssize_t)rlen);
    free(req);
    for (size_t off = 0; off < blen;) {
        ssize_t n = write(fd, body + off, blen - off);
        if (n < 0 && errno == EPIPE)
            break; /* refused before the whole body: its answer is below */
        assert_true(n > 0);
        off += (size_t)n;
    }
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    double end = cm_mono_s() + 60;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        assert_true(cm_mono_s() < end);
        if (poll(&p, 1, 1000) <= 0)
            continue;
        if (len + 4096 > cap) {
            char *more = realloc(buf, cap *= 2);
            assert_non_null(more);
            buf = more;
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == ECONNRESET)
            break;
        assert_true(n >= 0);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    buf[len] = 0;
    response r = {0, NULL, NULL};
    assert_int_equal(sscanf(buf, "HTTP/1.1 %d", &r.status), 1);
    char *sep = strstr(buf, "\r\n\r\n");
    assert_non_null(sep);
    *sep = 0;
    r.headers = strdup(buf);
    r.body = strdup(sep + 4);
    free(buf);
    assert_non_null(r.headers);
    assert_non_null(r.body);
    if (strcasestr(r.headers, "transfer-encoding: chunked"))
        dechunk(r.body);
    return r;
}

static response http(world *w, const char *method, const char *path, const char *body)
{
    return http_ex(w, method, path, 1, NULL, NULL, body);
}

/* r's status is want; its body as JSON (new) when it has one. */
static json_t *expect(const response *r, int want)
{
    if (r->status != want)
        print_message("status %d (want %d)\n%s\n\n%s\n", r->status, want, r->headers, r->body);
    assert_int_equal(r->status, want);
    if (!r->body[0])
        return NULL;
    json_error_t je;
    json_t *j = json_loads(r->body, 0, &je);
    if (!j)
        print_message("not JSON (%s): %s\n", je.text, r->body);
    assert_non_null(j);
    return j;
}

/* A daemon (fake_daemon.h) that serves HTTP as `kernelmgr serve --http`
 * does: the gateway inside the daemon, its manager the daemon's. Forked
 * from this process, which never makes a ZeroMQ context (none may cross a
 * fork): the test speaks HTTP over plain sockets only. */
static int setup(void **state)
{
    alarm(WATCHDOG_S);
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_int_equal(fake_tmp_dir(w->home, sizeof w->home, "test_gwd"), 0);
    json_t *http = json_pack("{s:s, s:s, s:i}", "http", "127.0.0.1:0", "http_token", TOKEN,
                             "http_max_body", 4096);
    fake_daemon_config(w->home, w->link, sizeof w->link, http);
    json_decref(http);
    w->daemon = fake_daemon_start(w->home, &gwdaemon_ops);
    char info[PATH_MAX];
    snprintf(info, sizeof info, "%s/http.json", w->home);
    double end = cm_mono_s() + 60;
    json_t *j;
    while (!(j = json_load_file(info, 0, NULL))) {
        assert_true(cm_mono_s() < end);
        usleep(20 * 1000); /* polls a condition, with a deadline */
    }
    w->port = (int)json_integer_value(json_object_get(j, "port"));
    json_decref(j);
    assert_true(w->port > 0);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    fake_daemon_stop(w->home, w->daemon);
    fake_tmp_remove(w->home);
    free(w);
    alarm(0);
    return 0;
}

/* Health needs no token; everything else does, and a Host that names the
 * gateway. */
static void health_token_and_host(void **state)
{
    world *w = *state;
    response r = http_ex(w, "GET", "/healthz", 0, NULL, NULL, NULL);
    json_t *j = expect(&r, 200);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
    response_free(&r);
    r = http_ex(w, "GET", "/readyz", 0, NULL, NULL, NULL);
    j = expect(&r, 200);
    assert_string_equal(json_string_value(json_object_get(j, "status")), "ready");
    json_decref(j);
    response_free(&r);

    r = http_ex(w, "GET", "/api", 0, NULL, NULL, NULL);
    assert_int_equal(r.status, 401);
    assert_null(strstr(r.body, "version"));
    response_free(&r);
    r = http_ex(w, "GET", "/api", 0, NULL, "Authorization: token wrong-token-0123456789\r\n", NULL);
    assert_int_equal(r.status, 401);
    response_free(&r);
    r = http_ex(w, "GET", "/api?token=" TOKEN, 0, NULL, NULL, NULL);
    json_decref(expect(&r, 200));
    response_free(&r);
    r = http(w, "GET", "/api", NULL);
    j = expect(&r, 200);
    assert_true(json_is_string(json_object_get(j, "version")));
    json_decref(j);
    response_free(&r);
    /* a page of another site that made the browser ask (DNS rebinding) */
    r = http_ex(w, "GET", "/api", 1, "evil.example:80", NULL, NULL);
    assert_int_equal(r.status, 403);
    response_free(&r);
    /* the name is checked, not the port (a proxy in front forwards its own) */
    r = http_ex(w, "GET", "/api", 1, "localhost:1", NULL, NULL);
    json_decref(expect(&r, 200));
    response_free(&r);
}

/* Start, list, get, interrupt, restart and delete a kernel the Jupyter way. */
static void kernels_rest(void **state)
{
    world *w = *state;
    response r = http(w, "GET", "/api/kernelspecs", NULL);
    json_t *j = expect(&r, 200);
    assert_non_null(json_object_get(json_object_get(j, "kernelspecs"), "kernelmgr-fake"));
    json_decref(j);
    response_free(&r);
    r = http(w, "GET", "/api/kernelspecs/kernelmgr-fake", NULL);
    j = expect(&r, 200);
    assert_string_equal(json_string_value(json_object_get(j, "name")), "kernelmgr-fake");
    json_decref(j);
    response_free(&r);
    r = http(w, "GET", "/api/kernelspecs/kernelmgr-cobol", NULL);
    json_decref(expect(&r, 404));
    response_free(&r);

    r = http(w, "POST", "/api/kernels", "{\"name\":\"kernelmgr-fake\"}");
    j = expect(&r, 201);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(j, "id")));
    assert_true(strlen(id) == 36);
    const char *session =
        json_string_value(json_object_get(json_object_get(j, "kernelmgr"), "session"));
    assert_non_null(session);
    assert_int_equal(strncmp(session, "jupyter-", 8), 0);
    json_decref(j);
    response_free(&r);

    r = http(w, "GET", "/api/kernels", NULL);
    j = expect(&r, 200);
    assert_int_equal(json_array_size(j), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(j, 0), "id")), id);
    json_decref(j);
    response_free(&r);

    char path[160];
    snprintf(path, sizeof path, "/api/kernels/%s", id);
    r = http(w, "GET", path, NULL);
    j = expect(&r, 200);
    assert_string_equal(json_string_value(json_object_get(j, "name")), "kernelmgr-fake");
    json_decref(j);
    response_free(&r);
    snprintf(path, sizeof path, "/api/kernels/%s/interrupt", id);
    r = http(w, "POST", path, "{}");
    assert_int_equal(r.status, 204);
    response_free(&r);
    snprintf(path, sizeof path, "/api/kernels/%s/restart", id);
    r = http(w, "POST", path, "{}");
    json_decref(expect(&r, 200));
    response_free(&r);
    snprintf(path, sizeof path, "/api/kernels/%s", id);
    r = http(w, "DELETE", path, NULL);
    assert_int_equal(r.status, 204);
    response_free(&r);
    r = http(w, "GET", path, NULL);
    json_decref(expect(&r, 404));
    response_free(&r);
    r = http(w, "GET", "/api/kernels/00000000-0000-0000-0000-000000000000", NULL);
    json_decref(expect(&r, 404));
    response_free(&r);
    r = http(w, "POST", "/api/kernels", "{\"name\":\"kernelmgr-cobol\"}");
    assert_true(r.status >= 400 && r.status < 500);
    response_free(&r);
    r = http(w, "POST", "/api/kernels", "{\"name\":");
    assert_int_equal(r.status, 400);
    response_free(&r);
    r = http(w, "GET", "/api/nothing-here", NULL);
    assert_int_equal(r.status, 404);
    response_free(&r);
}

/* The kernelmgr API over HTTP: exec into a session, then the session is
 * one the agent's tools see; JSON-RPC's own errors for bad requests. */
static void jsonrpc_endpoint(void **state)
{
    world *w = *state;
    response r = http(w, "POST", "/api/kernelmgr",
                      "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"exec\",\"params\":{"
                      "\"session\":\"web\",\"lang\":\"fake\",\"code\":\"out over http\"}}");
    json_t *j = expect(&r, 200);
    assert_int_equal(json_integer_value(json_object_get(j, "id")), 7);
    json_t *res = json_object_get(j, "result");
    if (!res)
        print_message("%s\n", r.body);
    assert_non_null(res);
    json_t *b = json_array_get(json_object_get(res, "results"), 0);
    assert_string_equal(json_string_value(json_object_get(b, "stdout")), "over http\n");
    json_decref(j);
    response_free(&r);

    r = http(w, "POST", "/api/kernelmgr",
             "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"sessions.list\",\"params\":{}}");
    j = expect(&r, 200);
    assert_non_null(strstr(r.body, "\"web\""));
    json_decref(j);
    response_free(&r);

    r = http(w, "POST", "/api/kernelmgr",
             "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"frobnicate\",\"params\":{}}");
    j = expect(&r, 200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "code")),
                     -32601);
    json_decref(j);
    response_free(&r);
    r = http(w, "POST", "/api/kernelmgr", "{\"jsonrpc\":\"2.0\",\"id\":");
    j = expect(&r, 200);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "error"), "code")),
                     -32700);
    json_decref(j);
    response_free(&r);
    /* the operator's trust is a ceiling: a remote client cannot run a daemon
     * method that is the operator's alone */
    r = http(w, "POST", "/api/kernelmgr",
             "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"shutdown\",\"params\":{}}");
    j = expect(&r, 200);
    const char *why = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    if (!why || !strstr(why, "shutdown"))
        print_message("%s\n", r.body);
    assert_non_null(why);
    assert_non_null(strstr(why, "shutdown"));
    json_decref(j);
    response_free(&r);
    /* still served */
    r = http(w, "GET", "/api", NULL);
    json_decref(expect(&r, 200));
    response_free(&r);
}

/* A body over max_body (4096 here) is refused whole, and the gateway
 * serves on. */
static void body_limit(void **state)
{
    world *w = *state;
    size_t n = 64 * 1024;
    char *big = malloc(n + 64);
    assert_non_null(big);
    int k = snprintf(big, n + 64, "{\"name\":\"");
    memset(big + k, 'a', n);
    strcpy(big + k + n, "\"}");
    response r = http(w, "POST", "/api/kernels", big);
    free(big);
    if (r.status != 413)
        print_message("%d %s\n", r.status, r.body);
    assert_int_equal(r.status, 413);
    response_free(&r);
    r = http(w, "GET", "/api", NULL);
    json_decref(expect(&r, 200));
    response_free(&r);
}

/* ---------------------------------------------------------------- WebSockets */

/* A WebSocket client of its own (RFC 6455): masked frames out, frames in
 * through a buffer that may hold bytes read with the handshake. */
typedef struct wsconn {
    int fd;
    char *buf;
    size_t len, cap;
} wsconn;

static void ws_fill(wsconn *c, size_t want)
{
    double end = cm_mono_s() + 60;
    while (c->len < want) {
        assert_true(cm_mono_s() < end);
        if (c->len + 65536 > c->cap) {
            char *more = realloc(c->buf, c->cap = (c->len + 65536) * 2);
            assert_non_null(more);
            c->buf = more;
        }
        struct pollfd p = {c->fd, POLLIN, 0};
        if (poll(&p, 1, 1000) <= 0)
            continue;
        ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len);
        if (n <= 0)
            fail_msg("the gateway closed the WebSocket (%zd)", n);
        c->len += (size_t)n;
    }
}

static void ws_take(wsconn *c, size_t n)
{
    memmove(c->buf, c->buf + n, c->len - n);
    c->len -= n;
}

/* Opens path as a WebSocket; origin: an Origin header (NULL: none, as a
 * program sends). Returns the HTTP status of the upgrade (101 when open). */
static int ws_open(world *w, wsconn *c, const char *path, const char *origin)
{
    memset(c, 0, sizeof *c);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(c->fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)w->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(c->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char *req = NULL;
    assert_true(asprintf(&req,
                         "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\n"
                         "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                         "Sec-WebSocket-Version: 13\r\nAuthorization: token " TOKEN "\r\n"
                         "%s%s%s\r\n",
                         path, w->port, origin ? "Origin: " : "", origin ? origin : "",
                         origin ? "\r\n" : "") > 0);
    size_t n = strlen(req);
    assert_true(write(c->fd, req, n) == (ssize_t)n);
    free(req);
    char *end = NULL;
    while (!end) {
        ws_fill(c, c->len + 1);
        c->buf[c->len] = 0; /* ws_fill leaves room */
        end = strstr(c->buf, "\r\n\r\n");
    }
    int status = 0;
    if (sscanf(c->buf, "HTTP/1.%*d %d", &status) != 1) /* lws refuses in 1.0 */
        print_message("not an HTTP answer: %.200s\n", c->buf);
    assert_true(status > 0);
    ws_take(c, (size_t)(end + 4 - c->buf));
    return status;
}

static void ws_close(wsconn *c)
{
    close(c->fd);
    free(c->buf);
}

static void ws_send(wsconn *c, const char *text)
{
    size_t n = strlen(text);
    unsigned char hdr[14];
    size_t h = 0;
    hdr[h++] = 0x81; /* FIN, text */
    if (n < 126) {
        hdr[h++] = (unsigned char)(0x80 | n);
    } else if (n < 65536) {
        hdr[h++] = 0x80 | 126;
        hdr[h++] = (unsigned char)(n >> 8);
        hdr[h++] = (unsigned char)n;
    } else {
        hdr[h++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            hdr[h++] = (unsigned char)((uint64_t)n >> (8 * i));
    }
    static const unsigned char mask[4] = {0x12, 0x34, 0x56, 0x78};
    memcpy(hdr + h, mask, 4);
    h += 4;
    unsigned char *frame = malloc(h + n);
    assert_non_null(frame);
    memcpy(frame, hdr, h);
    for (size_t i = 0; i < n; i++)
        frame[h + i] = (unsigned char)text[i] ^ mask[i % 4];
    assert_true(write(c->fd, frame, h + n) == (ssize_t)(h + n));
    free(frame);
}

/* The next whole text message (new), answering pings. */
static char *ws_recv(wsconn *c)
{
    char *msg = NULL;
    size_t mlen = 0;
    for (;;) {
        ws_fill(c, 2);
        unsigned char *b = (unsigned char *)c->buf;
        int fin = b[0] & 0x80, op = b[0] & 0x0f;
        assert_false(b[1] & 0x80); /* a server never masks */
        uint64_t n = b[1] & 0x7f;
        size_t h = 2;
        if (n == 126) {
            ws_fill(c, 4);
            b = (unsigned char *)c->buf;
            n = (uint64_t)b[2] << 8 | b[3];
            h = 4;
        } else if (n == 127) {
            ws_fill(c, 10);
            b = (unsigned char *)c->buf;
            n = 0;
            for (int i = 0; i < 8; i++)
                n = n << 8 | b[2 + i];
            h = 10;
        }
        ws_fill(c, h + n);
        if (op == 8)
            fail_msg("the gateway closed the WebSocket: %.*s", (int)(n > 2 ? n - 2 : 0),
                     c->buf + h + 2);
        if (op == 9 || op == 10) { /* a ping (answered below) or a pong */
            ws_take(c, h + n);
            continue;
        }
        char *more = realloc(msg, mlen + n + 1);
        assert_non_null(more);
        msg = more;
        memcpy(msg + mlen, c->buf + h, n);
        mlen += n;
        msg[mlen] = 0;
        ws_take(c, h + n);
        if (fin)
            return msg;
    }
}

/* The next message, which must be JSON (new). */
static json_t *ws_recv_json(wsconn *c)
{
    char *m = ws_recv(c);
    json_t *o = json_loads(m, 0, NULL);
    if (!o)
        print_message("not JSON: %s\n", m);
    free(m);
    assert_non_null(o);
    return o;
}

/* A Jupyter message of the JSON form (new text). */
static char *jupyter_msg(const char *channel, const char *msg_type, const char *id, json_t *content)
{
    json_t *m =
        json_pack("{s:{s:s, s:s, s:s, s:s, s:s, s:s}, s:{}, s:{}, s:o, s:s, s:[]}", "header",
                  "msg_id", id, "msg_type", msg_type, "session", "unit", "username", "test", "date",
                  "2026-12-03T00:00:00Z", "version", "5.3", "parent_header", "metadata", "content",
                  content, "channel", channel, "buffers");
    assert_non_null(m);
    char *t = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    assert_non_null(t);
    return t;
}

/* The kernel WebSocket of a kernel started over REST: a malformed message
 * is dropped and the connection stays; kernel_info and a cell are answered,
 * the cell's output arrives on iopub; an upgrade from a foreign Origin is
 * refused. */
static void kernel_websocket(void **state)
{
    world *w = *state;
    response r = http(w, "POST", "/api/kernels", "{\"name\":\"kernelmgr-fake\"}");
    json_t *j = expect(&r, 201);
    char path[160];
    snprintf(path, sizeof path, "/api/kernels/%s/channels",
             json_string_value(json_object_get(j, "id")));
    json_decref(j);
    response_free(&r);

    wsconn c;
    int st = ws_open(w, &c, path, "http://evil.example");
    assert_int_equal(st, 403);
    ws_close(&c);

    assert_int_equal(ws_open(w, &c, path, NULL), 101);
    ws_send(&c, "this is not a Jupyter message");
    char *t = jupyter_msg("shell", "kernel_info_request", "ki-1", json_object());
    ws_send(&c, t);
    free(t);
    t = jupyter_msg("shell", "execute_request", "ex-1",
                    json_pack("{s:s, s:b, s:b, s:{}, s:b}", "code", "out via websocket", "silent",
                              0, "store_history", 1, "user_expressions", "allow_stdin", 0));
    ws_send(&c, t);
    free(t);
    int info = 0, reply = 0, idle = 0;
    char out[256] = "";
    while (!(info && reply && idle)) {
        json_t *o = ws_recv_json(&c);
        const char *type =
            json_string_value(json_object_get(json_object_get(o, "header"), "msg_type"));
        const char *parent =
            json_string_value(json_object_get(json_object_get(o, "parent_header"), "msg_id"));
        const char *ch = json_string_value(json_object_get(o, "channel"));
        json_t *content = json_object_get(o, "content");
        assert_non_null(type);
        if (parent && !strcmp(parent, "ki-1") && !strcmp(type, "kernel_info_reply")) {
            assert_string_equal(ch, "shell");
            info = 1;
        }
        if (parent && !strcmp(parent, "ex-1")) {
            if (!strcmp(type, "execute_reply")) {
                assert_string_equal(json_string_value(json_object_get(content, "status")), "ok");
                reply = 1;
            } else if (!strcmp(type, "stream")) {
                assert_string_equal(ch, "iopub");
                strncat(out, json_string_value(json_object_get(content, "text")),
                        sizeof out - strlen(out) - 1);
            } else if (!strcmp(type, "status") &&
                       !strcmp(json_string_value(json_object_get(content, "execution_state")),
                               "idle")) {
                idle = 1;
            }
        }
        json_decref(o);
    }
    assert_string_equal(out, "via websocket\n");
    ws_close(&c);
}

/* The kernelmgr API over a WebSocket: a streamed exec sends its events,
 * then its response; a second request on the same connection is served. */
static void jsonrpc_websocket(void **state)
{
    world *w = *state;
    wsconn c;
    assert_int_equal(ws_open(w, &c, "/api/kernelmgr/ws", NULL), 101);
    ws_send(&c, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"exec\",\"params\":{\"session\":"
                "\"wsrpc\",\"lang\":\"fake\",\"code\":\"out streamed\",\"stream\":true}}");
    int events = 0;
    json_t *resp = NULL;
    while (!resp) {
        json_t *o = ws_recv_json(&c);
        if (json_object_get(o, "id")) {
            resp = o;
        } else {
            assert_non_null(json_object_get(o, "method")); /* a notification */
            events++;
            json_decref(o);
        }
    }
    json_t *res = json_object_get(resp, "result");
    if (!res) {
        char *d = json_dumps(resp, JSON_COMPACT);
        print_message("%s\n", d);
        free(d);
    }
    assert_non_null(res);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(res, "results"), 0), "stdout")),
                        "streamed\n");
    assert_true(events > 0);
    json_decref(resp);
    ws_send(&c, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}");
    json_t *o = ws_recv_json(&c);
    assert_int_equal(json_integer_value(json_object_get(o, "id")), 2);
    assert_non_null(json_object_get(o, "result"));
    json_decref(o);
    ws_close(&c);
}

int main(int argc, char **argv)
{
    int part = fake_kernel_main(argc, argv);
    if (part >= 0)
        return part;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(health_token_and_host, setup, teardown),
        cmocka_unit_test_setup_teardown(kernels_rest, setup, teardown),
        cmocka_unit_test_setup_teardown(jsonrpc_endpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(body_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(kernel_websocket, setup, teardown),
        cmocka_unit_test_setup_teardown(jsonrpc_websocket, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
