/* Unit tests of common/cm_install.c: kernelmgr's files found from the
 * running binary, in the build-tree and the installed layout. The test
 * copies itself into each layout and runs the copy, which prints what it
 * finds (argv[1] == "--print"). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm_install.h"
#include "common/cm_path.h"

static char root[] = "/tmp/cm-install-XXXXXX";

static void mkdirs(const char *rel)
{
    char *p = cm_path_join(root, rel);
    assert_non_null(p);
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
        *s = '/';
    }
    assert_true(mkdir(p, 0755) == 0 || errno == EEXIST);
    free(p);
}

/* copies /proc/self/exe to root/rel (its directory made) */
static void install_self(const char *rel)
{
    char *dir = strdup(rel);
    *strrchr(dir, '/') = 0;
    mkdirs(dir);
    free(dir);
    char *dst = cm_path_join(root, rel);
    int in = open("/proc/self/exe", O_RDONLY), out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    assert_true(in >= 0 && out >= 0);
    char buf[65536];
    ssize_t n;
    while ((n = read(in, buf, sizeof buf)) > 0)
        assert_int_equal(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
    free(dst);
}

/* runs root/rel --print; its three lines into out */
static void run_copy(const char *rel, const char *share_env, char *out, size_t size)
{
    char *bin = cm_path_join(root, rel);
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(p[1], 1);
        if (share_env)
            setenv("KERNELMGR_SHARE", share_env, 1);
        else
            unsetenv("KERNELMGR_SHARE");
        execl(bin, bin, "--print", (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    size_t k = 0;
    ssize_t n;
    while (k < size - 1 && (n = read(p[0], out + k, size - 1 - k)) > 0)
        k += (size_t)n;
    out[k] = 0;
    close(p[0]);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    free(bin);
}

static void expect(const char *rel, const char *share_env, const char *exe, const char *helpers,
                   const char *share)
{
    char out[8192], want[8192];
    run_copy(rel, share_env, out, sizeof out);
    snprintf(want, sizeof want, "%s/%s\n%s/%s\n%s%s%s\n", root, exe, root, helpers,
             share[0] == '/' ? "" : root, share[0] == '/' ? "" : "/", share);
    if (strcmp(out, want))
        fail_msg("%s: got\n%swant\n%s", rel, out, want);
}

static void build_tree_layout(void **state)
{
    (void)state;
    install_self("b/kernelmgr");
    mkdirs("b/share/kernelmgr");
    expect("b/kernelmgr", NULL, "b", "b", "b/share/kernelmgr");
}

static void installed_layout(void **state)
{
    (void)state;
    install_self("usr/bin/kernelmgr");
    install_self("usr/libexec/kernelmgr/kernel-python");
    mkdirs("usr/share/kernelmgr");
    /* the command finds the helpers in LIBEXECDIR/kernelmgr */
    expect("usr/bin/kernelmgr", NULL, "usr/bin", "usr/libexec/kernelmgr", "usr/share/kernelmgr");
    /* a helper finds its siblings beside it and the support files in DATADIR */
    expect("usr/libexec/kernelmgr/kernel-python", NULL, "usr/libexec/kernelmgr",
           "usr/libexec/kernelmgr", "usr/share/kernelmgr");
    /* $KERNELMGR_SHARE wins */
    expect("usr/libexec/kernelmgr/kernel-python", "/elsewhere", "usr/libexec/kernelmgr",
           "usr/libexec/kernelmgr", "/elsewhere");
}

static void nothing_found_names_the_first_place(void **state)
{
    (void)state;
    install_self("lone/kernelmgr");
    expect("lone/kernelmgr", NULL, "lone", "lone", "lone/share/kernelmgr");
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--print")) {
        char *e = cm_install_exe_dir(), *h = cm_install_helper_dir(), *s = cm_install_share_dir();
        printf("%s\n%s\n%s\n", e ? e : "NULL", h ? h : "NULL", s ? s : "NULL");
        free(e);
        free(h);
        free(s);
        return 0;
    }
    if (!mkdtemp(root))
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(build_tree_layout),
        cmocka_unit_test(installed_layout),
        cmocka_unit_test(nothing_found_names_the_first_place),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char *cmd = cm_path_fmt("rm -rf '%s'", root);
    if (cmd && system(cmd) != 0)
        rc = 1;
    free(cmd);
    return rc;
}
