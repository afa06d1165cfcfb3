/* Unit tests of common/cm_array.c: a growable NULL-terminated array. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cm_array.h"

static void grows_and_stays_terminated(void **state)
{
    (void)state;
    cm_array a = CM_ARRAY_INIT;
    char name[32];
    for (int i = 0; i < 1000; i++) {
        snprintf(name, sizeof name, "item-%d", i);
        assert_int_equal(cm_array_push_str(&a, name), 0);
        assert_int_equal(a.len, (size_t)i + 1);
        assert_null(a.items[a.len]);
    }
    assert_string_equal(a.items[0], "item-0");
    assert_string_equal(a.items[999], "item-999");
    char *last = cm_array_pop(&a);
    assert_string_equal(last, "item-999");
    free(last);
    assert_int_equal(a.len, 999);
    assert_null(a.items[999]);
    cm_array_free(&a, free);
    assert_int_equal(a.len, 0);
    assert_null(a.items);
    assert_null(cm_array_pop(&a));
    cm_array_free(&a, free); /* twice: harmless */
}

static void refuses_null_items(void **state)
{
    (void)state;
    cm_array a = CM_ARRAY_INIT;
    errno = 0;
    assert_int_equal(cm_array_push(&a, NULL), -1);
    assert_int_equal(errno, EINVAL);
    assert_int_equal(cm_array_push_str(&a, NULL), -1);
    assert_int_equal(a.len, 0);
    static int x;
    assert_int_equal(cm_array_push(&a, &x), 0); /* not owned: freed without free_item */
    cm_array_free(&a, NULL);
}

static void steal_gives_an_argv(void **state)
{
    (void)state;
    cm_array a = CM_ARRAY_INIT;
    char **empty = (char **)cm_array_steal(&a);
    assert_non_null(empty);
    assert_null(empty[0]);
    free(empty);
    assert_int_equal(cm_array_push_str(&a, "/bin/sh"), 0);
    assert_int_equal(cm_array_push_str(&a, "-c"), 0);
    assert_int_equal(cm_array_push_str(&a, "exit 7"), 0);
    char **argv = (char **)cm_array_steal(&a);
    assert_int_equal(a.len, 0);
    assert_null(a.items);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 7);
    for (char **p = argv; *p; p++)
        free(*p);
    free(argv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grows_and_stays_terminated),
        cmocka_unit_test(refuses_null_items),
        cmocka_unit_test(steal_gives_an_argv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
