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
    km_err why = {0};
    int ok = result_error_valid(e, &why);
    if (!ok)
        fail_msg("%s", why.msg);
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
    static const struct {
        result_status status;
        const char *status_name, *name, *value;
        int exit_code;
    } kinds[] = {
        {RESULT_ERROR, "error", "KernelStartError", "too many live kernels (max_kernels=1)", 1},
        {RESULT_ERROR, "error", "LanguageNotAllowed", "language \"bash\" is not allowed", 1},
        {RESULT_ERROR, "error", "SessionClosed", "the session was closed", 1},
        {RESULT_KILLED, "killed", "KernelKilled",
         "kernel died during execution (killed by signal 9)", 137},
        {RESULT_TIMEOUT, "timeout", "Timeout", "timeout after 1.0 s; interrupted, state preserved",
         124},
    };
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        json_t *r = result_new("s", "bash");
        result_set_failure(r, kinds[i].status, kinds[i].name, kinds[i].value);
        assert_string_equal(json_string_value(json_object_get(r, "status")), kinds[i].status_name);
        json_t *e = json_object_get(r, "error");
        assert_error_shape(e, kinds[i].name, kinds[i].value);
        json_t *tb = json_object_get(e, "traceback");
        assert_int_equal(json_array_size(tb), 1);
        assert_string_equal(json_string_value(json_array_get(tb, 0)), kinds[i].value);
        assert_true(result_failed(r));
        json_int_t ec = json_integer_value(json_object_get(r, "exit_code"));
        assert_int_equal(ec, kinds[i].exit_code);
        json_decref(r);
    }
}

/* result_set_status: the name and exit code of each status; an error keeps
 * the non-zero exit code a kernel reported (bash's 2), else becomes 1. */
static void status_enum_names_and_exit_codes(void **state)
{
    (void)state;
    assert_string_equal(result_status_name(RESULT_OK), "ok");
    assert_string_equal(result_status_name(RESULT_ERROR), "error");
    assert_string_equal(result_status_name(RESULT_TIMEOUT), "timeout");
    assert_string_equal(result_status_name(RESULT_KILLED), "killed");
    json_t *r = result_new("s", "bash");
    result_set_status(r, RESULT_OK);
    assert_false(result_failed(r));
    assert_int_equal(json_integer_value(json_object_get(r, "exit_code")), 0);
    result_set_status(r, RESULT_ERROR);
    assert_int_equal(json_integer_value(json_object_get(r, "exit_code")), 1);
    json_object_set_new(r, "exit_code", json_integer(2));
    result_set_status(r, RESULT_ERROR);
    assert_int_equal(json_integer_value(json_object_get(r, "exit_code")), 2);
    result_set_status(r, RESULT_TIMEOUT);
    assert_string_equal(json_string_value(json_object_get(r, "status")), "timeout");
    assert_int_equal(json_integer_value(json_object_get(r, "exit_code")), 124);
    result_set_status(r, RESULT_KILLED);
    assert_int_equal(json_integer_value(json_object_get(r, "exit_code")), 137);
    assert_true(result_failed(r));
    json_decref(r);
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
    km_err why = {0};
    assert_true(result_error_valid(e, &why));
    json_decref(e);
}

static void validator_rejects_bad_shapes(void **state)
{
    (void)state;
    km_err why = {0};
    /* what json_pack("{s:s s:s s:[]}", "name", n, "value", v) used to give */
    json_t *e = json_pack("{s:s s:s s:[]}", "name", "x", "value", "KernelKilled", "traceback");
    assert_true(result_error_valid(e, &why));
    json_object_del(e, "traceback");
    json_object_set_new(e, "KernelKilled", json_array());
    assert_false(result_error_valid(e, &why));
    assert_non_null(strstr(why.msg, "KernelKilled"));
    json_decref(e);
    e = json_pack("{s:s s:s}", "name", "x", "value", "y");
    assert_false(result_error_valid(e, &why));
    assert_non_null(strstr(why.msg, "traceback"));
    json_decref(e);
    e = json_pack("{s:s s:s s:[i]}", "name", "x", "value", "y", "traceback", 3);
    assert_false(result_error_valid(e, &why));
    json_decref(e);
    e = json_pack("{s:i s:s s:[]}", "name", 1, "value", "y", "traceback");
    assert_false(result_error_valid(e, &why));
    json_decref(e);
    assert_false(result_error_valid(NULL, &why));
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
        cmocka_unit_test(status_enum_names_and_exit_codes),
        cmocka_unit_test(error_builder_shapes),
        cmocka_unit_test(validator_rejects_bad_shapes),
        cmocka_unit_test(kernel_member),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
