/*
 * sbx_limits.c — resource limits: cgroups where the host lets us create
 * them (cgroup v2 memory.max/pids.max/cpu.max, or v1 memory/pids/cpuacct/cpu
 * controllers), rlimits always.
 *
 * A sandbox's cgroups are children of the cgroup the caller runs in (that is
 * the part of the hierarchy delegated to us, if any). Only the sandbox's init
 * and its descendants are moved in, so the accounting is exactly the
 * sandbox's. Without cgroups (an unprivileged caller without delegation):
 *   memory    RLIMIT_DATA (not RLIMIT_AS: JIT runtimes reserve huge ranges)
 *   processes RLIMIT_NPROC — since Linux 5.14 it is counted per user
 *             namespace, and every sandbox has a fresh one, so it is a
 *             per-sandbox limit even when sandboxes share a host uid
 *   cpu time  summed over the sandbox's process tree from /proc (walked
 *             from its init through the children files), and at the end
 *             the monitor's wait4() figure for init (sandbox.c)
 *   cpu rate  nothing: no rlimit caps a rate (RLIMIT_CPU is a per-process
 *             total), so cfg->cpus is then not enforced, and
 *             sbx_limits_describe() says so ("cpu-rate-cap-unavailable")
 * RLIMIT_NOFILE, RLIMIT_FSIZE and RLIMIT_CORE=0 apply in every case.
 */
#include "sandbox/sbx_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SBX_CG_ROOT "/sys/fs/cgroup"
#define SBX_CG_DIRLEN 1024
/* every sandbox cgroup's name: PREFIX<creator pid>-<counter> */
#define SBX_CG_PREFIX "kernelmgr-sandbox-"

struct sbx_limits {
    int version;             /* 0: no cgroups, 1, 2 */
    char mem[SBX_CG_DIRLEN]; /* "" when not available */
    char pids[SBX_CG_DIRLEN];
    char cpu[SBX_CG_DIRLEN]; /* v1 cpuacct dir, or the v2 dir */
    /* where the CPU rate cap (cfg->cpus) was written: the v2 dir, the v1
     * cpuacct dir when cpu and cpuacct share a hierarchy, else a v1 cpu
     * dir of its own; "" when not capped */
    char cpumax[SBX_CG_DIRLEN];
    uint64_t memory_bytes; /* what was written */
    unsigned max_procs;
    int view; /* sbx_limits_view(): another's cgroups, never removed */
};

static atomic_uint sbx_limits_counter;

/* The CFS period every cap uses, and the smallest quota the kernel takes. */
#define SBX_CPU_PERIOD_US 100000LL
#define SBX_CPU_MIN_QUOTA_US 1000LL

/* cfg->cpus as a quota per SBX_CPU_PERIOD_US, at least the kernel's
 * minimum; 0 when no cap is asked for. */
static long long sbx_limits_cpu_quota_us(const sandbox_config *cfg)
{
    if (!(cfg->cpus > 0))
        return 0;
    double q = cfg->cpus * (double)SBX_CPU_PERIOD_US + 0.5;
    if (q > 1e15)
        q = 1e15;
    long long us = (long long)q;
    return us < SBX_CPU_MIN_QUOTA_US ? SBX_CPU_MIN_QUOTA_US : us;
}

/* The cgroup path of process pid (0: the caller) for a v1 controller (or
 * "" for v2), from /proc/PID/cgroup. */
static int sbx_limits_pid_path(pid_t pid, const char *ctrl, char *out, size_t size)
{
    char file[64];
    if (pid > 0)
        snprintf(file, sizeof file, "/proc/%d/cgroup", (int)pid);
    else
        snprintf(file, sizeof file, "/proc/self/cgroup");
    FILE *f = fopen(file, "re");
    if (!f)
        return -1;
    char line[1024];
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        char *ctrls = c1 + 1;
        int match = 0;
        if (ctrl[0] == 0)
            match = ctrls[0] == 0;
        else
            for (char *sp, *tok = strtok_r(ctrls, ",", &sp); tok; tok = strtok_r(NULL, ",", &sp))
                if (!strcmp(tok, ctrl))
                    match = 1;
        if (match) {
            char *path = c2 + 1;
            path[strcspn(path, "\n")] = 0;
            snprintf(out, size, "%s", strcmp(path, "/") ? path : "");
            found = 0;
            break;
        }
    }
    fclose(f);
    return found;
}

/* The caller's cgroup path for a v1 controller (or "" for v2). */
static int sbx_limits_self_path(const char *ctrl, char *out, size_t size)
{
    return sbx_limits_pid_path(0, ctrl, out, size);
}

static int sbx_limits_exists(const char *dir, const char *file)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return access(p, F_OK) == 0;
}

static int sbx_limits_write(const char *dir, const char *file, const char *val)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    return sbx_util_write_file(p, val);
}

/* Reads "key N" out of a flat keyed file (memory.events, pids.events,
 * memory.oom_control). */
static long long sbx_limits_read_key(const char *dir, const char *file, const char *key)
{
    char p[PATH_MAX], line[256];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "re");
    if (!f)
        return -1;
    long long v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ' ') {
            v = atoll(line + kl + 1);
            break;
        }
    fclose(f);
    return v;
}

/* Removes empty sandbox cgroups in dir left by callers that died without
 * sandbox_destroy() (SIGKILLed kernels): their name carries the caller's
 * pid, and cgroup v1 has no way to remove them on release without touching
 * the host-wide release agent. A busy cgroup is never removed. */
static void sbx_limits_collect_stale(const char *dir)
{
    /* Once per caller process and cgroup directory: the stale ones come
     * from callers that died, and scanning a busy parent (one entry per
     * running sandbox of the host) on every start is wasted work. */
    static char done[4][SBX_CG_DIRLEN];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    int seen = 0, recorded = 0;
    /* held across the scan: no sandbox of ours is created here meanwhile */
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < 4 && !seen; i++)
        if (!strcmp(done[i], dir))
            seen = 1;
    for (size_t i = 0; i < 4 && !seen && !recorded; i++)
        if (!done[i][0]) {
            snprintf(done[i], sizeof done[i], "%s", dir);
            recorded = 1;
        }
    DIR *d = seen ? NULL : opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        int pid;
        if (sscanf(de->d_name, SBX_CG_PREFIX "%d-", &pid) != 1 || pid <= 0)
            continue;
        /* One with our own pid, seen on our first scan of dir (before we
         * created any there), is a dead earlier holder's of that pid: pids
         * are reused, and its name would collide with ours. */
        if (pid == (int)getpid() ? !recorded : (kill(pid, 0) == 0 || errno != ESRCH))
            continue;
        char p[SBX_CG_DIRLEN + 300];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        rmdir(p);
    }
    if (d)
        closedir(d);
    pthread_mutex_unlock(&mu);
}

/* Creates <controller root><own path>/<name>; "" in out on failure. */
static void sbx_limits_mkdir_v1(const char *ctrl, const char *name, char *out, size_t size)
{
    char own[SBX_CG_DIRLEN];
    out[0] = 0;
    if (sbx_limits_self_path(ctrl, own, sizeof own) < 0)
        return;
    char dir[SBX_CG_DIRLEN];
    if (snprintf(dir, sizeof dir, SBX_CG_ROOT "/%s%s", ctrl, own) >= (int)sizeof dir - 80)
        return;
    sbx_limits_collect_stale(dir);
    size_t n = strlen(dir);
    snprintf(dir + n, sizeof dir - n, "/%s", name);
    if (mkdir(dir, 0755) < 0)
        return;
    snprintf(out, size, "%s", dir);
}

sbx_limits *sbx_limits_new(const sandbox_config *cfg)
{
    sbx_limits *lim = calloc(1, sizeof *lim);
    if (!lim)
        return NULL;
    char name[64], val[32];
    snprintf(name, sizeof name, SBX_CG_PREFIX "%d-%u", (int)getpid(),
             atomic_fetch_add(&sbx_limits_counter, 1));
    struct statfs sfs;
    if (statfs(SBX_CG_ROOT, &sfs) == 0 && sfs.f_type == CGROUP2_SUPER_MAGIC) {
        char own[SBX_CG_DIRLEN], dir[SBX_CG_DIRLEN] = "";
        if (sbx_limits_self_path("", own, sizeof own) == 0 &&
            snprintf(dir, sizeof dir, SBX_CG_ROOT "%s", own) < (int)sizeof dir - 80) {
            sbx_limits_collect_stale(dir);
            size_t n = strlen(dir);
            snprintf(dir + n, sizeof dir - n, "/%s", name);
        }
        if (dir[0] && mkdir(dir, 0755) == 0) {
            lim->version = 2;
            snprintf(lim->cpu, sizeof lim->cpu, "%s", dir);
            snprintf(val, sizeof val, "%llu", (unsigned long long)cfg->memory_bytes);
            if (cfg->memory_bytes && sbx_limits_exists(dir, "memory.max") &&
                sbx_limits_write(dir, "memory.max", val) == 0) {
                sbx_limits_write(dir, "memory.swap.max", "0");
                snprintf(lim->mem, sizeof lim->mem, "%s", dir);
            }
            snprintf(val, sizeof val, "%u", cfg->max_procs);
            if (cfg->max_procs && sbx_limits_exists(dir, "pids.max") &&
                sbx_limits_write(dir, "pids.max", val) == 0)
                snprintf(lim->pids, sizeof lim->pids, "%s", dir);
            /* cpu.max exists when the parent delegates the cpu controller */
            long long quota = sbx_limits_cpu_quota_us(cfg);
            snprintf(val, sizeof val, "%lld %lld", quota, SBX_CPU_PERIOD_US);
            if (quota && sbx_limits_exists(dir, "cpu.max") &&
                sbx_limits_write(dir, "cpu.max", val) == 0)
                snprintf(lim->cpumax, sizeof lim->cpumax, "%s", dir);
        }
    } else {
        if (cfg->memory_bytes) {
            sbx_limits_mkdir_v1("memory", name, lim->mem, sizeof lim->mem);
            snprintf(val, sizeof val, "%llu", (unsigned long long)cfg->memory_bytes);
            if (lim->mem[0] && sbx_limits_write(lim->mem, "memory.limit_in_bytes", val) < 0) {
                rmdir(lim->mem);
                lim->mem[0] = 0;
            }
            /* memory+swap at the same value: no escaping the limit by swapping */
            if (lim->mem[0])
                sbx_limits_write(lim->mem, "memory.memsw.limit_in_bytes", val);
        }
        if (cfg->max_procs) {
            sbx_limits_mkdir_v1("pids", name, lim->pids, sizeof lim->pids);
            snprintf(val, sizeof val, "%u", cfg->max_procs);
            if (lim->pids[0] && sbx_limits_write(lim->pids, "pids.max", val) < 0) {
                rmdir(lim->pids);
                lim->pids[0] = 0;
            }
        }
        sbx_limits_mkdir_v1("cpuacct", name, lim->cpu, sizeof lim->cpu);
        long long quota = sbx_limits_cpu_quota_us(cfg);
        if (quota) {
            /* cpu and cpuacct are often mounted together (cpu,cpuacct) */
            if (lim->cpu[0] && sbx_limits_exists(lim->cpu, "cpu.cfs_quota_us"))
                snprintf(lim->cpumax, sizeof lim->cpumax, "%s", lim->cpu);
            else
                sbx_limits_mkdir_v1("cpu", name, lim->cpumax, sizeof lim->cpumax);
            snprintf(val, sizeof val, "%lld", quota);
            if (lim->cpumax[0] &&
                (sbx_limits_write(lim->cpumax, "cpu.cfs_period_us", "100000") < 0 ||
                 sbx_limits_write(lim->cpumax, "cpu.cfs_quota_us", val) < 0)) {
                if (strcmp(lim->cpumax, lim->cpu))
                    rmdir(lim->cpumax);
                lim->cpumax[0] = 0;
            }
        }
        if (lim->mem[0] || lim->pids[0] || lim->cpu[0] || lim->cpumax[0])
            lim->version = 1;
    }
    lim->memory_bytes = lim->mem[0] ? cfg->memory_bytes : 0;
    lim->max_procs = lim->pids[0] ? cfg->max_procs : 0;
    return lim;
}

int sbx_limits_attach(sbx_limits *lim, pid_t pid, char *err, size_t len)
{
    char val[32];
    snprintf(val, sizeof val, "%d", (int)pid);
    const char *dirs[] = {lim->mem, lim->pids, lim->cpu, lim->cpumax};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            seen |= !strcmp(dirs[i], dirs[j]);
        if (!dirs[i][0] || seen)
            continue;
        if (sbx_limits_write(dirs[i], "cgroup.procs", val) < 0)
            return sbx_util_fail(err, len, "cgroup: move %d into %s", (int)pid, dirs[i]);
    }
    return 0;
}

int sbx_limits_clone_fd(const sbx_limits *lim)
{
    if (!lim || lim->version != 2 || !lim->cpu[0])
        return -1;
    return open(lim->cpu, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
}

int sbx_limits_has_memory_cgroup(const sbx_limits *lim)
{
    return lim && lim->mem[0];
}

int sbx_limits_apply_rlimits(const sandbox_config *cfg, const sbx_limits *lim, char *err,
                             size_t len)
{
    struct {
        int res;
        uint64_t val;
        const char *name;
    } set[] = {
        {RLIMIT_CORE, 0, "core"},
        {RLIMIT_NOFILE, cfg->max_open_files, "open files"},
        {RLIMIT_FSIZE, cfg->max_file_bytes, "file size"},
        {RLIMIT_NPROC, cfg->max_procs, "processes"},
        {RLIMIT_DATA, sbx_limits_has_memory_cgroup(lim) ? 0 : cfg->memory_bytes, "memory"},
    };
    for (size_t i = 0; i < sizeof set / sizeof *set; i++) {
        if (set[i].val == 0 && set[i].res != RLIMIT_CORE)
            continue;
        struct rlimit r = {set[i].val, set[i].val};
        if (setrlimit(set[i].res, &r) < 0)
            return sbx_util_fail(err, len, "rlimit %s", set[i].name);
    }
    return 0;
}

long long sbx_limits_oom_kills(const sbx_limits *lim)
{
    if (!lim || !lim->mem[0])
        return -1;
    return lim->version == 2 ? sbx_limits_read_key(lim->mem, "memory.events", "oom_kill")
                             : sbx_limits_read_key(lim->mem, "memory.oom_control", "oom_kill");
}

const char *sbx_limits_hit(sbx_limits *lim, const sandbox_config *cfg, int wait_status,
                           long long oom_base, char *buf, size_t size)
{
    char n[32];
    /* A shell reports a child killed by SIGXFSZ as exit code 128+SIGXFSZ. */
    if ((WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGXFSZ) ||
        (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 128 + SIGXFSZ)) {
        snprintf(buf, size, "file size limit exceeded (limit %s)",
                 sbx_util_bytes(cfg->max_file_bytes, n, sizeof n));
        return buf;
    }
    int failed = WIFSIGNALED(wait_status) || (WIFEXITED(wait_status) && WEXITSTATUS(wait_status));
    if (!lim || !failed)
        return NULL;
    if (lim->mem[0]) {
        long long ooms = lim->version == 2
                             ? sbx_limits_read_key(lim->mem, "memory.events", "oom_kill")
                             : sbx_limits_read_key(lim->mem, "memory.oom_control", "oom_kill");
        if (ooms > (oom_base > 0 ? oom_base : 0)) {
            snprintf(buf, size, "out of memory (limit %s)",
                     sbx_util_bytes(lim->memory_bytes, n, sizeof n));
            return buf;
        }
    }
    if (lim->pids[0] && sbx_limits_read_key(lim->pids, "pids.events", "max") > 0) {
        snprintf(buf, size, "process limit reached (limit %u)", lim->max_procs);
        return buf;
    }
    return NULL;
}

static uint64_t sbx_limits_read_u64(const char *dir, const char *file)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "re");
    unsigned long long v = 0;
    if (f) {
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

long long sandbox_memory_cgroup_usage(pid_t pid)
{
    struct statfs sfs;
    int v2 = statfs(SBX_CG_ROOT, &sfs) == 0 && sfs.f_type == CGROUP2_SUPER_MAGIC;
    char path[SBX_CG_DIRLEN], dir[SBX_CG_DIRLEN + 32];
    if (pid <= 0 || sbx_limits_pid_path(pid, v2 ? "" : "memory", path, sizeof path) < 0)
        return -1;
    const char *leaf = strrchr(path, '/');
    if (!leaf || strncmp(leaf + 1, SBX_CG_PREFIX, strlen(SBX_CG_PREFIX)))
        return -1; /* not in a sandbox's cgroup */
    char own[SBX_CG_DIRLEN];
    if (sbx_limits_self_path(v2 ? "" : "memory", own, sizeof own) == 0 && !strcmp(own, path))
        return -1; /* the caller's own: a caller that itself runs in a sandbox */
    snprintf(dir, sizeof dir, SBX_CG_ROOT "%s%s", v2 ? "" : "/memory", path);
    const char *file = v2 ? "memory.current" : "memory.usage_in_bytes";
    if (!sbx_limits_exists(dir, file))
        return -1; /* a v2 sandbox cgroup without the memory controller */
    return (long long)sbx_limits_read_u64(dir, file);
}

typedef struct sbx_limits_pids {
    int *v;
    size_t n, cap;
} sbx_limits_pids;

/* Bounds the walk even if pid reuse during it ever produced a cycle. */
#define SBX_LIMITS_MAX_TREE 65536

static void sbx_limits_push(sbx_limits_pids *ps, int pid)
{
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 64;
        if (cap > SBX_LIMITS_MAX_TREE)
            return;
        int *v = realloc(ps->v, cap * sizeof *v);
        if (!v)
            return;
        ps->v = v;
        ps->cap = cap;
    }
    ps->v[ps->n++] = pid;
}

/* utime + stime + cutime + cstime of pid in clock ticks, and its number of
 * threads; -1 when it is gone. */
static long long sbx_limits_proc_ticks(int pid, long *threads)
{
    char p[64], buf[1024];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0)
        return -1;
    buf[got] = 0;
    char *rp = strrchr(buf, ')');
    if (!rp)
        return -1;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt
     * majflt cmajflt utime stime cutime cstime priority nice num_threads */
    unsigned long long ut, st, cut, cst;
    if (sscanf(rp + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %llu %llu %*d %*d %ld", &ut,
               &st, &cut, &cst, threads) != 5)
        return -1;
    return (long long)(ut + st + cut + cst);
}

/* Appends the pids listed in a /proc/.../children file. */
static void sbx_limits_read_children(const char *path, sbx_limits_pids *ps)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[4096];
    int cur = 0, in = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] >= '0' && buf[i] <= '9') {
                cur = cur * 10 + (buf[i] - '0');
                in = 1;
            } else if (in) {
                sbx_limits_push(ps, cur);
                cur = in = 0;
            }
        }
    if (in)
        sbx_limits_push(ps, cur);
    close(fd);
}

/* Without cgroups: every live process of the tree under root, with the time
 * of the children it reaped (cutime/cstime), covers everything the tree ever
 * ran that is not still a zombie of some dead parent (orphans are
 * reparented to the sandbox's init, the root). Children are found through
 * /proc/PID/task/TID/children, so the cost is a few system calls per
 * process of the sandbox, whatever runs on the host. */
static uint64_t sbx_limits_proc_tree_ns(pid_t root)
{
    sbx_limits_pids ps = {NULL, 0, 0};
    unsigned long long ticks = 0;
    sbx_limits_push(&ps, root);
    for (size_t i = 0; i < ps.n; i++) {
        int pid = ps.v[i];
        long threads = 1;
        long long t = sbx_limits_proc_ticks(pid, &threads);
        if (t < 0)
            continue;
        ticks += (unsigned long long)t;
        char p[96];
        if (threads <= 1) {
            snprintf(p, sizeof p, "/proc/%d/task/%d/children", pid, pid);
            sbx_limits_read_children(p, &ps);
            continue;
        }
        snprintf(p, sizeof p, "/proc/%d/task", pid);
        DIR *d = opendir(p);
        if (!d)
            continue;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] < '0' || de->d_name[0] > '9')
                continue;
            snprintf(p, sizeof p, "/proc/%d/task/%.16s/children", pid, de->d_name);
            sbx_limits_read_children(p, &ps);
        }
        closedir(d);
    }
    free(ps.v);
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? ticks * (1000000000ULL / (unsigned long long)hz) : 0;
}

int sbx_limits_has_cpu_cgroup(const sbx_limits *lim)
{
    return lim && lim->cpu[0];
}

int sbx_limits_cpu_capped(const sbx_limits *lim)
{
    return lim && lim->cpumax[0];
}

uint64_t sbx_limits_cpu_ns(sbx_limits *lim, pid_t root_pid)
{
    if (lim && lim->cpu[0]) {
        if (lim->version == 1)
            return sbx_limits_read_u64(lim->cpu, "cpuacct.usage");
        long long us = sbx_limits_read_key(lim->cpu, "cpu.stat", "usage_usec");
        if (us >= 0)
            return (uint64_t)us * 1000;
    }
    return root_pid > 0 ? sbx_limits_proc_tree_ns(root_pid) : 0;
}

void sbx_limits_describe(const sandbox_config *cfg, json_t *list)
{
    sbx_limits *lim = sbx_limits_new(cfg);
    char name[64];
    const char *v = lim && lim->version == 2 ? "cgroup-v2" : "cgroup-v1";
    if (lim && lim->mem[0]) {
        snprintf(name, sizeof name, "%s-memory", v);
        json_array_append_new(list, json_string(name));
    } else if (cfg->memory_bytes) {
        json_array_append_new(list, json_string("rlimit-data"));
    }
    if (lim && lim->pids[0]) {
        snprintf(name, sizeof name, "%s-pids", v);
        json_array_append_new(list, json_string(name));
    }
    if (cfg->max_procs)
        json_array_append_new(list, json_string("rlimit-nproc"));
    if (lim && lim->cpu[0]) {
        snprintf(name, sizeof name, "%s-cpu-accounting", v);
        json_array_append_new(list, json_string(name));
    }
    /* a rate cap asked for is either enforced or said not to be */
    if (lim && lim->cpumax[0]) {
        snprintf(name, sizeof name, "%s-cpu-max", v);
        json_array_append_new(list, json_string(name));
    } else if (cfg->cpus > 0) {
        json_array_append_new(list, json_string("cpu-rate-cap-unavailable"));
    }
    json_array_append_new(list, json_string("rlimit-nofile"));
    json_array_append_new(list, json_string("rlimit-fsize"));
    json_array_append_new(list, json_string("rlimit-core-0"));
    sbx_limits_destroy(&lim);
}

/* SIGKILLs whatever is still in dir and removes it, waiting briefly for
 * dying processes to leave (about 2 s at most). The first retries come
 * fast: processes killed a moment ago are usually gone within a
 * millisecond, and a kernel's shutdown (what `kernelmgr run` waits for
 * before it exits) should not pay a fixed 10 ms. */
static void sbx_limits_remove(const char *dir)
{
    long wait_ns = 500 * 1000;
    for (int attempt = 0; attempt < 220; attempt++) {
        if (rmdir(dir) == 0 || errno == ENOENT)
            return;
        if (errno != EBUSY)
            return;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/cgroup.procs", dir);
        FILE *f = fopen(p, "re");
        if (f) {
            int pid;
            while (fscanf(f, "%d", &pid) == 1)
                kill(pid, SIGKILL);
            fclose(f);
        }
        struct timespec ts = {0, wait_ns};
        nanosleep(&ts, NULL);
        if (wait_ns < 10 * 1000 * 1000)
            wait_ns *= 2;
    }
}

void sbx_limits_destroy(sbx_limits **plim)
{
    if (!plim || !*plim)
        return;
    sbx_limits *lim = *plim;
    if (lim->view) {
        free(lim);
        *plim = NULL;
        return;
    }
    if (lim->mem[0])
        sbx_limits_remove(lim->mem);
    if (lim->pids[0] && strcmp(lim->pids, lim->mem))
        sbx_limits_remove(lim->pids);
    if (lim->cpu[0] && strcmp(lim->cpu, lim->mem) && strcmp(lim->cpu, lim->pids))
        sbx_limits_remove(lim->cpu);
    if (lim->cpumax[0] && strcmp(lim->cpumax, lim->mem) && strcmp(lim->cpumax, lim->pids) &&
        strcmp(lim->cpumax, lim->cpu))
        sbx_limits_remove(lim->cpumax);
    free(lim);
    *plim = NULL;
}

/* The v1 controller ctrl's (v2: "") directory of a sandbox's cgroup that
 * pid is in, into out; "" when it is not in one below the caller's own. */
static void sbx_limits_view_dir(pid_t pid, int v2, const char *ctrl, char *out, size_t size)
{
    char path[SBX_CG_DIRLEN], own[SBX_CG_DIRLEN];
    out[0] = 0;
    if (sbx_limits_pid_path(pid, v2 ? "" : ctrl, path, sizeof path) < 0)
        return;
    const char *leaf = strrchr(path, '/');
    if (!leaf || strncmp(leaf + 1, SBX_CG_PREFIX, strlen(SBX_CG_PREFIX)) || strstr(path, "/.."))
        return;
    if (sbx_limits_self_path(v2 ? "" : ctrl, own, sizeof own) == 0 && !strcmp(own, path))
        return;
    int k = snprintf(out, size, SBX_CG_ROOT "%s%s%s", v2 ? "" : "/", v2 ? "" : ctrl, path);
    if (k < 0 || (size_t)k >= size)
        out[0] = 0;
}

sbx_limits *sbx_limits_view(pid_t pid, const sandbox_config *cfg)
{
    struct statfs sfs;
    int v2 = statfs(SBX_CG_ROOT, &sfs) == 0 && sfs.f_type == CGROUP2_SUPER_MAGIC;
    sbx_limits *lim = calloc(1, sizeof *lim);
    if (!lim)
        return NULL;
    lim->view = 1;
    lim->version = v2 ? 2 : 1;
    lim->memory_bytes = cfg->memory_bytes;
    lim->max_procs = cfg->max_procs;
    sbx_limits_view_dir(pid, v2, "memory", lim->mem, sizeof lim->mem);
    if (lim->mem[0] && !sbx_limits_exists(lim->mem, v2 ? "memory.events" : "memory.oom_control"))
        lim->mem[0] = 0;
    sbx_limits_view_dir(pid, v2, "pids", lim->pids, sizeof lim->pids);
    if (lim->pids[0] && !sbx_limits_exists(lim->pids, "pids.events"))
        lim->pids[0] = 0;
    /* the rate cap the holder wrote, when there is one */
    char cpu[SBX_CG_DIRLEN - 64];
    sbx_limits_view_dir(pid, v2, "cpu", cpu, sizeof cpu);
    if (cpu[0]) {
        char p[PATH_MAX], q[64] = "";
        snprintf(p, sizeof p, "%s/%s", cpu, v2 ? "cpu.max" : "cpu.cfs_quota_us");
        FILE *f = fopen(p, "re");
        if (f) {
            if (!fgets(q, sizeof q, f))
                q[0] = 0;
            fclose(f);
        }
        if (q[0] && strncmp(q, "max", 3) && strncmp(q, "-1", 2))
            snprintf(lim->cpumax, sizeof lim->cpumax, "%s", cpu);
    }
    if (!lim->mem[0] && !lim->pids[0] && !lim->cpumax[0]) {
        free(lim);
        return NULL;
    }
    return lim;
}
