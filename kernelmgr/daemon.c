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
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
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
    size_t len, cap;
} lreader;

/* Returns a new NUL-terminated line (without '\n'), NULL at EOF / error /
 * too long. timeout_ms < 0 waits forever; *timed_out set on timeout. */
static char *lreader_next(lreader *r, int timeout_ms, int *timed_out)
{
    if (timed_out)
        *timed_out = 0;
    for (;;) {
        char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
        if (nl) {
            size_t n = (size_t)(nl - r->buf);
            char *line = malloc(n + 1);
            if (!line)
                return NULL;
            memcpy(line, r->buf, n);
            line[n] = 0;
            memmove(r->buf, nl + 1, r->len - n - 1);
            r->len -= n + 1;
            return line;
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

/* ---------------------------------------------------------------- server */

typedef struct conn {
    int fd;
    json_t *id;
    int dead; /* the client went away: keep running, stop writing */
} conn;

static void reply_err(conn *c, int code, const char *msg)
{
    json_t *o = json_pack("{s:O s:b s:{s:i s:s}}", "id", c->id ? c->id : json_null(), "ok", 0,
                          "error", "code", code, "message", msg);
    if (!c->dead && daemon_send_json(c->fd, o))
        c->dead = 1;
    json_decref(o);
}

static void reply_ok(conn *c, json_t *o /* steals */)
{
    if (!o)
        o = json_object();
    json_object_set(o, "id", c->id ? c->id : json_null());
    json_object_set_new(o, "ok", json_true());
    if (!c->dead && daemon_send_json(c->fd, o))
        c->dead = 1;
    json_decref(o);
}

static void on_event(void *ud, const json_t *ev)
{
    conn *c = ud;
    if (c->dead)
        return;
    json_t *o = json_deep_copy(ev);
    json_object_set(o, "id", c->id ? c->id : json_null());
    if (daemon_send_json(c->fd, o))
        c->dead = 1;
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
    } else {
        char msg[128];
        snprintf(msg, sizeof msg, "unknown op \"%.60s\"", op);
        reply_err(c, KM_EUSAGE, msg);
    }
}

static void *conn_thread(void *arg)
{
    int fd = (int)(intptr_t)arg;
    lreader r = {fd, NULL, 0, 0};
    char *line;
    while (!daemon_stop && (line = lreader_next(&r, -1, NULL))) {
        conn c = {fd, NULL, 0};
        json_error_t jerr;
        json_t *req = json_loads(line, 0, &jerr);
        free(line);
        if (!json_is_object(req)) {
            char msg[300];
            snprintf(msg, sizeof msg, "request is not a JSON object: %s", jerr.text);
            reply_err(&c, KM_EUSAGE, msg);
            json_decref(req);
            continue;
        }
        c.id = json_object_get(req, "id");
        handle(&c, req);
        json_decref(req);
        if (c.dead)
            break;
    }
    free(r.buf);
    close(fd);
    atomic_fetch_sub(&daemon_conns, 1);
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

    daemon_mgr = km_manager_new(home, cfg, 1, err);
    if (!daemon_mgr) {
        close(lockfd);
        return err->code ? err->code : KM_EINTERNAL;
    }
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s", sock);
    unlink(sock);
    mode_t old = umask(0177);
    int brc = lfd >= 0 ? bind(lfd, (struct sockaddr *)&sun, sizeof sun) : -1;
    umask(old);
    if (brc || chmod(sock, 0600) || listen(lfd, 64)) {
        err->code = KM_EDAEMON;
        snprintf(err->msg, sizeof err->msg, "cannot listen on %s: %s", sock, strerror(errno));
        if (lfd >= 0)
            close(lfd);
        km_manager_destroy(&daemon_mgr);
        close(lockfd);
        return KM_EDAEMON;
    }
    snprintf(path, sizeof path, "%s/daemon.pid", home);
    FILE *pf = fopen(path, "w");
    if (pf) {
        fprintf(pf, "%d\n", (int)getpid());
        fclose(pf);
    }
    fprintf(stderr, "kernelmgr: serving %s (pid %d)\n", sock, (int)getpid());
    pthread_t ticker;
    int have_ticker = pthread_create(&ticker, NULL, tick_thread, NULL) == 0;
    while (!daemon_stop) {
        struct pollfd p = {lfd, POLLIN, 0};
        int rc = poll(&p, 1, 500);
        if (rc <= 0)
            continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        /* only our own uid may talk to us, even if the mode were wrong */
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) || cred.uid != getuid()) {
            close(fd);
            continue;
        }
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        atomic_fetch_add(&daemon_conns, 1);
        if (pthread_create(&t, &attr, conn_thread, (void *)(intptr_t)fd)) {
            atomic_fetch_sub(&daemon_conns, 1);
            close(fd);
        }
        pthread_attr_destroy(&attr);
    }
    fprintf(stderr, "kernelmgr: daemon stopping\n");
    close(lfd);
    unlink(sock);
    if (have_ticker)
        pthread_join(ticker, NULL);
    /* kernels go down with the daemon; workspaces and session.json stay, so
     * the next daemon brings the sessions back with fresh kernels */
    km_manager_destroy(&daemon_mgr);
    snprintf(path, sizeof path, "%s/daemon.pid", home);
    unlink(path);
    close(lockfd);
    /* connection threads still blocked in recv() die with the process */
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
    lreader r = {fd, NULL, 0, 0};
    int cancelled = 0;
    for (;;) {
        int to;
        char *line = lreader_next(&r, 200, &to);
        if (!line) {
            if (to) {
                if (cancel && *cancel && !cancelled && on_cancel) {
                    cancelled = 1;
                    on_cancel(ud);
                }
                continue;
            }
            free(r.buf);
            err->code = KM_EDAEMON;
            snprintf(err->msg, sizeof err->msg, "the daemon closed the connection");
            return KM_EDAEMON;
        }
        json_t *o = json_loads(line, 0, NULL);
        free(line);
        if (!json_is_object(o)) {
            json_decref(o);
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
