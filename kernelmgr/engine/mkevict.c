/*
 * mkevict.c — the choice of the session that gives way (mkevict.h).
 */
#include "kernelmgr/engine/mkevict.h"

long kevict_choose(const kevict_cand *c, size_t n)
{
    long best = -1;
    for (size_t i = 0; i < n; i++) {
        const kevict_cand *x = &c[i];
        if (x->skip || x->self || !x->kernels || (x->running && !x->pool))
            continue;
        if (best < 0) {
            best = (long)i;
            continue;
        }
        const kevict_cand *b = &c[best];
        /* a pool entry before any session; then the least recently used */
        if (x->pool != b->pool ? x->pool : x->last_used < b->last_used)
            best = (long)i;
    }
    return best;
}
