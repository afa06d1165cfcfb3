/* Unit tests of libkernelmgr's parts that need no daemon: base64, the home
 * resolved as the CLI resolves it (against kmcfg_home itself), the daemon
 * binary's lookup, options, the error convention, and the result and
 * file-list accessors on the daemon's JSON (tests/e2e/test_libkernelmgr.py
 * runs the library against a real daemon). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "libkernelmgr/klib_int.h"
#include "kernelmgr/engine/config.h"

static void b64_roundtrip(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } vec[] = {{"", ""},
               {"f", "Zg=="},
               {"fo", "Zm8="},
               {"foo", "Zm9v"},
               {"foob", "Zm9vYg=="},
               {"fooba", "Zm9vYmE="},
               {"foobar", "Zm9vYmFy"}};
    unsigned char buf[64];
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        char *e = klib_b64_encode(vec[i].in, strlen(vec[i].in));
        assert_string_equal(e, vec[i].out);
        free(e);
        long long n = klib_b64_decode(vec[i].out, strlen(vec[i].out), buf);
        assert_int_equal(n, (long long)strlen(vec[i].in));
        assert_memory_equal(buf, vec[i].in, (size_t)n);
    }
    unsigned char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    char *e = klib_b64_encode(all, sizeof all);
    unsigned char back[256];
    assert_int_equal(klib_b64_decode(e, strlen(e), back), 256);
    assert_memory_equal(all, back, 256);
    free(e);
}

static void b64_refuses(void **state)
{
    (void)state;
    unsigned char buf[64];
    const char *bad[] = {"Zg=",  "Zg",   "Z===", "Zm9v\n",   "Zm 9",
                         "Zh==", "Zm9=", "=Zm9", "Zg==Zg==", "Zm9v!A=="};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(klib_b64_decode(bad[i], strlen(bad[i]), buf), -1);
}

/* The library's home is the CLI's: kmcfg_home, made absolute. */
static void home_like_cli(void **state)
{
    (void)state;
    static const struct {
        const char *km, *xdg, *home;
    } envs[] = {{"/srv/km", "/x", "/h"},
                {NULL, "/xdg", "/h"},
                {NULL, NULL, "/home/u"},
                {"", "", "/home/v"},
                {"rel/home", NULL, "/h"}};
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        envs[i].km ? setenv("KERNELMGR_HOME", envs[i].km, 1) : unsetenv("KERNELMGR_HOME");
        envs[i].xdg ? setenv("XDG_STATE_HOME", envs[i].xdg, 1) : unsetenv("XDG_STATE_HOME");
        setenv("HOME", envs[i].home, 1);
        char cli[4096];
        assert_non_null(kmcfg_home(cli, sizeof cli));
        char *lib = klib_home_resolve(NULL, NULL);
        assert_non_null(lib);
        if (cli[0] == '/') {
            assert_string_equal(lib, cli);
        } else {
            char *cwd = getcwd(NULL, 0);
            char want[8192];
            snprintf(want, sizeof want, "%s/%s", cwd, cli);
            assert_string_equal(lib, want);
            free(cwd);
        }
        free(lib);
    }
    char *given = klib_home_resolve("/given", NULL);
    assert_string_equal(given, "/given");
    free(given);
    unsetenv("KERNELMGR_HOME");
}

static void daemon_lookup(void **state)
{
    (void)state;
    kernelmgr_error *e = NULL;
    setenv("KERNELMGR_BIN", "/nonexistent/kernelmgr", 1);
    assert_null(klib_find_daemon(NULL, &e));
    assert_int_equal(kernelmgr_error_code(e), KERNELMGR_EDAEMON);
    assert_non_null(strstr(kernelmgr_error_message(e), "KERNELMGR_BIN"));
    kernelmgr_error_free(e);
    /* the explicit path wins over the environment */
    e = NULL;
    char *p = klib_find_daemon("/bin/sh", &e);
    assert_string_equal(p, "/bin/sh");
    assert_null(e);
    free(p);
    assert_null(klib_find_daemon("/etc/passwd", &e)); /* not executable */
    kernelmgr_error_free(e);
    /* PATH: relative entries are skipped */
    char dir[] = "/tmp/klibXXXXXX";
    assert_non_null(mkdtemp(dir));
    char exe[64];
    snprintf(exe, sizeof exe, "%s/kernelmgr", dir);
    FILE *f = fopen(exe, "w");
    fputs("#!/bin/sh\n", f);
    fclose(f);
    chmod(exe, 0755);
    unsetenv("KERNELMGR_BIN");
    char path[256];
    snprintf(path, sizeof path, "relative:%s", dir);
    setenv("PATH", path, 1);
    e = NULL;
    p = klib_find_daemon(NULL, &e);
    /* this directory's, unless the build's BINDIR has an installed one */
    assert_non_null(p);
    assert_true(p[0] == '/' && strstr(p, "/kernelmgr"));
    if (strcmp(p, exe))
        assert_int_equal(access(p, X_OK), 0);
    free(p);
    kernelmgr_error_free(e);
    unlink(exe);
    rmdir(dir);
}

static void errors_and_options(void **state)
{
    (void)state;
    kernelmgr_error *e = (kernelmgr_error *)1;
    kernelmgr_options *o = kernelmgr_options_new();
    assert_int_equal(kernelmgr_options_set(o, "memory", "1G", &e), 0);
    assert_null(e); /* success clears *err */
    assert_int_equal(kernelmgr_options_set_number(o, "cpus", 1.5, NULL), 0);
    assert_int_equal(kernelmgr_options_set_number(o, "memory", 1 << 30, NULL), 0);
    assert_int_equal(kernelmgr_options_set_env(o, "A", "b", NULL), 0);
    assert_int_equal(kernelmgr_options_set_env(o, "C", "d", NULL), 0);
    char *s = json_dumps(o->obj, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(s,
                        "{\"cpus\":1.5,\"env\":{\"A\":\"b\",\"C\":\"d\"},\"memory\":1073741824}");
    free(s);
    assert_int_equal(kernelmgr_options_set(o, NULL, "x", &e), -1);
    assert_int_equal(kernelmgr_error_code(e), KERNELMGR_EUSAGE);
    assert_int_equal(kernelmgr_error_rpc_code(e), 0);
    kernelmgr_error_free(e);
    assert_int_equal(kernelmgr_options_set(o, "k", NULL, &e), -1);
    kernelmgr_error_free(e);
    /* not finite, or too large for an integer: never a cast out of range */
    assert_int_equal(kernelmgr_options_set_number(o, "cpus", 0.0 / 0.0, &e), -1);
    assert_int_equal(kernelmgr_error_code(e), KERNELMGR_EUSAGE);
    kernelmgr_error_free(e);
    assert_int_equal(kernelmgr_options_set_number(o, "cpus", 1.0 / 0.0, &e), -1);
    kernelmgr_error_free(e);
    assert_int_equal(kernelmgr_options_set_number(o, "big", 1e300, NULL), 0);
    assert_true(json_is_real(json_object_get(o->obj, "big")));
    assert_int_equal(kernelmgr_options_set_env(o, "", "x", &e), -1);
    kernelmgr_error_free(e);
    kernelmgr_options_free(o);
    kernelmgr_options_free(NULL);
    /* NULL everywhere is an error or nothing, never a crash */
    assert_null(kernelmgr_exec(NULL, "x", NULL, 0, 0, NULL, NULL, NULL));
    assert_int_equal(kernelmgr_session_interrupt(NULL, NULL), -1);
    assert_null(kernelmgr_call(NULL, "ping", NULL, &e));
    assert_int_equal(kernelmgr_error_code(e), KERNELMGR_EUSAGE);
    kernelmgr_error_free(e);
    assert_int_equal(kernelmgr_error_code(NULL), KERNELMGR_OK);
    kernelmgr_error_free(NULL);
    kernelmgr_session_free(NULL);
    kernelmgr_client_free(NULL);
    kernelmgr_result_free(NULL);
    kernelmgr_filelist_free(NULL);
    assert_string_equal(kernelmgr_version(), "0.1.0");
}

static kernelmgr_result *parse(const char *text, int one)
{
    return klib_result_new(json_loads(text, JSON_ALLOW_NUL, NULL), one, NULL);
}

static void result_accessors(void **state)
{
    (void)state;
    kernelmgr_result *r =
        parse("{\"results\":[{\"language\":\"python\",\"status\":\"error\",\"exit_code\":1,"
              "\"stdout\":\"a\\u0000b\",\"stderr\":\"\",\"result\":{\"text/plain\":\"42\","
              "\"application/json\":{\"k\":[1]}},\"displays\":[{\"text/html\":\"<i>x</i>\"}],"
              "\"error\":{\"name\":\"E\",\"value\":\"v\",\"traceback\":[\"l1\",\"l2\"]},"
              "\"files\":[{\"path\":\"p\",\"change\":\"created\"}]},{\"status\":\"ok\"}],"
              "\"failed\":true}",
              0);
    assert_non_null(r);
    assert_int_equal(kernelmgr_result_blocks(r), 2);
    assert_true(kernelmgr_result_failed(r));
    size_t n;
    assert_memory_equal(kernelmgr_result_stdout(r, 0, &n), "a\0b", 3);
    assert_int_equal(n, 3);
    assert_string_equal(kernelmgr_result_error_name(r, 0), "E");
    assert_string_equal(kernelmgr_result_traceback_line(r, 0, 1), "l2");
    assert_null(kernelmgr_result_traceback_line(r, 0, 2));
    assert_int_equal(kernelmgr_result_outputs(r, 0), 2);
    assert_false(kernelmgr_result_output_is_result(r, 0, 0));
    assert_true(kernelmgr_result_output_is_result(r, 0, 1));
    assert_string_equal(kernelmgr_result_output_data(r, 0, 1, "application/json", &n),
                        "{\"k\":[1]}");
    assert_int_equal(kernelmgr_result_output_mimes(r, 0, 1), 2);
    assert_null(kernelmgr_result_output_mime(r, 0, 1, 2));
    assert_string_equal(kernelmgr_result_file_change(r, 0, 0), "created");
    /* the JSON is as the daemon sent it, not flattened */
    assert_non_null(strstr(kernelmgr_result_json(r), "\"application/json\":{\"k\":[1]}"));
    /* block 1 has none of it; block 2 does not exist */
    assert_null(kernelmgr_result_error_name(r, 1));
    assert_int_equal(kernelmgr_result_exit_code(r, 1), -1);
    assert_int_equal(kernelmgr_result_outputs(r, 1), 0);
    assert_null(kernelmgr_result_stdout(r, 2, &n));
    assert_int_equal(n, 0);
    assert_null(kernelmgr_result_status(r, (size_t)-1));
    kernelmgr_result_free(r);

    kernelmgr_result *one = parse("{\"status\":\"ok\",\"stdout\":\"x\"}", 1);
    assert_int_equal(kernelmgr_result_blocks(one), 1);
    assert_string_equal(kernelmgr_result_stdout(one, 0, NULL), "x");
    kernelmgr_result_free(one);

    kernelmgr_error *e = NULL;
    assert_null(klib_result_new(json_loads("{\"results\":3}", 0, NULL), 0, &e));
    assert_int_equal(kernelmgr_error_code(e), KERNELMGR_EDAEMON);
    kernelmgr_error_free(e);
    /* wrong types read as absent */
    r = parse("{\"results\":[{\"status\":1,\"error\":[],\"displays\":{},\"files\":[3]}]}", 0);
    assert_null(kernelmgr_result_status(r, 0));
    assert_null(kernelmgr_result_error_name(r, 0));
    assert_int_equal(kernelmgr_result_outputs(r, 0), 0);
    assert_null(kernelmgr_result_file_path(r, 0, 0));
    kernelmgr_result_free(r);
}

static void rpc_error_codes(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        int code;
    } vec[] = {{"{\"code\":-32602}", KERNELMGR_EUSAGE},
               {"{\"code\":-32601}", KERNELMGR_EUSAGE},
               {"{\"code\":-32003}", KERNELMGR_ENOSESSION},
               {"{\"code\":-32005}", KERNELMGR_EDAEMON},
               {"{\"code\":-32602,\"data\":{\"km_code\":3}}", KERNELMGR_ENOSESSION},
               {"{\"code\":-32099,\"data\":{\"km_code\":\"x\"}}", 99},
               {"{\"code\":12}", KERNELMGR_EINTERNAL}};
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        json_t *e = json_loads(vec[i].json, 0, NULL);
        assert_int_equal(klib_error_code_of(e), vec[i].code);
        json_decref(e);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(b64_roundtrip),      cmocka_unit_test(b64_refuses),
        cmocka_unit_test(home_like_cli),      cmocka_unit_test(daemon_lookup),
        cmocka_unit_test(errors_and_options), cmocka_unit_test(result_accessors),
        cmocka_unit_test(rpc_error_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
