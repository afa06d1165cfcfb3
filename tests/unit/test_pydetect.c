/*
 * test_pydetect.c — Python detection helpers and the Python worker spec.
 * Fake interpreters are small shell scripts that answer the probe.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/python/pydetect.h"
#include "kernels/python/pykernel.h"

static char tmpdir[64];

static int setup(void **state)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_pydetect.XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes an executable file tmpdir/rel with content; returns its path. */
static const char *write_script(const char *rel, const char *content)
{
    static char path[PATH_MAX];
    char dir[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", tmpdir, rel);
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + strlen(tmpdir) + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    }
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    chmod(path, 0755);
    return path;
}

static void test_parse_version(void **state)
{
    int a, b, c;
    assert_int_equal(pydetect_parse_version("3.11.2", &a, &b, &c), 0);
    assert_int_equal(a, 3);
    assert_int_equal(b, 11);
    assert_int_equal(c, 2);
    assert_int_equal(pydetect_parse_version("3.12.0rc1", &a, &b, &c), 0);
    assert_int_equal(b, 12);
    assert_int_equal(c, 0);
    assert_int_equal(pydetect_parse_version("3.8", &a, &b, &c), 0);
    assert_int_equal(c, 0);
    assert_int_equal(pydetect_parse_version("3", &a, &b, &c), -1);
    assert_int_equal(pydetect_parse_version("", &a, &b, &c), -1);
    assert_int_equal(pydetect_parse_version(NULL, &a, &b, &c), -1);
    assert_int_equal(pydetect_parse_version("x.1", &a, &b, &c), -1);
    assert_int_equal(pydetect_parse_version("3.99999999999", &a, &b, &c), -1);
}

static void test_version_ok(void **state)
{
    assert_true(pydetect_version_ok(3, 8));
    assert_true(pydetect_version_ok(3, 13));
    assert_true(pydetect_version_ok(4, 0));
    assert_false(pydetect_version_ok(3, 7));
    assert_false(pydetect_version_ok(2, 7));
}

static void test_which(void **state)
{
    char path_env[PATH_MAX * 2], want[PATH_MAX];
    write_script("a/notexec", "x");
    chmod(write_script("a/notexec", "x"), 0644);
    write_script("b/mypy", "#!/bin/sh\n");
    snprintf(path_env, sizeof path_env, "%s/a:%s/nonexistent:%s/b", tmpdir, tmpdir, tmpdir);
    snprintf(want, sizeof want, "%s/b/mypy", tmpdir);
    char *got = pydetect_which("mypy", path_env);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    assert_null(pydetect_which("notexec", path_env));
    assert_null(pydetect_which("missing", path_env));
    assert_null(pydetect_which("mypy", NULL));
    assert_null(pydetect_which("", path_env));
    got = pydetect_which(want, NULL);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_parse_probe(void **state)
{
    pydetect_info info = {0};
    char err[512];
    /* A shim: sys.executable names another (real, executable) file. */
    const char *real = write_script("versions/3.11.7/bin/python3.11", "#!/bin/sh\n");
    char real_copy[PATH_MAX], json[PATH_MAX * 2];
    snprintf(real_copy, sizeof real_copy, "%s", real);
    snprintf(
        json, sizeof json,
        "{\"executable\": \"%s\", \"version\": \"3.11.7\", \"version_full\": \"3.11.7 (main)\","
        " \"prefix\": \"/p\", \"base_prefix\": \"/p\", \"implementation\": \"cpython\"}",
        real_copy);
    assert_int_equal(pydetect_parse_probe("/shims/python3", json, &info, err, sizeof err), 0);
    assert_string_equal(info.interpreter, real_copy);
    assert_string_equal(info.version, "3.11.7");
    assert_int_equal(info.minor, 11);
    assert_false(info.is_venv);
    pydetect_info_clear(&info);
    assert_null(info.interpreter);

    /* A venv: prefix differs from base_prefix. */
    snprintf(json, sizeof json,
             "{\"executable\": \"%s\", \"version\": \"3.9.1\", \"prefix\": \"/ws/.venv\","
             " \"base_prefix\": \"/usr\"}",
             real_copy);
    assert_int_equal(pydetect_parse_probe("/ws/.venv/bin/python", json, &info, err, sizeof err), 0);
    assert_true(info.is_venv);
    assert_string_equal(info.version_full, "3.9.1");
    assert_string_equal(info.implementation, "cpython");
    pydetect_info_clear(&info);

    /* Empty executable: the candidate itself. */
    assert_int_equal(pydetect_parse_probe("/x/python",
                                          "{\"executable\": \"\", \"version\": "
                                          "\"3.10.0\", \"prefix\": \"/x\", "
                                          "\"base_prefix\": \"/x\"}",
                                          &info, err, sizeof err),
                     0);
    assert_string_equal(info.interpreter, "/x/python");
    pydetect_info_clear(&info);

    assert_int_equal(pydetect_parse_probe("/x/python", "hello", &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "is it Python?"));
    assert_int_equal(
        pydetect_parse_probe("/x/python", "{\"version\": \"3.10.0\"}", &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "incomplete"));
    assert_int_equal(pydetect_parse_probe("/x/python", NULL, &info, err, sizeof err), -1);
}

static void test_probe_real_python(void **state)
{
    pydetect_info info = {0};
    char err[512];
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, &info, err, sizeof err), 0);
    assert_int_equal(info.major, 3);
    assert_true(info.minor >= 8);
    assert_string_equal(info.prefix, "/usr");
    assert_false(info.is_venv);
    assert_string_equal(info.implementation, "cpython");
    pydetect_info_clear(&info);
}

static void test_probe_shim_script(void **state)
{
    /* pyenv-style: a shell script that execs the real interpreter. */
    pydetect_info info = {0};
    char err[512];
    const char *shim = write_script("shims/python3", "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n");
    assert_int_equal(pydetect_probe(shim, NULL, &info, err, sizeof err), 0);
    assert_string_equal(info.interpreter, "/usr/bin/python3");
    char *real = realpath("/usr/bin/python3", NULL);
    assert_string_equal(info.real_executable, real);
    free(real);
    pydetect_info_clear(&info);
}

static void test_probe_failures(void **state)
{
    pydetect_info info = {0};
    char err[512];
    const char *old = write_script(
        "old/python", "#!/bin/sh\necho '{\"executable\": \"\", \"version\": \"3.7.3\", "
                      "\"prefix\": \"/o\", \"base_prefix\": \"/o\"}'\n");
    char want[PATH_MAX + 128];
    snprintf(want, sizeof want,
             "python 3.7.3 at %s/old/python is too old: kernelmgr needs Python >= 3.8", tmpdir);
    assert_int_equal(pydetect_probe(old, NULL, &info, err, sizeof err), -1);
    assert_string_equal(err, want);
    assert_null(info.interpreter);

    const char *bad = write_script("bad/python", "#!/bin/sh\necho boom >&2\nexit 3\n");
    assert_int_equal(pydetect_probe(bad, NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "exit status 3"));
    assert_non_null(strstr(err, "boom"));

    const char *notpy = write_script("np/python", "#!/bin/sh\necho hello\n");
    assert_int_equal(pydetect_probe(notpy, NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "is it Python?"));

    assert_int_equal(pydetect_probe("/nonexistent/python3", NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "python not found at /nonexistent/python3"));
    assert_int_equal(pydetect_probe(tmpdir, NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "not an executable file"));
}

static void test_find_order(void **state)
{
    pydetect_info info = {0};
    char err[1024], ws[PATH_MAX], venv[PATH_MAX], path_env[PATH_MAX];
    const char *shim = "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n";
    write_script("ws/.venv/bin/python", shim);
    write_script("venv2/bin/python", shim);
    write_script("pathdir/python3", shim);
    snprintf(ws, sizeof ws, "%s/ws", tmpdir);
    snprintf(venv, sizeof venv, "%s/venv2", tmpdir);
    snprintf(path_env, sizeof path_env, "%s/pathdir", tmpdir);

    pydetect_sources src = {NULL, NULL, ws, venv, path_env};
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, ".venv");
    pydetect_info_clear(&info);

    src.workspace = tmpdir; /* no .venv there */
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, "$VIRTUAL_ENV");
    pydetect_info_clear(&info);

    src.virtual_env = "/nonexistent-venv";
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, "PATH");
    pydetect_info_clear(&info);

    src.env_python = "/usr/bin/python3";
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, "$KERNELMGR_PYTHON");
    pydetect_info_clear(&info);

    src.explicit_path = "python3"; /* a bare name: looked up on PATH */
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, "--python");
    pydetect_info_clear(&info);

    /* An explicit choice that fails is final. */
    src.explicit_path = "/nonexistent/python";
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_string_equal(err, "--python: python not found at /nonexistent/python (missing or not "
                             "executable)");
    src.explicit_path = NULL;
    src.env_python = "nosuchpython";
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_string_equal(err, "$KERNELMGR_PYTHON: no executable named nosuchpython on PATH");

    /* Nothing at all. */
    pydetect_sources none = {NULL, "", tmpdir, NULL, "/nonexistent"};
    assert_int_equal(pydetect_find(&none, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "no Python interpreter found"));
    assert_non_null(strstr(err, "--python PATH"));
}

static void test_kernel_info(void **state)
{
    pydetect_info info = {0};
    char err[512];
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, &info, err, sizeof err), 0);
    info.source = "PATH";
    json_t *ki = pykernel_kernel_info(&info);
    assert_non_null(ki);
    json_t *li = json_object_get(ki, "language_info");
    assert_string_equal(json_string_value(json_object_get(li, "name")), "python");
    assert_string_equal(json_string_value(json_object_get(li, "version")), info.version);
    assert_string_equal(json_string_value(json_object_get(li, "mimetype")), "text/x-python");
    assert_string_equal(json_string_value(json_object_get(li, "file_extension")), ".py");
    assert_string_equal(json_string_value(json_object_get(li, "pygments_lexer")), "ipython3");
    assert_string_equal(json_string_value(json_object_get(li, "nbconvert_exporter")), "python");
    json_t *cm = json_object_get(li, "codemirror_mode");
    assert_string_equal(json_string_value(json_object_get(cm, "name")), "ipython");
    assert_int_equal(json_integer_value(json_object_get(cm, "version")), 3);
    assert_string_equal(json_string_value(json_object_get(ki, "implementation")), "kernelmgr");
    assert_non_null(strstr(json_string_value(json_object_get(ki, "banner")), "/usr/bin/python3"));
    json_t *in = json_object_get(ki, "interpreter");
    assert_string_equal(json_string_value(json_object_get(in, "path")), "/usr/bin/python3");
    assert_string_equal(json_string_value(json_object_get(in, "source")), "PATH");
    assert_true(json_is_false(json_object_get(in, "venv")));
    json_decref(ki);
    pydetect_info_clear(&info);
}

static void test_fill_spec(void **state)
{
    pydetect_info info = {0};
    kworker_spec spec = {0};
    char err[512], share[PATH_MAX], ws[PATH_MAX], driver[PATH_MAX + 32];
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, &info, err, sizeof err), 0);
    info.source = "PATH";
    snprintf(share, sizeof share, "%s/share", tmpdir);
    snprintf(ws, sizeof ws, "%s/ws", tmpdir);
    mkdir(ws, 0755);

    /* Driver missing: a clear error. */
    assert_int_equal(pykernel_fill_spec(&info, share, ws, "/bin", &spec, err, sizeof err), -1);
    assert_non_null(strstr(err, "python driver not found at"));
    kspec_clear(&spec);

    write_script("share/python/driver.py", "# driver\n");
    assert_int_equal(pykernel_fill_spec(&info, share, ws, "/bin", &spec, err, sizeof err), 0);
    snprintf(driver, sizeof driver, "%s/python/driver.py", share);
    assert_string_equal(spec.argv[0], "/usr/bin/python3");
    /* no -u: the driver buffers stdout itself (driver.py, output buffering) */
    assert_string_equal(spec.argv[1], driver);
    assert_null(spec.argv[2]);
    assert_string_equal(spec.env[0], "PATH=/usr/bin:/bin");
    /* /usr is bound by the sandbox anyway: only the driver's directory. */
    char want_ro[PATH_MAX + 16];
    snprintf(want_ro, sizeof want_ro, "%s/python", share);
    assert_string_equal(spec.ro_paths[0], want_ro);
    assert_null(spec.ro_paths[1]);
    assert_non_null(spec.kernel_info);
    kspec_clear(&spec);

    /* A venv outside /usr: its prefix is bound; one inside the workspace is not. */
    free(info.prefix);
    info.prefix = strdup(tmpdir);
    info.is_venv = 1;
    assert_int_equal(pykernel_fill_spec(&info, share, ws, NULL, &spec, err, sizeof err), 0);
    assert_string_equal(spec.ro_paths[0], tmpdir); /* covers the driver directory */
    assert_null(spec.ro_paths[1]);
    char want_env[PATH_MAX + 16];
    snprintf(want_env, sizeof want_env, "VIRTUAL_ENV=%s", tmpdir);
    assert_string_equal(spec.env[1], want_env);
    kspec_clear(&spec);
    free(info.prefix);
    info.prefix = strdup(ws);
    assert_int_equal(pykernel_fill_spec(&info, share, ws, NULL, &spec, err, sizeof err), 0);
    assert_string_equal(spec.ro_paths[0], want_ro);
    assert_null(spec.ro_paths[1]);
    kspec_clear(&spec);
    pydetect_info_clear(&info);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_version),
        cmocka_unit_test(test_version_ok),
        cmocka_unit_test(test_which),
        cmocka_unit_test(test_parse_probe),
        cmocka_unit_test(test_probe_real_python),
        cmocka_unit_test(test_probe_shim_script),
        cmocka_unit_test(test_probe_failures),
        cmocka_unit_test(test_find_order),
        cmocka_unit_test(test_kernel_info),
        cmocka_unit_test(test_fill_spec),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
