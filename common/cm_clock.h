/*
 * cm_clock.h — the clocks: monotonic for deadlines and durations (never
 * jumps), wall for timestamps people read.
 */
#ifndef CM_CLOCK_H
#define CM_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds, milliseconds and seconds. */
uint64_t cm_mono_ns(void);
uint64_t cm_mono_ms(void);
double cm_mono_s(void);

/* CLOCK_REALTIME: seconds since the epoch, and milliseconds since it. */
double cm_wall_s(void);
uint64_t cm_wall_ms(void);

/* The CLOCK_MONOTONIC time `seconds` (>= 0) from now, as an absolute
 * deadline for pthread_cond_timedwait on a cm_cond_init_mono condition. */
struct timespec cm_mono_deadline(double seconds);

/* Initialises cv with CLOCK_MONOTONIC as its timedwait clock (a wall-clock
 * jump then neither cuts nor stretches a wait). 0, or an errno value. */
int cm_cond_init_mono(pthread_cond_t *cv);

#endif
