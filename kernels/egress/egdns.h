/*
 * egdns.h — the egress proxy's own resolver, for tests: A records from one
 * DNS server over UDP, instead of the host's resolver (getaddrinfo).
 *
 * Only the operator can point the proxy at one: the variable
 * KERNELMGR_EGRESS_RESOLVER ("IPv4:port", e.g. "127.0.0.1:5353") in the
 * environment of the process that runs the proxy (the manager's, which its
 * kernels and session holders inherit). Nothing less trusted sets it: a
 * sandbox's environment is built from scratch (kenv.h), and the API, MCP
 * and configuration have no such field. Its purpose is testing what the
 * proxy does with a hostile DNS answer (a rebinding server that answers a
 * public address first and 127.0.0.1 next) without touching the host's
 * resolver configuration.
 *
 * The answer is hostile input: its id and question must match, an answer's
 * name is skipped (a compression pointer ends it, never followed), every
 * length is checked against the packet. Pure C and sockets (tests/unit/test_eg_dns.c).
 */
#ifndef KERNELS_EGRESS_EGDNS_H
#define KERNELS_EGRESS_EGDNS_H

#include <netinet/in.h>
#include <stddef.h>

#define EGDNS_ENV "KERNELMGR_EGRESS_RESOLVER"
#define EGDNS_MAX_ADDRS 8
#define EGDNS_TIMEOUT_MS 3000

/* Parses "a.b.c.d:port" into *server. 0, or -1. */
int egdns_parse_server(const char *text, struct sockaddr_in *server);

/* Builds the query for name's A records with id into buf (size bytes). Its
 * length, or -1 when name is no valid DNS name or buf is too small. */
int egdns_query(const char *name, unsigned short id, unsigned char *buf, size_t size);

/* Reads a response of len bytes to the query (qlen bytes, as built above):
 * up to max IPv4 addresses (network order) of its answers into out. The
 * count (0: none), or -1 when it is no valid answer to that query. */
int egdns_answer(const unsigned char *q, size_t qlen, const unsigned char *r, size_t len,
                 struct in_addr *out, int max);

/* Asks server for name's A records (one query, EGDNS_TIMEOUT_MS, a reply
 * from another address or for another query ignored). The count (> 0), or
 * -1 when it fails or there is none. */
int egdns_resolve(const struct sockaddr_in *server, const char *name, struct in_addr *out, int max);

#endif
