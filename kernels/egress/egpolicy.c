/*
 * egpolicy.c — the egress allow-list: parsing, canonical form, matching and
 * the ceiling check (see egpolicy.h).
 */
#include "kernels/egress/egpolicy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void egpolicy_init(egpolicy *p)
{
    memset(p, 0, sizeof *p);
}

static int fail(char *err, size_t errlen, const char *entry, const char *why)
{
    snprintf(err, errlen, "allow entry \"%.80s\": %s", entry, why);
    return -1;
}

/* Lower-cases a name in place and drops one trailing dot. 0, or -1 with why
 * when it is no valid name. */
static int check_name(char *h, const char **why)
{
    size_t len = strlen(h);
    if (len && h[len - 1] == '.')
        h[--len] = 0;
    if (!len) {
        *why = "empty host name";
        return -1;
    }
    if (len > EGPOLICY_HOST_MAX) {
        *why = "the host name is longer than 253 bytes";
        return -1;
    }
    size_t lab = 0;
    for (size_t i = 0; i <= len; i++) {
        char c = h[i];
        if (c == '.' || c == 0) {
            if (lab == 0) {
                *why = "empty label in the host name";
                return -1;
            }
            if (lab > 63) {
                *why = "a label of the host name is longer than 63 bytes";
                return -1;
            }
            if (h[i - 1] == '-' || h[i - lab] == '-') {
                *why = "a label of the host name starts or ends with '-'";
                return -1;
            }
            lab = 0;
            continue;
        }
        if (c == '*') {
            *why = "a wildcard must be the whole first label, as in \"*.example.com\"";
            return -1;
        }
        if (!isalnum((unsigned char)c) && c != '-' && c != '_') {
            *why = "the host name has a character other than letters, digits, '-', '_' and '.'";
            return -1;
        }
        h[i] = (char)tolower((unsigned char)c);
        lab++;
    }
    return 0;
}

static int parse_port(const char *s, unsigned *port)
{
    if (!*s || strlen(s) > 5 || strspn(s, "0123456789") != strlen(s))
        return -1;
    unsigned long v = strtoul(s, NULL, 10);
    if (v < 1 || v > 65535)
        return -1;
    *port = (unsigned)v;
    return 0;
}

int egpolicy_add(egpolicy *p, const char *entry, char *err, size_t errlen)
{
    if (!entry || !*entry)
        return fail(err, errlen, "", "empty entry");
    if (strlen(entry) > EGPOLICY_ENTRY_MAX)
        return fail(err, errlen, entry, "longer than 270 bytes (the longest entry allowed)");
    if (p->n >= EGPOLICY_MAX_ENTRIES) {
        snprintf(err, errlen, "allow list: more than %d entries (the most allowed)",
                 EGPOLICY_MAX_ENTRIES);
        return -1;
    }
    char buf[EGPOLICY_ENTRY_MAX + 1];
    snprintf(buf, sizeof buf, "%s", entry);
    egpolicy_entry e;
    memset(&e, 0, sizeof e);
    char *host = buf, *port = NULL;
    if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (!close)
            return fail(err, errlen, entry, "an IPv6 address needs its closing ']'");
        *close = 0;
        host = buf + 1;
        if (close[1] == ':')
            port = close + 2;
        else if (close[1])
            return fail(err, errlen, entry, "only \":PORT\" may follow \"]\"");
        struct in6_addr a6;
        if (inet_pton(AF_INET6, host, &a6) != 1)
            return fail(err, errlen, entry, "not an IPv6 address inside the brackets");
        e.kind = EGP_IPV6;
        inet_ntop(AF_INET6, &a6, e.host, sizeof e.host);
    } else {
        char *colon = strchr(buf, ':');
        if (colon && strchr(colon + 1, ':'))
            return fail(err, errlen, entry,
                        "an IPv6 address must be in brackets, as in \"[2001:db8::1]:443\"");
        if (colon) {
            *colon = 0;
            port = colon + 1;
        }
        struct in_addr a4;
        if (inet_pton(AF_INET, host, &a4) == 1) {
            e.kind = EGP_IPV4;
            inet_ntop(AF_INET, &a4, e.host, sizeof e.host);
        } else {
            if (!strncmp(host, "*.", 2)) {
                e.kind = EGP_WILDCARD;
                host += 2;
            } else {
                e.kind = EGP_NAME;
            }
            const char *why = NULL;
            if (check_name(host, &why))
                return fail(err, errlen, entry, why);
            if (e.kind == EGP_WILDCARD && !strchr(host, '.'))
                return fail(err, errlen, entry,
                            "a wildcard must cover names under a domain of at least two labels, "
                            "as in \"*.example.com\"");
            if (strspn(host, "0123456789.") == strlen(host))
                return fail(err, errlen, entry, "not a valid IPv4 address");
            memcpy(e.host, host, strlen(host) + 1); /* check_name: <= EGPOLICY_HOST_MAX */
        }
    }
    if (port && parse_port(port, &e.port))
        return fail(err, errlen, entry, "the port must be a number from 1 to 65535");
    p->e[p->n++] = e;
    return 0;
}

int egpolicy_is_text(const char *text)
{
    return text && !strncmp(text, EGPOLICY_PREFIX, strlen(EGPOLICY_PREFIX));
}

int egpolicy_parse_text(egpolicy *p, const char *text, char *err, size_t errlen)
{
    egpolicy_init(p);
    if (!egpolicy_is_text(text)) {
        snprintf(err, errlen, "an allow list starts with \"allow:\"");
        return -1;
    }
    const char *s = text + strlen(EGPOLICY_PREFIX);
    if (!*s) {
        snprintf(err, errlen,
                 "allow list: no entry (name at least one host, as in \"allow:pypi.org\"; "
                 "network off allows nothing)");
        return -1;
    }
    if (strlen(s) > EGPOLICY_TEXT_MAX) {
        snprintf(err, errlen, "allow list: longer than %d bytes", EGPOLICY_TEXT_MAX);
        return -1;
    }
    for (;;) {
        size_t l = strcspn(s, ",");
        char one[EGPOLICY_ENTRY_MAX + 2];
        if (l > EGPOLICY_ENTRY_MAX) {
            snprintf(one, sizeof one, "%.*s", EGPOLICY_ENTRY_MAX + 1, s);
            return fail(err, errlen, one, "longer than 270 bytes (the longest entry allowed)");
        }
        snprintf(one, sizeof one, "%.*s", (int)l, s);
        if (egpolicy_add(p, one, err, errlen))
            return -1;
        if (!s[l])
            return 0;
        s += l + 1;
    }
}

int egpolicy_from_json(egpolicy *p, const json_t *v, const char *what, char *err, size_t errlen)
{
    egpolicy_init(p);
    json_t *allow = NULL;
    json_error_t jerr;
    if (!json_is_object(v) ||
        json_unpack_ex((json_t *)v, &jerr, JSON_STRICT, "{s:o}", "allow", &allow) != 0) {
        snprintf(err, errlen,
                 "%s: must be \"on\", \"off\" or {\"allow\": [\"host[:port]\", ...]} (%s)", what,
                 json_is_object(v) ? jerr.text : "not an object");
        return -1;
    }
    if (!json_is_array(allow) || json_array_size(allow) == 0) {
        snprintf(err, errlen,
                 "%s: \"allow\" must be a non-empty array of \"host[:port]\" strings (network "
                 "\"off\" allows nothing)",
                 what);
        return -1;
    }
    size_t i;
    json_t *it;
    json_array_foreach(allow, i, it)
    {
        char why[400];
        if (!json_is_string(it)) {
            snprintf(err, errlen, "%s: allow[%zu] must be a string", what, i);
            return -1;
        }
        if (egpolicy_add(p, json_string_value(it), why, sizeof why)) {
            snprintf(err, errlen, "%s: %s", what, why);
            return -1;
        }
    }
    return 0;
}

static void entry_text(const egpolicy_entry *e, char *buf, size_t n)
{
    char port[16] = "";
    if (e->port)
        snprintf(port, sizeof port, ":%u", e->port & 0xffffu);
    snprintf(buf, n, "%s%s%s%s%s", e->kind == EGP_WILDCARD ? "*." : "",
             e->kind == EGP_IPV6 ? "[" : "", e->host, e->kind == EGP_IPV6 ? "]" : "", port);
}

json_t *egpolicy_to_json(const egpolicy *p)
{
    json_t *a = json_array();
    for (size_t i = 0; i < p->n; i++) {
        char t[EGPOLICY_ENTRY_MAX + 8];
        entry_text(&p->e[i], t, sizeof t);
        json_array_append_new(a, json_string(t));
    }
    return json_pack("{s:o}", "allow", a);
}

void egpolicy_format(const egpolicy *p, char *buf, size_t n)
{
    size_t len = (size_t)snprintf(buf, n, "%s", EGPOLICY_PREFIX);
    for (size_t i = 0; i < p->n && len < n; i++) {
        char t[EGPOLICY_ENTRY_MAX + 8];
        entry_text(&p->e[i], t, sizeof t);
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? "," : "", t);
    }
}

void egpolicy_describe(const egpolicy *p, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (size_t i = 0; i < p->n; i++) {
        char t[EGPOLICY_ENTRY_MAX + 8];
        entry_text(&p->e[i], t, sizeof t);
        if (len + strlen(t) + 8 >= n) {
            snprintf(buf + len, n - len, ", …");
            return;
        }
        len += (size_t)snprintf(buf + len, n - len, "%s%s", i ? ", " : "", t);
    }
}

static int port_ok(unsigned want, unsigned port)
{
    return want ? want == port : port == 80 || port == 443;
}

/* 1 when name (normalised) lies strictly under suffix. */
static int under(const char *name, const char *suffix)
{
    size_t nl = strlen(name), sl = strlen(suffix);
    return nl > sl + 1 && name[nl - sl - 1] == '.' && !strcmp(name + nl - sl, suffix);
}

int egpolicy_match(const egpolicy *p, const char *host, unsigned port)
{
    char h[EGPOLICY_HOST_MAX + 2];
    size_t hl = strlen(host);
    if (hl == 0 || hl > EGPOLICY_HOST_MAX + 1)
        return -1;
    for (size_t i = 0; i <= hl; i++)
        h[i] = (char)tolower((unsigned char)host[i]);
    if (h[hl - 1] == '.')
        h[--hl] = 0;
    struct in_addr a4;
    struct in6_addr a6;
    egpolicy_kind kind = inet_pton(AF_INET, h, &a4) == 1    ? EGP_IPV4
                         : inet_pton(AF_INET6, h, &a6) == 1 ? EGP_IPV6
                                                            : EGP_NAME;
    char lit[INET6_ADDRSTRLEN];
    if (kind == EGP_IPV4)
        inet_ntop(AF_INET, &a4, lit, sizeof lit);
    else if (kind == EGP_IPV6)
        inet_ntop(AF_INET6, &a6, lit, sizeof lit);
    for (size_t i = 0; i < p->n; i++) {
        const egpolicy_entry *e = &p->e[i];
        if (!port_ok(e->port, port))
            continue;
        int hit = 0;
        switch (e->kind) {
        case EGP_NAME:
            hit = kind == EGP_NAME && !strcmp(e->host, h);
            break;
        case EGP_WILDCARD:
            hit = kind == EGP_NAME && under(h, e->host);
            break;
        case EGP_IPV4:
        case EGP_IPV6:
            hit = kind == e->kind && !strcmp(e->host, lit);
            break;
        }
        if (hit)
            return (int)i;
    }
    return -1;
}

int egpolicy_is_literal(const egpolicy *p, int i)
{
    return i >= 0 && (size_t)i < p->n && (p->e[i].kind == EGP_IPV4 || p->e[i].kind == EGP_IPV6);
}

/* 1 when ceiling entry c allows everything entry e allows. */
static int covers(const egpolicy_entry *c, const egpolicy_entry *e)
{
    if (c->port && c->port != e->port)
        return 0; /* e without a port means 80 and 443: c must allow both */
    if (!c->port && e->port && e->port != 80 && e->port != 443)
        return 0;
    switch (c->kind) {
    case EGP_NAME:
    case EGP_IPV4:
    case EGP_IPV6:
        return e->kind == c->kind && !strcmp(e->host, c->host);
    case EGP_WILDCARD:
        return (e->kind == EGP_NAME && under(e->host, c->host)) ||
               (e->kind == EGP_WILDCARD && (!strcmp(e->host, c->host) || under(e->host, c->host)));
    }
    return 0;
}

int egpolicy_within(const egpolicy *narrow, const egpolicy *ceiling, char *why, size_t n)
{
    for (size_t i = 0; i < narrow->n; i++) {
        const egpolicy_entry *e = &narrow->e[i];
        int ok = 0;
        for (size_t j = 0; j < ceiling->n && !ok; j++)
            ok = covers(&ceiling->e[j], e);
        /* no port: both 80 and 443, each maybe by its own ceiling entry */
        if (!ok && !e->port) {
            egpolicy_entry e80 = *e, e443 = *e;
            e80.port = 80;
            e443.port = 443;
            int a = 0, b = 0;
            for (size_t j = 0; j < ceiling->n; j++) {
                a |= covers(&ceiling->e[j], &e80);
                b |= covers(&ceiling->e[j], &e443);
            }
            ok = a && b;
        }
        if (!ok) {
            char t[EGPOLICY_ENTRY_MAX + 8], list[600];
            entry_text(e, t, sizeof t);
            egpolicy_describe(ceiling, list, sizeof list);
            snprintf(why, n, "allow entry \"%s\" is not within the operator's allow list (%s)", t,
                     list);
            return -1;
        }
    }
    return 0;
}
