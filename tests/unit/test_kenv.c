/* Unit tests of kernels/server/kenv.c (the sandbox environment's rules) and
 * of the configuration's "env" key that uses them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/engine/config.h"
#include "kernels/server/kenv.h"

static void names(void **state)
{
    (void)state;
    assert_true(kenv_name_valid("A", 1));
    assert_true(kenv_name_valid("_x9", 3));
    assert_false(kenv_name_valid("9x", 2));
    assert_false(kenv_name_valid("A-B", 3));
    assert_false(kenv_name_valid("A B", 3));
    assert_false(kenv_name_valid("", 0));
    char longname[KENV_MAX_NAME + 2];
    memset(longname, 'N', sizeof longname);
    assert_true(kenv_name_valid(longname, KENV_MAX_NAME));
    assert_false(kenv_name_valid(longname, KENV_MAX_NAME + 1));
    assert_true(kenv_name_reserved("KERNELMGR_REQ_FD", 16));
    assert_true(kenv_name_reserved("KERNELMGR_EVT_FD", 16));
    assert_false(kenv_name_reserved("KERNELMGR_EVT_FDX", 17));
}

static void entries_and_limits(void **state)
{
    (void)state;
    char err[256];
    kenv_budget b = {0, 0};
    assert_int_equal(kenv_check_entry(&b, "--env", "A=1=2", err, sizeof err), 0);
    assert_int_equal(kenv_check_entry(&b, "--env", "EMPTY=", err, sizeof err), 0);
    assert_int_equal(b.count, 2);
    assert_int_equal(kenv_check_entry(&b, "--env", "NOVALUE", err, sizeof err), -1);
    assert_non_null(strstr(err, "expected NAME=VALUE"));
    assert_int_equal(kenv_check_entry(&b, "--env", "=x", err, sizeof err), -1);
    assert_non_null(strstr(err, "invalid variable name"));
    assert_int_equal(kenv_check_entry(&b, "--env", "KERNELMGR_REQ_FD=3", err, sizeof err), -1);
    assert_non_null(strstr(err, "set by the kernel itself"));
    char *big = malloc(KENV_MAX_VALUE + 8);
    assert_non_null(big);
    memcpy(big, "BIG=", 4);
    memset(big + 4, 'v', KENV_MAX_VALUE + 1);
    big[KENV_MAX_VALUE + 5] = '\0';
    assert_int_equal(kenv_check_entry(&b, "--env", big, err, sizeof err), -1);
    assert_non_null(strstr(err, "limit 32768 bytes per value"));
    big[KENV_MAX_VALUE + 4] = '\0'; /* exactly at the limit */
    kenv_budget t = {0, 0};
    for (int i = 0; i < 7; i++)
        assert_int_equal(kenv_check_entry(&t, "env", big, err, sizeof err), 0);
    assert_int_equal(kenv_check_entry(&t, "env", big, err, sizeof err), -1);
    assert_non_null(strstr(err, "limit 256 KiB"));
    free(big);
    kenv_budget c = {0, 0};
    for (int i = 0; i < KENV_MAX_VARS; i++)
        assert_int_equal(kenv_check_entry(&c, "env", "V=1", err, sizeof err), 0);
    assert_int_equal(kenv_check_entry(&c, "env", "V=1", err, sizeof err), -1);
    assert_non_null(strstr(err, "too many variables (limit 64)"));
}

static void host_allow_list(void **state)
{
    (void)state;
    assert_true(kenv_host_allowed("LANG=C.UTF-8"));
    assert_true(kenv_host_allowed("LC_ALL=en_US.UTF-8"));
    assert_true(kenv_host_allowed("LANGUAGE=en"));
    assert_true(kenv_host_allowed("TERM=xterm-256color"));
    assert_true(kenv_host_allowed("TZ=Europe/Paris"));
    assert_false(kenv_host_allowed("LC_=x"));
    assert_false(kenv_host_allowed("LC_X-Y=x"));
    assert_false(kenv_host_allowed("PATH=/usr/bin"));
    assert_false(kenv_host_allowed("HOME=/root"));
    assert_false(kenv_host_allowed("AWS_SECRET_ACCESS_KEY=x"));
    assert_false(kenv_host_allowed("LD_PRELOAD=/x.so"));
    assert_false(kenv_host_allowed("TERM=a\033]52;c;x\007"));
    assert_false(kenv_host_allowed("LANGX=1"));
    assert_false(kenv_host_allowed("TZ"));
    char big[KENV_MAX_HOST_VALUE + 8] = "TZ=";
    memset(big + 3, 'a', KENV_MAX_HOST_VALUE + 1);
    big[KENV_MAX_HOST_VALUE + 4] = '\0';
    assert_false(kenv_host_allowed(big));
    big[KENV_MAX_HOST_VALUE + 3] = '\0';
    assert_true(kenv_host_allowed(big));
}

static void json_objects_and_config(void **state)
{
    (void)state;
    km_err err = {0};
    json_t *ok = json_pack("{s:s s:s}", "A", "1", "B", "");
    assert_int_equal(kenv_check_object(NULL, "env", ok, err.msg, sizeof err.msg), 0);
    json_t *bad = json_pack("{s:i}", "A", 1);
    assert_int_equal(kenv_check_object(NULL, "env", bad, err.msg, sizeof err.msg), -1);
    assert_non_null(strstr(err.msg, "must be a string"));
    json_t *arr = json_array();
    assert_int_equal(kenv_check_object(NULL, "env", arr, err.msg, sizeof err.msg), -1);
    assert_non_null(strstr(err.msg, "must be an object"));

    kmcfg c;
    kmcfg_defaults(&c);
    json_t *cfg = json_pack("{s:O}", "env", ok);
    assert_int_equal(kmcfg_apply_json(&c, cfg, &err), 0);
    assert_true(json_equal(c.env, ok));
    assert_int_equal(kmcfg_apply_json(&c, cfg, &err), 0); /* replaces, no leak */
    json_t *badcfg = json_pack("{s:{s:s}}", "env", "1X", "y");
    assert_int_equal(kmcfg_apply_json(&c, badcfg, &err), -1);
    assert_non_null(strstr(err.msg, "env: invalid variable name '1X'"));
    assert_true(json_equal(c.env, ok)); /* the earlier value stays */
    kmcfg_clear(&c);
    assert_null(c.env);
    kmcfg_clear(&c);
    json_decref(ok);
    json_decref(bad);
    json_decref(arr);
    json_decref(cfg);
    json_decref(badcfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names),
        cmocka_unit_test(entries_and_limits),
        cmocka_unit_test(host_allow_list),
        cmocka_unit_test(json_objects_and_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
