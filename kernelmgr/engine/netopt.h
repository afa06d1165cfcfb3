/*
 * netopt.h — a session's network option in the manager: off, on, or an
 * egress allow-list (kernels/egress/egpolicy.h), in the three forms it
 * travels in: the int + canonical text the manager stores (network
 * KM_NET_*, allow "allow:a,b" when KM_NET_ALLOW, else ""), the JSON of the
 * API, MCP, config and session.json ("on", "off", true/false,
 * {"allow": ["a", "b"]}) and the text of the CLI and the kernels' command
 * line ("on", "off", "allow:a,b").
 *
 * Pure functions, no globals (tests/unit/test_eg_policy.c).
 */
#ifndef KERNELMGR_NETOPT_H
#define KERNELMGR_NETOPT_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>

#include "kernels/egress/egpolicy.h"

#define KM_NET_OFF 0
#define KM_NET_ON 1
#define KM_NET_ALLOW 2
/* Room for the canonical text of any allow-list. */
#define KM_NET_ALLOW_MAX EGPOLICY_TEXT_MAX

/* Parses the JSON form into *network and allow (KM_NET_ALLOW_MAX bytes).
 * what names the value in errors ("field \"network\"", "network"). 0, or -1
 * with a reason. */
int km_net_from_json(const json_t *v, const char *what, int *network, char *allow, size_t n,
                     km_err *err);

/* Parses the text form ("on", "off", "allow:..."). 0, or -1 with a reason
 * naming what. */
int km_net_from_text(const char *s, const char *what, int *network, char *allow, size_t n,
                     km_err *err);

/* new: the JSON form. */
json_t *km_net_json(int network, const char *allow);

/* borrowed: the text form (allow itself for KM_NET_ALLOW). */
const char *km_net_text(int network, const char *allow);

/* 1 when both name the same policy. */
int km_net_equal(int a, const char *a_allow, int b, const char *b_allow);

#endif
