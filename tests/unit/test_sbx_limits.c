/*
 * test_sbx_limits.c — the sandbox's resource limits (sbx_limits.c) for
 * real: rlimits set in a child and read back; a hit limit said with its
 * value, from real wait statuses; and, where the host lets this process
 * create cgroups (root, or a delegated v2 subtree), the cgroups themselves
 * enforce: a child over the memory limit is OOM-killed and the reason names
 * the limit, a fork past the process limit fails, the CPU a child burns is
 * accounted, and destroying the limits ends what is left in them and
 * removes their directories. Without cgroups those tests are skipped, and
 * sbx_limits_describe() must then say that the rlimit fallbacks are used.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "sandbox/sandbox.h"
#include "sandbox/sbx_internal.h"

#define MIB (1024ull * 1024)

/* The status of a child that ran fn (its return value is the exit code). */
static int status_of(int (*fn)(void))
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn());
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

static int exit_1(void)
{
    return 1;
}

static int exit_0(void)
{
    return 0;
}

/* A shell reports a child killed by SIGXFSZ as exit status 128 + SIGXFSZ. */
static int exit_xfsz(void)
{
    return 128 + SIGXFSZ;
}

static int raise_xfsz(void)
{
    struct rlimit r = {0, 0};
    setrlimit(RLIMIT_CORE, &r);
    signal(SIGXFSZ, SIG_DFL);
    raise(SIGXFSZ);
    return 0;
}

static void test_hit_says_the_file_size_limit_and_its_value(void **state)
{
    (void)state;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.max_file_bytes = 3 * MIB;
    char buf[128];
    const char *want = "file size limit exceeded (limit 3 MiB)";
    const char *r = sbx_limits_hit(NULL, &cfg, status_of(raise_xfsz), 0, buf, sizeof buf);
    assert_non_null(r);
    assert_string_equal(r, want);
    r = sbx_limits_hit(NULL, &cfg, status_of(exit_xfsz), 0, buf, sizeof buf);
    assert_non_null(r);
    assert_string_equal(r, want);
    /* an ordinary failure or success is no limit */
    assert_null(sbx_limits_hit(NULL, &cfg, status_of(exit_1), 0, buf, sizeof buf));
    assert_null(sbx_limits_hit(NULL, &cfg, status_of(exit_0), 0, buf, sizeof buf));
}

static sandbox_config rl_cfg;

/* In a child: the rlimits after sbx_limits_apply_rlimits(rl_cfg, no
 * cgroups); 0 when each is what was asked, else the number of the first
 * that is not. */
static int check_rlimits(void)
{
    struct rlimit before_data, r;
    getrlimit(RLIMIT_DATA, &before_data);
    char err[256];
    if (sbx_limits_apply_rlimits(&rl_cfg, NULL, err, sizeof err))
        return 10;
    const struct {
        int res;
        rlim_t want;
    } want[] = {
        {RLIMIT_CORE, 0},
        {RLIMIT_NOFILE, rl_cfg.max_open_files},
        {RLIMIT_FSIZE, rl_cfg.max_file_bytes},
        {RLIMIT_NPROC, rl_cfg.max_procs},
        /* no memory cgroup: the memory limit is RLIMIT_DATA; 0: untouched */
        {RLIMIT_DATA, rl_cfg.memory_bytes ? rl_cfg.memory_bytes : before_data.rlim_max},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        if (getrlimit(want[i].res, &r) || r.rlim_cur != want[i].want || r.rlim_max != want[i].want)
            return 20 + (int)i;
    }
    /* the file size limit is enforced: a write past it fails */
    signal(SIGXFSZ, SIG_IGN);
    char path[] = "/tmp/test_sbx_limitsXXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return 30;
    unlink(path);
    int rc = 0;
    if (ftruncate(fd, (off_t)rl_cfg.max_file_bytes) || lseek(fd, 0, SEEK_END) < 0)
        rc = 31;
    else if (write(fd, "x", 1) != -1 || errno != EFBIG)
        rc = 32;
    close(fd);
    return rc;
}

static char self_exe[PATH_MAX];

/* The status of this binary re-executed to check the rlimits of rl_cfg in
 * a process of its own (under valgrind, which keeps RLIMIT_NOFILE and
 * RLIMIT_DATA to itself, the re-executed binary runs natively). */
static int rlimits_child_status(void)
{
    char a[4][32];
    snprintf(a[0], sizeof a[0], "%u", rl_cfg.max_open_files);
    snprintf(a[1], sizeof a[1], "%llu", (unsigned long long)rl_cfg.max_file_bytes);
    snprintf(a[2], sizeof a[2], "%u", rl_cfg.max_procs);
    snprintf(a[3], sizeof a[3], "%llu", (unsigned long long)rl_cfg.memory_bytes);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execl(self_exe, self_exe, "--rlimits-child", a[0], a[1], a[2], a[3], (char *)NULL);
        _exit(98);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

static void test_rlimits_are_set_and_enforced(void **state)
{
    (void)state;
    sandbox_config_defaults(&rl_cfg);
    rl_cfg.max_open_files = 77;
    rl_cfg.max_file_bytes = 3 * MIB;
    rl_cfg.max_procs = 4000;
    rl_cfg.memory_bytes = 768 * MIB;
#if defined(__SANITIZE_ADDRESS__)
    rl_cfg.memory_bytes = 0; /* ASan's shadow mappings alone exceed any RLIMIT_DATA */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    rl_cfg.memory_bytes = 0;
#endif
#endif
    int st = rlimits_child_status();
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    /* a limit of 0 is "not set" (the core size excepted: always 0) */
    rl_cfg.memory_bytes = 0;
    st = rlimits_child_status();
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* ---------------------------------------------------------------- cgroups */

/* A child that waits until it was moved into lim's cgroups, then runs fn;
 * its pid. */
static pid_t spawn_in(sbx_limits *lim, int (*fn)(void))
{
    int go[2];
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(go[1]);
        char c;
        if (read(go[0], &c, 1) != 1)
            _exit(99);
        _exit(fn());
    }
    close(go[0]);
    char err[256] = "";
    int rc = sbx_limits_attach(lim, pid, err, sizeof err);
    if (rc)
        print_message("attach: %s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(write(go[1], "g", 1), 1);
    close(go[1]);
    return pid;
}

static int wait_for(pid_t pid)
{
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return st;
}

/* lim with cgroups for cfg, or the test skipped when the host gives none. */
static sbx_limits *cgroups_or_skip(const sandbox_config *cfg, int (*has)(const sbx_limits *))
{
    sbx_limits *lim = sbx_limits_new(cfg);
    assert_non_null(lim);
    if (!has(lim)) {
        sbx_limits_destroy(&lim);
        print_message("no cgroup of that kind can be created here (unprivileged, no "
                      "delegation): skipped\n");
        skip();
    }
    return lim;
}

/* Touches memory until the kernel kills it (up to 1 GiB); the chunks stay
 * reachable, so no compiler drops the unused allocations. */
static char *eaten[128];
static int eat_memory(void)
{
    for (size_t i = 0; i < sizeof eaten / sizeof *eaten; i++) {
        eaten[i] = malloc(8 * MIB);
        if (!eaten[i])
            return 3;
        memset(eaten[i], (int)i + 1, 8 * MIB);
    }
    volatile char sum = 0;
    for (size_t i = 0; i < sizeof eaten / sizeof *eaten; i++)
        sum = (char)(sum + eaten[i][i]);
    return sum == 0 ? 5 : 4; /* never killed: the limit is not enforced */
}

static void test_memory_cgroup_oom_kills_and_says_its_limit(void **state)
{
    (void)state;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.memory_bytes = 64 * MIB;
    sbx_limits *lim = cgroups_or_skip(&cfg, sbx_limits_has_memory_cgroup);
    long long base = sbx_limits_oom_kills(lim);
    assert_int_equal(base, 0);
    int st = wait_for(spawn_in(lim, eat_memory));
    if (!WIFSIGNALED(st))
        print_message("exit status %d (4: never killed)\n", WEXITSTATUS(st));
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    assert_true(sbx_limits_oom_kills(lim) > base);
    char buf[128];
    const char *r = sbx_limits_hit(lim, &cfg, st, base, buf, sizeof buf);
    assert_non_null(r);
    assert_string_equal(r, "out of memory (limit 64 MiB)");
    /* a kill counted before (base) is not this one's */
    assert_null(sbx_limits_hit(lim, &cfg, st, sbx_limits_oom_kills(lim), buf, sizeof buf));
    sbx_limits_destroy(&lim);
    assert_null(lim);
}

/* Forks children that wait, until a fork fails; exits 1 when it failed with
 * EAGAIN (the process limit) before 64 children, else 2. The children end
 * when it does (their pipe closes). */
static int fork_until_refused(void)
{
    int hold[2];
    if (pipe(hold))
        return 5;
    for (int n = 0; n < 64; n++) {
        pid_t p = fork();
        if (p < 0)
            return errno == EAGAIN ? 1 : 3;
        if (p == 0) {
            close(hold[1]);
            char c;
            while (read(hold[0], &c, 1) < 0 && errno == EINTR) {
            }
            _exit(0);
        }
    }
    return 2;
}

/* Whether a pids cgroup can be made here (sbx_limits.h has no accessor:
 * describe lists one when sbx_limits_new made it). */
static int has_pids_cgroup(const sbx_limits *lim)
{
    (void)lim;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.max_procs = 16;
    json_t *list = json_array();
    sbx_limits_describe(&cfg, list);
    int found = 0;
    size_t i;
    json_t *v;
    json_array_foreach(list, i, v)
    {
        const char *s = json_string_value(v);
        found |= s && strstr(s, "-pids") != NULL;
    }
    json_decref(list);
    return found;
}

static void test_pids_cgroup_refuses_forks_and_says_its_limit(void **state)
{
    (void)state;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.max_procs = 16;
    sbx_limits *lim = cgroups_or_skip(&cfg, has_pids_cgroup);
    int st = wait_for(spawn_in(lim, fork_until_refused));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    char buf[128];
    const char *r = sbx_limits_hit(lim, &cfg, st, 0, buf, sizeof buf);
    assert_non_null(r);
    assert_string_equal(r, "process limit reached (limit 16)");
    sbx_limits_destroy(&lim);
}

/* CLOCK_PROCESS_CPUTIME_ID in ns. */
static uint64_t own_cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Burns 100 ms of CPU time from now on (spawn_in runs it once attached:
 * what the child used before, after its fork, is not the cgroup's; under
 * valgrind that can be milliseconds). */
static int burn_cpu(void)
{
    uint64_t until = own_cpu_ns() + 100ull * 1000 * 1000;
    volatile unsigned long x = 0;
    do {
        for (int i = 0; i < 100000; i++)
            x += (unsigned long)i;
    } while (own_cpu_ns() < until);
    return x == 0; /* 0: x is used, so the loop is not optimised away */
}

static void test_cpu_cgroup_accounts_what_a_child_burns(void **state)
{
    (void)state;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.cpus = 0.5;
    sbx_limits *lim = cgroups_or_skip(&cfg, sbx_limits_has_cpu_cgroup);
    uint64_t before = sbx_limits_cpu_ns(lim, 0);
    int st = wait_for(spawn_in(lim, burn_cpu));
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    uint64_t used = sbx_limits_cpu_ns(lim, 0) - before;
    if (used < 100ull * 1000 * 1000)
        print_message("accounted %llu ns\n", (unsigned long long)used);
    assert_true(used >= 100ull * 1000 * 1000);
    /* the rate cap asked for is in place, or said to be unavailable */
    json_t *list = json_array();
    sbx_limits_describe(&cfg, list);
    char *s = json_dumps(list, JSON_COMPACT);
    assert_true(strstr(s, "-cpu-max") != NULL || strstr(s, "cpu-rate-cap-unavailable") != NULL);
    assert_int_equal(strstr(s, "-cpu-max") != NULL, sbx_limits_cpu_capped(lim));
    free(s);
    json_decref(list);
    sbx_limits_destroy(&lim);
}

static int sleep_long(void)
{
    for (;;)
        pause();
    return 0;
}

/* The directory of pid's cgroup of the v1 controller ctrl (v2: ctrl ""),
 * into out; 0 or -1. */
static int cgroup_dir_of(pid_t pid, const char *ctrl, char *out, size_t size)
{
    char p[64], line[1024];
    snprintf(p, sizeof p, "/proc/%d/cgroup", (int)pid);
    FILE *f = fopen(p, "re");
    assert_non_null(f);
    int rc = -1;
    while (rc && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        if (!strcmp(c1 + 1, ctrl) || (!*ctrl && c1[1] == 0)) {
            snprintf(out, size, "/sys/fs/cgroup%s%s%s", *ctrl ? "/" : "", ctrl, c2 + 1);
            rc = 0;
        }
    }
    fclose(f);
    return rc;
}

static void test_destroy_ends_what_is_left_and_removes_the_cgroups(void **state)
{
    (void)state;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.memory_bytes = 64 * MIB;
    sbx_limits *lim = cgroups_or_skip(&cfg, sbx_limits_has_memory_cgroup);
    pid_t pid = spawn_in(lim, sleep_long);
    char dir[1100];
    struct stat sb;
    /* once attached, the child's memory cgroup is the sandbox's (v1 or v2) */
    int ok = cgroup_dir_of(pid, "memory", dir, sizeof dir) == 0 ||
             cgroup_dir_of(pid, "", dir, sizeof dir) == 0;
    assert_true(ok);
    assert_non_null(strstr(dir, "kernelmgr-sandbox-"));
    assert_int_equal(stat(dir, &sb), 0);
    sbx_limits_destroy(&lim);
    int st = wait_for(pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGKILL);
    assert_int_equal(stat(dir, &sb), -1);
    assert_int_equal(errno, ENOENT);
}

/* What describe says matches what sbx_limits_new made: a cgroup, or the
 * rlimit that stands in for it. */
static void test_describe_names_each_limit_and_its_mechanism(void **state)
{
    (void)state;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.memory_bytes = 256 * MIB;
    cfg.max_procs = 64;
    cfg.cpus = 1.5;
    sbx_limits *lim = sbx_limits_new(&cfg);
    assert_non_null(lim);
    json_t *list = json_array();
    sbx_limits_describe(&cfg, list);
    char *s = json_dumps(list, JSON_COMPACT);
    for (const char *const *w = (const char *const[]){"rlimit-nofile", "rlimit-fsize",
                                                      "rlimit-core-0", "rlimit-nproc", NULL};
         *w; w++) {
        if (!strstr(s, *w))
            print_message("%s not in %s\n", *w, s);
        assert_non_null(strstr(s, *w));
    }
    if (sbx_limits_has_memory_cgroup(lim))
        assert_non_null(strstr(s, "-memory\""));
    else
        assert_non_null(strstr(s, "\"rlimit-data\""));
    if (sbx_limits_cpu_capped(lim))
        assert_non_null(strstr(s, "-cpu-max\""));
    else
        assert_non_null(strstr(s, "\"cpu-rate-cap-unavailable\""));
    free(s);
    json_decref(list);
    sbx_limits_destroy(&lim);
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "--rlimits-child")) {
        sandbox_config_defaults(&rl_cfg);
        rl_cfg.max_open_files = (unsigned)strtoul(argv[2], NULL, 10);
        rl_cfg.max_file_bytes = strtoull(argv[3], NULL, 10);
        rl_cfg.max_procs = (unsigned)strtoul(argv[4], NULL, 10);
        rl_cfg.memory_bytes = strtoull(argv[5], NULL, 10);
        return check_rlimits();
    }
    if (!realpath("/proc/self/exe", self_exe))
        snprintf(self_exe, sizeof self_exe, "%s", argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_says_the_file_size_limit_and_its_value),
        cmocka_unit_test(test_rlimits_are_set_and_enforced),
        cmocka_unit_test(test_memory_cgroup_oom_kills_and_says_its_limit),
        cmocka_unit_test(test_pids_cgroup_refuses_forks_and_says_its_limit),
        cmocka_unit_test(test_cpu_cgroup_accounts_what_a_child_burns),
        cmocka_unit_test(test_destroy_ends_what_is_left_and_removes_the_cgroups),
        cmocka_unit_test(test_describe_names_each_limit_and_its_mechanism),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
