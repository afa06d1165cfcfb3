/* Unit tests of kernelmgr/result.c: every error member has exactly
 * name/value/traceback (a list of strings), whatever built it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/engine/result.h"

static void assert_error_shape(const json_t *e, const char *name, const char *value)
{
    char why[200] = "";
    int ok = result_error_valid(e, why, sizeof why);
    if (!ok)
        fail_msg("%s", why);
    assert_int_equal(json_object_size(e), 3);
    assert_string_equal(json_string_value(json_object_get(e, "name")), name);
    assert_string_equal(json_string_value(json_object_get(e, "value")), value);
    assert_true(json_is_array(json_object_get(e, "traceback")));
}

static void new_result_has_every_member(void **state)
{
    (void)state;
    json_t *r = result_new("s", "python");
    assert_non_null(r);
    static const char *const keys[] = {"session",     "language", "status", "execution_count",
                                       "exit_code",   "stdout",   "stderr", "result",
                                       "displays",    "error",    "files",  "truncated",
                                       "duration_ms", "kernel",   NULL};
    for (int i = 0; keys[i]; i++)
        assert_non_null(json_object_get(r, keys[i]));
    assert_int_equal(json_object_size(r), 14);
    json_t *k = json_object_get(r, "kernel");
    assert_int_equal(json_object_size(k), 3);
    assert_true(json_is_false(json_object_get(k, "restarted")));
    assert_true(json_is_true(json_object_get(k, "state_preserved")));
    assert_true(json_is_null(json_object_get(k, "reason")));
    assert_true(json_is_null(json_object_get(r, "error")));
    assert_false(result_failed(r));
    json_decref(r);
}

/* The manager-side failures (KernelStartError, limits, closed sessions). */
static void failures_have_name_value_traceback(void **state)
{
    (void)state;
    static const char *const kinds[][3] = {
        {"error", "KernelStartError", "too many live kernels (max_kernels=1)"},
        {"error", "LanguageNotAllowed", "language \"bash\" is not allowed"},
        {"error", "SessionClosed", "the session was closed"},
        {"killed", "KernelKilled", "kernel died during execution (killed by signal 9)"},
        {"timeout", "Timeout", "timeout after 1.0 s; interrupted, state preserved"},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        json_t *r = result_new("s", "bash");
        result_set_failure(r, kinds[i][0], kinds[i][1], kinds[i][2]);
        json_t *e = json_object_get(r, "error");
        assert_error_shape(e, kinds[i][1], kinds[i][2]);
        json_t *tb = json_object_get(e, "traceback");
        assert_int_equal(json_array_size(tb), 1);
        assert_string_equal(json_string_value(json_array_get(tb, 0)), kinds[i][2]);
        assert_true(result_failed(r));
        json_int_t ec = json_integer_value(json_object_get(r, "exit_code"));
        assert_int_equal(ec, !strcmp(kinds[i][0], "killed")    ? 137
                             : !strcmp(kinds[i][0], "timeout") ? 124
                                                               : 1);
        json_decref(r);
    }
}

static void error_builder_shapes(void **state)
{
    (void)state;
    /* no traceback: an empty list, never a missing key or a stray one */
    json_t *e = result_error("KernelKilled", "the kernel died", NULL);
    assert_error_shape(e, "KernelKilled", "the kernel died");
    assert_int_equal(json_array_size(json_object_get(e, "traceback")), 0);
    assert_null(json_object_get(e, "KernelKilled"));
    json_decref(e);
    /* a traceback is stolen as it is */
    json_t *tb = json_pack("[s s]", "line 1", "line 2");
    e = result_error("ValueError", "bad", tb);
    assert_error_shape(e, "ValueError", "bad");
    assert_int_equal(json_array_size(json_object_get(e, "traceback")), 2);
    json_decref(e);
    /* NULLs and a non-array traceback */
    e = result_error(NULL, NULL, json_string("not a list"));
    assert_error_shape(e, "Error", "");
    json_decref(e);
    /* text that is not UTF-8 does not drop the member */
    e = result_error("Bad\xff", "v\xfe", NULL);
    assert_error_shape(e, "Error", "(not UTF-8 text)");
    json_decref(e);
    /* the documented extras are accepted */
    e = result_error("Timeout", "t", NULL);
    json_object_set_new(e, "timeout", json_true());
    json_object_set_new(e, "value_omitted_bytes", json_integer(5));
    char why[200];
    assert_true(result_error_valid(e, why, sizeof why));
    json_decref(e);
}

static void validator_rejects_bad_shapes(void **state)
{
    (void)state;
    char why[200];
    /* what json_pack("{s:s s:s s:[]}", "name", n, "value", v) used to give */
    json_t *e = json_pack("{s:s s:s s:[]}", "name", "x", "value", "KernelKilled", "traceback");
    assert_true(result_error_valid(e, why, sizeof why));
    json_object_del(e, "traceback");
    json_object_set_new(e, "KernelKilled", json_array());
    assert_false(result_error_valid(e, why, sizeof why));
    assert_non_null(strstr(why, "KernelKilled"));
    json_decref(e);
    e = json_pack("{s:s s:s}", "name", "x", "value", "y");
    assert_false(result_error_valid(e, why, sizeof why));
    assert_non_null(strstr(why, "traceback"));
    json_decref(e);
    e = json_pack("{s:s s:s s:[i]}", "name", "x", "value", "y", "traceback", 3);
    assert_false(result_error_valid(e, why, sizeof why));
    json_decref(e);
    e = json_pack("{s:i s:s s:[]}", "name", 1, "value", "y", "traceback");
    assert_false(result_error_valid(e, why, sizeof why));
    json_decref(e);
    assert_false(result_error_valid(NULL, why, sizeof why));
}

static void kernel_member(void **state)
{
    (void)state;
    json_t *r = result_new("s", "python");
    result_set_kernel(r, 1, 0, "culled");
    json_t *k = json_object_get(r, "kernel");
    assert_int_equal(json_object_size(k), 3);
    assert_true(json_is_true(json_object_get(k, "restarted")));
    assert_string_equal(json_string_value(json_object_get(k, "reason")), "culled");
    result_set_kernel(r, 0, 1, "");
    assert_true(json_is_null(json_object_get(json_object_get(r, "kernel"), "reason")));
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(new_result_has_every_member),
        cmocka_unit_test(failures_have_name_value_traceback),
        cmocka_unit_test(error_builder_shapes),
        cmocka_unit_test(validator_rejects_bad_shapes),
        cmocka_unit_test(kernel_member),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
