/*
 * sessopt.c — the session options' table and the loops over it (sessopt.h).
 */
#include "kernelmgr/engine/sessopt.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/netopt.h"
#include "kernelmgr/engine/session_int.h"

_Static_assert(sizeof(uint64_t) == sizeof(unsigned long long), "kmcfg sizes are 64-bit");

/* ---------------------------------------------------------------- fields */

#define FIELD(T, base, off) ((T *)(void *)((char *)(base) + (off)))
#define CFIELD(T, base, off) ((const T *)(const void *)((const char *)(base) + (off)))
typedef const char *sessopt_cstr; /* CFIELD's T for a const char * field */

static int o_bool(const km_sessopt *r, const km_session_opts *o)
{
    return *CFIELD(int, o, r->o_off);
}
static unsigned long long o_size(const km_sessopt *r, const km_session_opts *o)
{
    return *CFIELD(unsigned long long, o, r->o_off);
}
static double o_num(const km_sessopt *r, const km_session_opts *o)
{
    return *CFIELD(double, o, r->o_off);
}
static const char *o_str(const km_sessopt *r, const km_session_opts *o)
{
    return *CFIELD(sessopt_cstr, o, r->o_off);
}

/* 1 when o gives the option */
static int o_set(const km_sessopt *r, const km_session_opts *o)
{
    switch (r->type) {
    case KM_SO_BOOL:
        return o_bool(r, o) >= 0;
    case KM_SO_SIZE:
        return o_size(r, o) != 0;
    case KM_SO_NUMBER:
        return o_num(r, o) > 0;
    case KM_SO_STRING:
        return o_str(r, o) != NULL;
    case KM_SO_SPECIAL:
        break;
    }
    return 0;
}

/* the configuration's value */
static int c_bool(const km_sessopt *r, const km_manager *m)
{
    return *CFIELD(int, &m->cfg, r->c_off);
}
static unsigned long long c_size(const km_sessopt *r, const km_manager *m)
{
    uint64_t v;
    memcpy(&v, (const char *)&m->cfg + r->c_off, sizeof v);
    return (unsigned long long)v;
}
static double c_num(const km_sessopt *r, const km_manager *m)
{
    return *CFIELD(double, &m->cfg, r->c_off);
}
static const char *c_str(const km_sessopt *r, const km_manager *m)
{
    return CFIELD(char, &m->cfg, r->c_off);
}

/* ----------------------------------------------------------- the warning */

void km_sessopt_warn_ignored(json_t *arr, const char *sname, const char *opt, const char *given,
                             const char *kept_fmt, ...)
{
    va_list ap;
    va_start(ap, kept_fmt);
    char *kept = NULL;
    int n = vasprintf(&kept, kept_fmt, ap);
    va_end(ap);
    json_array_append_new(arr, json_sprintf("session \"%s\" already exists: %s %s was ignored "
                                            "(the session keeps %s); options of a session are "
                                            "fixed when it is created: close it to change them",
                                            sname, opt, given, n < 0 ? "another value" : kept));
    free(n < 0 ? NULL : kept);
}

/* The same for a numeric limit: kept 0 means the session has none (what
 * unlimited says). */
static void warn_ignored_limit(json_t *arr, const char *sname, const char *opt, double given,
                               const char *unit, const char *kept_name, double kept,
                               const char *unlimited)
{
    char g[80];
    snprintf(g, sizeof g, "%.15g%s", given, unit);
    if (kept > 0)
        km_sessopt_warn_ignored(arr, sname, opt, g, "%s %.15g%s", kept_name, kept, unit);
    else
        km_sessopt_warn_ignored(arr, sname, opt, g, "%s", unlimited);
}

/* new: "A,B,C", the names of env's variables (not their values), or NULL
 * when out of memory */
static char *env_names(const json_t *env)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return NULL;
    const char *n;
    json_t *v;
    int first = 1;
    json_object_foreach((json_t *)env, n, v)
    {
        fprintf(f, "%s%s", first ? "" : ",", n);
        first = 0;
    }
    if (fclose(f)) {
        free(out);
        return NULL;
    }
    return out;
}

/* --------------------------------------------------------------- network */

static int net_default(const km_manager *m, const km_session_opts *o)
{
    return o->network < 0 ||
           km_net_equal(o->network, o->network_allow, m->cfg.network, m->cfg.network_allow);
}

static int net_create(const km_manager *m, session *s, const km_session_opts *o)
{
    s->network = o && o->network >= 0 ? o->network : m->cfg.network;
    snprintf(s->net_allow, sizeof s->net_allow, "%s",
             o && o->network >= 0
                 ? (o->network == KM_NET_ALLOW && o->network_allow ? o->network_allow : "")
                 : m->cfg.network_allow);
    return 0;
}

static void net_warn(const km_manager *m, const session *s, const km_session_opts *o, json_t *arr)
{
    int net = s->network < 0 ? m->cfg.network : s->network;
    const char *net_allow = s->network < 0 ? m->cfg.network_allow : s->net_allow;
    if (o->network >= 0 && !km_net_equal(o->network, o->network_allow, net, net_allow))
        km_sessopt_warn_ignored(arr, s->name, "--network",
                                km_net_text(o->network, o->network_allow), "network %s",
                                km_net_text(net, net_allow));
}

static int net_save(const session *s, json_t *opts)
{
    return json_object_set_new(opts, "network",
                               s->network == KM_NET_ALLOW ? km_net_json(s->network, s->net_allow)
                                                          : json_boolean(s->network));
}

static void net_load(const km_manager *m, session *s, const json_t *opt, const char *name)
{
    json_t *v = json_object_get(opt, "network");
    s->network = json_is_boolean(v) ? json_is_true(v) : m->cfg.network;
    snprintf(s->net_allow, sizeof s->net_allow, "%s",
             json_is_boolean(v) ? "" : m->cfg.network_allow);
    if (json_is_object(v)) {
        km_err nwhy = {0};
        /* a list the session was created with: kept; a damaged one: network off, never wider */
        if (km_net_from_json(v, "network", &s->network, s->net_allow, sizeof s->net_allow, &nwhy))
            s->network = KM_NET_OFF;
    }
}

static void net_fork(const session *s, km_session_opts *o, json_t **hold)
{
    o->network = s->network;
    /* the allow-list too (borrowed from s, which the fork holds) */
    o->network_allow = s->network == KM_NET_ALLOW ? s->net_allow : NULL;
}

static const km_sessopt_hooks net_hooks = {net_default, net_create, net_warn,
                                           net_save,    net_load,   net_fork};

/* ------------------------------------------------------------- workspace */

/* The session's workspace itself is made (or taken) by create_locked and
 * saved beside the options ("workspace", "own_workspace"). */
static int ws_default(const km_manager *m, const km_session_opts *o)
{
    return !o->workspace;
}

static void ws_warn(const km_manager *m, const session *s, const km_session_opts *o, json_t *arr)
{
    if (!o->workspace)
        return;
    char *real = realpath(o->workspace, NULL);
    if (strcmp(real ? real : o->workspace, s->workspace))
        km_sessopt_warn_ignored(arr, s->name, "--workspace", o->workspace, "workspace %s",
                                s->workspace);
    free(real);
}

static const km_sessopt_hooks ws_hooks = {ws_default, NULL, ws_warn, NULL, NULL, NULL};

/* ------------------------------------------------------------------- env */

static int env_default(const km_manager *m, const km_session_opts *o)
{
    return !json_object_size(o->env);
}

static int env_create(const km_manager *m, session *s, const km_session_opts *o)
{
    if (o && json_object_size(o->env) && !(s->env = json_deep_copy(o->env)))
        return -1;
    return 0;
}

static void env_warn(const km_manager *m, const session *s, const km_session_opts *o, json_t *arr)
{
    if (!json_object_size(o->env) || (s->env && json_equal((json_t *)o->env, s->env)))
        return;
    /* names only: values may be secrets, and warnings are shown and logged */
    char *given = env_names(o->env), *kept = env_names(s->env);
    if (json_object_size(s->env))
        km_sessopt_warn_ignored(arr, s->name, "--env", given ? given : "(names unknown)",
                                "its env (%s)", kept ? kept : "names unknown");
    else
        km_sessopt_warn_ignored(arr, s->name, "--env", given ? given : "(names unknown)", "%s",
                                "no env of its own");
    free(given);
    free(kept);
}

/* the session's variables (the directory and the file are the user's
 * alone: 0700 and 0600), so a restarted manager gives them back */
static int env_save(const session *s, json_t *opts)
{
    return s->env ? json_object_set(opts, "env", s->env) : 0;
}

static void env_load(const km_manager *m, session *s, const json_t *opt, const char *name)
{
    km_err reason = {0};
    json_t *env = json_object_get(opt, "env");
    if (env && session_env_check(m, env, &reason) == 0)
        s->env = json_deep_copy(env);
    else if (env)
        fprintf(stderr, "kernelmgr: session %s: its saved env is not used: %s\n", name, reason.msg);
}

static void env_fork(const session *s, km_session_opts *o, json_t **hold)
{
    /* a copy: the source's lock is not held while the fork is created */
    json_t *env = s->env ? json_deep_copy(s->env) : NULL;
    o->env = env;
    *hold = env;
}

static const km_sessopt_hooks env_hooks = {env_default, env_create, env_warn,
                                           env_save,    env_load,   env_fork};

/* ----------------------------------------------------------------- table */

#define OO(f) offsetof(km_session_opts, f)
#define SO(f) offsetof(session, f), sizeof(((session *)0)->f)
#define CO(f) offsetof(kmcfg, f)

const km_sessopt km_sessopts[] = {
    {"network", "--network", KM_SO_SPECIAL, OO(network), SO(network), CO(network),
     KM_SO_WARN | KM_SO_INT_UNSET, NULL, NULL, &net_hooks},
    {"memory", "--memory", KM_SO_SIZE, OO(memory), SO(memory), CO(memory),
     KM_SO_SAVE_UNSET | KM_SO_WARN, " bytes", "the kernel's default memory limit", NULL},
    {"python", "--python", KM_SO_STRING, OO(python), SO(python), CO(python),
     KM_SO_SAVE_UNSET | KM_SO_WARN, NULL, "(detected)", NULL},
    {"workspace", "--workspace", KM_SO_SPECIAL, OO(workspace), SO(workspace), 0,
     KM_SO_WARN | KM_SO_NO_FORK | KM_SO_NO_CONFIG, NULL, NULL, &ws_hooks},
    {"env", "--env", KM_SO_SPECIAL, OO(env), SO(env), CO(env), KM_SO_WARN, NULL, NULL, &env_hooks},
    {"sandbox", "--sandbox", KM_SO_STRING, OO(sandbox), SO(sandbox), CO(sandbox),
     KM_SO_POOL_SAME | KM_SO_SAVE_UNSET | KM_SO_CFG_FILL | KM_SO_WARN, NULL, NULL, NULL},
/* the plain ones (sessopt.def) */
#define KM_SO_DEF_BOOL(n, fl, sf, t, d, ch, ah, lh)                                                \
    {#n, "--" fl, KM_SO_BOOL, OO(n), SO(n), CO(n), sf, NULL, NULL, NULL},
#define KM_SO_DEF_NUMBER(n, fl, sf, t, lo, hi, z, u, wu, wn, mv, ch, ah, lh)                       \
    {#n, "--" fl, KM_SO_NUMBER, OO(n), SO(n), CO(n), sf, wu, wn, NULL},
#define KM_SO_DEF_SIZE(n, fl, sf, t, lo, hi, d, wu, wn, mv, ch, ah, lh)                            \
    {#n, "--" fl, KM_SO_SIZE, OO(n), SO(n), CO(n), sf, wu, wn, NULL},
#include "kernelmgr/engine/sessopt.def"
#undef KM_SO_DEF_BOOL
#undef KM_SO_DEF_NUMBER
#undef KM_SO_DEF_SIZE
    {NULL, NULL, KM_SO_SPECIAL, 0, 0, 0, 0, 0, NULL, NULL, NULL},
};

const km_sessopt *km_sessopt_find(const char *name)
{
    for (const km_sessopt *r = km_sessopts; name && r->name; r++)
        if (!strcmp(r->name, name))
            return r;
    return NULL;
}

/* ----------------------------------------------------------------- loops */

void km_sessopt_init(km_session_opts *o)
{
    for (const km_sessopt *r = km_sessopts; r->name; r++)
        if (r->type == KM_SO_BOOL || (r->flags & KM_SO_INT_UNSET))
            *FIELD(int, o, r->o_off) = -1;
}

void km_sessopt_unset(session *s)
{
    for (const km_sessopt *r = km_sessopts; r->name; r++)
        if (r->type == KM_SO_BOOL || (r->flags & KM_SO_INT_UNSET))
            *FIELD(int, s, r->s_off) = -1;
        else if (r->type == KM_SO_STRING)
            FIELD(char, s, r->s_off)[0] = 0;
        else if (r->type == KM_SO_SIZE)
            *FIELD(unsigned long long, s, r->s_off) = 0;
        else if (r->type == KM_SO_NUMBER)
            *FIELD(double, s, r->s_off) = 0;
}

int km_sessopt_default(const km_manager *m, const km_session_opts *o)
{
    if (!o)
        return 1;
    for (const km_sessopt *r = km_sessopts; r->name; r++) {
        if (r->type == KM_SO_SPECIAL) {
            if (r->hooks->is_default && !r->hooks->is_default(m, o))
                return 0;
            continue;
        }
        if (!o_set(r, o))
            continue;
        if (!(r->flags & KM_SO_POOL_SAME))
            return 0;
        int same = r->type == KM_SO_BOOL     ? o_bool(r, o) == c_bool(r, m)
                   : r->type == KM_SO_SIZE   ? o_size(r, o) == c_size(r, m)
                   : r->type == KM_SO_NUMBER ? o_num(r, o) == c_num(r, m)
                                             : !strcmp(o_str(r, o), c_str(r, m));
        if (!same)
            return 0;
    }
    return 1;
}

int km_sessopt_create(const km_manager *m, session *s, const km_session_opts *o)
{
    for (const km_sessopt *r = km_sessopts; r->name; r++) {
        int set = o && r->type != KM_SO_SPECIAL && o_set(r, o);
        switch (r->type) {
        case KM_SO_BOOL:
            *FIELD(int, s, r->s_off) = set ? o_bool(r, o) : -1;
            break;
        case KM_SO_SIZE:
            *FIELD(unsigned long long, s, r->s_off) = set ? o_size(r, o) : 0;
            break;
        case KM_SO_NUMBER:
            *FIELD(double, s, r->s_off) = set ? o_num(r, o) : 0;
            break;
        case KM_SO_STRING:
            snprintf(FIELD(char, s, r->s_off), r->s_size, "%s",
                     set                           ? o_str(r, o)
                     : (r->flags & KM_SO_CFG_FILL) ? c_str(r, m)
                                                   : "");
            break;
        case KM_SO_SPECIAL:
            if (r->hooks->create && r->hooks->create(m, s, o))
                return -1;
            break;
        }
    }
    return 0;
}

void km_sessopt_warn(const km_manager *m, const session *s, const km_session_opts *o, json_t *arr)
{
    for (const km_sessopt *r = km_sessopts; r->name; r++) {
        if (!(r->flags & KM_SO_WARN))
            continue;
        if (r->type == KM_SO_SPECIAL) {
            if (r->hooks->warn)
                r->hooks->warn(m, s, o, arr);
            continue;
        }
        if (!o_set(r, o))
            continue;
        switch (r->type) {
        case KM_SO_BOOL: {
            int v = *CFIELD(int, s, r->s_off), kept = v >= 0 ? v : c_bool(r, m);
            if (o_bool(r, o) != kept)
                km_sessopt_warn_ignored(arr, s->name, r->flag, o_bool(r, o) ? "on" : "off", "%s %s",
                                        r->name, kept ? "on" : "off");
            break;
        }
        case KM_SO_SIZE: {
            unsigned long long v = *CFIELD(unsigned long long, s, r->s_off),
                               kept = v ? v : c_size(r, m);
            if (o_size(r, o) != kept)
                warn_ignored_limit(arr, s->name, r->flag, (double)o_size(r, o), r->unit, r->name,
                                   (double)kept, r->none);
            break;
        }
        case KM_SO_NUMBER: {
            double v = *CFIELD(double, s, r->s_off), kept = v > 0 ? v : c_num(r, m);
            if (o_num(r, o) != kept)
                warn_ignored_limit(arr, s->name, r->flag, o_num(r, o), r->unit, r->name, kept,
                                   r->none);
            break;
        }
        case KM_SO_STRING: {
            const char *v = CFIELD(char, s, r->s_off), *kept = v[0] ? v : c_str(r, m);
            if (strcmp(o_str(r, o), kept))
                km_sessopt_warn_ignored(arr, s->name, r->flag, o_str(r, o), "%s %s", r->name,
                                        kept[0] || !r->none ? kept : r->none);
            break;
        }
        case KM_SO_SPECIAL:
            break;
        }
    }
}

int km_sessopt_save(const session *s, json_t *opts)
{
    int rc = 0;
    for (const km_sessopt *r = km_sessopts; r->name; r++) {
        int always = (r->flags & KM_SO_SAVE_UNSET) != 0;
        json_t *v = NULL;
        switch (r->type) {
        case KM_SO_BOOL: {
            int b = *CFIELD(int, s, r->s_off);
            if (b < 0)
                continue;
            v = json_boolean(b);
            break;
        }
        case KM_SO_SIZE: {
            unsigned long long n = *CFIELD(unsigned long long, s, r->s_off);
            if (!n && !always)
                continue;
            v = json_integer((json_int_t)n);
            break;
        }
        case KM_SO_NUMBER: {
            double d = *CFIELD(double, s, r->s_off);
            if (!(d > 0) && !always)
                continue;
            v = json_real(d);
            break;
        }
        case KM_SO_STRING: {
            const char *t = CFIELD(char, s, r->s_off);
            if (!t[0] && !always)
                continue;
            /* NULL when t is not UTF-8: the save fails */
            v = json_string(t);
            break;
        }
        case KM_SO_SPECIAL:
            if (r->hooks->save && r->hooks->save(s, opts))
                rc = -1;
            continue;
        }
        if (json_object_set_new(opts, r->name, v))
            rc = -1;
    }
    return rc;
}

void km_sessopt_load(const km_manager *m, session *s, const json_t *opts, const char *name)
{
    for (const km_sessopt *r = km_sessopts; r->name; r++) {
        json_t *v = json_object_get(opts, r->name);
        /* the range a saved value must be in: its config key's */
        const kmcfg_opt *c = r->flags & KM_SO_NO_CONFIG ? NULL : kmcfg_opt_find(r->name);
        double min = c ? c->min : 0, max = c ? c->max : 0;
        switch (r->type) {
        case KM_SO_BOOL:
            *FIELD(int, s, r->s_off) = json_is_boolean(v) ? json_is_true(v) : -1;
            break;
        case KM_SO_SIZE:
            /* absent, or not a number of bytes of at least the key's minimum: unset */
            *FIELD(unsigned long long, s, r->s_off) =
                json_is_integer(v) && json_integer_value(v) >= 0 &&
                        (double)json_integer_value(v) >= min
                    ? (unsigned long long)json_integer_value(v)
                    : 0;
            break;
        case KM_SO_NUMBER: {
            /* absent, or not a number in the key's range: unset */
            double d = json_number_value(v);
            *FIELD(double, s, r->s_off) = d >= min && d <= max ? d : 0;
            break;
        }
        case KM_SO_STRING: {
            const char *t = json_string_value(v);
            snprintf(FIELD(char, s, r->s_off), r->s_size, "%s",
                     t && *t                       ? t
                     : (r->flags & KM_SO_CFG_FILL) ? c_str(r, m)
                                                   : "");
            break;
        }
        case KM_SO_SPECIAL:
            if (r->hooks->load)
                r->hooks->load(m, s, opts, name);
            break;
        }
    }
}

void km_sessopt_fork(const session *s, km_session_opts *o, json_t **hold)
{
    for (const km_sessopt *r = km_sessopts; r->name; r++) {
        if (r->flags & KM_SO_NO_FORK)
            continue;
        switch (r->type) {
        case KM_SO_BOOL:
            *FIELD(int, o, r->o_off) = *CFIELD(int, s, r->s_off);
            break;
        case KM_SO_SIZE:
            *FIELD(unsigned long long, o, r->o_off) = *CFIELD(unsigned long long, s, r->s_off);
            break;
        case KM_SO_NUMBER:
            *FIELD(double, o, r->o_off) = *CFIELD(double, s, r->s_off);
            break;
        case KM_SO_STRING: {
            /* borrowed: a session's options do not change once it exists */
            const char *t = CFIELD(char, s, r->s_off);
            *FIELD(const char *, o, r->o_off) = t[0] ? t : NULL;
            break;
        }
        case KM_SO_SPECIAL:
            if (r->hooks->fork)
                r->hooks->fork(s, o, hold);
            break;
        }
    }
}

void km_sessopt_params(const km_session_opts *o, json_t *req)
{
    for (const km_sessopt *r = km_sessopts; r->name; r++) {
        if (r->type == KM_SO_SPECIAL || !o_set(r, o))
            continue;
        json_object_set_new(req, r->name,
                            r->type == KM_SO_BOOL     ? json_boolean(o_bool(r, o))
                            : r->type == KM_SO_SIZE   ? json_integer((json_int_t)o_size(r, o))
                            : r->type == KM_SO_NUMBER ? json_real(o_num(r, o))
                                                      : json_string(o_str(r, o)));
    }
}
