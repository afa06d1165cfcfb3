/*
 * mcp_tools.c — the tools of `kernelmgr mcp`: schemas, descriptions and
 * handlers. Each tool is a thin translation into one request of the
 * daemon's API (docs/API.md, through mcp_daemon.h): the daemon owns the
 * sessions, their workspace files (read and written confined by wsfile.c)
 * and package installs, under each session's lock, and validates every
 * request; a tool only renames arguments and renders the result for a
 * model. The tools are one table (mcpt_tools[], at the end): name,
 * description, schema and handler together.
 */
#include "kernelmgr/frontends/mcp_tools.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernelmgr/frontends/mcp_daemon.h"
#include "kernelmgr/frontends/mcp_render.h"
#include "kernelmgr/engine/wsfile.h"
#include "kernelmgr/service/dtier.h"

#define DEFAULT_SESSION "default"
#define LIST_MAX 2000

/* ---------------------------------------------------------------- helpers */

static json_t *tool_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static json_t *tool_error(const char *fmt, ...)
{
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return mcpr_text_result(buf, 1);
}

/* Same rule as the manager's session names (km_name_valid), checked here so
 * a bad name is a clear tool error rather than a daemon round trip. */
static int session_name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 64 || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.')
            return 0;
    return 1;
}

/* Reads args.session: required unless dflt is given. NULL with *errres set. */
static const char *arg_session(json_t *args, const char *dflt, json_t **errres)
{
    json_t *v = json_object_get(args, "session");
    if (!v && dflt)
        return dflt;
    if (!json_is_string(v)) {
        *errres = tool_error("`session` (string) is required");
        return NULL;
    }
    if (!session_name_ok(json_string_value(v))) {
        *errres = tool_error("invalid session name '%.80s': use 1-64 letters, digits, '_', '-' "
                             "or '.', not starting with '.'",
                             json_string_value(v));
        return NULL;
    }
    return json_string_value(v);
}

/* 1 when name is a session option the mcp tier may set (dtier.h). */
static int mcp_sessopt(const char *name)
{
    const dtier_sessopt *o = dtier_sessopt_find(name);
    return o && (o->f.tiers & DT_M);
}

/* Refuses unknown argument names: a typo ("timeout" for "timeout_s") must
 * not be silently ignored. The names are the properties of the tool's
 * schema and, with session_options, the session options the mcp tier may
 * set. NULL, or a tool error that lists them. */
static json_t *check_keys(const mcpt_tool *t, json_t *args)
{
    json_t *schema = json_loads(t->input_schema, 0, NULL);
    json_t *props = json_object_get(schema, "properties");
    json_t *res = NULL;
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v)
    {
        if (json_object_get(props, key) || (t->session_options && mcp_sessopt(key)))
            continue;
        char list[400] = "";
        const char *name;
        json_t *pv;
        int i = 0;
        json_object_foreach(props, name, pv)
        {
            strncat(list, i++ ? ", " : "", sizeof list - strlen(list) - 1);
            strncat(list, name, sizeof list - strlen(list) - 1);
        }
        for (const dtier_sessopt *o = dtier_sessopts; t->session_options && o->f.name; o++)
            if (o->f.tiers & DT_M) {
                strncat(list, ", ", sizeof list - strlen(list) - 1);
                strncat(list, o->f.name, sizeof list - strlen(list) - 1);
            }
        res = tool_error("unknown argument '%.60s' (expected: %s)", key, list);
        break;
    }
    json_decref(schema);
    return res;
}

/* new: the result of an API request without events, or NULL with err. */
static json_t *api(const char *method, json_t *params, km_err *err)
{
    return mcpd_request(method, params, NULL, NULL, NULL, err);
}

/* The session options a tool that may create a session accepts: those of
 * the daemon's table (dtier.h) the mcp tier may set, copied to the API
 * request as they are. The daemon validates them, applies the operator's
 * ceilings and refuses what the tier may not send; the relaxing values
 * (network on, sandbox none) are refused here too with the operator's
 * remedy. NULL, or a tool error. */
static json_t *copy_session_opts(mcp_call *call, json_t *args, json_t *req)
{
    int unsafe_ok = mcp_server_options(call->srv)->allow_unsafe_session_options;
    for (const dtier_sessopt *o = dtier_sessopts; o->f.name; o++) {
        json_t *v = json_object_get(args, o->f.name);
        if (!v || !(o->f.tiers & DT_M))
            continue;
        const char *sv = json_string_value(v);
        if (o->relaxing && sv && !strcmp(sv, o->relaxing) && !unsafe_ok)
            return tool_error("`%s` \"%s\" is not allowed by this server (its operator can allow "
                              "it with `kernelmgr mcp --allow-unsafe-session-options`)",
                              o->f.name, sv);
        json_object_set(req, o->f.name, v);
    }
    return NULL;
}

/* ---------------------------------------------------------------- code_exec */

typedef struct exec_ctx {
    mcp_call *call;
    char session[80];
    int interrupted;
    size_t streamed; /* bytes of output seen so far */
    char tail[200];  /* the last line of output, for progress messages */
    double last_progress;
} exec_ctx;

static void exec_event(void *ud, const json_t *ev)
{
    exec_ctx *x = ud;
    const char *type = json_string_value(json_object_get(ev, "event"));
    if (!type || strcmp(type, "stream") != 0)
        return;
    const char *text = json_string_value(json_object_get(ev, "text"));
    if (!text)
        return;
    size_t n = strlen(text);
    x->streamed += n;
    /* Keep the last non-empty line for the next progress message. */
    const char *end = text + n;
    while (end > text && (end[-1] == '\n' || end[-1] == '\r'))
        end--;
    const char *start = end;
    while (start > text && start[-1] != '\n')
        start--;
    if (end > start) {
        size_t len = (size_t)(end - start);
        if (len >= sizeof x->tail)
            len = sizeof x->tail - 1;
        memcpy(x->tail, start, len);
        x->tail[len] = '\0';
    }
}

static int exec_tick(void *ud, double elapsed)
{
    exec_ctx *x = ud;
    if (mcp_call_cancelled(x->call)) {
        if (!x->interrupted)
            mcp_log("code_exec in session %s cancelled: interrupting", x->session);
        x->interrupted = 1;
        return 1;
    }
    /* Ticks come every 250 ms so a cancel is acted on fast; progress goes
     * out once a second, which is enough to keep clients from timing out. */
    if (elapsed - x->last_progress < 1.0)
        return 0;
    x->last_progress = elapsed;
    char msg[320];
    if (x->tail[0])
        snprintf(msg, sizeof msg, "running for %.0f s; %zu bytes of output; last: %s", elapsed,
                 x->streamed, x->tail);
    else
        snprintf(msg, sizeof msg, "running for %.0f s", elapsed);
    mcp_call_progress(x->call, elapsed, msg);
    return 0;
}

static json_t *tool_code_exec(mcp_call *call, json_t *args)
{
    json_t *res = NULL;
    const char *code = json_string_value(json_object_get(args, "code"));
    if (!code)
        return tool_error("`code` (string) is required");
    const char *session = arg_session(args, DEFAULT_SESSION, &res);
    if (!session)
        return res;
    json_t *lang = json_object_get(args, "language");
    const char *l = "auto";
    if (lang) {
        l = json_string_value(lang);
        /* which languages exist is the daemon's to say (its configuration's
         * "kernels"): its error lists them */
        if (!l || !*l)
            return tool_error("`language` must be a string: \"python\", \"bash\", \"auto\" "
                              "or a language the server's configuration adds");
    }
    json_t *req = json_pack("{s:s,s:s,s:s}", "session", session, "code", code, "lang", l);
    json_t *t = json_object_get(args, "timeout_s");
    if (t) {
        if (!json_is_number(t) || json_number_value(t) <= 0 || json_number_value(t) > 86400) {
            json_decref(req);
            return tool_error("`timeout_s` must be a number of seconds in (0, 86400]");
        }
        json_object_set_new(req, "timeout", json_real(json_number_value(t)));
    }
    if ((res = copy_session_opts(call, args, req))) {
        json_decref(req);
        return res;
    }
    exec_ctx x;
    memset(&x, 0, sizeof x);
    x.call = call;
    snprintf(x.session, sizeof x.session, "%s", session);
    mcp_call_progress(call, 0, "started");
    km_err err = {0};
    json_t *reply = mcpd_request("exec", req, exec_event, exec_tick, &x, &err);
    if (!reply)
        return tool_error("code_exec failed: %s", err.msg);
    const char *wsp = json_string_value(json_object_get(reply, "workspace"));
    json_t *result = mcpr_exec_result(reply, session, wsp);
    json_decref(reply);
    return result ? result : tool_error("out of memory");
}

/* ---------------------------------------------------------------- files */

static json_t *tool_list_files(mcp_call *call, json_t *args)
{
    json_t *res = NULL;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    km_err err = {0};
    json_t *p = json_object_get(args, "path");
    if (p && !json_is_string(p))
        return tool_error("`path` must be a string");
    json_t *req = json_pack("{s:s}", "session", session);
    if (p)
        json_object_set(req, "path", p);
    json_t *listing = api("files.list", req, &err);
    if (!listing)
        return tool_error("%s", err.msg);
    const char *sub = json_string_value(json_object_get(listing, "path"));
    if (!sub)
        sub = ".";
    const char *ws = json_string_value(json_object_get(listing, "workspace"));
    json_t *all = json_object_get(listing, "files");
    int incomplete = json_is_true(json_object_get(listing, "incomplete"));
    json_t *files = json_array();
    size_t i, omitted = 0;
    json_t *fe;
    json_array_foreach(all, i, fe)
    {
        if (json_array_size(files) >= LIST_MAX) {
            omitted++;
            continue;
        }
        json_array_append(files, fe);
    }
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (f) {
        fprintf(f, "%zu file%s in the workspace of session %s%s%s:\n", json_array_size(files),
                json_array_size(files) == 1 ? "" : "s", session, strcmp(sub, ".") ? " under " : "",
                strcmp(sub, ".") ? sub : "");
        json_array_foreach(files, i, fe)
        {
            fprintf(f, "%s\t%lld\t%s%s\n", json_string_value(json_object_get(fe, "path")),
                    (long long)json_integer_value(json_object_get(fe, "size")),
                    json_string_value(json_object_get(fe, "mime")) ?: "",
                    json_is_string(json_object_get(fe, "type")) &&
                            strcmp(json_string_value(json_object_get(fe, "type")), "file")
                        ? " (not a regular file)"
                        : "");
        }
        /* the daemon's own omissions (files_omitted) and what it did not
         * walk (truncated.files.reason) count too, not only LIST_MAX */
        json_int_t d_omitted = json_integer_value(json_object_get(listing, "files_omitted"));
        const char *why = json_string_value(json_object_get(
            json_object_get(json_object_get(listing, "truncated"), "files"), "reason"));
        if (omitted || incomplete)
            fprintf(f, "(list incomplete: %lld more not shown%s%s)\n",
                    (long long)omitted + (d_omitted > 0 ? (long long)d_omitted : 0),
                    why ? "; " : "", why ? why : "");
        fclose(f);
    }
    json_t *obj =
        json_pack("{s:s,s:s,s:o,s:I,s:b}", "session", session, "workspace", ws ? ws : "", "files",
                  files, "omitted", (json_int_t)omitted, "incomplete", incomplete);
    json_decref(listing);
    json_t *r = mcpr_json_result(obj, text ? text : "", 0);
    free(text);
    return r;
}

static json_t *tool_read_file(mcp_call *call, json_t *args)
{
    json_t *res = NULL;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    const char *path = json_string_value(json_object_get(args, "path"));
    if (!path)
        return tool_error("`path` (string) is required");
    json_t *o = json_object_get(args, "offset"), *l = json_object_get(args, "length");
    if ((o && (!json_is_integer(o) || json_integer_value(o) < 0)) ||
        (l && (!json_is_integer(l) || json_integer_value(l) < 1)))
        return tool_error("`offset` must be an integer >= 0 and `length` an integer >= 1");
    json_t *e = json_object_get(args, "encoding");
    km_err err = {0};
    if (e && wsfile_encoding(json_string_value(e), WSFILE_ENC_READ, &err) < 0)
        return tool_error("`encoding` %s", err.msg);
    json_t *req = json_pack("{s:s,s:s}", "session", session, "path", path);
    if (o)
        json_object_set(req, "offset", o);
    if (l)
        json_object_set(req, "length", l);
    if (e)
        json_object_set(req, "encoding", e);
    json_t *r = api("files.read", req, &err);
    if (!r)
        return tool_error("read_file: %s", err.msg);
    int is_text = strcmp(json_string_value(json_object_get(r, "encoding")), "utf-8") == 0;
    json_t *content = json_object_get(r, "content");
    char head[400];
    snprintf(head, sizeof head, "%s: bytes %lld..%lld of %lld%s%s",
             json_string_value(json_object_get(r, "path")),
             (long long)json_integer_value(json_object_get(r, "offset")),
             (long long)(json_integer_value(json_object_get(r, "offset")) +
                         json_integer_value(json_object_get(r, "length"))),
             (long long)json_integer_value(json_object_get(r, "size")),
             json_is_true(json_object_get(r, "eof")) ? ""
                                                     : " (more: read again with a larger "
                                                       "offset)",
             is_text ? "" : "; binary, base64 below");
    json_t *result =
        json_pack("{s:[{s:s,s:s},{s:s,s:O}],s:O,s:b}", "content", "type", "text", "text", head,
                  "type", "text", "text", content, "structuredContent", r, "isError", 0);
    json_decref(r);
    return result;
}

static json_t *tool_write_file(mcp_call *call, json_t *args)
{
    json_t *res = NULL;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    const char *path = json_string_value(json_object_get(args, "path"));
    json_t *content = json_object_get(args, "content");
    if (!path || !json_is_string(content))
        return tool_error("`path` and `content` (strings) are required");
    const char *enc = json_string_value(json_object_get(args, "encoding"));
    km_err bad = {0};
    if (json_object_get(args, "encoding") && wsfile_encoding(enc, WSFILE_ENC_WRITE, &bad) < 0)
        return tool_error("`encoding` %s", bad.msg);
    json_t *app = json_object_get(args, "append");
    if (app && !json_is_boolean(app))
        return tool_error("`append` must be a boolean");
    /* the session is created when absent, with the options given */
    json_t *req =
        json_pack("{s:s,s:s,s:O,s:s,s:b,s:b}", "session", session, "path", path, "content", content,
                  "encoding", enc ? enc : "text", "append", json_is_true(app), "create", 1);
    if ((res = copy_session_opts(call, args, req))) {
        json_decref(req);
        return res;
    }
    km_err err = {0};
    json_t *r = api("files.write", req, &err);
    if (!r)
        return tool_error("write_file: %s", err.msg);
    char text[WSFILE_PATH_MAX + 200];
    snprintf(text, sizeof text, "%s %s (%lld bytes) in the workspace of session %s",
             json_is_true(json_object_get(r, "created")) ? "created" : "wrote",
             json_string_value(json_object_get(r, "path")),
             (long long)json_integer_value(json_object_get(r, "size")), session);
    return mcpr_json_result(r, text, 0);
}

/* ---------------------------------------------------------------- sessions */

static json_t *tool_list_sessions(mcp_call *call, json_t *args)
{
    km_err err = {0};
    json_t *reply = api("sessions.list", json_object(), &err);
    if (!reply)
        return tool_error("list_sessions failed: %s", err.msg);
    json_t *obj = json_pack("{s:O}", "sessions", json_object_get(reply, "sessions"));
    json_decref(reply);
    if (!obj)
        return tool_error("list_sessions failed: the daemon sent no session list");
    json_t *list;
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (f) {
        list = json_object_get(obj, "sessions");
        if (json_array_size(list) == 0)
            fputs("no sessions", f);
        size_t i;
        json_t *s;
        json_array_foreach(list, i, s)
        {
            fprintf(f, "%s%s: workspace %s", i ? "\n" : "",
                    json_string_value(json_object_get(s, "name")) ?: "?",
                    json_string_value(json_object_get(s, "workspace")) ?: "?");
            const char *k;
            json_t *kv;
            json_object_foreach(json_object_get(s, "kernels"), k, kv)
            {
                if (json_is_object(kv))
                    fprintf(f, "; %s %s", k,
                            json_string_value(json_object_get(kv, "state")) ?: "?");
            }
        }
        fclose(f);
    }
    json_t *r = mcpr_json_result(obj, text ? text : "", 0);
    free(text);
    return r;
}

static json_t *simple_session_op(json_t *args, const char *op, const char *done)
{
    json_t *res = NULL;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    km_err err = {0};
    /* close removes the session's packages too (the daemon's km_close) */
    json_t *reply = api(op, json_pack("{s:s}", "session", session), &err);
    if (!reply)
        return tool_error("%s %s: %s", op, session, err.msg);
    json_decref(reply);
    char text[200];
    snprintf(text, sizeof text, "session %s %s", session, done);
    return mcpr_json_result(json_pack("{s:s,s:b}", "session", session, "ok", 1), text, 0);
}

/* ---------------------------------------------------------------- packages */

static json_t *do_install(mcp_call *call, json_t *args)
{
    json_t *res = NULL;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    const char *mgr = json_string_value(json_object_get(args, "manager"));
    if (!mgr || (strcmp(mgr, "pip") && strcmp(mgr, "npm")))
        return tool_error("`manager` must be \"pip\" or \"npm\"");
    json_t *pk = json_object_get(args, "packages");
    if (!json_is_array(pk))
        return tool_error("`packages` must be a list of 1 to 50 package names");
    /* the operator's allowlist of this server was fixed on the connection
     * (mcpd_configure): the request never names a file */
    json_t *req = json_pack("{s:s,s:s,s:O}", "session", session, "manager", mgr, "packages", pk);
    mcp_call_progress(call, 0, "installing");
    km_err err = {0};
    json_t *r = api("packages.install", req, &err);
    if (!r)
        return tool_error("%s", err.msg);
    char *text = NULL;
    size_t tlen = 0, i;
    FILE *f = open_memstream(&text, &tlen);
    if (f) {
        fprintf(f, "installed for session %s (%s):", session, mgr);
        json_t *inst;
        json_array_foreach(json_object_get(r, "installed"), i, inst)
        {
            fprintf(f, "%s %s %s", i ? "," : "", json_string_value(json_object_get(inst, "name")),
                    json_string_value(json_object_get(inst, "version")) ?: "?");
        }
        fprintf(f, "\n%s",
                !strcmp(mgr, "pip") ? "import it in the session's Python kernel"
                                    : "use it from the session's Bash kernel (node "
                                      "finds it through NODE_PATH)");
        fclose(f);
    }
    json_t *result = mcpr_json_result(r, text ? text : "", 0);
    free(text);
    return result;
}

/* ---------------------------------------------------------------- the tools */

static json_t *tool_restart_session(mcp_call *call, json_t *args)
{
    return simple_session_op(args, "restart",
                             "restarted: variables and imports are cleared, files kept");
}

/* snapshot_session: the API's session.snapshot (or session.restore with
 * "restore": true); fork_session: session.fork. */
static json_t *tool_snapshot_session(mcp_call *call, json_t *args)
{
    json_t *res = NULL;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    const char *tag = json_string_value(json_object_get(args, "tag"));
    int restore = json_is_true(json_object_get(args, "restore"));
    json_t *req = json_pack("{s:s}", "session", session);
    if (tag)
        json_object_set_new(req, "tag", json_string(tag));
    km_err err = {0};
    json_t *r = api(restore ? "session.restore" : "session.snapshot", req, &err);
    if (!r)
        return tool_error("%s", err.msg);
    char text[600];
    if (restore) {
        snprintf(text, sizeof text,
                 "session %s restored from snapshot %s (variables and "
                 "workspace as they were then)",
                 session, json_string_value(json_object_get(r, "tag")));
    } else {
        size_t lost = 0;
        const char *k;
        json_t *kv;
        json_object_foreach(json_object_get(r, "kernels"), k, kv)
        {
            lost += json_array_size(json_object_get(kv, "lost"));
        }
        snprintf(text, sizeof text, "snapshot %s of session %s taken (%lld bytes)%s",
                 json_string_value(json_object_get(r, "tag")), session,
                 (long long)json_integer_value(json_object_get(r, "bytes")),
                 lost ? "; some names could not be saved (kernels.*.lost)" : "");
    }
    return mcpr_json_result(r, text, 0);
}

static json_t *tool_fork_session(mcp_call *call, json_t *args)
{
    json_t *res = NULL;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    const char *to = json_string_value(json_object_get(args, "new_session"));
    if (!to)
        return tool_error("`new_session` must be the name of the new session");
    const char *tag = json_string_value(json_object_get(args, "tag"));
    json_t *req = json_pack("{s:s s:s}", "session", session, "new_session", to);
    if (tag)
        json_object_set_new(req, "tag", json_string(tag));
    km_err err = {0};
    json_t *r = api("session.fork", req, &err);
    if (!r)
        return tool_error("%s", err.msg);
    char text[400];
    snprintf(text, sizeof text,
             "session %s is a copy of %s (variables and files); the two "
             "share nothing from now on",
             to, session);
    return mcpr_json_result(r, text, 0);
}

static json_t *tool_close_session(mcp_call *call, json_t *args)
{
    return simple_session_op(args, "close", "closed: kernels stopped, workspace removed");
}

/* The one list of tools: tools/list is built from it and tools/call looks
 * the name up in it. The options of a session a tool call may create are
 * not in these schemas: with session_options, mcpt_list adds them from the
 * daemon's table (dtier.h), those the mcp tier may set. */
const mcpt_tool mcpt_tools[] = {
    {
        .name = "code_exec",
        .title = "Run code",
        .description =
            "Run Python or Bash code in a persistent, sandboxed session and get back stdout, "
            "stderr, the value of the last expression, errors with tracebacks, plots (as "
            "images) and the files the code created or changed. State persists between calls "
            "with the same `session`: Python variables and imports, the shell's cwd, "
            "variables and functions, and the files in the workspace (the working directory "
            "of both kernels). Python and Bash of one session share the workspace, not "
            "variables. `code` may be plain code or Markdown with ```python / ```bash fenced "
            "blocks, which run in order (text outside fences is ignored). The sandbox has no "
            "network access. Long computations: set timeout_s; on timeout the code is "
            "interrupted (Python gets KeyboardInterrupt) and state is kept when possible. Use "
            "matplotlib normally: figures are returned as images.",
        .input_schema =
            "{\"type\":\"object\",\"properties\":{"
            "\"code\":{\"type\":\"string\",\"description\":\"The code to run, or Markdown with "
            "```python / ```bash blocks.\"},"
            "\"language\":{\"type\":\"string\",\"default\":"
            "\"auto\",\"description\":\"python or bash to run `code` as-is in that language; auto "
            "(default) runs Markdown fences by their language and guesses for unfenced code. The "
            "server's configuration may add languages (its error for an unknown one lists "
            "them).\"},"
            "\"session\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$\","
            "\"default\":\"default\",\"description\":\"Session name; reuse it to keep state. "
            "Created "
            "on first use.\"},"
            "\"timeout_s\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":86400,"
            "\"description\":\"Time limit of each block in seconds (default: the server's, usually "
            "60).\"}},"
            "\"required\":[\"code\"],\"additionalProperties\":false}",
        .annotations = "{\"title\":\"Run code\",\"readOnlyHint\":false,\"destructiveHint\":false,"
                       "\"idempotentHint\":false,\"openWorldHint\":false}",
        .session_options = 1,
        .handler = tool_code_exec,
    },
    {
        .name = "list_files",
        .title = "List workspace files",
        .description =
            "List the files in a session's workspace (the kernels' working directory), with "
            "size and type. Optionally only below a sub-directory.",
        .input_schema = "{\"type\":\"object\",\"properties\":{"
                        "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"},"
                        "\"path\":{\"type\":\"string\",\"description\":\"Sub-directory relative to "
                        "the workspace (default: all).\"}},\"required\":[\"session\"],"
                        "\"additionalProperties\":false}",
        .annotations = "{\"readOnlyHint\":true,\"openWorldHint\":false}",
        .handler = tool_list_files,
    },
    {
        .name = "read_file",
        .title = "Read a workspace file",
        .description =
            "Read a file from a session's workspace. Text comes back as text; binary files as "
            "base64 (encoding tells which). Large files: read in pieces with offset and "
            "length (bytes, at most 1 MiB per call); `eof` says whether the end was reached. "
            "Paths are relative to the workspace; '..' and symbolic links are refused.",
        .input_schema =
            "{\"type\":\"object\",\"properties\":{"
            "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"},"
            "\"path\":{\"type\":\"string\",\"description\":\"File path relative to the "
            "workspace.\"},"
            "\"offset\":{\"type\":\"integer\",\"minimum\":0,\"default\":0,\"description\":\"Byte "
            "offset to start at.\"},"
            "\"length\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":1048576,\"description\":"
            "\"Bytes to read (default and maximum 1 MiB).\"},"
            "\"encoding\":{\"type\":\"string\",\"enum\":" WSFILE_ENC_READ_JSON ",\"default\":"
            "\"auto\",\"description\":\"auto: text when the bytes are UTF-8, else base64.\"}},"
            "\"required\":[\"session\",\"path\"],\"additionalProperties\":false}",
        .annotations = "{\"readOnlyHint\":true,\"openWorldHint\":false}",
        .handler = tool_read_file,
    },
    {
        .name = "write_file",
        .title = "Write a workspace file",
        .description =
            "Create or overwrite a file in a session's workspace (missing directories are "
            "created), e.g. to give the code a data file. Content is text, or base64 for "
            "binary data. Paths are relative to the workspace; '..' and symbolic links are "
            "refused. Creates the session when it does not exist.",
        .input_schema =
            "{\"type\":\"object\",\"properties\":{"
            "\"session\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$\","
            "\"description\":\"Session name.\"},"
            "\"path\":{\"type\":\"string\",\"description\":\"File path relative to the "
            "workspace.\"},"
            "\"content\":{\"type\":\"string\",\"description\":\"The file's content.\"},"
            "\"encoding\":{\"type\":\"string\",\"enum\":" WSFILE_ENC_WRITE_JSON
            ",\"default\":\"text\"}"
            ","
            "\"append\":{\"type\":\"boolean\",\"default\":false,\"description\":\"Append instead "
            "of "
            "overwriting.\"}},"
            "\"required\":[\"session\",\"path\",\"content\"],\"additionalProperties\":false}",
        .annotations = "{\"readOnlyHint\":false,\"destructiveHint\":true,\"openWorldHint\":false}",
        .session_options = 1,
        .handler = tool_write_file,
    },
    {
        .name = "list_sessions",
        .title = "List sessions",
        .description = "List the live sessions with their workspace and kernels.",
        .input_schema = "{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false}",
        .annotations = "{\"readOnlyHint\":true,\"openWorldHint\":false}",
        .handler = tool_list_sessions,
    },
    {
        .name = "restart_session",
        .title = "Restart a session",
        .description =
            "Restart a session's kernels: variables, imports and shell state are cleared; "
            "workspace files are kept. Use it when a kernel is stuck or its state is broken.",
        .input_schema = "{\"type\":\"object\",\"properties\":{"
                        "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"}},"
                        "\"required\":[\"session\"],\"additionalProperties\":false}",
        .annotations = "{\"destructiveHint\":true,\"idempotentHint\":true,\"openWorldHint\":false}",
        .handler = tool_restart_session,
    },
    {
        .name = "snapshot_session",
        .title = "Snapshot or restore a session",
        .description =
            "Save a session's state (Python variables, imports, Bash variables and functions, "
            "the workspace files) as a snapshot, or with restore: true bring a snapshot back. "
            "Names that cannot be saved (open sockets, generators, threads) are listed. Use it "
            "before a risky step to be able to go back.",
        .input_schema =
            "{\"type\":\"object\",\"properties\":{"
            "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"},"
            "\"tag\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$\","
            "\"description\":\"The snapshot's name (default: a new one by the time; "
            "for restore: the newest).\"},"
            "\"restore\":{\"type\":\"boolean\",\"default\":false,\"description\":"
            "\"Restore the snapshot instead of taking one.\"}},"
            "\"required\":[\"session\"],\"additionalProperties\":false}",
        .annotations =
            "{\"destructiveHint\":false,\"idempotentHint\":false,\"openWorldHint\":false}",
        .handler = tool_snapshot_session,
    },
    {
        .name = "fork_session",
        .title = "Fork a session",
        .description =
            "Make a new session that is a copy of another: its variables and its workspace "
            "files. Afterwards the two are independent: try a risky step in the fork and keep "
            "whichever worked.",
        .input_schema =
            "{\"type\":\"object\",\"properties\":{"
            "\"session\":{\"type\":\"string\",\"description\":\"The session to copy.\"},"
            "\"new_session\":{\"type\":\"string\",\"pattern\":"
            "\"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$\",\"description\":\"The new session's "
            "name (must not exist).\"},"
            "\"tag\":{\"type\":\"string\",\"description\":\"Fork from this snapshot "
            "of the session instead of its current state.\"}},"
            "\"required\":[\"session\",\"new_session\"],\"additionalProperties\":false}",
        .annotations =
            "{\"destructiveHint\":false,\"idempotentHint\":false,\"openWorldHint\":false}",
        .handler = tool_fork_session,
    },
    {
        .name = "close_session",
        .title = "Close a session",
        .description =
            "Close a session: its kernels stop and its workspace is deleted. The name can be "
            "used again afterwards for a fresh session.",
        .input_schema = "{\"type\":\"object\",\"properties\":{"
                        "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"}},"
                        "\"required\":[\"session\"],\"additionalProperties\":false}",
        .annotations = "{\"destructiveHint\":true,\"idempotentHint\":true,\"openWorldHint\":false}",
        .handler = tool_close_session,
    },
    {
        .name = "install_packages",
        .title = "Install packages",
        .description =
            "Install Python (pip) or Node (npm) packages for a session, only from the "
            "operator's allowlist (names, optionally with a version: \"pkg\", \"pkg==1.2\" "
            "for pip, \"pkg@1.2.0\" for npm). URLs, paths, VCS links and options are refused. "
            "Python packages become importable in the session's Python kernel right away; npm "
            "packages are usable from Bash (node with NODE_PATH, their commands on PATH). "
            "Dependencies are installed only when they are on the allowlist too; otherwise "
            "the install is refused and names them.",
        .input_schema =
            "{\"type\":\"object\",\"properties\":{"
            "\"session\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$\","
            "\"description\":\"Session name.\"},"
            "\"manager\":{\"type\":\"string\",\"enum\":[\"pip\",\"npm\"]},"
            "\"packages\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,"
            "\"maxItems\":50}},"
            "\"required\":[\"session\",\"manager\",\"packages\"],\"additionalProperties\":false}",
        .annotations = "{\"destructiveHint\":false,\"idempotentHint\":true,\"openWorldHint\":true}",
        .handler = do_install,
    },
    {.name = NULL},
};

const mcpt_tool *mcpt_find(const char *name)
{
    for (const mcpt_tool *t = mcpt_tools; name && t->name; t++)
        if (strcmp(t->name, name) == 0)
            return t;
    return NULL;
}

/* new: the JSON schema of a session option (a row of the daemon's table). */
static json_t *sessopt_schema(const dtier_sessopt *o)
{
    json_t *p = NULL;
    switch (o->type) {
    case DT_SO_CHOICE:
        p = json_pack("{s:s s:[]}", "type", "string", "enum");
        for (int i = 0; p && o->values[i]; i++)
            json_array_append_new(json_object_get(p, "enum"), json_string(o->values[i]));
        break;
    case DT_SO_NETWORK:
        p = json_pack("{s:[{s:s s:[s,s]},{s:s s:{s:{s:s s:{s:s} s:i s:i}} s:[s] s:b}]}", "oneOf",
                      "type", "string", "enum", "on", "off", "type", "object", "properties",
                      "allow", "type", "array", "items", "type", "string", "minItems", 1,
                      "maxItems", EGPOLICY_MAX_ENTRIES, "required", "allow", "additionalProperties",
                      0);
        break;
    case DT_SO_SIZE:
        p = json_pack("{s:[s,s]}", "type", "string", "integer");
        break;
    case DT_SO_NUMBER:
        p = json_pack("{s:s s:f s:f}", "type", "number", "minimum", o->min, "maximum", o->max);
        break;
    case DT_SO_ENV:
        p = json_pack("{s:s s:{s:s} s:i}", "type", "object", "additionalProperties", "type",
                      "string", "maxProperties", 64);
        break;
    case DT_SO_PATH:
        p = json_pack("{s:s}", "type", "string");
        break;
    case DT_SO_BOOL:
        p = json_pack("{s:s}", "type", "boolean");
        break;
    }
    char d[600];
    snprintf(d, sizeof d, "%s%s%s%s Applied when this call creates the session.", o->help,
             o->relaxing ? " \"" : "", o->relaxing ? o->relaxing : "",
             o->relaxing ? "\" only when the server allows it." : "");
    if (p)
        json_object_set_new(p, "description", json_string(d));
    return p;
}

json_t *mcpt_list(void)
{
    json_t *tools = json_array();
    for (const mcpt_tool *t = mcpt_tools; tools && t->name; t++) {
        json_error_t jerr;
        json_t *schema = json_loads(t->input_schema, 0, &jerr);
        json_t *ann = json_loads(t->annotations, 0, &jerr);
        if (!schema || !ann) {
            mcp_log("BUG: the schema of tool %s does not parse: %s at %d", t->name, jerr.text,
                    jerr.position);
            json_decref(schema);
            json_decref(ann);
            continue;
        }
        json_t *props = json_object_get(schema, "properties");
        for (const dtier_sessopt *o = dtier_sessopts; t->session_options && o->f.name; o++)
            if (o->f.tiers & DT_M)
                json_object_set_new(props, o->f.name, sessopt_schema(o));
        json_array_append_new(tools, json_pack("{s:s,s:s,s:s,s:o,s:o}", "name", t->name, "title",
                                               t->title, "description", t->description,
                                               "inputSchema", schema, "annotations", ann));
    }
    return tools;
}

json_t *mcpt_call(mcp_call *call, const char *name, json_t *args, int *rpc_code, char *msg,
                  size_t msglen)
{
    const mcpt_tool *t = mcpt_find(name);
    if (t) {
        json_t *res = check_keys(t, args);
        return res ? res : t->handler(call, args);
    }
    *rpc_code = -32602;
    snprintf(msg, msglen, "Unknown tool: %.100s", name);
    return NULL;
}
