/* Unit tests of kernelmgr/wsfile.c (and fsdiff's use of it): confined
 * resolution, special files never opened, symlink text never resolved, and
 * an rmtree that follows no symlink and enters no other filesystem. Real
 * files in a fresh directory under /tmp; no mocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernelmgr/engine/fsdiff.h"
#include "kernelmgr/engine/wsfile.h"

typedef struct fx {
    char *top;     /* /tmp/km-wsfile-XXXXXX */
    char *ws;      /* top/ws: the workspace */
    char *outside; /* top/outside: host files the workspace must not reach */
    int rootfd;
} fx;

static char *join(const char *a, const char *b)
{
    char *p = NULL;
    assert_true(asprintf(&p, "%s/%s", a, b) > 0);
    return p;
}

static void put(const char *dir, const char *name, const char *text)
{
    char *p = join(dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    free(p);
}

static int exists(const char *dir, const char *name)
{
    char *p = join(dir, name);
    struct stat st;
    int r = lstat(p, &st) == 0;
    free(p);
    return r;
}

static void rm_rf(const char *path)
{
    /* the test's own cleanup: a plain rm (the code under test is not
     * trusted to clean up after itself) */
    pid_t pid = fork();
    if (pid == 0) {
        execlp("rm", "rm", "-rf", "--one-file-system", path, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    f->top = strdup("/tmp/km-wsfile-XXXXXX");
    assert_non_null(mkdtemp(f->top));
    f->ws = join(f->top, "ws");
    f->outside = join(f->top, "outside");
    assert_int_equal(mkdir(f->ws, 0700), 0);
    assert_int_equal(mkdir(f->outside, 0700), 0);
    /* the host's secret: would sniff as PNG, content must never be read */
    put(f->outside, "secret.bin", "\x89PNG\r\n\x1a\nHOSTSECRET");
    put(f->outside, "marker", "keep me");
    f->rootfd = wsfile_root_open(f->ws, NULL);
    assert_true(f->rootfd >= 0);
    *state = f;
    alarm(60); /* a hang (a FIFO opened for reading) fails the test */
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    alarm(0);
    close(f->rootfd);
    rm_rf(f->top);
    free(f->top);
    free(f->ws);
    free(f->outside);
    free(f);
    return 0;
}

/* ws/sub (a real dir) and ws/link -> outside */
static void plant(fx *f)
{
    char *sub = join(f->ws, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    put(sub, "ok.txt", "hello");
    free(sub);
    char *l = join(f->ws, "link");
    assert_int_equal(symlink(f->outside, l), 0);
    free(l);
    l = join(f->ws, "rel");
    assert_int_equal(symlink("sub", l), 0); /* even one pointing inside */
    free(l);
}

static void middle_symlink_refused(void **state)
{
    fx *f = *state;
    plant(f);
    km_err err = {0};
    int fd = wsfile_openat(f->rootfd, "sub/ok.txt", O_RDONLY, 0, &err);
    assert_true(fd >= 0);
    close(fd);
    errno = 0;
    assert_int_equal(wsfile_openat(f->rootfd, "link/secret.bin", O_RDONLY, 0, &err), -1);
    assert_int_equal(errno, ELOOP);
    assert_non_null(strstr(err.msg, "symbolic link"));
    assert_int_equal(wsfile_openat(f->rootfd, "rel/ok.txt", O_RDONLY, 0, &err), -1);
    assert_int_equal(wsfile_openat(f->rootfd, "link", O_RDONLY, 0, &err), -1);
    /* the fallback walk without openat2 refuses the same */
    assert_int_equal(wsfile_openat_walk(f->rootfd, "link/secret.bin", O_RDONLY, 0), -1);
    assert_int_equal(errno, ELOOP);
    assert_int_equal(wsfile_openat_walk(f->rootfd, "rel/ok.txt", O_RDONLY, 0), -1);
    assert_int_equal(wsfile_openat_walk(f->rootfd, "link", O_RDONLY, 0), -1);
    fd = wsfile_openat_walk(f->rootfd, "./sub/./ok.txt", O_RDONLY, 0);
    assert_true(fd >= 0);
    close(fd);
    /* and so do the readers built on it */
    assert_null(wsfile_read(f->ws, "link/secret.bin", 0, 0, "auto", &err));
    assert_null(strstr(err.msg, "HOSTSECRET"));
    assert_null(wsfile_write(f->ws, "link/marker", "x", 1, 0, 1, &err));
    assert_null(wsfile_write(f->ws, "link/new", "x", 1, 0, 1, &err));
    assert_false(exists(f->outside, "new"));
    struct stat st;
    assert_int_equal(wsfile_open_regular(f->rootfd, "link/secret.bin", &st, NULL), -1);
    char *data = NULL;
    size_t len = 0;
    assert_int_equal(wsfile_slurp(f->rootfd, "link/marker", 1024, &data, &len, NULL), -1);
    assert_null(data);
    assert_int_equal(wsfile_replace(f->rootfd, "link/marker", "x", 1, 0644, NULL), -1);
    /* MIME sniffing does not see the PNG behind the link */
    assert_string_equal(fsdiff_mime(f->rootfd, "link/secret.bin", S_IFREG),
                        "application/octet-stream");
    assert_string_equal(fsdiff_mime(f->rootfd, "sub/ok.txt", S_IFREG), "text/plain");
    char *m = join(f->outside, "marker");
    FILE *mf = fopen(m, "r");
    char buf[32] = "";
    assert_non_null(fgets(buf, sizeof buf, mf));
    fclose(mf);
    free(m);
    assert_string_equal(buf, "keep me");
}

static void dotdot_and_absolute_refused(void **state)
{
    fx *f = *state;
    km_err err = {0};
    assert_int_equal(wsfile_openat(f->rootfd, "../outside/marker", O_RDONLY, 0, &err), -1);
    assert_int_equal(errno, EXDEV);
    char *abs = join(f->outside, "marker");
    assert_int_equal(wsfile_openat(f->rootfd, abs, O_RDONLY, 0, &err), -1);
    assert_int_equal(errno, EXDEV);
    assert_int_equal(wsfile_openat_walk(f->rootfd, abs, O_RDONLY, 0), -1);
    free(abs);
    assert_int_equal(wsfile_openat_walk(f->rootfd, "../outside/marker", O_RDONLY, 0), -1);
    assert_int_equal(errno, EXDEV);
    char norm[WSFILE_PATH_MAX + 1];
    assert_int_equal(wsfile_normalize("a/../../x", 0, norm, &err), -1);
    assert_int_equal(wsfile_normalize("/etc/passwd", 0, norm, &err), -1);
    assert_null(wsfile_read(f->ws, "../outside/marker", 0, 0, "auto", &err));
}

static void magic_link_refused(void **state)
{
    (void)state;
    /* /proc/self/fd/N are magic links: never resolved, even when the
     * directory fd is /proc/self itself */
    int proc = open("/proc/self", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (proc < 0)
        skip();
    int target = open("/etc/hostname", O_RDONLY | O_CLOEXEC);
    if (target < 0)
        target = open("/dev/null", O_RDONLY | O_CLOEXEC);
    char rel[64];
    snprintf(rel, sizeof rel, "fd/%d", target);
    km_err err = {0};
    assert_int_equal(wsfile_openat(proc, rel, O_RDONLY, 0, &err), -1);
    assert_int_equal(errno, ELOOP);
    assert_int_equal(wsfile_openat_walk(proc, rel, O_RDONLY, 0), -1);
    assert_int_equal(errno, ELOOP);
    snprintf(rel, sizeof rel, "fd/%d/x", proc); /* a magic link in the middle */
    assert_int_equal(wsfile_openat(proc, rel, O_RDONLY, 0, &err), -1);
    assert_int_equal(wsfile_openat(proc, "root/etc/passwd", O_RDONLY, 0, &err), -1);
    assert_int_equal(wsfile_openat(proc, "cwd", O_PATH, 0, &err), -1);
    close(target);
    close(proc);
}

static void fifo_never_opened(void **state)
{
    fx *f = *state;
    char *p = join(f->ws, "fifo");
    assert_int_equal(mkfifo(p, 0600), 0);
    free(p);
    km_err err = {0};
    struct stat st;
    /* opening a FIFO for reading without a writer would block: no hang */
    assert_int_equal(wsfile_open_regular(f->rootfd, "fifo", &st, &err), -1);
    assert_int_equal(errno, EINVAL);
    assert_null(wsfile_read(f->ws, "fifo", 0, 0, "auto", &err));
    assert_non_null(strstr(err.msg, "not a regular file"));
    char *data = NULL;
    size_t len;
    assert_int_equal(wsfile_slurp(f->rootfd, "fifo", 100, &data, &len, NULL), -1);
    assert_null(wsfile_write(f->ws, "fifo", "x", 1, 0, 0, &err));
    assert_int_equal(wsfile_replace(f->rootfd, "fifo", "x", 1, 0644, NULL), -1);
    assert_string_equal(fsdiff_mime(f->rootfd, "fifo", S_IFREG), "application/octet-stream");
    assert_string_equal(fsdiff_mime(f->rootfd, "fifo", S_IFIFO), "inode/fifo");
    fsdiff_snap *s = fsdiff_take(f->ws, 100, 1u << 20);
    json_t *list = fsdiff_list(s, 100, NULL);
    assert_int_equal(json_array_size(list), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "mime")),
                        "inode/fifo");
    json_decref(list);
    fsdiff_destroy(&s);
}

static void read_bounded_and_dirs_refused(void **state)
{
    fx *f = *state;
    put(f->ws, "big", "0123456789");
    char *data = NULL;
    size_t len = 0;
    km_err err = {0};
    assert_int_equal(wsfile_slurp(f->rootfd, "big", 5, &data, &len, &err), -1);
    assert_int_equal(errno, EFBIG);
    assert_int_equal(wsfile_slurp(f->rootfd, "big", 10, &data, &len, &err), 0);
    assert_int_equal(len, 10);
    assert_string_equal(data, "0123456789");
    free(data);
    assert_int_equal(wsfile_replace(f->rootfd, "big", "ab", 2, 0644, &err), 0);
    assert_int_equal(wsfile_slurp(f->rootfd, "big", 10, &data, &len, &err), 0);
    assert_string_equal(data, "ab");
    free(data);
    char *d = join(f->ws, "d");
    mkdir(d, 0755);
    free(d);
    struct stat st;
    assert_int_equal(wsfile_open_regular(f->rootfd, "d", &st, &err), -1);
    assert_int_equal(errno, EISDIR);
    assert_null(wsfile_read(f->ws, "d", 0, 0, "auto", &err));
    assert_non_null(strstr(err.msg, "directory"));
}

/* remove: files, links (never their targets), empty directories; a
 * non-empty directory, a path through a symlink and a missing entry are
 * refused with reasons */
static void remove_never_follows(void **state)
{
    fx *f = *state;
    plant(f);
    km_err err = {0};
    json_t *r = wsfile_remove(f->ws, "link", &err);
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "type")), "symlink");
    json_decref(r);
    assert_true(exists(f->outside, "marker"));
    err.msg[0] = 0;
    assert_null(wsfile_remove(f->ws, "rel/ok.txt", &err));
    assert_true(strlen(err.msg) > 0);
    assert_true(exists(f->ws, "sub/ok.txt"));
    assert_null(wsfile_remove(f->ws, "sub", &err));
    assert_non_null(strstr(err.msg, "not empty"));
    assert_null(wsfile_remove(f->ws, "../outside/marker", &err));
    assert_true(exists(f->outside, "marker"));
    r = wsfile_remove(f->ws, "sub/ok.txt", &err);
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "type")), "file");
    json_decref(r);
    r = wsfile_remove(f->ws, "sub", &err);
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "type")), "dir");
    json_decref(r);
    assert_false(exists(f->ws, "sub"));
    assert_null(wsfile_remove(f->ws, "sub", &err));
    assert_non_null(strstr(err.msg, "no such file"));
    assert_null(wsfile_remove(f->ws, "gone/x", &err));
    assert_non_null(strstr(err.msg, "no such file"));
}

static void symlink_text_is_plain_text(void **state)
{
    fx *f = *state;
    char *l = join(f->ws, "pw");
    assert_int_equal(symlink("/etc/passwd", l), 0);
    free(l);
    l = join(f->ws, "self");
    assert_int_equal(symlink("/proc/self/fd/0", l), 0);
    free(l);
    fsdiff_snap *s = fsdiff_take(f->ws, 100, 1u << 20);
    json_t *list = fsdiff_list(s, 100, NULL);
    size_t i;
    json_t *e;
    int seen = 0;
    json_array_foreach(list, i, e)
    {
        const char *path = json_string_value(json_object_get(e, "path"));
        const char *t = json_string_value(json_object_get(e, "target"));
        assert_string_equal(json_string_value(json_object_get(e, "mime")), "inode/symlink");
        if (!strcmp(path, "pw"))
            assert_string_equal(t, "/etc/passwd"), seen++;
        if (!strcmp(path, "self"))
            assert_string_equal(t, "/proc/self/fd/0"), seen++; /* not what fd 0 is */
    }
    assert_int_equal(seen, 2);
    json_decref(list);
    fsdiff_snap *empty = fsdiff_take("/nonexistent-km-wsfile", 10, 1u << 20);
    size_t omitted = 0;
    json_t *changes = fsdiff_compare(empty, s, 100, &omitted);
    assert_int_equal(json_array_size(changes), 2);
    json_array_foreach(changes, i, e)
    {
        const char *t = json_string_value(json_object_get(e, "target"));
        assert_true(!strcmp(t, "/etc/passwd") || !strcmp(t, "/proc/self/fd/0"));
    }
    json_decref(changes);
    fsdiff_destroy(&empty);
    fsdiff_destroy(&s);
}

/* A child swaps ws/d (a real directory) with ws/l (a symlink to outside)
 * as fast as it can; readers through the workspace fd never see outside. */
static void rename_exchange_race(void **state)
{
    fx *f = *state;
    char *d = join(f->ws, "d");
    assert_int_equal(mkdir(d, 0755), 0);
    put(d, "secret.bin", "plain text");
    free(d);
    char *l = join(f->ws, "l");
    assert_int_equal(symlink(f->outside, l), 0);
    free(l);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        for (;;)
            renameat2(f->rootfd, "d", f->rootfd, "l", RENAME_EXCHANGE);
    }
    int png = 0, secret = 0;
    for (int i = 0; i < 400; i++) {
        const char *m = fsdiff_mime(f->rootfd, "d/secret.bin", S_IFREG);
        png += !strcmp(m, "image/png");
        json_t *r = wsfile_read(f->ws, "d/secret.bin", 0, 0, "auto", NULL);
        if (r) {
            const char *c = json_string_value(json_object_get(r, "content"));
            secret += c && strstr(c, "HOSTSECRET") != NULL;
            png += !strcmp(json_string_value(json_object_get(r, "mime")), "image/png");
            json_decref(r);
        }
        fsdiff_snap *s = fsdiff_take(f->ws, 100, 1u << 20);
        json_t *list = fsdiff_list(s, 100, NULL);
        size_t k;
        json_t *e;
        json_array_foreach(list, k, e)
        {
            png += !strcmp(json_string_value(json_object_get(e, "mime")), "image/png");
            const char *t = json_string_value(json_object_get(e, "target"));
            if (t)
                assert_string_equal(t, f->outside); /* only the link's text */
            assert_null(strstr(json_string_value(json_object_get(e, "path")), "marker"));
        }
        json_decref(list);
        fsdiff_destroy(&s);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_int_equal(png, 0);
    assert_int_equal(secret, 0);
}

static void rmtree_never_follows(void **state)
{
    fx *f = *state;
    plant(f);
    char *deep = join(f->ws, "sub/inner");
    assert_int_equal(mkdir(deep, 0755), 0);
    char *l = join(deep, "up");
    assert_int_equal(symlink(f->outside, l), 0);
    free(l);
    l = join(deep, "root");
    assert_int_equal(symlink("/", l), 0);
    free(l);
    put(deep, "f", "x");
    assert_int_equal(chmod(deep, 0500), 0); /* read-only: still removed */
    free(deep);
    km_err err = {0};
    assert_int_equal(wsfile_rmtree(f->ws, &err), 0);
    assert_false(exists(f->top, "ws"));
    assert_true(exists(f->outside, "marker"));
    assert_true(exists(f->outside, "secret.bin"));
    /* a symlink given as the path itself: only the link goes */
    char *link = join(f->top, "tolink");
    assert_int_equal(symlink(f->outside, link), 0);
    assert_int_equal(wsfile_rmtree(link, &err), 0);
    free(link);
    assert_false(exists(f->top, "tolink"));
    assert_true(exists(f->outside, "marker"));
    /* absent: fine; nonsense: refused */
    assert_int_equal(wsfile_rmtree(f->ws, &err), 0);
    assert_int_equal(wsfile_rmtree("/", &err), -1);
    assert_int_equal(wsfile_rmtree("", &err), -1);
    char *dots = join(f->top, "..");
    assert_int_equal(wsfile_rmtree(dots, &err), -1);
    free(dots);
    assert_int_equal(mkdir(f->ws, 0700), 0); /* for teardown's symmetry */
}

static void rmtree_deeper_than_fd_bound(void **state)
{
    fx *f = *state;
    int dfd = open(f->ws, O_RDONLY | O_DIRECTORY);
    for (int i = 0; i < WSFILE_RMTREE_DEPTH * 3 + 5; i++) {
        assert_int_equal(mkdirat(dfd, "d", 0700), 0);
        int n = openat(dfd, "d", O_RDONLY | O_DIRECTORY);
        close(dfd);
        dfd = n;
    }
    assert_int_equal(symlinkat(f->outside, dfd, "bottom"), 0);
    close(dfd);
    km_err err = {0};
    int rc = wsfile_rmtree(f->ws, &err);
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_false(exists(f->top, "ws"));
    assert_true(exists(f->outside, "marker"));
    assert_int_equal(mkdir(f->ws, 0700), 0);
}

static void rmtree_stops_at_other_filesystem(void **state)
{
    fx *f = *state;
    if (geteuid() != 0)
        skip(); /* mounting a tmpfs needs root (CAP_SYS_ADMIN) */
    char *mnt = join(f->ws, "mnt");
    assert_int_equal(mkdir(mnt, 0755), 0);
    put(f->ws, "plain", "x");
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* a private mount namespace: the host's mounts stay as they are */
        if (unshare(CLONE_NEWNS) < 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) < 0)
            _exit(77);
        if (mount("tmpfs", mnt, "tmpfs", 0, "size=1m") < 0)
            _exit(77);
        put(mnt, "on-tmpfs", "keep");
        km_err err = {0};
        int rc = wsfile_rmtree(f->ws, &err);
        int ok = rc == -1 && strstr(err.msg, "mount point") != NULL && exists(mnt, "on-tmpfs") &&
                 !exists(f->ws, "plain") && exists(f->top, "ws");
        if (!ok)
            fprintf(stderr, "rc=%d err.msg=%s\n", rc, err.msg);
        umount2(mnt, MNT_DETACH);
        _exit(ok ? 0 : 1);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    free(mnt);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip(); /* no mount namespace here (a container without CAP_SYS_ADMIN) */
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* The reasons a refused path gets, the same from openat2 and from the
 * fallback walk: a symlink anywhere (even the last component opened as a
 * directory, where O_NOFOLLOW | O_DIRECTORY alone would say ENOTDIR) is "a
 * symbolic link"; a regular file in the middle is "not a directory". */
static const struct reason_case {
    const char *rel;
    int flags;
    int err;
    const char *reason;
} reason_cases[] = {
    {"link/secret.bin", O_RDONLY, ELOOP, "symbolic link"},
    {"link", O_RDONLY | O_DIRECTORY, ELOOP, "symbolic link"},
    {"link", O_PATH | O_DIRECTORY, ELOOP, "symbolic link"},
    {"link/", O_RDONLY, ELOOP, "symbolic link"},
    {"rel/ok.txt", O_RDONLY, ELOOP, "symbolic link"},
    {"sub/ok.txt/x", O_RDONLY, ENOTDIR, "not a directory"},
};
#define N_REASON_CASES (sizeof reason_cases / sizeof reason_cases[0])

/* Index + 1 of the first case wsfile_openat reports otherwise, or 0. */
static int first_wrong_reason(int rootfd)
{
    for (size_t i = 0; i < N_REASON_CASES; i++) {
        const struct reason_case *c = &reason_cases[i];
        km_err err = {0};
        errno = 0;
        int fd = wsfile_openat(rootfd, c->rel, c->flags, 0, &err);
        if (fd >= 0)
            close(fd);
        if (fd >= 0 || errno != c->err || !strstr(err.msg, c->reason) || !strstr(err.msg, c->rel)) {
            fprintf(stderr, "case %s: errno %d, reason '%s'\n", c->rel, errno, err.msg);
            return (int)i + 1;
        }
    }
    return 0;
}

static void refusal_reasons_both_paths(void **state)
{
    fx *f = *state;
    plant(f);
    /* the fallback walk itself */
    for (size_t i = 0; i < N_REASON_CASES; i++) {
        errno = 0;
        assert_int_equal(
            wsfile_openat_walk(f->rootfd, reason_cases[i].rel, reason_cases[i].flags, 0), -1);
        assert_int_equal(errno, reason_cases[i].err);
    }
    /* wsfile_openat as this host runs it (openat2; under valgrind, which
     * does not know openat2, the walk) */
    assert_int_equal(first_wrong_reason(f->rootfd), 0);
    /* and wsfile_openat with openat2 denied (ENOSYS, as on an old kernel),
     * in a child whose seccomp filter says so */
#if defined(__x86_64__)
    const unsigned arch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
    const unsigned arch = AUDIT_ARCH_AARCH64;
#else
    skip();
    const unsigned arch = 0;
#endif
#ifndef SYS_openat2
#define SYS_openat2 437
#endif
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct sock_filter prog[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog fp = {.len = sizeof prog / sizeof prog[0], .filter = prog};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fp) < 0)
            _exit(77);
        struct open_how_ {
            unsigned long long flags, mode, resolve;
        } how = {O_RDONLY, 0, 0};
        if (syscall(SYS_openat2, f->rootfd, ".", &how, sizeof how) >= 0 || errno != ENOSYS)
            _exit(78); /* the filter did not take */
        _exit(first_wrong_reason(f->rootfd));
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77)
        skip(); /* no seccomp here */
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* The encodings are one table: each direction takes its own, a refusal
 * names exactly those, and the JSON lists the MCP schemas carry are the
 * table's. */
static void encodings_one_table(void **state)
{
    (void)state;
    km_err err = {0};
    assert_int_equal(wsfile_encoding("auto", WSFILE_ENC_READ, &err), WSFILE_ENC_AUTO);
    assert_int_equal(wsfile_encoding("text", WSFILE_ENC_READ, &err), WSFILE_ENC_TEXT);
    assert_int_equal(wsfile_encoding("base64", WSFILE_ENC_WRITE, &err), WSFILE_ENC_BASE64);
    assert_int_equal(wsfile_encoding("auto", WSFILE_ENC_WRITE, &err), -1);
    assert_int_equal(err.code, KM_EUSAGE);
    assert_string_equal(err.msg, "must be \"text\" or \"base64\" (got \"auto\")");
    assert_int_equal(wsfile_encoding("utf-8", WSFILE_ENC_READ, &err), -1);
    assert_string_equal(err.msg, "must be \"auto\", \"text\" or \"base64\" (got \"utf-8\")");
    assert_int_equal(wsfile_encoding(NULL, WSFILE_ENC_READ, &err), -1);
    assert_int_equal(wsfile_encoding("TEXT", WSFILE_ENC_READ, &err), -1);
    const struct {
        int dir;
        const char *json;
    } lists[] = {{WSFILE_ENC_READ, WSFILE_ENC_READ_JSON},
                 {WSFILE_ENC_WRITE, WSFILE_ENC_WRITE_JSON}};
    for (size_t i = 0; i < 2; i++) {
        json_t *want = wsfile_encodings_json(lists[i].dir);
        json_t *got = json_loads(lists[i].json, 0, NULL);
        assert_non_null(got);
        assert_true(json_equal(want, got));
        json_decref(want);
        json_decref(got);
    }
    /* a read refuses an unknown encoding before touching anything */
    json_t *r = wsfile_read("/nonexistent-root", "x", 0, 0, "latin1", &err);
    assert_null(r);
    assert_string_equal(err.msg,
                        "encoding: must be \"auto\", \"text\" or \"base64\" (got \"latin1\")");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(encodings_one_table),
        cmocka_unit_test_setup_teardown(middle_symlink_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(refusal_reasons_both_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(dotdot_and_absolute_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(magic_link_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(fifo_never_opened, setup, teardown),
        cmocka_unit_test_setup_teardown(read_bounded_and_dirs_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(symlink_text_is_plain_text, setup, teardown),
        cmocka_unit_test_setup_teardown(remove_never_follows, setup, teardown),
        cmocka_unit_test_setup_teardown(rename_exchange_race, setup, teardown),
        cmocka_unit_test_setup_teardown(rmtree_never_follows, setup, teardown),
        cmocka_unit_test_setup_teardown(rmtree_deeper_than_fd_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(rmtree_stops_at_other_filesystem, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
