/*
 * gwrest.c — the Jupyter kernels REST API (gw_int.h, the routes in
 * gateway.h): the routes table, its handlers, kernel ids, models and
 * kernelspecs. Runs on a REST job's thread: it calls the manager (km.h)
 * and writes only its job's status and response.
 */
#include "kernelmgr/frontends/gw_int.h"
#include "kernelmgr/frontends/kspecinstall.h"

#include <stdatomic.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GW_SESSION_PREFIX "jupyter-"

static void iso8601(double epoch, char out[40])
{
    time_t t = (time_t)epoch;
    struct tm tm;
    gmtime_r(&t, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 40, "%.20s.%06ldZ", base, (long)((epoch - (double)t) * 1e6) % 1000000);
}

/* The stable kernel id of (session, language): a UUID-shaped BLAKE2b; with
 * a node_id, "NODE-" and 14 bytes of it, 8-4-4-12 hex digits: still five
 * \w+ fields joined by '-' (the kernel id jupyter_server's routes accept),
 * and a balancer routes a kernel URL by its first field
 * (docs/MANY_MACHINES.md). */
static void kernel_id(const gateway *g, const char *session, const char *lang,
                      char out[GW_KERNEL_ID_MAX + 1])
{
    unsigned char h[16];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, (const unsigned char *)"kernelmgr-gateway", 18);
    crypto_generichash_update(&st, (const unsigned char *)session, strlen(session) + 1);
    crypto_generichash_update(&st, (const unsigned char *)lang, strlen(lang) + 1);
    crypto_generichash_final(&st, h, sizeof h);
    const char *node = km_manager_config(g->m)->node_id;
    if (node[0]) {
        snprintf(out, GW_KERNEL_ID_MAX + 1,
                 "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", node, h[0], h[1],
                 h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13]);
        return;
    }
    h[6] = (unsigned char)((h[6] & 0x0f) | 0x80); /* version 8: vendor-specific */
    h[8] = (unsigned char)((h[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    snprintf(out, GW_KERNEL_ID_MAX + 1,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", h[0], h[1],
             h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13], h[14],
             h[15]);
}

/* "kernelmgr-LANG" (the language table's kernelspec names, lang.h) into
 * buf. Returns buf. */
static const char *spec_name(const char *lang, char *buf, size_t len)
{
    snprintf(buf, len, "kernelmgr-%s", lang);
    return buf;
}

/* The language of a kernelspec name: kernelmgr-LANG, or a name or alias of
 * the table (python3, bash), or NULL; a session's own kernelspec
 * "kernelmgr-LANG--SESSION" also gives the session in *session (borrowed
 * from name). The language is borrowed from the manager's table. */
#define GW_SPEC_SEP "--"
static const char *spec_lang_session(const gateway *g, const char *name, const char **session)
{
    *session = NULL;
    const km_langs *t = &km_manager_config(g->m)->langs;
    for (int i = 0; i < t->n; i++) {
        char pre[KM_LANG_NAME_MAX + 16];
        snprintf(pre, sizeof pre, "kernelmgr-%s" GW_SPEC_SEP, t->v[i].name);
        if (!strncmp(name, pre, strlen(pre)) && name[strlen(pre)]) {
            *session = name + strlen(pre);
            return t->v[i].name;
        }
    }
    for (int i = 0; i < t->n; i++)
        if (!strncmp(name, "kernelmgr-", 10) && !strcmp(name + 10, t->v[i].name))
            return t->v[i].name;
    int l = km_langs_find(t, name);
    return l >= 0 ? t->v[l].name : NULL;
}

/* A kernel of the manager found by id: session and language, whether it
 * is live, and its model (new). 0 found, -1 not. */

static json_t *kernel_model(const char *id, const char *session, const char *lang,
                            const json_t *sess, const json_t *k)
{
    char when[40];
    iso8601(json_real_value(json_object_get(sess, "last_used")), when);
    const char *state = json_is_true(json_object_get(sess, "busy")) ? "busy" : "idle";
    /* A session the gateway did not create is named by its own kernelspec,
     * so a frontend that saves the kernelspec into the notebook reopens it
     * on that session, not on a new one. */
    char *name = NULL, nbuf[KM_LANG_NAME_MAX + 16];
    spec_name(lang, nbuf, sizeof nbuf);
    if (strncmp(session, GW_SESSION_PREFIX, strlen(GW_SESSION_PREFIX)) &&
        asprintf(&name, "%s" GW_SPEC_SEP "%s", nbuf, session) < 0)
        name = NULL;
    json_t *m =
        json_pack("{s:s s:s s:s s:s s:i s:{s:s s:s s:o}}", "id", id, "name", name ? name : nbuf,
                  "last_activity", when, "execution_state", k ? state : "dead", "connections", 0,
                  "kernelmgr", "session", session, "language", lang, "pid",
                  k ? json_incref(json_object_get(k, "pid")) : json_null());
    free(name);
    return m;
}

/* Every kernel of every session (of session scope only, when not NULL or
 * ""): live ones only unless all. new array. */
static json_t *list_kernels(gateway *g, int all, const char *scope)
{
    json_t *out = json_array();
    json_t *ss = km_sessions(g->m);
    size_t i;
    json_t *s;
    json_array_foreach(ss, i, s)
    {
        const char *name = json_string_value(json_object_get(s, "name"));
        json_t *ks = json_object_get(s, "kernels");
        const char *lang;
        json_t *k;
        json_object_foreach(ks, lang, k)
        {
            if (!name || (!all && !json_is_object(k)) || (scope && scope[0] && strcmp(name, scope)))
                continue;
            char id[GW_KERNEL_ID_MAX + 1];
            kernel_id(g, name, lang, id);
            json_array_append_new(out,
                                  kernel_model(id, name, lang, s, json_is_object(k) ? k : NULL));
        }
    }
    json_decref(ss);
    return out;
}

int gw_find_kernel(gateway *g, const char *id, gw_kernel *out)
{
    json_t *all = list_kernels(g, 1, NULL);
    size_t i;
    json_t *k;
    int rc = -1;
    json_array_foreach(all, i, k)
    {
        if (strcmp(json_string_value(json_object_get(k, "id")), id))
            continue;
        json_t *x = json_object_get(k, "kernelmgr");
        snprintf(out->session, sizeof out->session, "%s",
                 json_string_value(json_object_get(x, "session")));
        snprintf(out->lang, sizeof out->lang, "%s",
                 json_string_value(json_object_get(x, "language")));
        out->live = json_is_integer(json_object_get(x, "pid"));
        out->model = json_incref(k);
        rc = 0;
        break;
    }
    json_decref(all);
    return rc;
}

/* The connection file of the live kernel (session, lang), new (free()), or
 * NULL when it is not running. Never starts one. */
char *gw_live_cf(gateway *g, const char *session, const char *lang)
{
    json_t *ss = km_sessions(g->m);
    char *cf = NULL;
    size_t i;
    json_t *s;
    json_array_foreach(ss, i, s)
    {
        if (strcmp(json_string_value(json_object_get(s, "name")), session))
            continue;
        json_t *k = json_object_get(json_object_get(s, "kernels"), lang);
        const char *p = json_string_value(json_object_get(k, "connection_file"));
        if (p)
            cf = strdup(p);
        break;
    }
    json_decref(ss);
    return cf;
}

void gw_kernel_missing(const gateway *g, const char *id, unsigned *status, char **body)
{
    const char *node = km_manager_config(g->m)->node_id;
    size_t nl = strcspn(id, "-");
    *status = 404;
    if (node[0] && (nl != strlen(node) || strncmp(id, node, nl)))
        *body = gw_error_body("Not Found",
                              "Kernel does not exist: %s (this is node \"%s\"; a kernel id's "
                              "first field names the node that has it: the balancer routes by it)",
                              id, node);
    else
        *body = gw_error_body("Not Found", "Kernel does not exist: %s", id);
}

/* ---------------------------------------------------------------- REST */

static void respond(gw_job *j, unsigned status, char *body)
{
    j->status = status;
    j->resp = body;
}

static void km_fail(gw_job *j, const km_err *e)
{
    /* KM_EDAEMON: busy, or draining (no new sessions here) */
    unsigned st = e->code == KM_ENOSESSION ? 404
                  : e->code == KM_EUSAGE   ? 400
                  : e->code == KM_EDAEMON  ? 503
                                           : 500;
    respond(j, st,
            gw_error_body(st == 404   ? "Not Found"
                          : st == 400 ? "Bad Request"
                          : st == 503 ? "Service Unavailable"
                                      : "Error",
                          "%s", e->msg));
}

static json_t *one_spec(const char *name, const char *display, const char *lang,
                        const char *session, int debugger)
{
    json_t *spec = json_pack("{s:s s:{s:[] s:s s:s s:s s:{} s:{s:s s:s?}} s:{}}", "name", name,
                             "spec", "argv", "display_name", display, "language", lang,
                             "interrupt_mode", "message", "env", "metadata", "kernelmgr",
                             "sandboxed by kernelmgr", "session", session, "resources");
    /* what JupyterLab and VS Code read to offer their debugger */
    if (spec && debugger)
        json_object_set_new(json_object_get(json_object_get(spec, "spec"), "metadata"), "debugger",
                            json_true());
    return spec;
}

/* Whether the manager's Python kernels can debug (debugpy importable by
 * their interpreter): asked once per gateway, on the first listing. */
static int python_debugger(const kmcfg *cfg)
{
    static atomic_int known = -1;
    int v = atomic_load(&known);
    if (v < 0) {
        v = kspecinst_python_debugger(cfg->python);
        atomic_store(&known, v);
    }
    return v;
}

/* The kernelspecs: one per language for new sessions, and one per existing
 * session and language, "kernelmgr-python--NAME": starting it attaches to
 * that session's live kernel (how a frontend that can only start kernels
 * from a kernelspec opens an agent's session). Under a scope (/s/NAME/) the
 * sessions' ones are that session's only. */
static json_t *kernelspecs(gateway *g, const char *scope)
{
    json_t *specs = json_object();
    const kmcfg *cfg = km_manager_config(g->m);
    json_t *ss = km_sessions(g->m);
    for (int l = 0; l < cfg->langs.n; l++) {
        if (!cfg->allow[l])
            continue;
        const km_lang *lg = &cfg->langs.v[l];
        const char *lang = lg->name;
        char nbuf[KM_LANG_NAME_MAX + 16], *title = NULL;
        const char *name = spec_name(lang, nbuf, sizeof nbuf);
        if (asprintf(&title, "%s (kernelmgr%s)", lg->title, lg->backend[0] ? " sandbox" : "") < 0)
            title = NULL;
        int dbg = lg->takes_python && python_debugger(cfg);
        json_object_set_new(specs, name, one_spec(name, title ? title : lang, lang, NULL, dbg));
        free(title);
        size_t i;
        json_t *s;
        json_array_foreach(ss, i, s)
        {
            const char *sn = json_string_value(json_object_get(s, "name"));
            char *n2 = NULL, *disp = NULL;
            if (sn && scope[0] && strcmp(sn, scope))
                continue;
            if (sn && asprintf(&n2, "%s" GW_SPEC_SEP "%s", name, sn) >= 0 &&
                asprintf(&disp, "%s — session %s (kernelmgr)", lg->title, sn) >= 0)
                json_object_set_new(specs, n2, one_spec(n2, disp, lang, sn, dbg));
            free(n2);
            free(disp);
        }
    }
    json_decref(ss);
    return specs;
}

/* POST /api/kernels */
static void start_kernel(gw_job *j)
{
    gateway *g = j->g;
    json_error_t je;
    json_t *req =
        j->body_len ? json_loadb((const char *)j->body, j->body_len, 0, &je) : json_object();
    /* default: the first language of the table (kernelmgr-python) */
    char defname[KM_LANG_NAME_MAX + 16];
    const char *name = spec_name(km_manager_config(g->m)->langs.v[0].name, defname, sizeof defname);
    const char *session = NULL;
    json_t *env = NULL, *path = NULL, *kmo = NULL, *kenv = NULL;
    if (!req ||
        json_unpack_ex(req, &je, 0, "{s?:s s?:o s?:o s?:o}", "name", &name, "env", &env, "path",
                       &path, "kernelmgr", &kmo) ||
        (kmo &&
         json_unpack_ex(kmo, &je, JSON_STRICT, "{s?:s s?:o}", "session", &session, "env", &kenv))) {
        respond(j, 400, gw_error_body("Bad Request", "invalid request body: %s", je.text));
        json_decref(req);
        return;
    }
    const char *attach = NULL;
    const char *lang = spec_lang_session(g, name, &attach);
    /* a name is refused, never cut: a name cut to the limit could be
     * another session's */
    const char *bad = session && !km_name_valid(session) ? session
                      : attach && !km_name_valid(attach) ? attach
                                                         : NULL;
    if (bad) {
        respond(j, 400,
                gw_error_body("Bad Request",
                              "invalid session name of %zu bytes (allowed: letters, digits, _ - ., "
                              "at most %d bytes, not starting with '.')",
                              strlen(bad), KM_NAME_MAX));
        json_decref(req);
        return;
    }
    if (attach && session && strcmp(attach, session)) {
        respond(j, 400,
                gw_error_body("Bad Request",
                              "kernelspec %s names session \"%s\", the request "
                              "session \"%s\"",
                              name, attach, session));
        json_decref(req);
        return;
    }
    /* under /s/NAME/ (or X-Kernelmgr-Session) the kernel is that session's */
    const char *other = !j->scope[0]                           ? NULL
                        : session && strcmp(session, j->scope) ? session
                        : attach && strcmp(attach, j->scope)   ? attach
                                                               : NULL;
    if (other) {
        respond(j, 400,
                gw_error_body("Bad Request",
                              "the request names session \"%s\", the URL's /s/%s/ (or "
                              "X-Kernelmgr-Session) session \"%s\"",
                              other, j->scope, j->scope));
        json_decref(req);
        return;
    }
    if (j->scope[0] && !attach)
        session = j->scope;
    if (attach) {
        /* an existing session's kernel: attached, nothing created */
        km_err e = {0};
        char cf[4096], id[GW_KERNEL_ID_MAX + 1];
        gw_kernel gk;
        kernel_id(g, attach, lang, id);
        if (km_connection_file(g->m, attach, lang, cf, sizeof cf, &e))
            km_fail(j, &e);
        else if (gw_find_kernel(g, id, &gk) == 0)
            respond(j, 201, gw_json_text(gk.model));
        else
            respond(
                j, 500,
                gw_error_body("Error", "the kernel of session \"%s\" ended as it started", attach));
        json_decref(req);
        return;
    }
    if (!lang) {
        char known[400];
        respond(j, 404,
                gw_error_body(
                    "Not Found",
                    "no kernelspec named \"%s\" (kernelmgr-LANG for a language of "
                    "this manager: %s)",
                    name, km_langs_names(&km_manager_config(g->m)->langs, known, sizeof known)));
        json_decref(req);
        return;
    }
    /* The code's environment is what the session's configuration gives,
     * plus only what the client asks for explicitly in "kernelmgr": {"env"}.
     * The standard "env" is ignored: jupyter_server fills it with its own
     * process environment (host paths, tokens), which the sandbox must not
     * get. */
    (void)env;
    if (kenv && !json_is_object(kenv)) {
        respond(j, 400, gw_error_body("Bad Request", "kernelmgr.env must be an object of strings"));
        json_decref(req);
        return;
    }
    char sname[KM_NAME_MAX + 1];
    if (session)
        memcpy(sname, session, strlen(session) + 1); /* checked above: it fits */
    else {
        unsigned char r[6];
        randombytes_buf(r, sizeof r);
        snprintf(sname, sizeof sname, GW_SESSION_PREFIX "%02x%02x%02x%02x%02x%02x", r[0], r[1],
                 r[2], r[3], r[4], r[5]);
    }
    km_session_opts so;
    km_session_opts_init(&so);
    so.env = kenv && json_object_size(kenv) ? kenv : NULL;
    km_err e = {0};
    json_t *created = km_session_create(g->m, sname, &so, &e);
    char cf[4096];
    if (!created || km_connection_file(g->m, sname, lang, cf, sizeof cf, &e)) {
        km_fail(j, &e);
    } else {
        char id[GW_KERNEL_ID_MAX + 1];
        kernel_id(g, sname, lang, id);
        gw_kernel gk;
        if (gw_find_kernel(g, id, &gk) == 0) {
            respond(j, 201, gw_json_text(gk.model));
        } else {
            respond(
                j, 500,
                gw_error_body("Error", "the kernel of session \"%s\" ended as it started", sname));
        }
    }
    json_decref(created);
    json_decref(req);
}

static void route(gw_job *j, char *segs[5], int n);

void gw_rest_run(gw_job *j)
{
    /* split "/api/..." into up to 4 segments */
    char *segs[5] = {NULL};
    int n = 0;
    char *copy = strdup(j->path);
    if (!copy) {
        respond(j, 500, gw_error_body("Error", "out of memory"));
        return;
    }
    char *p = copy;
    while (*p == '/')
        p++;
    for (char *save = NULL, *t = strtok_r(p, "/", &save); t && n < 5;
         t = strtok_r(NULL, "/", &save))
        segs[n++] = t;
    route(j, segs, n);
    free(copy);
}

/* ---------------------------------------------------------------- routes */

static void on_version(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 200,
            gw_json_text(json_pack("{s:s s:s}", "version", "1.23.3", "kernelmgr", "gateway")));
}

static void on_kernelspecs(gw_job *j, char **segs, gw_kernel *gk)
{
    gateway *g = j->g;
    char defname[KM_LANG_NAME_MAX + 16];
    spec_name(km_manager_config(g->m)->langs.v[0].name, defname, sizeof defname);
    respond(j, 200,
            gw_json_text(json_pack("{s:s s:o}", "default", defname, "kernelspecs",
                                   kernelspecs(g, j->scope))));
}

static void on_kernelspec(gw_job *j, char **segs, gw_kernel *gk)
{
    json_t *specs = kernelspecs(j->g, j->scope);
    json_t *one = json_object_get(specs, segs[2]);
    if (one)
        respond(j, 200, gw_json_text(json_incref(one)));
    else
        respond(j, 404, gw_error_body("Not Found", "no kernelspec named \"%s\"", segs[2]));
    json_decref(specs);
}

static void no_spec_resource(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 404, gw_error_body("Not Found", "no such kernelspec resource"));
}

static void on_api_call(gw_job *j, char **segs, gw_kernel *gk)
{
    gateway *g = j->g;
    json_error_t je;
    json_t *req = json_loadb((const char *)j->body, j->body_len, 0, &je);
    if (!req) {
        respond(j, 200,
                gw_json_text(json_pack("{s:s s:n s:{s:i s:s}}", "jsonrpc", "2.0", "id", "error",
                                       "code", -32700, "message", "parse error")));
        return;
    }
    j->verbatim = 1;
    json_t *refused = gwapi_check(req, j->scope);
    respond(j, 200, gw_json_text(refused ? refused : gwapi_call(g->home, req, g->o.max_pending)));
    json_decref(req);
}

static void api_post_only(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 405,
            gw_error_body("Method Not Allowed", "POST a JSON-RPC 2.0 request here (docs/API.md)"));
}

static void on_list_kernels(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 200, gw_json_text(list_kernels(j->g, 0, j->scope)));
}

static void on_start_kernel(gw_job *j, char **segs, gw_kernel *gk)
{
    start_kernel(j);
}

static void kernels_not_allowed(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 405, gw_error_body("Method Not Allowed", "%s is not allowed here", j->method));
}

static void on_kernel(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 200, gw_json_text(json_incref(gk->model)));
}

static void on_delete_kernel(gw_job *j, char **segs, gw_kernel *gk)
{
    km_err e = {0};
    /* a session the gateway did not create (an agent's) is detached
     * from, never shut down: its state is the agent's */
    if (strncmp(gk->session, GW_SESSION_PREFIX, strlen(GW_SESSION_PREFIX)))
        respond(j, 204, NULL);
    else if (km_close(j->g->m, gk->session, 0, &e))
        km_fail(j, &e);
    else
        respond(j, 204, NULL);
}

static void on_interrupt(gw_job *j, char **segs, gw_kernel *gk)
{
    km_err e = {0};
    if (km_interrupt(j->g->m, gk->session, &e))
        km_fail(j, &e);
    else
        respond(j, 204, NULL);
}

static void on_restart(gw_job *j, char **segs, gw_kernel *gk)
{
    km_err e = {0};
    gw_kernel after = {0};
    if (km_restart(j->g->m, gk->session, &e))
        km_fail(j, &e);
    else if (gw_find_kernel(j->g, segs[2], &after) == 0)
        respond(j, 200, gw_json_text(after.model));
    else
        respond(j, 500, gw_error_body("Error", "the kernel did not come back after restart"));
}

static void kernel_not_allowed(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 405,
            gw_error_body("Method Not Allowed", "%s %s is not allowed", j->method, j->path));
}

/* The REST routes, first match wins. A pattern is path segments: "*" is any
 * one, a final "**" any number (none too). method NULL is any method: the
 * answer to a path whose methods above did not match. With kernel, the
 * third segment names a kernel, looked up before any handler (404 when
 * none, whatever the method). The token is not a column: every request
 * shows it before it is routed (on_http_request), and nothing is routed
 * without it. */
typedef struct gw_route {
    const char *method;
    const char *pattern;
    int kernel;
    void (*handler)(gw_job *j, char **segs, gw_kernel *gk);
} gw_route;

static const gw_route routes[] = {
    {"GET", "api", 0, on_version},
    {"GET", "api/kernelspecs", 0, on_kernelspecs},
    {"GET", "api/kernelspecs/*", 0, on_kernelspec},
    {NULL, "api/kernelspecs/**", 0, no_spec_resource},
    {NULL, "api/kernelspecs-resources/**", 0, no_spec_resource},
    {"POST", "api/kernelmgr", 0, on_api_call},
    {NULL, "api/kernelmgr", 0, api_post_only},
    {"GET", "api/kernels", 0, on_list_kernels},
    {"POST", "api/kernels", 0, on_start_kernel},
    {NULL, "api/kernels", 0, kernels_not_allowed},
    {"GET", "api/kernels/*", 1, on_kernel},
    {"DELETE", "api/kernels/*", 1, on_delete_kernel},
    {"POST", "api/kernels/*/interrupt", 1, on_interrupt},
    {"POST", "api/kernels/*/restart", 1, on_restart},
    {NULL, "api/kernels/*/**", 1, kernel_not_allowed},
    {NULL, NULL, 0, NULL},
};

/* 1 when the n segments match pattern. */
static int route_matches(const char *pattern, char **segs, int n)
{
    int i = 0;
    for (const char *p = pattern; *p; i++) {
        const char *end = strchrnul(p, '/');
        size_t len = (size_t)(end - p);
        if (len == 2 && !strncmp(p, "**", 2))
            return 1;
        if (i >= n)
            return 0;
        if (!(len == 1 && *p == '*') && (strlen(segs[i]) != len || strncmp(segs[i], p, len)))
            return 0;
        p = *end ? end + 1 : end;
    }
    return i == n;
}

static void route(gw_job *j, char *segs[5], int n)
{
    const gw_route *r = routes;
    for (; r->pattern; r++)
        if ((!r->method || !strcmp(r->method, j->method)) && route_matches(r->pattern, segs, n))
            break;
    if (!r->pattern) {
        respond(j, 404, gw_error_body("Not Found", "no such resource: %s", j->path));
        return;
    }
    gw_kernel gk = {0};
    if (r->kernel && gw_find_kernel(j->g, segs[2], &gk)) {
        gw_kernel_missing(j->g, segs[2], &j->status, &j->resp);
        return;
    }
    if (r->kernel && j->scope[0] && strcmp(gk.session, j->scope)) {
        respond(j, 404,
                gw_error_body("Not Found",
                              "Kernel %s is not a kernel of session \"%s\" (the URL's /s/%s/ or "
                              "X-Kernelmgr-Session)",
                              segs[2], j->scope, j->scope));
        json_decref(gk.model);
        return;
    }
    r->handler(j, segs, r->kernel ? &gk : NULL);
    json_decref(gk.model);
}
