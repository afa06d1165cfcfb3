/*
 * gwpeers.h — the gateway's accounting of its network connections, so that
 * peers without the token cannot starve the daemon whose process the
 * gateway shares (its fd table above all).
 *
 * Every accepted connection is counted from accept to close, and counted as
 * unauthenticated until one of its requests shows the token. Three bounds:
 *   max_total            connections of every kind at once (the gateway's
 *                        share of RLIMIT_NOFILE, computed by the caller);
 *   max_unauth           unauthenticated connections from all peers;
 *   max_unauth_per_peer  unauthenticated connections from one IPv4 address.
 * A connection over any of them is refused before anything is allocated for
 * it (gwpeers_check); the caller closes it at once.
 *
 * Memory is bounded by the connections themselves: a peer is remembered
 * only while it has an unauthenticated connection. Not thread-safe: the
 * gateway calls it from its one service thread. No libwebsockets here
 * (unit-tested on its own).
 */
#ifndef KERNELMGR_GWPEERS_H
#define KERNELMGR_GWPEERS_H

#include <stddef.h>
#include <stdint.h>

typedef struct gwpeers gwpeers;
typedef struct gwpeers_conn gwpeers_conn;

/* Why a connection is refused; GWPEERS_OK when it is not. */
typedef enum gwpeers_verdict {
    GWPEERS_OK = 0,
    GWPEERS_PEER,   /* its address holds max_unauth_per_peer unauthenticated ones */
    GWPEERS_UNAUTH, /* max_unauth unauthenticated ones are open */
    GWPEERS_TOTAL,  /* max_total connections are open */
} gwpeers_verdict;

/* new: an empty account with these bounds (each at least 1); NULL when out
 * of memory. */
gwpeers *gwpeers_new(unsigned max_total, unsigned max_unauth, unsigned max_unauth_per_peer);

/* Frees the account; connections still counted are forgotten (their records
 * must not be used afterwards). NULL-safe. */
void gwpeers_destroy(gwpeers **p);

/* Whether a new connection from addr (IPv4, network byte order) would be
 * admitted. Changes nothing. */
gwpeers_verdict gwpeers_check(const gwpeers *p, uint32_t addr);

/* Counts a new, unauthenticated connection from addr: its record (new,
 * owned by p; give it back with gwpeers_release), or NULL with *why set
 * (a bound, or GWPEERS_TOTAL when out of memory). */
gwpeers_conn *gwpeers_admit(gwpeers *p, uint32_t addr, gwpeers_verdict *why);

/* The connection showed the token: it no longer counts against the
 * unauthenticated bounds. Idempotent. */
void gwpeers_authenticated(gwpeers *p, gwpeers_conn *c);

/* 1 once gwpeers_authenticated was called for c. */
int gwpeers_is_authenticated(const gwpeers_conn *c);

/* A request of c reached the application (counted for the log: a
 * connection closed unauthenticated without one timed out or sent garbage). */
void gwpeers_request(gwpeers_conn *c);

/* The connection closed: uncounts it and frees *c (NULL-safe). Returns 1
 * when it closed unauthenticated and without a complete request. */
int gwpeers_release(gwpeers *p, gwpeers_conn **c);

/* Connections counted now: all of them, and the unauthenticated ones. */
unsigned gwpeers_total(const gwpeers *p);
unsigned gwpeers_unauth(const gwpeers *p);

/* The bound a verdict names and its value, for messages:
 * "http_max_unauth_per_peer" and 16. */
const char *gwpeers_limit_name(gwpeers_verdict v);
unsigned gwpeers_limit_value(const gwpeers *p, gwpeers_verdict v);

#endif
