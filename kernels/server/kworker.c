/*
 * kworker.c — worker process and its pipes, see kworker.h.
 */
#include "kernels/server/kworker.h"
#include "common/cm_utf8.h"
#include "kernels/server/kserver.h"
#include "kernels/egress/egproxy.h"

#include "common/cm_size.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "jp.h"
#include "kernels/server/kenv.h"

extern char **environ;

#define KWORKER_READ_CHUNK (256u << 10)

/* Bytes queued for a pipe to the worker: [off, len) are still to write. */
typedef struct kw_out {
    char *buf;
    size_t len, off, cap;
} kw_out;

/* A partial line read from a pipe of the worker. */
typedef struct kw_lines {
    char *buf;
    size_t len, cap;
    int skip; /* discarding an over-long line until its newline */
} kw_lines;

struct kworker {
    sandbox *sb;
    pid_t pid;
    int fds[KW__COUNT]; /* indexed by kworker_pipe; -1 when closed or absent */
    kw_out req;         /* pending request bytes */
    kw_out dbg;         /* pending debug request lines */
    kw_lines evt;       /* partial event line */
    kw_lines dbg_in;    /* partial debug line */
    int exited;
    int wait_status;
    uint64_t started_ns;
    egproxy *egress;     /* the egress proxy serving the sandbox's listener, or NULL */
    char *egress_holder; /* in a session sandbox with an allow-list: the holder's
                            socket, whose proxy serves every kernel (owned) */
};

uint64_t kworker_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Appends a copy of entry to env[*k] unless a variable of the same name is
 * already there (earlier entries win). 0, or -1 when out of memory. */
static int env_put(char **env, size_t *k, const char *entry)
{
    size_t nl = strcspn(entry, "=");
    for (size_t i = 0; i < *k; i++)
        if (!strncmp(env[i], entry, nl) && env[i][nl] == '=')
            return 0;
    if (!(env[*k] = strdup(entry)))
        return -1;
    (*k)++;
    return 0;
}

/* Builds the worker's environment from scratch (kenv.h), never from ours:
 * in order of precedence, the fd numbers, the backend's extras and --env
 * (spec->env: a later entry of a name already replaced an earlier one),
 * then PATH and HOME, then the allow-listed host variables (LANG, LC_*,
 * TERM, TZ). new (free with free_env). */
static const char *const egress_env[] = {
    "http_proxy=http://127.0.0.1:" KWORKER_EGRESS_PORT_S,
    "https_proxy=http://127.0.0.1:" KWORKER_EGRESS_PORT_S,
    "HTTP_PROXY=http://127.0.0.1:" KWORKER_EGRESS_PORT_S,
    "HTTPS_PROXY=http://127.0.0.1:" KWORKER_EGRESS_PORT_S,
    NULL,
};

/* no_proxy / NO_PROXY: the sandbox's own loopback is reached directly,
 * except a loopback address the list names (the operator means the host's
 * service there: through the proxy). */
static void egress_no_proxy(const egpolicy *p, char *buf, size_t n)
{
    static const char *const local[] = {"localhost", "127.0.0.1", "::1", NULL};
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; local[i]; i++) {
        int listed = 0;
        for (size_t j = 0; j < p->n; j++)
            listed |= egpolicy_is_literal(p, (int)j) && !strcmp(p->e[j].host, local[i]);
        if (!listed && len < n)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? "," : "", local[i]);
    }
}

static char **build_env(const kworker_spec *spec, const egpolicy *egress)
{
    size_t n = 0, extra = 8 + sizeof egress_env / sizeof *egress_env;
    while (environ[n])
        n++;
    for (size_t i = 0; i < KSPEC_MAX_ENV && spec->env[i]; i++)
        extra++;
    char **env = calloc(n + extra + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    int rc = env_put(env, &k, "KERNELMGR_REQ_FD=3") | env_put(env, &k, "KERNELMGR_EVT_FD=4");
    if (spec->debug_pipes)
        rc |=
            env_put(env, &k, "KERNELMGR_DBG_REQ_FD=5") | env_put(env, &k, "KERNELMGR_DBG_EVT_FD=6");
    for (size_t i = 0; i < KSPEC_MAX_ENV && spec->env[i]; i++)
        rc |= env_put(env, &k, spec->env[i]);
    /* after the user's: a session's own proxy variables win (they can only
     * lose it the one way out) */
    for (size_t i = 0; egress && egress_env[i]; i++)
        rc |= env_put(env, &k, egress_env[i]);
    if (egress) {
        char np[64], var[80];
        egress_no_proxy(egress, np, sizeof np);
        snprintf(var, sizeof var, "no_proxy=%s", np);
        rc |= env_put(env, &k, var);
        snprintf(var, sizeof var, "NO_PROXY=%s", np);
        rc |= env_put(env, &k, var);
    }
    rc |= env_put(env, &k, "PATH=" KENV_SANDBOX_PATH) | env_put(env, &k, "HOME=" KENV_SANDBOX_HOME);
    for (size_t i = 0; i < n; i++)
        if (kenv_host_allowed(environ[i]))
            rc |= env_put(env, &k, environ[i]);
    env[k] = NULL;
    if (rc) {
        for (size_t j = 0; j < k; j++)
            free(env[j]);
        free(env);
        return NULL;
    }
    return env;
}

static void free_env(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

kworker *kworker_start(const kworker_spec *spec, const sandbox_config *cfg, const egpolicy *egress,
                       char *err, size_t errlen)
{
    int use_egress = egress && egress->n > 0;
    int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1}, req[2] = {-1, -1},
        evt[2] = {-1, -1}, dreq[2] = {-1, -1}, devt[2] = {-1, -1}, devnull = -1;
    char **env = NULL;
    kworker *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < KW__COUNT; i++)
        w->fds[i] = -1;
    if (!spec->argv[0]) {
        snprintf(err, errlen, "the backend gave no worker command");
        goto fail;
    }
    if (spec->debug_pipes && spec->quiet_start) {
        snprintf(err, errlen, "the backend asked for both quiet_start and debug_pipes (fd 5)");
        goto fail;
    }
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 ||
        pipe2(req, O_CLOEXEC) < 0 || pipe2(evt, O_CLOEXEC) < 0 ||
        (spec->debug_pipes && (pipe2(dreq, O_CLOEXEC) < 0 || pipe2(devt, O_CLOEXEC) < 0))) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto fail;
    }
    /* stdin of user code: an empty pipe whose write end is closed, so reads
     * see end-of-file, and the worker can tell its own stdin from a file the
     * user redirected (a distinct inode, unlike /dev/null). */
    close_fd(&in[1]);
    /* Bigger output pipes mean fewer wake-ups under heavy output; best effort. */
    fcntl(out[0], F_SETPIPE_SZ, 1 << 20);
    fcntl(errp[0], F_SETPIPE_SZ, 256 << 10);
    env = build_env(spec, use_egress ? egress : NULL);
    if (!env) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    sandbox_config c = *cfg;
    c.ro_paths = (const char *const *)spec->ro_paths;
    /* A zygote only in a session sandbox, only when the backend has one. */
    c.zygote_argv = spec->zygote_argv[0] ? spec->zygote_argv : NULL;
    if (!c.session_socket || !c.zygote_argv)
        c.zygote_forks = 0;
    if (use_egress) {
        c.network = 0;
        /* in a session sandbox, its holder serves the session's listener */
        c.loopback_listen_port = cfg->session_socket ? 0 : KWORKER_EGRESS_PORT;
    }
    int child_fds[KSPEC_DEBUG_EVT_FD + 1] = {in[0], out[1], errp[1], req[0], evt[1], errp[1]};
    int nfds = 5;
    if (spec->quiet_start) {
        /* Saves the worker a shell whose only job is to move stderr aside. */
        devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (devnull < 0) {
            snprintf(err, errlen, "open /dev/null: %s", strerror(errno));
            goto fail;
        }
        child_fds[2] = devnull;
        nfds = KSPEC_STDERR_FD + 1;
    } else if (spec->debug_pipes) {
        child_fds[KSPEC_DEBUG_REQ_FD] = dreq[0];
        child_fds[KSPEC_DEBUG_EVT_FD] = devt[1];
        nfds = KSPEC_DEBUG_EVT_FD + 1;
    }
    w->sb = sandbox_spawn(&c, spec->argv, env, child_fds, nfds, err, errlen);
    close_fd(&devnull);
    if (!w->sb)
        goto fail;
    w->pid = sandbox_pid(w->sb);
    w->started_ns = kworker_now_ns();
    if (use_egress && cfg->session_socket && !(w->egress_holder = strdup(cfg->session_socket))) {
        snprintf(err, errlen, "out of memory");
        sandbox_destroy(&w->sb);
        goto fail;
    }
    if (use_egress && !cfg->session_socket) {
        char why[400];
        int lfd = sandbox_take_listen_fd(w->sb);
        w->egress = lfd >= 0 ? egproxy_start_policy(lfd, egress, why, sizeof why) : NULL;
        if (w->egress)
            egproxy_log_limit(w->egress, kserver_log_max());
        if (!w->egress) {
            snprintf(err, errlen, "the egress proxy cannot start: %s",
                     lfd < 0 ? "no listening socket from the sandbox" : why);
            sandbox_destroy(&w->sb);
            goto fail;
        }
    }
    close_fd(&in[0]);
    close_fd(&out[1]);
    close_fd(&errp[1]);
    close_fd(&req[0]);
    close_fd(&evt[1]);
    close_fd(&dreq[0]);
    close_fd(&devt[1]);
    w->fds[KW_STDOUT] = out[0];
    w->fds[KW_STDERR] = errp[0];
    w->fds[KW_EVENTS] = evt[0];
    w->fds[KW_REQUESTS] = req[1];
    w->fds[KW_DEBUG_REQ] = dreq[1];
    w->fds[KW_DEBUG_EVT] = devt[0];
    for (int i = 0; i < KW__COUNT; i++)
        if (w->fds[i] >= 0)
            fcntl(w->fds[i], F_SETFL, fcntl(w->fds[i], F_GETFL) | O_NONBLOCK);
    free_env(env);
    return w;
fail:
    free_env(env);
    int *all[] = {&in[0],  &in[1],  &out[0],  &out[1],  &errp[0], &errp[1], &req[0], &req[1],
                  &evt[0], &evt[1], &dreq[0], &dreq[1], &devt[0], &devt[1], &devnull};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        close_fd(all[i]);
    free(w);
    return NULL;
}

void kworker_destroy(kworker **pw)
{
    if (!pw || !*pw)
        return;
    kworker *w = *pw;
    for (int i = 0; i < KW__COUNT; i++)
        close_fd(&w->fds[i]);
    sandbox_destroy(&w->sb);
    egproxy_stop(&w->egress);
    free(w->egress_holder);
    free(w->req.buf);
    free(w->dbg.buf);
    free(w->evt.buf);
    free(w->dbg_in.buf);
    free(w);
    *pw = NULL;
}

pid_t kworker_pid(const kworker *w)
{
    return w->pid;
}

egproxy *kworker_egress(kworker *w)
{
    return w->egress;
}

long long kworker_egress_refusals(kworker *w, char *last, size_t lastlen)
{
    if (w->egress)
        return egproxy_refusals(w->egress, last, lastlen);
    return w->egress_holder ? sandbox_session_egress_refusals(w->egress_holder, last, lastlen) : -1;
}

sandbox *kworker_sandbox(kworker *w)
{
    return w->sb;
}

int kworker_fd(const kworker *w, kworker_pipe p)
{
    return w->fds[p];
}

void kworker_close_fd(kworker *w, kworker_pipe p)
{
    close_fd(&w->fds[p]);
}

/* Writes o's queued bytes to fd. 0, or -1 when the pipe is broken. */
static int out_write(kw_out *o, int fd)
{
    while (o->off < o->len) {
        if (fd < 0)
            return -1;
        ssize_t n = write(fd, o->buf + o->off, o->len - o->off);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        o->off += (size_t)n;
    }
    o->off = o->len = 0;
    return 0;
}

static int out_reserve(kw_out *o, size_t more)
{
    if (o->off > 0 && o->off == o->len)
        o->off = o->len = 0;
    if (o->len + more <= o->cap)
        return 0;
    size_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + more)
        cap *= 2;
    char *b = realloc(o->buf, cap);
    if (!b)
        return -1;
    o->buf = b;
    o->cap = cap;
    return 0;
}

static int out_append(kw_out *o, const char *data, size_t len)
{
    if (out_reserve(o, len) < 0)
        return -1;
    memcpy(o->buf + o->len, data, len);
    o->len += len;
    return 0;
}

int kworker_wants_write(const kworker *w)
{
    return w->req.off < w->req.len && w->fds[KW_REQUESTS] >= 0;
}

int kworker_write(kworker *w)
{
    return out_write(&w->req, w->fds[KW_REQUESTS]);
}

int kworker_send(kworker *w, const char *const *fields, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *f = fields[i] ? fields[i] : "";
        /* a C string cannot hold a NUL: nothing to strip; its own ends the field */
        if (out_append(&w->req, f, strlen(f) + 1) < 0)
            return -1;
    }
    return kworker_write(w);
}

int kworker_has_debug(const kworker *w)
{
    return w->fds[KW_DEBUG_REQ] >= 0;
}

int kworker_debug_wants_write(const kworker *w)
{
    return w->dbg.off < w->dbg.len && w->fds[KW_DEBUG_REQ] >= 0;
}

int kworker_debug_write(kworker *w)
{
    return out_write(&w->dbg, w->fds[KW_DEBUG_REQ]);
}

int kworker_debug_send(kworker *w, const char *line, size_t len)
{
    if (w->fds[KW_DEBUG_REQ] < 0 || memchr(line, '\n', len))
        return -1;
    if (out_append(&w->dbg, line, len) < 0 || out_append(&w->dbg, "\n", 1) < 0)
        return -1;
    return kworker_debug_write(w);
}

static void handle_line(char *line, size_t len, kworker_event_fn fn, void *ctx)
{
    size_t clean_len;
    char *clean = cm_utf8_sanitize(line, len, &clean_len);
    if (!clean)
        return;
    json_error_t jerr;
    json_t *ev = json_loadb(clean, clean_len, 0, &jerr);
    if (!json_is_object(ev)) {
        /* the sandboxed code writes this channel: rate-limited, capped */
        kserver_log("worker: ignoring a malformed line (%s): %.80s",
                    ev ? "not an object" : jerr.text, clean);
    } else {
        fn(ctx, ev);
    }
    json_decref(ev);
    free(clean);
}

/* Reads what fd has (one read) into lb and calls fn for each complete line
 * (a JSON object). 1 at end of file, 0 after progress, -1 when nothing. */
static int read_lines(kw_lines *lb, int fd, kworker_event_fn fn, void *ctx)
{
    if (fd < 0)
        return 1;
    if (lb->cap - lb->len < KWORKER_READ_CHUNK) {
        size_t cap = lb->len + KWORKER_READ_CHUNK;
        char *b = realloc(lb->buf, cap);
        if (!b)
            return -1;
        lb->buf = b;
        lb->cap = cap;
    }
    ssize_t n;
    do {
        n = read(fd, lb->buf + lb->len, KWORKER_READ_CHUNK);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? -1 : 1;
    if (n == 0)
        return 1;
    size_t start = 0, scan = lb->len;
    lb->len += (size_t)n;
    for (size_t i = scan; i < lb->len; i++) {
        if (lb->buf[i] != '\n')
            continue;
        if (!lb->skip && i > start)
            handle_line(lb->buf + start, i - start, fn, ctx);
        lb->skip = 0;
        start = i + 1;
    }
    memmove(lb->buf, lb->buf + start, lb->len - start);
    lb->len -= start;
    if (lb->len > KWORKER_MAX_EVENT) {
        kserver_log("worker: dropping a line longer than %u bytes", KWORKER_MAX_EVENT);
        lb->skip = 1;
        lb->len = 0;
    }
    /* Do not keep a huge buffer around after a big event. */
    if (lb->len == 0 && lb->cap > 4 * KWORKER_READ_CHUNK) {
        free(lb->buf);
        lb->buf = NULL;
        lb->cap = 0;
    }
    return 0;
}

/* An event line must name its type. */
typedef struct typed_ctx {
    kworker_event_fn fn;
    void *ctx;
} typed_ctx;

static void typed_event(void *arg, json_t *ev)
{
    typed_ctx *t = arg;
    if (!json_is_string(json_object_get(ev, "type"))) {
        kserver_log("worker: ignoring malformed event (%s)", "no \"type\"");
        return;
    }
    t->fn(t->ctx, ev);
}

int kworker_read_events(kworker *w, kworker_event_fn fn, void *ctx)
{
    typed_ctx t = {fn, ctx};
    return read_lines(&w->evt, w->fds[KW_EVENTS], typed_event, &t);
}

int kworker_read_debug(kworker *w, kworker_event_fn fn, void *ctx)
{
    return read_lines(&w->dbg_in, w->fds[KW_DEBUG_EVT], fn, ctx);
}

int kworker_reap(kworker *w)
{
    if (w->exited)
        return 1;
    int st;
    if (sandbox_reap(w->sb, &st) != 1)
        return 0;
    w->exited = 1;
    w->wait_status = st;
    return 1;
}

int kworker_exited(const kworker *w)
{
    return w->exited;
}

const char *kworker_describe_exit(kworker *w, char *buf, size_t size)
{
    char limit[160];
    const char *hit =
        w->exited ? sandbox_limit_hit(w->sb, w->wait_status, limit, sizeof limit) : NULL;
    int st = w->wait_status;
    /* Under the RLIMIT_DATA fallback a failed allocation is not counted:
     * a worker that exited with an error, or aborted or crashed (what a
     * failed malloc leads to; never SIGKILL), gets the limit named, as a
     * possibility. */
    unsigned long long rl = w->exited && !hit ? sandbox_memory_rlimit(w->sb) : 0;
    int maybe_alloc = (WIFEXITED(st) && WEXITSTATUS(st)) ||
                      (WIFSIGNALED(st) && (WTERMSIG(st) == SIGABRT || WTERMSIG(st) == SIGSEGV ||
                                           WTERMSIG(st) == SIGBUS));
    if (rl && maybe_alloc) {
        char n[32];
        snprintf(limit, sizeof limit,
                 "memory is capped at %s here by RLIMIT_DATA (no memory cgroup for this "
                 "caller): if an allocation failed, that limit is why",
                 cm_size_format(rl, n, sizeof n));
        hit = limit;
    }
    if (!w->exited)
        snprintf(buf, size, "is still running");
    else if (WIFSIGNALED(st))
        snprintf(buf, size, "was killed by signal %d (%s)%s%s", WTERMSIG(st),
                 strsignal(WTERMSIG(st)), hit ? ": " : "", hit ? hit : "");
    else
        snprintf(buf, size, "exited with status %d%s%s", WEXITSTATUS(st), hit ? ": " : "",
                 hit ? hit : "");
    return buf;
}

int kworker_exit_code(const kworker *w)
{
    if (!w->exited)
        return -1;
    if (WIFSIGNALED(w->wait_status))
        return 128 + WTERMSIG(w->wait_status);
    return WEXITSTATUS(w->wait_status);
}

int kworker_signal(kworker *w, int sig)
{
    if (w->exited)
        return -1;
    return sandbox_signal(w->sb, sig);
}

uint64_t kworker_age_ns(const kworker *w)
{
    return kworker_now_ns() - w->started_ns;
}
