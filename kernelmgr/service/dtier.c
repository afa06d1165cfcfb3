/*
 * dtier.c — the tiers of a daemon connection, the table of session
 * options, the operator's ceilings and the scrubbing of replies (see
 * dtier.h).
 */
#include "kernelmgr/service/dtier.h"
#include "kernelmgr/service/rpc.h"
#include "kernelmgr/engine/kmlimits.h"
#include "kernelmgr/engine/sessopt.h"
#include "kernels/server/kenv.h"
#include "kernels/egress/egproxy.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const tier_names[DT_NTIERS] = {"owner", "mcp", "http"};
static const char *const tier_clients[DT_NTIERS] = {"the socket's owner", "MCP clients",
                                                    "HTTP clients"};
/* how the operator opts a tier into the relaxing values */
static const char *const tier_optin[DT_NTIERS] = {"",
                                                  "`kernelmgr mcp --allow-unsafe-session-options`",
                                                  "config http_allow_unsafe_session_options"};

const char *dtier_name(dtier t)
{
    return (unsigned)t < DT_NTIERS ? tier_names[t] : "?";
}

const char *dtier_clients(dtier t)
{
    return (unsigned)t < DT_NTIERS ? tier_clients[t] : "?";
}

int dtier_parse(const char *name, dtier *t)
{
    for (int i = 0; name && i < DT_NTIERS; i++)
        if (!strcmp(name, tier_names[i])) {
            *t = (dtier)i;
            return 0;
        }
    return -1;
}

#define HOST_PATH "it names a host path"
#define RELAXES "it relaxes the sandbox"

/* The session options. The ranges are the kernels' own (--cpus, --cpu-time,
 * --memory: kmlimits.h), the same as the configuration's (config.c). Host paths are the owner's;
 * over HTTP the operator's opt-in also allows them (as it always did); the
 * model behind MCP never names one. */
const dtier_sessopt dtier_sessopts[] = {
    {{"network", DT_ALL, DT_M | DT_H, RELAXES},
     DT_SO_NETWORK,
     0,
     0,
     {"on", "off", NULL},
     "on",
     DT_CEIL_NETWORK,
     "Network inside the sandbox: \"off\" (default), \"on\", or {\"allow\": [\"pypi.org\", "
     "\"*.example.com:443\"]}: only those hosts (ports 80 and 443 unless given), through a "
     "filtering proxy (HTTPS_PROXY); at most the operator's list.",
     NULL},
    {{"memory", DT_ALL, 0, NULL},
     DT_SO_SIZE,
     KM_MEMORY_MIN,
     0,
     {NULL},
     NULL,
     DT_CEIL_MEMORY,
     "Memory limit of the session's sandbox, which its kernels share (per kernel when the "
     "operator's session_sandbox is false), e.g. \"1G\" (at least " KM_MEMORY_MIN_TEXT
     ", at most the operator's).",
     NULL},
    {{"python", DT_O, DT_H, HOST_PATH},
     DT_SO_PATH,
     0,
     0,
     {NULL},
     NULL,
     DT_CEIL_NONE,
     "Absolute path of the Python kernel's interpreter.",
     NULL},
    {{"workspace", DT_O, DT_H, HOST_PATH},
     DT_SO_PATH,
     0,
     0,
     {NULL},
     NULL,
     DT_CEIL_NONE,
     "Absolute path of an existing directory used as the workspace.",
     "a fresh `sessions/NAME/workspace`"},
    {{"sandbox", DT_ALL, DT_M | DT_H, RELAXES},
     DT_SO_CHOICE,
     0,
     0,
     {"strict", "none", NULL},
     "none",
     DT_CEIL_SANDBOX,
     "Sandbox level (default strict).",
     NULL},
    {{"env", DT_ALL, 0, NULL},
     DT_SO_ENV,
     0,
     0,
     {NULL},
     NULL,
     DT_CEIL_NONE,
     "Environment variables for the code, {NAME: value}, on top of the operator's (a session "
     "keeps the variables it was "
     "created with; the code sees no other variable of the server's but LANG, LC_*, TERM and "
     "TZ).",
     NULL},
/* the plain ones (sessopt.def); the configuration's value is a number's
 * or size's ceiling */
#define KM_SO_DEF_BOOL(n, fl, sf, t, d, ch, ah, lh)                                                \
    {{#n, t, 0, NULL}, DT_SO_BOOL, 0, 0, {NULL}, NULL, DT_CEIL_NONE, ah, NULL},
#define KM_SO_DEF_NUMBER(n, fl, sf, t, lo, hi, z, u, wu, wn, mv, ch, ah, lh)                       \
    {{#n, t, 0, NULL}, DT_SO_NUMBER, lo, hi, {NULL}, NULL, DT_CEIL_CFG, ah, NULL},
#define KM_SO_DEF_SIZE(n, fl, sf, t, lo, hi, d, wu, wn, mv, ch, ah, lh)                            \
    {{#n, t, 0, NULL}, DT_SO_SIZE, lo, hi, {NULL}, NULL, DT_CEIL_CFG, ah, NULL},
#include "kernelmgr/engine/sessopt.def"
#undef KM_SO_DEF_BOOL
#undef KM_SO_DEF_NUMBER
#undef KM_SO_DEF_SIZE
    {{NULL, 0, 0, NULL}, 0, 0, 0, {NULL}, NULL, DT_CEIL_NONE, NULL, NULL},
};

const dtier_sessopt *dtier_sessopt_find(const char *name)
{
    for (const dtier_sessopt *o = dtier_sessopts; name && o->f.name; o++)
        if (!strcmp(o->f.name, name))
            return o;
    return NULL;
}

int dtier_field_allowed(const dtier_grant *g, const dtier_field *f)
{
    unsigned bit = DT_BIT(g->tier);
    /* a choice's unsafe bits gate its relaxing value, not the field */
    const dtier_sessopt *so = dtier_sessopt_find(f->name);
    int gates_value = so && (so->type == DT_SO_CHOICE || so->type == DT_SO_NETWORK) && &so->f == f;
    return (f->tiers & bit) || (!gates_value && g->unsafe && (f->unsafe & bit));
}

static const dtier_field *field_find(const dtier_field *fields, const char *name)
{
    for (const dtier_field *f = fields; f && f->name; f++)
        if (!strcmp(f->name, name))
            return f;
    return NULL;
}

/* Appends the names g may send to list. */
static void allowed_list(const dtier_grant *g, const dtier_field *fields, int sopts, char *list,
                         size_t n)
{
    size_t len = 0;
    list[0] = 0;
    for (const dtier_field *f = fields; f && f->name; f++)
        if (dtier_field_allowed(g, f) && len < n)
            len += (size_t)snprintf(list + len, n - len, "%s%s", len ? ", " : "", f->name);
    for (const dtier_sessopt *o = dtier_sessopts; sopts && o->f.name; o++)
        if (dtier_field_allowed(g, &o->f) && len < n)
            len += (size_t)snprintf(list + len, n - len, "%s%s", len ? ", " : "", o->f.name);
    if (!list[0])
        snprintf(list, n, "none");
}

int dtier_check_fields(const dtier_grant *g, const dtier_field *fields, int sopts,
                       const json_t *params, km_err *why)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)params, key, v)
    {
        const dtier_field *f = field_find(fields, key);
        if (!f && sopts) {
            const dtier_sessopt *o = dtier_sessopt_find(key);
            f = o ? &o->f : NULL;
        }
        if (f && dtier_field_allowed(g, f))
            continue;
        if (!f) {
            char list[600];
            allowed_list(g, fields, sopts, list, sizeof list);
            km_err_set(why, KM_EUSAGE, "unknown field \"%.80s\" (expected: %s)", key, list);
            return -1;
        }
        int optin = (f->unsafe & DT_BIT(g->tier)) != 0;
        int note = f->why || optin;
        km_err_set(why, KM_EUSAGE, "field \"%s\" is not available to %s%s%s%s%s%s%s", f->name,
                   dtier_clients(g->tier), note ? " (" : "", f->why ? f->why : "",
                   f->why && optin ? "; " : "", optin ? "the operator can allow it with " : "",
                   optin ? tier_optin[g->tier] : "", note ? ")" : "");
        return -1;
    }
    return 0;
}

/* "256M", "2G", or bytes: the shortest exact form. */
static const char *fmt_size(uint64_t b, char *buf, size_t n)
{
    static const char units[] = "TGMK";
    for (int i = 0; i < 4; i++) {
        uint64_t u = 1ull << (10 * (4 - i));
        if (b >= u && b % u == 0) {
            snprintf(buf, n, "%" PRIu64 "%c", b / u, units[i]);
            return buf;
        }
    }
    snprintf(buf, n, "%" PRIu64 " bytes", b);
    return buf;
}

/* The field of session option name in so: its row in sessopt.c's table
 * (every row here has one: tests/unit/test_km_sessopt.c). */
#define SO_FIELD(T, so, name) ((T *)(void *)((char *)(so) + km_sessopt_find(name)->o_off))

static int fill_one(const dtier_sessopt *o, const json_t *v, km_session_opts *so, km_err *why)
{
    const char *name = o->f.name;
    switch (o->type) {
    case DT_SO_NETWORK: {
        char what[40];
        km_err e = {0};
        snprintf(what, sizeof what, "field \"%s\"", name);
        if (json_is_boolean(v) || (!json_is_string(v) && !json_is_object(v))) {
            km_err_set(
                why, KM_EUSAGE,
                "field \"%s\": must be \"on\", \"off\" or {\"allow\": [\"host[:port]\", ...]} "
                "(got %s)",
                name, rpc_type_name(v));
            return -1;
        }
        if (json_is_string(v) && strcmp(json_string_value(v), "on") &&
            strcmp(json_string_value(v), "off")) {
            km_err_set(
                why, KM_EUSAGE,
                "field \"%s\": must be \"on\", \"off\" or {\"allow\": [\"host[:port]\", ...]} "
                "(got \"%.40s\")",
                name, json_string_value(v));
            return -1;
        }
        if (km_net_from_json(v, what, &so->network, so->network_allow_buf,
                             sizeof so->network_allow_buf, &e)) {
            km_err_set(why, KM_EUSAGE, "%s", e.msg);
            return -1;
        }
        so->network_allow = so->network == KM_NET_ALLOW ? so->network_allow_buf : NULL;
        return 0;
    }
    case DT_SO_CHOICE: {
        const char *s = json_string_value(v);
        if (!s) {
            km_err_set(why, KM_EUSAGE, "field \"%s\": expected a string, got %s", name,
                       rpc_type_name(v));
            return -1;
        }
        int ok = 0;
        for (int i = 0; o->values[i]; i++)
            ok |= !strcmp(s, o->values[i]);
        if (!ok) {
            km_err_set(why, KM_EUSAGE, "field \"%s\": must be \"%s\" or \"%s\" (got \"%.40s\")",
                       name, o->values[0], o->values[1], s);
            return -1;
        }
        *SO_FIELD(const char *, so, name) = s;
        return 0;
    }
    case DT_SO_SIZE: {
        uint64_t bytes = 0;
        if (json_is_integer(v) && json_integer_value(v) > 0)
            bytes = (uint64_t)json_integer_value(v);
        else if (!json_is_string(v) || kmcfg_parse_size(json_string_value(v), &bytes))
            bytes = 0;
        if (bytes < (uint64_t)o->min) {
            char mb[32];
            km_err_set(why, KM_EUSAGE,
                       "field \"%s\": must be a size of at least %s, like \"512M\" or \"2G\" (or "
                       "a number of bytes)",
                       name, fmt_size((uint64_t)o->min, mb, sizeof mb));
            return -1;
        }
        *SO_FIELD(unsigned long long, so, name) = bytes;
        return 0;
    }
    case DT_SO_NUMBER: {
        if (!json_is_number(v)) {
            km_err_set(why, KM_EUSAGE, "field \"%s\": expected a number, got %s", name,
                       rpc_type_name(v));
            return -1;
        }
        double d = json_number_value(v);
        /* the documented range (the schemas' minimum and maximum): 0 is
         * no value of its own, leaving a field out is how to get the
         * configuration's */
        if (!(d >= o->min && d <= o->max)) {
            km_err_set(why, KM_EUSAGE, "field \"%s\": must be a number of %s from %g to %.0f", name,
                       kmcfg_opt_find(name)->unit, o->min, o->max);
            return -1;
        }
        *SO_FIELD(double, so, name) = d;
        return 0;
    }
    case DT_SO_PATH: {
        const char *s = json_string_value(v);
        if (!s) {
            km_err_set(why, KM_EUSAGE, "field \"%s\": expected a string, got %s", name,
                       rpc_type_name(v));
            return -1;
        }
        if (s[0] != '/') {
            km_err_set(why, KM_EUSAGE, "field \"%s\": must be an absolute path", name);
            return -1;
        }
        *SO_FIELD(const char *, so, name) = s;
        return 0;
    }
    case DT_SO_BOOL:
        if (!json_is_boolean(v)) {
            km_err_set(why, KM_EUSAGE, "field \"%s\": expected true or false, got %s", name,
                       rpc_type_name(v));
            return -1;
        }
        *SO_FIELD(int, so, name) = json_is_true(v);
        return 0;
    case DT_SO_ENV: {
        char what[40];
        snprintf(what, sizeof what, "field \"%s\"", name);
        /* kenv says what is wrong, a value that is not an object included
         * (the one wording every client of the environment sees) */
        char bad[sizeof why->msg];
        if (kenv_check_object(NULL, what, v, bad, sizeof bad)) {
            km_err_set(why, KM_EUSAGE, "%s", bad);
            return -1;
        }
        so->env = v;
        return 0;
    }
    }
    return 0;
}

int dtier_sopts_fill(const json_t *params, km_session_opts *so, km_err *why)
{
    km_session_opts_init(so);
    for (const dtier_sessopt *o = dtier_sessopts; o->f.name; o++) {
        const json_t *v = json_object_get(params, o->f.name);
        if (v && fill_one(o, v, so, why))
            return -1;
    }
    return 0;
}

/* The value a request gave, as it gave it, for a message. */
static const char *given(const json_t *v, char *buf, size_t n)
{
    if (json_is_string(v))
        snprintf(buf, n, "%.40s", json_string_value(v));
    else if (json_is_integer(v))
        fmt_size((uint64_t)json_integer_value(v), buf, n);
    else
        snprintf(buf, n, "%g", json_number_value(v));
    return buf;
}

/* The network ceiling (see dtier.h): off < allow-list < on. A tier below
 * owner may ask for "off", for what the configuration has, for a list within
 * the configuration's list, or for anything when the configuration is "on";
 * wider only with the operator's opt-in. */
static int net_ceiling(const dtier_grant *g, const kmcfg *cfg, const dtier_sessopt *o,
                       const km_session_opts *so, km_err *why)
{
    if (so->network == KM_NET_OFF || (g->unsafe && (o->f.unsafe & DT_BIT(g->tier))))
        return 0;
    if (cfg->network == KM_NET_ON) {
        /* "on" never reaches this host or its private networks (slirp4netns
         * and reject routes): a list may not either, through the proxy */
        egpolicy *want = malloc(sizeof *want);
        char e[600] = "out of memory";
        int bad = -1;
        if (want &&
            !egpolicy_parse_text(want, so->network_allow ? so->network_allow : "", e, sizeof e)) {
            bad = 0;
            for (size_t i = 0; i < want->n && !bad; i++)
                if (egpolicy_is_literal(want, (int)i) &&
                    egproxy_restricted_literal(want->e[i].host) != 0) {
                    snprintf(e, sizeof e,
                             "allow entry \"%s\" is an address of this host or of a private "
                             "network, which network \"on\" does not reach either",
                             want->e[i].host);
                    bad = 1;
                }
        }
        free(want);
        if (so->network == KM_NET_ON || !bad)
            return 0;
        km_err_set(why, KM_EUSAGE,
                   "field \"network\": %s (only the operator's own list may name one)", e);
        return -1;
    }
    if (so->network == KM_NET_ALLOW && cfg->network == KM_NET_ALLOW) {
        egpolicy *want = malloc(sizeof *want), *ceil = malloc(sizeof *ceil);
        char e[900] = "out of memory";
        int rc = -1;
        if (want && ceil && !egpolicy_parse_text(want, so->network_allow, e, sizeof e) &&
            !egpolicy_parse_text(ceil, cfg->network_allow, e, sizeof e))
            rc = egpolicy_within(want, ceil, e, sizeof e);
        free(want);
        free(ceil);
        if (rc)
            km_err_set(why, KM_EUSAGE,
                       "field \"network\": %s (config \"network\"; %s may only narrow it; the "
                       "operator can allow more with %s)",
                       e, dtier_clients(g->tier), tier_optin[g->tier]);
        return rc;
    }
    km_err_set(why, KM_EUSAGE,
               "field \"network\": %s is not available to %s (%s; the operator's configuration has "
               "network %s; the operator can allow it with %s)",
               so->network == KM_NET_ON ? "\"on\"" : "an allow list", dtier_clients(g->tier),
               o->f.why ? o->f.why : "",
               cfg->network == KM_NET_ALLOW ? "as an allow list" : "\"off\"", tier_optin[g->tier]);
    return -1;
}

int dtier_sopts_ceiling(const dtier_grant *g, const kmcfg *cfg, const json_t *params,
                        const km_session_opts *so, km_err *why)
{
    if (g->tier == DT_OWNER)
        return 0; /* the operator is the owner */
    char gb[64], lb[64];
    for (const dtier_sessopt *o = dtier_sessopts; o->f.name; o++) {
        const json_t *v = json_object_get(params, o->f.name);
        if (!v)
            continue;
        switch (o->ceiling) {
        case DT_CEIL_NONE:
            break;
        case DT_CEIL_MEMORY: {
            uint64_t lim = cfg->memory ? cfg->memory : DTIER_DEFAULT_MEMORY;
            if (so->memory > lim) {
                km_err_set(why, KM_EUSAGE,
                           "field \"memory\": %s exceeds the operator's limit %s (%s)",
                           given(v, gb, sizeof gb), fmt_size(lim, lb, sizeof lb),
                           cfg->memory ? "config \"memory\""
                                       : "the kernels' default; config \"memory\" is unset");
                return -1;
            }
            break;
        }
        case DT_CEIL_CFG: {
            /* the configuration's value of the same key, when it has one */
            const km_sessopt *r = km_sessopt_find(o->f.name);
            const kmcfg_opt *c = kmcfg_opt_find(o->f.name);
            if (o->type == DT_SO_SIZE) {
                uint64_t lim = *(const uint64_t *)(const void *)((const char *)cfg + r->c_off);
                unsigned long long want = *SO_FIELD(unsigned long long, so, o->f.name);
                if (lim && want > lim) {
                    km_err_set(why, KM_EUSAGE,
                               "field \"%s\": %s exceeds the operator's limit %s (config \"%s\")",
                               o->f.name, given(v, gb, sizeof gb), fmt_size(lim, lb, sizeof lb),
                               c->name);
                    return -1;
                }
            } else {
                double lim = *(const double *)(const void *)((const char *)cfg + r->c_off);
                double want = *SO_FIELD(double, so, o->f.name);
                if (lim > 0 && want > lim) {
                    km_err_set(why, KM_EUSAGE,
                               "field \"%s\": %g exceeds the operator's limit %g (config \"%s\")",
                               o->f.name, want, lim, c->name);
                    return -1;
                }
            }
            break;
        }
        case DT_CEIL_NETWORK:
            if (net_ceiling(g, cfg, o, so, why))
                return -1;
            break;
        case DT_CEIL_SANDBOX: {
            const char *s = json_string_value(v);
            if (!s || strcmp(s, o->relaxing))
                break;
            int has = !strcmp(cfg->sandbox, o->relaxing);
            if (has || (g->unsafe && (o->f.unsafe & DT_BIT(g->tier))))
                break;
            km_err_set(why, KM_EUSAGE,
                       "field \"%s\": \"%s\" is not available to %s (%s; the operator's "
                       "configuration has %s \"%s\"; the operator can allow it with %s)",
                       o->f.name, s, dtier_clients(g->tier), o->f.why ? o->f.why : "", o->f.name,
                       cfg->sandbox, tier_optin[g->tier]);
            return -1;
        }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- doc */

/* "`mcp` and `http`": the names of the tier bits into buf (n bytes). */
static const char *tier_list(unsigned bits, char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int t = 0; t < DT_NTIERS; t++)
        if ((bits & DT_BIT(t)) && len < n)
            len +=
                (size_t)snprintf(buf + len, n - len, "%s`%s`", len ? " and " : "", tier_names[t]);
    return buf;
}

/* Appends ", " or " (" and the formatted text to the type cell t (n bytes,
 * *len used), counting the parts in *parts. */
static void type_part(char *t, size_t n, size_t *len, int *parts, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void type_part(char *t, size_t n, size_t *len, int *parts, const char *fmt, ...)
{
    if (*len >= n)
        return;
    *len += (size_t)snprintf(t + *len, n - *len, "%s", (*parts)++ ? "; " : " (");
    if (*len >= n)
        return;
    va_list ap;
    va_start(ap, fmt);
    *len += (size_t)vsnprintf(t + *len, n - *len, fmt, ap);
    va_end(ap);
}

/* The type cell of o: its values or kind, its limits, the tiers that may
 * send it when not all, and its ceiling below owner. */
static void doc_type(const dtier_sessopt *o, char *t, size_t n)
{
    const kmcfg_opt *c = kmcfg_opt_find(o->f.name);
    char a[32], b[32], names[64];
    size_t len = 0;
    int parts = 0;
    t[0] = 0;
    switch (o->type) {
    case DT_SO_CHOICE:
    case DT_SO_NETWORK:
        for (int i = 0; o->values[i] && len < n; i++)
            len += (size_t)snprintf(t + len, n - len, "%s`\"%s\"`", i ? " \\| " : "", o->values[i]);
        if (o->type == DT_SO_NETWORK && len < n)
            len += (size_t)snprintf(t + len, n - len, " \\| `{\"allow\": [\"host[:port]\", ...]}`");
        break;
    case DT_SO_SIZE:
        len = (size_t)snprintf(t, n, "string (`\"64M\"`) or integer bytes, ≥ %s",
                               fmt_size((uint64_t)o->min, a, sizeof a));
        break;
    case DT_SO_NUMBER:
        len = (size_t)snprintf(t, n, "number%s%s from %g to %.0f", c && c->unit ? " of " : "",
                               c && c->unit ? c->unit : "", o->min, o->max);
        break;
    case DT_SO_PATH:
        len = (size_t)snprintf(t, n, "absolute path");
        break;
    case DT_SO_ENV:
        len = (size_t)snprintf(t, n, "object `{NAME: \"value\"}`");
        type_part(t, n, &len, &parts, "%d variables, %s per value, %s in all", KENV_MAX_VARS,
                  fmt_size(KENV_MAX_VALUE, a, sizeof a), fmt_size(KENV_MAX_TOTAL, b, sizeof b));
        break;
    case DT_SO_BOOL:
        len = (size_t)snprintf(t, n, "boolean");
        break;
    }
    if (len >= n)
        return;
    /* who may send it; a choice's unsafe bits gate its relaxing value
     * (dtier_field_allowed), said with the ceiling */
    int gates_value = o->type == DT_SO_CHOICE || o->type == DT_SO_NETWORK;
    unsigned optin = o->f.unsafe & ~o->f.tiers & DT_ALL;
    if ((o->f.tiers & DT_ALL) != DT_ALL) {
        if ((o->f.tiers & DT_ALL) == DT_O)
            type_part(t, n, &len, &parts, "owner only");
        else
            type_part(t, n, &len, &parts, "%s only", tier_list(o->f.tiers, names, sizeof names));
        if (optin && !gates_value)
            type_part(t, n, &len, &parts, "%s with the operator's opt-in",
                      tier_list(optin, names, sizeof names));
    }
    /* the relaxing value: also with the opt-in of these tiers (all below
     * owner, or named) */
    char also[96] = "";
    unsigned below = (DT_ALL & ~DT_O) & o->f.unsafe;
    if (below == (DT_ALL & ~DT_O))
        snprintf(also, sizeof also, " or with the operator's opt-in");
    else if (below)
        snprintf(also, sizeof also, " or, for %s, with the operator's opt-in",
                 tier_list(below, names, sizeof names));
    switch (o->ceiling) {
    case DT_CEIL_NONE:
        break;
    case DT_CEIL_MEMORY:
    case DT_CEIL_CFG:
        type_part(t, n, &len, &parts, "below owner: ≤ the configuration's");
        break;
    case DT_CEIL_NETWORK:
        type_part(t, n, &len, &parts,
                  "below owner: an allow-list within the configuration's, `\"%s\"` only when it "
                  "is `\"%s\"`%s",
                  o->relaxing, o->relaxing, also);
        break;
    case DT_CEIL_SANDBOX:
        type_part(t, n, &len, &parts,
                  "below owner: `\"%s\"` only when the configuration's is `\"%s\"`%s", o->relaxing,
                  o->relaxing, also);
        break;
    }
    if (parts && len < n)
        snprintf(t + len, n - len, ")");
}

/* Writes s to f with every '|' escaped for a markdown table cell. */
static int put_cell(FILE *f, const char *s)
{
    int bad = 0;
    for (; *s; s++)
        bad |= (*s == '|' ? fputs("\\|", f) : fputc(*s, f)) == EOF;
    return bad;
}

int dtier_sessopt_doc(FILE *f)
{
    char type[512], def[128];
    int bad = fprintf(f, "| field | type | default | meaning |\n|---|---|---|---|\n") < 0;
    for (const dtier_sessopt *o = dtier_sessopts; o->f.name; o++) {
        const kmcfg_opt *c = kmcfg_opt_find(o->f.name);
        doc_type(o, type, sizeof type);
        bad |= fprintf(f, "| `%s` | %s | ", o->f.name, type) < 0;
        if (o->def || !c)
            bad |= put_cell(f, o->def ? o->def : "");
        else
            bad |=
                fprintf(f, "config `%s`: %s", c->name, kmcfg_doc_default(c, def, sizeof def)) < 0;
        bad |= fputs(" | ", f) == EOF;
        bad |= put_cell(f, o->help);
        bad |= fputs(" |\n", f) == EOF;
    }
    return bad || ferror(f) ? -1 : 0;
}

/* ---------------------------------------------------------------- scrub */

/* Keys whose strings are data that must stay exact: a file's bytes and the
 * workspace-relative file reports (a symlink's target is the code's). The
 * code's output is rewritten like the rest: the daemon's truncation notes
 * in it name spill files under the home. */
static int is_exact_data(const char *key)
{
    return !strcmp(key, "content") || !strcmp(key, "files");
}

/* new: s with every occurrence of home (as a path: followed by '/' or the
 * end or a non-path character) replaced by $KERNELMGR_HOME; NULL when s has
 * none. */
static char *replace_home(const char *s, const char *home)
{
    size_t hl = home ? strlen(home) : 0;
    if (hl < 2 || !strstr(s, home))
        return NULL;
    size_t cap = strlen(s) * 2 + 64, len = 0;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    for (const char *p = s; *p;) {
        if (!strncmp(p, home, hl)) {
            const char *rep = "$KERNELMGR_HOME";
            size_t rl = strlen(rep);
            if (len + rl + 1 > cap) {
                cap = (len + rl + 1) * 2;
                char *o2 = realloc(out, cap);
                if (!o2) {
                    free(out);
                    return NULL;
                }
                out = o2;
            }
            memcpy(out + len, rep, rl);
            len += rl;
            p += hl;
            continue;
        }
        if (len + 2 > cap) {
            cap *= 2;
            char *o2 = realloc(out, cap);
            if (!o2) {
                free(out);
                return NULL;
            }
            out = o2;
        }
        out[len++] = *p++;
    }
    out[len] = 0;
    return out;
}

static void basename_in_place(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    if (!s)
        return;
    const char *b = strrchr(s, '/');
    if (b)
        json_object_set_new(obj, key, json_string(b + 1));
}

static void scrub_value(json_t *v, const char *home, int depth)
{
    if (depth > 32)
        return;
    if (json_is_array(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            if (json_is_string(e)) {
                char *r = replace_home(json_string_value(e), home);
                if (r)
                    json_array_set_new(v, i, json_string(r));
                free(r);
            } else {
                scrub_value(e, home, depth + 1);
            }
        }
        return;
    }
    if (!json_is_object(v))
        return;
    json_object_del(v, "home");
    json_object_del(v, "workspace");
    json_object_del(v, "connection_file");
    basename_in_place(v, "spill");
    json_t *imgs = json_object_get(v, "images");
    if (json_is_array(imgs)) {
        size_t i;
        json_t *im;
        json_array_foreach(imgs, i, im)
        {
            basename_in_place(im, "path");
        }
    }
    const char *key;
    json_t *e;
    void *tmp;
    json_object_foreach_safe(v, tmp, key, e)
    {
        if (is_exact_data(key))
            continue;
        if (json_is_string(e)) {
            char *r = replace_home(json_string_value(e), home);
            if (r)
                json_object_set_new(v, key, json_string(r));
            free(r);
        } else {
            scrub_value(e, home, depth + 1);
        }
    }
}

void dtier_scrub(dtier t, json_t *reply, const char *home)
{
    if (t != DT_HTTP || !reply)
        return;
    json_object_del(reply, "target"); /* packages.install: the host directory */
    scrub_value(reply, home, 0);
}

void dtier_scrub_text(dtier t, char *buf, size_t n, const char *home)
{
    if (t != DT_HTTP || !n)
        return;
    char *r = replace_home(buf, home);
    if (r)
        snprintf(buf, n, "%s", r);
    free(r);
}
