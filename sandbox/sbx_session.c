/*
 * sbx_session.c — one sandbox for a whole session, many workers in it.
 *
 *   kernel server ── unix socket ──▶ holder ── socketpair ──▶ init ── fork ▶ worker
 *   (host, any)      SEQPACKET       (host)     SEQPACKET      (PID 1, inside)
 *
 * The holder (sandbox_session_serve(), the kernelmgr-sandbox process of a
 * session) owns the sandbox: its monitor, cgroups and init, made by
 * sandbox_session_start() exactly as a worker's own sandbox is, except that
 * init, once every restriction is in force (mounts, Landlock, no
 * capabilities, seccomp, the cgroups), serves requests instead of forking
 * one worker. A kernel server asks the holder for a worker: argv, the
 * environment, the read-only paths it needs, and the worker's pipe fds by
 * SCM_RIGHTS. The holder checks the request, passes argv, environment and
 * fds to init, which forks and execs the worker with them and reports its
 * pid inside; the holder finds that pid among init's children on the host
 * (a pidfd, held against reuse) and hands the pidfd back to the kernel
 * server, which signals the worker's process group with it directly. Init
 * reports each worker's exit status; the holder forwards it to the worker's
 * kernel server. A kernel server that disconnects has its worker's group
 * killed; the holder's end (lifeline, SIGTERM, init gone) kills the sandbox.
 *
 * Trust: init runs with exactly the sandbox's rights (it is the sandbox's
 * code's peer, same uid, no capabilities, seccomp, Landlock), so whatever
 * the sandboxed code makes it do gains nothing the sandbox lacks. No host
 * process enters the sandbox's namespaces. Every message from init is
 * hostile input to the holder: bounded, fixed header, unknown ids and any
 * fds dropped, a reason made printable and cut; the only thing the holder
 * takes from init is a pid inside the sandbox, which it resolves itself
 * among init's own children.
 */
#include "sandbox/sandbox.h"
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long a spawn may take: init's fork and the worker's exec (holder),
 * plus making the sandbox at the first request (kernel server). */
#define SBX_SESS_SPAWN_MS 20000
#define SBX_SESS_JOIN_MS 60000
#define SBX_SESS_CONNECT_MS 10000
#define SBX_SESS_MAX_CLIENTS 64
/* How long a kernel server waits for the answer to a query ('R'). */
#define SBX_SESS_QUERY_MS 5000

/* ---- wire --------------------------------------------------------------- */

int sbx_sess_send(int fd, const sbx_sess_hdr *h, const void *payload, size_t len, const int *fds,
                  int nfds)
{
    if (nfds < 0 || nfds > SBX_SESS_MAX_FDS || len > SBX_SESS_MAX_MSG - sizeof *h) {
        errno = EMSGSIZE;
        return -1;
    }
    struct iovec iov[2] = {{(void *)h, sizeof *h}, {(void *)payload, len}};
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int) * SBX_SESS_MAX_FDS)];
    } cb;
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = len ? 2 : 1;
    if (nfds > 0) {
        memset(&cb, 0, sizeof cb);
        m.msg_control = cb.b;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    do {
        n = sendmsg(fd, &m, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)(sizeof *h + len) ? 0 : -1;
}

ssize_t sbx_sess_recv(int fd, sbx_sess_hdr *h, char *buf, size_t cap, int *fds, int *nfds,
                      int maxfds)
{
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int) * SBX_SESS_MAX_FDS)];
    } cb;
    memset(h, 0, sizeof *h);
    struct iovec iov[2] = {{h, sizeof *h}, {buf, cap}};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = 2;
    m.msg_control = cb.b;
    m.msg_controllen = sizeof cb.b;
    *nfds = 0;
    ssize_t n;
    do {
        n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n <= 0)
        return n;
    int got[SBX_SESS_MAX_FDS], ngot = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int f;
            memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
            if (ngot < SBX_SESS_MAX_FDS)
                got[ngot++] = f;
            else
                close(f);
        }
    }
    int bad = (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || ngot > maxfds || (size_t)n < sizeof *h ||
              h->magic != SBX_SESS_MAGIC;
    if (bad) {
        for (int i = 0; i < ngot; i++)
            close(got[i]);
        errno = EBADMSG;
        return -1;
    }
    for (int i = 0; i < ngot; i++)
        fds[i] = got[i];
    *nfds = ngot;
    /* an empty payload is 1 here, never 0 (end-of-file) */
    return (ssize_t)((size_t)n - sizeof *h) + 1;
}

int sbx_sess_split(char *payload, size_t len, uint32_t n, char **out)
{
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        char *nul = off < len ? memchr(payload + off, 0, len - off) : NULL;
        if (!nul)
            return -1;
        out[i] = payload + off;
        off = (size_t)(nul - payload) + 1;
    }
    out[n] = NULL;
    return off == len ? 0 : -1;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

/* Sends 'E' with reason made printable (hostile text stays inert). */
static void send_error(int fd, uint32_t id, const char *reason)
{
    char r[SBX_SESS_MAX_REASON + 1];
    size_t n = strnlen(reason, SBX_SESS_MAX_REASON);
    for (size_t i = 0; i < n; i++)
        r[i] = reason[i] >= 0x20 && reason[i] < 0x7f ? reason[i] : '?';
    r[n] = 0;
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC, .type = 'E', .id = id};
    sbx_sess_send(fd, &h, r, n + 1, NULL, 0);
}

/* A reason received in an 'E' message, made printable into out. */
static void take_reason(const char *buf, ssize_t n, char *out, size_t size)
{
    size_t k = 0;
    for (ssize_t i = 0; i + 1 < n && buf[i] && k + 1 < size && k < SBX_SESS_MAX_REASON; i++)
        out[k++] = buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '?';
    out[k] = 0;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits until fd is readable or deadline (now_ms) passes. 1, 0 (timeout), -1. */
static int wait_readable(int fd, uint64_t deadline)
{
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline)
            return 0;
        struct pollfd p = {fd, POLLIN, 0};
        int rc = poll(&p, 1, (int)(deadline - now));
        if (rc < 0 && errno == EINTR)
            continue;
        return rc < 0 ? -1 : rc > 0;
    }
}

/* The signals a worker's group may be sent through the holder and init. */
static int signal_allowed(int sig)
{
    static const int ok[] = {SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (ok[i] == sig)
            return 1;
    return 0;
}

/* ---- init: the session's PID 1 -------------------------------------------- */

typedef struct sess_worker {
    uint32_t id;
    pid_t pid; /* inside the sandbox; its pgid too (it called setsid) */
} sess_worker;

/* One spawn request from the holder: forks and execs the worker, replies
 * 'O' (its pid) or 'E'. fds are the worker's, closed here either way. */
static void init_spawn(const sandbox_config *cfg, const sbx_limits *lim, int ctl, int sfd,
                       const sbx_sess_hdr *h, char *buf, size_t len, int *fds, int nfds,
                       sess_worker *w, int *nw, sbx_zygote *zyg)
{
    char *strs[2 * SBX_SESS_MAX_ARGC + SBX_SESS_MAX_ENVC + 3];
    if (h->argc < 1 || h->argc > SBX_SESS_MAX_ARGC || h->envc > SBX_SESS_MAX_ENVC || h->roc ||
        h->zargc > SBX_SESS_MAX_ARGC ||
        sbx_sess_split(buf, len, h->argc + h->envc + h->zargc, strs) < 0 || strs[0][0] != '/') {
        send_error(ctl, h->id, "malformed spawn request");
        close_all(fds, nfds);
        return;
    }
    if (*nw >= SBX_SESS_MAX_WORKERS) {
        char r[96];
        snprintf(r, sizeof r, "too many workers in this session's sandbox (limit %d)",
                 SBX_SESS_MAX_WORKERS);
        send_error(ctl, h->id, r);
        close_all(fds, nfds);
        return;
    }
    char *argv[SBX_SESS_MAX_ARGC + 1], *envp[SBX_SESS_MAX_ENVC + 1];
    for (uint32_t i = 0; i < h->argc; i++)
        argv[i] = strs[i];
    argv[h->argc] = NULL;
    for (uint32_t i = 0; i < h->envc; i++)
        envp[i] = strs[h->argc + i];
    envp[h->envc] = NULL;
    if (h->zargc && h->zmax) {
        /* Forked by the session's zygote when it can; else cold, below. */
        char *zargv[SBX_SESS_MAX_ARGC + 1], why[SBX_SESS_MAX_REASON];
        for (uint32_t i = 0; i < h->zargc; i++)
            zargv[i] = strs[h->argc + h->envc + i];
        zargv[h->zargc] = NULL;
        pid_t zp = 0;
        if (sbx_zygote_spawn(zyg, cfg, lim, ctl, sfd, zargv, envp, fds, nfds, h->zmax, &zp, why,
                             sizeof why) == 0) {
            close_all(fds, nfds);
            w[*nw].id = h->id;
            w[*nw].pid = zp;
            (*nw)++;
            sbx_sess_hdr o = {.magic = SBX_SESS_MAGIC, .type = 'O', .id = h->id, .a = zp};
            sbx_sess_send(ctl, &o, NULL, 0, NULL, 0);
            return;
        }
    }
    int ep[2];
    if (pipe2(ep, O_CLOEXEC) < 0) {
        send_error(ctl, h->id, "init: pipe failed");
        close_all(fds, nfds);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(ep[0]);
        close(ctl);
        close(sfd);
        sbx_worker_exec(cfg, argv, envp, fds, nfds, ep[1], lim);
    }
    close(ep[1]);
    close_all(fds, nfds);
    if (pid < 0) {
        char r[128];
        snprintf(r, sizeof r, "init: fork: %s", strerror(errno));
        send_error(ctl, h->id, r);
        close(ep[0]);
        return;
    }
    /* EOF: the exec succeeded (the pipe is close-on-exec); else "E<reason>". */
    char rep[600];
    size_t have = 0;
    uint64_t deadline = now_ms() + SBX_SESS_SPAWN_MS;
    for (;;) {
        int r = wait_readable(ep[0], deadline);
        if (r <= 0) {
            kill(pid, SIGKILL);
            send_error(ctl, h->id, "the worker did not start in time");
            close(ep[0]);
            return;
        }
        ssize_t n = read(ep[0], rep + have, sizeof rep - 1 - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || have + (size_t)n >= sizeof rep - 1) {
            if (n > 0)
                have += (size_t)n;
            break;
        }
        have += (size_t)n;
    }
    close(ep[0]);
    if (have > 1 && rep[0] == 'E') {
        rep[have] = 0;
        send_error(ctl, h->id, rep + 1);
        return; /* the child exits 127 and is reaped as an orphan */
    }
    w[*nw].id = h->id;
    w[*nw].pid = pid;
    (*nw)++;
    sbx_sess_hdr o = {.magic = SBX_SESS_MAGIC, .type = 'O', .id = h->id, .a = pid};
    sbx_sess_send(ctl, &o, NULL, 0, NULL, 0);
}

int sbx_session_init_run(const sandbox_config *cfg, const sbx_limits *lim, int ctl)
{
    static char buf[SBX_SESS_MAX_MSG];
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    /* SIGCHLD is blocked (sbx_init_block_signals); the forwarded signals
     * stay blocked too: in a session nothing is forwarded, workers are
     * signalled from the host through their pidfds. */
    int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        return 127;
    sess_worker w[SBX_SESS_MAX_WORKERS];
    int nw = 0;
    sbx_zygote zyg = SBX_ZYGOTE_NONE;
    for (;;) {
        struct pollfd p[2] = {{ctl, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return 127;
        }
        if (p[1].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si)
                ;
            int st;
            pid_t pid;
            while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
                sbx_zygote_reaped(&zyg, pid);
                for (int i = 0; i < nw; i++) {
                    if (w[i].pid != pid)
                        continue;
                    sbx_sess_hdr x = {.magic = SBX_SESS_MAGIC, .type = 'X', .id = w[i].id, .a = st};
                    sbx_sess_send(ctl, &x, NULL, 0, NULL, 0);
                    w[i] = w[--nw];
                    break;
                }
            }
        }
        if (!p[0].revents)
            continue;
        sbx_sess_hdr h;
        int fds[SBX_SESS_MAX_FDS], nfds = 0;
        ssize_t n = sbx_sess_recv(ctl, &h, buf, sizeof buf, fds, &nfds, SBX_SESS_MAX_FDS);
        if (n == 0)
            return 0; /* the holder is gone: PID 1 ends, and the namespace with it */
        if (n < 0) {
            if (errno == EAGAIN || errno == EBADMSG)
                continue;
            return 0;
        }
        size_t len = (size_t)n - 1;
        if (h.type == 'S') {
            init_spawn(cfg, lim, ctl, sfd, &h, buf, len, fds, nfds, w, &nw, &zyg);
            continue;
        }
        close_all(fds, nfds);
        if (h.type == 'K' && signal_allowed(h.a))
            for (int i = 0; i < nw; i++)
                if (w[i].id == h.id && kill(-w[i].pid, h.a) < 0)
                    kill(w[i].pid, h.a);
    }
}

/* ---- the holder ------------------------------------------------------------ */

/* Signals the process group led by the process of pidfd (host pid pid). */
static int signal_group(int pidfd, pid_t pid, int sig)
{
    if (pidfd < 0)
        return -1;
#ifndef PIDFD_SIGNAL_PROCESS_GROUP
#define SBX_SESS_PIDFD_GROUP (1u << 2)
#else
#define SBX_SESS_PIDFD_GROUP PIDFD_SIGNAL_PROCESS_GROUP
#endif
    if (syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, SBX_SESS_PIDFD_GROUP) == 0)
        return 0;
    if (errno == EINVAL && syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0)
        return kill(-pid, sig);
    return -1;
}

int sbx_session_signal_group(int pidfd, pid_t pid, int sig)
{
    return signal_group(pidfd, pid, sig);
}

static void queue_exit(sandbox *sb, uint32_t id, int status)
{
    if (sb->nevq < SBX_SESS_MAX_WORKERS) {
        sb->evq[sb->nevq].id = id;
        sb->evq[sb->nevq].status = status;
        sb->nevq++;
    }
}

/* Starts a worker in the session sandbox: 0 with its host pid and a pidfd,
 * or -1 with a reason. Exit reports that arrive meanwhile are queued. */
static int holder_spawn(sandbox *sb, uint32_t id, const char *payload, size_t len,
                        const sbx_sess_hdr *req, const int *fds, int nfds, pid_t *pid, int *pidfd,
                        char *err, size_t errlen)
{
    static char buf[4096];
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC,
                      .type = 'S',
                      .id = id,
                      .argc = req->argc,
                      .envc = req->envc,
                      .zargc = req->zargc,
                      .zmax = req->zargc ? req->zmax : 0};
    if (sbx_sess_send(sb->ctl_fd, &h, payload, len, fds, nfds) < 0) {
        sbx_util_fail(err, errlen, "session sandbox: send the request to its init");
        return -1;
    }
    uint64_t deadline = now_ms() + SBX_SESS_SPAWN_MS + 1000 +
                        (h.zargc ? 2 * SBX_ZYG_START_MS + 2 * SBX_ZYG_FORK_MS : 0);
    for (;;) {
        int r = wait_readable(sb->ctl_fd, deadline);
        if (r <= 0) {
            snprintf(err, errlen, "session sandbox: its init did not answer in time");
            return -1;
        }
        sbx_sess_hdr rh;
        int rfds[1], nr = 0;
        ssize_t n = sbx_sess_recv(sb->ctl_fd, &rh, buf, sizeof buf, rfds, &nr, 0);
        if (n == 0) {
            snprintf(err, errlen, "session sandbox: its init is gone");
            return -1;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EBADMSG || errno == EMSGSIZE)
                continue; /* hostile or garbled: dropped */
            sbx_util_fail(err, errlen, "session sandbox: read from its init");
            return -1;
        }
        if (rh.type == 'X') {
            queue_exit(sb, rh.id, rh.a);
            continue;
        }
        if (rh.id != id)
            continue;
        if (rh.type == 'E') {
            char why[SBX_SESS_MAX_REASON + 1];
            take_reason(buf, n - 1, why, sizeof why);
            snprintf(err, errlen, "%s", why[0] ? why : "the worker did not start");
            return -1;
        }
        if (rh.type != 'O')
            continue;
        /* Only a child of init with that pid inside is believed. */
        if (rh.a <= 1 || sbx_find_child(sb->init_pid, rh.a, pid, pidfd) < 0) {
            snprintf(err, errlen, "session sandbox: its init named no worker it started");
            return -1;
        }
        return 0;
    }
}

static int sandbox_session_kill(sandbox *sb, uint32_t id, int sig)
{
    if (!sb || sb->ctl_fd < 0 || !signal_allowed(sig))
        return -1;
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC, .type = 'K', .id = id, .a = sig};
    return sbx_sess_send(sb->ctl_fd, &h, NULL, 0, NULL, 0);
}

typedef struct sess_client {
    int fd;
    uint32_t id; /* its worker's, 0 before it asked */
    pid_t pid;   /* the worker's host pid */
    int pidfd;   /* held for killing its group when the client goes */
    int running; /* the worker has not exited yet */
} sess_client;

static void client_drop(sandbox *sb, sess_client *c)
{
    if (c->running) {
        signal_group(c->pidfd, c->pid, SIGKILL);
        sandbox_session_kill(sb, c->id, SIGKILL);
    }
    if (c->pidfd >= 0)
        close(c->pidfd);
    close(c->fd);
    memset(c, 0, sizeof *c);
    c->fd = c->pidfd = -1;
}

typedef struct sess_state {
    sandbox_config cfg;
    const char *ro[SBX_SESS_MAX_ROC + 64 + 1]; /* the sandbox's read-only paths */
    char *ro_owned[SBX_SESS_MAX_ROC];
    int nro, nowned;
    sandbox *sb;
    uint32_t next_id;
    sandbox_session_hooks hooks; /* the holder's (zeroed: none) */
} sess_state;

/* Every read-only path a request names must already be in the sandbox
 * (its mounts are made once): a system directory, one of its read-only
 * paths or below one, or the workspace. NULL, or the first that is not. */
static const char *ro_missing(const sess_state *st, char *const *ro, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        int ok = st->cfg.workspace && sbx_util_path_under(ro[i], st->cfg.workspace);
        ok = ok || sandbox_is_system_path(ro[i]);
        for (int k = 0; !ok && k < st->nro; k++)
            ok = sbx_util_path_under(ro[i], st->ro[k]);
        if (!ok)
            return ro[i];
    }
    return NULL;
}

/* A query ('R'): the count the holder's refusals hook gives, the last
 * reason as the payload; 'E' when there is no such hook or count. */
static void client_query(const sess_state *st, sess_client *c)
{
    char last[SBX_SESS_MAX_REASON + 1] = "";
    long long n = st->hooks.refusals ? st->hooks.refusals(st->hooks.arg, last, sizeof last) : -1;
    if (n < 0) {
        send_error(c->fd, 0, "this session's sandbox has no egress proxy");
        return;
    }
    for (size_t i = 0; last[i]; i++)
        if (last[i] < 0x20 || last[i] >= 0x7f)
            last[i] = '?';
    sbx_sess_hdr r = {
        .magic = SBX_SESS_MAGIC, .type = 'R', .a = n > INT32_MAX ? INT32_MAX : (int)n};
    sbx_sess_send(c->fd, &r, last, strlen(last) + 1, NULL, 0);
}

/* The sandbox, made at the first request with the read-only paths it
 * names too, and handed to the ready hook. 0, or -1 with a reason. */
static int session_make(sess_state *st, char *const *ro, uint32_t roc, char *err, size_t errlen)
{
    for (uint32_t i = 0; i < roc && st->nowned < SBX_SESS_MAX_ROC; i++) {
        if (ro_missing(st, &ro[i], 1) == NULL)
            continue;
        char *d = strdup(ro[i]);
        if (!d)
            break;
        st->ro_owned[st->nowned++] = d;
        st->ro[st->nro++] = d;
    }
    st->ro[st->nro] = NULL;
    st->cfg.ro_paths = st->ro;
    st->sb = sandbox_session_start(&st->cfg, err, errlen);
    if (!st->sb)
        return -1;
    if (st->hooks.ready && st->hooks.ready(st->hooks.arg, st->sb, err, errlen) < 0) {
        sandbox_destroy(&st->sb);
        return -1;
    }
    return 0;
}

/* One spawn request of client c. */
static void client_request(sess_state *st, sess_client *c, sbx_sess_hdr *h, char *buf, size_t len,
                           int *fds, int nfds)
{
    char err[768];
    char *strs[2 * SBX_SESS_MAX_ARGC + SBX_SESS_MAX_ENVC + SBX_SESS_MAX_ROC + 1];
    if (h->type == 'R' && !c->id) {
        close_all(fds, nfds);
        client_query(st, c);
        return;
    }
    if (h->type != 'S' || c->id) {
        send_error(c->fd, 0, h->type != 'S' ? "unknown request" : "one worker per connection");
        close_all(fds, nfds);
        return;
    }
    if (h->argc < 1 || h->argc > SBX_SESS_MAX_ARGC || h->envc > SBX_SESS_MAX_ENVC ||
        h->roc > SBX_SESS_MAX_ROC || h->zargc > SBX_SESS_MAX_ARGC ||
        (h->zargc && (h->zmax < 1 || h->zmax > SBX_ZYG_MAX_FORKS)) ||
        sbx_sess_split(buf, len, h->argc + h->envc + h->zargc + h->roc, strs) ||
        strs[0][0] != '/' || (h->zargc && strs[h->argc + h->envc][0] != '/')) {
        send_error(c->fd, 0, "malformed spawn request");
        close_all(fds, nfds);
        return;
    }
    for (uint32_t i = 0; i < h->envc; i++)
        if (!strchr(strs[h->argc + i], '=')) {
            send_error(c->fd, 0, "malformed spawn request: an environment entry without '='");
            close_all(fds, nfds);
            return;
        }
    char **ro = strs + h->argc + h->envc + h->zargc;
    for (uint32_t i = 0; i < h->roc; i++)
        if (ro[i][0] != '/') {
            send_error(c->fd, 0, "malformed spawn request: a read-only path is not absolute");
            close_all(fds, nfds);
            return;
        }
    if (!st->sb && session_make(st, ro, h->roc, err, sizeof err) < 0) {
        /* the first worker's request makes the sandbox */
        send_error(c->fd, 0, err);
        close_all(fds, nfds);
        return;
    }
    const char *miss = ro_missing(st, ro, h->roc);
    if (miss) {
        snprintf(err, sizeof err,
                 "this session's sandbox was made without %s, which this kernel needs "
                 "(restart the session to make it anew)",
                 miss);
        send_error(c->fd, 0, err);
        close_all(fds, nfds);
        return;
    }
    uint32_t id = ++st->next_id;
    if (id == 0)
        id = ++st->next_id;
    size_t sent_len = 0;
    for (uint32_t i = 0; i < h->argc + h->envc + h->zargc; i++)
        sent_len += strlen(strs[i]) + 1;
    pid_t pid = 0;
    int pidfd = -1;
    int rc = holder_spawn(st->sb, id, buf, sent_len, h, fds, nfds, &pid, &pidfd, err, sizeof err);
    close_all(fds, nfds);
    if (rc < 0) {
        send_error(c->fd, 0, err);
        return;
    }
    c->id = id;
    c->pid = pid;
    c->pidfd = pidfd;
    c->running = 1;
    sbx_sess_hdr o = {.magic = SBX_SESS_MAGIC, .type = 'O', .a = pid};
    if (sbx_sess_send(c->fd, &o, NULL, 0, &pidfd, 1) < 0)
        client_drop(st->sb, c);
}

static void deliver_exit(sess_client *cl, int n, uint32_t id, int status)
{
    for (int i = 0; i < n; i++) {
        if (cl[i].fd < 0 || cl[i].id != id || !cl[i].running)
            continue;
        cl[i].running = 0;
        sbx_sess_hdr x = {.magic = SBX_SESS_MAGIC, .type = 'X', .a = status};
        sbx_sess_send(cl[i].fd, &x, NULL, 0, NULL, 0);
        return;
    }
}

int sandbox_session_serve(const sandbox_config *cfg, int listen_fd, int owner_fd, char *err,
                          size_t errlen)
{
    return sandbox_session_serve_with(cfg, listen_fd, owner_fd, NULL, err, errlen);
}

int sandbox_session_serve_with(const sandbox_config *cfg, int listen_fd, int owner_fd,
                               const sandbox_session_hooks *hooks, char *err, size_t errlen)
{
    static char buf[SBX_SESS_MAX_MSG];
    static sess_state st;
    memset(&st, 0, sizeof st);
    if (hooks)
        st.hooks = *hooks;
    st.cfg = *cfg;
    st.cfg.session_socket = NULL;
    for (const char *const *r = cfg->ro_paths; r && *r && st.nro < 64; r++)
        st.ro[st.nro++] = *r;
    st.ro[st.nro] = NULL;
    err[0] = 0;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        sbx_util_fail(err, errlen, "signalfd");
        return -1;
    }
    sess_client cl[SBX_SESS_MAX_CLIENTS];
    for (int i = 0; i < SBX_SESS_MAX_CLIENTS; i++) {
        memset(&cl[i], 0, sizeof cl[i]);
        cl[i].fd = cl[i].pidfd = -1;
    }
    int rc = 0;
    for (;;) {
        struct pollfd p[4 + SBX_SESS_MAX_CLIENTS];
        int n = 0, i_owner = -1, i_ctl = -1;
        p[n++] = (struct pollfd){sfd, POLLIN, 0};
        p[n++] = (struct pollfd){listen_fd, POLLIN, 0};
        if (owner_fd >= 0) {
            i_owner = n;
            p[n++] = (struct pollfd){owner_fd, POLLIN, 0};
        }
        if (st.sb) {
            i_ctl = n;
            p[n++] = (struct pollfd){st.sb->ctl_fd, POLLIN, 0};
        }
        int first_client = n;
        for (int i = 0; i < SBX_SESS_MAX_CLIENTS; i++)
            p[n++] = (struct pollfd){cl[i].fd, POLLIN, 0}; /* -1: ignored */
        if (poll(p, (nfds_t)n, -1) < 0) {
            if (errno == EINTR)
                continue;
            sbx_util_fail(err, errlen, "poll");
            rc = -1;
            break;
        }
        if (p[0].revents)
            break;
        if (i_owner >= 0 && p[i_owner].revents)
            break;
        if (i_ctl >= 0 && p[i_ctl].revents) {
            for (int k = 0; k < 64; k++) {
                sbx_sess_hdr h;
                int f[1], nf = 0;
                ssize_t r = sbx_sess_recv(st.sb->ctl_fd, &h, buf, 4096, f, &nf, 0);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EBADMSG)) {
                    snprintf(err, errlen, "the session's sandbox ended (its init is gone)");
                    rc = -1;
                    goto out;
                }
                if (r < 0 && errno == EAGAIN)
                    break;
                if (r > 0 && h.type == 'X')
                    deliver_exit(cl, SBX_SESS_MAX_CLIENTS, h.id, h.a);
            }
        }
        if (p[1].revents & POLLIN) {
            int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (fd >= 0) {
                struct ucred uc;
                socklen_t ul = sizeof uc;
                int slot = -1;
                for (int i = 0; i < SBX_SESS_MAX_CLIENTS && slot < 0; i++)
                    if (cl[i].fd < 0)
                        slot = i;
                /* Only this user's processes (the socket's directory is
                 * private too): another user is never served. */
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) < 0 || uc.uid != geteuid()) {
                    close(fd);
                } else if (slot < 0) {
                    char r[96];
                    snprintf(r, sizeof r, "too many kernels in this session (limit %d)",
                             SBX_SESS_MAX_CLIENTS);
                    send_error(fd, 0, r);
                    close(fd);
                } else {
                    int big = (int)SBX_SESS_MAX_MSG + 4096;
                    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
                    cl[slot].fd = fd;
                }
            }
        }
        for (int i = 0; i < SBX_SESS_MAX_CLIENTS; i++) {
            if (cl[i].fd < 0 || !p[first_client + i].revents)
                continue;
            sbx_sess_hdr h;
            int fds[SBX_SESS_MAX_FDS], nfds = 0;
            ssize_t r = sbx_sess_recv(cl[i].fd, &h, buf, sizeof buf, fds, &nfds, SBX_SESS_MAX_FDS);
            if (r < 0 && errno == EAGAIN)
                continue;
            if (r < 0 && errno == EBADMSG) {
                send_error(cl[i].fd, 0, "malformed request (too large, too many fds, or garbled)");
                continue;
            }
            if (r <= 0) {
                client_drop(st.sb, &cl[i]);
                continue;
            }
            client_request(&st, &cl[i], &h, buf, (size_t)r - 1, fds, nfds);
        }
        /* exit reports that arrived while a spawn waited */
        if (st.sb)
            for (int k = 0; k < st.sb->nevq; k++)
                deliver_exit(cl, SBX_SESS_MAX_CLIENTS, st.sb->evq[k].id, st.sb->evq[k].status);
        if (st.sb)
            st.sb->nevq = 0;
    }
out:
    for (int i = 0; i < SBX_SESS_MAX_CLIENTS; i++)
        if (cl[i].fd >= 0)
            client_drop(st.sb, &cl[i]);
    sandbox_destroy(&st.sb);
    for (int i = 0; i < st.nowned; i++)
        free(st.ro_owned[i]);
    close(sfd);
    return rc;
}

/* ---- a kernel server joining ---------------------------------------------- */

static int connect_holder(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a.sun_path) {
        snprintf(err, errlen, "session sandbox socket path too long: %s", path);
        return -1;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    uint64_t deadline = now_ms() + SBX_SESS_CONNECT_MS;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            sbx_util_fail(err, errlen, "socket");
            return -1;
        }
        if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
            return fd;
        int e = errno;
        close(fd);
        /* The holder was just started: its socket appears in a moment. */
        if ((e != ENOENT && e != ECONNREFUSED && e != EAGAIN) || now_ms() >= deadline) {
            errno = e;
            sbx_util_fail(err, errlen, "session sandbox: connect to %s", path);
            return -1;
        }
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
}

/* The pid a pidfd refers to, from /proc/self/fdinfo; -1 when fd is none. */
static pid_t pidfd_pid(int fd)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/fdinfo/%d", fd);
    int f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        return -1;
    ssize_t n = read(f, buf, sizeof buf - 1);
    close(f);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    const char *p = strstr(buf, "\nPid:");
    return p ? (pid_t)atoi(p + 5) : -1;
}

sandbox *sbx_session_join(const sandbox_config *cfg, char *const argv[], char *const envp[],
                          const int *fds, int nfds, char *err, size_t errlen)
{
    uint32_t argc = 0, envc = 0, roc = 0, zargc = 0;
    size_t len = 0;
    while (argv[argc])
        len += strlen(argv[argc++]) + 1;
    while (envp && envp[envc])
        len += strlen(envp[envc++]) + 1;
    while (cfg->zygote_forks && cfg->zygote_argv && cfg->zygote_argv[zargc])
        len += strlen(cfg->zygote_argv[zargc++]) + 1;
    while (cfg->ro_paths && cfg->ro_paths[roc])
        len += strlen(cfg->ro_paths[roc++]) + 1;
    if (argc > SBX_SESS_MAX_ARGC || envc > SBX_SESS_MAX_ENVC || roc > SBX_SESS_MAX_ROC ||
        zargc > SBX_SESS_MAX_ARGC || len + sizeof(sbx_sess_hdr) > SBX_SESS_MAX_MSG) {
        snprintf(err, errlen,
                 "the worker's command and environment are too large for a session sandbox "
                 "(limit %u KiB, %d arguments, %d variables)",
                 SBX_SESS_MAX_MSG >> 10, SBX_SESS_MAX_ARGC, SBX_SESS_MAX_ENVC);
        return NULL;
    }
    char *payload = malloc(len ? len : 1);
    if (!payload) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    size_t off = 0;
    for (uint32_t i = 0; i < argc; i++) {
        memcpy(payload + off, argv[i], strlen(argv[i]) + 1);
        off += strlen(argv[i]) + 1;
    }
    for (uint32_t i = 0; i < envc; i++) {
        memcpy(payload + off, envp[i], strlen(envp[i]) + 1);
        off += strlen(envp[i]) + 1;
    }
    for (uint32_t i = 0; i < zargc; i++) {
        memcpy(payload + off, cfg->zygote_argv[i], strlen(cfg->zygote_argv[i]) + 1);
        off += strlen(cfg->zygote_argv[i]) + 1;
    }
    for (uint32_t i = 0; i < roc; i++) {
        memcpy(payload + off, cfg->ro_paths[i], strlen(cfg->ro_paths[i]) + 1);
        off += strlen(cfg->ro_paths[i]) + 1;
    }
    int fd = connect_holder(cfg->session_socket, err, errlen);
    if (fd < 0) {
        free(payload);
        return NULL;
    }
    int big = (int)SBX_SESS_MAX_MSG + 4096;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    unsigned zmax = cfg->zygote_forks < SBX_ZYG_MAX_FORKS ? cfg->zygote_forks : SBX_ZYG_MAX_FORKS;
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC,
                      .type = 'S',
                      .argc = argc,
                      .envc = envc,
                      .roc = roc,
                      .a = nfds,
                      .zargc = zargc,
                      .zmax = zargc ? zmax : 0};
    int sent = sbx_sess_send(fd, &h, payload, len, fds, nfds);
    explicit_bzero(payload, len);
    free(payload);
    if (sent < 0) {
        sbx_util_fail(err, errlen, "session sandbox: send the request");
        close(fd);
        return NULL;
    }
    char buf[SBX_SESS_MAX_REASON + 64];
    sbx_sess_hdr r;
    int rfd[1] = {-1}, nr = 0;
    ssize_t n = -1;
    uint64_t deadline = now_ms() + SBX_SESS_JOIN_MS;
    for (;;) {
        int w = wait_readable(fd, deadline);
        if (w <= 0) {
            snprintf(err, errlen, "session sandbox: no answer from the session's holder");
            close(fd);
            return NULL;
        }
        n = sbx_sess_recv(fd, &r, buf, sizeof buf - 1, rfd, &nr, 1);
        if (n < 0 && errno == EAGAIN)
            continue;
        break;
    }
    if (n <= 0 || r.type != 'O' || nr != 1 || r.a <= 1 || pidfd_pid(rfd[0]) != r.a) {
        if (n > 0 && r.type == 'E') {
            char why[SBX_SESS_MAX_REASON + 1];
            take_reason(buf, n - 1, why, sizeof why);
            snprintf(err, errlen, "session sandbox: %s", why);
        } else {
            snprintf(err, errlen, "session sandbox: no valid answer from the session's holder");
        }
        if (nr == 1)
            close(rfd[0]);
        close(fd);
        return NULL;
    }
    sandbox *sb = sbx_sandbox_alloc(cfg, err, errlen);
    if (!sb) {
        close(rfd[0]);
        close(fd);
        return NULL;
    }
    sb->cfg.session_socket = NULL; /* the caller's string: not kept */
    sb->cfg.ro_paths = NULL;
    sb->cfg.zygote_argv = NULL;
    sb->joined = 1;
    sb->join_fd = fd;
    sb->pid = sb->worker_pid = r.a;
    sb->worker_pidfd = rfd[0];
    sb->lim = sbx_limits_view(r.a, cfg);
    sb->oom_base = sbx_limits_oom_kills(sb->lim);
    if (!cfg->network && sbx_net_open_counters(r.a, sb->net_fds) == 0 &&
        syscall(SYS_pidfd_send_signal, sb->worker_pidfd, 0, NULL, 0) < 0) {
        for (int i = 0; i < 2; i++)
            if (sb->net_fds[i] >= 0)
                close(sb->net_fds[i]);
        sb->net_fds[0] = sb->net_fds[1] = -1;
    }
    return sb;
}

int sbx_session_reap(sandbox *sb, int *status)
{
    if (sb->join_exited) {
        *status = sb->join_status;
        return 1;
    }
    char buf[64];
    for (;;) {
        sbx_sess_hdr h;
        int f[1], nf = 0;
        ssize_t n = sbx_sess_recv(sb->join_fd, &h, buf, sizeof buf, f, &nf, 0);
        if (n < 0 && (errno == EAGAIN || errno == EBADMSG)) {
            if (errno == EAGAIN)
                return 0;
            continue;
        }
        if (n > 0 && h.type != 'X')
            continue;
        if (n > 0) {
            sb->join_status = h.a;
        } else {
            /* The holder is gone, and the sandbox with it. */
            signal_group(sb->worker_pidfd, sb->worker_pid, SIGKILL);
            sb->join_status = SIGKILL; /* wait status: killed by SIGKILL */
        }
        sb->join_exited = 1;
        *status = sb->join_status;
        return 1;
    }
}

long long sandbox_session_egress_refusals(const char *socket_path, char *last, size_t lastlen)
{
    char err[256];
    if (last && lastlen)
        last[0] = 0;
    int fd = socket_path ? connect_holder(socket_path, err, sizeof err) : -1;
    if (fd < 0)
        return -1;
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC, .type = 'R'};
    long long n = -1;
    if (sbx_sess_send(fd, &h, NULL, 0, NULL, 0) == 0) {
        char buf[SBX_SESS_MAX_REASON + 2];
        uint64_t deadline = now_ms() + SBX_SESS_QUERY_MS;
        for (;;) {
            if (wait_readable(fd, deadline) <= 0)
                break;
            sbx_sess_hdr r;
            int f[1], nf = 0;
            ssize_t k = sbx_sess_recv(fd, &r, buf, sizeof buf - 1, f, &nf, 0);
            if (k < 0 && errno == EAGAIN)
                continue;
            if (k > 0 && r.type == 'R' && r.a >= 0) {
                n = r.a;
                if (last && lastlen)
                    take_reason(buf, k, last, lastlen);
            }
            break;
        }
    }
    close(fd);
    return n;
}
