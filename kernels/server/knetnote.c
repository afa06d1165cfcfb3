/*
 * knetnote.c — the network note (see knetnote.h).
 */
#include "kernels/server/knetnote.h"

#include <string.h>

/* What resolvers say when a name cannot be looked up: glibc's gai_strerror
 * (Python, Node, most C programs), curl and git, wget, ssh ("Could not
 * resolve hostname"), Node's error code. Each shorter than KNETNOTE_CARRY. */
static const char *const knetnote_lookup[] = {
    "Temporary failure in name resolution",
    "Name or service not known",
    "No address associated with hostname",
    "Could not resolve host",
    "unable to resolve host address",
    "getaddrinfo EAI_AGAIN",
    NULL,
};

void knetnote_start(knetnote *n, int active, long long no_routes)
{
    memset(n, 0, sizeof *n);
    n->active = active;
    n->no_routes = no_routes;
    n->refused = -1;
}

void knetnote_start_allow(knetnote *n, long long no_routes, long long refused)
{
    knetnote_start(n, 1, no_routes);
    n->refused = refused;
}

static int knetnote_has(const char *text, size_t len, const char *what)
{
    size_t w = strlen(what);
    for (size_t i = 0; len >= w && i <= len - w; i++)
        if (text[i] == what[0] && !memcmp(text + i, what, w))
            return 1;
    return 0;
}

static int knetnote_has_any(const char *text, size_t len)
{
    for (const char *const *p = knetnote_lookup; *p; p++)
        if (knetnote_has(text, len, *p))
            return 1;
    return 0;
}

void knetnote_scan(knetnote *n, const char *text, size_t len)
{
    if (!n->active || n->lookup_failed || !text || !len)
        return;
    if (knetnote_has_any(text, len)) {
        n->lookup_failed = 1;
        return;
    }
    /* A message split across chunks: the carried end and this start. */
    size_t c = strlen(n->carry);
    char joint[2 * KNETNOTE_CARRY];
    size_t head = len < KNETNOTE_CARRY - 1 ? len : KNETNOTE_CARRY - 1;
    memcpy(joint, n->carry, c);
    memcpy(joint + c, text, head);
    if (c && knetnote_has_any(joint, c + head)) {
        n->lookup_failed = 1;
        return;
    }
    /* Keep the last KNETNOTE_CARRY - 1 bytes seen (no NUL inside: a NUL
     * would end the carry early, which only loses a split match). */
    size_t keep = KNETNOTE_CARRY - 1;
    if (len >= keep) {
        memcpy(n->carry, text + len - keep, keep);
        n->carry[keep] = 0;
    } else {
        size_t drop = c + len > keep ? c + len - keep : 0;
        memmove(n->carry, n->carry + drop, c - drop);
        memcpy(n->carry + c - drop, text, len);
        n->carry[c - drop + len] = 0;
    }
}

int knetnote_due(const knetnote *n, int failed, long long no_routes_now)
{
    if (!n->active || !failed)
        return 0;
    if (n->lookup_failed)
        return 1;
    return n->no_routes >= 0 && no_routes_now > n->no_routes;
}

int knetnote_due_allow(const knetnote *n, int failed, long long no_routes_now,
                       long long refused_now)
{
    if (!n->active || !failed)
        return 0;
    return knetnote_due(n, failed, no_routes_now) || (n->refused >= 0 && refused_now > n->refused);
}
