/*
 * sbx_internal.h — the pieces sandbox.c assembles into SANDBOX_STRICT.
 *
 * One file per isolation concern, each with its own prefix. Everything here
 * is private to sandbox/: the public entry point is sandbox.h.
 *
 * Functions that run in the sandbox's child processes report failure by
 * returning -1 with a human-readable reason (strerror appended) in err; they
 * never print and never exit, so sandbox.c can forward the reason to the
 * caller of sandbox_spawn().
 */
#ifndef KERNELS_SANDBOX_SBX_INTERNAL_H
#define KERNELS_SANDBOX_SBX_INTERNAL_H

#include "sandbox/sandbox.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- sbx_util.c: error strings ------------------------------------------ */

/* Writes fmt into err and appends ": strerror(errno)" when errno != 0.
 * Returns -1 so callers can `return sbx_util_fail(...)`. */
int sbx_util_fail(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Formats a byte count the way limit messages show it: "2 GiB", "64 MiB",
 * "1536 KiB", "100 bytes". Returns buf. */
const char *sbx_util_bytes(uint64_t n, char *buf, size_t size);
/* Writes s to path (O_WRONLY, no O_CREAT). 0 or -1 with errno. */
int sbx_util_write_file(const char *path, const char *s);
/* Closes every fd >= 0 except the n in keep (-1 entries are ignored). */
void sbx_util_close_except(const int *keep, int n);
/* Passes fd over the unix socket sock (SCM_RIGHTS, one datagram). 0 or -1
 * with errno. */
int sbx_util_send_fd(int sock, int fd);
/* Receives an fd sent by sbx_util_send_fd() without blocking: the new fd
 * (O_CLOEXEC), or -1 with errno (EAGAIN: nothing was sent). */
int sbx_util_recv_fd(int sock);
/* 1 when path p is dir or below it, lexically ("/a/b" is under "/a" and
 * "/a/", not under "/ab"). The sandbox includes nothing of ours, so this is
 * common/cm_path_under's twin. */
int sbx_util_path_under(const char *p, const char *dir);

/* ---- sbx_ns.c: namespaces and the uid/gid mapping ------------------------ */

/* Every namespace the worker gets (user, mount, pid, net, ipc, uts, cgroup). */
#define SBX_NS_CLONE_FLAGS                                                                         \
    (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS |     \
     CLONE_NEWCGROUP)

typedef struct sbx_ids {
    uid_t uid; /* the sandbox's uid inside its user namespace */
    gid_t gid;
    uid_t host_uid; /* what uid maps to on the host: never 0 (but as_caller) */
    gid_t host_gid;
    int own_uid; /* host_uid is the sandbox's own (caller root), no user's */
    /* Caller root of a user namespace that cannot map the uids root mode
     * needs (a rootless container): the unprivileged mode, host_uid is the
     * caller's 0 (an unprivileged uid of the host) and uid is nobody. */
    int as_caller;
    /* Caller root, with a workspace: the workspace is an idmapped mount that
     * shows its on-disk owner ws_uid:ws_gid as host_uid:host_gid, so the
     * sandbox writes it while files land on disk owned by ws_uid:ws_gid. */
    int idmap;
    uid_t ws_uid;
    gid_t ws_gid;
} sbx_ids;

/* Decides the sandbox's identity. See the "Identity" comment in sbx_ns.c.
 * Runs in the caller; host_uid/host_gid of a root caller are placeholders
 * until sbx_ns_assign_host_ids() runs in the monitor. */
int sbx_ns_choose_ids(const char *workspace, sbx_ids *ids, char *err, size_t len);
/* Monitor side, caller root: the per-sandbox host uid/gid (derived from the
 * monitor's pid, unique among live sandboxes). */
void sbx_ns_assign_host_ids(sbx_ids *ids);
/* Monitor side, caller root, ids->idmap set: a detached clone of workspace
 * (open_tree) idmapped with mount_setattr(MOUNT_ATTR_IDMAP) so that on-disk
 * ws_uid:ws_gid is host_uid:host_gid. new fd, O_CLOEXEC. When the filesystem
 * cannot be idmapped and the workspace's owner is not root, falls back to
 * running the sandbox as that owner (ids changed, idmap cleared, returns -2);
 * when root owns it, -1 with a reason naming the way out. Leaves the
 * short-lived creator of the mapping's user namespace, a child that exits
 * at once, to the caller's wait4(-1) loop to reap (not waited for: part of
 * the cold start). */
int sbx_ns_idmap_workspace(const char *workspace, sbx_ids *ids, char *err, size_t len);
/* Monitor side, caller root, around the clone that creates the sandbox's
 * user namespace: switches the effective uid/gid to ids->host_uid/host_gid
 * (real and saved stay 0, fsuid/fsgid stay 0), so that the namespace is
 * owned by the sandbox's own host uid. The kernel charges the per-user
 * quotas (ucounts) of everything inside to the namespace's owner at the
 * levels above, so a sandbox's inotify instances, queued signals, ... are
 * never counted against host root. fsuid 0 keeps init's access rights to
 * host paths (sbx_mount_prepare) those of the caller. 0, or -1 with a
 * reason (ids restored). sbx_ns_creator_leave() restores euid/egid 0; the
 * change of credentials clears PR_SET_PDEATHSIG, so set it again after. */
int sbx_ns_creator_enter(const sbx_ids *ids, char *err, size_t len);
void sbx_ns_creator_leave(void);
/* Parent side: writes setgroups=deny, uid_map and gid_map of child pid. */
int sbx_ns_write_maps(pid_t pid, const sbx_ids *ids, char *err, size_t len);
/* Child side, once the maps exist: become ids->uid/gid inside, keeping the
 * namespace capabilities needed to finish the setup. */
int sbx_ns_become(const sbx_ids *ids, char *err, size_t len);
/* 0 when this process may create the namespaces, else -1 with a reason. */
int sbx_ns_probe(char *err, size_t len);

/* ---- sbx_mount.c: the read-only root ------------------------------------ */

typedef struct sbx_mount_plan sbx_mount_plan;

/* Child side, in the new mount namespace, before sbx_ns_become(): resolves
 * every host path while the process still has the caller's access rights
 * (detached mount clones via open_tree). ws_fd: a detached (idmapped) clone
 * of the workspace made by the monitor, stolen; -1 to clone it here.
 * new: free with sbx_mount_plan_free. */
sbx_mount_plan *sbx_mount_prepare(const sandbox_config *cfg, const sbx_ids *ids, int ws_fd,
                                  char *err, size_t len);
/* Child side, after sbx_ns_become(), as PID 1 of the new pid namespace:
 * builds the tmpfs root, pivots into it, remounts it read-only and makes the
 * workspace the cwd. */
int sbx_mount_build(sbx_mount_plan *plan, const sandbox_config *cfg, const sbx_ids *ids, char *err,
                    size_t len);
void sbx_mount_plan_free(sbx_mount_plan **plan);

/* ---- sbx_caps.c --------------------------------------------------------- */

/* no_new_privs, then every capability gone: bounding, ambient, inheritable,
 * permitted, effective. */
int sbx_caps_drop_all(char *err, size_t len);

/* ---- sbx_landlock.c ----------------------------------------------------- */

/* Landlock ABI version of the running kernel, 0 when unavailable. */
int sbx_landlock_abi(void);
/* Restricts the calling process (in the final root) to the sandbox's mounts.
 * Returns the ABI used (> 0), 0 when Landlock is unavailable, -1 on error. */
int sbx_landlock_apply(const sandbox_config *cfg, char *err, size_t len);

/* ---- sbx_seccomp.c ------------------------------------------------------ */

/* 0 when seccomp filters with KILL_PROCESS are available, else -1 + reason. */
int sbx_seccomp_probe(char *err, size_t len);
/* Loads the deny-list filter into the calling process (no_new_privs set). */
int sbx_seccomp_apply(const sandbox_config *cfg, char *err, size_t len);

/* ---- sbx_limits.c ------------------------------------------------------- */

typedef struct sbx_limits sbx_limits;

/* Parent side: creates this sandbox's cgroups where the host lets us and
 * writes the limits. Never fails: without cgroups the rlimits carry the
 * limits. new: free with sbx_limits_destroy. */
sbx_limits *sbx_limits_new(const sandbox_config *cfg);
/* Moves pid (and its future children) into the cgroups. */
int sbx_limits_attach(sbx_limits *lim, pid_t pid, char *err, size_t len);
/* cgroup v2 only: new fd (O_CLOEXEC) of the sandbox's one cgroup directory,
 * for clone3(CLONE_INTO_CGROUP), which starts a process inside it without
 * the attach (and without the attach's RCU grace period); -1 otherwise. */
int sbx_limits_clone_fd(const sbx_limits *lim);
/* Child side, in the worker just before exec. */
int sbx_limits_apply_rlimits(const sandbox_config *cfg, const sbx_limits *lim, char *err,
                             size_t len);
int sbx_limits_has_memory_cgroup(const sbx_limits *lim);
/* The memory cgroup's oom_kill counter, or -1 without one (or unreadable). */
long long sbx_limits_oom_kills(const sbx_limits *lim);
/* "out of memory (limit 2 GiB)" etc. or NULL; see sandbox_limit_hit().
 * Counts only OOM kills past oom_base (a joined worker's count at the
 * join; 0 for a sandbox of its own). */
const char *sbx_limits_hit(sbx_limits *lim, const sandbox_config *cfg, int wait_status,
                           long long oom_base, char *buf, size_t size);
int sbx_limits_has_cpu_cgroup(const sbx_limits *lim);
/* 1 when cfg->cpus was written to a cpu cgroup of the sandbox (a rate cap
 * in force), else 0. */
int sbx_limits_cpu_capped(const sbx_limits *lim);
/* CPU ns of the sandbox's cgroup when lim has one; else of the live process
 * tree under root_pid, each process with the time of the children it reaped,
 * walked through /proc/PID/task/TID/children: O(processes of the tree). */
uint64_t sbx_limits_cpu_ns(sbx_limits *lim, pid_t root_pid);
/* Appends protection names ("cgroup-v1-memory", "rlimit-nproc", ...). */
void sbx_limits_describe(const sandbox_config *cfg, json_t *list);
/* Kills what is left in the cgroups and removes them. NULL-safe. */
void sbx_limits_destroy(sbx_limits **lim);

/* ---- sbx_cgwarm.c ------------------------------------------------------- */

/* Parent side, once the sandbox's cgroups exist and its init will be
 * attached to them (cgroup v1): starts, on a detached thread that moves
 * only itself into the cgroup it is in, the RCU grace period the first
 * cgroup attach in a while waits for, so that the monitor's attach shares
 * it. Best effort, never fails. */
void sbx_cgwarm_start(void);

/* ---- sbx_quota.c -------------------------------------------------------- */

/* Child side, in init, with CAP_SYS_RESOURCE in the sandbox's user
 * namespace (after sbx_ns_become(), before sbx_caps_drop_all()): writes the
 * namespace's /proc/sys/user/max_* ceilings (inotify from cfg; fanotify and
 * every namespace type 0) and sets RLIMIT_SIGPENDING, RLIMIT_MSGQUEUE and
 * RLIMIT_MEMLOCK, which the worker inherits. */
int sbx_quota_apply(const sandbox_config *cfg, char *err, size_t len);
/* Appends protection names ("userns-max-inotify-instances", ...). */
void sbx_quota_describe(const sandbox_config *cfg, json_t *list);

/* ---- sbx_net.c ---------------------------------------------------------- */

/* Child side: brings lo up in the new network namespace. */
int sbx_net_lo_up(char *err, size_t len);
/* Child side, network off, after sbx_net_lo_up(), before any restriction:
 * a TCP socket (O_CLOEXEC) listening on 127.0.0.1:port, or -1 with err. */
int sbx_net_listen_lo(unsigned short port, char *err, size_t len);
/* Parent side, network on: attaches slirp4netns to pid's namespaces and
 * waits until tap0 is configured. Returns slirp4netns' pid; it exits when
 * *exit_fd (kept by the caller) is closed. */
pid_t sbx_net_start_slirp(pid_t pid, int *exit_fd, char *err, size_t len);
#define SBX_NET_MAX_HOST_ADDRS 32
/* Parent side, in the host's network namespace: the host's own IPv4
 * addresses (not loopback), network byte order. Returns how many. */
int sbx_net_host_addrs(uint32_t *addrs, int max);
/* Child side, network on, with CAP_NET_ADMIN in the new namespace: reject
 * routes to the host's own addresses, so that services listening on the
 * host's 0.0.0.0 are not reachable through its external address either. */
int sbx_net_block_host(const uint32_t *addrs, int n, char *err, size_t len);
/* 0 when user-mode networking can work on this host, else -1 + reason. */
int sbx_net_probe(char *err, size_t len);
/* Parent side: opens the IPv4 and IPv6 counters (/proc/PID/net/snmp and
 * snmp6, O_CLOEXEC) of pid's network namespace into fds; an fd stays bound
 * to that namespace, whoever reuses the pid later. One missing (no IPv6) is
 * -1. Returns 0 when at least one was opened. */
int sbx_net_open_counters(pid_t pid, int fds[2]);
/* How many connects and sends found no route (OutNoRoutes + Ip6OutNoRoutes)
 * in the namespace of fds, or -1 when neither can be read. */
long long sbx_net_no_routes(const int fds[2]);

/* ---- the sandbox object (sandbox.c; sbx_session.c uses it too) ---------- */

#define SBX_SESS_MAX_WORKERS 64

struct sandbox {
    pid_t pid;  /* direct child the caller waits for */
    int reaped; /* caller told us (via destroy) or we reaped it */
    sandbox_config cfg;
    pid_t init_pid;      /* strict: host pid of the sandbox's PID 1 */
    int init_pidfd;      /* strict: pidfd of init (-1 if unavailable) */
    pid_t worker_ns_pid; /* strict: the worker's pid inside the sandbox */
    pid_t worker_pid;    /* strict: its host pid (= host pgid), 0 if unknown */
    int worker_pidfd;    /* strict: pidfd of the worker, -1 if unknown */
    sbx_limits *lim;     /* strict: cgroups */
    int listen_fd;       /* strict: loopback listener from init, until taken */
    int stats_fd;        /* strict: the monitor's final CPU time (read end) */
    int net_fds[2];      /* strict, network off: its namespace's IP counters */
    uint64_t cpu_ns;     /* the largest value sandbox_cpu_ns() returned */
    int cpu_final;       /* cpu_ns is the monitor's final figure */
    /* A session sandbox (sandbox_session_start): the holder's end of the
     * control socket to init; exit reports read while waiting for a spawn
     * reply wait here for sandbox_session_event(). */
    int ctl_fd;
    struct {
        uint32_t id;
        int status;
    } evq[SBX_SESS_MAX_WORKERS];
    int nevq;
    /* A worker that joined a session sandbox (cfg.session_socket): the
     * connection to the session's holder, which reports the exit status. */
    int join_fd;
    int joined, join_exited, join_status;
    long long oom_base; /* the session's oom_kill counter at the join */
};

/* sandbox.c: the worker's last steps (setsid, fds to 0..nfds-1, rlimits,
 * exec); a failure is reported on rep ("E<reason>"). Never returns. */
void sbx_worker_exec(const sandbox_config *cfg, char *const argv[], char *const envp[],
                     const int *fds, int nfds, int rep, const sbx_limits *lim)
    __attribute__((noreturn));
/* sandbox.c: the host pid (and a pidfd, held against reuse) of the child of
 * init_pid whose pid inside the sandbox is ns_pid. 0, or -1 (*pid 0,
 * *pidfd -1) when there is none. */
int sbx_find_child(pid_t init_pid, pid_t ns_pid, pid_t *pid, int *pidfd);

/* ---- sbx_session.c: one sandbox, many workers ----------------------------
 *
 * The wire format of both hops (a kernel server -> the session's holder,
 * the holder -> the sandbox's init): one SOCK_SEQPACKET message each, a
 * fixed header and NUL-terminated strings, fds by SCM_RIGHTS. */

#define SBX_SESS_MAGIC 0x6b6d7362u /* "kmsb" */
#define SBX_SESS_MAX_MSG (352u << 10)
#define SBX_SESS_MAX_FDS 16
#define SBX_SESS_MAX_ARGC 128
#define SBX_SESS_MAX_ENVC 512
#define SBX_SESS_MAX_ROC 32
#define SBX_SESS_MAX_REASON 480

typedef struct sbx_sess_hdr {
    uint32_t magic;
    uint32_t type; /* 'S' spawn, 'O' started, 'E' failed, 'X' exited, 'K' signal,
                      'R' egress refusals (query; answer: a the count, the last reason) */
    uint32_t id;   /* the worker, chosen by the holder (a client's is 0) */
    int32_t a;     /* 'O': pid (init: inside; holder: host), 'X': wait status, 'K': signal */
    uint32_t argc, envc, roc; /* 'S': how many strings of each follow */
    uint32_t zargc;           /* 'S': strings of the zygote's command, after the
                                 environment (0: a cold start) */
    uint32_t zmax;            /* 'S': its forks before it is replaced */
} sbx_sess_hdr;

/* Sends one message (payload may be NULL when len is 0). 0 or -1 + errno. */
int sbx_sess_send(int fd, const sbx_sess_hdr *h, const void *payload, size_t len, const int *fds,
                  int nfds);
/* Receives one message into h and buf (cap bytes), fds into fds (at most
 * maxfds, O_CLOEXEC; *nfds how many). Returns the payload length, 0 on
 * end-of-file, -1 with errno (EAGAIN; EBADMSG: truncated, too many fds, a
 * bad magic or a short header: whatever came is closed). */
ssize_t sbx_sess_recv(int fd, sbx_sess_hdr *h, char *buf, size_t cap, int *fds, int *nfds,
                      int maxfds);
/* Splits payload into exactly n NUL-terminated strings (out[n] = NULL)
 * that fill it. 0, or -1 when it is anything else. */
int sbx_sess_split(char *payload, size_t len, uint32_t n, char **out);

/* In init of a session sandbox, every restriction in force: serves spawn
 * and signal requests on ctl until it reaches end-of-file, reports each
 * worker's exit. Returns init's exit code. */
int sbx_session_init_run(const sandbox_config *cfg, const sbx_limits *lim, int ctl);
/* sandbox_spawn() with cfg->session_socket: asks the session's holder. */
sandbox *sbx_session_join(const sandbox_config *cfg, char *const argv[], char *const envp[],
                          const int *fds, int nfds, char *err, size_t errlen);
/* A joined worker's sandbox_reap(): reads the holder's exit report. */
int sbx_session_reap(sandbox *sb, int *status);
/* Signals the process group led by the process of pidfd (host pid pid):
 * PIDFD_SIGNAL_PROCESS_GROUP, or kill(-pid) once the pidfd says the
 * leader still exists (its pid not reused). 0 or -1. */
int sbx_session_signal_group(int pidfd, pid_t pid, int sig);
/* A sandbox object with nothing in it yet (sandbox.c). */
sandbox *sbx_sandbox_alloc(const sandbox_config *cfg, char *err, size_t errlen);
/* sbx_limits.c: a view (never removed, nothing written) of the cgroups
 * process pid is in, when they are a sandbox's (below the caller's own):
 * for a worker that joined a session sandbox. NULL when there are none. */
sbx_limits *sbx_limits_view(pid_t pid, const sandbox_config *cfg);

/* ---- sbx_zygote.c: a session's pre-initialized worker that forks workers -- */

#define SBX_ZYG_MAX_FORKS 100000u
/* How long init waits for a zygote to be ready, and for one fork: a spawn
 * that asks for a zygote may take this much longer (the cold start after
 * a failed zygote has its own SBX_SESS_SPAWN_MS). */
#define SBX_ZYG_START_MS 8000
#define SBX_ZYG_FORK_MS 4000

typedef struct sbx_zygote {
    pid_t pid;      /* inside the sandbox (init's child); 0: none */
    int fd;         /* init's end of the socketpair to it; -1: none */
    unsigned forks; /* workers it forked */
    char *key;      /* its command and start-up environment, NUL-separated */
    size_t keylen;
    unsigned asked; /* requests for a zygote's worker so far */
} sbx_zygote;

#define SBX_ZYGOTE_NONE                                                                            \
    {                                                                                              \
        0, -1, 0, NULL, 0, 0                                                                       \
    }

/* In the session's init: a worker for zargv/envp forked by the zygote
 * (started, or replaced after zmax forks or when its command, start-up
 * environment or files changed), with fds as fds 0..nfds-1. The first
 * such request of a session is refused (it starts cold: most sessions
 * start one Python kernel, and a zygote would only cost them), so the
 * zygote starts with the second. 0 with *pid,
 * a child of init inside the sandbox; -1 with a reason (the caller then
 * starts the worker cold; fds stay the caller's either way). ctl and sfd
 * are init's own fds, closed in the zygote. */
int sbx_zygote_spawn(sbx_zygote *z, const sandbox_config *cfg, const sbx_limits *lim, int ctl,
                     int sfd, char *const zargv[], char *const envp[], const int *fds, int nfds,
                     unsigned zmax, pid_t *pid, char *err, size_t errlen);
/* Init reaped pid: forgets the zygote when it was that. */
void sbx_zygote_reaped(sbx_zygote *z, pid_t pid);

/* ---- sbx_init.c --------------------------------------------------------- */

/* PID 1 of the sandbox: runs until the worker (pid worker) exits, forwarding
 * SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 to its process group and
 * reaping orphans. Writes the worker's wait status (int) to status_fd, then
 * returns the exit code init should _exit() with. */
int sbx_init_run(pid_t worker, int status_fd);
/* Blocks the signals sbx_init_run() forwards; call before forking the worker
 * so that none is lost in between (the worker unblocks them). */
void sbx_init_block_signals(void);

#endif
