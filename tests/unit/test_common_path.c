/* Unit tests of common/cm_path.c: paths built to their length. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <limits.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/cm_path.h"

static void join(const char *dir, const char *name, const char *want)
{
    char *p = cm_path_join(dir, name);
    assert_non_null(p);
    if (strcmp(p, want))
        fail_msg("join('%s', '%s') = '%s', want '%s'", dir, name, p, want);
    free(p);
}

static void join_puts_one_slash(void **state)
{
    (void)state;
    join("a", "b", "a/b");
    join("a/", "b", "a/b");
    join("a//", "/b", "a/b");
    join("/", "x", "/x");
    join("/", "/x", "/x");
    join("", "x", "x");
    join("/tmp/dir", "sub/file.txt", "/tmp/dir/sub/file.txt");
    join("a", "", "a/");
    errno = 0;
    assert_null(cm_path_join(NULL, "x"));
    assert_int_equal(errno, EINVAL);
    assert_null(cm_path_join("x", NULL));
}

static void fmt_has_no_length_limit(void **state)
{
    (void)state;
    char *p = cm_path_fmt("%s/packages/%s", "/home/u", "s1");
    assert_string_equal(p, "/home/u/packages/s1");
    free(p);
    /* longer than PATH_MAX: built whole, never cut */
    size_t n = PATH_MAX * 3;
    char *longdir = malloc(n + 1);
    assert_non_null(longdir);
    memset(longdir, 'd', n);
    longdir[n] = '\0';
    p = cm_path_fmt("%s/%s-%d.json", longdir, "kernel", 42);
    assert_non_null(p);
    assert_int_equal(strlen(p), n + strlen("/kernel-42.json"));
    assert_string_equal(p + n, "/kernel-42.json");
    free(p);
    p = cm_path_join(longdir, "x");
    assert_int_equal(strlen(p), n + 2);
    free(p);
    free(longdir);
    assert_null(cm_path_fmt(NULL));
}

static void under_is_lexical(void **state)
{
    (void)state;
    assert_true(cm_path_under("/a/b", "/a"));
    assert_true(cm_path_under("/a/b", "/a/"));
    assert_true(cm_path_under("/a", "/a"));
    assert_true(cm_path_under("/a/b/c", "/a/b//"));
    assert_false(cm_path_under("/ab", "/a"));
    assert_false(cm_path_under("/a", "/a/b"));
    assert_true(cm_path_under("/anything", "/"));
    assert_false(cm_path_under("/a", ""));
    assert_false(cm_path_under(NULL, "/a"));
    assert_false(cm_path_under("/a", NULL));
    /* not resolved: ".." is a name like any other */
    assert_true(cm_path_under("/a/../etc", "/a"));
}

/* The directory resolved, the last component kept: a symbolic link there
 * stays one. */
static void absolute_keeps_the_last_component(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_cm_pathXXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[PATH_MAX], link[PATH_MAX], want[PATH_MAX];
    snprintf(sub, sizeof sub, "%s/real", dir);
    snprintf(link, sizeof link, "%s/via", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(symlink("real", link), 0); /* dir/via -> dir/real */
    char *realdir = realpath(dir, NULL);
    assert_non_null(realdir);
    /* through the linked directory: resolved */
    char in[PATH_MAX];
    snprintf(in, sizeof in, "%s/via/file", dir);
    snprintf(want, sizeof want, "%s/real/file", realdir);
    char *p = cm_path_absolute(in);
    assert_non_null(p);
    assert_string_equal(p, want);
    free(p);
    /* the link itself, last: kept */
    snprintf(want, sizeof want, "%s/via", realdir);
    p = cm_path_absolute(link);
    assert_non_null(p);
    assert_string_equal(p, want);
    free(p);
    /* relative: from the working directory */
    char *cwd = getcwd(NULL, 0);
    assert_int_equal(chdir(dir), 0);
    p = cm_path_absolute("via");
    assert_non_null(p);
    assert_string_equal(p, want);
    free(p);
    assert_int_equal(chdir(cwd), 0);
    free(cwd);
    /* refused */
    errno = 0;
    assert_null(cm_path_absolute("/nonexistent-dir/x"));
    assert_int_equal(errno, ENOENT);
    static const char *const bad[] = {"a/", ".", "x/..", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        errno = 0;
        assert_null(cm_path_absolute(bad[i]));
        assert_int_equal(errno, EINVAL);
    }
    assert_null(cm_path_absolute(NULL));
    free(realdir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(join_puts_one_slash),
        cmocka_unit_test(fmt_has_no_length_limit),
        cmocka_unit_test(under_is_lexical),
        cmocka_unit_test(absolute_keeps_the_last_component),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
