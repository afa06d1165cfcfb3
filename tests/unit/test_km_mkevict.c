/* Unit tests of kernelmgr/engine/mkevict.c (which session gives way when a
 * kernel must start at the cap or the memory budget) and of mkmem.c's pure
 * parts (the auto budget) and its measurement of this very process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kernelmgr/engine/mkevict.h"
#include "kernelmgr/engine/mkmem.h"

#define N(a) (sizeof(a) / sizeof *(a))

static void least_recently_used_idle_session_goes(void **state)
{
    (void)state;
    kevict_cand c[] = {
        {.last_used = 30, .kernels = 1},
        {.last_used = 10, .kernels = 2},
        {.last_used = 20, .kernels = 1},
    };
    assert_int_equal(kevict_choose(c, N(c)), 1);
    /* the first of equals */
    c[2].last_used = 10;
    assert_int_equal(kevict_choose(c, N(c)), 1);
}

static void never_the_session_that_asked(void **state)
{
    (void)state;
    /* the asking session is the least recently used (its other language's
     * kernel idled while it ran this one): another session goes */
    kevict_cand c[] = {
        {.last_used = 1, .kernels = 1, .self = 1},
        {.last_used = 50, .kernels = 1},
    };
    assert_int_equal(kevict_choose(c, N(c)), 1);
    /* and when only it has kernels, nobody does */
    c[1].kernels = 0;
    assert_int_equal(kevict_choose(c, N(c)), -1);
}

static void never_a_session_running_code(void **state)
{
    (void)state;
    kevict_cand c[] = {
        {.last_used = 1, .kernels = 2, .running = 1},
        {.last_used = 5, .kernels = 1},
        {.last_used = 2, .kernels = 1, .running = 1},
    };
    assert_int_equal(kevict_choose(c, N(c)), 1);
    c[1].running = 1;
    assert_int_equal(kevict_choose(c, N(c)), -1);
}

static void pool_entries_before_any_session(void **state)
{
    (void)state;
    kevict_cand c[] = {
        {.last_used = 1, .kernels = 1},
        {.last_used = 99, .kernels = 2, .pool = 1},
    };
    assert_int_equal(kevict_choose(c, N(c)), 1);
}

static void skipped_and_empty_ones_are_passed_over(void **state)
{
    (void)state;
    kevict_cand c[] = {
        {.last_used = 1, .kernels = 1, .skip = 1},
        {.last_used = 2, .kernels = 0},
        {.last_used = 3, .kernels = 1},
    };
    assert_int_equal(kevict_choose(c, N(c)), 2);
    assert_int_equal(kevict_choose(c, 0), -1);
    assert_int_equal(kevict_choose(NULL, 0), -1);
}

static void auto_budget_keeps_a_reserve(void **state)
{
    (void)state;
    const uint64_t G = 1ull << 30;
    /* an eighth of a large host */
    assert_true(kmem_auto_budget(24 * G) == 21 * G);
    /* at least 1 GiB on a middling one */
    assert_true(kmem_auto_budget(4 * G) == 3 * G);
    /* at least half of a small one, never all of it nor less than nothing */
    assert_true(kmem_auto_budget(G) == G / 2);
    assert_true(kmem_auto_budget(0) == 0);
}

static void measures_a_live_process(void **state)
{
    (void)state;
    uint64_t total = 0, avail = 0;
    assert_int_equal(kmem_host(&total, &avail), 0);
    assert_true(total > 0 && avail > 0 && avail <= total);
    /* this process is no sandbox: its anonymous memory, more than nothing and below
     * the host's memory; a pid that does not exist uses nothing */
    uint64_t self = kmem_kernel_bytes(getpid());
    assert_true(self > 0 && self < total);
    assert_true(kmem_kernel_bytes(0) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(least_recently_used_idle_session_goes),
        cmocka_unit_test(never_the_session_that_asked),
        cmocka_unit_test(never_a_session_running_code),
        cmocka_unit_test(pool_entries_before_any_session),
        cmocka_unit_test(skipped_and_empty_ones_are_passed_over),
        cmocka_unit_test(auto_budget_keeps_a_reserve),
        cmocka_unit_test(measures_a_live_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
