/*
 * sandbox.h — run a worker process isolated from the host.
 *
 * One concept per file under sandbox/: namespaces and uid mapping,
 * mounts and the read-only root, Landlock, seccomp, limits (cgroups/rlimits),
 * the init that runs as PID 1, network. This header is the only entry point:
 * the kernel server's worker spawn and the manager's installers use it.
 *
 * Ownership: a sandbox object owns its init process, its cgroup and its
 * scratch directories; sandbox_destroy() kills every process in it.
 *
 * Identity (strict): the worker never runs as host root and the workspace
 * is never chowned. An unprivileged caller's sandbox runs as the caller (same
 * uid inside and out). A root caller's runs as a host uid of its own
 * (0x70000000 + the monitor's pid: unprivileged, owning nothing), and sees
 * the workspace through an idmapped mount that presents the workspace's
 * on-disk owner and group as that uid and gid: it can write a root- or
 * alice-owned workspace, and what it creates there lands on disk owned by
 * the workspace's owner and group. Inside, the sandbox is the workspace's
 * owner (nobody, 65534, for a root-owned one). A filesystem that cannot be
 * idmapped makes the sandbox run as the workspace's owner when that is not
 * root, and sandbox_spawn() refuse (naming the way out) when it is.
 * A root caller's sandbox also creates its user namespace as that own uid,
 * so the kernel's per-user quotas (inotify, queued signals, ...) of
 * everything inside are charged to it, never to host root; every sandbox
 * has per-user quota ceilings besides (see sandbox_config).
 * Setuid/setgid bits cannot be set by the sandbox (seccomp), so it cannot
 * leave a set-id program owned by the workspace's owner.
 * The workspace appears at its host path (tracebacks stay valid on the host).
 *
 * Threads: PR_SET_PDEATHSIG follows the *thread* that called sandbox_spawn();
 * call it from a thread that lives as long as the sandbox should.
 * See "The sandbox" and the sections after it in docs/SECURITY.md.
 */
#ifndef KERNELS_SANDBOX_SANDBOX_H
#define KERNELS_SANDBOX_SANDBOX_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum sandbox_level {
    SANDBOX_NONE = 0, /* plain fork/exec: setsid, PDEATHSIG, fds closed, rlimits */
    SANDBOX_STRICT,   /* everything of DESIGN.md's sandbox policy */
} sandbox_level;

typedef struct sandbox_config {
    sandbox_level level;
    const char *workspace; /* absolute host path, read-write, the cwd */
    const char *const
        *ro_paths;           /* extra host paths bound read-only, NULL-terminated, may be NULL */
    int network;             /* 0: empty net namespace with lo; 1: user-mode networking */
    uint64_t memory_bytes;   /* default 2 GiB */
    uint64_t tmp_bytes;      /* /tmp and /dev/shm tmpfs size, default 512 MiB */
    unsigned max_procs;      /* default 256 */
    unsigned max_open_files; /* default 1024 */
    uint64_t max_file_bytes; /* default 1 GiB */
    /* CPU rate cap of the whole sandbox, in CPUs (0.5: half of one CPU over
     * every scheduling period; 2: two CPUs' worth): cgroup v2 cpu.max or v1
     * cpu.cfs_quota_us / cpu.cfs_period_us (period 100 ms). 0: none
     * (default). No rlimit can cap a rate: without a cpu cgroup it is not
     * enforced, sandbox_cpu_capped() says so and sandbox_protections()
     * lists "cpu-rate-cap-unavailable". */
    double cpus;
    /* Strict and network off only (else sandbox_spawn() refuses): a TCP
     * socket listening on 127.0.0.1:port inside the sandbox's network
     * namespace, made by its init before any restriction applies and handed
     * to the caller (sandbox_take_listen_fd()), who serves it from outside:
     * the one way out of an otherwise empty namespace (package installers
     * reach their index proxy this way). The worker's sockets are those of
     * network off (TCP and UDP, reaching only its own loopback); the port
     * itself is taken, so nothing inside can listen on it. 0: off (default). */
    unsigned short loopback_listen_port;
    /* Strict only. Ceilings on the kernel's per-user quotas, per sandbox.
     * The kernel charges what the sandbox takes to the uid that created its
     * user namespace as well (the caller's own uid when unprivileged; the
     * sandbox's own host uid when the caller is root), so these keep one
     * sandbox from exhausting a quota shared with the host or with other
     * sandboxes. 0 means none may be taken: there is no "unlimited". Set by
     * the sandbox's init before the worker starts; fanotify groups and
     * marks and every namespace count are always 0 inside. */
    unsigned max_inotify_instances; /* user.max_inotify_instances, default 16 */
    unsigned max_inotify_watches;   /* user.max_inotify_watches, default 8192 */
    uint64_t max_sigpending;        /* RLIMIT_SIGPENDING: queued signals and
                                       POSIX timers, default 1024 */
    uint64_t max_msgqueue_bytes;    /* RLIMIT_MSGQUEUE, default 128 KiB */
    uint64_t max_memlock_bytes;     /* RLIMIT_MEMLOCK, default 1 MiB */
    /* Strict only. NULL (default): sandbox_spawn() makes a sandbox of the
     * worker's own. A path: the unix socket of a session's holder
     * (kernelmgr-sandbox, sandbox_session_serve()): the worker starts inside
     * that session's one sandbox instead, beside the session's other
     * workers (one network namespace, /tmp, pid namespace and cgroup, whose
     * limits are the holder's: this config's limits and workspace are not
     * applied; its ro_paths must be ones the session's sandbox has). */
    const char *session_socket;
    /* With session_socket only. NULL (default): the session's init execs
     * the worker (a cold start). A command (argv, NULL-terminated; argv[0]
     * absolute): the worker may instead be forked by a zygote the session's
     * init starts with this command and keeps, one at a time, for workers
     * asking with the same command and start-up environment (sbx_zygote.c;
     * DESIGN.md "Python kernels forked by the session's zygote"); the
     * session's first such worker starts cold, and any failure of the
     * zygote falls back to the cold start. */
    char *const *zygote_argv;
    /* Forks after which that zygote is replaced by a fresh one (it bounds
     * how many workers share one memory layout). 0: no zygote. */
    unsigned zygote_forks;
} sandbox_config;

/* This sandbox implements the per-user quota ceilings above. */
#define SANDBOX_HAS_QUOTAS 1

/* This sandbox implements loopback_listen_port / sandbox_take_listen_fd(). */
#define SANDBOX_HAS_LOOPBACK_LISTEN 1

/* Sets cfg to the defaults above (level strict, network off). */
void sandbox_config_defaults(sandbox_config *cfg);

typedef struct sandbox sandbox;

/* new: starts argv[0] (absolute path) inside a new sandbox with environment
 * envp. fds[i] (i < nfds, nfds <= 16) becomes fd i of the worker; every other
 * fd is closed. Returns once the worker's exec succeeded. On failure returns
 * NULL with a reason in err (e.g. "user namespaces unavailable: Operation not
 * permitted", "exec /x: No such file or directory"). */
sandbox *sandbox_spawn(const sandbox_config *cfg, char *const argv[], char *const envp[],
                       const int *fds, int nfds, char *err, size_t errlen);

/* The pid the caller waits for with waitpid(): a direct child. Its exit status
 * is the worker's (exit code, or the signal that killed it). */
pid_t sandbox_pid(const sandbox *sb);

/* Delivers sig to the worker's whole process group (SIGINT for interrupts),
 * complete when this returns: a signal meant for one cell cannot arrive
 * during the next. Strict: straight from the caller to the group (the
 * worker's host pid, found at spawn and held by a pidfd against reuse);
 * through the sandbox's init only when that pid is unknown or gone, which is
 * asynchronous. SIGKILL ends the whole sandbox. */
int sandbox_signal(sandbox *sb, int sig);

/* When the worker died of a limit, writes which limit and its value, e.g.
 * "out of memory (limit 2 GiB)", and returns buf; otherwise returns NULL.
 * Call it after the worker was reaped, before sandbox_destroy(). */
const char *sandbox_limit_hit(sandbox *sb, int wait_status, char *buf, size_t size);

/* The memory limit in bytes when it is only RLIMIT_DATA (strict, a limit
 * set, no memory cgroup for this caller): an allocation over it just fails
 * in the process that made it, and nothing counts that, so
 * sandbox_limit_hit() cannot name it. 0 otherwise. */
unsigned long long sandbox_memory_rlimit(const sandbox *sb);

/* How many processes of the sandbox the kernel's OOM killer has killed so
 * far (the memory cgroup's oom_kill counter: v2 memory.events, v1
 * memory.oom_control), any process, not only the worker; -1 when unknown
 * (no memory cgroup: with the rlimit fallback an allocation just fails in
 * the process that made it, and nothing can be attributed). Reads one small
 * file; call it at cell boundaries and compare. */
long long sandbox_oom_kills(sandbox *sb);

/* Network off (strict): how many times a process of the sandbox tried to
 * reach an address outside it — a connect or send that found no route
 * (ENETUNREACH: the namespace routes nothing but loopback), counted by the
 * kernel in the namespace (IPv4 OutNoRoutes + IPv6 Ip6OutNoRoutes). -1 when
 * unknown, or network on or level none. Reads two small files; call it at
 * cell boundaries and compare. */
long long sandbox_net_no_routes(const sandbox *sb);

/* The bytes the memory cgroup of the sandbox that process pid is in uses
 * now (cgroup v2 memory.current, v1 memory.usage_in_bytes: its processes'
 * memory, the page cache and tmpfs files they caused, kernel memory): what
 * the sandbox's memory limit is held against. For any process on the host,
 * not only the caller's sandboxes: a manager measures its kernels' sandboxes
 * from the outside. -1 when pid is in no sandbox's memory cgroup (a process
 * outside every sandbox, a sandbox without a memory cgroup: RLIMIT_DATA), is
 * in the caller's own (a caller that itself runs in a sandbox) or is gone.
 * Reads three small files. */
long long sandbox_memory_cgroup_usage(pid_t pid);

/* CPU time (user + system, nanoseconds) used by every process of the sandbox
 * so far, or 0 when it cannot be measured. With a cgroup (cpuacct / cpu.stat)
 * it is the cgroup's figure. Without one (unprivileged callers without
 * delegation), while the sandbox runs, it is summed over the live process
 * tree under the sandbox's init, each process with the time of the children
 * it reaped (clock-tick precision), found through /proc/PID/task/TID/children
 * — a few system calls per process of the sandbox, nothing per host process;
 * once init is gone, the monitor's wait4() figure for init and everything it
 * reaped. Never decreases. Level none: the tree under the worker, while it
 * runs. */
uint64_t sandbox_cpu_ns(sandbox *sb);

/* 1 when cfg.cpus is enforced for this sandbox (its cpu cgroup has the
 * quota), 0 when cfg.cpus is set but cannot be (no usable cpu cgroup, or
 * level none), -1 when cfg.cpus is 0. */
int sandbox_cpu_capped(const sandbox *sb);

/* new fd (the caller closes it): the listening socket of
 * cfg.loopback_listen_port, once; -1 when there is none or it was taken.
 * It lives in the sandbox's network namespace: accept() on it from the host
 * yields the connections the sandbox makes to 127.0.0.1:port. */
int sandbox_take_listen_fd(sandbox *sb);

/* 1 when the worker has exited (*status its wait status), 0 while it runs,
 * without blocking. A worker of a sandbox of its own is the caller's child
 * (waitpid); one in a session sandbox is its init's, which reports the
 * status through the session's holder (a holder gone: killed, SIGKILL). */
int sandbox_reap(sandbox *sb, int *status);

/* An fd that becomes readable when sandbox_reap() may have news (the
 * connection to the session's holder), or -1 (a sandbox of its own:
 * SIGCHLD says so). */
int sandbox_wait_fd(const sandbox *sb);

/* ---- a session's one sandbox, many workers -------------------------------
 *
 * sandbox_session_start() makes the sandbox (every namespace, the mounts,
 * cgroups, Landlock, seccomp) with an init that starts workers on request
 * instead of one worker. sandbox_session_serve() is the holder: the host
 * process that owns that sandbox and serves kernel servers' requests on a
 * unix socket (cfg.session_socket of their sandbox_spawn()). See "One
 * sandbox per session" in docs/SECURITY.md for the trust argument: the
 * holder never enters the sandbox; everything init says is hostile input. */

/* new: the session sandbox, every process of it ended by sandbox_destroy(). */
sandbox *sandbox_session_start(const sandbox_config *cfg, char *err, size_t errlen);

/* Serves the session on listen_fd (a listening SOCK_SEQPACKET unix socket)
 * until owner_fd (>= 0: a lifeline) reports end-of-file or hang-up, SIGTERM
 * or SIGINT arrives, or the sandbox's init ends. The sandbox is made at the
 * first request, with cfg's ro_paths plus the request's. Returns 0, or -1
 * with a reason in err. Single-threaded; installs SIGTERM/SIGINT handling. */
int sandbox_session_serve(const sandbox_config *cfg, int listen_fd, int owner_fd, char *err,
                          size_t errlen);

/* What a holder adds to sandbox_session_serve() (members may be NULL). */
typedef struct sandbox_session_hooks {
    /* Called once, as soon as the sandbox is made (before its first worker
     * starts): the holder takes what it serves from outside, e.g. the
     * loopback listener of cfg.loopback_listen_port (sandbox_take_listen_fd)
     * for the session's egress proxy. 0, or -1 with a reason: the sandbox is
     * destroyed and the request refused with that reason. */
    int (*ready)(void *arg, sandbox *sb, char *err, size_t errlen);
    /* The answer to sandbox_session_egress_refusals(): how many requests
     * the session's egress proxy refused so far, the last reason in last;
     * -1 when there is none. */
    long long (*refusals)(void *arg, char *last, size_t lastlen);
    void *arg;
} sandbox_session_hooks;

/* sandbox_session_serve() with hooks (NULL: none). */
int sandbox_session_serve_with(const sandbox_config *cfg, int listen_fd, int owner_fd,
                               const sandbox_session_hooks *hooks, char *err, size_t errlen);

/* A kernel server of the session whose holder listens on socket_path asks
 * it (a connection of its own, answered at once) how many requests the
 * session's egress proxy refused so far, for every kernel of the session;
 * the last reason (printable, cut) in last. -1 when the holder has no
 * proxy or does not answer within 5 s. */
long long sandbox_session_egress_refusals(const char *socket_path, char *last, size_t lastlen);

/* Kills every process of the sandbox (SIGKILL), reaps the direct child if the
 * caller has not, releases cgroups and scratch directories. NULL-safe. */
void sandbox_destroy(sandbox **sb);

/* new: array of strings naming the protections this config gets on this
 * host, e.g. ["user-namespace", "pid-namespace", "seccomp", "landlock-v4",
 * "cgroup-v1-memory", ...]. */
json_t *sandbox_protections(const sandbox_config *cfg);

/* How this caller's sandboxes get their identity (sbx_ns.c): "root" (each
 * its own host uid), "unprivileged" (the caller's uid) or "userns-root"
 * (root of a user namespace that maps too few ids: the unprivileged mode,
 * as nobody). Static string. */
const char *sandbox_identity(void);

/* 0 when this host can provide cfg->level, else -1 with what is missing in err. */
int sandbox_check(const sandbox_config *cfg, char *err, size_t errlen);

/* The host's system directories every strict sandbox binds read-only (those
 * that exist), NULL-ended: a read-only path at or below one of them needs
 * no bind of its own. */
extern const char *const sandbox_system_dirs[];
/* 1 when path is one of sandbox_system_dirs or below one, lexically (path
 * is not resolved). */
int sandbox_is_system_path(const char *path);

#endif
