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
