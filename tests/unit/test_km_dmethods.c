/*
 * test_km_dmethods.c — the daemon's methods (dmethods.c, dreq.c, the tier
 * checks of dtier.c) driven through a fake connection: one end of a
 * socketpair is a dconn, request lines go through dmethod_run_line (the
 * method table, the tier check, the handler, the reply) with no loop or
 * worker pool, and the test reads the reply lines from the other end. The
 * kernels are the real kernel server in front of the fake worker
 * (fake_kernel.h), a language of their own ("fake"), --sandbox none: no
 * Python, Bash or privileges needed.
 *
 * Each test has a watchdog (alarm) and every read a deadline: a hang fails.
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

#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include "common/cm_clock.h"
#include "kernelmgr/engine/km.h"
#include "kernelmgr/service/daemon_int.h"
#include "kernelmgr/service/rpc.h"
#include "tests/unit/fake_kernel.h"
#include "tests/unit/fake_manager.h"

#define WATCHDOG_S 60
#define READ_DEADLINE_S 30.0

/* A fake client: dc is the daemon's side of the socketpair, fd the test's. */
typedef struct client {
    dconn *dc;
    int fd;
    char buf[1 << 16];
    size_t len;
} client;

typedef struct world {
    fake_home h;
    client a, b;
} world;

static void client_open(client *c)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    c->dc = dconn_new(sv[0], getpid());
    assert_non_null(c->dc);
    c->fd = sv[1];
    c->len = 0;
}

static void client_close(client *c)
{
    if (c->dc)
        dconn_unref(c->dc);
    if (c->fd >= 0)
        close(c->fd);
    c->dc = NULL;
    c->fd = -1;
}

/* The next line the daemon wrote to c, parsed (new); fails at the deadline. */
static json_t *next_line(client *c)
{
    double end = cm_mono_s() + READ_DEADLINE_S;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (nl) {
            size_t n = (size_t)(nl - c->buf);
            json_error_t e;
            json_t *o = json_loadb(c->buf, n, JSON_REJECT_DUPLICATES, &e);
            if (!o)
                print_message("not JSON: %.*s (%s)\n", (int)n, c->buf, e.text);
            assert_non_null(o);
            memmove(c->buf, nl + 1, c->len - n - 1);
            c->len -= n + 1;
            return o;
        }
        double left = end - cm_mono_s();
        assert_true(left > 0);
        assert_true(c->len < sizeof c->buf);
        struct pollfd p = {c->fd, POLLIN, 0};
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        ssize_t r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
        assert_true(r > 0);
        c->len += (size_t)r;
    }
}

/* Nothing more was written to c (its reply was exactly one line). */
static void nothing_more(client *c)
{
    assert_int_equal(c->len, 0);
    struct pollfd p = {c->fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 0), 0);
}

/* Runs one request line of c; returns the final response (new): every
 * notification before it is appended to events (when not NULL) and must be
 * an "event" of this request. */
static json_t *run(client *c, const char *line, json_t *events)
{
    dmethod_run_line(c->dc, line, strlen(line));
    for (;;) {
        json_t *o = next_line(c);
        if (!json_object_get(o, "method")) {
            nothing_more(c);
            return o;
        }
        assert_string_equal(json_string_value(json_object_get(o, "method")), "event");
        assert_non_null(events);
        json_array_append_new(events, o);
    }
}

static json_t *run_ok(client *c, const char *line)
{
    json_t *o = run(c, line, NULL);
    if (!json_object_get(o, "result"))
        print_message("%s -> %s\n", line, json_dumps(o, JSON_COMPACT));
    assert_non_null(json_object_get(o, "result"));
    assert_null(json_object_get(o, "error"));
    return o;
}

/* The error of the response to line: its code is want_code and its message
 * is exactly want_msg (when not NULL). Returns the response (new). */
static json_t *run_err(client *c, const char *line, int want_code, const char *want_msg)
{
    json_t *o = run(c, line, NULL);
    json_t *e = json_object_get(o, "error");
    if (!e)
        print_message("%s -> %s\n", line, json_dumps(o, JSON_COMPACT));
    assert_non_null(e);
    assert_null(json_object_get(o, "result"));
    assert_int_equal(json_integer_value(json_object_get(e, "code")), want_code);
    if (want_msg)
        assert_string_equal(json_string_value(json_object_get(e, "message")), want_msg);
    return o;
}

static const char *str_at(const json_t *o, const char *path)
{
    char key[64];
    const json_t *cur = o;
    while (cur && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        cur =
            json_is_array(cur) ? json_array_get(cur, (size_t)atoi(key)) : json_object_get(cur, key);
        path += n + (path[n] == '.');
    }
    return json_string_value(cur);
}

/* run_err(c, line, want_code), whose message must hold part; freed. */
static void refused_with(client *c, const char *line, int want_code, const char *part)
{
    json_t *o = run_err(c, line, want_code, NULL);
    const char *msg = str_at(o, "error.message");
    if (!msg || !strstr(msg, part))
        print_message("%s: message \"%s\" lacks \"%s\"\n", line, msg ? msg : "", part);
    assert_non_null(msg);
    assert_non_null(strstr(msg, part));
    json_decref(o);
}

static int sessions_named(client *c, const char *name)
{
    json_t *o = run_ok(c, "{\"jsonrpc\":\"2.0\",\"id\":90,\"method\":\"sessions.list\"}");
    json_t *all = json_object_get(json_object_get(o, "result"), "sessions");
    size_t i;
    json_t *s;
    int n = 0;
    json_array_foreach(all, i, s)
    {
        const char *sn = json_string_value(json_object_get(s, "name"));
        assert_non_null(sn);
        n += !strcmp(sn, name);
    }
    json_decref(o);
    return n;
}

static int setup(void **state)
{
    alarm(WATCHDOG_S);
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    static const char *const langs[] = {"fake", NULL};
    fake_home_open(&w->h, "test_kmdmeth", langs);
    daemon_mgr = w->h.m; /* the daemon's, which its methods use */
    client_open(&w->a);
    client_open(&w->b);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    client_close(&w->a);
    client_close(&w->b);
    daemon_mgr = NULL;
    fake_home_close(&w->h);
    free(w);
    alarm(0);
    return 0;
}

/* Lines that are no request of a known method: JSON-RPC's own errors, and
 * the connection keeps working. */
static void parse_errors_and_unknown_methods(void **state)
{
    world *w = *state;
    json_t *o = run_err(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":1,", RPC_PARSE_ERROR, NULL);
    assert_true(json_is_null(json_object_get(o, "id")));
    json_decref(o);
    o = run_err(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"no.such\"}",
                RPC_METHOD_NOT_FOUND, "Method not found: no.such");
    assert_int_equal(json_integer_value(json_object_get(o, "id")), 2);
    json_decref(o);
    /* a notification (no id) is ignored: nothing is written */
    const char *note = "{\"jsonrpc\":\"2.0\",\"method\":\"ping\"}";
    dmethod_run_line(w->a.dc, note, strlen(note));
    nothing_more(&w->a);
    o = run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"ping\"}");
    json_t *res = json_object_get(o, "result");
    assert_string_equal(json_string_value(json_object_get(o, "id")), "p");
    assert_int_equal(json_integer_value(json_object_get(res, "api_version")), DAEMON_API_VERSION);
    assert_string_equal(str_at(res, "tier"), "owner");
    assert_string_equal(str_at(res, "server"), "kernelmgr");
    json_decref(o);
}

/* Params are checked strictly before anything is done: an unknown or
 * mistyped field is refused naming it, and no session is made. */
static void strict_params_name_the_field(void **state)
{
    world *w = *state;
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"exec\",\"params\":{\"session\":"
                 "\"s1\",\"code\":\"out x\",\"lang\":\"fake\",\"colour\":1}}",
                 RPC_INVALID_PARAMS, "colour");
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"exec\",\"params\":{\"session\":\"s1\","
                 "\"code\":7,\"lang\":\"fake\"}}",
                 RPC_INVALID_PARAMS, "code");
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"exec\",\"params\":{\"session\":\"s1\","
                 "\"code\":\"out x\",\"lang\":\"cobol\"}}",
                 RPC_INVALID_PARAMS, "unknown language \"cobol\"");
    json_t *o = run_err(&w->a,
                        "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"session.create\",\"params\":{"
                        "\"session\":\"s1\",\"cpus\":5000}}",
                        RPC_INVALID_PARAMS, NULL);
    assert_string_equal(str_at(o, "error.message"),
                        "session.create: field \"cpus\": must be a number of CPUs from 0.01 to "
                        "4096");
    json_decref(o);
    assert_int_equal(sessions_named(&w->a, "s1"), 0);
}

/* initialize lowers a connection's tier, never raises it; a method or a
 * field its tier may not use is refused with the reason, and an option over
 * the operator's ceiling is refused naming it. The other connection keeps
 * its own tier. */
static void tiers_lower_and_refuse(void **state)
{
    world *w = *state;
    json_t *o = run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\","
                              "\"params\":{\"tier\":\"mcp\"}}");
    assert_string_equal(str_at(o, "result.tier"), "mcp");
    json_t *methods = json_object_get(json_object_get(o, "result"), "methods");
    size_t i;
    json_t *m;
    assert_true(json_array_size(methods) > 0);
    json_array_foreach(methods, i, m)
    {
        assert_non_null(json_string_value(m));
        assert_string_not_equal(json_string_value(m), "shutdown");
    }
    json_decref(o);
    refused_with(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"shutdown\"}",
                 RPC_INVALID_PARAMS, "the daemon is its operator's to stop");
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"session.export\",\"params\":{"
                 "\"session\":\"x\"}}",
                 RPC_INVALID_PARAMS, "not an agent's");
    /* a field of the owner's only */
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"packages.install\",\"params\":{"
                 "\"session\":\"x\",\"manager\":\"pip\",\"packages\":[\"a\"],\"allowlist\":\"/"
                 "etc/passwd\"}}",
                 RPC_INVALID_PARAMS, "allowlist");
    /* over the ceiling: the memory the kernels get by default */
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"session.create\",\"params\":{"
                 "\"session\":\"big\",\"memory\":\"64G\"}}",
                 RPC_INVALID_PARAMS, "memory");
    /* a host path is the owner's */
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"session.create\",\"params\":{"
                 "\"session\":\"big\",\"workspace\":\"/etc\"}}",
                 RPC_INVALID_PARAMS, "workspace");
    assert_int_equal(sessions_named(&w->a, "big"), 0);
    /* lower again: http; then back up: refused, and the tier stays */
    json_decref(run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\","
                              "\"params\":{\"tier\":\"http\"}}"));
    o = run_err(&w->a,
                "{\"jsonrpc\":\"2.0\",\"id\":8,\"method\":\"initialize\",\"params\":{\"tier\":"
                "\"owner\"}}",
                RPC_INVALID_PARAMS,
                "initialize: field \"tier\": a connection may only lower its tier (it is "
                "\"http\", asked for \"owner\")");
    json_decref(o);
    o = run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"ping\"}");
    assert_string_equal(str_at(o, "result.tier"), "http");
    /* the home is a host path: not told over HTTP */
    char *text = json_dumps(o, JSON_COMPACT);
    assert_null(strstr(text, w->h.home));
    free(text);
    json_decref(o);
    refused_with(&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":10,\"method\":\"exec\",\"params\":{\"session\":"
                 "\"h\",\"code\":\"out x\",\"lang\":\"fake\",\"raw_text\":true}}",
                 RPC_INVALID_PARAMS, "raw_text");
    /* the other connection is still the owner */
    o = run_ok(&w->b, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}");
    assert_string_equal(str_at(o, "result.tier"), "owner");
    json_decref(o);
}

/* exec on the fake kernel: stream events first, each naming the request,
 * then the reply with the cell's output; a failing cell gives its error;
 * the session is listed until it is closed, and then methods on it say
 * there is no such session. */
static void exec_streams_then_replies(void **state)
{
    world *w = *state;
    json_t *events = json_array();
    json_t *o = run(&w->a,
                    "{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"exec\",\"params\":{\"session\":"
                    "\"s\",\"lang\":\"fake\",\"stream\":true,\"code\":\"out hello\\nstream "
                    "more\\nresult 42\"}}",
                    events);
    if (!json_object_get(o, "result"))
        print_message("%s\n", json_dumps(o, JSON_COMPACT));
    json_t *res = json_object_get(o, "result");
    assert_non_null(res);
    assert_false(json_is_true(json_object_get(res, "failed")));
    assert_string_equal(str_at(res, "results.0.stdout"), "hello\nmore");
    assert_true(json_array_size(events) >= 1);
    size_t i;
    json_t *ev;
    int streamed = 0;
    json_array_foreach(events, i, ev)
    {
        json_t *p = json_object_get(ev, "params");
        assert_int_equal(json_integer_value(json_object_get(p, "request_id")), 11);
        if (!strcmp(str_at(p, "event") ?: "", "stream"))
            streamed = 1;
    }
    assert_true(streamed);
    json_decref(events);
    json_decref(o);
    assert_int_equal(sessions_named(&w->a, "s"), 1);

    o = run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"exec\",\"params\":{\"session\":"
                      "\"s\",\"lang\":\"fake\",\"code\":\"fail\"}}");
    res = json_object_get(o, "result");
    assert_true(json_is_true(json_object_get(res, "failed")));
    assert_string_equal(str_at(res, "results.0.error.name"), "FakeError");
    json_decref(o);

    json_decref(run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"close\",\"params\":{"
                              "\"session\":\"s\"}}"));
    assert_int_equal(sessions_named(&w->a, "s"), 0);
    o = run_err(&w->a,
                "{\"jsonrpc\":\"2.0\",\"id\":14,\"method\":\"interrupt\",\"params\":{\"session\":"
                "\"s\"}}",
                RPC_SERVER_ERROR - KM_ENOSESSION, NULL);
    assert_non_null(strstr(str_at(o, "error.message"), "s"));
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(json_object_get(o, "error"), "data"), "km_code")),
                     KM_ENOSESSION);
    json_decref(o);
    /* exec with create false does not make it again */
    json_decref(
        run_err(&w->a,
                "{\"jsonrpc\":\"2.0\",\"id\":15,\"method\":\"exec\",\"params\":{\"session\":\"s\","
                "\"lang\":\"fake\",\"code\":\"out x\",\"create\":false}}",
                RPC_SERVER_ERROR - KM_ENOSESSION, NULL));
    assert_int_equal(sessions_named(&w->a, "s"), 0);
}

typedef struct bg_exec {
    client *c;
    const char *line;
    json_t *reply;
} bg_exec;

static void *bg_main(void *arg)
{
    bg_exec *b = arg;
    dmethod_run_line(b->c->dc, b->line, strlen(b->line));
    return NULL;
}

/* A running cell is interrupted from a second connection while the first
 * waits for its reply: the interrupt is answered at once and the cell ends
 * with KeyboardInterrupt. */
static void interrupt_from_another_connection(void **state)
{
    world *w = *state;
    json_decref(run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":20,\"method\":\"exec\",\"params\":{"
                              "\"session\":\"i\",\"lang\":\"fake\",\"code\":\"out up\"}}"));
    bg_exec b = {&w->a,
                 "{\"jsonrpc\":\"2.0\",\"id\":21,\"method\":\"exec\",\"params\":{\"session\":\"i\","
                 "\"lang\":\"fake\",\"code\":\"wait\"}}",
                 NULL};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, bg_main, &b), 0);
    /* until the kernel is busy with the cell */
    double end = cm_mono_s() + READ_DEADLINE_S;
    for (;;) {
        json_t *o = run_ok(&w->b, "{\"jsonrpc\":\"2.0\",\"id\":30,\"method\":\"sessions.list\"}");
        json_t *all = json_object_get(json_object_get(o, "result"), "sessions");
        const char *st = NULL;
        size_t i;
        json_t *s;
        json_array_foreach(all, i, s)
        {
            const char *name = str_at(s, "name");
            if (name && !strcmp(name, "i"))
                st = str_at(s, "kernels.fake.state");
        }
        int busy = st && !strcmp(st, "busy");
        json_decref(o);
        if (busy)
            break;
        assert_true(cm_mono_s() < end);
        usleep(10 * 1000);
    }
    json_decref(run_ok(&w->b, "{\"jsonrpc\":\"2.0\",\"id\":31,\"method\":\"interrupt\",\"params\":{"
                              "\"session\":\"i\"}}"));
    pthread_join(t, NULL);
    json_t *o = next_line(&w->a);
    nothing_more(&w->a);
    json_t *res = json_object_get(o, "result");
    if (!res)
        print_message("%s\n", json_dumps(o, JSON_COMPACT));
    assert_non_null(res);
    assert_int_equal(json_integer_value(json_object_get(o, "id")), 21);
    json_t *first = json_array_get(json_object_get(res, "results"), 0);
    assert_int_equal(json_integer_value(json_object_get(first, "exit_code")), 130);
    assert_string_equal(str_at(first, "error.name"), "KeyboardInterrupt");
    json_decref(o);
    /* the session goes on */
    o = run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":22,\"method\":\"exec\",\"params\":{"
                      "\"session\":\"i\",\"lang\":\"fake\",\"code\":\"out again\"}}");
    assert_string_equal(str_at(o, "result.results.0.stdout"), "again\n");
    json_decref(o);
}

/* files: a write makes the session when asked, a read returns the bytes; a
 * bad encoding or path is refused before anything is done. */
static void files_through_the_methods(void **state)
{
    world *w = *state;
    json_t *o =
        run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":40,\"method\":\"files.write\",\"params\":"
                      "{\"session\":\"f\",\"path\":\"d/a.txt\",\"content\":\"aGk=\","
                      "\"encoding\":\"base64\",\"create\":true}}");
    assert_string_equal(str_at(o, "result.path"), "d/a.txt");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "result"), "size")), 2);
    json_decref(o);
    o = run_ok(&w->a, "{\"jsonrpc\":\"2.0\",\"id\":41,\"method\":\"files.read\",\"params\":{"
                      "\"session\":\"f\",\"path\":\"d/a.txt\"}}");
    assert_string_equal(str_at(o, "result.content"), "hi");
    assert_string_equal(str_at(o, "result.encoding"), "utf-8");
    json_decref(o);
    json_decref(run_err(&w->a,
                        "{\"jsonrpc\":\"2.0\",\"id\":42,\"method\":\"files.read\",\"params\":{"
                        "\"session\":\"f\",\"path\":\"d/a.txt\",\"encoding\":\"rot13\"}}",
                        RPC_INVALID_PARAMS,
                        "files.read: field \"encoding\": must be \"auto\", \"text\" or \"base64\" "
                        "(got \"rot13\")"));
    json_decref(run_err(&w->a,
                        "{\"jsonrpc\":\"2.0\",\"id\":43,\"method\":\"files.write\",\"params\":{"
                        "\"session\":\"g\",\"path\":\"../x\",\"content\":\"x\",\"create\":true}}",
                        RPC_INVALID_PARAMS, NULL));
    json_decref(run_err(&w->a,
                        "{\"jsonrpc\":\"2.0\",\"id\":44,\"method\":\"files.write\",\"params\":{"
                        "\"session\":\"g\",\"path\":\"x\",\"content\":\"@@\",\"encoding\":"
                        "\"base64\",\"create\":true}}",
                        RPC_INVALID_PARAMS, "files.write: field \"content\": not valid base64"));
    assert_int_equal(sessions_named(&w->a, "g"), 0);
}

int main(int argc, char **argv)
{
    int part = fake_kernel_main(argc, argv);
    if (part >= 0)
        return part;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(parse_errors_and_unknown_methods, setup, teardown),
        cmocka_unit_test_setup_teardown(strict_params_name_the_field, setup, teardown),
        cmocka_unit_test_setup_teardown(tiers_lower_and_refuse, setup, teardown),
        cmocka_unit_test_setup_teardown(exec_streams_then_replies, setup, teardown),
        cmocka_unit_test_setup_teardown(interrupt_from_another_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(files_through_the_methods, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
