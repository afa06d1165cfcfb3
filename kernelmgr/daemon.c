/*
 * daemon.c — the unix-socket server and its client.
 *
 * Request fields (all optional unless noted):
 *   ping                                   -> {"ok","pid","home","pool"}
 *   exec     session*, code*, lang, timeout, continue_on_error, stream,
 *            network ("on"/"off"), memory ("2G"), python, workspace, sandbox,
 *            env ({NAME: "value"}, kernels/server/kenv.h rules)
 *                                          -> {"ok","results","failed","skipped"}
 *   sessions                               -> {"ok","sessions":[...],"pool":{...}}
 *            (exec replies and results may carry "warnings", see km.h)
 *   close    session*, keep                -> {"ok"}
 *   interrupt / restart  session*          -> {"ok"}
 *   files    session*                      -> {"ok","session","workspace","files",...}
 *   export   session*, kernel_name         -> {"ok","notebook":{...}}
 *   connection_file session*, lang         -> {"ok","connection_file":PATH}
 *   shutdown                               -> {"ok"} then the daemon exits
 */
#include "kernelmgr/daemon.h"
#include "kernelmgr/klaunch.h"
#include "kernels/server/kenv.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Paths are built into fixed PATH_MAX buffers whose overflow is checked
 * where it matters; gcc's truncation guesses are noise here (clang has no
 * such warning). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

#define DAEMON_MAX_LINE (64u << 20)

static int try_connect(const char *sock);
static volatile sig_atomic_t daemon_stop;
static km_manager *daemon_mgr;
static atomic_int daemon_conns;

int daemon_socket_path(const char *home, char *buf, size_t size, km_err *err)
{
    struct sockaddr_un sun;
    int n = snprintf(buf, size, "%s/kernelmgr.sock", home);
    if (n < 0 || (size_t)n >= size || (size_t)n >= sizeof sun.sun_path) {
        if (err) {
            err->code = KM_EDAEMON;
            snprintf(err->msg, sizeof err->msg,
                     "socket path %s/kernelmgr.sock is longer than %zu bytes: use a shorter "
                     "KERNELMGR_HOME",
                     home, sizeof sun.sun_path - 1);
        }
        return -1;
    }
    return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int daemon_send_json(int fd, const json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    if (!s)
        return -1;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return -1;
    }
    line[n] = '\n';
    int rc = write_all(fd, line, n + 1);
    free(line);
    return rc;
}

/* A line reader over a socket with a bounded line length. */
typedef struct lreader {
    int fd;
    char *buf;
    size_t head, len, cap; /* unread bytes: buf[head, len) */
} lreader;

/* Returns the next line (without '\n', NUL-terminated, in r's buffer:
 * borrowed until the next call), NULL at EOF / error / too long.
 * timeout_ms < 0 waits forever; *timed_out set on timeout. Lines are cut
 * in place and the rest moves to the front only before a read, so a burst
 * of events costs one pass (it was one malloc and one move of the whole
 * rest per line). */
static char *lreader_next(lreader *r, int timeout_ms, int *timed_out)
{
    if (timed_out)
        *timed_out = 0;
    for (;;) {
        char *nl = r->len > r->head ? memchr(r->buf + r->head, '\n', r->len - r->head) : NULL;
        if (nl) {
            char *line = r->buf + r->head;
            *nl = 0;
            r->head = (size_t)(nl - r->buf) + 1;
            return line;
        }
        if (r->head) {
            memmove(r->buf, r->buf + r->head, r->len - r->head);
            r->len -= r->head;
            r->head = 0;
        }
        if (r->len >= DAEMON_MAX_LINE)
            return NULL;
        if (r->cap - r->len < 65536) {
            size_t cap = r->cap ? r->cap * 2 : 131072;
            char *b = realloc(r->buf, cap);
            if (!b)
                return NULL;
            r->buf = b;
            r->cap = cap;
        }
        if (timeout_ms >= 0) {
            struct pollfd p = {r->fd, POLLIN, 0};
            int rc = poll(&p, 1, timeout_ms);
            if (rc == 0) {
                if (timed_out)
                    *timed_out = 1;
                return NULL;
            }
            if (rc < 0 && errno != EINTR)
                return NULL;
            if (rc < 0) {
                if (timed_out)
                    *timed_out = 1;
                return NULL;
            }
        }
        ssize_t n = recv(r->fd, r->buf + r->len, r->cap - r->len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
        r->len += (size_t)n;
    }
}

/* Returns the next n bytes (n <= DAEMON_MAX_LINE; borrowed until the next
 * call), NULL at EOF / error, or on timeout with *timed_out set (call again:
 * what arrived stays). */
static char *lreader_bytes(lreader *r, size_t n, int timeout_ms, int *timed_out)
{
    *timed_out = 0;
    if (n > DAEMON_MAX_LINE)
        return NULL;
    for (;;) {
        if (r->len - r->head >= n) {
            char *p = r->buf + r->head;
            r->head += n;
            return p;
        }
        if (r->head) {
            memmove(r->buf, r->buf + r->head, r->len - r->head);
            r->len -= r->head;
            r->head = 0;
        }
        if (r->cap - r->len < 65536 || r->cap < n) {
            size_t cap = r->cap ? r->cap * 2 : 131072;
            while (cap < n + 65536)
                cap *= 2;
            char *b = realloc(r->buf, cap);
            if (!b)
                return NULL;
            r->buf = b;
            r->cap = cap;
        }
        struct pollfd p = {r->fd, POLLIN, 0};
        int rc = poll(&p, 1, timeout_ms);
        if (rc <= 0) {
            if (rc < 0 && errno != EINTR)
                return NULL;
            *timed_out = 1;
            return NULL;
        }
        ssize_t got = recv(r->fd, r->buf + r->len, r->cap - r->len, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return NULL;
        r->len += (size_t)got;
    }
}

/* ---------------------------------------------------------------- server
 *
 * Concurrency model. One event-loop thread (daemon_serve) accepts
 * connections and does all socket reading and the buffered writing with
 * epoll (edge-triggered, non-blocking sockets): an idle connection costs a
 * few hundred bytes and no thread. A complete request line is handed to a
 * bounded pool of worker threads (daemon_workers); a connection has at most
 * one request in flight (answers stay in order), later lines wait in its
 * buffer. "Long" requests (exec, restart, connection_file: they may run
 * code or start kernels) may occupy all but DAEMON_RESERVED workers, so
 * ping, sessions, interrupt, close, files and export are served even while
 * every other worker runs code. Requests beyond the workers wait in a FIFO
 * of at most daemon_queue entries; past it the request is refused at once
 * ("the daemon is busy").
 *
 * Output. A worker sends directly while the socket takes it; what the
 * socket does not take waits in the connection's buffer (client_buffer
 * bytes), written by the loop. A stream event that does not fit waits up to
 * DAEMON_STALL_S for the client to make room (back-pressure to the kernel
 * for a slow reader); a client that made no progress in that time stops
 * receiving stream events (the execution goes on; one notice event says how
 * many bytes it missed, the final reply still comes). A connection whose
 * buffered output makes no progress for client_timeout seconds is dropped
 * and logged; its request runs to completion or timeout and its result goes
 * to the session's history. So a stopped client never holds a session.
 */

#define DAEMON_RESERVED 4
#define DAEMON_STALL_S 1.0

typedef struct dconn {
    int fd;
    pid_t peer_pid; /* SO_PEERCRED at accept: named when another exec waits for this one */
    int refs;       /* loop thread only: 1 while registered + 1 per request in flight */
    int registered;
    /* input: loop thread only */
    char *rbuf;
    size_t rlen, rcap;
    int rd_eof;
    int busy; /* a request is queued or running */
    /* output: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* output drained or the connection dropped */
    int dead;          /* dropped or broken: nothing more is written */
    char *obuf;
    size_t ohead, olen, ocap;
    double last_progress;
    int discarding; /* stream events are being dropped for this client */
    unsigned long long discarded;
    json_int_t last_block;
    struct dconn *prev, *next; /* every registered connection (loop thread) */
} dconn;

typedef struct djob {
    dconn *c;
    json_t *req;
    int is_long;
    struct djob *next;
} djob;

typedef struct dqueue {
    djob *head, *tail;
} dqueue;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dqueue q[2]; /* [0] short, [1] long */
    unsigned queued, running_long, long_max, queue_max;
    /* finished requests and broken connections, for the loop */
    djob *done;
    int efd; /* eventfd waking the loop */
    size_t obuf_max;
    double client_timeout;
} D = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .efd = -1};

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void loop_wake(void)
{
    uint64_t one = 1;
    ssize_t w = write(D.efd, &one, sizeof one);
    (void)w;
}

/* Appends to the pending output; the caller holds c->mu. 0 or -1 (OOM). */
static int obuf_append(dconn *c, const char *p, size_t n)
{
    if (c->ohead && c->ohead == c->olen)
        c->ohead = c->olen = 0;
    if (c->ocap - c->olen < n && c->ohead) {
        memmove(c->obuf, c->obuf + c->ohead, c->olen - c->ohead);
        c->olen -= c->ohead;
        c->ohead = 0;
    }
    if (c->ocap - c->olen < n) {
        size_t cap = c->ocap ? c->ocap : 65536;
        while (cap - c->olen < n)
            cap *= 2;
        char *b = realloc(c->obuf, cap);
        if (!b)
            return -1;
        c->obuf = b;
        c->ocap = cap;
    }
    if (c->olen == c->ohead)
        c->last_progress = mono_now();
    memcpy(c->obuf + c->olen, p, n);
    c->olen += n;
    return 0;
}

/* Sends what the socket takes of the pending output; caller holds c->mu.
 * An emptied buffer is freed (memory goes back after a burst). */
static void obuf_flush(dconn *c)
{
    while (!c->dead && c->olen > c->ohead) {
        ssize_t w =
            send(c->fd, c->obuf + c->ohead, c->olen - c->ohead, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w <= 0) {
            c->dead = 1;
            break;
        }
        c->ohead += (size_t)w;
        c->last_progress = mono_now();
    }
    if (c->dead || c->olen == c->ohead) {
        free(c->obuf);
        c->obuf = NULL;
        c->ohead = c->olen = c->ocap = 0;
    }
    pthread_cond_broadcast(&c->cv);
}

static int append_notice(dconn *c)
{
    char text[512];
    snprintf(text, sizeof text,
             "\n[kernelmgr: %llu bytes of streamed output were not sent to this client: it "
             "read too slowly; the result holds the output (within output_cap, spill files "
             "beyond)]\n",
             c->discarded);
    json_t *o = json_pack("{s:s s:I s:s s:s}", "event", "stream", "block", c->last_block, "name",
                          "stderr", "text", text);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return -1;
    int rc = obuf_append(c, s, strlen(s)) || obuf_append(c, "\n", 1);
    free(s);
    c->discarding = 0;
    c->discarded = 0;
    return rc;
}

/* Writes one line (s, n bytes with its '\n') to the client. An event may be
 * dropped for a client that does not read (see above); a final reply is
 * always queued. Called by workers and by the loop. */
static void conn_write(dconn *c, const char *s, size_t n, int is_event)
{
    pthread_mutex_lock(&c->mu);
    if (c->dead)
        goto out;
    if (c->discarding && c->olen - c->ohead <= D.obuf_max / 2)
        if (append_notice(c))
            c->dead = 1;
    if (is_event && c->discarding) {
        c->discarded += n;
        goto out;
    }
    if (is_event && c->olen - c->ohead + n > D.obuf_max && c->olen > c->ohead) {
        /* back-pressure: wait for the client to make room, not longer than
         * DAEMON_STALL_S without progress */
        for (;;) {
            obuf_flush(c);
            if (c->dead || c->olen - c->ohead + n <= D.obuf_max || c->olen == c->ohead)
                break;
            double give_up = c->last_progress + DAEMON_STALL_S;
            double now = mono_now();
            if (now >= give_up) {
                c->discarding = 1;
                c->discarded += n;
                goto out;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            double left = give_up - now;
            if (left > 0.1)
                left = 0.1;
            ts.tv_sec += (time_t)left;
            ts.tv_nsec += (long)((left - (double)(time_t)left) * 1e9);
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        if (c->dead)
            goto out;
    }
    if (c->olen == c->ohead) {
        /* nothing pending: straight to the socket */
        while (n) {
            ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (w <= 0) {
                c->dead = 1;
                goto out;
            }
            s += w;
            n -= (size_t)w;
        }
    }
    if (n && obuf_append(c, s, n))
        c->dead = 1;
out:;
    int dead = c->dead;
    pthread_mutex_unlock(&c->mu);
    if (dead)
        loop_wake();
}

/* Bytes this worker thread wrote to clients in its current request (see
 * worker_thread: when to give memory back). */
static __thread size_t job_bytes;

static void conn_write_json(dconn *c, json_t *o, int is_event)
{
    char *s = json_dumps(o, JSON_COMPACT);
    if (!s) {
        pthread_mutex_lock(&c->mu);
        c->dead = 1;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return;
    }
    line[n] = '\n';
    job_bytes += n + 1;
    conn_write(c, line, n + 1, is_event);
    free(line);
}

typedef struct conn {
    dconn *dc;
    json_t *id;
    int dead; /* the client went away: keep running, stop writing */
    int raw;  /* exec with "raw_text": stream text follows its event line as bytes */
} conn;

static int conn_dead(conn *c)
{
    pthread_mutex_lock(&c->dc->mu);
    int d = c->dc->dead;
    pthread_mutex_unlock(&c->dc->mu);
    return d;
}

static void reply_err(conn *c, int code, const char *msg)
{
    json_t *o = json_pack("{s:O s:b s:{s:i s:s}}", "id", c->id ? c->id : json_null(), "ok", 0,
                          "error", "code", code, "message", msg);
    if (o)
        conn_write_json(c->dc, o, 0);
    json_decref(o);
}

static void reply_ok(conn *c, json_t *o /* steals */)
{
    if (!o)
        o = json_object();
    json_object_set(o, "id", c->id ? c->id : json_null());
    json_object_set_new(o, "ok", json_true());
    conn_write_json(c->dc, o, 0);
    json_decref(o);
}

/* A stream event for a "raw_text" client: the event line without "text"
 * but with "text_bytes": N, then the N bytes of the text (UTF-8, as the
 * kernel sent them), in one write unit. JSON-escaping the text here and
 * parsing it again in the client was most of the CPU of a long output
 * (the text of `yes` is half escapes). 0, or -1: send it the usual way. */
static int on_event_raw(conn *c, const json_t *ev)
{
    json_t *t = json_object_get(ev, "text");
    json_t *block = json_object_get(ev, "block");
    json_t *name = json_object_get(ev, "name");
    if (!json_is_string(t) || !json_is_integer(block) || !json_is_string(name))
        return -1;
    size_t tn = json_string_length(t);
    json_t *h = json_pack("{s:s s:O s:O s:O s:I}", "event", "stream", "block", block, "name", name,
                          "id", c->id ? c->id : json_null(), "text_bytes", (json_int_t)tn);
    char *hs = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    if (!hs)
        return -1;
    size_t hn = strlen(hs);
    char *unit = malloc(hn + 1 + tn);
    if (!unit) {
        free(hs);
        return -1;
    }
    memcpy(unit, hs, hn);
    unit[hn] = '\n';
    memcpy(unit + hn + 1, json_string_value(t), tn);
    free(hs);
    pthread_mutex_lock(&c->dc->mu);
    c->dc->last_block = json_integer_value(block);
    pthread_mutex_unlock(&c->dc->mu);
    job_bytes += hn + 1 + tn;
    conn_write(c->dc, unit, hn + 1 + tn, 1);
    free(unit);
    return 0;
}

static void on_event(void *ud, const json_t *ev)
{
    conn *c = ud;
    if (c->dead || (c->dead = conn_dead(c)))
        return;
    if (c->raw && json_is_string(json_object_get(ev, "text")) &&
        !strcmp(json_string_value(json_object_get(ev, "event")) ?: "", "stream") &&
        on_event_raw(c, ev) == 0)
        return;
    json_t *o = json_deep_copy(ev);
    if (!o)
        return;
    json_object_set(o, "id", c->id ? c->id : json_null());
    json_t *b = json_object_get(o, "block");
    if (json_is_integer(b)) {
        pthread_mutex_lock(&c->dc->mu);
        c->dc->last_block = json_integer_value(b);
        pthread_mutex_unlock(&c->dc->mu);
    }
    conn_write_json(c->dc, o, 1);
    json_decref(o);
}

static const char *sfield(const json_t *req, const char *k)
{
    return json_string_value(json_object_get(req, k));
}

static void handle(conn *c, const json_t *req)
{
    km_manager *m = daemon_mgr;
    const char *op = sfield(req, "op");
    const char *name = sfield(req, "session");
    km_err err = {0, ""};
    if (!op)
        return reply_err(c, KM_EUSAGE, "request has no \"op\"");
    int needs_session = strcmp(op, "ping") && strcmp(op, "sessions") && strcmp(op, "shutdown");
    if (needs_session && !name)
        return reply_err(c, KM_EUSAGE, "request needs a \"session\"");
    if (!strcmp(op, "ping")) {
        reply_ok(c, json_pack("{s:i s:s s:o}", "pid", (int)getpid(), "home", km_manager_home(m),
                              "pool", km_pool_status(m)));
    } else if (!strcmp(op, "exec")) {
        const char *code = sfield(req, "code");
        if (!code)
            return reply_err(c, KM_EUSAGE, "exec needs \"code\" (a string)");
        km_session_opts so;
        km_session_opts_init(&so);
        const char *net = sfield(req, "network");
        if (net && strcmp(net, "on") && strcmp(net, "off"))
            return reply_err(c, KM_EUSAGE, "network must be \"on\" or \"off\"");
        if (net)
            so.network = !strcmp(net, "on");
        const char *mem = sfield(req, "memory");
        uint64_t bytes = 0;
        if (mem && kmcfg_parse_size(mem, &bytes))
            return reply_err(c, KM_EUSAGE, "memory must be a size like \"512M\"");
        so.memory = bytes;
        so.python = sfield(req, "python");
        so.workspace = sfield(req, "workspace");
        so.sandbox = sfield(req, "sandbox");
        if (so.sandbox && strcmp(so.sandbox, "strict") && strcmp(so.sandbox, "none"))
            return reply_err(c, KM_EUSAGE, "sandbox must be \"strict\" or \"none\"");
        json_t *env = json_object_get(req, "env");
        if (env && !json_is_null(env)) {
            char why[512];
            if (kenv_check_object(NULL, "env", env, why, sizeof why))
                return reply_err(c, KM_EUSAGE, why);
            so.env = env;
        }
        km_exec_opts eo = {sfield(req, "lang"), json_number_value(json_object_get(req, "timeout")),
                           json_is_true(json_object_get(req, "continue_on_error"))};
        int stream = json_is_true(json_object_get(req, "stream"));
        c->raw = stream && json_is_true(json_object_get(req, "raw_text"));
        km_exec_set_client((int)c->dc->peer_pid);
        json_t *res = km_exec(m, name, &so, &eo, code, stream ? on_event : NULL, c, &err);
        if (!res)
            return reply_err(c, err.code, err.msg);
        reply_ok(c, res);
    } else if (!strcmp(op, "sessions")) {
        reply_ok(c, json_pack("{s:o s:o}", "sessions", km_sessions(m), "pool", km_pool_status(m)));
    } else if (!strcmp(op, "close")) {
        if (km_close(m, name, json_is_true(json_object_get(req, "keep")) ? KM_KEEP : 0, &err))
            return reply_err(c, err.code, err.msg);
        reply_ok(c, NULL);
    } else if (!strcmp(op, "interrupt") || !strcmp(op, "restart")) {
        int rc = !strcmp(op, "interrupt") ? km_interrupt(m, name, &err) : km_restart(m, name, &err);
        if (rc)
            return reply_err(c, err.code, err.msg);
        reply_ok(c, NULL);
    } else if (!strcmp(op, "files")) {
        json_t *f = km_files(m, name, &err);
        if (!f)
            return reply_err(c, err.code, err.msg);
        reply_ok(c, f);
    } else if (!strcmp(op, "export")) {
        json_t *nb = km_export(m, name, sfield(req, "kernel_name"), &err);
        if (!nb)
            return reply_err(c, err.code, err.msg);
        reply_ok(c, json_pack("{s:o}", "notebook", nb));
    } else if (!strcmp(op, "connection_file")) {
        char path[4096];
        if (km_connection_file(m, name, sfield(req, "lang"), path, sizeof path, &err))
            return reply_err(c, err.code, err.msg);
        reply_ok(c, json_pack("{s:s}", "connection_file", path));
    } else if (!strcmp(op, "shutdown")) {
        reply_ok(c, NULL);
        daemon_stop = 1;
        loop_wake();
    } else {
        char msg[128];
        snprintf(msg, sizeof msg, "unknown op \"%.60s\"", op);
        reply_err(c, KM_EUSAGE, msg);
    }
}

static void *tick_thread(void *arg)
{
    (void)arg;
    int steps = (int)(km_tick_interval(daemon_mgr) * 10 + 0.5);
    while (!daemon_stop) {
        km_tick(daemon_mgr);
        for (int i = 0; i < steps && !daemon_stop; i++) {
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static void on_signal(int sig)
{
    (void)sig;
    daemon_stop = 1;
}

/* ------------------------------------------------ workers and event loop */

static int op_is_long(const json_t *req)
{
    const char *op = sfield(req, "op");
    return op && (!strcmp(op, "exec") || !strcmp(op, "restart") || !strcmp(op, "connection_file"));
}

static void *worker_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&D.mu);
    for (;;) {
        djob *j = NULL;
        int lng = 0;
        if (D.q[0].head) {
            j = D.q[0].head;
        } else if (D.q[1].head && D.running_long < D.long_max) {
            j = D.q[1].head;
            lng = 1;
        }
        if (!j) {
            pthread_cond_wait(&D.cv, &D.mu);
            continue;
        }
        dqueue *q = &D.q[lng];
        q->head = j->next;
        if (!q->head)
            q->tail = NULL;
        D.queued--;
        D.running_long += (unsigned)lng;
        pthread_mutex_unlock(&D.mu);

        conn c = {j->c, json_object_get(j->req, "id"), 0, 0};
        job_bytes = 0;
        double t0 = mono_now();
        handle(&c, j->req);
        json_decref(j->req);
        j->req = NULL;
        /* a large result (or a burst of output) was just freed: give the
         * memory back to the system instead of keeping the high-water mark.
         * Only after a request that could have left one: 1 MiB or more sent
         * to the client, or 20 ms or more of work (a burst the client did
         * not stream). malloc_trim walks every arena, ~0.1-0.3 ms: after
         * every trivial exec it was a fifth of the daemon's CPU; here it
         * costs at most ~1 % of the request it follows. */
        if (lng && (job_bytes >= ((size_t)1 << 20) || mono_now() - t0 >= 0.020))
            malloc_trim(0);

        pthread_mutex_lock(&D.mu);
        D.running_long -= (unsigned)lng;
        j->next = D.done;
        D.done = j;
        /* no wake-up here: this worker looks at the queues again itself
         * (below), and takes the long request the freed slot admits. A
         * broadcast woke every idle worker (2 x cores + 32) after each exec
         * only for them to sleep again: most of the daemon's CPU per exec. */
        pthread_mutex_unlock(&D.mu);
        loop_wake();
        pthread_mutex_lock(&D.mu);
    }
    return NULL;
}

/* Queues req (steals) of c; 0, or -1 when the queue is full. */
static int submit(dconn *c, json_t *req)
{
    djob *j = calloc(1, sizeof *j);
    if (!j)
        return -1;
    j->c = c;
    j->req = req;
    j->is_long = op_is_long(req);
    pthread_mutex_lock(&D.mu);
    if (D.queued >= D.queue_max) {
        pthread_mutex_unlock(&D.mu);
        free(j);
        return -1;
    }
    dqueue *q = &D.q[j->is_long];
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    D.queued++;
    /* one idle worker: every waiter takes a short request (the short queue
     * comes first), and a long one the cap does not admit now is taken by
     * the worker whose long request ends (worker_thread) */
    pthread_cond_signal(&D.cv);
    pthread_mutex_unlock(&D.mu);
    return 0;
}

typedef struct dloop {
    int ep, lfd;
    dconn *all;
    unsigned nconns;
} dloop;

static void conn_unref(dconn *c)
{
    if (--c->refs > 0)
        return;
    close(c->fd);
    free(c->rbuf);
    free(c->obuf);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* Stops serving c: marks it dead (a worker running its request stops
 * writing), unregisters it; the fd closes with the last reference. */
static void conn_drop(dloop *L, dconn *c, const char *why)
{
    if (!c->registered)
        return;
    pthread_mutex_lock(&c->mu);
    size_t unsent = c->olen - c->ohead;
    c->dead = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (why)
        fprintf(stderr,
                "kernelmgr: dropped a client connection: %s (%zu bytes unsent); a request it "
                "made runs to completion or timeout, its result goes to the session's history\n",
                why, unsent);
    epoll_ctl(L->ep, EPOLL_CTL_DEL, c->fd, NULL);
    shutdown(c->fd, SHUT_RDWR);
    c->registered = 0;
    if (c->prev)
        c->prev->next = c->next;
    else
        L->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    L->nconns--;
    conn_unref(c);
}

/* Dispatches the complete lines in c's buffer while no request of c is in
 * flight; reads more when the buffer allows; closes at EOF once answered. */
static void conn_service(dloop *L, dconn *c)
{
    for (;;) {
        while (!c->busy && c->registered) {
            char *nl = c->rlen ? memchr(c->rbuf, '\n', c->rlen) : NULL;
            if (!nl)
                break;
            size_t n = (size_t)(nl - c->rbuf);
            json_error_t jerr;
            json_t *req = json_loadb(c->rbuf, n, 0, &jerr);
            memmove(c->rbuf, nl + 1, c->rlen - n - 1);
            c->rlen -= n + 1;
            conn cc = {c, NULL, 0, 0};
            if (!json_is_object(req)) {
                char msg[300];
                snprintf(msg, sizeof msg, "request is not a JSON object: %s", jerr.text);
                reply_err(&cc, KM_EUSAGE, msg);
                json_decref(req);
                continue;
            }
            c->refs++;
            c->busy = 1;
            if (submit(c, req)) {
                c->refs--;
                c->busy = 0;
                cc.id = json_object_get(req, "id");
                char msg[200];
                snprintf(msg, sizeof msg,
                         "the daemon is busy: %u requests already wait for a worker "
                         "(daemon_queue); retry later",
                         D.queue_max);
                reply_err(&cc, KM_EDAEMON, msg);
                json_decref(req);
            }
        }
        if (!c->registered)
            return;
        if (c->busy || c->rd_eof)
            break;
        /* read: with a request in flight only up to one complete line is
         * buffered ahead (the next read happens when it is answered) */
        if (c->rlen >= DAEMON_MAX_LINE) {
            conn_drop(L, c, "a request line is longer than 64 MiB");
            return;
        }
        if (c->rcap - c->rlen < 65536) {
            size_t cap = c->rcap ? c->rcap * 2 : 16384;
            if (cap - c->rlen < 4096)
                cap *= 2;
            char *b = realloc(c->rbuf, cap);
            if (!b) {
                conn_drop(L, c, "out of memory");
                return;
            }
            c->rbuf = b;
            c->rcap = cap;
        }
        ssize_t n = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            c->rd_eof = 1;
            break;
        }
        c->rlen += (size_t)n;
    }
    /* an idle connection gives its read buffer back */
    if (!c->rlen && c->rcap > 16384) {
        free(c->rbuf);
        c->rbuf = NULL;
        c->rcap = 0;
    }
    pthread_mutex_lock(&c->mu);
    int dead = c->dead, pending = c->olen > c->ohead;
    pthread_mutex_unlock(&c->mu);
    if (dead || (c->rd_eof && !c->busy && !pending))
        conn_drop(L, c, NULL);
}

/* kept open to accept-and-close a connection when out of fds */
static int spare_fd = -1;

static void loop_accept(dloop *L)
{
    for (int i = 0; i < 1024; i++) {
        int fd = accept4(L->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
            /* out of fds: accept with the spare one and close at once (the
             * client sees EOF) rather than spin on a readable listen fd */
            close(spare_fd);
            fd = accept4(L->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0)
                close(fd);
            spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            errno = EMFILE;
            fd = -1;
        }
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                static double last;
                if (mono_now() - last > 10) {
                    fprintf(stderr, "kernelmgr: cannot accept a connection: %s\n", strerror(errno));
                    last = mono_now();
                }
            }
            return;
        }
        /* only our own uid may talk to us, even if the mode were wrong */
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) || cred.uid != getuid()) {
            close(fd);
            continue;
        }
        dconn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->peer_pid = cred.pid;
        c->refs = 1;
        c->registered = 1;
        pthread_mutex_init(&c->mu, NULL);
        pthread_cond_init(&c->cv, NULL);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                 .data.ptr = c};
        if (epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &ev)) {
            pthread_mutex_destroy(&c->mu);
            pthread_cond_destroy(&c->cv);
            free(c);
            close(fd);
            continue;
        }
        c->next = L->all;
        if (L->all)
            L->all->prev = c;
        L->all = c;
        L->nconns++;
        atomic_fetch_add(&daemon_conns, 1);
    }
}

/* Finished requests: their connections go on with the next line. */
static void loop_done(dloop *L)
{
    pthread_mutex_lock(&D.mu);
    djob *j = D.done;
    D.done = NULL;
    pthread_mutex_unlock(&D.mu);
    /* oldest first */
    djob *rev = NULL;
    while (j) {
        djob *n = j->next;
        j->next = rev;
        rev = j;
        j = n;
    }
    while (rev) {
        djob *n = rev->next;
        dconn *c = rev->c;
        free(rev);
        c->busy = 0;
        if (c->registered)
            conn_service(L, c);
        conn_unref(c);
        rev = n;
    }
}

/* Drops connections that are broken or whose output made no progress for
 * client_timeout seconds. */
static void loop_scan(dloop *L)
{
    double now = mono_now();
    dconn *next;
    for (dconn *c = L->all; c; c = next) {
        next = c->next;
        pthread_mutex_lock(&c->mu);
        int dead = c->dead;
        int stuck = c->olen > c->ohead && now - c->last_progress > D.client_timeout;
        pthread_mutex_unlock(&c->mu);
        if (dead && !c->busy)
            conn_drop(L, c, NULL);
        else if (dead)
            conn_drop(L, c, NULL);
        else if (stuck) {
            char why[160];
            snprintf(why, sizeof why,
                     "the client read none of its output for %.0f s (client_timeout)",
                     D.client_timeout);
            conn_drop(L, c, why);
        }
    }
}

static void conn_event(dloop *L, dconn *c, uint32_t events)
{
    if (events & EPOLLERR) {
        conn_drop(L, c, NULL);
        return;
    }
    if (events & EPOLLOUT) {
        pthread_mutex_lock(&c->mu);
        obuf_flush(c);
        pthread_mutex_unlock(&c->mu);
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLOUT))
        conn_service(L, c);
}

static unsigned default_workers(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    if (n > 256)
        n = 256;
    return 2u * (unsigned)n + 32u;
}

int daemon_serve(const char *home, const kmcfg *cfg, km_err *err)
{
    char sock[256], path[4200];
    if (daemon_socket_path(home, sock, sizeof sock, err))
        return KM_EDAEMON;
    mkdir(home, 0700);
    /* one daemon per home: the lock outlives crashes (the kernel drops it) */
    snprintf(path, sizeof path, "%s/daemon.lock", home);
    int lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lockfd < 0) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "%s: %s", path, strerror(errno));
        return KM_EDAEMON;
    }
    /* The lock is held by a serving daemon (its socket answers: nothing to
     * do) or by one still stopping its kernels (wait for it, up to 30 s). */
    for (int tries = 0; flock(lockfd, LOCK_EX | LOCK_NB); tries++) {
        int fd = errno == EWOULDBLOCK ? try_connect(sock) : -1;
        if (fd >= 0 || errno != EWOULDBLOCK || tries >= 300) {
            if (fd >= 0)
                close(fd);
            fprintf(stderr, "kernelmgr: a daemon already serves %s\n", home);
            close(lockfd);
            return 0;
        }
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* every idle connection is an fd: allow as many as the hard limit */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }

    daemon_mgr = km_manager_new(home, cfg, 1, err);
    if (!daemon_mgr) {
        close(lockfd);
        return err->code ? err->code : KM_EINTERNAL;
    }
    dloop L = {-1, -1, NULL, 0};
    L.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s", sock);
    unlink(sock);
    mode_t old = umask(0177);
    int brc = L.lfd >= 0 ? bind(L.lfd, (struct sockaddr *)&sun, sizeof sun) : -1;
    umask(old);
    /* the kernel caps the backlog at net.core.somaxconn */
    if (brc || chmod(sock, 0600) || listen(L.lfd, 65535)) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s: %s", sock, strerror(errno));
        if (L.lfd >= 0)
            close(L.lfd);
        km_manager_destroy(&daemon_mgr);
        close(lockfd);
        return KM_EDAEMON;
    }
    spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    D.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    L.ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &L};
    struct epoll_event eev = {.events = EPOLLIN, .data.ptr = &D};
    if (D.efd < 0 || L.ep < 0 || epoll_ctl(L.ep, EPOLL_CTL_ADD, L.lfd, &lev) ||
        epoll_ctl(L.ep, EPOLL_CTL_ADD, D.efd, &eev)) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot set up the event loop: %s", strerror(errno));
        close(L.lfd);
        unlink(sock);
        km_manager_destroy(&daemon_mgr);
        close(lockfd);
        return KM_EDAEMON;
    }
    unsigned workers = cfg->daemon_workers ? cfg->daemon_workers : default_workers();
    D.long_max = workers > DAEMON_RESERVED ? workers - DAEMON_RESERVED : 1;
    D.queue_max = cfg->daemon_queue ? cfg->daemon_queue : 4096;
    D.obuf_max = cfg->client_buffer ? (size_t)cfg->client_buffer : 8u << 20;
    D.client_timeout = cfg->client_timeout > 0 ? cfg->client_timeout : 10;
    unsigned started = 0;
    for (unsigned i = 0; i < workers; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, worker_thread, NULL) == 0)
            started++;
        pthread_attr_destroy(&attr);
    }
    if (!started) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot start worker threads: %s", strerror(errno));
        close(L.lfd);
        unlink(sock);
        km_manager_destroy(&daemon_mgr);
        close(lockfd);
        return KM_EDAEMON;
    }
    if (started < D.long_max + 1)
        D.long_max = started > 1 ? started - 1 : 1;
    snprintf(path, sizeof path, "%s/daemon.pid", home);
    FILE *pf = fopen(path, "w");
    if (pf) {
        fprintf(pf, "%d\n", (int)getpid());
        fclose(pf);
    }
    fprintf(stderr, "kernelmgr: serving %s (pid %d, %u workers, max_kernels %u)\n", sock,
            (int)getpid(), started, cfg->max_kernels);
    pthread_t ticker;
    int have_ticker = pthread_create(&ticker, NULL, tick_thread, NULL) == 0;
    double last_scan = mono_now();
    while (!daemon_stop) {
        struct epoll_event evs[256];
        int n = epoll_wait(L.ep, evs, 256, 250);
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &L) {
                loop_accept(&L);
            } else if (p == &D) {
                uint64_t v;
                ssize_t r = read(D.efd, &v, sizeof v);
                (void)r;
            } else {
                dconn *c = p;
                if (c->registered)
                    conn_event(&L, c, evs[i].events);
            }
        }
        loop_done(&L);
        double now = mono_now();
        if (now - last_scan >= 0.25) {
            loop_scan(&L);
            last_scan = now;
        }
    }
    fprintf(stderr, "kernelmgr: daemon stopping\n");
    close(L.lfd);
    unlink(sock);
    if (have_ticker)
        pthread_join(ticker, NULL);
    /* kernels go down with the daemon; workspaces and session.json stay, so
     * the next daemon brings the sessions back with fresh kernels */
    km_manager_destroy(&daemon_mgr);
    snprintf(path, sizeof path, "%s/daemon.pid", home);
    unlink(path);
    close(lockfd);
    /* workers still running a request die with the process */
    return 0;
}

/* ---------------------------------------------------------------- client */

static int try_connect(const char *sock)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s", sock);
    if (connect(fd, (struct sockaddr *)&sun, sizeof sun)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int spawn_daemon(const char *home, char *const argv_extra[])
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -1;
    exe[n] = 0;
    char *argv[16] = {"kernelmgr", "serve"};
    int k = 2;
    for (int i = 0; argv_extra && argv_extra[i] && k < 15; i++)
        argv[k++] = argv_extra[i];
    argv[k] = NULL;
    char log[4200];
    snprintf(log, sizeof log, "%s/daemon.log", home);
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (logfd < 0 || nullfd < 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setsid();
        if (fork() != 0)
            _exit(0);
        dup2(nullfd, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        signal(SIGINT, SIG_DFL);
        setenv("KERNELMGR_HOME", home, 1);
        execv(exe, argv);
        _exit(127);
    }
    close(logfd);
    close(nullfd);
    int st;
    waitpid(pid, &st, 0);
    return 0;
}

int daemon_connect(const char *home, int autostart, char *const argv_extra[], km_err *err)
{
    char sock[256];
    if (daemon_socket_path(home, sock, sizeof sock, err))
        return -1;
    int fd = try_connect(sock);
    if (fd >= 0 || !autostart) {
        if (fd < 0) {
            err->code = KM_EDAEMON;
            snprintf(err->msg, sizeof err->msg, "no daemon is running for %s", home);
        }
        return fd;
    }
    mkdir(home, 0700);
    if (spawn_daemon(home, argv_extra)) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot start the daemon: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < 900; i++) {
        fd = try_connect(sock);
        if (fd >= 0)
            return fd;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    err->code = KM_EDAEMON;
    snprintf(err->msg, sizeof err->msg,
             "the daemon did not come up within 45 s (see %s/daemon.log)", home);
    return -1;
}

int daemon_call(int fd, const json_t *req, void (*on_ev)(void *, const json_t *),
                void (*on_cancel)(void *), void *ud, volatile sig_atomic_t *cancel, json_t **reply,
                km_err *err)
{
    *reply = NULL;
    if (daemon_send_json(fd, req)) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot send to the daemon: %s", strerror(errno));
        return KM_EDAEMON;
    }
    lreader r = {fd, NULL, 0, 0, 0};
    int cancelled = 0;
    json_t *pending = NULL; /* a raw stream event waiting for its text */
    size_t pending_n = 0;
    for (;;) {
        int to;
        char *line = NULL, *text = NULL;
        if (pending)
            text = lreader_bytes(&r, pending_n, 200, &to);
        else
            line = lreader_next(&r, 200, &to);
        if (text) {
            json_object_set_new(pending, "text", json_stringn_nocheck(text, pending_n));
            if (on_ev)
                on_ev(ud, pending);
            json_decref(pending);
            pending = NULL;
            continue;
        }
        if (!line) {
            if (to) {
                if (cancel && *cancel && !cancelled && on_cancel) {
                    cancelled = 1;
                    on_cancel(ud);
                }
                continue;
            }
            free(r.buf);
            json_decref(pending);
            err->code = KM_EDAEMON;
            snprintf(err->msg, sizeof err->msg, "the daemon closed the connection");
            return KM_EDAEMON;
        }
        json_t *o = json_loads(line, 0, NULL);
        if (!json_is_object(o)) {
            json_decref(o);
            continue;
        }
        json_t *tb = json_object_get(o, "text_bytes");
        if (json_object_get(o, "event") && json_is_integer(tb)) {
            /* raw_text: the text's bytes follow (daemon.c on_event_raw) */
            json_int_t n = json_integer_value(tb);
            if (n < 0 || (unsigned long long)n > DAEMON_MAX_LINE) {
                json_decref(o);
                free(r.buf);
                err->code = KM_EDAEMON;
                snprintf(err->msg, sizeof err->msg,
                         "the daemon sent a stream event of %lld bytes (at most %u)", (long long)n,
                         DAEMON_MAX_LINE);
                return KM_EDAEMON;
            }
            pending = o;
            pending_n = (size_t)n;
            continue;
        }
        if (json_object_get(o, "event")) {
            if (on_ev)
                on_ev(ud, o);
            json_decref(o);
            continue;
        }
        free(r.buf);
        *reply = o;
        return 0;
    }
}
