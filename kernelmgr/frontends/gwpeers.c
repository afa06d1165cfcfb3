/*
 * gwpeers.c — connection accounting per peer (see gwpeers.h).
 */
#include "kernelmgr/frontends/gwpeers.h"

#include <stdlib.h>

/* out of memory in HASH_ADD: the connection is refused, the daemon lives
 * (uthash's default would exit) */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (add_failed = 1)
#include <uthash.h>

/* A peer with at least one unauthenticated connection. */
typedef struct peer {
    uint32_t addr;
    unsigned unauth;
    UT_hash_handle hh;
} peer;

struct gwpeers_conn {
    uint32_t addr;
    int authed;
    int requests;
};

struct gwpeers {
    unsigned max_total, max_unauth, max_unauth_per_peer;
    unsigned total, unauth;
    peer *peers; /* uthash by addr */
};

gwpeers *gwpeers_new(unsigned max_total, unsigned max_unauth, unsigned max_unauth_per_peer)
{
    gwpeers *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->max_total = max_total ? max_total : 1;
    p->max_unauth = max_unauth ? max_unauth : 1;
    p->max_unauth_per_peer = max_unauth_per_peer ? max_unauth_per_peer : 1;
    return p;
}

void gwpeers_destroy(gwpeers **pp)
{
    if (!pp || !*pp)
        return;
    gwpeers *p = *pp;
    peer *e, *tmp;
    HASH_ITER(hh, p->peers, e, tmp)
    {
        HASH_DEL(p->peers, e);
        free(e);
    }
    free(p);
    *pp = NULL;
}

static peer *find(const gwpeers *p, uint32_t addr)
{
    peer *e = NULL;
    HASH_FIND(hh, p->peers, &addr, sizeof addr, e);
    return e;
}

gwpeers_verdict gwpeers_check(const gwpeers *p, uint32_t addr)
{
    if (p->total >= p->max_total)
        return GWPEERS_TOTAL;
    if (p->unauth >= p->max_unauth)
        return GWPEERS_UNAUTH;
    const peer *e = find(p, addr);
    if (e && e->unauth >= p->max_unauth_per_peer)
        return GWPEERS_PEER;
    return GWPEERS_OK;
}

gwpeers_conn *gwpeers_admit(gwpeers *p, uint32_t addr, gwpeers_verdict *why)
{
    gwpeers_verdict v = gwpeers_check(p, addr);
    if (v != GWPEERS_OK) {
        *why = v;
        return NULL;
    }
    gwpeers_conn *c = calloc(1, sizeof *c);
    peer *e = find(p, addr);
    if (c && !e && (e = calloc(1, sizeof *e))) {
        int add_failed = 0;
        e->addr = addr;
        HASH_ADD(hh, p->peers, addr, sizeof e->addr, e);
        if (add_failed) {
            free(e);
            e = NULL;
        }
    }
    if (!c || !e) {
        free(c);
        *why = GWPEERS_TOTAL;
        return NULL;
    }
    c->addr = addr;
    e->unauth++;
    p->unauth++;
    p->total++;
    *why = GWPEERS_OK;
    return c;
}

/* One unauthenticated connection of addr less; the peer is forgotten at 0. */
static void unauth_drop(gwpeers *p, uint32_t addr)
{
    peer *e = find(p, addr);
    if (e && --e->unauth == 0) {
        HASH_DEL(p->peers, e);
        free(e);
    }
    p->unauth--;
}

void gwpeers_authenticated(gwpeers *p, gwpeers_conn *c)
{
    if (!c || c->authed)
        return;
    c->authed = 1;
    unauth_drop(p, c->addr);
}

int gwpeers_is_authenticated(const gwpeers_conn *c)
{
    return c && c->authed;
}

void gwpeers_request(gwpeers_conn *c)
{
    if (c)
        c->requests++;
}

int gwpeers_release(gwpeers *p, gwpeers_conn **pc)
{
    if (!pc || !*pc)
        return 0;
    gwpeers_conn *c = *pc;
    int idle = !c->authed && !c->requests;
    if (!c->authed)
        unauth_drop(p, c->addr);
    p->total--;
    free(c);
    *pc = NULL;
    return idle;
}

unsigned gwpeers_total(const gwpeers *p)
{
    return p->total;
}

unsigned gwpeers_unauth(const gwpeers *p)
{
    return p->unauth;
}

const char *gwpeers_limit_name(gwpeers_verdict v)
{
    switch (v) {
    case GWPEERS_PEER:
        return "http_max_unauth_per_peer";
    case GWPEERS_UNAUTH:
        return "http_max_unauth";
    case GWPEERS_TOTAL:
        return "the gateway's connection budget (from RLIMIT_NOFILE)";
    default:
        return "none";
    }
}

unsigned gwpeers_limit_value(const gwpeers *p, gwpeers_verdict v)
{
    switch (v) {
    case GWPEERS_PEER:
        return p->max_unauth_per_peer;
    case GWPEERS_UNAUTH:
        return p->max_unauth;
    case GWPEERS_TOTAL:
        return p->max_total;
    default:
        return 0;
    }
}
