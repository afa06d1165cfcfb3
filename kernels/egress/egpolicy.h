/*
 * egpolicy.h — a session's egress allow-list: which hosts and ports the
 * session's filtering proxy (egproxy.h) may connect to.
 *
 * An entry is one of
 *   pypi.org             a name; ports 80 and 443
 *   pypi.org:8443        a name and one port
 *   *.example.com[:P]    every name *under* example.com (a.example.com,
 *                        a.b.example.com; not example.com itself); the
 *                        wildcard is the whole first label, and the rest
 *                        has at least two labels ("*.com" is refused)
 *   192.0.2.7[:P]        an IPv4 address literal
 *   [2001:db8::7][:P]    an IPv6 address literal, in brackets
 * Names are compared case-insensitively without a trailing dot; labels are
 * letters, digits, '-' and '_' (1..63 bytes, no '-' at either end), the
 * whole name at most EGPOLICY_HOST_MAX bytes. A name entry never matches a
 * request for an address literal, nor the reverse. At most
 * EGPOLICY_MAX_ENTRIES entries, each at most EGPOLICY_ENTRY_MAX bytes.
 *
 * Forms: the API/MCP/config JSON {"allow": ["pypi.org", ...]} and the CLI's
 * and kernels' text "allow:pypi.org,*.example.com:443" (egpolicy_format()
 * writes the canonical text: lower case, entries in the given order).
 *
 * A listed name is resolved by the proxy only; an address that only this
 * host or its private networks answer on is dialled only when the list
 * names that address as a literal (egproxy.h: the rebinding defence).
 *
 * Pure C, no I/O (tests/unit/test_eg_policy.c).
 */
#ifndef KERNELS_EGRESS_EGPOLICY_H
#define KERNELS_EGRESS_EGPOLICY_H

#include <jansson.h>
#include <stddef.h>

#define EGPOLICY_MAX_ENTRIES 32
#define EGPOLICY_HOST_MAX 253
/* "[" v6 "]" or a name, ":" and five digits */
#define EGPOLICY_ENTRY_MAX 270
/* The canonical text's size bound ("allow:" and every entry with its comma). */
#define EGPOLICY_TEXT_MAX (6 + EGPOLICY_MAX_ENTRIES * (EGPOLICY_ENTRY_MAX + 1) + 1)
/* The prefix of the text form. */
#define EGPOLICY_PREFIX "allow:"

typedef enum egpolicy_kind {
    EGP_NAME = 0, /* host is a name */
    EGP_WILDCARD, /* host is the suffix under which every name matches */
    EGP_IPV4,     /* host is the dotted quad */
    EGP_IPV6,     /* host is the address without brackets, as inet_ntop writes it */
} egpolicy_kind;

typedef struct egpolicy_entry {
    egpolicy_kind kind;
    char host[EGPOLICY_HOST_MAX + 1];
    unsigned port; /* 0: 80 and 443 */
} egpolicy_entry;

typedef struct egpolicy {
    size_t n;
    egpolicy_entry e[EGPOLICY_MAX_ENTRIES];
} egpolicy;

void egpolicy_init(egpolicy *p);

/* Appends one entry. 0, or -1 with "allow entry \"X\": reason" in err (the
 * entry quoted at most 80 bytes). */
int egpolicy_add(egpolicy *p, const char *entry, char *err, size_t errlen);

/* Parses the text form "allow:A,B,..." (the prefix required) into p
 * (initialised here). 0, or -1 with a reason. */
int egpolicy_parse_text(egpolicy *p, const char *text, char *err, size_t errlen);

/* 1 when text starts with the text form's prefix. */
int egpolicy_is_text(const char *text);

/* Parses the JSON form {"allow": [strings]} (strict: no other key, at least
 * one entry) into p (initialised here). what names the value in errors
 * ("field \"network\"", "network"). 0, or -1 with a reason. */
int egpolicy_from_json(egpolicy *p, const json_t *v, const char *what, char *err, size_t errlen);

/* new: {"allow": [...]} in canonical form. */
json_t *egpolicy_to_json(const egpolicy *p);

/* Writes the canonical text form (EGPOLICY_TEXT_MAX bytes suffice). */
void egpolicy_format(const egpolicy *p, char *buf, size_t n);

/* Writes the entries, ", "-separated, for messages (truncated with "…"). */
void egpolicy_describe(const egpolicy *p, char *buf, size_t n);

/* The index of the first entry that allows host (a name, or an address
 * literal without brackets; case and a trailing dot do not matter) on
 * port, or -1. */
int egpolicy_match(const egpolicy *p, const char *host, unsigned port);

/* 1 when entry i names an address literal (the only way a list admits an
 * address of this host or its private networks). */
int egpolicy_is_literal(const egpolicy *p, int i);

/* 0 when every destination narrow allows, ceiling allows too (the operator's
 * configuration is a ceiling a less trusted tier may only narrow); else -1
 * with "allow entry \"X\" is not within the operator's allow list (...)". */
int egpolicy_within(const egpolicy *narrow, const egpolicy *ceiling, char *why, size_t n);

#endif
