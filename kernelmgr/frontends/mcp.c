/*
 * mcp.c — the MCP server core: JSON-RPC 2.0 over stdio, both protocol eras,
 * request dispatch, progress and cancellation. Tools live in mcp_tools.c;
 * the JSON-RPC framing and checks are rpc.c's, the same as the daemon API's.
 *
 * What we follow, and where it is written:
 *  - JSON-RPC 2.0 (jsonrpc.org/specification): error codes -32700 parse
 *    error (id null), -32600 invalid request, -32601 method not found,
 *    -32602 invalid params; notifications (no id) are never answered.
 *  - MCP stdio transport (spec 2025-11-25, basic/transports): messages are
 *    newline-delimited and MUST NOT contain embedded newlines; the server MAY
 *    log to stderr and MUST NOT write anything else to stdout. jansson's
 *    compact output escapes every newline inside strings, so one json_dumpf
 *    call is one line.
 *  - Legacy lifecycle (2025-11-25, basic/lifecycle "Version Negotiation"):
 *    if the server supports the protocolVersion the client requested it MUST
 *    answer with the same version, otherwise with another version it
 *    supports, which SHOULD be the latest. We answer a legacy client that
 *    asks for something unknown (2026-07-28 included: that revision has no
 *    initialize) with 2025-11-25, the newest handshake-era version.
 *  - Modern revision 2026-07-28 (basic/versioning, server/discover): there is
 *    no handshake; every request carries
 *    _meta["io.modelcontextprotocol/protocolVersion"] and
 *    _meta["io.modelcontextprotocol/clientCapabilities"]; a server MUST
 *    implement server/discover (supportedVersions, capabilities, serverInfo);
 *    every result carries resultType ("complete" here: we never need input
 *    from the client mid-request); a version the server does not implement
 *    gets UnsupportedProtocolVersionError, code -32022 in the 2026-07-28
 *    schema, with data {"supported": [...], "requested": "..."}. A request
 *    whose _meta names a protocol version is modern whatever came before on
 *    the connection ("a request carrying _meta protocolVersion is never
 *    legacy"), so one stdio process can serve both eras.
 *  - Cancellation (basic/utilities/cancellation): notifications/cancelled
 *    {requestId, reason}; the receiver SHOULD stop the work and SHOULD NOT
 *    answer the cancelled request. Unknown or finished ids are ignored.
 *  - Progress (basic/utilities/progress): when a request has
 *    _meta.progressToken the server MAY send notifications/progress
 *    {progressToken, progress, total?, message?}; progress MUST increase with
 *    each notification.
 */
#include "kernelmgr/frontends/mcp.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernelmgr/frontends/mcp_int.h"
#include "kernelmgr/frontends/mcp_tools.h"
#include "kernelmgr/frontends/mcp_daemon.h"
#include "kernelmgr/frontends/mcpinstall.h"
#include "kernelmgr/service/rpc.h"

#define MCP_SERVER_NAME "kernelmgr"
#define MCP_SERVER_VERSION "0.1.0"
#define MCP_MODERN_VERSION "2026-07-28"
#define MCP_LEGACY_LATEST "2025-11-25"
/* One line may carry a whole file for write_file (base64); beyond this we
 * answer -32600 instead of trying to parse it. */
#define MCP_MAX_LINE ((size_t)64 << 20)

#define META_VERSION "io.modelcontextprotocol/protocolVersion"
#define META_CAPS "io.modelcontextprotocol/clientCapabilities"

/* UnsupportedProtocolVersionError of the 2026-07-28 schema (the standard
 * codes are rpc.h's) */
#define RPC_UNSUPPORTED_VERSION (-32022)

static const char *const legacy_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                              "2024-11-05", NULL};

/* A tools/call in flight, linked into the server's list while its thread runs. */
typedef struct mcp_inflight {
    mcp_call call;
    json_t *request; /* owned: the whole request */
    char *tool;      /* owned */
    json_t *args;    /* borrowed from request */
    int delivered;   /* (atomic) its request reached the daemon (mcp_call_delivered) */
    struct mcp_inflight *next;
} mcp_inflight;

/* The call the current thread runs (call_thread), for mcp_call_delivered. */
static __thread mcp_inflight *thread_call;

struct mcp_server {
    pthread_mutex_t out_lock; /* one writer of stdout at a time */
    pthread_mutex_t lock;     /* guards inflight, n_threads */
    pthread_cond_t idle;      /* signalled when n_threads drops */
    mcp_inflight *inflight;
    int n_threads;
    int initialized; /* legacy handshake completed (informational) */
    char legacy_version[16];
    mcp_options opts;
};

void mcp_log(const char *fmt, ...)
{
    va_list ap;
    char buf[1024];
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kernelmgr mcp: %s\n", buf);
}

void mcp_send(mcp_server *srv, json_t *msg)
{
    if (!msg)
        return;
    size_t len;
    char *line = rpc_line(msg, &len);
    json_decref(msg);
    if (!line) {
        mcp_log("cannot serialise a message (out of memory?)");
        return;
    }
    pthread_mutex_lock(&srv->out_lock);
    fwrite(line, 1, len, stdout);
    fflush(stdout);
    pthread_mutex_unlock(&srv->out_lock);
    free(line);
}

const mcp_options *mcp_server_options(mcp_server *srv)
{
    return &srv->opts;
}

int mcp_call_cancelled(mcp_call *call)
{
    return __atomic_load_n(&call->cancelled, __ATOMIC_SEQ_CST);
}

void mcp_call_delivered(void)
{
    if (thread_call)
        __atomic_store_n(&thread_call->delivered, 1, __ATOMIC_SEQ_CST);
}

void mcp_call_progress(mcp_call *call, double progress, const char *message)
{
    if (!call->progress_token)
        return;
    if (progress <= call->progress)
        progress = call->progress + 0.001;
    call->progress = progress;
    json_t *params =
        json_pack("{s:O,s:f}", "progressToken", call->progress_token, "progress", progress);
    if (!params)
        return;
    if (message)
        json_object_set_new(params, "message", json_string(message));
    mcp_send(call->srv, rpc_notification("notifications/progress", params));
}

/* ---------------------------------------------------------------- replies */

static void send_error(mcp_server *srv, json_t *id, int code, const char *message, json_t *data)
{
    mcp_send(srv, rpc_error(id, code, message, data));
}

/* Steals result. Modern-era results carry resultType. */
static void send_result(mcp_server *srv, json_t *id, json_t *result, int modern)
{
    if (!result)
        result = json_object();
    if (modern && !json_object_get(result, "resultType"))
        json_object_set_new(result, "resultType", json_string("complete"));
    mcp_send(srv, rpc_result(id, result));
}

static json_t *supported_versions(void)
{
    json_t *a = json_array();
    json_array_append_new(a, json_string(MCP_MODERN_VERSION));
    for (int i = 0; legacy_versions[i]; i++)
        json_array_append_new(a, json_string(legacy_versions[i]));
    return a;
}

static json_t *server_capabilities(void)
{
    return json_pack("{s:{s:b}}", "tools", "listChanged", 0);
}

static json_t *server_info(void)
{
    return json_pack("{s:s,s:s,s:s}", "name", MCP_SERVER_NAME, "title",
                     "kernelmgr — sandboxed Python and Bash kernels", "version",
                     MCP_SERVER_VERSION);
}

static const char *instructions =
    "Run code with code_exec in long-lived, sandboxed Python and Bash kernels. Pass the same "
    "`session` name on every call to keep variables, imports, shell state and files (like a "
    "notebook); different names are independent sandboxes. The kernels have no network. "
    "Files live in the session's workspace (the kernels' working directory): use list_files, "
    "read_file and write_file to move data in and out. Packages can be installed only from the "
    "operator's allowlist with install_packages.";

/* ---------------------------------------------------------------- methods */

static void do_initialize(mcp_server *srv, json_t *id, json_t *params)
{
    const char *asked = json_string_value(json_object_get(params, "protocolVersion"));
    if (!asked) {
        send_error(srv, id, RPC_INVALID_PARAMS,
                   "initialize: params.protocolVersion (string) is "
                   "required",
                   NULL);
        return;
    }
    const char *chosen = MCP_LEGACY_LATEST;
    for (int i = 0; legacy_versions[i]; i++)
        if (strcmp(asked, legacy_versions[i]) == 0)
            chosen = legacy_versions[i];
    snprintf(srv->legacy_version, sizeof srv->legacy_version, "%s", chosen);
    json_t *result =
        json_pack("{s:s,s:o,s:o,s:s}", "protocolVersion", chosen, "capabilities",
                  server_capabilities(), "serverInfo", server_info(), "instructions", instructions);
    const json_t *ci = json_object_get(params, "clientInfo");
    mcp_log("initialize: client %s asked for %s, answering %s",
            json_string_value(json_object_get(ci, "name")) ?: "?", asked, chosen);
    send_result(srv, id, result, 0);
}

static void do_discover(mcp_server *srv, json_t *id)
{
    /* serverInfo appears both as a field (server/discover "DiscoverResult")
     * and in _meta, where the 2026-07-28 examples also put it. */
    json_t *result = json_pack("{s:o,s:o,s:o,s:s,s:{s:o}}", "supportedVersions",
                               supported_versions(), "capabilities", server_capabilities(),
                               "serverInfo", server_info(), "instructions", instructions, "_meta",
                               "io.modelcontextprotocol/serverInfo", server_info());
    send_result(srv, id, result, 1);
}

static void *call_thread(void *arg)
{
    mcp_inflight *f = arg;
    mcp_server *srv = f->call.srv;
    int rpc_code = 0;
    char msg[512] = "";
    thread_call = f;
    json_t *result = mcpt_call(&f->call, f->tool, f->args, &rpc_code, msg, sizeof msg);
    thread_call = NULL;

    pthread_mutex_lock(&srv->lock);
    for (mcp_inflight **p = &srv->inflight; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
    pthread_mutex_unlock(&srv->lock);

    if (mcp_call_cancelled(&f->call)) {
        /* The client gave up on this request: it must not get an answer. */
        mcp_log("tools/call %s cancelled; no response sent", f->tool);
        json_decref(result);
    } else if (result) {
        send_result(srv, f->call.id, result, f->call.modern);
    } else {
        send_error(srv, f->call.id, rpc_code ? rpc_code : RPC_INTERNAL_ERROR,
                   msg[0] ? msg : "internal error", NULL);
    }
    json_decref(f->request);
    free(f->tool);
    free(f);

    pthread_mutex_lock(&srv->lock);
    srv->n_threads--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

static void do_tools_call(mcp_server *srv, json_t *req, json_t *id, json_t *params, int modern)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *args = json_object_get(params, "arguments");
    if (!name) {
        send_error(srv, id, RPC_INVALID_PARAMS, "tools/call: params.name (string) is required",
                   NULL);
        return;
    }
    if (args && !json_is_object(args)) {
        send_error(srv, id, RPC_INVALID_PARAMS, "tools/call: params.arguments must be an object",
                   NULL);
        return;
    }
    mcp_inflight *f = calloc(1, sizeof *f);
    if (!f) {
        send_error(srv, id, RPC_INTERNAL_ERROR, "out of memory", NULL);
        return;
    }
    f->request = json_incref(req);
    f->tool = strdup(name);
    f->args = args ? args : json_object_get(params, "arguments"); /* NULL → handled below */
    if (!f->args) {
        json_object_set_new(params, "arguments", json_object());
        f->args = json_object_get(params, "arguments");
    }
    f->call.srv = srv;
    f->call.id = id;
    f->call.progress_token = json_object_get(json_object_get(params, "_meta"), "progressToken");
    if (f->call.progress_token && !json_is_string(f->call.progress_token) &&
        !json_is_integer(f->call.progress_token))
        f->call.progress_token = NULL;
    f->call.modern = modern;
    f->call.progress = -1; /* the first notification may say 0 */

    pthread_mutex_lock(&srv->lock);
    f->next = srv->inflight;
    srv->inflight = f;
    srv->n_threads++;
    pthread_mutex_unlock(&srv->lock);

    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &attr, call_thread, f);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        mcp_log("pthread_create: %s", strerror(rc));
        pthread_mutex_lock(&srv->lock);
        srv->inflight = f->next;
        srv->n_threads--;
        pthread_mutex_unlock(&srv->lock);
        send_error(srv, id, RPC_INTERNAL_ERROR, "cannot start a thread for this call", NULL);
        json_decref(f->request);
        free(f->tool);
        free(f);
    }
}

static void do_cancelled(mcp_server *srv, json_t *params)
{
    json_t *rid = json_object_get(params, "requestId");
    if (!rid)
        return;
    pthread_mutex_lock(&srv->lock);
    for (mcp_inflight *f = srv->inflight; f; f = f->next)
        if (json_equal(f->call.id, rid)) {
            __atomic_store_n(&f->call.cancelled, 1, __ATOMIC_SEQ_CST);
            mcp_log("cancel %s: %s", f->tool,
                    json_string_value(json_object_get(params, "reason")) ?: "no reason given");
        }
    pthread_mutex_unlock(&srv->lock);
}

/* Checks the modern-era _meta of a request. Returns 1 when the request is
 * modern and acceptable, 0 when it is legacy, -1 when an error was sent. */
static int check_era(mcp_server *srv, json_t *id, json_t *params)
{
    json_t *meta = json_object_get(params, "_meta");
    json_t *ver = json_object_get(meta, META_VERSION);
    if (!ver)
        return 0;
    if (!json_is_string(ver)) {
        send_error(srv, id, RPC_INVALID_PARAMS, "_meta." META_VERSION " must be a string", NULL);
        return -1;
    }
    if (strcmp(json_string_value(ver), MCP_MODERN_VERSION) != 0) {
        /* A handshake-era version named per request is served as that era
         * (every version in supportedVersions must work when chosen). */
        for (int i = 0; legacy_versions[i]; i++)
            if (strcmp(json_string_value(ver), legacy_versions[i]) == 0)
                return 0;
        send_error(srv, id, RPC_UNSUPPORTED_VERSION, "Unsupported protocol version",
                   json_pack("{s:o,s:O}", "supported", supported_versions(), "requested", ver));
        return -1;
    }
    if (!json_is_object(json_object_get(meta, META_CAPS))) {
        send_error(srv, id, RPC_INVALID_PARAMS,
                   "_meta." META_CAPS
                   " (object) is required with protocol version " MCP_MODERN_VERSION,
                   NULL);
        return -1;
    }
    return 1;
}

static void do_ping(mcp_server *srv, json_t *req, json_t *id, json_t *params, int modern)
{
    send_result(srv, id, json_object(), modern);
}

static void do_tools_list(mcp_server *srv, json_t *req, json_t *id, json_t *params, int modern)
{
    json_t *result = json_pack("{s:o}", "tools", mcpt_list());
    if (modern)
        json_object_set_new(result, "ttlMs", json_integer(0));
    send_result(srv, id, result, modern);
}

static void on_initialize(mcp_server *srv, json_t *req, json_t *id, json_t *params, int modern)
{
    do_initialize(srv, id, params);
}

static void on_discover(mcp_server *srv, json_t *req, json_t *id, json_t *params, int modern)
{
    do_discover(srv, id);
}

static void on_initialized(mcp_server *srv, json_t *params)
{
    srv->initialized = 1;
}

/* The JSON-RPC methods this server answers. A request is looked up among
 * the requests, a notification among the notifications; an unknown request
 * is "Method not found", an unknown notification (progress,
 * roots/list_changed...) needs nothing from us. Every request but
 * initialize has its era checked first (check_era: the modern _meta). */
typedef struct mcp_method {
    const char *name;
    int era; /* check_era before the handler */
    void (*request)(mcp_server *srv, json_t *req, json_t *id, json_t *params, int modern);
    void (*notification)(mcp_server *srv, json_t *params);
} mcp_method;

static const mcp_method methods[] = {
    {"initialize", 0, on_initialize, NULL},
    {"server/discover", 1, on_discover, NULL},
    {"ping", 1, do_ping, NULL},
    {"tools/list", 1, do_tools_list, NULL},
    {"tools/call", 1, do_tools_call, NULL},
    {"notifications/initialized", 0, NULL, on_initialized},
    {"notifications/cancelled", 0, NULL, do_cancelled},
    {NULL, 0, NULL, NULL},
};

static const mcp_method *find_method(const char *name, int notification)
{
    for (const mcp_method *m = methods; m->name; m++)
        if ((notification ? m->notification != NULL : m->request != NULL) &&
            strcmp(m->name, name) == 0)
            return m;
    return NULL;
}

static void handle_request(mcp_server *srv, json_t *req, json_t *id, const char *method,
                           json_t *params)
{
    const mcp_method *m = find_method(method, 0);
    int modern = 0;
    if (!m || m->era) {
        /* an unknown method's request is checked as well: a bad _meta is
         * reported before "Method not found" */
        modern = check_era(srv, id, params);
        if (modern < 0)
            return;
    }
    if (m) {
        m->request(srv, req, id, params, modern);
    } else {
        char msg[160];
        snprintf(msg, sizeof msg, "Method not found: %.100s", method);
        send_error(srv, id, RPC_METHOD_NOT_FOUND, msg, NULL);
    }
}

static void handle_notification(mcp_server *srv, const char *method, json_t *params)
{
    const mcp_method *m = find_method(method, 1);
    if (m)
        m->notification(srv, params);
}

/* One line of input. Never exits: a malformed message gets an error reply
 * (rpc_parse: the checks the daemon API makes too). */
static void handle_line(mcp_server *srv, const char *line, size_t len)
{
    rpc_msg m;
    km_err why = {0};
    int kind = rpc_parse(line, len, &m, &why);
    if (kind < 0) {
        if (!m.silent)
            send_error(srv, m.id, kind, why.msg, NULL);
    } else if (kind == RPC_REQUEST) {
        handle_request(srv, m.root, m.id, m.method, m.params);
    } else if (kind == RPC_NOTIFICATION) {
        handle_notification(srv, m.method, m.params);
    }
    /* RPC_RESPONSE: to a request of ours; we send none, so it is ignored */
    rpc_msg_clear(&m);
}

/* 1 when nobody reads our stdout any more (the reader of a pipe or the
 * peer of a socket is gone); never for a file or a terminal. */
static int stdout_gone(void)
{
    struct pollfd pfd = {.fd = STDOUT_FILENO, .events = POLLOUT};
    return poll(&pfd, 1, 0) == 1 && (pfd.revents & (POLLERR | POLLHUP | POLLNVAL));
}

/* End of input: the client is done or gone. Nothing is cancelled (README
 * "When a client goes away": a cell whose client went away runs to its
 * end, its result goes to the session's history; only
 * notifications/cancelled interrupts). Waits for every call still in flight
 * to reach the daemon (daemon_connect bounds that), and, while someone
 * still reads stdout, for the calls to finish and be answered. Returns how
 * many calls still run (the daemon finishes them). */
static int end_of_input(mcp_server *srv)
{
    pthread_mutex_lock(&srv->lock);
    for (;;) {
        int undelivered = 0;
        for (mcp_inflight *f = srv->inflight; f; f = f->next)
            undelivered += !__atomic_load_n(&f->delivered, __ATOMIC_SEQ_CST);
        if (srv->n_threads == 0 || (!undelivered && stdout_gone()))
            break;
        /* woken when a call ends; else looked at again (a call reaching the
         * daemon, the reader of stdout going away) */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&srv->idle, &srv->lock, &ts);
    }
    int left = srv->n_threads;
    pthread_mutex_unlock(&srv->lock);
    return left;
}

static void usage(FILE *f)
{
    fputs("usage: kernelmgr mcp [--allowlist FILE] [--allow-unsafe-session-options]\n"
          "       kernelmgr mcp install --client claude|cursor|vscode|generic [--print] ...\n"
          "                    (add kernelmgr to an MCP client's configuration; --help)\n"
          "  Model Context Protocol server on stdin/stdout (JSON-RPC, one message per line).\n"
          "  Sessions live in the kernelmgr daemon (started when none runs), under\n"
          "  $KERNELMGR_HOME.\n"
          "  --allowlist FILE  packages install_packages may install (JSON; default\n"
          "                    $KERNELMGR_ALLOWLIST, else $KERNELMGR_HOME/allowlist.json;\n"
          "                    none: nothing is installable)\n"
          "  --allow-unsafe-session-options\n"
          "                    let tools ask for network \"on\" or sandbox \"none\" for the\n"
          "                    sessions they create (default: refused)\n",
          f);
}

int mcp_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"allowlist", required_argument, NULL, 'a'},
        {"allow-unsafe-session-options", no_argument, NULL, 'u'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    if (argc >= 2 && !strcmp(argv[1], "install"))
        return mcpinst_main(argc - 1, argv + 1);
    mcp_server srv;
    memset(&srv, 0, sizeof srv);
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'a':
            free(srv.opts.allowlist_path);
            srv.opts.allowlist_path = strdup(optarg);
            break;
        case 'u':
            srv.opts.allow_unsafe_session_options = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kernelmgr mcp: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        free(srv.opts.allowlist_path);
        return 2;
    }
    mcpd_configure(&srv.opts);
    /* A client that goes away must not kill us in the middle of a write;
     * the write fails instead and we notice EOF on stdin. */
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&srv.out_lock, NULL);
    pthread_mutex_init(&srv.lock, NULL);
    pthread_cond_init(&srv.idle, NULL);
    mcp_log("ready (protocol %s and legacy %s..%s)", MCP_MODERN_VERSION, "2024-11-05",
            MCP_LEGACY_LATEST);

    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        size_t len = (size_t)n;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        size_t start = 0;
        while (start < len && (line[start] == ' ' || line[start] == '\t'))
            start++;
        if (start == len)
            continue;
        if (len > MCP_MAX_LINE) {
            send_error(&srv, NULL, RPC_INVALID_REQUEST, "Invalid Request: message too large", NULL);
        } else {
            handle_line(&srv, line + start, len - start);
        }
        /* Do not keep a huge buffer around after one big message. */
        if (cap > ((size_t)1 << 20)) {
            free(line);
            line = NULL;
            cap = 0;
        }
    }
    free(line);

    int left = end_of_input(&srv);
    if (left > 0) {
        mcp_log("%d call(s) still running in the daemon at exit: they run to their end, their "
                "results go to the sessions' history",
                left);
        fflush(stdout);
        _exit(0); /* threads still use srv: do not tear it down under them */
    }
    pthread_mutex_destroy(&srv.out_lock);
    pthread_mutex_destroy(&srv.lock);
    pthread_cond_destroy(&srv.idle);
    free(srv.opts.allowlist_path);
    return 0;
}
