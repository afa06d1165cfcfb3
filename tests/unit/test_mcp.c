/*
 * test_mcp.c — the MCP server's JSON-RPC side (kernelmgr/frontends/mcp.c)
 * without a daemon: mcp_main runs in a child per conversation, its stdin a
 * file of request lines, its stdout captured and parsed line by line. The
 * handshake negotiates a version (a known legacy one as asked, anything
 * else the latest), server/discover lists every version, tools/list gives
 * each tool a name, a description and an object schema; malformed lines get
 * JSON-RPC's own errors (and the server reads on); an unknown request is
 * "Method not found", an unknown notification gets no reply; a modern-era
 * request must carry its capabilities; tools/call refuses a missing name,
 * arguments that are not an object, an unknown tool and an unknown argument
 * before any daemon is asked. With a real daemon (fake_daemon.h) in front
 * of the fake kernel, every tool: code_exec's output, result and errors,
 * the workspace files (write, append, list, read, refusals), restart,
 * snapshot and fork (refused with the reason), install (refused), close.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <sys/types.h>

#include "tests/unit/cli_child.h"
#include "tests/unit/fake_daemon.h"
#include "tests/unit/fake_kernel.h"

#define WATCHDOG_S 60
/* MCP's "unsupported protocol version" (mcp.c's RPC_UNSUPPORTED_VERSION) */
#define MCP_UNSUPPORTED_VERSION_CODE (-32022)

typedef struct world {
    char home[64];
    char link[PATH_MAX]; /* with a daemon: the fake kernel's link */
    pid_t daemon;        /* with a daemon: its process, else 0 */
} world;

/* What one conversation gave: the exit status, each reply by its id (the
 * ids are integers), the replies with a null id, how many lines came,
 * stderr (owned). */
typedef struct talk {
    int status;
    json_t *by_id;
    json_t *nulls; /* the replies whose id is null, in order */
    size_t lines;
    char *err;
} talk;

/* `kernelmgr mcp ARGS...` (NULL-terminated) with input on stdin: its exit
 * status, *out and *err (new). */
static int run_mcp(world *w, const char *const *args, const char *input, char **out_text,
                   char **err_text)
{
    const char *argv[16] = {"mcp"};
    for (int i = 0; args && args[i]; i++) {
        assert_true(i < 14);
        argv[i + 1] = args[i];
    }
    cli_child how = {w->home, input, NULL, NULL};
    cli_outcome r = cli_child_run(&how, argv);
    *out_text = r.out;
    *err_text = r.err;
    return r.status;
}

/* A conversation: input's lines to `kernelmgr mcp ARGS...`, every line of
 * its stdout a JSON-RPC message. */
static talk converse(world *w, const char *const *args, const char *input)
{
    char *text;
    talk t = {0, json_object(), json_array(), 0, NULL};
    t.status = run_mcp(w, args, input, &text, &t.err);
    for (char *line = text, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        assert_non_null(nl); /* every reply is one whole line */
        *nl = 0;
        json_error_t je;
        json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &je);
        if (!o)
            print_message("not JSON: %s (%s)\n", line, je.text);
        assert_non_null(o);
        assert_string_equal(json_string_value(json_object_get(o, "jsonrpc")), "2.0");
        json_t *id = json_object_get(o, "id");
        t.lines++;
        if (json_is_null(id)) {
            json_array_append_new(t.nulls, o);
            continue;
        }
        assert_true(json_is_integer(id));
        char key[32];
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(id));
        assert_null(json_object_get(t.by_id, key)); /* one reply per request */
        json_object_set_new(t.by_id, key, o);
    }
    free(text);
    return t;
}

static void talk_free(talk *t)
{
    json_decref(t->by_id);
    json_decref(t->nulls);
    free(t->err);
}

/* The reply to request id: its result (want_code 0) or an error with that
 * code whose message holds want_msg (when not NULL). */
static json_t *reply(const talk *t, int id, int want_code, const char *want_msg)
{
    char key[32];
    snprintf(key, sizeof key, "%d", id);
    json_t *o = json_object_get(t->by_id, key);
    if (!o)
        print_message("no reply to %d; stderr: %s\n", id, t->err);
    assert_non_null(o);
    json_t *e = json_object_get(o, "error");
    if (!want_code) {
        if (e)
            print_message("%d: %s\n", id, json_string_value(json_object_get(e, "message")));
        assert_null(e);
        assert_non_null(json_object_get(o, "result"));
        return json_object_get(o, "result");
    }
    assert_non_null(e);
    assert_int_equal(json_integer_value(json_object_get(e, "code")), want_code);
    const char *msg = json_string_value(json_object_get(e, "message"));
    assert_non_null(msg);
    if (want_msg && !strstr(msg, want_msg))
        print_message("%d: \"%s\" lacks \"%s\"\n", id, msg, want_msg);
    if (want_msg)
        assert_non_null(strstr(msg, want_msg));
    return e;
}

static int setup(void **state)
{
    alarm(WATCHDOG_S);
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_int_equal(fake_tmp_dir(w->home, sizeof w->home, "test_mcp"), 0);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    fake_tmp_remove(w->home);
    free(w);
    alarm(0);
    return 0;
}

static void handshake_negotiates_a_version(void **state)
{
    world *w = *state;
    talk t = converse(
        w, NULL,
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
        "\"2025-03-26\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}\n"
        "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"initialize\",\"params\":{\"protocolVersion\":"
        "\"1999-01-01\"}}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"initialize\",\"params\":{}}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\"}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"server/discover\"}\n");
    assert_int_equal(t.status, 0);
    assert_int_equal(t.lines, 5); /* the notification has no reply */
    json_t *r = reply(&t, 1, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(r, "protocolVersion")), "2025-03-26");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(r, "serverInfo"), "name")), "kernelmgr");
    assert_true(json_is_object(json_object_get(json_object_get(r, "capabilities"), "tools")));
    assert_non_null(strstr(json_string_value(json_object_get(r, "instructions")), "code_exec"));
    /* an unknown version: the latest of the handshake era */
    r = reply(&t, 2, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(r, "protocolVersion")), "2025-11-25");
    reply(&t, 3, -32602, "params.protocolVersion (string) is required");
    assert_int_equal(json_object_size(reply(&t, 4, 0, NULL)), 0);
    r = reply(&t, 5, 0, NULL);
    json_t *versions = json_object_get(r, "supportedVersions");
    assert_int_equal(json_array_size(versions), 5);
    char *v = json_dumps(versions, JSON_COMPACT);
    assert_non_null(strstr(v, "\"2024-11-05\""));
    assert_non_null(strstr(v, "\"2025-11-25\""));
    free(v);
    talk_free(&t);
}

static void tools_list_describes_every_tool(void **state)
{
    world *w = *state;
    talk t = converse(w, NULL, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\"}\n");
    assert_int_equal(t.status, 0);
    json_t *tools = json_object_get(reply(&t, 1, 0, NULL), "tools");
    assert_true(json_array_size(tools) >= 5);
    size_t i;
    json_t *tool;
    int code_exec = 0;
    json_array_foreach(tools, i, tool)
    {
        const char *name = json_string_value(json_object_get(tool, "name"));
        assert_non_null(name);
        code_exec |= !strcmp(name, "code_exec");
        const char *d = json_string_value(json_object_get(tool, "description"));
        assert_true(d && strlen(d) > 20);
        json_t *schema = json_object_get(tool, "inputSchema");
        assert_string_equal(json_string_value(json_object_get(schema, "type")), "object");
        assert_true(json_is_object(json_object_get(schema, "properties")));
    }
    assert_true(code_exec);
    talk_free(&t);
}

/* Lines that are no good request: JSON-RPC's errors; the server reads on. */
static void malformed_lines_get_errors_and_the_server_reads_on(void **state)
{
    world *w = *state;
    talk t = converse(w, NULL,
                      "{\"jsonrpc\":\"2.0\",\"id\":1,\n"
                      "   \n"
                      "[1,2]\n"
                      "{\"jsonrpc\":\"1.0\",\"id\":2,\"method\":\"ping\"}\n"
                      "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"frobnicate\"}\n"
                      "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/frobnicated\"}\n"
                      "{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":{}}\n"
                      "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\"}\n");
    assert_int_equal(t.status, 0);
    /* the broken line (a parse error) and the array (no request object)
     * have no id to answer to: their errors' ids are null; the blank line,
     * the unknown notification and the response get no reply */
    assert_int_equal(json_array_size(t.nulls), 2);
    json_t *e = json_object_get(json_array_get(t.nulls, 0), "error");
    assert_int_equal(json_integer_value(json_object_get(e, "code")), -32700);
    e = json_object_get(json_array_get(t.nulls, 1), "error");
    assert_int_equal(json_integer_value(json_object_get(e, "code")), -32600);
    reply(&t, 2, -32600, NULL);
    reply(&t, 3, -32601, "Method not found: frobnicate");
    assert_null(json_object_get(t.by_id, "4"));
    reply(&t, 5, 0, NULL);
    talk_free(&t);
}

/* A modern-era request names its version in _meta and must carry its
 * capabilities; a version no era has is refused with the supported list. */
static void modern_requests_are_checked(void **state)
{
    world *w = *state;
    talk t = converse(
        w, NULL,
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/list\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\",\"io.modelcontextprotocol/"
        "clientCapabilities\":{}}}}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":\"2026-07-28\"}}}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"ping\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":\"3000-01-01\"}}}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"ping\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":7}}}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"ping\",\"params\":{\"_meta\":{"
        "\"io.modelcontextprotocol/protocolVersion\":\"2025-06-18\"}}}\n");
    json_t *r = reply(&t, 1, 0, NULL);
    assert_string_equal(json_string_value(json_object_get(r, "resultType")), "complete");
    assert_true(json_is_integer(json_object_get(r, "ttlMs")));
    reply(&t, 2, -32602, "clientCapabilities (object) is required");
    json_t *e = reply(&t, 3, MCP_UNSUPPORTED_VERSION_CODE, "Unsupported protocol version");
    json_t *data = json_object_get(e, "data");
    assert_string_equal(json_string_value(json_object_get(data, "requested")), "3000-01-01");
    assert_int_equal(json_array_size(json_object_get(data, "supported")), 5);
    reply(&t, 4, -32602, "must be a string");
    r = reply(&t, 5, 0, NULL);
    assert_null(json_object_get(r, "resultType")); /* served as its own, legacy era */
    talk_free(&t);
}

/* tools/call's refusals that need no daemon. */
static void tools_call_refuses_bad_calls_first(void **state)
{
    world *w = *state;
    talk t =
        converse(w, NULL,
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{}}\n"
                 "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{\"name\":"
                 "\"code_exec\",\"arguments\":[1]}}\n"
                 "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"tools/call\",\"params\":{\"name\":"
                 "\"rm_rf\",\"arguments\":{}}}\n"
                 "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":"
                 "\"code_exec\",\"arguments\":{\"code\":\"1\",\"frobnicate\":true}}}\n");
    assert_int_equal(t.status, 0);
    reply(&t, 1, -32602, "params.name (string) is required");
    reply(&t, 2, -32602, "params.arguments must be an object");
    reply(&t, 3, -32602, "Unknown tool: rm_rf");
    /* a tool's own refusal is a result the model reads (isError) */
    json_t *r = reply(&t, 4, 0, NULL);
    assert_true(json_is_true(json_object_get(r, "isError")));
    char *s = json_dumps(r, JSON_COMPACT);
    if (!strstr(s, "frobnicate"))
        print_message("%s\n", s);
    assert_non_null(strstr(s, "frobnicate"));
    free(s);
    talk_free(&t);
}

static void options(void **state)
{
    world *w = *state;
    char *out, *err;
    assert_int_equal(run_mcp(w, (const char *[]){"--help", NULL}, "", &out, &err), 0);
    assert_non_null(strstr(out, "usage: kernelmgr mcp"));
    free(out);
    free(err);
    assert_int_equal(run_mcp(w, (const char *[]){"stray", NULL}, "", &out, &err), 2);
    assert_non_null(strstr(err, "unexpected argument 'stray'"));
    assert_string_equal(out, "");
    free(out);
    free(err);
    assert_int_equal(run_mcp(w, (const char *[]){"--frob", NULL}, "", &out, &err), 2);
    assert_non_null(strstr(err, "usage: kernelmgr mcp"));
    free(out);
    free(err);
}

/* ---------------------------------------------------------------- the tools, with a daemon */

static int setup_daemon(void **state)
{
    setup(state);
    world *w = *state;
    fake_daemon_config(w->home, w->link, sizeof w->link, NULL);
    w->daemon = fake_daemon_start(w->home, NULL);
    return 0;
}

static int teardown_daemon(void **state)
{
    world *w = *state;
    fake_daemon_stop(w->home, w->daemon);
    return teardown(state);
}

/* One tools/call in a conversation of its own (calls of one conversation
 * run concurrently): its result (new), which must say isError as wanted. */
static json_t *call_tool(world *w, const char *name, const char *args, int want_error)
{
    char *line = NULL;
    assert_true(asprintf(&line,
                         "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{"
                         "\"name\":\"%s\",\"arguments\":%s}}\n",
                         name, args) > 0);
    talk t = converse(w, NULL, line);
    free(line);
    assert_int_equal(t.status, 0);
    json_t *r = json_incref(reply(&t, 1, 0, NULL));
    talk_free(&t);
    if (json_is_true(json_object_get(r, "isError")) != want_error) {
        char *d = json_dumps(r, JSON_COMPACT);
        print_message("%s(%s): isError wanted %d: %s\n", name, args, want_error, d);
        free(d);
        fail();
    }
    return r;
}

/* The text of a tool result's content, joined (new). */
static char *result_text(const json_t *r)
{
    size_t cap = 1, len = 0;
    char *out = calloc(1, cap);
    assert_non_null(out);
    size_t i;
    json_t *c;
    json_array_foreach(json_object_get(r, "content"), i, c)
    {
        const char *t = json_string_value(json_object_get(c, "text"));
        if (!t)
            continue;
        size_t n = strlen(t);
        char *more = realloc(out, cap += n + 1);
        assert_non_null(more);
        out = more;
        memcpy(out + len, t, n);
        out[len += n] = '\n';
        out[++len] = 0;
    }
    return out;
}

/* r's text holds want. */
static void expect_text(const json_t *r, const char *want)
{
    char *t = result_text(r);
    if (!strstr(t, want))
        print_message("\"%s\" lacks \"%s\"\n", t, want);
    assert_non_null(strstr(t, want));
    free(t);
}

/* One call whose result must say isError as wanted and, unless want is
 * NULL, hold want in its text. */
static void tool_says(world *w, const char *name, const char *args, int want_error,
                      const char *want)
{
    json_t *r = call_tool(w, name, args, want_error);
    if (want)
        expect_text(r, want);
    json_decref(r);
}

/* code_exec through a real daemon: output, the result, an error the model
 * reads as an error; the session kept between calls. */
static void code_exec_runs_in_a_session(void **state)
{
    world *w = *state;
    json_t *r = call_tool(w, "code_exec",
                          "{\"code\":\"out hello\\nresult 42\",\"language\":\"fake\","
                          "\"session\":\"m\"}",
                          0);
    expect_text(r, "hello");
    expect_text(r, "42");
    json_decref(r);
    r = call_tool(w, "code_exec",
                  "{\"code\":\"err oops\\nfail\",\"language\":\"fake\",\"session\":\"m\"}", 1);
    expect_text(r, "oops");
    expect_text(r, "FakeError");
    json_decref(r);
    tool_says(w, "code_exec", "{\"code\":\"out x\",\"language\":\"cobol\",\"session\":\"m\"}", 1,
              "cobol");
    r = call_tool(w, "list_sessions", "{}", 0);
    expect_text(r, "m: workspace ");
    expect_text(r, "; fake idle");
    json_decref(r);
}

/* The workspace tools: write, list, read back, refusals with their reason. */
static void workspace_files(void **state)
{
    world *w = *state;
    tool_says(w, "write_file", "{\"session\":\"f\",\"path\":\"d/x.txt\",\"content\":\"abc\\n\"}", 0,
              NULL);
    tool_says(w, "write_file",
              "{\"session\":\"f\",\"path\":\"d/x.txt\",\"content\":\"def\\n\",\"append\":true}", 0,
              NULL);
    tool_says(w, "list_files", "{\"session\":\"f\"}", 0, "d/x.txt");
    tool_says(w, "read_file", "{\"session\":\"f\",\"path\":\"d/x.txt\"}", 0, "abc\ndef\n");
    tool_says(w, "read_file", "{\"session\":\"f\",\"path\":\"d/x.txt\",\"offset\":4}", 0, "def\n");
    tool_says(w, "read_file", "{\"session\":\"f\",\"path\":\"../../etc/passwd\"}", 1, "..");
    tool_says(w, "read_file", "{\"session\":\"f\",\"path\":\"nope.txt\"}", 1, "no such file");
    tool_says(w, "write_file",
              "{\"session\":\"f\",\"path\":\"y\",\"content\":\"!!\",\"encoding\":\"base64\"}", 1,
              NULL);
}

/* The session tools: restart (files kept), snapshot and fork (the fake
 * worker cannot save its state: said, with the reason), install (refused:
 * nothing is allowed), close (then gone). */
static void session_lifecycle(void **state)
{
    world *w = *state;
    tool_says(w, "code_exec", "{\"code\":\"out one\",\"language\":\"fake\",\"session\":\"s\"}", 0,
              NULL);
    tool_says(w, "write_file", "{\"session\":\"s\",\"path\":\"kept.txt\",\"content\":\"k\"}", 0,
              NULL);
    tool_says(w, "restart_session", "{\"session\":\"s\"}", 0, NULL);
    tool_says(w, "read_file", "{\"session\":\"s\",\"path\":\"kept.txt\"}", 0, "k");
    /* the fake worker cannot save its state: both say so, and why */
    tool_says(w, "snapshot_session", "{\"session\":\"s\"}", 1, "no \"snapshot\" feature");
    tool_says(w, "fork_session", "{\"session\":\"s\",\"new_session\":\"s2\"}", 1,
              "no \"snapshot\" feature");
    tool_says(w, "fork_session", "{\"session\":\"s\",\"new_session\":\"bad/name\"}", 1, "bad/name");
    tool_says(w, "install_packages",
              "{\"session\":\"s\",\"manager\":\"pip\",\"packages\":[\"numpy\"]}", 1, "numpy");
    tool_says(w, "close_session", "{\"session\":\"s\"}", 0, NULL);
    tool_says(w, "read_file", "{\"session\":\"s\",\"path\":\"kept.txt\"}", 1, NULL);
    tool_says(w, "list_sessions", "{}", 0, "no sessions");
}

int main(int argc, char **argv)
{
    int part = fake_kernel_main(argc, argv);
    if (part >= 0)
        return part;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(handshake_negotiates_a_version, setup, teardown),
        cmocka_unit_test_setup_teardown(tools_list_describes_every_tool, setup, teardown),
        cmocka_unit_test_setup_teardown(malformed_lines_get_errors_and_the_server_reads_on, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(modern_requests_are_checked, setup, teardown),
        cmocka_unit_test_setup_teardown(tools_call_refuses_bad_calls_first, setup, teardown),
        cmocka_unit_test_setup_teardown(options, setup, teardown),
        cmocka_unit_test_setup_teardown(code_exec_runs_in_a_session, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(workspace_files, setup_daemon, teardown_daemon),
        cmocka_unit_test_setup_teardown(session_lifecycle, setup_daemon, teardown_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
