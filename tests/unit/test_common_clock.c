/* Unit tests of common/cm_clock.c: the clocks agree with the system's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <time.h>

#include "common/cm_clock.h"

#include <errno.h>

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

/* cm_mono_deadline: now + s on CLOCK_MONOTONIC, nanoseconds normalised;
 * a cm_cond_init_mono condition times out at such a deadline. */
static void deadline_and_monotonic_condition(void **state)
{
    (void)state;
    struct timespec a;
    clock_gettime(CLOCK_MONOTONIC, &a);
    struct timespec d = cm_mono_deadline(1.75);
    double ad = (double)a.tv_sec + (double)a.tv_nsec / 1e9;
    double dd = (double)d.tv_sec + (double)d.tv_nsec / 1e9;
    assert_true(dd - ad >= 1.75 && dd - ad < 2.75);
    assert_true(d.tv_nsec >= 0 && d.tv_nsec < 1000000000L);
    struct timespec z = cm_mono_deadline(-3);
    assert_true((double)z.tv_sec + (double)z.tv_nsec / 1e9 >= ad);
    pthread_cond_t cv;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    assert_int_equal(cm_cond_init_mono(&cv), 0);
    double t0 = cm_mono_s();
    struct timespec w = cm_mono_deadline(0.05);
    pthread_mutex_lock(&mu);
    int rc;
    while ((rc = pthread_cond_timedwait(&cv, &mu, &w)) == 0) {
    }
    pthread_mutex_unlock(&mu);
    assert_int_equal(rc, ETIMEDOUT);
    assert_true(cm_mono_s() - t0 >= 0.05);
    pthread_cond_destroy(&cv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(monotonic_agrees_and_never_goes_back),
        cmocka_unit_test(wall_agrees),
        cmocka_unit_test(deadline_and_monotonic_condition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
