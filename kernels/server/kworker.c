/*
 * kworker.c — worker process and its pipes, see kworker.h.
 */
#include "kernels/server/kworker.h"
#include "kernels/server/kserver.h"

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

struct kworker {
    sandbox *sb;
    pid_t pid;
    int fds[4]; /* indexed by kworker_pipe */
    char *wbuf; /* pending request bytes [woff, wlen) */
    size_t wlen, woff, wcap;
    char *ebuf; /* partial event line */
    size_t elen, ecap;
    int eskip; /* discarding an over-long line until its newline */
    int exited;
    int wait_status;
    uint64_t started_ns;
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
static char **build_env(const kworker_spec *spec)
{
    size_t n = 0, extra = 4;
    while (environ[n])
        n++;
    for (size_t i = 0; i < KSPEC_MAX_ENV && spec->env[i]; i++)
        extra++;
    char **env = calloc(n + extra + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    int rc = env_put(env, &k, "KERNELMGR_REQ_FD=3") | env_put(env, &k, "KERNELMGR_EVT_FD=4");
    for (size_t i = 0; i < KSPEC_MAX_ENV && spec->env[i]; i++)
        rc |= env_put(env, &k, spec->env[i]);
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

kworker *kworker_start(const kworker_spec *spec, const sandbox_config *cfg, char *err,
                       size_t errlen)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, errp[2] = {-1, -1}, req[2] = {-1, -1},
        evt[2] = {-1, -1}, devnull = -1;
    char **env = NULL;
    kworker *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < 4; i++)
        w->fds[i] = -1;
    if (!spec->argv[0]) {
        snprintf(err, errlen, "the backend gave no worker command");
        goto fail;
    }
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(errp, O_CLOEXEC) < 0 ||
        pipe2(req, O_CLOEXEC) < 0 || pipe2(evt, O_CLOEXEC) < 0) {
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
    env = build_env(spec);
    if (!env) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    sandbox_config c = *cfg;
    c.ro_paths = (const char *const *)spec->ro_paths;
    int child_fds[KSPEC_STDERR_FD + 1] = {in[0], out[1], errp[1], req[0], evt[1], errp[1]};
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
    }
    w->sb = sandbox_spawn(&c, spec->argv, env, child_fds, nfds, err, errlen);
    close_fd(&devnull);
    if (!w->sb)
        goto fail;
    w->pid = sandbox_pid(w->sb);
    w->started_ns = kworker_now_ns();
    close_fd(&in[0]);
    close_fd(&out[1]);
    close_fd(&errp[1]);
    close_fd(&req[0]);
    close_fd(&evt[1]);
    w->fds[KW_STDOUT] = out[0];
    w->fds[KW_STDERR] = errp[0];
    w->fds[KW_EVENTS] = evt[0];
    w->fds[KW_REQUESTS] = req[1];
    for (int i = 0; i < 4; i++)
        fcntl(w->fds[i], F_SETFL, fcntl(w->fds[i], F_GETFL) | O_NONBLOCK);
    free_env(env);
    return w;
fail:
    free_env(env);
    int *all[] = {&in[0],  &in[1],  &out[0], &out[1], &errp[0], &errp[1],
                  &req[0], &req[1], &evt[0], &evt[1], &devnull};
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
    for (int i = 0; i < 4; i++)
        close_fd(&w->fds[i]);
    sandbox_destroy(&w->sb);
    free(w->wbuf);
    free(w->ebuf);
    free(w);
    *pw = NULL;
}

pid_t kworker_pid(const kworker *w)
{
    return w->pid;
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

int kworker_wants_write(const kworker *w)
{
    return w->woff < w->wlen && w->fds[KW_REQUESTS] >= 0;
}

int kworker_write(kworker *w)
{
    while (w->woff < w->wlen) {
        if (w->fds[KW_REQUESTS] < 0)
            return -1;
        ssize_t n = write(w->fds[KW_REQUESTS], w->wbuf + w->woff, w->wlen - w->woff);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        w->woff += (size_t)n;
    }
    w->woff = w->wlen = 0;
    return 0;
}

static int wbuf_reserve(kworker *w, size_t more)
{
    if (w->woff > 0 && w->woff == w->wlen)
        w->woff = w->wlen = 0;
    if (w->wlen + more <= w->wcap)
        return 0;
    size_t cap = w->wcap ? w->wcap : 4096;
    while (cap < w->wlen + more)
        cap *= 2;
    char *b = realloc(w->wbuf, cap);
    if (!b)
        return -1;
    w->wbuf = b;
    w->wcap = cap;
    return 0;
}

int kworker_send(kworker *w, const char *const *fields, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *f = fields[i] ? fields[i] : "";
        size_t len = strlen(f); /* a C string cannot hold a NUL: nothing to strip */
        if (wbuf_reserve(w, len + 1) < 0)
            return -1;
        memcpy(w->wbuf + w->wlen, f, len + 1);
        w->wlen += len + 1;
    }
    return kworker_write(w);
}

static void handle_line(char *line, size_t len, kworker_event_fn fn, void *ctx)
{
    size_t clean_len;
    char *clean = jp_utf8_sanitize(line, len, &clean_len);
    if (!clean)
        return;
    json_error_t jerr;
    json_t *ev = json_loadb(clean, clean_len, 0, &jerr);
    if (!json_is_object(ev) || !json_is_string(json_object_get(ev, "type"))) {
        /* the sandboxed code writes this channel: rate-limited, capped */
        kserver_log("worker: ignoring malformed event (%s): %.80s", ev ? "no \"type\"" : jerr.text,
                    clean);
    } else {
        fn(ctx, ev);
    }
    json_decref(ev);
    free(clean);
}

int kworker_read_events(kworker *w, kworker_event_fn fn, void *ctx)
{
    int fd = w->fds[KW_EVENTS];
    if (fd < 0)
        return 1;
    if (w->ecap - w->elen < KWORKER_READ_CHUNK) {
        size_t cap = w->elen + KWORKER_READ_CHUNK;
        char *b = realloc(w->ebuf, cap);
        if (!b)
            return -1;
        w->ebuf = b;
        w->ecap = cap;
    }
    ssize_t n;
    do {
        n = read(fd, w->ebuf + w->elen, KWORKER_READ_CHUNK);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return (errno == EAGAIN || errno == EWOULDBLOCK) ? -1 : 1;
    if (n == 0)
        return 1;
    size_t start = 0, scan = w->elen;
    w->elen += (size_t)n;
    for (size_t i = scan; i < w->elen; i++) {
        if (w->ebuf[i] != '\n')
            continue;
        if (!w->eskip && i > start)
            handle_line(w->ebuf + start, i - start, fn, ctx);
        w->eskip = 0;
        start = i + 1;
    }
    memmove(w->ebuf, w->ebuf + start, w->elen - start);
    w->elen -= start;
    if (w->elen > KWORKER_MAX_EVENT) {
        kserver_log("worker: dropping an event line longer than %u bytes", KWORKER_MAX_EVENT);
        w->eskip = 1;
        w->elen = 0;
    }
    /* Do not keep a huge buffer around after a big event. */
    if (w->elen == 0 && w->ecap > 4 * KWORKER_READ_CHUNK) {
        free(w->ebuf);
        w->ebuf = NULL;
        w->ecap = 0;
    }
    return 0;
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
