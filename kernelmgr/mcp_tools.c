/*
 * mcp_tools.c — the tools of `kernelmgr mcp`: schemas, descriptions and
 * handlers. Every session operation is a daemon request (mcp_daemon.h); file
 * tools resolve the session's workspace through the daemon and then access
 * it directly, confined by wsfile.c; installs go through allowlist.c and
 * pkginstall.c.
 */
#include "kernelmgr/mcp_tools.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernelmgr/allowlist.h"
#include "kernelmgr/config.h"
#include "kernelmgr/fsdiff.h"
#include "kernelmgr/mcp_daemon.h"
#include "kernelmgr/mcp_render.h"
#include "kernelmgr/pkginstall.h"
#include "kernelmgr/wsfile.h"
#include "kernels/server/kenv.h"

#define DEFAULT_SESSION "default"
#define LIST_MAX 2000

/* ---------------------------------------------------------------- schemas */

static const char *const tools_json =
    "["
    "{\"name\":\"code_exec\","
    "\"title\":\"Run code\","
    "\"description\":\"Run Python or Bash code in a persistent, sandboxed session and get back "
    "stdout, stderr, the value of the last expression, errors with tracebacks, plots (as "
    "images) and the files the code created or changed. State persists between calls with the "
    "same `session`: Python variables and imports, the shell's cwd, variables and functions, and "
    "the files in the workspace (the working directory of both kernels). Python and Bash of "
    "one session share the workspace, not variables. `code` may be plain code or Markdown with "
    "```python / ```bash fenced blocks, which run in order (text outside fences is ignored). "
    "The sandbox has no network access. Long computations: set timeout_s; on timeout the code "
    "is interrupted (Python gets KeyboardInterrupt) and state is kept when possible. Use "
    "matplotlib normally: figures are returned as images.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"code\":{\"type\":\"string\",\"description\":\"The code to run, or Markdown with "
    "```python / ```bash blocks.\"},"
    "\"language\":{\"type\":\"string\",\"enum\":[\"python\",\"bash\",\"auto\"],\"default\":"
    "\"auto\",\"description\":\"python or bash to run `code` as-is in that language; auto "
    "(default) runs Markdown fences by their language and guesses for unfenced code.\"},"
    "\"session\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$\","
    "\"default\":\"default\",\"description\":\"Session name; reuse it to keep state. Created on "
    "first use.\"},"
    "\"timeout_s\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":86400,"
    "\"description\":\"Time limit of each block in seconds (default: the server's, usually "
    "60).\"},"
    "\"env\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"},"
    "\"maxProperties\":64,\"description\":\"Environment variables for the code, "
    "{NAME: value}; applied when this call creates the session (a session keeps the variables "
    "it was created with). The code sees no other variable of the server's but LANG, LC_*, "
    "TERM and TZ.\"}},"
    "\"required\":[\"code\"],\"additionalProperties\":false},"
    "\"annotations\":{\"title\":\"Run code\",\"readOnlyHint\":false,\"destructiveHint\":false,"
    "\"idempotentHint\":false,\"openWorldHint\":false}},"

    "{\"name\":\"list_files\",\"title\":\"List workspace files\","
    "\"description\":\"List the files in a session's workspace (the kernels' working "
    "directory), with size and type. Optionally only below a sub-directory.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"},"
    "\"path\":{\"type\":\"string\",\"description\":\"Sub-directory relative to the workspace "
    "(default: all).\"}},\"required\":[\"session\"],\"additionalProperties\":false},"
    "\"annotations\":{\"readOnlyHint\":true,\"openWorldHint\":false}},"

    "{\"name\":\"read_file\",\"title\":\"Read a workspace file\","
    "\"description\":\"Read a file from a session's workspace. Text comes back as text; binary "
    "files as base64 (encoding tells which). Large files: read in pieces with offset and "
    "length (bytes, at most 1 MiB per call); `eof` says whether the end was reached. Paths are "
    "relative to the workspace; '..' and symbolic links are refused.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"},"
    "\"path\":{\"type\":\"string\",\"description\":\"File path relative to the workspace.\"},"
    "\"offset\":{\"type\":\"integer\",\"minimum\":0,\"default\":0,\"description\":\"Byte "
    "offset to start at.\"},"
    "\"length\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":1048576,\"description\":\"Bytes "
    "to read (default and maximum 1 MiB).\"},"
    "\"encoding\":{\"type\":\"string\",\"enum\":[\"auto\",\"text\",\"base64\"],\"default\":"
    "\"auto\",\"description\":\"auto: text when the bytes are UTF-8, else base64.\"}},"
    "\"required\":[\"session\",\"path\"],\"additionalProperties\":false},"
    "\"annotations\":{\"readOnlyHint\":true,\"openWorldHint\":false}},"

    "{\"name\":\"write_file\",\"title\":\"Write a workspace file\","
    "\"description\":\"Create or overwrite a file in a session's workspace (missing "
    "directories are created), e.g. to give the code a data file. Content is text, or base64 "
    "for binary data. Paths are relative to the workspace; '..' and symbolic links are "
    "refused. Creates the session when it does not exist.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"session\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$\","
    "\"description\":\"Session name.\"},"
    "\"path\":{\"type\":\"string\",\"description\":\"File path relative to the workspace.\"},"
    "\"content\":{\"type\":\"string\",\"description\":\"The file's content.\"},"
    "\"encoding\":{\"type\":\"string\",\"enum\":[\"text\",\"base64\"],\"default\":\"text\"},"
    "\"append\":{\"type\":\"boolean\",\"default\":false,\"description\":\"Append instead of "
    "overwriting.\"}},"
    "\"required\":[\"session\",\"path\",\"content\"],\"additionalProperties\":false},"
    "\"annotations\":{\"readOnlyHint\":false,\"destructiveHint\":true,\"openWorldHint\":false}},"

    "{\"name\":\"list_sessions\",\"title\":\"List sessions\","
    "\"description\":\"List the live sessions with their workspace and kernels.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{},\"additionalProperties\":false},"
    "\"annotations\":{\"readOnlyHint\":true,\"openWorldHint\":false}},"

    "{\"name\":\"restart_session\",\"title\":\"Restart a session\","
    "\"description\":\"Restart a session's kernels: variables, imports and shell state are "
    "cleared; workspace files are kept. Use it when a kernel is stuck or its state is "
    "broken.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"}},"
    "\"required\":[\"session\"],\"additionalProperties\":false},"
    "\"annotations\":{\"destructiveHint\":true,\"idempotentHint\":true,\"openWorldHint\":false}},"

    "{\"name\":\"close_session\",\"title\":\"Close a session\","
    "\"description\":\"Close a session: its kernels stop and its workspace is deleted. The "
    "name can be used again afterwards for a fresh session.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"session\":{\"type\":\"string\",\"description\":\"Session name.\"}},"
    "\"required\":[\"session\"],\"additionalProperties\":false},"
    "\"annotations\":{\"destructiveHint\":true,\"idempotentHint\":true,\"openWorldHint\":false}},"

    "{\"name\":\"install_packages\",\"title\":\"Install packages\","
    "\"description\":\"Install Python (pip) or Node (npm) packages for a session, only from the "
    "operator's allowlist (names, optionally with a version: \\\"pkg\\\", \\\"pkg==1.2\\\" for "
    "pip, \\\"pkg@1.2.0\\\" for npm). URLs, paths, VCS links and options are refused. Python "
    "packages become importable in the session's Python kernel right away; npm packages are "
    "usable from Bash (node with NODE_PATH, their commands on PATH). Dependencies are installed "
    "only when they are on the allowlist too; otherwise the install is refused and names "
    "them.\","
    "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"session\":{\"type\":\"string\",\"pattern\":\"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}$\","
    "\"description\":\"Session name.\"},"
    "\"manager\":{\"type\":\"string\",\"enum\":[\"pip\",\"npm\"]},"
    "\"packages\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"minItems\":1,"
    "\"maxItems\":50}},"
    "\"required\":[\"session\",\"manager\",\"packages\"],\"additionalProperties\":false},"
    "\"annotations\":{\"destructiveHint\":false,\"idempotentHint\":true,\"openWorldHint\":true}}"
    "]";

json_t *mcpt_list(void)
{
    json_error_t jerr;
    json_t *tools = json_loads(tools_json, 0, &jerr);
    if (!tools)
        mcp_log("BUG: tool schemas do not parse: %s at %d", jerr.text, jerr.position);
    return tools ? tools : json_array();
}

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

/* Refuses unknown argument names: a typo ("timeout" for "timeout_s") must
 * not be silently ignored. */
static json_t *check_keys(json_t *args, const char *const *allowed)
{
    const char *key;
    json_t *v;
    json_object_foreach(args, key, v)
    {
        int ok = 0;
        for (int i = 0; allowed[i]; i++)
            ok |= strcmp(key, allowed[i]) == 0;
        if (!ok) {
            char list[300] = "";
            for (int i = 0; allowed[i]; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, allowed[i], sizeof list - strlen(list) - 1);
            }
            return tool_error("unknown argument '%.60s' (expected: %s)", key, list);
        }
    }
    return NULL;
}

/* new: the daemon's list of sessions (its reply's "sessions", or the reply
 * itself when it is not wrapped), or NULL with err. */
static json_t *daemon_sessions(char *err, size_t errlen)
{
    json_t *reply =
        mcpd_request(json_pack("{s:s}", "op", "sessions"), NULL, NULL, NULL, err, errlen);
    if (!reply)
        return NULL;
    json_t *list = json_object_get(reply, "sessions");
    if (!json_is_array(list))
        return reply;
    json_incref(list);
    json_decref(reply);
    return list;
}

/* new: the daemon's session entry for name, or NULL (absent or error). */
static json_t *find_session(const char *name, char *err, size_t errlen)
{
    json_t *list = daemon_sessions(err, errlen);
    if (!list)
        return NULL;
    size_t i;
    json_t *s;
    json_array_foreach(list, i, s)
    {
        if (json_is_string(json_object_get(s, "name")) &&
            strcmp(json_string_value(json_object_get(s, "name")), name) == 0) {
            json_incref(s);
            json_decref(list);
            return s;
        }
    }
    json_decref(list);
    snprintf(err, errlen,
             "no session named '%s' (sessions are created by code_exec or "
             "write_file)",
             name);
    return NULL;
}

/* Writes the session's workspace path; creates the session when create.
 * 0, or -1 with err. */
static int session_workspace(const char *name, int create, char *ws, size_t wslen, char *err,
                             size_t errlen)
{
    json_t *s = find_session(name, err, errlen);
    if (!s && create) {
        /* The manager creates a session on its first execution. */
        json_t *r = mcpd_request(json_pack("{s:s,s:s,s:s,s:s}", "op", "exec", "session", name,
                                           "lang", "bash", "code", ":"),
                                 NULL, NULL, NULL, err, errlen);
        if (!r)
            return -1;
        json_decref(r);
        s = find_session(name, err, errlen);
    }
    if (!s)
        return -1;
    const char *w = json_string_value(json_object_get(s, "workspace"));
    if (!w) {
        snprintf(err, errlen, "the daemon did not say where session '%s' keeps its workspace",
                 name);
        json_decref(s);
        return -1;
    }
    snprintf(ws, wslen, "%s", w);
    json_decref(s);
    return 0;
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
    static const char *const keys[] = {"code", "language", "session", "timeout_s", "env", NULL};
    json_t *res = check_keys(args, keys);
    if (res)
        return res;
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
        if (!l || (strcmp(l, "python") && strcmp(l, "bash") && strcmp(l, "auto")))
            return tool_error("`language` must be \"python\", \"bash\" or \"auto\"");
    }
    json_t *req =
        json_pack("{s:s,s:s,s:s,s:s}", "op", "exec", "session", session, "code", code, "lang", l);
    json_t *t = json_object_get(args, "timeout_s");
    if (t) {
        if (!json_is_number(t) || json_number_value(t) <= 0 || json_number_value(t) > 86400) {
            json_decref(req);
            return tool_error("`timeout_s` must be a number of seconds in (0, 86400]");
        }
        json_object_set_new(req, "timeout", json_real(json_number_value(t)));
    }
    json_t *env = json_object_get(args, "env");
    if (env) {
        char why[512];
        if (kenv_check_object(NULL, "`env`", env, why, sizeof why)) {
            json_decref(req);
            return tool_error("%s", why);
        }
        json_object_set(req, "env", env);
    }
    exec_ctx x;
    memset(&x, 0, sizeof x);
    x.call = call;
    snprintf(x.session, sizeof x.session, "%s", session);
    mcp_call_progress(call, 0, "started");
    char err[1024] = "";
    json_t *reply = mcpd_request(req, exec_event, exec_tick, &x, err, sizeof err);
    if (!reply)
        return tool_error("code_exec failed: %s", err);
    char ws[PATH_MAX] = "";
    const char *wsp = json_string_value(json_object_get(reply, "workspace"));
    if (!wsp) {
        /* a daemon that does not name the workspace in its exec reply (one
         * started by an older kernelmgr): ask for the sessions */
        json_t *sess = find_session(session, err, sizeof err);
        if (sess && json_string_value(json_object_get(sess, "workspace"))) {
            snprintf(ws, sizeof ws, "%s", json_string_value(json_object_get(sess, "workspace")));
            wsp = ws;
        }
        json_decref(sess);
    }
    json_t *result = mcpr_exec_result(reply, session, wsp);
    json_decref(reply);
    return result ? result : tool_error("out of memory");
}

/* ---------------------------------------------------------------- files */

static json_t *tool_list_files(json_t *args)
{
    static const char *const keys[] = {"session", "path", NULL};
    json_t *res = check_keys(args, keys);
    if (res)
        return res;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    char sub[WSFILE_PATH_MAX + 1], err[1024];
    json_t *p = json_object_get(args, "path");
    if (p && !json_is_string(p))
        return tool_error("`path` must be a string");
    if (wsfile_normalize(p ? json_string_value(p) : "", 1, sub, err, sizeof err) < 0)
        return tool_error("%s", err);
    char ws[PATH_MAX];
    if (session_workspace(session, 0, ws, sizeof ws, err, sizeof err) < 0)
        return tool_error("%s", err);
    /* The walk goes through directory fds and never follows a symlink
     * (fsdiff, wsfile.h), so listing the whole workspace and filtering by
     * prefix cannot leave it. */
    fsdiff_snap *snap = fsdiff_take(ws, 50000);
    if (!snap)
        return tool_error("out of memory");
    json_t *all = fsdiff_list(snap, 50000);
    int incomplete = fsdiff_incomplete(snap);
    fsdiff_destroy(&snap);
    json_t *files = json_array();
    size_t i, omitted = 0, plen = strlen(sub);
    json_t *fe;
    json_array_foreach(all, i, fe)
    {
        const char *path = json_string_value(json_object_get(fe, "path"));
        if (!path)
            continue;
        if (strcmp(sub, ".") != 0 && !(strncmp(path, sub, plen) == 0 && path[plen] == '/'))
            continue;
        if (json_array_size(files) >= LIST_MAX) {
            omitted++;
            continue;
        }
        json_array_append(files, fe);
    }
    json_decref(all);
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
        if (omitted || incomplete)
            fprintf(f, "(list incomplete: %zu more not shown)\n", omitted);
        fclose(f);
    }
    json_t *obj = json_pack("{s:s,s:s,s:o,s:I,s:b}", "session", session, "workspace", ws, "files",
                            files, "omitted", (json_int_t)omitted, "incomplete", incomplete);
    json_t *r = mcpr_json_result(obj, text ? text : "", 0);
    free(text);
    return r;
}

static json_t *tool_read_file(json_t *args)
{
    static const char *const keys[] = {"session", "path", "offset", "length", "encoding", NULL};
    json_t *res = check_keys(args, keys);
    if (res)
        return res;
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
    if (e && !json_is_string(e))
        return tool_error("`encoding` must be \"auto\", \"text\" or \"base64\"");
    char ws[PATH_MAX], err[1024];
    if (session_workspace(session, 0, ws, sizeof ws, err, sizeof err) < 0)
        return tool_error("%s", err);
    json_t *r = wsfile_read(ws, path, o ? (uint64_t)json_integer_value(o) : 0,
                            l ? (uint64_t)json_integer_value(l) : 0,
                            e ? json_string_value(e) : "auto", err, sizeof err);
    if (!r)
        return tool_error("read_file: %s", err);
    json_object_set_new(r, "session", json_string(session));
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

static json_t *tool_write_file(json_t *args)
{
    static const char *const keys[] = {"session", "path", "content", "encoding", "append", NULL};
    json_t *res = check_keys(args, keys);
    if (res)
        return res;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    const char *path = json_string_value(json_object_get(args, "path"));
    json_t *content = json_object_get(args, "content");
    if (!path || !json_is_string(content))
        return tool_error("`path` and `content` (strings) are required");
    const char *enc = json_string_value(json_object_get(args, "encoding"));
    if (json_object_get(args, "encoding") &&
        (!enc || (strcmp(enc, "text") && strcmp(enc, "base64"))))
        return tool_error("`encoding` must be \"text\" or \"base64\"");
    json_t *app = json_object_get(args, "append");
    if (app && !json_is_boolean(app))
        return tool_error("`append` must be a boolean");
    char norm[WSFILE_PATH_MAX + 1], err[1024];
    /* Refuse a bad path before creating a session for it. */
    if (wsfile_normalize(path, 0, norm, err, sizeof err) < 0)
        return tool_error("write_file: %s", err);
    const char *data = json_string_value(content);
    size_t len = json_string_length(content);
    unsigned char *bin = NULL;
    if (enc && strcmp(enc, "base64") == 0) {
        bin = malloc(len / 4 * 3 + 3);
        size_t binlen = 0;
        if (!bin || sodium_base642bin(bin, len / 4 * 3 + 3, data, len, " \t\r\n", &binlen, NULL,
                                      sodium_base64_VARIANT_ORIGINAL) != 0) {
            free(bin);
            return tool_error("write_file: `content` is not valid base64");
        }
        data = (const char *)bin;
        len = binlen;
    }
    char ws[PATH_MAX];
    if (session_workspace(session, 1, ws, sizeof ws, err, sizeof err) < 0) {
        free(bin);
        return tool_error("%s", err);
    }
    json_t *r = wsfile_write(ws, path, data, len, json_is_true(app), 1, err, sizeof err);
    free(bin);
    if (!r)
        return tool_error("write_file: %s", err);
    json_object_set_new(r, "session", json_string(session));
    char text[WSFILE_PATH_MAX + 200];
    snprintf(text, sizeof text, "%s %s (%lld bytes) in the workspace of session %s",
             json_is_true(json_object_get(r, "created")) ? "created" : "wrote",
             json_string_value(json_object_get(r, "path")),
             (long long)json_integer_value(json_object_get(r, "size")), session);
    return mcpr_json_result(r, text, 0);
}

/* ---------------------------------------------------------------- sessions */

static json_t *tool_list_sessions(json_t *args)
{
    static const char *const keys[] = {NULL};
    json_t *res = check_keys(args, keys);
    if (res)
        return res;
    char err[1024];
    json_t *list = daemon_sessions(err, sizeof err);
    if (!list)
        return tool_error("list_sessions failed: %s", err);
    json_t *obj = json_pack("{s:o}", "sessions", list);
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
    static const char *const keys[] = {"session", NULL};
    json_t *res = check_keys(args, keys);
    if (res)
        return res;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    char err[1024];
    json_t *reply = mcpd_request(json_pack("{s:s,s:s}", "op", op, "session", session), NULL, NULL,
                                 NULL, err, sizeof err);
    if (!reply)
        return tool_error("%s %s: %s", op, session, err);
    json_decref(reply);
    if (strcmp(op, "close") == 0) {
        char home[PATH_MAX];
        char why[512];
        if (pkginst_remove_session(kmcfg_home(home, sizeof home), session, why, sizeof why) < 0)
            mcp_log("close %s: cannot remove its packages: %s", session, why);
    }
    char text[200];
    snprintf(text, sizeof text, "session %s %s", session, done);
    return mcpr_json_result(json_pack("{s:s,s:b}", "session", session, "ok", 1), text, 0);
}

/* ---------------------------------------------------------------- packages */

static json_t *tool_install(json_t *args)
{
    static const char *const keys[] = {"session", "manager", "packages", NULL};
    json_t *res = check_keys(args, keys);
    if (res)
        return res;
    const char *session = arg_session(args, NULL, &res);
    if (!session)
        return res;
    int m = allowlist_mgr_from_name(json_string_value(json_object_get(args, "manager")));
    if (m < 0)
        return tool_error("`manager` must be \"pip\" or \"npm\"");
    json_t *pk = json_object_get(args, "packages");
    if (!json_is_array(pk) || json_array_size(pk) == 0 || json_array_size(pk) > 50)
        return tool_error("`packages` must be a list of 1 to 50 package names");
    size_t i;
    json_t *p;
    json_array_foreach(pk, i, p)
    {
        if (!json_is_string(p))
            return tool_error("`packages` must contain strings only");
    }
    return NULL; /* the caller goes on with the allowlist (needs the server) */
}

/* ---------------------------------------------------------------- dispatch */

static json_t *do_install(mcp_call *call, json_t *args)
{
    json_t *res = tool_install(args);
    if (res)
        return res;
    const char *session = json_string_value(json_object_get(args, "session"));
    allowlist_mgr m =
        (allowlist_mgr)allowlist_mgr_from_name(json_string_value(json_object_get(args, "manager")));
    char home[PATH_MAX], path[PATH_MAX + 32], err[1024];
    kmcfg_home(home, sizeof home);
    const mcp_options *o = mcp_server_options(call->srv);
    const char *env = getenv("KERNELMGR_ALLOWLIST");
    if (o->allowlist_path)
        snprintf(path, sizeof path, "%s", o->allowlist_path);
    else if (env && *env)
        snprintf(path, sizeof path, "%s", env);
    else
        snprintf(path, sizeof path, "%s/allowlist.json", home);
    /* Read on every call: the operator may edit the list while agents run. */
    allowlist *al = allowlist_load(path, 0, err, sizeof err);
    if (!al)
        return tool_error("the package allowlist cannot be read, so nothing is installable: %s",
                          err);
    json_t *pk = json_object_get(args, "packages");
    /* Every request is checked before anything runs. */
    size_t i;
    json_t *p;
    char name[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1];
    json_array_foreach(pk, i, p)
    {
        if (allowlist_check(al, m, json_string_value(p), name, spec, err, sizeof err) < 0) {
            allowlist_destroy(&al);
            return tool_error("install refused, nothing was installed: %s", err);
        }
    }
    mcp_call_progress(call, 0, "installing");
    json_t *r = pkginst_install(al, m, home, session, pk, err, sizeof err);
    allowlist_destroy(&al);
    if (!r)
        return tool_error("install failed, nothing was installed: %s", err);
    char *text = NULL;
    size_t tlen = 0;
    FILE *f = open_memstream(&text, &tlen);
    if (f) {
        fprintf(f, "installed for session %s (%s):", session, allowlist_mgr_name(m));
        json_t *inst;
        json_array_foreach(json_object_get(r, "installed"), i, inst)
        {
            fprintf(f, "%s %s %s", i ? "," : "", json_string_value(json_object_get(inst, "name")),
                    json_string_value(json_object_get(inst, "version")) ?: "?");
        }
        fprintf(f, "\n%s",
                m == ALLOWLIST_PIP ? "import it in the session's Python kernel"
                                   : "use it from the session's Bash kernel (node "
                                     "finds it through NODE_PATH)");
        fclose(f);
    }
    json_object_set_new(r, "session", json_string(session));
    json_t *result = mcpr_json_result(r, text ? text : "", 0);
    free(text);
    return result;
}

json_t *mcpt_call(mcp_call *call, const char *name, json_t *args, int *rpc_code, char *msg,
                  size_t msglen)
{
    if (strcmp(name, "code_exec") == 0)
        return tool_code_exec(call, args);
    if (strcmp(name, "list_files") == 0)
        return tool_list_files(args);
    if (strcmp(name, "read_file") == 0)
        return tool_read_file(args);
    if (strcmp(name, "write_file") == 0)
        return tool_write_file(args);
    if (strcmp(name, "list_sessions") == 0)
        return tool_list_sessions(args);
    if (strcmp(name, "restart_session") == 0)
        return simple_session_op(args, "restart",
                                 "restarted: variables and imports are cleared, files kept");
    if (strcmp(name, "close_session") == 0)
        return simple_session_op(args, "close", "closed: kernels stopped, workspace removed");
    if (strcmp(name, "install_packages") == 0)
        return do_install(call, args);
    *rpc_code = -32602;
    snprintf(msg, msglen, "Unknown tool: %.100s", name);
    return NULL;
}
