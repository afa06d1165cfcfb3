/*
 * cm_clock.h — the clocks: monotonic for deadlines and durations (never
 * jumps), wall for timestamps people read.
 */
#ifndef CM_CLOCK_H
#define CM_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds, milliseconds and seconds. */
uint64_t cm_mono_ns(void);
uint64_t cm_mono_ms(void);
double cm_mono_s(void);

/* CLOCK_REALTIME: seconds since the epoch, and milliseconds since it. */
double cm_wall_s(void);
uint64_t cm_wall_ms(void);

#endif
