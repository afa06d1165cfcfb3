/*
 * gwapi.c — the kernelmgr API for HTTP clients, passed to the daemon's
 * socket (see gwapi.h).
 */
#include "kernelmgr/frontends/gwapi.h"
#include "kernelmgr/service/daemon.h"
#include "kernelmgr/service/rpc.h"
#include "common/cm_io.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* the daemon could not be talked to: KM_EDAEMON's code (rpc.h), without data */
#define GWAPI_SERVER_ERROR rpc_code_from_km(KM_EDAEMON)

static json_t *error_response(const json_t *id, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static json_t *error_response(const json_t *id, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return rpc_error(id, code, msg, NULL);
}

json_t *gwapi_check(const json_t *req, const char *scope)
{
    /* what an HTTP client may ask for is the daemon's table (dtier.h): the
     * connection declared the http tier */
    const json_t *id = json_object_get(req, "id");
    const char *method = json_string_value(json_object_get(req, "method"));
    if (!json_is_object(req) || !method)
        return error_response(id, RPC_INVALID_REQUEST,
                              "invalid request: a JSON-RPC 2.0 object with a method "
                              "is expected");
    /* the balancer routed by the prefix or header: a body naming another
     * session would act on a session that lives on another node */
    const json_t *sess = json_object_get(json_object_get(req, "params"), "session");
    if (scope && scope[0] && json_is_string(sess) && strcmp(json_string_value(sess), scope)) {
        char msg[512];
        snprintf(msg, sizeof msg,
                 "%s: field \"session\": \"%.64s\" is not the session this "
                 "request was routed by, \"%s\" (its /s/%s/ prefix or "
                 "X-Kernelmgr-Session header)",
                 method, json_string_value(sess), scope, scope);
        /* as the daemon's own -32602: data.km_code (docs/API.md) */
        return rpc_error_params(id, msg);
    }
    return NULL;
}

/* A connection to the daemon of home at the http tier: fd, or -1 with the
 * reason in err. */
static int connect_http(const char *home, km_err *err)
{
    int fd = daemon_connect(home, 0, NULL, err);
    if (fd >= 0 && daemon_declare_tier(fd, "http", NULL, 0, err)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* ---------------------------------------------------------------- lines */

typedef struct linebuf {
    char *buf;
    size_t len, cap;
} linebuf;

/* Appends n bytes; -1 past max. */
static int lb_add(linebuf *b, const char *p, size_t n, size_t max)
{
    if (b->len + n > max)
        return -1;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 8192;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *nb = realloc(b->buf, cap);
        if (!nb)
            return -1;
        b->buf = nb;
        b->cap = cap;
    }
    memcpy(b->buf + b->len, p, n);
    b->len += n;
    return 0;
}

/* Takes the first complete line (without '\n'): new, or NULL. */
static char *lb_line(linebuf *b, size_t *len)
{
    char *nl = b->len ? memchr(b->buf, '\n', b->len) : NULL;
    if (!nl)
        return NULL;
    size_t n = (size_t)(nl - b->buf);
    char *line = malloc(n + 1);
    if (!line)
        return NULL;
    memcpy(line, b->buf, n);
    line[n] = 0;
    memmove(b->buf, nl + 1, b->len - n - 1);
    b->len -= n + 1;
    *len = n;
    return line;
}

static int send_line(int fd, const json_t *o)
{
    char *t = json_dumps(o, JSON_COMPACT);
    if (!t)
        return -1;
    size_t n = strlen(t);
    t[n] = '\n';
    int rc = cm_write_all(fd, t, n + 1);
    free(t);
    return rc;
}

json_t *gwapi_call(const char *home, const json_t *req, size_t max_line)
{
    const json_t *id = json_object_get(req, "id");
    km_err err = {0, ""};
    int fd = connect_http(home, &err);
    if (fd < 0)
        return error_response(id, GWAPI_SERVER_ERROR, "the daemon: %s", err.msg);
    json_t *out = NULL;
    linebuf b = {0};
    if (send_line(fd, req)) {
        out = error_response(id, GWAPI_SERVER_ERROR, "cannot write to the daemon: %s",
                             strerror(errno));
        goto done;
    }
    for (;;) {
        size_t len;
        char *line;
        while ((line = lb_line(&b, &len))) {
            json_t *o = json_loadb(line, len, 0, NULL);
            free(line);
            /* the response: an id and no method (notifications have one) */
            if (o && !json_object_get(o, "method") && json_object_get(o, "id")) {
                out = o;
                goto done;
            }
            json_decref(o);
        }
        char chunk[65536];
        ssize_t r = read(fd, chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            out = error_response(id, GWAPI_SERVER_ERROR, "the daemon closed the connection");
            goto done;
        }
        if (lb_add(&b, chunk, (size_t)r, max_line)) {
            out = error_response(id, GWAPI_SERVER_ERROR,
                                 "the daemon's response is over the limit of %zu bytes", max_line);
            goto done;
        }
    }
done:
    free(b.buf);
    close(fd);
    return out;
}

/* ---------------------------------------------------------------- streaming */

typedef struct gwline {
    struct gwline *next;
    char *text;
    size_t len;
} gwline;

struct gwapi_conn {
    int fd, efd;
    char scope[KM_NAME_MAX + 1]; /* gwapi_check's, for every request */
    size_t max_pending;
    void (*wake)(void *);
    void *ud;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    int stop, failed;
    char why[256];
    gwline *out_head, *out_tail; /* for the client */
    size_t out_bytes;
    gwline *in_head, *in_tail; /* for the daemon */
    size_t in_bytes;
};

static void push(gwline **head, gwline **tail, gwline *l)
{
    if (*tail)
        (*tail)->next = l;
    else
        *head = l;
    *tail = l;
}

static gwline *take(gwline **head, gwline **tail)
{
    gwline *l = *head;
    if (l) {
        *head = l->next;
        if (!*head)
            *tail = NULL;
        l->next = NULL;
    }
    return l;
}

static void free_lines(gwline *l)
{
    while (l) {
        gwline *n = l->next;
        free(l->text);
        free(l);
        l = n;
    }
}

/* Queues text (stolen) for the client; fails the connection past the limit.
 * Under mu. */
static void to_client_locked(gwapi_conn *c, char *text, size_t len)
{
    gwline *l = calloc(1, sizeof *l);
    if (!l || c->out_bytes + len > c->max_pending) {
        if (!c->failed) {
            c->failed = 1;
            snprintf(c->why, sizeof c->why,
                     "the client did not read its messages: %zu bytes waiting (limit %zu)",
                     c->out_bytes + len, c->max_pending);
        }
        free(l);
        free(text);
        return;
    }
    l->text = text;
    l->len = len;
    c->out_bytes += len;
    push(&c->out_head, &c->out_tail, l);
}

static void *conn_main(void *arg)
{
    gwapi_conn *c = arg;
    linebuf b = {0};
    for (;;) {
        struct pollfd pf[2] = {{c->fd, POLLIN, 0}, {c->efd, POLLIN, 0}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[1].revents & POLLIN) {
            uint64_t v;
            if (read(c->efd, &v, sizeof v) < 0) {
                /* EAGAIN: nothing */
            }
        }
        pthread_mutex_lock(&c->mu);
        int stop = c->stop || c->failed;
        gwline *in = c->in_head;
        c->in_head = c->in_tail = NULL;
        c->in_bytes = 0;
        pthread_mutex_unlock(&c->mu);
        for (gwline *l = in; l && !stop; l = l->next)
            if (cm_write_all(c->fd, l->text, l->len) || cm_write_all(c->fd, "\n", 1)) {
                pthread_mutex_lock(&c->mu);
                c->failed = 1;
                snprintf(c->why, sizeof c->why, "cannot write to the daemon: %s", strerror(errno));
                pthread_mutex_unlock(&c->mu);
                stop = 1;
            }
        free_lines(in);
        if (stop)
            break;
        if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            char chunk[65536];
            ssize_t r = read(c->fd, chunk, sizeof chunk);
            if (r < 0 && errno == EINTR)
                continue;
            pthread_mutex_lock(&c->mu);
            if (r <= 0 || lb_add(&b, chunk, (size_t)r, c->max_pending)) {
                if (!c->failed) {
                    c->failed = 1;
                    snprintf(c->why, sizeof c->why, "%s",
                             r <= 0 ? "the daemon closed the connection"
                                    : "a daemon message over the pending limit");
                }
            } else {
                size_t len;
                char *line;
                while ((line = lb_line(&b, &len)))
                    to_client_locked(c, line, len);
            }
            int failed = c->failed;
            pthread_mutex_unlock(&c->mu);
            c->wake(c->ud);
            if (failed)
                break;
        }
    }
    free(b.buf);
    return NULL;
}

gwapi_conn *gwapi_open(const char *home, const char *scope, size_t max_pending,
                       void (*wake)(void *), void *ud, km_err *err)
{
    gwapi_conn *c = calloc(1, sizeof *c);
    if (!c) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return NULL;
    }
    snprintf(c->scope, sizeof c->scope, "%s", scope ? scope : "");
    c->fd = c->efd = -1;
    c->max_pending = max_pending;
    c->wake = wake;
    c->ud = ud;
    pthread_mutex_init(&c->mu, NULL);
    km_err e = {0, ""};
    c->fd = connect_http(home, &e);
    if (c->fd < 0) {
        km_err_set(err, KM_EUSAGE, "the daemon: %s", e.msg);
        gwapi_close(&c);
        return NULL;
    }
    c->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->efd < 0 || pthread_create(&c->thread, NULL, conn_main, c)) {
        km_err_set(err, KM_EUSAGE, "cannot start the API relay: %s", strerror(errno));
        gwapi_close(&c);
        return NULL;
    }
    c->started = 1;
    return c;
}

void gwapi_close(gwapi_conn **pc)
{
    if (!pc || !*pc)
        return;
    gwapi_conn *c = *pc;
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_mutex_unlock(&c->mu);
        uint64_t one = 1;
        if (write(c->efd, &one, sizeof one) < 0) {
            /* the counter is full: the thread wakes anyway */
        }
        pthread_join(c->thread, NULL);
    }
    if (c->fd >= 0)
        close(c->fd);
    if (c->efd >= 0)
        close(c->efd);
    free_lines(c->out_head);
    free_lines(c->in_head);
    pthread_mutex_destroy(&c->mu);
    free(c);
    *pc = NULL;
}

int gwapi_send(gwapi_conn *c, const char *text, size_t len)
{
    json_error_t je;
    json_t *req = json_loadb(text, len, 0, &je);
    json_t *refused = req ? gwapi_check(req, c->scope)
                          : json_pack("{s:s s:n s:{s:i s:s}}", "jsonrpc", "2.0", "id", "error",
                                      "code", -32700, "message", "parse error");
    pthread_mutex_lock(&c->mu);
    int rc = c->failed ? -1 : 0;
    if (!rc && refused) {
        char *t = json_dumps(refused, JSON_COMPACT);
        if (t)
            to_client_locked(c, t, strlen(t));
    } else if (!rc) {
        char *t = json_dumps(req, JSON_COMPACT); /* one line, whatever the client sent */
        gwline *l = t ? calloc(1, sizeof *l) : NULL;
        if (!l || c->in_bytes + strlen(t) > c->max_pending) {
            c->failed = 1;
            snprintf(c->why, sizeof c->why, "requests waiting for the daemon over %zu bytes",
                     c->max_pending);
            free(t);
            free(l);
            rc = -1;
        } else {
            l->text = t;
            l->len = strlen(t);
            c->in_bytes += l->len;
            push(&c->in_head, &c->in_tail, l);
        }
    }
    pthread_mutex_unlock(&c->mu);
    json_decref(req);
    json_decref(refused);
    if (!rc) {
        uint64_t one = 1;
        if (write(c->efd, &one, sizeof one) < 0) {
            /* full counter: still readable */
        }
        if (refused)
            c->wake(c->ud);
    }
    return rc;
}

int gwapi_pop(gwapi_conn *c, char **line, size_t *len)
{
    pthread_mutex_lock(&c->mu);
    gwline *l = take(&c->out_head, &c->out_tail);
    if (l)
        c->out_bytes -= l->len;
    pthread_mutex_unlock(&c->mu);
    if (!l)
        return 0;
    *line = l->text;
    *len = l->len;
    free(l);
    return 1;
}

int gwapi_failed(gwapi_conn *c, km_err *why)
{
    pthread_mutex_lock(&c->mu);
    int f = c->failed;
    if (f && why)
        km_err_set(why, KM_EUSAGE, "%s", c->why);
    pthread_mutex_unlock(&c->mu);
    return f;
}
