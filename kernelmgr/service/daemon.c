/*
 * daemon.c — the kernelmgr API server (`kernelmgr serve`) and its client.
 *
 * The API — versioned JSON-RPC 2.0 over the unix socket, one message per
 * line, its methods, params, results, events and error codes — is
 * documented in docs/API.md; the framing and validation are rpc.c's (the
 * MCP server uses the same). Methods are the table dmethods below; each
 * validates its params once (rpc_unpack: json_unpack_ex, JSON_STRICT).
 */
#include "kernelmgr/service/daemon.h"
#include "kernelmgr/service/daemon_http.h"
#include "kernelmgr/engine/klaunch.h"
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/service/rpc.h"
#include "kernelmgr/service/dtier.h"
#include "kernelmgr/engine/wsfile.h"
#include "common/cm_path.h"
#include "common/cm_clock.h"

#include <sodium.h>

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
    /* what this connection may do (dtier.h): owner until initialize lowers
     * it; set and read by the worker running its one request in flight */
    dtier_grant grant;
    char *allowlist;           /* the operator's allowlist given at initialize, or NULL */
    struct dconn *prev, *next; /* every registered connection (loop thread) */
} dconn;

typedef struct djob {
    dconn *c;
    json_t *req; /* the whole request */
    const struct dmethod *meth;
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
        c->last_progress = cm_mono_s();
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
        c->last_progress = cm_mono_s();
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
            double now = cm_mono_s();
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
    int dead;   /* the client went away: keep running, stop writing */
    int raw;    /* exec with "raw_text": stream text follows its event line as bytes */
    dtier tier; /* the connection's when the request started: what replies may carry */
} conn;

/* One API method: its handler gets the validated request's params, once
 * the tier of the connection was found to permit the method and every
 * field it sent (dtier_check_fields) — an allowlist per tier. */
struct dmethod {
    const char *name;
    void (*fn)(conn *c, const char *method, const json_t *params);
    int is_long;
    unsigned tiers;            /* DT_* bits: the tiers that may call it */
    const char *why;           /* why the others may not */
    const dtier_field *fields; /* the fields it takes and who may send each */
    int sopts;                 /* it also takes the session options (dtier_sessopts) */
};

static json_t *hello_for(km_manager *m, const dtier_grant *g);

static int conn_dead(conn *c)
{
    pthread_mutex_lock(&c->dc->mu);
    int d = c->dc->dead;
    pthread_mutex_unlock(&c->dc->mu);
    return d;
}

/* An error of the operation (a KM_E* code, see rpc.h). */
static void reply_err(conn *c, int km_code, const char *msg)
{
    char m2[sizeof((km_err *)0)->msg + 64];
    snprintf(m2, sizeof m2, "%s", msg);
    dtier_scrub_text(c->tier, m2, sizeof m2, km_manager_home(daemon_mgr));
    json_t *o = rpc_error_km(c->id, km_code, m2);
    if (o)
        conn_write_json(c->dc, o, 0);
    json_decref(o);
}

/* A request the API refuses before doing anything (invalid params). */
static void reply_invalid(conn *c, const char *method, const char *why)
{
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", method, why);
    dtier_scrub_text(c->tier, msg, sizeof msg, km_manager_home(daemon_mgr));
    json_t *o = rpc_error(c->id, RPC_INVALID_PARAMS, msg, json_pack("{s:i}", "km_code", KM_EUSAGE));
    if (o)
        conn_write_json(c->dc, o, 0);
    json_decref(o);
}

static void reply_ok(conn *c, json_t *result /* steals */)
{
    dtier_scrub(c->tier, result, km_manager_home(daemon_mgr));
    json_t *o = rpc_result(c->id, result);
    if (o)
        conn_write_json(c->dc, o, 0);
    json_decref(o);
}

/* A stream event for a "raw_text" client: the notification without "text"
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
    json_t *h =
        rpc_notification(DAEMON_EVENT_METHOD,
                         json_pack("{s:O s:s s:O s:O s:I}", "request_id", c->id, "event", "stream",
                                   "block", block, "name", name, "text_bytes", (json_int_t)tn));
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

/* An exec event as a notification {"method":"event","params":{"request_id",
 * "event",...}}. */
static void on_event(void *ud, const json_t *ev)
{
    conn *c = ud;
    if (c->dead || (c->dead = conn_dead(c)))
        return;
    if (c->tier != DT_HTTP && c->raw && json_is_string(json_object_get(ev, "text")) &&
        !strcmp(json_string_value(json_object_get(ev, "event")) ?: "", "stream") &&
        on_event_raw(c, ev) == 0)
        return;
    json_t *params = json_deep_copy(ev);
    if (!params)
        return;
    json_object_set(params, "request_id", c->id);
    dtier_scrub(c->tier, params, km_manager_home(daemon_mgr));
    if (json_is_object(json_object_get(params, "result"))) /* a block's result */
        dtier_scrub(c->tier, json_object_get(params, "result"), km_manager_home(daemon_mgr));
    json_t *b = json_object_get(params, "block");
    if (json_is_integer(b)) {
        pthread_mutex_lock(&c->dc->mu);
        c->dc->last_block = json_integer_value(b);
        pthread_mutex_unlock(&c->dc->mu);
    }
    json_t *o = rpc_notification(DAEMON_EVENT_METHOD, params);
    if (o)
        conn_write_json(c->dc, o, 1);
    json_decref(o);
}

/* ------------------------------------------------------------ the methods
 *
 * Each method validates its params once, with rpc_unpack (json_unpack_ex,
 * JSON_STRICT): an unknown, missing or mistyped field is refused naming it,
 * before anything is done. docs/API.md is the reference. */

/* The session options every method that may create a session takes: the
 * table dtier_sessopts says their types, ranges, ceilings and tiers
 * (dtier.h); rpc_unpack only has to know their names (JSON_STRICT). */
typedef struct sopts_raw {
    json_t *v[8];
} sopts_raw;

#define SOPTS_FMT "s?o s?o s?o s?o s?o s?o s?o s?o"
#define SOPTS_ARGS(r)                                                                              \
    "network", &(r).v[0], "memory", &(r).v[1], "cpus", &(r).v[2], "cpu_time", &(r).v[3], "python", \
        &(r).v[4], "workspace", &(r).v[5], "sandbox", &(r).v[6], "env", &(r).v[7]

/* Checks the session options of params by the table and against the
 * operator's ceilings for c's tier, and fills so (borrowing from params).
 * 0, or -1 with the reason naming the field. */
static int sopts_fill(conn *c, const json_t *p, km_session_opts *so, char *why, size_t n)
{
    return dtier_sopts_fill(p, so, why, n) ||
                   dtier_sopts_ceiling(&c->dc->grant, km_manager_config(daemon_mgr), p, so, why, n)
               ? -1
               : 0;
}

static void m_ping(conn *c, const char *method, const json_t *p)
{
    char why[600];
    if (rpc_unpack(p, why, sizeof why, "{}"))
        return reply_invalid(c, method, why);
    reply_ok(c, hello_for(daemon_mgr, &c->dc->grant));
}

static void m_initialize(conn *c, const char *method, const json_t *p)
{
    char why[600];
    json_int_t want = DAEMON_API_VERSION;
    const char *client = NULL, *tname = NULL, *allow = NULL;
    int unsafe = 0;
    if (rpc_unpack(p, why, sizeof why, "{s?I s?s s?s s?s s?b}", "api_version", &want, "client",
                   &client, "tier", &tname, "allowlist", &allow, "allow_unsafe_session_options",
                   &unsafe))
        return reply_invalid(c, method, why);
    if (want != DAEMON_API_VERSION) {
        snprintf(why, sizeof why,
                 "api_version %lld is not served here: this daemon speaks api_version %d",
                 (long long)want, DAEMON_API_VERSION);
        return reply_invalid(c, method, why);
    }
    dconn *dc = c->dc;
    dtier t = dc->grant.tier;
    if (tname && dtier_parse(tname, &t)) {
        snprintf(why, sizeof why,
                 "field \"tier\": must be \"owner\", \"mcp\" or \"http\" (got "
                 "\"%.40s\")",
                 tname);
        return reply_invalid(c, method, why);
    }
    if (t < dc->grant.tier) {
        snprintf(why, sizeof why,
                 "field \"tier\": a connection may only lower its tier (it is \"%s\", asked "
                 "for \"%s\")",
                 dtier_name(dc->grant.tier), dtier_name(t));
        return reply_invalid(c, method, why);
    }
    if (allow && allow[0] != '/')
        return reply_invalid(c, method, "field \"allowlist\": must be an absolute path");
    /* allowlist and allow_unsafe_session_options are owner fields (the
     * table): what the operator gave the lowering party, fixed for the
     * connection before its tier drops */
    if (allow) {
        char *a = strdup(allow);
        if (!a)
            return reply_err(c, KM_EINTERNAL, "out of memory");
        free(dc->allowlist);
        dc->allowlist = a;
    }
    if (unsafe)
        dc->grant.unsafe = 1;
    /* the operator's configuration opts the HTTP tier in */
    if (t == DT_HTTP && dc->grant.tier != DT_HTTP)
        dc->grant.unsafe |= km_manager_config(daemon_mgr)->http_allow_unsafe;
    dc->grant.tier = t;
    c->tier = t;
    reply_ok(c, hello_for(daemon_mgr, &c->dc->grant));
}

static void m_session_create(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name;
    sopts_raw r = {0};
    km_session_opts so;
    if (rpc_unpack(p, why, sizeof why, "{s:s " SOPTS_FMT "}", "session", &name, SOPTS_ARGS(r)) ||
        sopts_fill(c, p, &so, why, sizeof why))
        return reply_invalid(c, method, why);
    km_err err = {0, ""};
    json_t *res = km_session_create(daemon_mgr, name, &so, &err);
    if (!res)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, res);
}

static void m_exec(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name, *code, *lang = NULL;
    double timeout = 0;
    int coe = 0, stream = 0, raw = 0;
    sopts_raw r = {0};
    km_session_opts so;
    if (rpc_unpack(p, why, sizeof why, "{s:s s:s s?s s?F s?b s?b s?b " SOPTS_FMT "}", "session",
                   &name, "code", &code, "lang", &lang, "timeout", &timeout, "continue_on_error",
                   &coe, "stream", &stream, "raw_text", &raw, SOPTS_ARGS(r)) ||
        sopts_fill(c, p, &so, why, sizeof why))
        return reply_invalid(c, method, why);
    /* the one check of the language: the configuration's table (lang.h);
     * the CLI and MCP pass it through */
    const kmcfg *cfg = km_manager_config(daemon_mgr);
    if (lang && strcmp(lang, "auto") && kmcfg_lang_index(cfg, lang) < 0) {
        char known[400];
        snprintf(why, sizeof why, "field \"lang\": unknown language \"%.64s\" (known: %s or auto)",
                 lang, km_langs_names(&cfg->langs, known, sizeof known));
        return reply_invalid(c, method, why);
    }
    if (json_object_get(p, "timeout") && !(timeout > 0 && timeout <= 604800)) {
        snprintf(why, sizeof why, "field \"timeout\": must be a number of seconds in (0, 604800]");
        return reply_invalid(c, method, why);
    }
    km_exec_opts eo = {lang, timeout, coe};
    c->raw = stream && raw;
    km_exec_set_client((int)c->dc->peer_pid);
    km_err err = {0, ""};
    json_t *res = km_exec(daemon_mgr, name, &so, &eo, code, stream ? on_event : NULL, c, &err);
    if (!res)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, res);
}

static void m_sessions_list(conn *c, const char *method, const json_t *p)
{
    char why[600];
    if (rpc_unpack(p, why, sizeof why, "{}"))
        return reply_invalid(c, method, why);
    reply_ok(c, json_pack("{s:o s:o}", "sessions", km_sessions(daemon_mgr), "pool",
                          km_pool_status(daemon_mgr)));
}

static void m_close(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name;
    int keep = 0;
    if (rpc_unpack(p, why, sizeof why, "{s:s s?b}", "session", &name, "keep", &keep))
        return reply_invalid(c, method, why);
    km_err err = {0, ""};
    json_t *warnings = json_array();
    if (km_close_warn(daemon_mgr, name, keep ? KM_KEEP : 0, warnings, &err)) {
        json_decref(warnings);
        return reply_err(c, err.code, err.msg);
    }
    json_t *res = json_pack("{s:s s:b}", "session", name, "kept", keep);
    if (res && json_array_size(warnings))
        json_object_set(res, "warnings", warnings);
    json_decref(warnings);
    reply_ok(c, res);
}

static void m_session_repair(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name;
    if (rpc_unpack(p, why, sizeof why, "{s:s}", "session", &name))
        return reply_invalid(c, method, why);
    km_err err = {0, ""};
    json_t *res = km_session_repair(daemon_mgr, name, &err);
    if (!res)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, res);
}

static void m_interrupt_restart(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name;
    if (rpc_unpack(p, why, sizeof why, "{s:s}", "session", &name))
        return reply_invalid(c, method, why);
    km_err err = {0, ""};
    int rc = !strcmp(method, "interrupt") ? km_interrupt(daemon_mgr, name, &err)
                                          : km_restart(daemon_mgr, name, &err);
    if (rc)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, json_pack("{s:s}", "session", name));
}

static void m_files_list(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name, *path = NULL;
    if (rpc_unpack(p, why, sizeof why, "{s:s s?s}", "session", &name, "path", &path))
        return reply_invalid(c, method, why);
    char sub[WSFILE_PATH_MAX + 1];
    if (wsfile_normalize(path ? path : "", 1, sub, why, sizeof why) < 0)
        return reply_invalid(c, method, why);
    km_err err = {0, ""};
    json_t *f = km_files(daemon_mgr, name, &err);
    if (!f)
        return reply_err(c, err.code, err.msg);
    if (strcmp(sub, ".")) {
        /* below a sub-directory: the walk never follows a link (fsdiff), so
         * filtering the whole listing by prefix cannot leave the workspace */
        json_t *all = json_object_get(f, "files"), *keep = json_array();
        size_t i, plen = strlen(sub);
        json_t *fe;
        json_array_foreach(all, i, fe)
        {
            const char *fp = json_string_value(json_object_get(fe, "path"));
            if (fp && !strncmp(fp, sub, plen) && fp[plen] == '/')
                json_array_append(keep, fe);
        }
        json_object_set_new(f, "files", keep);
        json_object_set_new(f, "path", json_string(sub));
    }
    reply_ok(c, f);
}

static void m_files_read(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name, *path, *enc = "auto";
    json_int_t off = 0, len = 0;
    if (rpc_unpack(p, why, sizeof why, "{s:s s:s s?I s?I s?s}", "session", &name, "path", &path,
                   "offset", &off, "length", &len, "encoding", &enc))
        return reply_invalid(c, method, why);
    if (off < 0 || (json_object_get(p, "length") && len < 1))
        return reply_invalid(c, method, "field \"offset\" must be >= 0 and field \"length\" >= 1");
    if (strcmp(enc, "auto") && strcmp(enc, "text") && strcmp(enc, "base64"))
        return reply_invalid(c, method,
                             "field \"encoding\": must be \"auto\", \"text\" or \"base64\"");
    km_err err = {0, ""};
    json_t *r = km_file_read(daemon_mgr, name, path, (uint64_t)off, (uint64_t)len, enc, &err);
    if (!r)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, r);
}

static void m_files_write(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name, *path, *content, *enc = "text";
    int append = 0, create = 0;
    sopts_raw r = {0};
    km_session_opts so;
    if (rpc_unpack(p, why, sizeof why, "{s:s s:s s:s s?s s?b s?b " SOPTS_FMT "}", "session", &name,
                   "path", &path, "content", &content, "encoding", &enc, "append", &append,
                   "create", &create, SOPTS_ARGS(r)) ||
        sopts_fill(c, p, &so, why, sizeof why))
        return reply_invalid(c, method, why);
    if (strcmp(enc, "text") && strcmp(enc, "base64"))
        return reply_invalid(c, method, "field \"encoding\": must be \"text\" or \"base64\"");
    char norm[WSFILE_PATH_MAX + 1];
    /* a bad path is refused before a session is created for it */
    if (wsfile_normalize(path, 0, norm, why, sizeof why) < 0)
        return reply_invalid(c, method, why);
    size_t len = json_string_length(json_object_get(p, "content"));
    unsigned char *bin = NULL;
    const void *data = content;
    if (!strcmp(enc, "base64")) {
        size_t binlen = 0;
        bin = malloc(len / 4 * 3 + 3);
        if (!bin || sodium_base642bin(bin, len / 4 * 3 + 3, content, len, " \t\r\n", &binlen, NULL,
                                      sodium_base64_VARIANT_ORIGINAL) != 0) {
            free(bin);
            return reply_invalid(c, method, "field \"content\": not valid base64");
        }
        data = bin;
        len = binlen;
    }
    km_err err = {0, ""};
    json_t *created = NULL;
    if (create && !(created = km_session_create(daemon_mgr, name, &so, &err))) {
        free(bin);
        return reply_err(c, err.code, err.msg);
    }
    json_t *res = km_file_write(daemon_mgr, name, path, data, len, append, &err);
    free(bin);
    if (res && json_is_array(json_object_get(created, "warnings")))
        json_object_set(res, "warnings", json_object_get(created, "warnings"));
    json_decref(created);
    if (!res)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, res);
}

static void m_packages_install(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name, *manager, *allow = NULL;
    json_t *pkgs;
    if (rpc_unpack(p, why, sizeof why, "{s:s s:s s:o s?s}", "session", &name, "manager", &manager,
                   "packages", &pkgs, "allowlist", &allow))
        return reply_invalid(c, method, why);
    if (!json_is_array(pkgs))
        return reply_invalid(c, method, "field \"packages\": expected an array of strings");
    /* a tier below owner never names the file (the table): the allowlist
     * its operator fixed for the connection at initialize, else the
     * daemon's own */
    if (!allow)
        allow = c->dc->allowlist;
    km_err err = {0, ""};
    json_t *r = km_packages_install(daemon_mgr, name, allow, manager, pkgs, &err);
    if (!r)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, r);
}

static void m_export(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name, *kname = NULL;
    if (rpc_unpack(p, why, sizeof why, "{s:s s?s}", "session", &name, "kernel_name", &kname))
        return reply_invalid(c, method, why);
    km_err err = {0, ""};
    json_t *nb = km_export(daemon_mgr, name, kname, &err);
    if (!nb)
        return reply_err(c, err.code, err.msg);
    reply_ok(c, json_pack("{s:o}", "notebook", nb));
}

static void m_connection_file(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *name, *lang = NULL;
    if (rpc_unpack(p, why, sizeof why, "{s:s s?s}", "session", &name, "lang", &lang))
        return reply_invalid(c, method, why);
    km_err err = {0, ""};
    char path[4096];
    if (km_connection_file(daemon_mgr, name, lang, path, sizeof path, &err))
        return reply_err(c, err.code, err.msg);
    reply_ok(c, json_pack("{s:s}", "connection_file", path));
}

/* Starts serving HTTP in this running daemon (daemon_http.h): what `serve
 * --http` asks of a daemon an agent's exec started. */
static void m_http_start(conn *c, const char *method, const json_t *p)
{
    char why[600];
    const char *listen, *cert = NULL, *key = NULL;
    int insecure = 0;
    if (rpc_unpack(p, why, sizeof why, "{s:s s?s s?s s?b}", "listen", &listen, "tls_cert", &cert,
                   "tls_key", &key, "insecure", &insecure))
        return reply_invalid(c, method, why);
    if ((cert && cert[0] != '/') || (key && key[0] != '/'))
        return reply_invalid(c, method, "fields \"tls_cert\", \"tls_key\": must be absolute paths");
    daemon_http_listen l = {listen, cert, key, insecure};
    km_err err = {0, ""};
    char url[256];
    int started = 0, port = 0;
    if (daemon_http_start(daemon_mgr, &l, &started, url, sizeof url, &port, &err))
        return reply_err(c, err.code, err.msg);
    reply_ok(c, json_pack("{s:s s:i s:b s:i}", "url", url, "port", port, "started", started, "pid",
                          (int)getpid()));
}

static void m_shutdown(conn *c, const char *method, const json_t *p)
{
    char why[600];
    if (rpc_unpack(p, why, sizeof why, "{}"))
        return reply_invalid(c, method, why);
    reply_ok(c, NULL);
    daemon_stop = 1;
    loop_wake();
}

/* The fields of each method and the tiers that may send them (dtier.h).
 * The session options are the table dtier_sessopts. */
#define F_ALL(name)                                                                                \
    {                                                                                              \
        name, DT_ALL, 0, NULL                                                                      \
    }
static const dtier_field f_none[] = {{NULL, 0, 0, NULL}};
static const dtier_field f_session[] = {F_ALL("session"), {NULL, 0, 0, NULL}};
static const dtier_field f_initialize[] = {
    F_ALL("api_version"),
    F_ALL("client"),
    F_ALL("tier"),
    {"allowlist", DT_O, 0, "it names a host path: the operator's allowlist applies"},
    {"allow_unsafe_session_options", DT_O, 0, "only the operator opts a connection in"},
    {NULL, 0, 0, NULL}};
static const dtier_field f_exec[] = {F_ALL("session"),
                                     F_ALL("code"),
                                     F_ALL("lang"),
                                     F_ALL("timeout"),
                                     F_ALL("continue_on_error"),
                                     F_ALL("stream"),
                                     {"raw_text", DT_O | DT_M, 0, "messages over HTTP are JSON"},
                                     {NULL, 0, 0, NULL}};
static const dtier_field f_close[] = {F_ALL("session"), F_ALL("keep"), {NULL, 0, 0, NULL}};
static const dtier_field f_files_list[] = {F_ALL("session"), F_ALL("path"), {NULL, 0, 0, NULL}};
static const dtier_field f_files_read[] = {F_ALL("session"), F_ALL("path"),     F_ALL("offset"),
                                           F_ALL("length"),  F_ALL("encoding"), {NULL, 0, 0, NULL}};
static const dtier_field f_files_write[] = {F_ALL("session"),  F_ALL("path"),   F_ALL("content"),
                                            F_ALL("encoding"), F_ALL("append"), F_ALL("create"),
                                            {NULL, 0, 0, NULL}};
static const dtier_field f_packages[] = {
    F_ALL("session"),
    F_ALL("manager"),
    F_ALL("packages"),
    {"allowlist", DT_O, 0, "it names a host path: the operator's allowlist applies"},
    {NULL, 0, 0, NULL}};
static const dtier_field f_export[] = {F_ALL("session"), F_ALL("kernel_name"), {NULL, 0, 0, NULL}};
static const dtier_field f_connection_file[] = {
    F_ALL("session"), F_ALL("lang"), {NULL, 0, 0, NULL}};
static const dtier_field f_http_start[] = {
    F_ALL("listen"), F_ALL("tls_cert"), F_ALL("tls_key"), F_ALL("insecure"), {NULL, 0, 0, NULL}};

/* is_long: may run code, start kernels or wait for a session's running
 * cell; at most all workers but DAEMON_RESERVED run these. */
static const struct dmethod dmethods[] = {
    {"initialize", m_initialize, 0, DT_ALL, NULL, f_initialize, 0},
    {"ping", m_ping, 0, DT_ALL, NULL, f_none, 0},
    {"session.create", m_session_create, 0, DT_ALL, NULL, f_session, 1},
    {"exec", m_exec, 1, DT_ALL, NULL, f_exec, 1},
    {"interrupt", m_interrupt_restart, 0, DT_ALL, NULL, f_session, 0},
    {"restart", m_interrupt_restart, 1, DT_ALL, NULL, f_session, 0},
    {"close", m_close, 0, DT_ALL, NULL, f_close, 0},
    {"sessions.list", m_sessions_list, 0, DT_ALL, NULL, f_none, 0},
    {"session.repair", m_session_repair, 0, DT_O,
     "repairing the daemon's state files is its operator's", f_session, 0},
    {"files.list", m_files_list, 0, DT_ALL, NULL, f_files_list, 0},
    {"files.read", m_files_read, 0, DT_ALL, NULL, f_files_read, 0},
    {"files.write", m_files_write, 1, DT_ALL, NULL, f_files_write, 1},
    {"export", m_export, 0, DT_ALL, NULL, f_export, 0},
    {"packages.install", m_packages_install, 1, DT_ALL, NULL, f_packages, 0},
    {"connection_file", m_connection_file, 1, DT_O,
     "a connection file is a host path; over HTTP use the kernel WebSocket", f_connection_file, 0},
    {"shutdown", m_shutdown, 0, DT_O, "the daemon is its operator's to stop", f_none, 0},
    {"http.start", m_http_start, 0, DT_O, "the daemon's listening addresses are its operator's",
     f_http_start, 0},
    {NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* The tier check before any handler runs: the method and every field the
 * request sent must be permitted for the connection's tier. 0, or -1 with
 * the refusal sent. */
static int tier_check(conn *c, const struct dmethod *d, const json_t *params)
{
    const dtier_grant *g = &c->dc->grant;
    char why[900];
    if (!(d->tiers & DT_BIT(g->tier))) {
        snprintf(why, sizeof why, "%s is not available to %s (%s)", d->name, dtier_clients(g->tier),
                 d->why ? d->why : "not permitted for its tier");
        json_t *o =
            rpc_error(c->id, RPC_INVALID_PARAMS, why, json_pack("{s:i}", "km_code", KM_EUSAGE));
        if (o)
            conn_write_json(c->dc, o, 0);
        json_decref(o);
        return -1;
    }
    if (json_is_object(params) &&
        dtier_check_fields(g, d->fields, d->sopts, params, why, sizeof why)) {
        reply_invalid(c, d->name, why);
        return -1;
    }
    return 0;
}

static json_t *hello(km_manager *m)
{
    json_t *methods = json_array();
    for (const struct dmethod *d = dmethods; d->name; d++)
        json_array_append_new(methods, json_string(d->name));
    return json_pack("{s:i s:s s:s s:i s:s s:o s:o}", "api_version", DAEMON_API_VERSION, "server",
                     "kernelmgr", "version", DAEMON_VERSION, "pid", (int)getpid(), "home",
                     km_manager_home(m), "pool", km_pool_status(m), "methods", methods);
}

/* The methods a connection of grant g may call, for its hello. */
static json_t *hello_for(km_manager *m, const dtier_grant *g)
{
    json_t *h = hello(m);
    json_t *methods = json_array();
    for (const struct dmethod *d = dmethods; d->name; d++)
        if (d->tiers & DT_BIT(g->tier))
            json_array_append_new(methods, json_string(d->name));
    json_object_set_new(h, "methods", methods);
    json_object_set_new(h, "tier", json_string(dtier_name(g->tier)));
    return h;
}

static const struct dmethod *dmethod_find(const char *name)
{
    for (const struct dmethod *d = dmethods; d->name; d++)
        if (!strcmp(d->name, name))
            return d;
    return NULL;
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

        conn c = {j->c, json_object_get(j->req, "id"), 0, 0, j->c->grant.tier};
        job_bytes = 0;
        double t0 = cm_mono_s();
        if (tier_check(&c, j->meth, json_object_get(j->req, "params")) == 0)
            j->meth->fn(&c, j->meth->name, json_object_get(j->req, "params"));
        json_decref(j->req);
        j->req = NULL;
        /* a large result (or a burst of output) was just freed: give the
         * memory back to the system instead of keeping the high-water mark.
         * Only after a request that could have left one: 1 MiB or more sent
         * to the client, or 20 ms or more of work (a burst the client did
         * not stream). malloc_trim walks every arena, ~0.1-0.3 ms: after
         * every trivial exec it was a fifth of the daemon's CPU; here it
         * costs at most ~1 % of the request it follows. */
        if (lng && (job_bytes >= ((size_t)1 << 20) || cm_mono_s() - t0 >= 0.020))
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

/* Queues req (steals; a valid request for method d) of c; 0, or -1 when
 * the queue is full. */
static int submit(dconn *c, json_t *req, const struct dmethod *d)
{
    djob *j = calloc(1, sizeof *j);
    if (!j)
        return -1;
    j->c = c;
    j->req = req;
    j->meth = d;
    j->is_long = d->is_long;
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
    free(c->allowlist);
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
            rpc_msg msg;
            char why[300];
            int kind = rpc_parse(c->rbuf, n, &msg, why, sizeof why);
            memmove(c->rbuf, nl + 1, c->rlen - n - 1);
            c->rlen -= n + 1;
            conn cc = {c, msg.id, 0, 0, c->grant.tier};
            if (kind < 0) {
                if (!msg.silent) {
                    json_t *o = rpc_error(msg.id, kind, why, NULL);
                    if (o)
                        conn_write_json(c, o, 0);
                    json_decref(o);
                }
                rpc_msg_clear(&msg);
                continue;
            }
            /* the API defines no client notifications, and sends no
             * requests whose responses could come back: both are ignored */
            const struct dmethod *d = kind == RPC_REQUEST ? dmethod_find(msg.method) : NULL;
            if (kind == RPC_REQUEST && !d) {
                char m2[200];
                snprintf(m2, sizeof m2, "Method not found: %.100s", msg.method);
                json_t *o = rpc_error(msg.id, RPC_METHOD_NOT_FOUND, m2, NULL);
                if (o)
                    conn_write_json(c, o, 0);
                json_decref(o);
            }
            if (!d) {
                rpc_msg_clear(&msg);
                continue;
            }
            json_t *req = json_incref(msg.root);
            rpc_msg_clear(&msg);
            cc.id = json_object_get(req, "id");
            c->refs++;
            c->busy = 1;
            if (submit(c, req, d)) {
                c->refs--;
                c->busy = 0;
                char m2[200];
                snprintf(m2, sizeof m2,
                         "the daemon is busy: %u requests already wait for a worker "
                         "(daemon_queue); retry later",
                         D.queue_max);
                reply_err(&cc, KM_EDAEMON, m2);
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
                if (cm_mono_s() - last > 10) {
                    fprintf(stderr, "kernelmgr: cannot accept a connection: %s\n", strerror(errno));
                    last = cm_mono_s();
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
    double now = cm_mono_s();
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
    char sock[256];
    if (daemon_socket_path(home, sock, sizeof sock, err))
        return KM_EDAEMON;
    /* the home is trusted state (kmhome.h): made, or refused, before a file
     * in it is opened */
    if (kmhome_prepare(home, 1, err->msg, sizeof err->msg)) {
        err->code = KM_EUSAGE;
        return KM_EUSAGE;
    }
    /* one daemon per home: the lock outlives crashes (the kernel drops it) */
    char *path = cm_path_join(home, "daemon.lock");
    /* files the manager makes: no link followed, no FIFO waited on */
    int lockfd =
        path ? open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600) : -1;
    if (lockfd < 0) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "%s/daemon.lock: %s", home, strerror(errno));
        free(path);
        return KM_EDAEMON;
    }
    free(path);
    /* The lock is held by a serving daemon (its socket answers: nothing to
     * do) or by one still stopping its kernels (wait for it, up to 30 s). */
    for (int tries = 0; flock(lockfd, LOCK_EX | LOCK_NB); tries++) {
        int fd = errno == EWOULDBLOCK ? try_connect(sock) : -1;
        if (fd >= 0 || errno != EWOULDBLOCK || tries >= 300) {
            if (fd >= 0)
                close(fd);
            close(lockfd);
            return DAEMON_SERVE_ALREADY;
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
    /* Bound and listening under a temporary name, then renamed into place:
     * whoever sees kernelmgr.sock can connect (a client that found the file
     * between bind and listen was refused). The temporary name is shorter
     * than the socket's, so it fits where the socket's does. */
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s/.s%d", home, (int)getpid());
    unlink(sun.sun_path);
    mode_t old = umask(0177);
    int brc = L.lfd >= 0 ? bind(L.lfd, (struct sockaddr *)&sun, sizeof sun) : -1;
    umask(old);
    /* the kernel caps the backlog at net.core.somaxconn */
    if (brc || chmod(sun.sun_path, 0600) || listen(L.lfd, 65535) || rename(sun.sun_path, sock)) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s: %s", sock, strerror(errno));
        unlink(sun.sun_path);
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
    /* Jupyter frontends over HTTP (daemon_http.h), when configured */
    if (cfg->http[0]) {
        int http_started;
        if (daemon_http_start(daemon_mgr, NULL, &http_started, NULL, 0, NULL, err)) {
            close(L.lfd);
            unlink(sock);
            km_manager_destroy(&daemon_mgr);
            close(lockfd);
            return err->code;
        }
    }
    char *pidfile = cm_path_join(home, "daemon.pid");
    int pfd = pidfile
                  ? open(pidfile,
                         O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644)
                  : -1;
    if (pfd >= 0) {
        dprintf(pfd, "%d\n", (int)getpid());
        close(pfd);
    }
    fprintf(stderr, "kernelmgr: serving %s (pid %d, %u workers, max_kernels %u)\n", sock,
            (int)getpid(), started, cfg->max_kernels);
    pthread_t ticker;
    int have_ticker = pthread_create(&ticker, NULL, tick_thread, NULL) == 0;
    double last_scan = cm_mono_s();
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
        double now = cm_mono_s();
        if (now - last_scan >= 0.25) {
            loop_scan(&L);
            last_scan = now;
        }
    }
    fprintf(stderr, "kernelmgr: daemon stopping\n");
    /* Clients still connected are dropped (what is pending is sent if the
     * socket takes it now): the loop's reference goes, and the connection
     * is freed here or, when a worker still runs its request, with that
     * request's reference (loop_done, or a reachable job at exit). */
    while (L.all) {
        dconn *c = L.all;
        pthread_mutex_lock(&c->mu);
        obuf_flush(c);
        pthread_mutex_unlock(&c->mu);
        conn_drop(&L, c, NULL);
    }
    loop_done(&L);
    daemon_http_stop();
    close(L.lfd);
    unlink(sock);
    if (have_ticker)
        pthread_join(ticker, NULL);
    /* kernels go down with the daemon; workspaces and session.json stay, so
     * the next daemon brings the sessions back with fresh kernels */
    km_manager_destroy(&daemon_mgr);
    loop_done(&L); /* requests that ended meanwhile release their connection */
    close(L.ep);
    if (pidfile)
        unlink(pidfile);
    free(pidfile);
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
    int logfd =
        open(log, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
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
    /* a socket in a home that is not ours alone may be anyone's daemon */
    if (kmhome_prepare(home, 0, err->msg, sizeof err->msg)) {
        err->code = KM_EUSAGE;
        return -1;
    }
    int fd = try_connect(sock);
    if (fd >= 0 || !autostart) {
        if (fd < 0) {
            err->code = KM_EDAEMON;
            snprintf(err->msg, sizeof err->msg, "no daemon is running for %s", home);
        }
        return fd;
    }
    if (kmhome_prepare(home, 1, err->msg, sizeof err->msg)) {
        err->code = KM_EUSAGE;
        return -1;
    }
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

/* Fills err from a JSON-RPC error object; returns the KM_E* code. */
static int error_from(const json_t *e, km_err *err)
{
    json_t *kc = json_object_get(json_object_get(e, "data"), "km_code");
    int code = json_is_integer(kc) && json_integer_value(kc) > 0 && json_integer_value(kc) < 100
                   ? (int)json_integer_value(kc)
                   : rpc_code_to_km((int)json_integer_value(json_object_get(e, "code")));
    const char *msg = json_string_value(json_object_get(e, "message"));
    err->code = code;
    snprintf(err->msg, sizeof err->msg, "%s", msg ? msg : "the daemon reported an error");
    return code;
}

static atomic_llong call_seq;

int daemon_call(int fd, const char *method, json_t *params, const daemon_callbacks *cb,
                json_t **result, km_err *err)
{
    static const daemon_callbacks none = {0};
    if (!cb)
        cb = &none;
    *result = NULL;
    json_t *id = json_integer((json_int_t)atomic_fetch_add(&call_seq, 1) + 1);
    json_t *req = rpc_request(id, method, params);
    int sent = req ? daemon_send_json(fd, req) : -1;
    json_decref(req);
    if (sent) {
        json_decref(id);
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot send to the daemon: %s", strerror(errno));
        return KM_EDAEMON;
    }
    lreader r = {fd, NULL, 0, 0, 0};
    int cancelled = 0, rc = KM_EDAEMON;
    json_t *pending = NULL; /* a raw stream event waiting for its text */
    size_t pending_n = 0;
    double next_tick = cm_mono_s() + 0.2;
    for (;;) {
        int to;
        char *line = NULL, *text = NULL;
        /* ticks by the clock: a request streaming output without pause
         * still gets them (progress, cancellation) */
        if (cb->on_tick && cm_mono_s() >= next_tick) {
            next_tick = cm_mono_s() + 0.2;
            if (cb->on_tick(cb->ud) && !cancelled) {
                cancelled = 1;
                if (cb->on_cancel)
                    cb->on_cancel(cb->ud);
            }
        }
        if (pending)
            text = lreader_bytes(&r, pending_n, 200, &to);
        else
            line = lreader_next(&r, 200, &to);
        if (text) {
            json_object_set_new(pending, "text", json_stringn_nocheck(text, pending_n));
            if (cb->on_event)
                cb->on_event(cb->ud, pending);
            json_decref(pending);
            pending = NULL;
            continue;
        }
        if (!line) {
            if (to)
                continue;
            err->code = KM_EDAEMON;
            snprintf(err->msg, sizeof err->msg,
                     "the daemon closed the connection without a response (did it stop? see "
                     "daemon.log)");
            break;
        }
        json_t *o = json_loads(line, 0, NULL);
        if (!json_is_object(o)) {
            json_decref(o);
            continue;
        }
        json_t *m = json_object_get(o, "method");
        if (json_is_string(m)) {
            /* a notification: an event of our request */
            json_t *ps = json_object_get(o, "params");
            json_t *tb = json_object_get(ps, "text_bytes");
            if (json_is_integer(tb)) {
                /* raw_text: the text's bytes follow (on_event_raw) */
                json_int_t n = json_integer_value(tb);
                if (n < 0 || (unsigned long long)n > DAEMON_MAX_LINE) {
                    json_decref(o);
                    err->code = KM_EDAEMON;
                    snprintf(err->msg, sizeof err->msg,
                             "the daemon sent a stream event of %lld bytes (at most %u)",
                             (long long)n, DAEMON_MAX_LINE);
                    break;
                }
                pending = json_incref(ps);
                pending_n = (size_t)n;
            } else if (json_is_object(ps) && cb->on_event &&
                       !strcmp(json_string_value(m), DAEMON_EVENT_METHOD)) {
                cb->on_event(cb->ud, ps);
            }
            json_decref(o);
            continue;
        }
        if (!json_equal(json_object_get(o, "id"), id) && !json_is_null(json_object_get(o, "id"))) {
            json_decref(o);
            continue;
        }
        json_t *e = json_object_get(o, "error");
        if (e) {
            rc = error_from(e, err);
        } else if (json_object_get(o, "result")) {
            *result = json_incref(json_object_get(o, "result"));
            rc = 0;
        } else {
            err->code = KM_EDAEMON;
            snprintf(err->msg, sizeof err->msg, "the daemon sent a response without a result");
        }
        json_decref(o);
        break;
    }
    free(r.buf);
    json_decref(pending);
    json_decref(id);
    return rc;
}

int daemon_declare_tier(int fd, const char *tier, const char *allowlist, int unsafe, km_err *err)
{
    json_t *p = json_pack("{s:i s:s}", "api_version", DAEMON_API_VERSION, "tier", tier);
    if (p && allowlist)
        json_object_set_new(p, "allowlist", json_string(allowlist));
    if (p && unsafe)
        json_object_set_new(p, "allow_unsafe_session_options", json_true());
    json_t *res = NULL;
    int rc = daemon_call(fd, "initialize", p, NULL, &res, err);
    json_decref(res);
    return rc;
}

int daemon_request(const char *home, char *const argv_extra[], const char *method, json_t *params,
                   const daemon_callbacks *cb, json_t **result, km_err *err)
{
    *result = NULL;
    int fd = daemon_connect(home, 1, argv_extra, err);
    if (fd < 0) {
        json_decref(params);
        return err->code ? err->code : KM_EDAEMON;
    }
    int rc = daemon_call(fd, method, params, cb, result, err);
    close(fd);
    return rc;
}
