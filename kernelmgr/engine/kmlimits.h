/*
 * kmlimits.h — the ranges of the session options that the configuration
 * also sets (memory, cpus, cpu_time): the kernels' own limits (kernel
 * options --memory, --cpus, --cpu-time). Declared once here, below both
 * readers: config.c's table of configuration options (the operator's
 * values) and dtier.c's table of session options (a request's values).
 */
#ifndef KERNELMGR_KMLIMITS_H
#define KERNELMGR_KMLIMITS_H

/* the kernels' memory limit when none is set (sandbox.c's default) */
#define KM_MEMORY_DEFAULT (2ull << 30)
/* the smallest memory limit a kernel starts with, and as the help texts
 * write it (the two kept together) */
#define KM_MEMORY_MIN (16ull << 20)
#define KM_MEMORY_MIN_TEXT "16M"
/* a CPU rate cap, in CPUs */
#define KM_CPUS_MIN 0.01
#define KM_CPUS_MAX 4096.0
/* a CPU-time budget per block, in seconds */
#define KM_CPU_TIME_MIN 0.001
#define KM_CPU_TIME_MAX (86400.0 * 365)

#endif
