/*
 * cm_clock.c — the clocks (see cm_clock.h).
 */
#include "common/cm_clock.h"

#include <time.h>

static struct timespec now(clockid_t c)
{
    struct timespec ts = {0, 0};
    clock_gettime(c, &ts); /* cannot fail for these clocks */
    return ts;
}

uint64_t cm_mono_ns(void)
{
    struct timespec ts = now(CLOCK_MONOTONIC);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t cm_mono_ms(void)
{
    return cm_mono_ns() / 1000000ull;
}

double cm_mono_s(void)
{
    struct timespec ts = now(CLOCK_MONOTONIC);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double cm_wall_s(void)
{
    struct timespec ts = now(CLOCK_REALTIME);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint64_t cm_wall_ms(void)
{
    struct timespec ts = now(CLOCK_REALTIME);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

struct timespec cm_mono_deadline(double seconds)
{
    struct timespec ts = now(CLOCK_MONOTONIC);
    if (!(seconds > 0))
        return ts;
    time_t whole = (time_t)seconds;
    ts.tv_sec += whole;
    ts.tv_nsec += (long)((seconds - (double)whole) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

int cm_cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc)
        return rc;
    rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (!rc)
        rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}
