/*
 * mkmem.h — the memory kernels really use, measured from the outside, and
 * the host's: what admission under memory_budget counts (mkslots.c).
 *
 * A kernel is its kernel server process and everything it started (the
 * sandbox's monitor, init and worker, the cells' processes). A process in a
 * sandbox's memory cgroup is counted by that cgroup's usage, once for the
 * whole sandbox (sandbox_memory_cgroup_usage: page cache and tmpfs files
 * included, what the sandbox's memory limit is held against); every other
 * process of the tree by its anonymous resident memory (/proc/PID/statm:
 * resident less shared pages; the libraries every kernel maps are one page
 * cache, not each kernel's). The cost is a few small reads per process
 * outside a sandbox's cgroup (the kernel server and its monitor) and three
 * per sandbox, nothing per other host process: about 0.2 ms a kernel.
 *
 * No state: every call measures now. Thread-safe.
 */
#ifndef KERNELMGR_MKMEM_H
#define KERNELMGR_MKMEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Bytes the kernel whose server is process pid uses now (see above); 0 when
 * it is gone. */
uint64_t kmem_kernel_bytes(pid_t pid);

/* /proc/meminfo's MemTotal and MemAvailable in bytes. 0, or -1 (both 0)
 * when it cannot be read. */
int kmem_host(uint64_t *total, uint64_t *available);

/* What the rest of the host keeps when memory_budget is 0 (auto): an
 * eighth of MemTotal, and at least min(1 GiB, MemTotal / 2). */
uint64_t kmem_host_reserve(uint64_t total);

/* The auto memory_budget: total - kmem_host_reserve(total). */
uint64_t kmem_auto_budget(uint64_t total);

#endif
