/* Unit tests of common/cm_path.c: paths built to their length. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(join_puts_one_slash),
        cmocka_unit_test(fmt_has_no_length_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
