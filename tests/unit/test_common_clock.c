/* Unit tests of common/cm_clock.c: the clocks agree with the system's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <time.h>

#include "common/cm_clock.h"

static void monotonic_agrees_and_never_goes_back(void **state)
{
    (void)state;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    uint64_t ns = cm_mono_ns(), ms = cm_mono_ms();
    double s = cm_mono_s();
    clock_gettime(CLOCK_MONOTONIC, &b);
    uint64_t lo = (uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec;
    uint64_t hi = (uint64_t)b.tv_sec * 1000000000ull + (uint64_t)b.tv_nsec;
    assert_true(ns >= lo && ns <= hi);
    assert_true(ms >= lo / 1000000 && ms <= hi / 1000000);
    assert_true(s >= (double)lo / 1e9 - 1e-6 && s <= (double)hi / 1e9 + 1e-6);
    uint64_t prev = cm_mono_ns();
    for (int i = 0; i < 1000; i++) {
        uint64_t t = cm_mono_ns();
        assert_true(t >= prev);
        prev = t;
    }
}

static void wall_agrees(void **state)
{
    (void)state;
    struct timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    double s = cm_wall_s();
    uint64_t ms = cm_wall_ms();
    clock_gettime(CLOCK_REALTIME, &b);
    assert_true(s >= (double)a.tv_sec && s <= (double)b.tv_sec + 1);
    assert_true(ms >= (uint64_t)a.tv_sec * 1000 && ms <= (uint64_t)b.tv_sec * 1000 + 1000);
    assert_true(s > 1.7e9); /* after 2023: the epoch, not the boot */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(monotonic_agrees_and_never_goes_back),
        cmocka_unit_test(wall_agrees),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
