/*
 * gateway.c — the Jupyter kernels REST API and kernel WebSocket on
 * libwebsockets (see gateway.h).
 *
 * Threads: libwebsockets runs in the gateway's own thread and never blocks
 * on the manager: every REST request runs as a job in a thread of its own
 * (a kernel start may take a while), whose response the service thread
 * writes once lws_cancel_service() wakes it. Each WebSocket connection has
 * a relay (gwrelay.c) with its own thread and ZeroMQ sockets.
 */
#include "kernelmgr/frontends/gateway.h"
#include "common/cm_clock.h"
#include "kernelmgr/frontends/gwapi.h"
#include "kernelmgr/frontends/gwpeers.h"
#include "kernelmgr/frontends/gwrelay.h"
#include "kernelmgr/frontends/gwwire.h"
#include "kernelmgr/frontends/kspecinstall.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libwebsockets.h>
#include <pthread.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GW_DEFAULT_BODY (1u << 20)
#define GW_DEFAULT_MESSAGE (64u << 20)
#define GW_DEFAULT_PENDING (64u << 20)
#define GW_DEFAULT_CONNECTIONS 64u
#define GW_DEFAULT_RATE 500.0
#define GW_HDR_MAX 4096
/* The fd budget (gateway.h "Bounds before the token"): the gateway takes at
 * most GW_FD_SHARE of RLIMIT_NOFILE (the rest is the daemon's: its socket,
 * its clients, its kernels); a kernel WebSocket costs its socket plus its
 * relay's ZeroMQ context and sockets (GW_FDS_PER_WS; measured: 10), any other
 * connection its socket plus, while a REST job runs, both ends of that job's
 * connection to the daemon (GW_FDS_PER_CONN). lws's own table is capped at
 * GW_CONN_MAX connections: with a limit of its own it finds a socket's
 * connection by a linear search. */
#define GW_FD_SHARE 2
#define GW_FDS_PER_WS 16u
#define GW_FDS_PER_CONN 3u
#define GW_CONN_MAX 4096u
#define GW_LWS_OWN_FDS 4u /* the listen socket, the cancel pipe, slack */
#define GW_REFUSAL_LOG_S 10.0
#define GW_SESSION_PREFIX "jupyter-"

typedef struct gw_job gw_job;

/* Per-connection data (lws allocates it zeroed, one per wsi). */
typedef struct gw_conn {
    gateway *g;
    struct lws *wsi;
    /* HTTP */
    char method[8];
    char *path;
    unsigned char *body;
    size_t body_len;
    gw_job *job;
    unsigned status;
    char *resp;
    size_t resp_len;
    /* rate limit (token bucket) */
    double tokens, last;
    /* WebSocket */
    int is_ws;
    gw_form form;
    char kernel_id[40];
    char session[KM_NAME_MAX + 1],
        lang[KM_LANG_NAME_MAX + 1]; /* the kernel's, found at the upgrade */
    char *cf;                       /* the connection file the relay was made from */
    gwrelay *relay;
    gwapi_conn *api; /* instead of relay: /api/kernelmgr/ws, the kernelmgr API */
    unsigned char *rx;
    size_t rx_len, rx_cap;
    int rx_too_big;
    int closing; /* a limit was hit: close (with close_why) once writeable */
    enum lws_close_status close_status;
    char close_why[124];
    unsigned char *tx; /* LWS_PRE + frame scratch */
    size_t tx_cap;
    struct gw_conn *next; /* gateway's WebSocket list (service thread only) */
} gw_conn;

struct gw_job {
    gateway *g;
    gw_conn *conn; /* NULL once the connection closed before the job ended */
    char method[8];
    char *path;
    unsigned char *body;
    size_t body_len;
    unsigned status;
    char *resp;
    int verbatim; /* the kernelmgr API's own response: passed on as the daemon wrote it */
    int done;
    gw_job *next_done;
};

struct gateway {
    km_manager *m;
    gateway_opts o;
    char *token, *home, *home_real, *listen_addr, *origin, *tls_cert, *tls_key;
    int port, tls;
    char url[128];
    struct lws_context *ctx;
    struct lws_vhost *vh;
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t mu;     /* done jobs, running job count */
    gw_job *done;           /* under mu */
    unsigned jobs;          /* running job threads, under mu */
    pthread_cond_t jobs_cv; /* jobs reached 0 */
    gw_conn *ws;            /* service thread only */
    unsigned n_ws;          /* service thread only */
    struct lws_protocols protocols[3];
    /* before the token (service thread only) */
    gwpeers *peers;
    unsigned conn_budget;    /* connections at once, from RLIMIT_NOFILE */
    unsigned header_timeout; /* http_header_timeout */
    unsigned long rlim;      /* RLIMIT_NOFILE at start */
    char *host;              /* http_host: another name the gateway answers to */
    int any_addr, loopback;  /* listening on 0.0.0.0 / on 127.0.0.0/8 */
    unsigned long refused[GWPEERS_TOTAL + 1], idle_closed; /* since the last log line */
    double last_log;
    lws_sorted_usec_list_t log_sul; /* the next log line, when one is held back */
};

/* ---------------------------------------------------------------- helpers */

/* The token bucket of one connection: 0 when this event is within the rate. */
static int rate_exceeded(gw_conn *c, double rate)
{
    double t = cm_mono_s();
    if (c->last == 0) {
        c->tokens = 2 * rate;
        c->last = t;
    }
    c->tokens += (t - c->last) * rate;
    if (c->tokens > 2 * rate)
        c->tokens = 2 * rate;
    c->last = t;
    if (c->tokens < 1)
        return 1;
    c->tokens -= 1;
    return 0;
}

static char *json_text(json_t *v) /* steals v; new (free()) */
{
    char *t = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    return t;
}

/* s (stolen) with every occurrence of the manager's home (as configured and
 * as resolved) replaced by "$KERNELMGR_HOME": what the gateway tells an
 * HTTP client names no host path (an engine error quotes the connection
 * file, a log, the socket). new (free()); NULL when s is. */
static char *redact_home(const gateway *g, char *s)
{
    const char *homes[2] = {g->home, g->home_real};
    for (int h = 0; h < 2 && s; h++) {
        const char *home = homes[h];
        size_t hl = home ? strlen(home) : 0;
        if (hl < 2 || !strstr(s, home))
            continue;
        static const char ph[] = "$KERNELMGR_HOME";
        size_t n = 0;
        for (const char *p = s; (p = strstr(p, home)); p += hl)
            n++;
        char *out = malloc(strlen(s) + n * sizeof ph + 1), *o = out;
        if (!out) {
            free(s);
            return NULL;
        }
        const char *p = s;
        for (const char *q; (q = strstr(p, home)); p = q + hl) {
            memcpy(o, p, (size_t)(q - p));
            o += q - p;
            memcpy(o, ph, sizeof ph - 1);
            o += sizeof ph - 1;
        }
        strcpy(o, p);
        free(s);
        s = out;
    }
    return s;
}

/* Jupyter's error body: {"message": ..., "reason": ...}. new (free()). */
static char *error_body(const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static char *error_body(const char *reason, const char *fmt, ...)
{
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    char *t = msg ? json_text(json_pack("{s:s s:s}", "message", msg, "reason", reason)) : NULL;
    free(msg);
    return t;
}

static void iso8601(double epoch, char out[40])
{
    time_t t = (time_t)epoch;
    struct tm tm;
    gmtime_r(&t, &tm);
    char base[32];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 40, "%.20s.%06ldZ", base, (long)((epoch - (double)t) * 1e6) % 1000000);
}

/* The stable kernel id of (session, language): a UUID-shaped BLAKE2b. */
static void kernel_id(const char *session, const char *lang, char out[40])
{
    unsigned char h[16];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof h);
    crypto_generichash_update(&st, (const unsigned char *)"kernelmgr-gateway", 18);
    crypto_generichash_update(&st, (const unsigned char *)session, strlen(session) + 1);
    crypto_generichash_update(&st, (const unsigned char *)lang, strlen(lang) + 1);
    crypto_generichash_final(&st, h, sizeof h);
    h[6] = (unsigned char)((h[6] & 0x0f) | 0x80); /* version 8: vendor-specific */
    h[8] = (unsigned char)((h[8] & 0x3f) | 0x80); /* RFC 4122 variant */
    snprintf(out, 40, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", h[0],
             h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], h[13],
             h[14], h[15]);
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
typedef struct gw_kernel {
    char session[KM_NAME_MAX + 1];
    char lang[KM_LANG_NAME_MAX + 1];
    int live;
    json_t *model;
} gw_kernel;

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

/* Every kernel of every session: live ones only unless all. new array. */
static json_t *list_kernels(gateway *g, int all)
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
            if (!name || (!all && !json_is_object(k)))
                continue;
            char id[40];
            kernel_id(name, lang, id);
            json_array_append_new(out,
                                  kernel_model(id, name, lang, s, json_is_object(k) ? k : NULL));
        }
    }
    json_decref(ss);
    return out;
}

static int find_kernel(gateway *g, const char *id, gw_kernel *out)
{
    json_t *all = list_kernels(g, 1);
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
static char *live_cf(gateway *g, const char *session, const char *lang)
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

/* ---------------------------------------------------------------- REST */

static void respond(gw_job *j, unsigned status, char *body)
{
    j->status = status;
    j->resp = body;
}

static void km_fail(gw_job *j, const km_err *e)
{
    unsigned st = e->code == KM_ENOSESSION ? 404 : e->code == KM_EUSAGE ? 400 : 500;
    respond(j, st,
            error_body(st == 404   ? "Not Found"
                       : st == 400 ? "Bad Request"
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
 * from a kernelspec opens an agent's session). */
static json_t *kernelspecs(gateway *g)
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
        respond(j, 400, error_body("Bad Request", "invalid request body: %s", je.text));
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
                error_body("Bad Request",
                           "invalid session name of %zu bytes (allowed: letters, digits, _ - ., "
                           "at most %d bytes, not starting with '.')",
                           strlen(bad), KM_NAME_MAX));
        json_decref(req);
        return;
    }
    if (attach && session && strcmp(attach, session)) {
        respond(j, 400,
                error_body("Bad Request",
                           "kernelspec %s names session \"%s\", the request "
                           "session \"%s\"",
                           name, attach, session));
        json_decref(req);
        return;
    }
    if (attach) {
        /* an existing session's kernel: attached, nothing created */
        km_err e = {0};
        char cf[4096], id[40];
        gw_kernel gk;
        kernel_id(attach, lang, id);
        if (km_connection_file(g->m, attach, lang, cf, sizeof cf, &e))
            km_fail(j, &e);
        else if (find_kernel(g, id, &gk) == 0)
            respond(j, 201, json_text(gk.model));
        else
            respond(
                j, 500,
                error_body("Error", "the kernel of session \"%s\" ended as it started", attach));
        json_decref(req);
        return;
    }
    if (!lang) {
        char known[400];
        respond(j, 404,
                error_body("Not Found",
                           "no kernelspec named \"%s\" (kernelmgr-LANG for a language of "
                           "this manager: %s)",
                           name,
                           km_langs_names(&km_manager_config(g->m)->langs, known, sizeof known)));
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
        respond(j, 400, error_body("Bad Request", "kernelmgr.env must be an object of strings"));
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
        char id[40];
        kernel_id(sname, lang, id);
        gw_kernel gk;
        if (find_kernel(g, id, &gk) == 0) {
            respond(j, 201, json_text(gk.model));
        } else {
            respond(j, 500,
                    error_body("Error", "the kernel of session \"%s\" ended as it started", sname));
        }
    }
    json_decref(created);
    json_decref(req);
}

static void route(gw_job *j, char *segs[5], int n);

static void run_job(gw_job *j)
{
    /* split "/api/..." into up to 4 segments */
    char *segs[5] = {NULL};
    int n = 0;
    char *copy = strdup(j->path);
    if (!copy) {
        respond(j, 500, error_body("Error", "out of memory"));
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
    respond(j, 200, json_text(json_pack("{s:s s:s}", "version", "1.23.3", "kernelmgr", "gateway")));
}

static void on_kernelspecs(gw_job *j, char **segs, gw_kernel *gk)
{
    gateway *g = j->g;
    char defname[KM_LANG_NAME_MAX + 16];
    spec_name(km_manager_config(g->m)->langs.v[0].name, defname, sizeof defname);
    respond(j, 200,
            json_text(json_pack("{s:s s:o}", "default", defname, "kernelspecs", kernelspecs(g))));
}

static void on_kernelspec(gw_job *j, char **segs, gw_kernel *gk)
{
    json_t *specs = kernelspecs(j->g);
    json_t *one = json_object_get(specs, segs[2]);
    if (one)
        respond(j, 200, json_text(json_incref(one)));
    else
        respond(j, 404, error_body("Not Found", "no kernelspec named \"%s\"", segs[2]));
    json_decref(specs);
}

static void no_spec_resource(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 404, error_body("Not Found", "no such kernelspec resource"));
}

static void on_api_call(gw_job *j, char **segs, gw_kernel *gk)
{
    gateway *g = j->g;
    json_error_t je;
    json_t *req = json_loadb((const char *)j->body, j->body_len, 0, &je);
    if (!req) {
        respond(j, 200,
                json_text(json_pack("{s:s s:n s:{s:i s:s}}", "jsonrpc", "2.0", "id", "error",
                                    "code", -32700, "message", "parse error")));
        return;
    }
    j->verbatim = 1;
    json_t *refused = gwapi_check(req);
    respond(j, 200, json_text(refused ? refused : gwapi_call(g->home, req, g->o.max_pending)));
    json_decref(req);
}

static void api_post_only(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 405,
            error_body("Method Not Allowed", "POST a JSON-RPC 2.0 request here (docs/API.md)"));
}

static void on_list_kernels(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 200, json_text(list_kernels(j->g, 0)));
}

static void on_start_kernel(gw_job *j, char **segs, gw_kernel *gk)
{
    start_kernel(j);
}

static void kernels_not_allowed(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 405, error_body("Method Not Allowed", "%s is not allowed here", j->method));
}

static void on_kernel(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 200, json_text(json_incref(gk->model)));
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
    else if (find_kernel(j->g, segs[2], &after) == 0)
        respond(j, 200, json_text(after.model));
    else
        respond(j, 500, error_body("Error", "the kernel did not come back after restart"));
}

static void kernel_not_allowed(gw_job *j, char **segs, gw_kernel *gk)
{
    respond(j, 405, error_body("Method Not Allowed", "%s %s is not allowed", j->method, j->path));
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
        respond(j, 404, error_body("Not Found", "no such resource: %s", j->path));
        return;
    }
    gw_kernel gk = {0};
    if (r->kernel && find_kernel(j->g, segs[2], &gk)) {
        respond(j, 404, error_body("Not Found", "Kernel does not exist: %s", segs[2]));
        return;
    }
    r->handler(j, segs, r->kernel ? &gk : NULL);
    json_decref(gk.model);
}

static void job_free(gw_job *j)
{
    free(j->path);
    free(j->body);
    free(j->resp);
    free(j);
}

static void *job_thread(void *arg)
{
    gw_job *j = arg;
    gateway *g = j->g;
    run_job(j);
    if (!j->verbatim)
        j->resp = redact_home(g, j->resp);
    if (!j->resp && j->status != 204)
        respond(j, 500, NULL);
    pthread_mutex_lock(&g->mu);
    j->done = 1;
    if (j->conn) {
        j->next_done = g->done;
        g->done = j;
    } else {
        job_free(j); /* the connection went away meanwhile */
    }
    /* under mu, before the count drops: gateway_stop destroys the context
     * only once no job is left */
    lws_cancel_service(g->ctx);
    if (--g->jobs == 0)
        pthread_cond_broadcast(&g->jobs_cv);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Starts the job of connection c (its method, path and body move into it). */
static int start_job(gw_conn *c)
{
    gateway *g = c->g;
    gw_job *j = calloc(1, sizeof *j);
    if (!j)
        return -1;
    j->g = g;
    j->conn = c;
    snprintf(j->method, sizeof j->method, "%s", c->method);
    j->path = c->path;
    j->body = c->body;
    j->body_len = c->body_len;
    c->path = NULL;
    c->body = NULL;
    c->body_len = 0;
    c->job = j;
    /* lws times the request's content with http_header_timeout; the job
     * (a kernel start, an exec) takes as long as it takes */
    lws_set_timeout(c->wsi, NO_PENDING_TIMEOUT, 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    pthread_mutex_lock(&g->mu);
    g->jobs++;
    int rc = pthread_create(&t, &attr, job_thread, j);
    if (rc) {
        g->jobs--;
        c->job = NULL;
    }
    pthread_mutex_unlock(&g->mu);
    pthread_attr_destroy(&attr);
    if (rc) {
        c->path = j->path;
        c->body = j->body;
        free(j);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- auth */

/* 0 when the request carries the token (header or ?token=). */
static int authorized(gateway *g, struct lws *wsi)
{
    char buf[GW_HDR_MAX];
    const char *tok = NULL;
    int n = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n > 0) {
        if (!strncasecmp(buf, "token ", 6))
            tok = buf + 6;
        else if (!strncasecmp(buf, "bearer ", 7))
            tok = buf + 7;
    }
    char qbuf[GW_HDR_MAX];
    if (!tok)
        tok = lws_get_urlarg_by_name(wsi, "token=", qbuf, sizeof qbuf);
    if (!tok)
        return -1;
    while (*tok == ' ')
        tok++;
    size_t tl = strlen(tok), kl = strlen(g->token);
    return tl == kl && sodium_memcmp(tok, g->token, kl) == 0 ? 0 : -1;
}

/* 0 when a WebSocket upgrade's Origin (if any) is the Host's or the
 * configured one. */
static int origin_ok(gateway *g, struct lws *wsi, char *why, size_t len)
{
    char origin[512], host[512];
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN);
    if (n <= 0)
        return 0; /* not a browser: no Origin to check */
    if (n >= (int)sizeof origin ||
        lws_hdr_copy(wsi, origin, sizeof origin, WSI_TOKEN_ORIGIN) != n) {
        snprintf(why, len, "WebSocket refused: an Origin of %d bytes is over the limit of %zu", n,
                 sizeof origin - 1);
        return -1;
    }
    if (g->origin && !strcmp(origin, g->origin))
        return 0;
    if (lws_hdr_copy(wsi, host, sizeof host, WSI_TOKEN_HOST) > 0) {
        const char *o = strstr(origin, "://");
        if (o && !strcmp(o + 3, host))
            return 0;
    }
    snprintf(why, len, "WebSocket from origin %.200s refused (allowed: the Host's%s%.200s)", origin,
             g->origin ? " or " : "", g->origin ? g->origin : "");
    return -1;
}

/* 0 when the request's Host names this gateway: its listen address (any
 * IP literal when that is 0.0.0.0), localhost when it listens on loopback,
 * or the configured http_host; the port is not compared (a port is no
 * defence against DNS rebinding, and a proxy or a port forward changes it).
 * A DNS name the gateway does not know is how DNS rebinding reaches a local
 * server, so it is refused before the token is even looked at. lws's own
 * check (LWS_SERVER_OPTION_VHOST_UPG_STRICT_HOST_CHECK) matches a prefix of
 * one name, only on upgrades, and hangs up without saying why. A request
 * without Host (HTTP/1.0) comes from no browser and passes. */
#define GW_HOST_MAX 255
static int host_ok(const gateway *g, struct lws *wsi, char *why, size_t len)
{
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_HOST);
    if (n <= 0)
        return 0;
    char host[GW_HOST_MAX + 1];
    if (n > GW_HOST_MAX || lws_hdr_copy(wsi, host, sizeof host, WSI_TOKEN_HOST) != n) {
        snprintf(why, len, "a Host of %d bytes is over the limit of %d", n, GW_HOST_MAX);
        return -1;
    }
    char *name = host;
    int v6 = 0;
    if (*name == '[') {
        char *end = strchr(name, ']');
        if (end) {
            *end = 0;
            name++;
            v6 = 1;
        }
    } else {
        char *colon = strchr(name, ':');
        if (colon)
            *colon = 0;
    }
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcasecmp(name, g->listen_addr) ||
        ((g->loopback || g->any_addr) && !strcasecmp(name, "localhost")) ||
        (g->host && !strcasecmp(name, g->host)) ||
        (g->any_addr &&
         (v6 ? inet_pton(AF_INET6, name, &a6) == 1 : inet_pton(AF_INET, name, &a4) == 1)))
        return 0;
    snprintf(why, len,
             "the Host header names neither this gateway's address (%s)%s nor a configured "
             "name (http_host%s%s): refused as DNS rebinding",
             g->any_addr ? "any IP address" : g->listen_addr,
             g->loopback || g->any_addr ? " nor localhost" : "", g->host ? " " : " unset",
             g->host ? g->host : "");
    return -1;
}

/* ---------------------------------------------------------------- HTTP */

static int write_response(struct lws *wsi, gw_conn *c)
{
    size_t n = c->resp ? strlen(c->resp) : 0;
    unsigned char *buf = malloc(LWS_PRE + 2048 + n);
    if (!buf)
        return -1;
    unsigned char *start = buf + LWS_PRE, *p = start, *end = start + 2048 - 1;
    const char *ctype = c->status == 204 ? NULL : "application/json";
    if (lws_add_http_common_headers(wsi, c->status, ctype, n, &p, end) ||
        (c->status == 401 &&
         lws_add_http_header_by_name(wsi, (const unsigned char *)"www-authenticate:",
                                     (const unsigned char *)"token", 5, &p, end)) ||
        lws_finalize_write_http_header(wsi, start, &p, end)) {
        free(buf);
        return -1;
    }
    int rc = 0;
    if (n) {
        memcpy(start, c->resp, n);
        if (lws_write(wsi, start, n, LWS_WRITE_HTTP_FINAL) != (int)n)
            rc = -1;
    }
    free(buf);
    free(c->resp);
    c->resp = NULL;
    c->status = 0;
    /* a connection that never showed the token gets one answer and is
     * closed: it cannot hold its place by keeping the connection alive */
    if (rc || !gwpeers_is_authenticated(lws_get_opaque_user_data(wsi)) ||
        lws_http_transaction_completed(wsi))
        return -1;
    return 0;
}

static void http_reply_now(struct lws *wsi, gw_conn *c, unsigned status, char *body)
{
    free(c->resp);
    c->status = status;
    c->resp = body;
    lws_callback_on_writable(wsi);
}

static void http_reset(gw_conn *c)
{
    free(c->path);
    free(c->body);
    c->path = NULL;
    c->body = NULL;
    c->body_len = 0;
}

static int on_http(struct lws *wsi, gw_conn *c, const char *uri)
{
    gateway *g = c->g;
    http_reset(c);
    c->wsi = wsi;
    gwpeers_request(lws_get_opaque_user_data(wsi));
    char why[512];
    if (host_ok(g, wsi, why, sizeof why)) {
        http_reply_now(wsi, c, 403, error_body("Forbidden", "%s", why));
        return 0;
    }
    if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI))
        snprintf(c->method, sizeof c->method, "GET");
    else if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI))
        snprintf(c->method, sizeof c->method, "POST");
    else if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI))
        snprintf(c->method, sizeof c->method, "DELETE");
    else {
        http_reply_now(wsi, c, 405, error_body("Method Not Allowed", "method not allowed"));
        return 0;
    }
    if (rate_exceeded(c, g->o.rate)) {
        http_reply_now(wsi, c, 429,
                       error_body("Too Many Requests",
                                  "rate limit of %.0f requests per second per connection "
                                  "exceeded",
                                  g->o.rate));
        return 0;
    }
    if (authorized(g, wsi)) {
        http_reply_now(wsi, c, 401,
                       error_body("Unauthorized", "a valid token is required "
                                                  "(header \"Authorization: token ...\")"));
        return 0;
    }
    gwpeers_authenticated(g->peers, lws_get_opaque_user_data(wsi));
    c->path = strdup(uri);
    if (!c->path)
        return -1;
    if (!strcmp(c->method, "POST")) {
        char cl[32];
        if (lws_hdr_copy(wsi, cl, sizeof cl, WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0) {
            unsigned long long len = strtoull(cl, NULL, 10);
            if (len > g->o.max_body) {
                http_reset(c);
                http_reply_now(wsi, c, 413,
                               error_body("Payload Too Large",
                                          "request body of %llu bytes is over the limit of %zu "
                                          "bytes",
                                          len, g->o.max_body));
                return 0;
            }
            if (len > 0)
                return 0; /* the body comes in LWS_CALLBACK_HTTP_BODY */
        }
    }
    if (start_job(c))
        http_reply_now(wsi, c, 503, error_body("Service Unavailable", "cannot start a worker"));
    return 0;
}

static int on_http_body(struct lws *wsi, gw_conn *c, const void *in, size_t len)
{
    gateway *g = c->g;
    if (!c->path)
        return 0; /* already answered */
    if (c->body_len + len > g->o.max_body) {
        http_reset(c);
        http_reply_now(wsi, c, 413,
                       error_body("Payload Too Large", "request body over the limit of %zu bytes",
                                  g->o.max_body));
        return 0;
    }
    unsigned char *nb = realloc(c->body, c->body_len + len + 1);
    if (!nb)
        return -1;
    memcpy(nb + c->body_len, in, len);
    c->body = nb;
    c->body_len += len;
    c->body[c->body_len] = 0;
    return 0;
}

/* ---------------------------------------------------------------- WebSocket */

static void relay_wake(void *ud)
{
    gateway *g = ud;
    lws_cancel_service(g->ctx);
}

/* The kernel id of ".../api/kernels/ID/channels", or -1. */
#define GW_API_PATH "/api/kernelmgr"
#define GW_API_WS_PATH "/api/kernelmgr/ws"

static int channels_path(const char *uri, char id[40])
{
    const char *pre = "/api/kernels/";
    const char *p = strstr(uri, pre);
    if (!p || p != uri)
        return -1;
    p += strlen(pre);
    const char *slash = strchr(p, '/');
    if (!slash || slash - p >= 40 || slash == p || strcmp(slash, "/channels"))
        return -1;
    memcpy(id, p, (size_t)(slash - p));
    id[slash - p] = 0;
    return 0;
}

/* A refused upgrade: answered; an unauthenticated connection is then closed
 * (-1: lws hangs up), an authenticated one kept (1). */
static int refuse_upgrade(struct lws *wsi, unsigned status, const char *why)
{
    lws_return_http_status(wsi, status, why);
    return gwpeers_is_authenticated(lws_get_opaque_user_data(wsi)) ? 1 : -1;
}

static int confirm_upgrade(struct lws *wsi, gateway *g, const char *upgrade)
{
    char uri[1024], id[40], why[512];
    gwpeers_request(lws_get_opaque_user_data(wsi));
    if (host_ok(g, wsi, why, sizeof why))
        return refuse_upgrade(wsi, 403, why);
    if (!upgrade || strcasecmp(upgrade, "websocket"))
        return refuse_upgrade(wsi, 400, "only a WebSocket upgrade is served");
    if (lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI) <= 0 ||
        (channels_path(uri, id) && strcmp(uri, GW_API_WS_PATH)))
        return refuse_upgrade(wsi, 404, "no WebSocket here: use /api/kernels/ID/channels");
    if (authorized(g, wsi))
        return refuse_upgrade(wsi, 401, "a valid token is required");
    gwpeers_authenticated(g->peers, lws_get_opaque_user_data(wsi));
    if (origin_ok(g, wsi, why, sizeof why)) {
        lws_return_http_status(wsi, 403, why);
        return 1;
    }
    if (g->n_ws >= g->o.max_connections) {
        snprintf(why, sizeof why, "too many WebSocket connections (limit %u)",
                 g->o.max_connections);
        lws_return_http_status(wsi, 503, why);
        return 1;
    }
    return 0;
}

static void ws_unlink(gateway *g, gw_conn *c)
{
    for (gw_conn **pp = &g->ws; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            g->n_ws--;
            return;
        }
}

/* (Re)connects c's relay to the kernel's current connection file cf
 * (stolen). 0, or -1 with why. */
static int ws_connect(gateway *g, gw_conn *c, char *cf, char *why, size_t len)
{
    jp_connection conn;
    jp_error je;
    int rc = -1;
    gwrelay_destroy(&c->relay);
    free(c->cf);
    c->cf = cf;
    if (jp_connection_read(cf, &conn, &je) != JP_OK)
        snprintf(why, len, "the kernel's connection file: %s", je.reason);
    else if ((c->relay = gwrelay_new(&conn, c->form, g->o.max_pending, relay_wake, g, why, len)))
        rc = 0;
    sodium_memzero(&conn, sizeof conn);
    return rc;
}

/* Every second: a kernel restarted by someone else (the agent, a restart
 * after a crash) has a new connection file; the relay follows it. */
static void ws_follow(gateway *g, gw_conn *c, const char *session, const char *lang)
{
    char *cf = live_cf(g, session, lang);
    if (cf && c->cf && strcmp(cf, c->cf)) {
        char why[600];
        if (ws_connect(g, c, cf, why, sizeof why))
            fprintf(stderr, "kernelmgr gateway: cannot follow kernel %s to its restart: %s\n",
                    c->kernel_id, why);
        lws_callback_on_writable(c->wsi);
        return;
    }
    free(cf);
}

/* Closes a WebSocket with status and why as its close reason (at most 120
 * bytes: a close frame's reason must fit in 123); returns -1 for the lws
 * callback to return. */
static int ws_close(struct lws *wsi, enum lws_close_status status, const char *why)
{
    struct lws_vhost *vh = lws_get_vhost(wsi);
    const gateway *g = vh ? lws_get_vhost_user(vh) : NULL;
    char *r = g ? redact_home(g, strdup(why)) : NULL;
    const char *t = r ? r : why;
    size_t n = strlen(t);
    lws_close_reason(wsi, status, (unsigned char *)t, n > 120 ? 120 : n);
    free(r);
    return -1;
}

static int ws_established(struct lws *wsi, gw_conn *c, gateway *g)
{
    char uri[1024];
    c->g = g;
    c->wsi = wsi;
    c->is_ws = 1;
    const struct lws_protocols *pr = lws_get_protocol(wsi);
    c->form = pr && pr->name && !strcmp(pr->name, GW_SUBPROTOCOL_V1) ? GW_FORM_V1 : GW_FORM_JSON;
    if (lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI) <= 0)
        return -1;
    if (!strcmp(uri, GW_API_WS_PATH)) {
        char why[300];
        snprintf(c->kernel_id, sizeof c->kernel_id, "api");
        c->api = gwapi_open(g->home, g->o.max_pending, relay_wake, g, why, sizeof why);
        if (!c->api) {
            return ws_close(wsi, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, why);
        }
        c->next = g->ws;
        g->ws = c;
        g->n_ws++;
        return 0;
    }
    if (channels_path(uri, c->kernel_id))
        return -1;
    gw_kernel gk = {0};
    char why[600] = "";
    if (find_kernel(g, c->kernel_id, &gk)) {
        snprintf(why, sizeof why, "no kernel %s", c->kernel_id);
    } else {
        km_err e = {0};
        char cf[4096];
        char *dup = NULL;
        snprintf(c->session, sizeof c->session, "%s", gk.session);
        snprintf(c->lang, sizeof c->lang, "%s", gk.lang);
        if (km_connection_file(g->m, gk.session, gk.lang, cf, sizeof cf, &e))
            snprintf(why, sizeof why, "%.500s", e.msg);
        else if (!(dup = strdup(cf)))
            snprintf(why, sizeof why, "out of memory");
        else
            ws_connect(g, c, dup, why, sizeof why);
    }
    json_decref(gk.model);
    if (!c->relay) {
        fprintf(stderr, "kernelmgr gateway: WebSocket for kernel %s refused: %s\n", c->kernel_id,
                why);
        return ws_close(wsi, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, why);
    }
    c->next = g->ws;
    g->ws = c;
    g->n_ws++;
    lws_set_timer_usecs(wsi, 1000000);
    return 0;
}

static int ws_receive(struct lws *wsi, gw_conn *c, const void *in, size_t len)
{
    gateway *g = c->g;
    if (!c->relay && !c->api)
        return -1;
    if (lws_is_first_fragment(wsi)) {
        c->rx_len = 0;
        c->rx_too_big = 0;
    }
    if (!c->rx_too_big) {
        if (c->rx_len + len > g->o.max_message) {
            c->rx_too_big = 1;
        } else {
            if (c->rx_len + len > c->rx_cap) {
                size_t cap = c->rx_cap ? c->rx_cap : 4096;
                while (cap < c->rx_len + len)
                    cap *= 2;
                unsigned char *nb = realloc(c->rx, cap);
                if (!nb)
                    return -1;
                c->rx = nb;
                c->rx_cap = cap;
            }
            memcpy(c->rx + c->rx_len, in, len);
            c->rx_len += len;
        }
    }
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi))
        return 0;
    char why[300];
    /* A limit closes the connection with a close frame saying which limit;
     * the close waits for the next writeable callback, so that what the
     * client already sent is read (closing with unread input would reset
     * the connection and lose the close frame). Input meanwhile is dropped. */
    if (c->closing)
        return 0;
    if (c->rx_too_big || rate_exceeded(c, g->o.rate)) {
        c->closing = 1;
        c->close_status =
            c->rx_too_big ? LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE : LWS_CLOSE_STATUS_POLICY_VIOLATION;
        if (c->rx_too_big)
            snprintf(c->close_why, sizeof c->close_why, "message over the limit of %zu bytes",
                     g->o.max_message);
        else
            snprintf(c->close_why, sizeof c->close_why,
                     "rate limit of %.0f messages per second exceeded", g->o.rate);
        fprintf(stderr, "kernelmgr gateway: closing a WebSocket of kernel %s: %s\n", c->kernel_id,
                c->close_why);
        lws_callback_on_writable(wsi);
        return 0;
    }
    if (c->api) {
        if (gwapi_send(c->api, (const char *)c->rx, c->rx_len)) {
            gwapi_failed(c->api, why, sizeof why);
            return ws_close(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, why);
        }
        return 0;
    }
    jp_channel ch;
    jmsg *m = NULL;
    char err[300];
    if (gwwire_decode(c->form, lws_frame_is_binary(wsi), c->rx, c->rx_len, &ch, &m, err,
                      sizeof err)) {
        /* like jupyter_server: a bad message is logged and dropped, the
         * connection stays */
        fprintf(stderr, "kernelmgr gateway: dropped a client message for kernel %s: %s\n",
                c->kernel_id, err);
        return 0;
    }
    if (gwrelay_send(c->relay, ch, m)) {
        gwrelay_failed(c->relay, why, sizeof why);
        return ws_close(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, why);
    }
    return 0;
}

/* Writes one frame (data stolen) behind LWS_PRE bytes of headroom and asks
 * for the next writeable callback (more may wait). 0 or -1 (close). */
static int ws_write_frame(struct lws *wsi, gw_conn *c, unsigned char *data, size_t len, int binary)
{
    if (LWS_PRE + len > c->tx_cap) {
        unsigned char *nb = realloc(c->tx, LWS_PRE + len);
        if (!nb) {
            free(data);
            return -1;
        }
        c->tx = nb;
        c->tx_cap = LWS_PRE + len;
    }
    memcpy(c->tx + LWS_PRE, data, len);
    free(data);
    if (lws_write(wsi, c->tx + LWS_PRE, len, binary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT) < (int)len)
        return -1;
    lws_callback_on_writable(wsi);
    return 0;
}

static int ws_writeable(struct lws *wsi, gw_conn *c)
{
    if (c->closing) {
        if (lws_partial_buffered(wsi)) { /* what was sent before goes first */
            lws_callback_on_writable(wsi);
            return 0;
        }
        lws_close_reason(wsi, c->close_status, (unsigned char *)c->close_why, strlen(c->close_why));
        return -1;
    }
    char why[256];
    if (c->api) {
        char *line;
        size_t n;
        if (gwapi_pop(c->api, &line, &n))
            return ws_write_frame(wsi, c, (unsigned char *)line, n, 0);
        if (gwapi_failed(c->api, why, sizeof why)) {
            return ws_close(wsi, LWS_CLOSE_STATUS_GOINGAWAY, why);
        }
        return 0;
    }
    if (!c->relay)
        return -1;
    unsigned char *data;
    size_t len;
    int binary;
    if (gwrelay_pop(c->relay, &data, &len, &binary))
        return ws_write_frame(wsi, c, data, len, binary);
    if (gwrelay_failed(c->relay, why, sizeof why)) {
        return ws_close(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, why);
    }
    return 0;
}

static void ws_closed(gw_conn *c)
{
    if (!c->is_ws)
        return;
    ws_unlink(c->g, c);
    gwrelay_destroy(&c->relay);
    gwapi_close(&c->api);
    free(c->rx);
    free(c->tx);
    free(c->cf);
    c->cf = NULL;
    c->rx = c->tx = NULL;
    c->is_ws = 0;
}

/* Jobs that finished: their connections may write now. */
static void on_cancelled(gateway *g)
{
    pthread_mutex_lock(&g->mu);
    gw_job *d = g->done;
    g->done = NULL;
    for (gw_job *j = d, *n; j; j = n) {
        n = j->next_done;
        gw_conn *c = j->conn;
        if (c) {
            c->job = NULL;
            free(c->resp);
            c->status = j->status;
            c->resp = j->resp;
            j->resp = NULL;
            lws_callback_on_writable(c->wsi);
        }
        job_free(j);
    }
    pthread_mutex_unlock(&g->mu);
    for (gw_conn *c = g->ws; c; c = c->next)
        lws_callback_on_writable(c->wsi);
}

/* ---------------------------------------------------------------- connections */

static uint32_t peer_addr(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ((const struct sockaddr_in *)ss)->sin_addr.s_addr;
    return 0; /* the listener is IPv4 only: anything else is one bucket */
}

static void log_refusals(gateway *g, int force);

static void log_held_back(lws_sorted_usec_list_t *sul)
{
    log_refusals(lws_container_of(sul, gateway, log_sul), 0);
}

/* One line at most every GW_REFUSAL_LOG_S seconds, counting what was
 * refused or timed out since the last (a flood never floods the log); what
 * comes within the window is written when it ends (an lws timer). */
static void log_refusals(gateway *g, int force)
{
    unsigned long n = g->idle_closed;
    for (int v = 0; v <= GWPEERS_TOTAL; v++)
        n += g->refused[v];
    double t = cm_mono_s();
    if (!n)
        return;
    if (!force && g->last_log && t - g->last_log < GW_REFUSAL_LOG_S) {
        if (!atomic_load(&g->stop))
            lws_sul_schedule(g->ctx, 0, &g->log_sul, log_held_back,
                             (lws_usec_t)((GW_REFUSAL_LOG_S - (t - g->last_log)) * 1e6) + 1000);
        return;
    }
    fprintf(stderr,
            "kernelmgr gateway: refused %lu connections (%lu over http_max_unauth_per_peer %u, "
            "%lu over http_max_unauth %u, %lu over the connection budget %u) and closed %lu "
            "without the token that sent no complete request (http_header_timeout %u s); "
            "%u open, %u without the token\n",
            g->refused[GWPEERS_PEER] + g->refused[GWPEERS_UNAUTH] + g->refused[GWPEERS_TOTAL],
            g->refused[GWPEERS_PEER], gwpeers_limit_value(g->peers, GWPEERS_PEER),
            g->refused[GWPEERS_UNAUTH], gwpeers_limit_value(g->peers, GWPEERS_UNAUTH),
            g->refused[GWPEERS_TOTAL], g->conn_budget, g->idle_closed, g->header_timeout,
            gwpeers_total(g->peers), gwpeers_unauth(g->peers));
    memset(g->refused, 0, sizeof g->refused);
    g->idle_closed = 0;
    g->last_log = t;
}

/* A connection over a bound: counted, and told so in one write when that is
 * cheap (plain HTTP; nothing is read) before the caller closes it. */
static void refuse_connection(gateway *g, gwpeers_verdict v, int fd)
{
    g->refused[v]++;
    if (!g->tls && fd >= 0) {
        char body[320], msg[512];
        int bl = snprintf(body, sizeof body,
                          "{\"message\":\"%s (%s: %u)\",\"reason\":\"Service Unavailable\"}",
                          v == GWPEERS_PEER     ? "too many connections without the token from "
                                                  "this address"
                          : v == GWPEERS_UNAUTH ? "too many connections without the token"
                                                : "the gateway is at its connection budget",
                          gwpeers_limit_name(v), gwpeers_limit_value(g->peers, v));
        int ml = snprintf(msg, sizeof msg,
                          "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                          "content-length: %d\r\nconnection: close\r\n\r\n%s",
                          bl, body);
        if (bl > 0 && ml > 0 && ml < (int)sizeof msg &&
            send(fd, msg, (size_t)ml, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            /* the peer is gone or not reading: it is closed all the same */
        }
    }
    log_refusals(g, 0);
}

/* LWS_CALLBACK_FILTER_NETWORK_CONNECTION: just accepted, nothing allocated
 * for it yet. 0 to go on, 1 for lws to close it. */
static int filter_connection(gateway *g, const struct lws_filter_network_conn_args *a)
{
    gwpeers_verdict v = gwpeers_check(g->peers, peer_addr(&a->cli_addr));
    if (v == GWPEERS_OK)
        return 0;
    refuse_connection(g, v, a->accept_fd);
    return 1;
}

/* LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED: the connection is counted
 * from here until LWS_CALLBACK_WSI_DESTROY (its record is the wsi's opaque
 * user data), unauthenticated until a request shows the token. */
static int admit_connection(gateway *g, struct lws *wsi)
{
    if (lws_get_opaque_user_data(wsi))
        return 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = lws_get_socket_fd(wsi);
    memset(&ss, 0, sizeof ss);
    if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &sl))
        ss.ss_family = AF_UNSPEC;
    gwpeers_verdict v;
    gwpeers_conn *pc = gwpeers_admit(g->peers, peer_addr(&ss), &v);
    if (!pc) {
        refuse_connection(g, v, fd);
        return -1;
    }
    lws_set_opaque_user_data(wsi, pc);
    return 0;
}

static void release_connection(gateway *g, struct lws *wsi)
{
    gwpeers_conn *pc = lws_get_opaque_user_data(wsi);
    if (!pc)
        return;
    lws_set_opaque_user_data(wsi, NULL);
    if (gwpeers_release(g->peers, &pc)) {
        g->idle_closed++;
        log_refusals(g, 0);
    }
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len)
{
    gw_conn *c = user;
    struct lws_vhost *vh = lws_get_vhost(wsi);
    gateway *g = vh ? lws_get_vhost_user(vh) : NULL;
    /* user is our gw_conn only for the connection reasons below (for the
     * TLS ones it is an OpenSSL object): set its gateway there */
    switch (reason) {
    case LWS_CALLBACK_HTTP:
    case LWS_CALLBACK_HTTP_BODY:
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
    case LWS_CALLBACK_HTTP_WRITEABLE:
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
    case LWS_CALLBACK_ESTABLISHED:
    case LWS_CALLBACK_RECEIVE:
    case LWS_CALLBACK_SERVER_WRITEABLE:
    case LWS_CALLBACK_TIMER:
    case LWS_CALLBACK_CLOSED:
        if (!c || !g)
            return reason == LWS_CALLBACK_CLOSED || reason == LWS_CALLBACK_CLOSED_HTTP ||
                           reason == LWS_CALLBACK_HTTP_DROP_PROTOCOL
                       ? 0
                       : -1;
        if (!c->g)
            c->g = g;
        break;
    default:
        break;
    }
    switch (reason) {
    case LWS_CALLBACK_HTTP:
        return on_http(wsi, c, in ? (const char *)in : "/");
    case LWS_CALLBACK_HTTP_BODY:
        return on_http_body(wsi, c, in, len);
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (c->path && !c->job && start_job(c))
            http_reply_now(wsi, c, 503, error_body("Service Unavailable", "cannot start a worker"));
        return 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        if (c->status)
            return write_response(wsi, c);
        return 0;
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        if (c && g) {
            pthread_mutex_lock(&g->mu);
            if (c->job) {
                c->job->conn = NULL; /* the job frees itself, or on_cancelled does */
                /* a done job still on the list: detach it there too */
                c->job = NULL;
            }
            pthread_mutex_unlock(&g->mu);
            http_reset(c);
            free(c->resp);
            c->resp = NULL;
            c->status = 0;
        }
        return 0;
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return g ? confirm_upgrade(wsi, g, in) : -1;
    case LWS_CALLBACK_ESTABLISHED:
        return g ? ws_established(wsi, c, g) : -1;
    case LWS_CALLBACK_RECEIVE:
        return ws_receive(wsi, c, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return ws_writeable(wsi, c);
    case LWS_CALLBACK_TIMER:
        if (c && c->is_ws && g && !c->api) {
            ws_follow(g, c, c->session, c->lang);
            lws_set_timer_usecs(wsi, 1000000);
        }
        return 0;
    case LWS_CALLBACK_CLOSED:
        if (c)
            ws_closed(c);
        return 0;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        if (g)
            on_cancelled(g);
        return 0;
    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
        return g && user ? filter_connection(g, user) : 1;
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
        return g ? admit_connection(g, wsi) : -1;
    case LWS_CALLBACK_WSI_DESTROY:
        if (g)
            release_connection(g, wsi);
        return 0;
    case LWS_CALLBACK_RAW_ADOPT:
    case LWS_CALLBACK_RAW_RX:
        /* an HTTP CONNECT turns the connection raw in lws, with no timeout
         * and no request to authenticate: nothing is served raw here */
        return -1;
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------- start/stop */

int gateway_built_in(void)
{
    return 1;
}

/* The token: given, or read from / generated into HOME/http-token (0600). */
static char *load_token(const char *home, const char *given, char *err, size_t errlen)
{
    if (given && *given)
        return strdup(given);
    char *path = NULL;
    if (asprintf(&path, "%s/http-token", home) < 0) {
        gw_err(err, errlen, "out of memory");
        return NULL;
    }
    char buf[128];
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        struct stat st;
        ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                            !(st.st_mode & 077)
                        ? read(fd, buf, sizeof buf - 1)
                        : -1;
        close(fd);
        if (n >= 32) {
            buf[n] = 0;
            buf[strcspn(buf, "\r\n")] = 0;
            if (strlen(buf) >= 32) {
                free(path);
                return strdup(buf);
            }
        }
        unlink(path); /* unusable: made anew */
    }
    unsigned char r[24];
    randombytes_buf(r, sizeof r);
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(buf + 2 * i, 3, "%02x", r[i]);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, buf, strlen(buf)) != (ssize_t)strlen(buf) || write(fd, "\n", 1) != 1) {
        gw_err(err, errlen, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(path);
        return NULL;
    }
    close(fd);
    free(path);
    return strdup(buf);
}

static void *service_thread(void *arg)
{
    gateway *g = arg;
    while (!atomic_load(&g->stop)) {
        if (lws_service(g->ctx, 0) < 0)
            break;
    }
    lws_sul_cancel(&g->log_sul);
    log_refusals(g, 1);
    return NULL;
}

static void write_info(gateway *g)
{
    char *path = NULL, *tmp = NULL;
    if (asprintf(&path, "%s/http.json", g->home) < 0)
        return;
    if (asprintf(&tmp, "%s.tmp", path) < 0) {
        free(path);
        return;
    }
    json_t *o = json_pack("{s:s s:i s:i s:b}", "url", g->url, "port", g->port, "pid", (int)getpid(),
                          "tls", g->tls);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    char *t = json_text(o);
    if (fd >= 0 && t && write(fd, t, strlen(t)) == (ssize_t)strlen(t)) {
        close(fd);
        fd = -1;
        rename(tmp, path);
    }
    if (fd >= 0)
        close(fd);
    free(t);
    free(tmp);
    free(path);
}

/* The bounds before the token (gateway.h): the connection budget from
 * RLIMIT_NOFILE, the unauthenticated bounds and the names from the
 * manager's configuration. 0, or -1 with a reason. */
static int connection_bounds(gateway *g, char *err, size_t errlen)
{
    const kmcfg *cfg = km_manager_config(g->m);
    struct rlimit rl;
    unsigned long lim = 1024; /* the kernel's default, if it cannot be read */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        lim = rl.rlim_cur == RLIM_INFINITY ? 1ul << 20 : (unsigned long)rl.rlim_cur;
    g->rlim = lim;
    unsigned long share = lim / GW_FD_SHARE,
                  ws = (unsigned long)g->o.max_connections * GW_FDS_PER_WS + GW_LWS_OWN_FDS;
    unsigned long conns = share > ws ? (share - ws) / GW_FDS_PER_CONN : 0;
    if (conns > GW_CONN_MAX)
        conns = GW_CONN_MAX;
    unsigned need = cfg->http_max_unauth + g->o.max_connections;
    if (conns < need)
        return gw_err(err, errlen,
                      "RLIMIT_NOFILE of %lu leaves the gateway (at most 1/%d of it) room for %lu "
                      "connections, fewer than http_max_unauth %u + http_max_connections %u: "
                      "raise the limit or lower those",
                      lim, GW_FD_SHARE, conns, cfg->http_max_unauth, g->o.max_connections);
    g->conn_budget = (unsigned)conns;
    g->header_timeout = cfg->http_header_timeout;
    g->peers = gwpeers_new(g->conn_budget, cfg->http_max_unauth, cfg->http_max_unauth_per_peer);
    if (!g->peers || (cfg->http_host[0] && !(g->host = strdup(cfg->http_host))))
        return gw_err(err, errlen, "out of memory");
    struct in_addr a4;
    if (inet_pton(AF_INET, g->listen_addr, &a4) == 1) {
        g->any_addr = a4.s_addr == htonl(INADDR_ANY);
        g->loopback = (ntohl(a4.s_addr) >> 24) == 127;
    }
    char *real = realpath(g->home, NULL);
    if (real && strcmp(real, g->home))
        g->home_real = real;
    else
        free(real);
    return 0;
}

/* Frees what gateway_start allocated (the context is already destroyed);
 * the token is wiped first. */
static void gateway_free(gateway *g)
{
    if (g->token)
        sodium_memzero(g->token, strlen(g->token));
    free(g->token);
    free(g->home);
    free(g->home_real);
    free(g->host);
    gwpeers_destroy(&g->peers);
    free(g->origin);
    free(g->listen_addr);
    free(g->tls_cert);
    free(g->tls_key);
    pthread_cond_destroy(&g->jobs_cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

gateway *gateway_start(km_manager *m, const gateway_opts *o, char *err, size_t errlen)
{
    if (!o->listen || !*o->listen) {
        gw_err(err, errlen, "no HTTP listen address");
        return NULL;
    }
    int tls = o->tls_cert && *o->tls_cert;
    if (tls != (o->tls_key && *o->tls_key)) {
        gw_err(err, errlen, "TLS needs both a certificate (--tls-cert) and a key (--tls-key)");
        return NULL;
    }
    if (gateway_listen_valid(o->listen, tls, o->insecure, err, errlen))
        return NULL;
    if (sodium_init() < 0) {
        gw_err(err, errlen, "libsodium failed to initialise");
        return NULL;
    }
    gateway *g = calloc(1, sizeof *g);
    if (!g) {
        gw_err(err, errlen, "out of memory");
        return NULL;
    }
    g->m = m;
    g->o = *o;
    if (!g->o.max_body)
        g->o.max_body = GW_DEFAULT_BODY;
    if (!g->o.max_message)
        g->o.max_message = GW_DEFAULT_MESSAGE;
    if (!g->o.max_pending)
        g->o.max_pending = GW_DEFAULT_PENDING;
    if (!g->o.max_connections)
        g->o.max_connections = GW_DEFAULT_CONNECTIONS;
    if (g->o.rate <= 0)
        g->o.rate = GW_DEFAULT_RATE;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->jobs_cv, NULL);
    g->tls = tls;
    g->home = strdup(km_manager_home(m));
    g->origin = o->origin && *o->origin ? strdup(o->origin) : NULL;
    g->listen_addr = calloc(1, 64);
    g->o.listen = g->o.token = g->o.tls_cert = g->o.tls_key = g->o.origin = NULL;
    if (!g->home || !g->listen_addr ||
        gw_parse_listen(o->listen, g->listen_addr, 64, &g->port, err, errlen))
        goto fail;
    g->token = load_token(g->home, o->token, err, errlen);
    if (!g->token)
        goto fail;
    if (tls && (!(g->tls_cert = strdup(o->tls_cert)) || !(g->tls_key = strdup(o->tls_key))))
        goto fail;
    if (connection_bounds(g, err, errlen))
        goto fail;

    lws_set_log_level(LLL_ERR, NULL);
    g->protocols[0] = (struct lws_protocols){"http", callback, sizeof(gw_conn), 65536, 0, NULL, 0};
    g->protocols[1] =
        (struct lws_protocols){GW_SUBPROTOCOL_V1, callback, sizeof(gw_conn), 65536, 0, NULL, 0};
    struct lws_context_creation_info ci;
    memset(&ci, 0, sizeof ci);
    ci.options = LWS_SERVER_OPTION_EXPLICIT_VHOSTS | LWS_SERVER_OPTION_DISABLE_IPV6 |
                 (tls ? LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT : 0);
    ci.port = CONTEXT_PORT_NO_LISTEN;
    /* lws's own bounds, behind ours (gwpeers refuses first): its table of
     * connections, which stops accepting when full; and its timeout for
     * the TLS handshake and for a request's content to arrive */
    ci.fd_limit_per_thread = g->conn_budget + GW_LWS_OWN_FDS;
    ci.timeout_secs = g->header_timeout;
    g->ctx = lws_create_context(&ci);
    if (!g->ctx) {
        gw_err(err, errlen, "cannot create the HTTP server context");
        goto fail;
    }
    struct lws_context_creation_info vi;
    memset(&vi, 0, sizeof vi);
    vi.port = g->port;
    vi.iface = g->listen_addr;
    vi.protocols = g->protocols;
    vi.user = g;
    vi.vhost_name = "kernelmgr";
    vi.alpn = "http/1.1";
    vi.options = LWS_SERVER_OPTION_DISABLE_IPV6 | LWS_SERVER_OPTION_VALIDATE_UTF8;
    vi.ka_time = 0;
    /* the request line and headers must be in within http_header_timeout
     * of the connection (or of the previous response on a kept-alive one) */
    vi.timeout_secs_ah_idle = g->header_timeout;
    if (tls) {
        vi.ssl_cert_filepath = g->tls_cert;
        vi.ssl_private_key_filepath = g->tls_key;
        vi.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    }
    g->vh = lws_create_vhost(g->ctx, &vi);
    if (!g->vh) {
        gw_err(err, errlen,
               "cannot serve HTTP on %s:%d (address in use, not available, or the TLS files "
               "unreadable)",
               g->listen_addr, g->port);
        goto fail;
    }
    g->port = lws_get_vhost_listen_port(g->vh);
    fprintf(stderr,
            "kernelmgr gateway: at most %u connections (1/%d of RLIMIT_NOFILE %lu, less %u per "
            "WebSocket for http_max_connections %u), %u without the token (%u per address), "
            "headers within %u s\n",
            g->conn_budget, GW_FD_SHARE, g->rlim, GW_FDS_PER_WS, g->o.max_connections,
            gwpeers_limit_value(g->peers, GWPEERS_UNAUTH),
            gwpeers_limit_value(g->peers, GWPEERS_PEER), g->header_timeout);
    snprintf(g->url, sizeof g->url, "%s://%s:%d/", tls ? "https" : "http", g->listen_addr, g->port);
    if (pthread_create(&g->thread, NULL, service_thread, g)) {
        gw_err(err, errlen, "cannot start the HTTP thread");
        goto fail;
    }
    write_info(g);
    return g;
fail:
    if (g->ctx)
        lws_context_destroy(g->ctx);
    gateway_free(g);
    return NULL;
}

void gateway_stop(gateway **pg)
{
    if (!pg || !*pg)
        return;
    gateway *g = *pg;
    atomic_store(&g->stop, 1);
    lws_cancel_service(g->ctx);
    pthread_join(g->thread, NULL);
    /* jobs still running finish (they hold the manager, not the context) */
    pthread_mutex_lock(&g->mu);
    while (g->jobs)
        pthread_cond_wait(&g->jobs_cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    lws_context_destroy(g->ctx); /* closes every connection: relays end in ws_closed */
    g->ctx = NULL;
    for (gw_job *j = g->done, *n; j; j = n) {
        n = j->next_done;
        job_free(j);
    }
    char *path = NULL;
    if (asprintf(&path, "%s/http.json", g->home) >= 0) {
        unlink(path);
        free(path);
    }
    gateway_free(g);
    *pg = NULL;
}

const char *gateway_url(const gateway *g)
{
    return g->url;
}

int gateway_port(const gateway *g)
{
    return g->port;
}
