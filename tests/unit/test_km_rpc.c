/* Unit tests of kernelmgr/rpc.c: JSON-RPC 2.0 line parsing, replies, error
 * code mapping and strict params validation that names the field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/engine/km.h"
#include "kernelmgr/service/rpc.h"

static int parse(const char *line, rpc_msg *m, char *why)
{
    km_err e = {0};
    int rc = rpc_parse(line, strlen(line), m, &e);
    snprintf(why, 300, "%.299s", e.msg);
    return rc;
}

static void parse_kinds(void **state)
{
    (void)state;
    rpc_msg m;
    char why[300];
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", &m, why),
                     RPC_REQUEST);
    assert_string_equal(m.method, "ping");
    assert_true(json_is_object(m.params) && json_object_size(m.params) == 0);
    assert_int_equal(json_integer_value(m.id), 1);
    rpc_msg_clear(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"params\":{\"a\":1}}", &m, why),
                     RPC_NOTIFICATION);
    assert_null(m.id);
    rpc_msg_clear(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{}}", &m, why),
                     RPC_RESPONSE);
    rpc_msg_clear(&m);
}

static void parse_errors(void **state)
{
    (void)state;
    rpc_msg m;
    char why[300];
    assert_int_equal(parse("{nope", &m, why), RPC_PARSE_ERROR);
    assert_non_null(strstr(why, "Parse error"));
    assert_null(m.id);
    rpc_msg_clear(&m);
    assert_int_equal(parse("[1]", &m, why), RPC_INVALID_REQUEST);
    assert_non_null(strstr(why, "batches"));
    rpc_msg_clear(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"p\"}", &m, why),
                     RPC_INVALID_REQUEST);
    assert_null(m.id);
    rpc_msg_clear(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"1.0\",\"id\":4,\"method\":\"p\"}", &m, why),
                     RPC_INVALID_REQUEST);
    assert_int_equal(json_integer_value(m.id), 4);
    rpc_msg_clear(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":7}", &m, why),
                     RPC_INVALID_REQUEST);
    rpc_msg_clear(&m);
    /* params must be an object; a notification with bad params is silent */
    assert_int_equal(
        parse("{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"p\",\"params\":[]}", &m, why),
        RPC_INVALID_PARAMS);
    assert_false(m.silent);
    rpc_msg_clear(&m);
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"method\":\"p\",\"params\":3}", &m, why),
                     RPC_INVALID_PARAMS);
    assert_true(m.silent);
    rpc_msg_clear(&m);
    /* duplicate keys are refused */
    assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"p\"}", &m, why),
                     RPC_PARSE_ERROR);
    rpc_msg_clear(&m);
}

static void replies_and_codes(void **state)
{
    (void)state;
    json_t *id = json_integer(9);
    json_t *e = rpc_error_km(id, KM_ENOSESSION, "no session named \"x\"");
    size_t n;
    char *line = rpc_line(e, &n);
    assert_string_equal(line,
                        "{\"jsonrpc\":\"2.0\",\"id\":9,\"error\":{\"code\":-32003,\"message\":"
                        "\"no session named \\\"x\\\"\",\"data\":{\"km_code\":3}}}\n");
    assert_int_equal(n, strlen(line));
    free(line);
    json_decref(e);
    json_t *r = rpc_result(id, json_pack("{s:s}", "a", "multi\nline"));
    line = rpc_line(r, &n);
    assert_null(memchr(line, '\n', n - 1)); /* one message, one line */
    free(line);
    json_decref(r);
    json_decref(id);
    assert_int_equal(rpc_code_to_km(rpc_code_from_km(KM_EKERNEL)), KM_EKERNEL);
    assert_int_equal(rpc_code_to_km(RPC_INVALID_PARAMS), KM_EUSAGE);
    assert_int_equal(rpc_code_to_km(RPC_METHOD_NOT_FOUND), KM_EUSAGE);
    assert_int_equal(rpc_code_to_km(RPC_INTERNAL_ERROR), KM_EINTERNAL);
}

static int unpack(const char *params, char *why, const char **s, int *b, double *d)
{
    json_t *p = json_loads(params, 0, NULL);
    assert_non_null(p);
    km_err e = {0};
    int rc = rpc_unpack(p, &e, "{s:s s?b s?F}", "session", s, "keep", b, "timeout", d);
    snprintf(why, 300, "%.299s", e.msg);
    json_decref(p);
    return rc;
}

static void unpack_names_the_field(void **state)
{
    (void)state;
    char why[300];
    km_err whye = {0};
    const char *s = NULL;
    int b = 0;
    double d = 0;
    json_t *p = json_loads("{\"session\":\"x\",\"keep\":true,\"timeout\":2}", 0, NULL);
    assert_int_equal(
        rpc_unpack(p, &whye, "{s:s s?b s?F}", "session", &s, "keep", &b, "timeout", &d), 0);
    assert_string_equal(s, "x");
    assert_true(b);
    assert_true(d == 2.0);
    json_decref(p);
    assert_int_equal(unpack("{\"session\":\"x\",\"kep\":true}", why, &s, &b, &d), -1);
    assert_string_equal(why, "unknown field \"kep\" (expected: session, keep, timeout)");
    assert_int_equal(unpack("{\"keep\":true}", why, &s, &b, &d), -1);
    assert_string_equal(why, "missing field \"session\"");
    assert_int_equal(unpack("{\"session\":1}", why, &s, &b, &d), -1);
    assert_string_equal(why, "field \"session\": expected a string, got an integer");
    assert_int_equal(unpack("{\"session\":\"x\",\"keep\":\"yes\"}", why, &s, &b, &d), -1);
    assert_string_equal(why, "field \"keep\": expected a boolean, got a string");
    assert_int_equal(unpack("{\"session\":\"x\",\"timeout\":null}", why, &s, &b, &d), -1);
    assert_string_equal(why, "field \"timeout\": expected a number, got null");
    json_t *empty = json_object();
    assert_int_equal(rpc_unpack(empty, &whye, "{}"), 0);
    json_object_set_new(empty, "x", json_true());
    assert_int_equal(rpc_unpack(empty, &whye, "{}"), -1);
    assert_string_equal(whye.msg, "unknown field \"x\" (expected: no fields)");
    json_decref(empty);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parse_kinds),
        cmocka_unit_test(parse_errors),
        cmocka_unit_test(replies_and_codes),
        cmocka_unit_test(unpack_names_the_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
