/*
 * test_sbx_mount.c — the sandbox's filesystem (sbx_mount.c) built for real
 * in namespaces of the test's own: sbx_mount_prepare() clones the host
 * trees, sbx_mount_build() assembles the tmpfs root, pivots into it and
 * makes it read-only; then probes inside report what a worker would see
 * (what is writable, what is absent, the sizes and mount flags, the
 * generated /etc) and the test checks each against the plan. The refusals
 * of a bad plan (a relative or missing read-only path, a missing
 * workspace) name the path.
 *
 * The namespaces are made by a child that runs this binary again
 * (`--mount-child CASE WS RO`): under valgrind, which runs only the test
 * itself (children are not traced), the new mount syscalls (open_tree,
 * move_mount, mount_setattr) reach the kernel. The child makes a user
 * namespace (root inside mapped to nobody, 65534, for the generated
 * passwd), a mount and a pid namespace, and its own child, PID 1 there,
 * does the work. Where user namespaces are not allowed the tests skip,
 * saying why.
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
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#include "sandbox/sandbox.h"
#include "sandbox/sbx_internal.h"

#define TMP_BYTES (8ull << 20)
#define SKIP_RC 77

static char self_exe[PATH_MAX];

/* ---- the child: namespaces, the plan, the probes ------------------------- */

__attribute__((format(printf, 2, 3))) static void say(const char *key, const char *fmt, ...)
{
    char v[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v, sizeof v, fmt, ap);
    va_end(ap);
    printf("%s %s\n", key, v);
}

/* errno of the call, 0 when it succeeded. */
static int probe_errno(int rc)
{
    return rc < 0 ? errno : 0;
}

static int create_file(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    int rc = write(fd, "x", 1) == 1 ? 0 : -1;
    close(fd);
    return rc;
}

/* Opens path for writing (nothing is written): 0, or -1 with errno. */
static int open_write(const char *path)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

static void say_errno(const char *key, int rc)
{
    say(key, "%s", strerrorname_np(probe_errno(rc)) ?: "0");
}

static void say_file(const char *key, const char *path)
{
    char buf[256] = "";
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        say(key, "<%s>", strerrorname_np(errno));
        return;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    buf[n > 0 ? n : 0] = 0;
    for (char *c = buf; *c; c++)
        if (*c == '\n')
            *c = '|';
    say(key, "%s", buf);
}

static void say_flags(const char *key, const char *path)
{
    struct statvfs sv;
    if (statvfs(path, &sv) < 0) {
        say(key, "<%s>", strerrorname_np(errno));
        return;
    }
    say(key, "%s%s%s", sv.f_flag & ST_RDONLY ? "ro" : "rw", sv.f_flag & ST_NOSUID ? ",nosuid" : "",
        sv.f_flag & ST_NODEV ? ",nodev" : "");
}

static int run_true(void)
{
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(126);
    }
    int st;
    if (p < 0 || waitpid(p, &st, 0) < 0)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* PID 1 of the new namespaces: prepare, build, probe. */
static int mount_pid1(const char *which, const char *ws, const char *ro)
{
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.tmp_bytes = TMP_BYTES;
    cfg.workspace = ws;
    char frozen[PATH_MAX], missing[PATH_MAX + 16];
    snprintf(frozen, sizeof frozen, "%s/frozen", ws);
    snprintf(missing, sizeof missing, "%s/gone", ro);
    const char *ro_plain[] = {ro, frozen, NULL};
    const char *ro_relative[] = {"relative/dir", NULL};
    const char *ro_missing[] = {missing, NULL};
    int build = 1;
    if (!strcmp(which, "plain"))
        cfg.ro_paths = ro_plain;
    else if (!strcmp(which, "network"))
        cfg.network = 1;
    else if (!strcmp(which, "relative"))
        cfg.ro_paths = ro_relative, build = 0;
    else if (!strcmp(which, "missing-ro"))
        cfg.ro_paths = ro_missing, build = 0;
    else if (!strcmp(which, "missing-ws"))
        cfg.workspace = missing, build = 0;
    else
        return 2;

    sbx_ids ids = {.uid = 65534, .gid = 65534};
    char err[512] = "";
    sbx_mount_plan *plan = sbx_mount_prepare(&cfg, &ids, -1, err, sizeof err);
    if (!plan) {
        say("prepare", "%s", err);
        return 0;
    }
    if (!build) {
        say("prepare", "ok");
        sbx_mount_plan_free(&plan);
        return 0;
    }
    int rc = sbx_mount_build(plan, &cfg, &ids, err, sizeof err);
    sbx_mount_plan_free(&plan);
    if (rc < 0) {
        say("build", "%s", err);
        return 0;
    }
    say("build", "ok");

    char cwd[PATH_MAX] = "";
    say("cwd", "%s", getcwd(cwd, sizeof cwd) ? cwd : "<none>");
    say("pid", "%d", (int)getpid());
    say_errno("root_mkdir", mkdir("/kmtest", 0755));
    say_errno("usr_create", create_file("/usr/kmtest"));
    say_errno("etc_create", create_file("/etc/kmtest"));
    say_errno("tmp_create", create_file("/tmp/kmtest"));
    say_errno("shm_create", create_file("/dev/shm/kmtest"));
    say_errno("dev_create", create_file("/dev/kmtest"));
    say_errno("devnull_write", create_file("/dev/null"));
    say_errno("ws_create", create_file("from-sandbox"));
    char path[PATH_MAX + 32];
    if (!strcmp(which, "plain")) {
        snprintf(path, sizeof path, "%s/data", ro);
        say_file("ro_read", path);
        snprintf(path, sizeof path, "%s/new", ro);
        say_errno("ro_create", create_file(path));
        say_errno("frozen_create", create_file("frozen/new"));
    }
    say_errno("shadow", access("/etc/shadow", F_OK));
    say_errno("sys", access("/sys/kernel", F_OK));
    say_errno("dev_sda", access("/dev/sda", F_OK));
    say_errno("self_exe", access(self_exe, F_OK));
    say_errno("sh_x", access("/bin/sh", X_OK));
    say("run_true", "%d", run_true());
    say_errno("proc_sys_write", open_write("/proc/sys/kernel/hostname"));
    say_file("passwd", "/etc/passwd");
    say_file("group", "/etc/group");
    say_file("hosts", "/etc/hosts");
    say_file("hostname", "/etc/hostname");
    say_file("resolv", "/etc/resolv.conf");
    char link[64] = "";
    ssize_t n = readlink("/etc/mtab", link, sizeof link - 1);
    say("mtab", "%s", n > 0 ? (link[n] = 0, link) : "<none>");
    n = readlink("/var/tmp", link, sizeof link - 1);
    say("var_tmp", "%s", n > 0 ? (link[n] = 0, link) : "<none>");
    say_flags("flags_root", "/");
    say_flags("flags_usr", "/usr");
    say_flags("flags_ws", ".");
    say_flags("flags_tmp", "/tmp");
    struct statvfs sv;
    say("tmp_bytes", "%llu",
        statvfs("/tmp", &sv) == 0 ? (unsigned long long)sv.f_blocks * sv.f_frsize : 0ull);
    return 0;
}

static int write_text(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static int mount_child(const char *which, const char *ws, const char *ro)
{
    uid_t uid = geteuid();
    gid_t gid = getegid();
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID) < 0) {
        say("skip", "user namespaces are not available here: unshare: %s", strerror(errno));
        return SKIP_RC;
    }
    char map[64];
    if (write_text("/proc/self/setgroups", "deny") < 0)
        return 3;
    snprintf(map, sizeof map, "65534 %u 1", (unsigned)uid);
    if (write_text("/proc/self/uid_map", map) < 0)
        return 4;
    snprintf(map, sizeof map, "65534 %u 1", (unsigned)gid);
    if (write_text("/proc/self/gid_map", map) < 0)
        return 5;
    fflush(stdout);
    pid_t p = fork();
    if (p < 0)
        return 6;
    if (p == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int rc = mount_pid1(which, ws, ro);
        fflush(stdout);
        _exit(rc);
    }
    int st;
    if (waitpid(p, &st, 0) < 0)
        return 7;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the test side -------------------------------------------------------- */

typedef struct report {
    char text[16384];
    int rc;
} report;

typedef struct dirs {
    char ws[64], ro[64];
} dirs;

static void run_case(const char *which, const dirs *d, report *r)
{
    int pfd[2];
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        dup2(pfd[1], 1);
        execl(self_exe, self_exe, "--mount-child", which, d->ws, d->ro, (char *)NULL);
        _exit(125);
    }
    close(pfd[1]);
    size_t len = 0;
    ssize_t n;
    while ((n = read(pfd[0], r->text + len, sizeof r->text - 1 - len)) > 0)
        len += (size_t)n;
    r->text[len] = 0;
    close(pfd[0]);
    int st;
    assert_int_equal(waitpid(p, &st, 0), p);
    r->rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r->rc == SKIP_RC) {
        print_message("%s", r->text);
        skip();
    }
    if (r->rc != 0)
        print_message("child exit %d:\n%s", r->rc, r->text);
    assert_int_equal(r->rc, 0);
}

/* The value reported for key (the rest of its line), or NULL. */
static const char *value(const report *r, const char *key, char *buf, size_t len)
{
    size_t k = strlen(key);
    for (const char *line = r->text; *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (n > k && !strncmp(line, key, k) && line[k] == ' ') {
            snprintf(buf, len, "%.*s", (int)(n - k - 1), line + k + 1);
            return buf;
        }
        line += n + (end != NULL);
    }
    return NULL;
}

static void expect(const report *r, const char *key, const char *want)
{
    char buf[1024];
    const char *got = value(r, key, buf, sizeof buf);
    if (!got || strcmp(got, want))
        print_message("%s: want \"%s\", got \"%s\"\n", key, want, got ? got : "(not reported)");
    assert_non_null(got);
    assert_string_equal(got, want);
}

static void expect_contains(const report *r, const char *key, const char *part)
{
    char buf[1024];
    const char *got = value(r, key, buf, sizeof buf);
    if (!got || !strstr(got, part))
        print_message("%s: want it to contain \"%s\", got \"%s\"\n", key, part,
                      got ? got : "(not reported)");
    assert_non_null(got);
    assert_non_null(strstr(got, part));
}

static int setup(void **state)
{
    dirs *d = calloc(1, sizeof *d);
    if (!d)
        return -1;
    snprintf(d->ws, sizeof d->ws, "/tmp/km-mount-ws-XXXXXX");
    snprintf(d->ro, sizeof d->ro, "/tmp/km-mount-ro-XXXXXX");
    char p[128];
    FILE *f = NULL;
    if (!mkdtemp(d->ws) || !mkdtemp(d->ro))
        goto fail;
    snprintf(p, sizeof p, "%s/frozen", d->ws);
    if (mkdir(p, 0755) < 0)
        goto fail;
    snprintf(p, sizeof p, "%s/data", d->ro);
    f = fopen(p, "w");
    if (!f || fputs("ro-data", f) < 0)
        goto fail;
    fclose(f);
    *state = d;
    return 0;
fail:
    if (f)
        fclose(f);
    free(d);
    return -1;
}

static int teardown(void **state)
{
    dirs *d = *state;
    const char *files[] = {"from-sandbox", "frozen/new", "frozen", NULL};
    char p[128];
    for (const char **f = files; *f; f++) {
        snprintf(p, sizeof p, "%s/%s", d->ws, *f);
        (void)!remove(p);
    }
    snprintf(p, sizeof p, "%s/data", d->ro);
    (void)!remove(p);
    (void)!rmdir(d->ws);
    (void)!rmdir(d->ro);
    free(d);
    return 0;
}

/* The root a worker gets: read-only but for the workspace, /tmp and
 * /dev/shm; the host's other paths absent; the generated /etc; the mount
 * flags of each part; /tmp of the configured size; programs run. */
static void build_gives_the_planned_root(void **state)
{
    dirs *d = *state;
    report r = {.rc = -1};
    run_case("plain", d, &r);
    expect(&r, "build", "ok");
    expect(&r, "cwd", d->ws);
    expect(&r, "pid", "1");
    expect(&r, "root_mkdir", "EROFS");
    expect(&r, "usr_create", "EROFS");
    expect(&r, "etc_create", "EROFS");
    expect(&r, "dev_create", "EROFS");
    expect(&r, "tmp_create", "0");
    expect(&r, "shm_create", "0");
    expect(&r, "devnull_write", "0");
    expect(&r, "ws_create", "0");
    expect(&r, "ro_read", "ro-data");
    expect(&r, "ro_create", "EROFS");
    /* a read-only path inside the workspace stays read-only; the rest of
     * the workspace does not become so */
    expect(&r, "frozen_create", "EROFS");
    expect(&r, "shadow", "ENOENT");
    expect(&r, "sys", "ENOENT");
    expect(&r, "dev_sda", "ENOENT");
    /* the host's paths outside the plan are gone (unless the checkout is
     * under a directory the sandbox shows) */
    if (strncmp(self_exe, "/usr/", 5) && strncmp(self_exe, "/lib", 4))
        expect(&r, "self_exe", "ENOENT");
    expect(&r, "sh_x", "0");
    expect(&r, "run_true", "0");
    /* the bind that makes /proc/sys read-only shows as EROFS when the
     * caller's uid owns the files there (root); otherwise the files'
     * owner, unmapped, refuses first */
    expect(&r, "proc_sys_write", geteuid() == 0 ? "EROFS" : "EACCES");
    expect(&r, "passwd",
           "root:x:0:0:root:/root:/usr/sbin/nologin|nobody:x:65534:65534:nobody:/"
           "tmp:/bin/bash|");
    expect(&r, "group", "root:x:0:|nogroup:x:65534:|");
    expect(&r, "hostname", "sandbox|");
    expect_contains(&r, "hosts", "127.0.0.1\tlocalhost sandbox");
    expect(&r, "resolv", "<ENOENT>");
    expect(&r, "mtab", "../proc/self/mounts");
    expect(&r, "var_tmp", "../tmp");
    expect(&r, "flags_root", "ro,nosuid,nodev");
    expect(&r, "flags_usr", "ro,nosuid,nodev");
    expect(&r, "flags_ws", "rw,nosuid,nodev");
    expect(&r, "flags_tmp", "rw,nosuid,nodev");
    char want[32];
    snprintf(want, sizeof want, "%llu", (unsigned long long)TMP_BYTES);
    expect(&r, "tmp_bytes", want);
    /* what the worker wrote is on the host */
    char p[128];
    snprintf(p, sizeof p, "%s/from-sandbox", d->ws);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, 1);
    snprintf(p, sizeof p, "%s/frozen/new", d->ws);
    assert_int_equal(stat(p, &st), -1);
}

/* With the network on the sandbox gets a resolver (slirp4netns's). */
static void network_on_writes_a_resolver(void **state)
{
    dirs *d = *state;
    report r = {.rc = -1};
    run_case("network", d, &r);
    expect(&r, "build", "ok");
    expect(&r, "resolv", "nameserver 10.0.2.3|");
    expect(&r, "ws_create", "0");
}

/* A bad plan is refused before anything is mounted, naming the path. */
static void bad_plans_name_the_path(void **state)
{
    dirs *d = *state;
    report r = {.rc = -1};
    run_case("relative", d, &r);
    expect(&r, "prepare", "read-only path relative/dir is not absolute");
    run_case("missing-ro", d, &r);
    char want[256];
    snprintf(want, sizeof want, "read-only path %s/gone: No such file or directory", d->ro);
    expect(&r, "prepare", want);
    run_case("missing-ws", d, &r);
    snprintf(want, sizeof want, "workspace %s/gone: No such file or directory", d->ro);
    expect(&r, "prepare", want);
}

/* The sandbox's own "is this path under that one" (it includes nothing of
 * ours): lexical, on whole components. */
static void path_under_is_lexical(void **state)
{
    (void)state;
    assert_true(sbx_util_path_under("/a/b", "/a"));
    assert_true(sbx_util_path_under("/a/b", "/a/"));
    assert_true(sbx_util_path_under("/a", "/a"));
    assert_false(sbx_util_path_under("/ab", "/a"));
    assert_false(sbx_util_path_under("/a", "/a/b"));
    assert_true(sbx_util_path_under("/x", "/"));
    assert_false(sbx_util_path_under("/x", ""));
    assert_false(sbx_util_path_under(NULL, "/"));
}

/* The one list of the system directories every sandbox binds: a path at or
 * below one needs no read-only bind of its own. */
static void system_paths_are_the_bound_dirs(void **state)
{
    (void)state;
    for (const char *const *d = sandbox_system_dirs; *d; d++)
        assert_true(sandbox_is_system_path(*d));
    assert_true(sandbox_is_system_path("/usr/lib/python3.11"));
    assert_true(sandbox_is_system_path("/lib32/libc.so.6"));
    assert_false(sandbox_is_system_path("/usrx"));
    assert_false(sandbox_is_system_path("/opt/python"));
    assert_false(sandbox_is_system_path("/"));
}

int main(int argc, char **argv)
{
    if (!realpath("/proc/self/exe", self_exe))
        snprintf(self_exe, sizeof self_exe, "%s", argv[0]);
    if (argc == 5 && !strcmp(argv[1], "--mount-child")) {
        int rc = mount_child(argv[2], argv[3], argv[4]);
        fflush(stdout);
        /* no exit handlers: LeakSanitizer cannot stop the world from
         * inside the new user namespace (the test process is checked) */
        _exit(rc);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(build_gives_the_planned_root, setup, teardown),
        cmocka_unit_test_setup_teardown(network_on_writes_a_resolver, setup, teardown),
        cmocka_unit_test_setup_teardown(bad_plans_name_the_path, setup, teardown),
        cmocka_unit_test(path_under_is_lexical),
        cmocka_unit_test(system_paths_are_the_bound_dirs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
