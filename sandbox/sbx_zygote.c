/*
 * sbx_zygote.c — a session sandbox's zygote: a pre-initialized worker
 * (kernels/python/kzygote.py: CPython, site and the driver loaded) that
 * forks the session's workers instead of init exec'ing each one cold.
 *
 *   init (PID 1) ── socketpair (SEQPACKET) ──▶ zygote ── fork, fork ▶ worker
 *                                                 (the worker is re-parented
 *                                                  to init, which reaps it)
 *
 * Init starts the zygote as it starts any worker (sbx_worker_exec: the same
 * namespaces, mounts, cgroup, Landlock, seccomp, rlimits, no capabilities,
 * no_new_privs: it is inside the session's sandbox, with the sandbox's
 * rights and nothing more), with fds 0-2 on /dev/null, its end of the
 * socketpair on fd 3, and only the start-up part of the first worker's
 * environment (keep_env()). It answers 'R' once ready. For a worker, init
 * sends 'F': the worker's whole environment and its fds by SCM_RIGHTS; the
 * zygote forks a child that forks the worker and exits, so the worker's
 * parent is init, and answers 'O' with the worker's pid (or 'E' with a
 * reason, or 'Z': its files changed, replace it). Init believes that pid
 * only for a child of its own (waitid WNOWAIT), reports the worker's exit
 * as for any worker, and the holder resolves the pid among init's children
 * as always.
 *
 * Trust: the zygote belongs to one session and never runs user code, but
 * the session's code can reach it (same uid, same pid namespace), so it is
 * treated as that code: its messages are bounded and checked, anything odd
 * ends it and the worker starts cold. A session that subverts its zygote
 * gains its own later workers, which it could reach anyway. One zygote
 * serves workers with one command and start-up environment; it is replaced
 * after zmax forks (the forks share its memory layout, ASLR included) and
 * when its command, environment or the files it was made from change.
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t zyg_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The part of a worker's environment that shapes an interpreter's start
 * (and so must be the same for every worker a zygote forks). */
static int keep_env(const char *e)
{
    /* KERNELMGR_IPYTHON: with it the zygote's preload() imports IPython */
    static const char *const exact[] = {"PATH",
                                        "HOME",
                                        "LANG",
                                        "TZ",
                                        "TERM",
                                        "TMPDIR",
                                        "VIRTUAL_ENV",
                                        "LD_LIBRARY_PATH",
                                        "KERNELMGR_IPYTHON",
                                        NULL};
    static const char *const prefix[] = {"LC_", "PYTHON", "KERNELMGR_ZYGOTE_", NULL};
    const char *eq = strchr(e, '=');
    if (!eq)
        return 0;
    size_t n = (size_t)(eq - e);
    for (const char *const *x = exact; *x; x++)
        if (strlen(*x) == n && !strncmp(e, *x, n))
            return 1;
    for (const char *const *x = prefix; *x; x++)
        if (!strncmp(e, *x, strlen(*x)))
            return 1;
    return 0;
}

/* The key of zargv and envp: the command, a NUL, then the kept
 * environment. new, or NULL on OOM. */
static char *make_key(char *const zargv[], char *const envp[], size_t *len)
{
    size_t n = 0;
    for (int i = 0; zargv[i]; i++)
        n += strlen(zargv[i]) + 1;
    n++;
    for (int i = 0; envp && envp[i]; i++)
        if (keep_env(envp[i]))
            n += strlen(envp[i]) + 1;
    char *k = malloc(n);
    if (!k)
        return NULL;
    size_t off = 0;
    for (int i = 0; zargv[i]; i++) {
        memcpy(k + off, zargv[i], strlen(zargv[i]) + 1);
        off += strlen(zargv[i]) + 1;
    }
    k[off++] = 0;
    for (int i = 0; envp && envp[i]; i++)
        if (keep_env(envp[i])) {
            memcpy(k + off, envp[i], strlen(envp[i]) + 1);
            off += strlen(envp[i]) + 1;
        }
    *len = off;
    return k;
}

static void zyg_stop(sbx_zygote *z)
{
    if (z->fd >= 0)
        close(z->fd);
    if (z->pid > 0)
        kill(z->pid, SIGKILL); /* reaped by init's loop as an unknown child */
    free(z->key);
    z->pid = 0;
    z->fd = -1;
    z->forks = 0;
    z->key = NULL;
    z->keylen = 0;
}

void sbx_zygote_reaped(sbx_zygote *z, pid_t pid)
{
    if (z->pid > 0 && pid == z->pid) {
        z->pid = 0; /* already reaped: no kill of a reused pid */
        zyg_stop(z);
    }
}

/* Waits for one message from the zygote until deadline: its payload
 * length + 1 (sbx_sess_recv), 0 at end-of-file, -1 on error or timeout. */
static ssize_t zyg_recv(int fd, sbx_sess_hdr *h, char *buf, size_t cap, uint64_t deadline)
{
    for (;;) {
        uint64_t now = zyg_now_ms();
        if (now >= deadline)
            return -1;
        struct pollfd p = {fd, POLLIN, 0};
        int rc = poll(&p, 1, (int)(deadline - now));
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0)
            return -1;
        int f[1], nf = 0;
        ssize_t n = sbx_sess_recv(fd, h, buf, cap, f, &nf, 0);
        if (n < 0 && errno == EAGAIN)
            continue;
        return n;
    }
}

/* Starts the zygote for key (zargv, envp): 0, or -1 with a reason. */
static int zyg_start(sbx_zygote *z, const sandbox_config *cfg, const sbx_limits *lim, int ctl,
                     int sfd, char *const zargv[], char *const envp[], char *key, size_t keylen,
                     char *err, size_t errlen)
{
    char *zenv[SBX_SESS_MAX_ENVC + 1];
    int ne = 0;
    for (int i = 0; envp && envp[i] && ne < SBX_SESS_MAX_ENVC; i++)
        if (keep_env(envp[i]))
            zenv[ne++] = envp[i];
    zenv[ne] = NULL;
    int sv[2] = {-1, -1}, ep[2] = {-1, -1};
    int dn = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (dn < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
        pipe2(ep, O_CLOEXEC) < 0) {
        sbx_util_fail(err, errlen, "zygote: make its socket");
        goto fail;
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(ep[0]);
        close(sv[0]);
        close(ctl);
        close(sfd);
        int f[4] = {dn, dn, dn, sv[1]};
        sbx_worker_exec(cfg, zargv, zenv, f, 4, ep[1], lim);
    }
    if (pid < 0) {
        sbx_util_fail(err, errlen, "zygote: fork");
        goto fail;
    }
    close(sv[1]);
    close(ep[1]);
    close(dn);
    sv[1] = ep[1] = dn = -1;
    z->pid = pid;
    z->fd = sv[0];
    z->forks = 0;
    z->key = key;
    z->keylen = keylen;
    sbx_sess_hdr h;
    char buf[SBX_SESS_MAX_REASON + 8];
    ssize_t n = zyg_recv(z->fd, &h, buf, sizeof buf, zyg_now_ms() + SBX_ZYG_START_MS);
    if (n > 0 && h.type == 'R') {
        close(ep[0]);
        return 0;
    }
    /* the exec's own failure, when that was it ("E<reason>") */
    char rep[256];
    ssize_t k = read(ep[0], rep, sizeof rep - 1);
    close(ep[0]);
    if (k > 1 && rep[0] == 'E') {
        rep[k] = 0;
        for (ssize_t i = 1; i < k; i++)
            if (rep[i] < 0x20 || rep[i] >= 0x7f)
                rep[i] = '?';
        snprintf(err, errlen, "zygote: %s", rep + 1);
    } else {
        snprintf(err, errlen, "zygote: %s",
                 n > 0    ? "no ready message"
                 : n == 0 ? "it exited before it was ready"
                          : "not ready in time");
    }
    z->key = NULL; /* the caller's, freed by it */
    zyg_stop(z);
    return -1;
fail:
    for (int i = 0; i < 2; i++) {
        if (sv[i] >= 0)
            close(sv[i]);
        if (ep[i] >= 0)
            close(ep[i]);
    }
    if (dn >= 0)
        close(dn);
    return -1;
}

/* One fork by a running zygote: 1 with *pid, 0 when it must be replaced
 * (it asked, 'Z', or it is gone: killed by the session's code, say), -1
 * with a reason (it is then stopped). */
static int zyg_fork(sbx_zygote *z, char *const envp[], const int *fds, int nfds, pid_t *pid,
                    char *err, size_t errlen)
{
    static char payload[SBX_SESS_MAX_MSG];
    size_t len = 0;
    uint32_t envc = 0;
    for (; envp && envp[envc]; envc++) {
        size_t l = strlen(envp[envc]) + 1;
        if (envc >= SBX_SESS_MAX_ENVC || len + l + sizeof(sbx_sess_hdr) > SBX_SESS_MAX_MSG) {
            snprintf(err, errlen, "zygote: the environment is too large");
            return -1;
        }
        memcpy(payload + len, envp[envc], l);
        len += l;
    }
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC, .type = 'F', .envc = envc, .a = nfds};
    int sent = sbx_sess_send(z->fd, &h, payload, len, fds, nfds);
    explicit_bzero(payload, len);
    if (sent < 0)
        return 0;
    sbx_sess_hdr r;
    char buf[SBX_SESS_MAX_REASON + 8];
    ssize_t n = zyg_recv(z->fd, &r, buf, sizeof buf, zyg_now_ms() + SBX_ZYG_FORK_MS);
    if (n == 0 || (n > 0 && r.type == 'Z'))
        return 0;
    if (n > 0 && r.type == 'O' && r.a > 1 && r.a != z->pid) {
        /* Believed only for a child of init (alive, or a zombie not yet
         * reaped: init's loop reports its exit). */
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)r.a, &si, WEXITED | WNOHANG | WNOWAIT) == 0) {
            z->forks++;
            *pid = r.a;
            return 1;
        }
        snprintf(err, errlen, "zygote: it named no child of init");
    } else if (n > 0 && r.type == 'E') {
        size_t k = 0;
        char why[SBX_SESS_MAX_REASON + 1];
        for (ssize_t i = 0; i + 1 < n && buf[i] && k < SBX_SESS_MAX_REASON; i++)
            why[k++] = buf[i] >= 0x20 && buf[i] < 0x7f ? buf[i] : '?';
        why[k] = 0;
        snprintf(err, errlen, "zygote: %s", why);
    } else {
        snprintf(err, errlen, "zygote: %s", n > 0 ? "an unexpected answer" : "no answer in time");
    }
    zyg_stop(z);
    return -1;
}

int sbx_zygote_spawn(sbx_zygote *z, const sandbox_config *cfg, const sbx_limits *lim, int ctl,
                     int sfd, char *const zargv[], char *const envp[], const int *fds, int nfds,
                     unsigned zmax, pid_t *pid, char *err, size_t errlen)
{
    if (!zargv[0] || zargv[0][0] != '/' || zmax == 0 || zmax > SBX_ZYG_MAX_FORKS) {
        snprintf(err, errlen, "zygote: malformed request");
        return -1;
    }
    /* The first: cold, no zygote (it would make that start slower and
     * cost the session its memory); one is started for the next. */
    if (z->asked++ == 0) {
        snprintf(err, errlen, "zygote: the session's first such worker starts cold");
        return -1;
    }
    size_t keylen = 0;
    char *key = make_key(zargv, envp, &keylen);
    if (!key) {
        snprintf(err, errlen, "zygote: out of memory");
        return -1;
    }
    if (z->pid > 0 && (z->forks >= zmax || z->keylen != keylen || memcmp(z->key, key, keylen)))
        zyg_stop(z);
    for (int attempt = 0; attempt < 2; attempt++) {
        if (z->pid <= 0) {
            if (zyg_start(z, cfg, lim, ctl, sfd, zargv, envp, key, keylen, err, errlen) < 0) {
                free(key);
                return -1;
            }
            key = NULL; /* the zygote's now */
        }
        int r = zyg_fork(z, envp, fds, nfds, pid, err, errlen);
        if (r != 0) {
            free(key);
            return r > 0 ? 0 : -1;
        }
        /* its files changed since it started, or it is gone: a fresh
         * one, once */
        if (!key) {
            key = z->key;
            z->key = NULL;
        }
        zyg_stop(z);
    }
    free(key);
    snprintf(err, errlen, "zygote: a fresh one failed too");
    return -1;
}
