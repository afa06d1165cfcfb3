/*
 * sbx_quota.c — per-sandbox ceilings on the kernel's per-user quotas.
 *
 * The kernel counts some objects per user ("ucounts", kernel/ucount.c), at
 * every level of the user-namespace tree: an object taken in the sandbox's
 * user namespace S by its uid U is charged to (S, U) and also to (parent,
 * owner of S) — the uid that created S — and so on up to the initial
 * namespace, each level checked against that level's limit. Without a
 * ceiling in S, a sandbox could take a whole host-wide per-user quota of its
 * creator: 128 inotify instances made inotify_init1 fail for every process
 * of that uid on the host.
 *
 * Two kinds, two mechanisms, both applied by the sandbox's init before the
 * worker exists (rlimits are inherited by everything it forks):
 *   - ucount limits (inotify instances and watches, fanotify groups and
 *     marks, and one per namespace type): /proc/sys/user/max_* are per user
 *     namespace, writable by a holder of CAP_SYS_RESOURCE in it; the values
 *     written in S bound (S, U), and so what this sandbox can add at every
 *     level above. fanotify and every namespace count are 0: seccomp already
 *     denies fanotify_init, unshare, setns and namespace clone flags.
 *   - rlimit-backed counts (Linux >= 5.14: pending signals, POSIX message
 *     queue bytes, locked shared memory): the call that charges compares
 *     the count of (S, U) — every process of the sandbox together — with
 *     the caller's rlimit, so an rlimit set in init bounds the sandbox's
 *     total. RLIMIT_NPROC (processes) is cfg->max_procs, set by sbx_limits.c.
 * Once init drops its capabilities nothing in the sandbox can raise them.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>

/* The sysctls of the sandbox's own user namespace, reached through whatever
 * procfs the calling process sees (the lookup is by the caller's user
 * namespace, not by the mount). A kernel without one (max_time_namespaces
 * before 5.6, fanotify before 5.13) skips it. */
static int sbx_quota_sysctl(const char *name, unsigned value, char *err, size_t len)
{
    char path[96], val[24];
    snprintf(path, sizeof path, "/proc/sys/user/%s", name);
    snprintf(val, sizeof val, "%u", value);
    if (sbx_util_write_file(path, val) == 0 || errno == ENOENT)
        return 0;
    return sbx_util_fail(err, len, "quota: write %u to %s", value, path);
}

int sbx_quota_apply(const sandbox_config *cfg, char *err, size_t len)
{
    const struct {
        const char *name;
        unsigned value;
    } sysctls[] = {
        {"max_inotify_instances", cfg->max_inotify_instances},
        {"max_inotify_watches", cfg->max_inotify_watches},
        {"max_fanotify_groups", 0},
        {"max_fanotify_marks", 0},
        {"max_user_namespaces", 0},
        {"max_mnt_namespaces", 0},
        {"max_pid_namespaces", 0},
        {"max_net_namespaces", 0},
        {"max_ipc_namespaces", 0},
        {"max_uts_namespaces", 0},
        {"max_cgroup_namespaces", 0},
        {"max_time_namespaces", 0},
    };
    for (size_t i = 0; i < sizeof sysctls / sizeof *sysctls; i++)
        if (sbx_quota_sysctl(sysctls[i].name, sysctls[i].value, err, len) < 0)
            return -1;
    const struct {
        int res;
        uint64_t value;
        const char *name;
    } rl[] = {
        {RLIMIT_SIGPENDING, cfg->max_sigpending, "pending signals"},
        {RLIMIT_MSGQUEUE, cfg->max_msgqueue_bytes, "message queue bytes"},
        {RLIMIT_MEMLOCK, cfg->max_memlock_bytes, "locked memory"},
    };
    for (size_t i = 0; i < sizeof rl / sizeof *rl; i++) {
        struct rlimit r = {rl[i].value, rl[i].value};
        if (setrlimit(rl[i].res, &r) < 0)
            return sbx_util_fail(err, len, "quota: rlimit %s %llu", rl[i].name,
                                 (unsigned long long)rl[i].value);
    }
    return 0;
}

void sbx_quota_describe(const sandbox_config *cfg, json_t *list)
{
    (void)cfg;
    static const char *const names[] = {"userns-max-inotify-instances",
                                        "userns-max-inotify-watches",
                                        "userns-no-fanotify",
                                        "userns-no-nested-namespaces",
                                        "rlimit-sigpending",
                                        "rlimit-msgqueue",
                                        "rlimit-memlock",
                                        NULL};
    for (const char *const *n = names; *n; n++)
        json_array_append_new(list, json_string(*n));
}
