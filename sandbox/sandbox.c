/*
 * sandbox.c — sandbox_spawn() and the object that tracks a running sandbox.
 * Level "none" is implemented here (fork/exec with the fd plan, setsid,
 * PDEATHSIG, rlimits); level "strict" is assembled from the per-concern files
 * of this directory, as one readable sequence of steps:
 *
 *   caller ── fork ──▶ monitor          host pid namespace; what the caller
 *                        │                waits for; re-creates the worker's
 *                        │                exit status; forwards signals;
 *                        │                idmaps the workspace (caller root)
 *                        ├─ clone(new user, mount, pid, net, ipc, uts, cgroup)
 *                        │     ▶ init   PID 1 inside: clones the host paths
 *                        │                it needs, waits for "go", becomes
 *                        │                the sandbox uid, builds the root,
 *                        │                Landlock, drops caps, seccomp,
 *                        │                waits for "cgroups done"
 *                        │                  └─ fork ▶ worker: setsid, fds,
 *                        │                            rlimits, exec
 *                        └─ (monitor meanwhile: uid/gid maps, slirp4netns,
 *                            "go", then the cgroup attach — on cgroup v1 it
 *                            waits for an RCU grace period, ~10 ms, which
 *                            now overlaps with init building the root —
 *                            then "cgroups done")
 *
 * When the sandbox ends, the monitor writes the CPU time of init and every
 * process init reaped (wait4's rusage) on a stats pipe, so that
 * sandbox_cpu_ns() stays readable without cgroups.
 *
 * With a loopback listener, init creates it in the new network namespace
 * (right after lo is up, before any restriction) and sends it over a unix
 * socket pair (SCM_RIGHTS) straight to the caller of sandbox_spawn().
 *
 * Setup errors travel back on a report pipe that every stage holds with
 * O_CLOEXEC: sandbox_spawn() returns once it reaches EOF, i.e. when the
 * worker's exec succeeded, or with the first stage's reason.
 */
#include "sandbox/sandbox.h"
#include "sandbox/sbx_internal.h"

#include <grp.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* <linux/pidfd.h> of Linux >= 6.9; older headers lack it. */
#ifndef PIDFD_SIGNAL_PROCESS_GROUP
#define SBX_PIDFD_SIGNAL_PROCESS_GROUP (1u << 2)
#else
#define SBX_PIDFD_SIGNAL_PROCESS_GROUP PIDFD_SIGNAL_PROCESS_GROUP
#endif

void sandbox_config_defaults(sandbox_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->level = SANDBOX_STRICT;
    cfg->memory_bytes = 2ull << 30;
    cfg->tmp_bytes = 512ull << 20;
    cfg->max_procs = 256;
    cfg->max_open_files = 1024;
    cfg->max_file_bytes = 1ull << 30;
    cfg->max_inotify_instances = 16;
    cfg->max_inotify_watches = 8192;
    cfg->max_sigpending = 1024;
    cfg->max_msgqueue_bytes = 128ull << 10;
    cfg->max_memlock_bytes = 1ull << 20;
}

/* In the child: moves fds[i] to i for every i, closes everything else. Uses
 * a temporary high range first so that fds[i] == j for j < i is handled. */
static int child_setup_fds(const int *fds, int nfds)
{
    int tmp[16];
    if (nfds > 16)
        return -1;
    for (int i = 0; i < nfds; i++) {
        tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100);
        if (tmp[i] < 0)
            return -1;
    }
    for (int i = 0; i < nfds; i++)
        if (dup2(tmp[i], i) < 0)
            return -1;
    /* close_range(nfds, ~0U, 0): every inherited fd, libzmq's included. */
    if (syscall(SYS_close_range, (unsigned)nfds, ~0U, 0) < 0) {
        for (int fd = nfds; fd < 65536; fd++)
            close(fd);
    }
    return 0;
}

static void child_rlimits(const sandbox_config *cfg)
{
    struct rlimit r;
    r.rlim_cur = r.rlim_max = 0;
    setrlimit(RLIMIT_CORE, &r);
    if (cfg->max_open_files) {
        r.rlim_cur = r.rlim_max = cfg->max_open_files;
        setrlimit(RLIMIT_NOFILE, &r);
    }
    if (cfg->max_file_bytes) {
        r.rlim_cur = r.rlim_max = cfg->max_file_bytes;
        setrlimit(RLIMIT_FSIZE, &r);
    }
}

/* new: a sandbox object with no process yet and every fd marked absent, or
 * NULL (out of memory, said in err). */
sandbox *sbx_sandbox_alloc(const sandbox_config *cfg, char *err, size_t errlen)
{
    sandbox *sb = calloc(1, sizeof *sb);
    if (!sb) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sb->cfg = *cfg;
    sb->init_pidfd = -1;
    sb->worker_pidfd = -1;
    sb->listen_fd = -1;
    sb->stats_fd = -1;
    sb->net_fds[0] = sb->net_fds[1] = -1;
    sb->ctl_fd = -1;
    sb->join_fd = -1;
    sb->oom_base = -1;
    return sb;
}

static sandbox *spawn_none(const sandbox_config *cfg, char *const argv[], char *const envp[],
                           const int *fds, int nfds, char *err, size_t errlen)
{
    sandbox *sb = sbx_sandbox_alloc(cfg, err, errlen);
    if (!sb)
        return NULL;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        free(sb);
        return NULL;
    }
    if (pid == 0) {
        /* New session and process group: interrupts go to the whole group and
         * the worker has no controlling terminal. */
        setsid();
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int s = 1; s < NSIG; s++)
            if (s != SIGKILL && s != SIGSTOP)
                signal(s, SIG_DFL);
        if (child_setup_fds(fds, nfds) < 0)
            _exit(127);
        child_rlimits(cfg);
        if (cfg->workspace && chdir(cfg->workspace) < 0) {
            dprintf(2, "sandbox: chdir %s: %s\n", cfg->workspace, strerror(errno));
            _exit(127);
        }
        execve(argv[0], argv, envp);
        dprintf(2, "sandbox: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    sb->pid = pid;
    return sb;
}

/* ---- strict ------------------------------------------------------------- */

/* Sends one report message (NUL-terminated) on the report pipe: "P<pid>"
 * from the monitor (init's host pid), "W<pid>" from init (the worker's pid
 * inside the sandbox), "E<reason>" from whichever stage failed. */
static void report(int fd, char kind, const char *text)
{
    char buf[600];
    int n = snprintf(buf, sizeof buf, "%c%s", kind, text);
    if (n < 0)
        return;
    if (n >= (int)sizeof buf)
        n = sizeof buf - 1;
    ssize_t w = write(fd, buf, (size_t)n + 1);
    (void)w;
}

static void reset_signals(void)
{
    sigset_t none;
    sigemptyset(&none);
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP)
            signal(s, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The worker: last steps before exec. Runs with no capabilities, under
 * seccomp and Landlock already. */
void sbx_worker_exec(const sandbox_config *cfg, char *const argv[], char *const envp[],
                     const int *fds, int nfds, int rep, const sbx_limits *lim)
{
    char err[512];
    setsid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    reset_signals();
    /* Keep the report pipe (CLOEXEC) above the worker's fd range. */
    rep = fcntl(rep, F_DUPFD_CLOEXEC, 100 + nfds);
    int tmp[16];
    for (int i = 0; i < nfds; i++)
        if ((tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100)) < 0)
            goto fail_fds;
    for (int i = 0; i < nfds; i++)
        if (dup2(tmp[i], i) < 0)
            goto fail_fds;
    int keep[18];
    int nkeep = 0;
    for (int i = 0; i < nfds; i++)
        keep[nkeep++] = i;
    keep[nkeep++] = rep;
    sbx_util_close_except(keep, nkeep);
    if (sbx_limits_apply_rlimits(cfg, lim, err, sizeof err) < 0) {
        report(rep, 'E', err);
        _exit(127);
    }
    execve(argv[0], argv, envp);
    sbx_util_fail(err, sizeof err, "exec %s", argv[0]);
    report(rep, 'E', err);
    _exit(127);
fail_fds:
    sbx_util_fail(err, sizeof err, "worker: set up fds");
    report(rep, 'E', err);
    _exit(127);
}

/* PID 1 of the new namespaces. */
/* The host's addresses, collected before the namespaces exist (network on). */
typedef struct host_addrs {
    uint32_t a[SBX_NET_MAX_HOST_ADDRS];
    int n;
} host_addrs;

/* The pipes between the monitor and init. */
typedef struct init_pipes {
    int go;       /* read: "g" once the maps (and slirp4netns) exist */
    int cgroups;  /* read: "c" once init is in the sandbox's cgroups */
    int status_w; /* write: the worker's wait status */
    int ws_fd;    /* the monitor's idmapped workspace clone, or -1 */
    int ctl;      /* session sandbox: init's end of the control socket, else -1 */
} init_pipes;

static void init_main(const sandbox_config *cfg, const sbx_ids *ids, const host_addrs *ha,
                      char *const argv[], char *const envp[], const int *fds, int nfds, int rep,
                      const init_pipes *ip, int lsock, const sbx_limits *lim)
{
    char err[512];
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sbx_mount_plan *plan = sbx_mount_prepare(cfg, ids, ip->ws_fd, err, sizeof err);
    if (!plan)
        goto fail;
    char c;
    if (read(ip->go, &c, 1) != 1)
        _exit(127); /* the monitor failed and reported why */
    close(ip->go);
    if (sbx_ns_become(ids, err, sizeof err) < 0)
        goto fail;
    /* A change of credentials clears the parent-death signal. Should the
     * monitor die before this, init's read of "c" below sees EOF. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Before anything of the worker's exists; needs CAP_SYS_RESOURCE in
     * the new user namespace, gone after sbx_caps_drop_all(). */
    if (sbx_quota_apply(cfg, err, sizeof err) < 0)
        goto fail;
    if (sethostname("sandbox", 7) < 0) {
        sbx_util_fail(err, sizeof err, "sethostname");
        goto fail;
    }
    prctl(PR_SET_NAME, "sandbox-init", 0, 0, 0);
    if (sbx_net_lo_up(err, sizeof err) < 0)
        goto fail;
    if (cfg->network && sbx_net_block_host(ha->a, ha->n, err, sizeof err) < 0)
        goto fail;
    if (lsock >= 0) {
        int l = sbx_net_listen_lo(cfg->loopback_listen_port, err, sizeof err);
        if (l < 0)
            goto fail;
        if (sbx_util_send_fd(lsock, l) < 0) {
            sbx_util_fail(err, sizeof err, "network: hand out the loopback listener");
            close(l);
            goto fail;
        }
        /* Only the caller keeps it: neither init nor the worker can accept. */
        close(l);
        close(lsock);
    }
    if (sbx_mount_build(plan, cfg, ids, err, sizeof err) < 0)
        goto fail;
    sbx_mount_plan_free(&plan);
    if (sbx_landlock_apply(cfg, err, sizeof err) < 0)
        goto fail;
    if (sbx_caps_drop_all(err, sizeof err) < 0)
        goto fail;
    if (sbx_seccomp_apply(cfg, err, sizeof err) < 0)
        goto fail;
    /* The worker must start inside the cgroups (limits, accounting). */
    if (read(ip->cgroups, &c, 1) != 1 || c != 'c')
        _exit(127); /* the monitor failed and reported why */
    close(ip->cgroups);
    sbx_init_block_signals();
    if (ip->ctl >= 0) {
        /* A session sandbox: no first worker; workers on request. Setup is
         * complete: the report pipe's EOF tells sandbox_session_start(). */
        close(rep);
        int keep[1] = {ip->ctl};
        sbx_util_close_except(keep, 1);
        _exit(sbx_session_init_run(cfg, lim, ip->ctl));
    }
    pid_t worker = fork();
    if (worker < 0) {
        sbx_util_fail(err, sizeof err, "fork worker");
        goto fail;
    }
    if (worker == 0)
        sbx_worker_exec(cfg, argv, envp, fds, nfds, rep, lim);
    /* The caller finds the worker's host pid by this one (see find_worker). */
    char wpid[24];
    snprintf(wpid, sizeof wpid, "%d", (int)worker);
    report(rep, 'W', wpid);
    int keep[1] = {ip->status_w};
    sbx_util_close_except(keep, 1);
    _exit(sbx_init_run(worker, ip->status_w));
fail:
    report(rep, 'E', err);
    _exit(127);
}

static volatile sig_atomic_t monitor_init_pid;

static void monitor_forward(int sig)
{
    if (monitor_init_pid > 0)
        kill(monitor_init_pid, sig);
}

/* Exits the way the worker did: same code, or the same signal. */
static void monitor_exit_as(int st)
{
    if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        struct rlimit r = {0, 0};
        setrlimit(RLIMIT_CORE, &r);
        signal(sig, SIG_DFL);
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, sig);
        sigprocmask(SIG_UNBLOCK, &s, NULL);
        kill(getpid(), sig);
        _exit(128 + sig);
    }
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 127);
}

static void monitor_main(const sandbox_config *cfg, const sbx_ids *chosen, const host_addrs *ha,
                         sbx_limits *lim, char *const argv[], char *const envp[], const int *fds,
                         int nfds, int rep, int lsock, int ctl, int stats_w, pid_t parent)
{
    char err[512], msg[32];
    sbx_ids idbuf = *chosen;
    sbx_ids *ids = &idbuf;
    setsid();
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    reset_signals();
    /* as_caller: a user namespace may deny setgroups (then it has none to
     * drop that its creator did not already see through) */
    if (geteuid() == 0 && setgroups(0, NULL) < 0 && !(ids->as_caller && errno == EPERM)) {
        sbx_util_fail(err, sizeof err, "setgroups");
        report(rep, 'E', err);
        _exit(127);
    }
    /* Caller root: this sandbox's own host uid, and the workspace
     * idmapped to it (never chowned; see sbx_ns.c). */
    init_pipes ip = {.ws_fd = -1, .ctl = ctl};
    if (ids->host_uid == 0 && !ids->as_caller) {
        sbx_ns_assign_host_ids(ids);
        if (ids->idmap &&
            (ip.ws_fd = sbx_ns_idmap_workspace(cfg->workspace, ids, err, sizeof err)) == -1) {
            report(rep, 'E', err);
            _exit(127);
        }
        if (ip.ws_fd < 0)
            ip.ws_fd = -1; /* no idmap support: running as the owner instead */
    }
    int go[2], status[2], cg[2];
    if (pipe2(go, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0 || pipe2(cg, O_CLOEXEC) < 0) {
        sbx_util_fail(err, sizeof err, "pipe");
        report(rep, 'E', err);
        _exit(127);
    }
    /* Raw clone without a new stack behaves like fork; this process has a
     * single thread, so the child may run any code. On cgroup v2, clone3
     * starts init inside the sandbox's cgroup: no attach needed. */
    int in_cgroup = 0;
    pid_t init = -1;
    /* Caller root: the user namespace is created by the sandbox's own host
     * uid, so the kernel's per-user quotas of everything inside are charged
     * to that uid, never to host root (see sbx_ns_creator_enter). */
    int as_sandbox = geteuid() == 0 && ids->own_uid;
    if (as_sandbox && sbx_ns_creator_enter(ids, err, sizeof err) < 0) {
        report(rep, 'E', err);
        _exit(127);
    }
    int cgfd = sbx_limits_clone_fd(lim);
    if (cgfd >= 0) {
        struct clone_args ca;
        memset(&ca, 0, sizeof ca);
        ca.flags = SBX_NS_CLONE_FLAGS | CLONE_INTO_CGROUP;
        ca.exit_signal = SIGCHLD;
        ca.cgroup = (uint64_t)cgfd;
        init = (pid_t)syscall(SYS_clone3, &ca, sizeof ca);
        in_cgroup = init >= 0;
        close(cgfd); /* in the child too: clone3 behaved like fork */
    }
    if (init < 0)
        init = (pid_t)syscall(SYS_clone, SBX_NS_CLONE_FLAGS | SIGCHLD, NULL, NULL, NULL, 0);
    if (init != 0 && as_sandbox) {
        int e = errno;
        sbx_ns_creator_leave();
        /* The change of credentials cleared the parent-death signal. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            if (init > 0)
                kill(init, SIGKILL);
            _exit(127);
        }
        errno = e;
    }
    if (init < 0) {
        sbx_util_fail(err, sizeof err, "namespaces: clone");
        report(rep, 'E', err);
        _exit(127);
    }
    if (init == 0) {
        close(go[1]);
        close(status[0]);
        close(cg[1]);
        if (stats_w >= 0)
            close(stats_w);
        ip.go = go[0];
        ip.cgroups = cg[0];
        ip.status_w = status[1];
        init_main(cfg, ids, ha, argv, envp, fds, nfds, rep, &ip, lsock, lim);
    }
    close(go[0]);
    close(status[1]);
    close(cg[0]);
    if (ip.ws_fd >= 0)
        close(ip.ws_fd);
    monitor_init_pid = init;
    pid_t slirp = 0;
    int slirp_exit = -1;
    if (sbx_ns_write_maps(init, ids, err, sizeof err) < 0 ||
        (cfg->network && (slirp = sbx_net_start_slirp(init, &slirp_exit, err, sizeof err)) < 0)) {
        report(rep, 'E', err);
        kill(init, SIGKILL);
        _exit(127);
    }
    snprintf(msg, sizeof msg, "%d", (int)init);
    report(rep, 'P', msg);
    if (write(go[1], "g", 1) != 1) {
        report(rep, 'E', "sandbox init died during setup");
        kill(init, SIGKILL);
        _exit(127);
    }
    /* While init builds the root: the attach is the slow step of a start
     * on cgroup v1 (the first writer of cgroup.procs waits for an RCU grace
     * period). Init forks the worker only after "c". */
    if (!in_cgroup && sbx_limits_attach(lim, init, err, sizeof err) < 0) {
        report(rep, 'E', err);
        kill(init, SIGKILL);
        _exit(127);
    }
    if (write(cg[1], "c", 1) != 1) {
        report(rep, 'E', "sandbox init died during setup");
        kill(init, SIGKILL);
        _exit(127);
    }
    int keep[3] = {status[0], slirp_exit, stats_w};
    sbx_util_close_except(keep, 3);

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = monitor_forward;
    const int fwd[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof fwd / sizeof *fwd; i++)
        sigaction(fwd[i], &sa, NULL);

    int st = 0;
    struct rusage ru;
    for (;;) {
        pid_t w = wait4(-1, &st, 0, &ru);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            _exit(127);
        }
        if (w == init)
            break;
        if (w == slirp)
            slirp = 0; /* networking died; the sandbox goes on without it */
        /* any other: the idmap's user-namespace creator (sbx_ns.c) */
    }
    /* init's rusage covers every process it reaped, and when PID 1 exits
     * the kernel reaps the rest of the namespace for it. */
    if (stats_w >= 0) {
        uint64_t ns = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000u +
                      ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000u;
        ssize_t w = write(stats_w, &ns, sizeof ns);
        (void)w;
    }
    int worker_st;
    if (read(status[0], &worker_st, sizeof worker_st) == (ssize_t)sizeof worker_st)
        st = worker_st;
    if (slirp > 0) {
        close(slirp_exit);
        kill(slirp, SIGKILL);
        waitpid(slirp, NULL, 0);
    }
    monitor_exit_as(st);
}

/* 1 when pid's parent is ppid and its innermost pid (the last NSpid field,
 * its pid inside the sandbox) is ns_pid, else 0. */
static int status_matches(pid_t pid, pid_t ppid, pid_t ns_pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *pp = strstr(buf, "\nPPid:");
    const char *ns = strstr(buf, "\nNSpid:");
    if (!pp || !ns || atoi(pp + 6) != (int)ppid)
        return 0;
    const char *eol = strchr(ns + 1, '\n');
    const char *last = ns + 7;
    for (const char *c = ns + 7; *c && c != eol; c++)
        if (*c == '\t' || *c == ' ')
            last = c + 1;
    return atoi(last) == (int)ns_pid;
}

int sbx_find_child(pid_t init_pid, pid_t ns_pid, pid_t *pid_out, int *pidfd_out)
{
    *pid_out = 0;
    *pidfd_out = -1;
    if (ns_pid <= 0 || init_pid <= 0)
        return -1;
    char path[96], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)init_pid, (int)init_pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
        pid_t pid = atoi(tok);
        if (pid <= 0)
            continue;
        int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pfd < 0)
            continue;
        if (status_matches(pid, init_pid, ns_pid) &&
            syscall(SYS_pidfd_send_signal, pfd, 0, NULL, 0) == 0) {
            *pid_out = pid;
            *pidfd_out = pfd;
            return 0;
        }
        close(pfd);
    }
    return -1;
}

/* Strict: finds the worker's host pid among init's children by its pid
 * inside the sandbox and keeps a pidfd of it, so that sandbox_signal() can
 * signal its process group directly: a signal forwarded by init arrives
 * whenever init gets to run, possibly after the next cell started. The
 * pidfd is taken before the check, and the check is believed only if the
 * pidfd still refers to a live process afterwards: a pid reused in between
 * would have required the checked process to die first. Leaves worker_pid
 * 0 when anything fails; sandbox_signal() then goes through init. */
static void find_worker(sandbox *sb)
{
    if (sb->worker_ns_pid <= 0 || sb->init_pid <= 0)
        return;
    sbx_find_child(sb->init_pid, sb->worker_ns_pid, &sb->worker_pid, &sb->worker_pidfd);
}

/* Init still runs, so its pid is still the sandbox's (held by the pidfd). */
static int init_alive(const sandbox *sb)
{
    if (sb->init_pidfd >= 0)
        return syscall(SYS_pidfd_send_signal, sb->init_pidfd, 0, NULL, 0) == 0;
    return 0;
}

static sandbox *spawn_strict(const sandbox_config *cfg, char *const argv[], char *const envp[],
                             const int *fds, int nfds, char *err, size_t errlen)
{
    if (nfds > 16) {
        snprintf(err, errlen, "sandbox_spawn: at most 16 fds");
        return NULL;
    }
    if (argv && argv[0][0] != '/') {
        snprintf(err, errlen, "sandbox_spawn: %s is not an absolute path", argv[0]);
        return NULL;
    }
    struct stat st;
    if (cfg->workspace &&
        (cfg->workspace[0] != '/' || stat(cfg->workspace, &st) < 0 || !S_ISDIR(st.st_mode))) {
        if (cfg->workspace[0] != '/')
            errno = EINVAL;
        else if (errno == 0 || S_ISDIR(st.st_mode) == 0)
            errno = errno ? errno : ENOTDIR;
        sbx_util_fail(err, errlen, "workspace %s", cfg->workspace);
        return NULL;
    }
    if (cfg->network && cfg->loopback_listen_port) {
        snprintf(err, errlen, "sandbox_spawn: a loopback listener needs the network off");
        return NULL;
    }
    if (cfg->network && sbx_net_probe(err, errlen) < 0)
        return NULL;
    sbx_ids ids;
    if (sbx_ns_choose_ids(cfg->workspace, &ids, err, errlen) < 0)
        return NULL;
    host_addrs ha = {.n = 0};
    if (cfg->network)
        ha.n = sbx_net_host_addrs(ha.a, SBX_NET_MAX_HOST_ADDRS);
    sandbox *sb = sbx_sandbox_alloc(cfg, err, errlen);
    if (!sb)
        return NULL;
    sb->lim = sbx_limits_new(cfg);
    /* cgroup v1 (no clone3 into the cgroup): the monitor will attach init,
     * and the first attach in a while waits for an RCU grace period; start
     * it now, beside the monitor's namespace set-up (sbx_cgwarm.c). */
    int cgfd = sbx_limits_clone_fd(sb->lim);
    if (cgfd >= 0)
        close(cgfd);
    else if (sbx_limits_has_memory_cgroup(sb->lim) || sbx_limits_has_cpu_cgroup(sb->lim))
        sbx_cgwarm_start();
    int rep[2], lsv[2] = {-1, -1}, stats[2], ctl[2] = {-1, -1};
    /* A session sandbox (no argv): init serves spawn requests on ctl. */
    if (!argv && socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) < 0) {
        sbx_util_fail(err, errlen, "socketpair");
        goto fail;
    }
    sb->ctl_fd = ctl[0];
    if (pipe2(stats, O_CLOEXEC | O_NONBLOCK) < 0) {
        sbx_util_fail(err, errlen, "pipe");
        if (ctl[1] >= 0)
            close(ctl[1]);
        goto fail;
    }
    sb->stats_fd = stats[0];
    if (pipe2(rep, O_CLOEXEC) < 0) {
        sbx_util_fail(err, errlen, "pipe");
        close(stats[1]);
        if (ctl[1] >= 0)
            close(ctl[1]);
        goto fail;
    }
    if (cfg->loopback_listen_port && socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, lsv) < 0) {
        sbx_util_fail(err, errlen, "socketpair");
        close(rep[0]);
        close(rep[1]);
        close(stats[1]);
        if (ctl[1] >= 0)
            close(ctl[1]);
        goto fail;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        sbx_util_fail(err, errlen, "fork");
        close(rep[0]);
        close(rep[1]);
        close(stats[1]);
        if (lsv[0] >= 0) {
            close(lsv[0]);
            close(lsv[1]);
        }
        if (ctl[1] >= 0)
            close(ctl[1]);
        goto fail;
    }
    if (pid == 0) {
        if (ctl[0] >= 0)
            close(ctl[0]);
        close(rep[0]);
        close(stats[0]);
        if (lsv[0] >= 0)
            close(lsv[0]);
        monitor_main(cfg, &ids, &ha, sb->lim, argv, envp, fds, nfds, rep[1], lsv[1], ctl[1],
                     stats[1], parent);
        _exit(127);
    }
    close(rep[1]);
    close(stats[1]);
    if (lsv[1] >= 0)
        close(lsv[1]);
    if (ctl[1] >= 0)
        close(ctl[1]);
    sb->pid = pid;

    /* Read reports until EOF (the worker's exec closed the last copy). */
    char buf[2048];
    size_t have = 0;
    int failed = 0;
    err[0] = 0;
    for (;;) {
        struct pollfd pfd = {rep[0], POLLIN, 0};
        int rc = poll(&pfd, 1, 30000);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc <= 0) {
            snprintf(err, errlen, "sandbox setup timed out");
            failed = 1;
            break;
        }
        ssize_t n = read(rep[0], buf + have, sizeof buf - 1 - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        have += (size_t)n;
        /* consume complete messages */
        size_t off = 0;
        while (off < have) {
            char *nul = memchr(buf + off, 0, have - off);
            if (!nul)
                break;
            char kind = buf[off];
            const char *text = buf + off + 1;
            if (kind == 'P' && sb->init_pid == 0) {
                sb->init_pid = atoi(text);
                sb->init_pidfd = (int)syscall(SYS_pidfd_open, sb->init_pid, 0);
            } else if (kind == 'W' && sb->worker_ns_pid == 0) {
                sb->worker_ns_pid = atoi(text);
            } else if (kind == 'E' && !failed) {
                snprintf(err, errlen, "%s", text);
                failed = 1;
            }
            off = (size_t)(nul - buf) + 1;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
        if (have == sizeof buf - 1)
            have = 0; /* garbage without terminator: drop */
    }
    close(rep[0]);
    if (!failed && sb->init_pid == 0) {
        snprintf(err, errlen, "sandbox setup failed without a reason");
        failed = 1;
    }
    /* Init sent the listener before it forked the worker, so it is queued
     * by now (the report pipe reached EOF only after the worker's exec). */
    if (!failed && lsv[0] >= 0 && (sb->listen_fd = sbx_util_recv_fd(lsv[0])) < 0) {
        sbx_util_fail(err, errlen, "sandbox: no loopback listener from init");
        failed = 1;
    }
    if (lsv[0] >= 0)
        close(lsv[0]);
    if (failed)
        goto fail;
    find_worker(sb);
    /* Opened while init (held by its pidfd) surely is the sandbox's. */
    if (!cfg->network && sbx_net_open_counters(sb->init_pid, sb->net_fds) == 0 && !init_alive(sb)) {
        for (int i = 0; i < 2; i++)
            if (sb->net_fds[i] >= 0)
                close(sb->net_fds[i]);
        sb->net_fds[0] = sb->net_fds[1] = -1;
    }
    return sb;
fail:
    sandbox_destroy(&sb);
    return NULL;
}

sandbox *sandbox_spawn(const sandbox_config *cfg, char *const argv[], char *const envp[],
                       const int *fds, int nfds, char *err, size_t errlen)
{
    if (!cfg || !argv || !argv[0] || nfds < 0 || (nfds > 0 && !fds)) {
        snprintf(err, errlen, "sandbox_spawn: invalid arguments");
        return NULL;
    }
    if (cfg->level == SANDBOX_NONE && cfg->loopback_listen_port) {
        /* Without a network namespace there is nothing to confine to. */
        snprintf(err, errlen, "sandbox_spawn: a loopback listener needs the strict sandbox");
        return NULL;
    }
    if (cfg->level == SANDBOX_NONE)
        return spawn_none(cfg, argv, envp, fds, nfds, err, errlen);
    if (cfg->level != SANDBOX_STRICT) {
        snprintf(err, errlen, "sandbox_spawn: unknown sandbox level %d", (int)cfg->level);
        return NULL;
    }
    if (cfg->session_socket) {
        if (nfds > SBX_SESS_MAX_FDS || argv[0][0] != '/') {
            snprintf(err, errlen, "sandbox_spawn: at most %d fds, an absolute argv[0]",
                     SBX_SESS_MAX_FDS);
            return NULL;
        }
        return sbx_session_join(cfg, argv, envp, fds, nfds, err, errlen);
    }
    return spawn_strict(cfg, argv, envp, fds, nfds, err, errlen);
}

sandbox *sandbox_session_start(const sandbox_config *cfg, char *err, size_t errlen)
{
    if (!cfg || cfg->level != SANDBOX_STRICT || cfg->session_socket) {
        snprintf(err, errlen, "sandbox_session_start: a strict config of its own");
        return NULL;
    }
    return spawn_strict(cfg, NULL, NULL, NULL, 0, err, errlen);
}

int sandbox_reap(sandbox *sb, int *status)
{
    if (!sb || sb->pid <= 0)
        return -1;
    if (sb->joined)
        return sbx_session_reap(sb, status);
    int st;
    pid_t r = waitpid(sb->pid, &st, WNOHANG);
    if (r == sb->pid) {
        *status = st;
        return 1;
    }
    if (r < 0 && errno == ECHILD) {
        *status = 0;
        return 1;
    }
    return 0;
}

int sandbox_wait_fd(const sandbox *sb)
{
    return sb && sb->joined ? sb->join_fd : -1;
}

pid_t sandbox_pid(const sandbox *sb)
{
    return sb ? sb->pid : -1;
}

int sandbox_signal(sandbox *sb, int sig)
{
    if (!sb || sb->pid <= 0)
        return -1;
    if (sb->cfg.level == SANDBOX_NONE)
        return kill(-sb->pid, sig);
    /* In a session sandbox: the worker's group only, SIGKILL included
     * (the session's other workers and the sandbox go on). */
    if (sb->joined)
        return sb->join_exited ? -1
                               : sbx_session_signal_group(sb->worker_pidfd, sb->worker_pid, sig);
    /* From here, straight to the worker's process group (its host pid is
     * its pgid: it called setsid): delivered when this returns, so an
     * interrupt cannot reach the next cell. PIDFD_SIGNAL_PROCESS_GROUP
     * (Linux 6.9) names the group by the worker's struct pid, immune to pid
     * reuse; older kernels: kill() once the pidfd says the leader still
     * exists (alive or a zombie, its pid is not reused; init exits, and the
     * namespace with it, right after reaping it). SIGKILL goes to init:
     * ending the pid namespace ends every process in it. */
    if (sig != SIGKILL && sb->worker_pidfd >= 0) {
        if (syscall(SYS_pidfd_send_signal, sb->worker_pidfd, sig, NULL,
                    SBX_PIDFD_SIGNAL_PROCESS_GROUP) == 0)
            return 0;
        if (errno == EINVAL && syscall(SYS_pidfd_send_signal, sb->worker_pidfd, 0, NULL, 0) == 0 &&
            kill(-sb->worker_pid, sig) == 0)
            return 0;
        /* The worker is gone or the group is: init forwards to whatever is
         * left (it tries the group, then the worker). */
    }
    /* Init forwards to the worker's process group; SIGKILL ends the pid
     * namespace and so every process in it. */
    if (sb->init_pidfd >= 0)
        return (int)syscall(SYS_pidfd_send_signal, sb->init_pidfd, sig, NULL, 0);
    return sb->init_pid > 0 ? kill(sb->init_pid, sig) : -1;
}

unsigned long long sandbox_memory_rlimit(const sandbox *sb)
{
    if (!sb || sb->cfg.level != SANDBOX_STRICT || !sb->cfg.memory_bytes ||
        sbx_limits_has_memory_cgroup(sb->lim))
        return 0;
    return (unsigned long long)sb->cfg.memory_bytes;
}

const char *sandbox_limit_hit(sandbox *sb, int wait_status, char *buf, size_t size)
{
    if (!sb || !buf || size == 0)
        return NULL;
    if (sb->cfg.level == SANDBOX_STRICT)
        return sbx_limits_hit(sb->lim, &sb->cfg, wait_status, sb->joined ? sb->oom_base : 0, buf,
                              size);
    if (WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGXFSZ) {
        char n[32];
        snprintf(buf, size, "file size limit exceeded (limit %s)",
                 sbx_util_bytes(sb->cfg.max_file_bytes, n, sizeof n));
        return buf;
    }
    return NULL;
}

long long sandbox_oom_kills(sandbox *sb)
{
    if (!sb || sb->cfg.level != SANDBOX_STRICT)
        return -1;
    long long n = sbx_limits_oom_kills(sb->lim);
    /* a joined worker counts the session's kills since it joined */
    return sb->joined && n >= 0 && sb->oom_base > 0 ? n - sb->oom_base : n;
}

long long sandbox_net_no_routes(const sandbox *sb)
{
    if (!sb || sb->cfg.level != SANDBOX_STRICT || sb->cfg.network)
        return -1;
    return sbx_net_no_routes(sb->net_fds);
}

uint64_t sandbox_cpu_ns(sandbox *sb)
{
    if (!sb)
        return 0;
    if (sb->cfg.level == SANDBOX_NONE)
        return sbx_limits_cpu_ns(NULL, sb->pid);
    if (sb->joined) {
        /* The session's cgroup counts every kernel of it: this worker's
         * figure is its own process tree's, while it lives. */
        if (!sb->join_exited && sb->worker_pidfd >= 0 &&
            syscall(SYS_pidfd_send_signal, sb->worker_pidfd, 0, NULL, 0) == 0) {
            uint64_t ns = sbx_limits_cpu_ns(NULL, sb->worker_pid);
            if (ns > sb->cpu_ns)
                sb->cpu_ns = ns;
        }
        return sb->cpu_ns;
    }
    if (sbx_limits_has_cpu_cgroup(sb->lim))
        return sbx_limits_cpu_ns(sb->lim, 0);
    if (sb->cpu_final)
        return sb->cpu_ns;
    /* Without a cgroup: the live process tree under init (its pid is only
     * trusted while the pidfd says init lives), then the monitor's total. */
    if (init_alive(sb)) {
        uint64_t ns = sbx_limits_cpu_ns(NULL, sb->init_pid);
        if (init_alive(sb) && ns > sb->cpu_ns)
            sb->cpu_ns = ns;
        return sb->cpu_ns;
    }
    uint64_t final;
    if (sb->stats_fd >= 0 && read(sb->stats_fd, &final, sizeof final) == (ssize_t)sizeof final) {
        sb->cpu_final = 1;
        if (final > sb->cpu_ns)
            sb->cpu_ns = final;
    }
    return sb->cpu_ns;
}

int sandbox_cpu_capped(const sandbox *sb)
{
    if (!sb || !(sb->cfg.cpus > 0))
        return -1;
    return sb->cfg.level == SANDBOX_STRICT && sbx_limits_cpu_capped(sb->lim);
}

int sandbox_take_listen_fd(sandbox *sb)
{
    if (!sb)
        return -1;
    int fd = sb->listen_fd;
    sb->listen_fd = -1;
    return fd;
}

void sandbox_destroy(sandbox **psb)
{
    if (!psb || !*psb)
        return;
    sandbox *sb = *psb;
    if (sb->listen_fd >= 0)
        close(sb->listen_fd);
    if (sb->stats_fd >= 0)
        close(sb->stats_fd);
    for (int i = 0; i < 2; i++)
        if (sb->net_fds[i] >= 0)
            close(sb->net_fds[i]);
    if (sb->joined) {
        /* This worker's group; the holder kills what is left of it too
         * when the connection closes. */
        if (!sb->join_exited)
            sbx_session_signal_group(sb->worker_pidfd, sb->worker_pid, SIGKILL);
        sb->pid = 0;
    }
    if (sb->join_fd >= 0)
        close(sb->join_fd);
    if (sb->ctl_fd >= 0)
        close(sb->ctl_fd);
    if (sb->worker_pidfd >= 0)
        close(sb->worker_pidfd);
    if (sb->init_pidfd >= 0) {
        syscall(SYS_pidfd_send_signal, sb->init_pidfd, SIGKILL, NULL, 0);
        close(sb->init_pidfd);
    }
    if (sb->pid > 0) {
        if (sb->cfg.level == SANDBOX_NONE)
            kill(-sb->pid, SIGKILL);
        else if (sb->init_pid > 0) {
            /* The monitor reaps the init just killed and exits; killed
             * first, it would leave init a zombie of whoever inherits it. */
            int mfd = (int)syscall(SYS_pidfd_open, sb->pid, 0);
            if (mfd >= 0) {
                struct pollfd p = {mfd, POLLIN, 0};
                while (poll(&p, 1, 2000) < 0 && errno == EINTR)
                    ;
                close(mfd);
            }
        }
        kill(sb->pid, SIGKILL);
        waitpid(sb->pid, NULL, 0); /* ECHILD if the caller reaped it: fine */
    }
    sbx_limits_destroy(&sb->lim);
    free(sb);
    *psb = NULL;
}

json_t *sandbox_protections(const sandbox_config *cfg)
{
    json_t *a = json_array();
    if (!a || !cfg)
        return a;
    if (cfg->level == SANDBOX_NONE) {
        json_array_append_new(a, json_string("none"));
        /* a plain child has no cgroup of its own: a rate cap is not applied */
        if (cfg->cpus > 0)
            json_array_append_new(a, json_string("cpu-rate-cap-unavailable"));
        return a;
    }
    char err[256];
    if (sbx_ns_probe(err, sizeof err) == 0) {
        static const char *const ns[] = {"user-namespace",
                                         "mount-namespace",
                                         "pid-namespace",
                                         "network-namespace",
                                         "ipc-namespace",
                                         "uts-namespace",
                                         "cgroup-namespace",
                                         "read-only-root",
                                         "unprivileged-uid",
                                         "pid1-init",
                                         NULL};
        for (const char *const *n = ns; *n; n++)
            json_array_append_new(a, json_string(*n));
    }
    json_array_append_new(a, json_string("no-new-privs"));
    json_array_append_new(a, json_string("capabilities-dropped"));
    if (sbx_seccomp_probe(err, sizeof err) == 0)
        json_array_append_new(a, json_string("seccomp"));
    int abi = sbx_landlock_abi();
    if (abi > 0) {
        char name[32];
        snprintf(name, sizeof name, "landlock-v%d", abi);
        json_array_append_new(a, json_string(name));
        if (abi >= 6)
            json_array_append_new(a, json_string("landlock-scope"));
    }
    sbx_limits_describe(cfg, a);
    sbx_quota_describe(cfg, a);
    json_array_append_new(a, json_string(cfg->network                ? "network-slirp4netns"
                                         : cfg->loopback_listen_port ? "network-loopback-listener"
                                                                     : "network-off"));
    return a;
}

int sandbox_check(const sandbox_config *cfg, char *err, size_t errlen)
{
    if (!cfg) {
        snprintf(err, errlen, "sandbox_check: no config");
        return -1;
    }
    if (cfg->level == SANDBOX_NONE)
        return 0;
    char why[512];
    size_t off = 0;
    int bad = 0;
    err[0] = 0;
#define SBX_MISSING(call)                                                                          \
    do {                                                                                           \
        if ((call) < 0) {                                                                          \
            int n_ = snprintf(err + off, off < errlen ? errlen - off : 0, "%s%s", bad ? "; " : "", \
                              why);                                                                \
            if (n_ > 0)                                                                            \
                off += (size_t)n_;                                                                 \
            bad = 1;                                                                               \
        }                                                                                          \
    } while (0)
    SBX_MISSING(sbx_ns_probe(why, sizeof why));
    SBX_MISSING(sbx_seccomp_probe(why, sizeof why));
    struct mount_attr_probe {
        uint64_t a, b, c, d;
    } probe = {0, 0, 0, 0};
    errno = 0;
    if (syscall(SYS_mount_setattr, -1, "", 0, &probe, sizeof probe) < 0 && errno == ENOSYS) {
        errno = 0;
        SBX_MISSING(sbx_util_fail(why, sizeof why,
                                  "the new mount API (open_tree, mount_setattr; Linux 5.12) "
                                  "is unavailable"));
    }
    if (cfg->network)
        SBX_MISSING(sbx_net_probe(why, sizeof why));
#undef SBX_MISSING
    return bad ? -1 : 0;
}
