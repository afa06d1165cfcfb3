/*
 * knetnote.h — the network note: the line a cell's result gets when the
 * network policy is why it failed.
 *
 * With network off the sandbox's namespace holds only lo, so two kinds of
 * failure come from the policy, whatever the language: a connect or send to
 * an address outside the sandbox (ENETUNREACH, counted by the kernel:
 * sandbox_net_no_routes() grew during the cell), and a name lookup of
 * anything but localhost (there is no resolver; seen in the cell's stderr or
 * error as the resolver's own message, e.g. glibc's "Temporary failure in
 * name resolution", curl's "Could not resolve host"). The note is added to
 * the reply's limits_hit only when the cell failed (an error, or a non-zero
 * exit code) and one of the two was seen; the cell's stderr and traceback
 * stay as they are. Never with network on or without the strict sandbox.
 */
#ifndef KERNELS_SERVER_KNETNOTE_H
#define KERNELS_SERVER_KNETNOTE_H

#include <stddef.h>

#define KNETNOTE_TEXT                                                                              \
    "network is off for this session (network=off): only 127.0.0.1 and ::1 inside the sandbox "    \
    "are reachable"

/* With an allow-list (--network allow:...) the namespace is the same, with
 * the egress proxy as the one way out: the note is also due when the proxy
 * refused a request during the failed cell (its refusal count grew), and
 * says so, with the list and the last refusal (kexec.c adds them). */
#define KNETNOTE_ALLOW_TEXT                                                                        \
    "network policy allow-list for this session: only the listed hosts are reachable, through "    \
    "the egress proxy (HTTP_PROXY / HTTPS_PROXY: http://127.0.0.1:3128); there is no DNS in the "  \
    "sandbox"

/* The longest resolver message looked for, less one: the text kept across
 * chunks so that a message split between two reads is still found. */
#define KNETNOTE_CARRY 40

typedef struct knetnote {
    int active;                     /* network off, strict sandbox: notes may be due */
    long long no_routes;            /* sandbox_net_no_routes() when the cell started, -1: unknown */
    long long refused;              /* the egress proxy's refusals then; -1: no allow-list */
    int lookup_failed;              /* a resolver failure was seen in this cell's output */
    char carry[KNETNOTE_CARRY + 1]; /* the end of the last chunk scanned */
} knetnote;

/* A cell starts: active says whether the policy applies (network off, strict),
 * no_routes is the sandbox's count now. */
void knetnote_start(knetnote *n, int active, long long no_routes);

/* The same with an allow-list: refused is the egress proxy's refusal count
 * now (egproxy_refusals). */
void knetnote_start_allow(knetnote *n, long long no_routes, long long refused);

/* Looks for a resolver failure in len bytes of the cell's stderr or error
 * text (chunks in order; NULs are fine). */
void knetnote_scan(knetnote *n, const char *text, size_t len);

/* 1 when the cell, which failed when failed is set, gets the note, given
 * the sandbox's count of unroutable connects and sends now (-1: unknown). */
int knetnote_due(const knetnote *n, int failed, long long no_routes_now);

/* knetnote_due with an allow-list: also when the proxy's refusal count is
 * above the one at the start. */
int knetnote_due_allow(const knetnote *n, int failed, long long no_routes_now,
                       long long refused_now);

#endif
