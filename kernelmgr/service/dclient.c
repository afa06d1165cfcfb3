/*
 * dclient.c — the client side of the daemon (daemon.h): connecting (and
 * starting a daemon when none answers), one call with its events and
 * ticks, and the line reader under it.
 */
#include "kernelmgr/service/daemon_int.h"
#include "kernelmgr/service/rpc.h"
#include "kernelmgr/engine/kmhome.h"
#include "common/cm_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

int daemon_try_connect(const char *sock)
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
    if (kmhome_prepare(home, 0, err)) {
        return -1;
    }
    int fd = daemon_try_connect(sock);
    if (fd >= 0 || !autostart) {
        if (fd < 0) {
            km_err_set(err, KM_EDAEMON, "no daemon is running for %s", home);
        }
        return fd;
    }
    if (kmhome_prepare(home, 1, err)) {
        return -1;
    }
    if (spawn_daemon(home, argv_extra)) {
        km_err_set(err, KM_EDAEMON, "cannot start the daemon: %s", strerror(errno));
        return -1;
    }
    for (int i = 0; i < 900; i++) {
        fd = daemon_try_connect(sock);
        if (fd >= 0)
            return fd;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    km_err_set(err, KM_EDAEMON, "the daemon did not come up within 45 s (see %s/daemon.log)", home);
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
    km_err_set(err, code, "%s", msg ? msg : "the daemon reported an error");
    return code;
}

static atomic_llong call_seq;

/* What a call waits on: the connection's reader, the request's id, a raw
 * stream event whose text has yet to come. */
typedef struct dcall {
    const daemon_callbacks *cb;
    lreader r;
    json_t *id;      /* owned */
    json_t *pending; /* owned: a raw stream event waiting for its text */
    size_t pending_n;
    int cancelled;
    double next_tick;
} dcall;

/* What call_step returns while the response has not come. */
#define CALL_MORE (-1)

/* Ticks by the clock: a request streaming output without pause still gets
 * them (progress, cancellation). */
static void call_tick(dcall *k)
{
    const daemon_callbacks *cb = k->cb;
    if (!cb->on_tick || cm_mono_s() < k->next_tick)
        return;
    k->next_tick = cm_mono_s() + 0.2;
    if (cb->on_tick(cb->ud) && !k->cancelled) {
        k->cancelled = 1;
        if (cb->on_cancel)
            cb->on_cancel(cb->ud);
    }
}

/* A notification o (borrowed): an event of our request, or the head of a
 * raw one whose text follows. CALL_MORE, or KM_EDAEMON with err. */
static int call_event(dcall *k, const json_t *o, km_err *err)
{
    json_t *ps = json_object_get(o, "params");
    json_t *tb = json_object_get(ps, "text_bytes");
    if (json_is_integer(tb)) {
        /* raw_text: the text's bytes follow (dreq.c, on_event_raw) */
        json_int_t n = json_integer_value(tb);
        if (n < 0 || (unsigned long long)n > DAEMON_MAX_LINE) {
            km_err_set(err, KM_EDAEMON, "the daemon sent a stream event of %lld bytes (at most %u)",
                       (long long)n, DAEMON_MAX_LINE);
            return KM_EDAEMON;
        }
        k->pending = json_incref(ps);
        k->pending_n = (size_t)n;
    } else if (json_is_object(ps) && k->cb->on_event &&
               !strcmp(json_string_value(json_object_get(o, "method")), DAEMON_EVENT_METHOD)) {
        k->cb->on_event(k->cb->ud, ps);
    }
    return CALL_MORE;
}

/* A response o (borrowed): CALL_MORE when it is not ours, else 0 with
 * *result (new) or a KM_E* code with err. */
static int call_response(dcall *k, const json_t *o, json_t **result, km_err *err)
{
    if (!json_equal(json_object_get(o, "id"), k->id) && !json_is_null(json_object_get(o, "id")))
        return CALL_MORE;
    json_t *e = json_object_get(o, "error");
    if (e)
        return error_from(e, err);
    if (json_object_get(o, "result")) {
        *result = json_incref(json_object_get(o, "result"));
        return 0;
    }
    km_err_set(err, KM_EDAEMON, "the daemon sent a response without a result");
    return KM_EDAEMON;
}

/* Reads on for one message (or the text of a pending raw event, given to
 * on_event). CALL_MORE, or the call's outcome as daemon_call's. */
static int call_step(dcall *k, json_t **result, km_err *err)
{
    int to;
    call_tick(k);
    if (k->pending) {
        char *text = lreader_bytes(&k->r, k->pending_n, 200, &to);
        if (text) {
            json_object_set_new(k->pending, "text", json_stringn_nocheck(text, k->pending_n));
            if (k->cb->on_event)
                k->cb->on_event(k->cb->ud, k->pending);
            json_decref(k->pending);
            k->pending = NULL;
            return CALL_MORE;
        }
    }
    char *line = k->pending ? NULL : lreader_next(&k->r, 200, &to);
    if (!line && !to) {
        km_err_set(err, KM_EDAEMON,
                   "the daemon closed the connection without a response (did it stop? see "
                   "daemon.log)");
        return KM_EDAEMON;
    }
    json_t *o = line ? json_loads(line, 0, NULL) : NULL;
    int rc = CALL_MORE;
    if (json_is_object(o))
        rc = json_is_string(json_object_get(o, "method")) ? call_event(k, o, err)
                                                          : call_response(k, o, result, err);
    json_decref(o);
    return rc;
}

int daemon_call(int fd, const char *method, json_t *params, const daemon_callbacks *cb,
                json_t **result, km_err *err)
{
    static const daemon_callbacks none = {0};
    *result = NULL;
    json_t *id = json_integer((json_int_t)atomic_fetch_add(&call_seq, 1) + 1);
    json_t *req = rpc_request(id, method, params);
    int sent = req ? daemon_send_json(fd, req) : -1;
    json_decref(req);
    if (sent) {
        json_decref(id);
        km_err_set(err, KM_EDAEMON, "cannot send to the daemon: %s", strerror(errno));
        return KM_EDAEMON;
    }
    dcall k = {cb ? cb : &none, {fd, NULL, 0, 0, 0}, id, NULL, 0, 0, cm_mono_s() + 0.2};
    int rc;
    while ((rc = call_step(&k, result, err)) == CALL_MORE)
        ;
    free(k.r.buf);
    json_decref(k.pending);
    json_decref(k.id);
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
