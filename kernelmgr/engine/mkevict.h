/*
 * mkevict.h — which session gives way when a kernel must start and the cap
 * on live kernels (max_kernels) or the memory budget (memory_budget) is
 * reached: the rule as a pure function of what the caller saw. mkslots.c
 * gathers the candidates (under the manager's lock) and stops every kernel
 * of the one chosen.
 *
 * The rule, in order:
 *   1. a warm-pool entry (it holds nobody's state);
 *   2. the session used least recently among those that have a live kernel
 *      and are not running code;
 *   never the session that asked (its other kernels are its state too: a
 *   session switching between languages keeps both), never a session
 *   running code. A session gives way as a whole, all its kernels at once:
 *   its state is one thing to its user, and a half of it kept would only
 *   be taken at the next start.
 */
#ifndef KERNELMGR_MKEVICT_H
#define KERNELMGR_MKEVICT_H

#include <stddef.h>

typedef struct kevict_cand {
    double last_used;      /* when it last started a kernel or ran code (one clock for all) */
    unsigned kernels;      /* its live kernels */
    unsigned char self;    /* the session that asked */
    unsigned char running; /* running code */
    unsigned char pool;    /* a warm-pool entry */
    unsigned char skip;    /* the caller could not take it (tried before; being closed) */
} kevict_cand;

/* The index in c[0..n) of the candidate that gives way by the rule above
 * (the first of equals), or -1 when none may. */
long kevict_choose(const kevict_cand *c, size_t n);

#endif
