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

/* Creates tmpdir/rel (and parents); returns its path (static buffer). */
static const char *mkdir_p(const char *rel)
{
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s/", tmpdir, rel);
    for (char *p = path + strlen(tmpdir) + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    }
    path[strlen(path) - 1] = '\0';
    return path;
}

static void symlink_at(const char *target, const char *rel)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", tmpdir, rel);
    unlink(path);
    assert_int_equal(symlink(target, path), 0);
}

/* 1 when tmpdir/rel exists. */
static int exists(const char *rel)
{
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", tmpdir, rel);
    return lstat(path, &st) == 0;
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

    /* Empty, "." and relative entries would mean the cwd: never searched. */
    char *cwd = getcwd(NULL, 0);
    char bdir[PATH_MAX];
    snprintf(bdir, sizeof bdir, "%s/b", tmpdir);
    assert_int_equal(chdir(bdir), 0);
    assert_null(pydetect_which("mypy", ""));
    assert_null(pydetect_which("mypy", ":/nonexistent"));
    assert_null(pydetect_which("mypy", "/nonexistent::"));
    assert_null(pydetect_which("mypy", ".:./:b"));
    assert_int_equal(chdir(cwd), 0);
    free(cwd);
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
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, NULL, &info, err, sizeof err), 0);
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
    assert_int_equal(pydetect_probe(shim, NULL, NULL, &info, err, sizeof err), 0);
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
    assert_int_equal(pydetect_probe(old, NULL, NULL, &info, err, sizeof err), -1);
    assert_string_equal(err, want);
    assert_null(info.interpreter);

    const char *bad = write_script("bad/python", "#!/bin/sh\necho boom >&2\nexit 3\n");
    assert_int_equal(pydetect_probe(bad, NULL, NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "exit status 3"));
    assert_non_null(strstr(err, "boom"));

    const char *notpy = write_script("np/python", "#!/bin/sh\necho hello\n");
    assert_int_equal(pydetect_probe(notpy, NULL, NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "is it Python?"));

    assert_int_equal(pydetect_probe("/nonexistent/python3", NULL, NULL, &info, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "python not found at /nonexistent/python3"));
    assert_int_equal(pydetect_probe(tmpdir, NULL, NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "not an executable file"));
}

static void test_find_order(void **state)
{
    pydetect_info info = {0};
    char err[1024], ws[PATH_MAX], venv[PATH_MAX], path_env[PATH_MAX];
    const char *shim = "#!/bin/sh\nexec /usr/bin/python3 \"$@\"\n";
    /* A workspace venv as `python3 -m venv` / uv make it: never run on the
     * host, its base (pyvenv.cfg's home) is. */
    write_script("ws/.venv/pyvenv.cfg", "home = /usr/bin\ninclude-system-site-packages = false\n");
    mkdir_p("ws/.venv/bin");
    symlink_at("/usr/bin/python3", "ws/.venv/bin/python");
    write_script("venv2/bin/python", shim);
    write_script("pathdir/python3", shim);
    snprintf(ws, sizeof ws, "%s/ws", tmpdir);
    snprintf(venv, sizeof venv, "%s/venv2", tmpdir);
    snprintf(path_env, sizeof path_env, "%s/pathdir", tmpdir);

    pydetect_sources src = {NULL, NULL, ws, venv, path_env};
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, ".venv");
    assert_true(info.is_venv);
    assert_true(info.workspace_venv);
    char want[PATH_MAX + 32];
    snprintf(want, sizeof want, "%s/.venv/bin/python", ws);
    assert_string_equal(info.interpreter, want);
    snprintf(want, sizeof want, "%s/.venv", ws);
    assert_string_equal(info.prefix, want);
    assert_string_equal(info.base_prefix, "/usr");
    char *real = realpath("/usr/bin/python3", NULL);
    assert_string_equal(info.real_executable, real);
    free(real);
    pydetect_info_clear(&info);

    src.workspace = mkdir_p("ws-empty"); /* no .venv there */
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
    assert_string_equal(
        err, "$KERNELMGR_PYTHON: no executable named nosuchpython on PATH (outside the workspace)");

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
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, NULL, &info, err, sizeof err), 0);
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
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, NULL, &info, err, sizeof err), 0);
    info.source = "PATH";
    snprintf(share, sizeof share, "%s/share", tmpdir);
    snprintf(ws, sizeof ws, "%s/ws", tmpdir);
    mkdir(ws, 0755);

    /* Driver missing: a clear error. */
    assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), -1);
    assert_non_null(strstr(err, "python driver not found at"));
    kspec_clear(&spec);

    write_script("share/python/driver.py", "# driver\n");
    assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), 0);
    snprintf(driver, sizeof driver, "%s/python/driver.py", share);
    assert_string_equal(spec.argv[0], "/usr/bin/python3");
    /* no -u: the driver buffers stdout itself (driver.py, output buffering);
     * run through the boot program that uses its precompiled code (pykernel.h) */
    assert_string_equal(spec.argv[1], "-c");
    assert_string_equal(spec.argv[2], PYKERNEL_BOOT);
    assert_string_equal(spec.argv[3], driver);
    assert_null(spec.argv[4]);
    /* the interpreter's directory first, then the fixed sandbox PATH, never the host's */
    assert_string_equal(spec.env[0], "PATH=/usr/bin:/usr/local/bin:/usr/bin:/bin");
    /* /usr is bound by the sandbox anyway: only the driver's directory. */
    char want_ro[PATH_MAX + 16];
    snprintf(want_ro, sizeof want_ro, "%s/python", share);
    assert_string_equal(spec.ro_paths[0], want_ro);
    assert_null(spec.ro_paths[1]);
    assert_non_null(spec.kernel_info);
    kspec_clear(&spec);

    /* A venv outside /usr: its prefix is bound; one inside the workspace is
     * refused (a probe never reports one: only a workspace venv, below). */
    char lib[PATH_MAX + 32];
    snprintf(lib, sizeof lib, "lib/python%d.%d", info.major, info.minor);
    mkdir_p(lib);
    free(info.prefix);
    info.prefix = strdup(tmpdir);
    info.is_venv = 1;
    assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), 0);
    assert_string_equal(spec.ro_paths[0], tmpdir); /* covers the driver directory */
    assert_null(spec.ro_paths[1]);
    char want_env[PATH_MAX + 64];
    snprintf(want_env, sizeof want_env, "VIRTUAL_ENV=%s", tmpdir);
    assert_string_equal(spec.env[1], want_env);
    kspec_clear(&spec);
    free(info.prefix);
    info.prefix = strdup(ws);
    assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), -1);
    assert_non_null(strstr(err, "is inside the workspace"));
    assert_null(spec.ro_paths[0]);
    kspec_clear(&spec);

    /* Forged prefixes are never bound: "/", a host directory that is not
     * where the interpreter lives, a path that is not normalised. */
    const char *forged[] = {"/", "/etc", "/root", "/usr/../etc", "relative", "/nonexistent"};
    for (size_t i = 0; i < sizeof forged / sizeof *forged; i++) {
        free(info.prefix);
        info.prefix = strdup(forged[i]);
        assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), -1);
        assert_non_null(strstr(err, "refusing its description"));
        assert_null(spec.ro_paths[0]);
        kspec_clear(&spec);
        free(info.prefix);
        info.prefix = strdup("/usr");
        free(info.base_prefix);
        info.base_prefix = strdup(forged[i]);
        assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), -1);
        assert_null(spec.ro_paths[0]);
        kspec_clear(&spec);
        free(info.base_prefix);
        info.base_prefix = strdup("/usr");
    }

    /* A workspace venv: the worker runs its bin/python (in the sandbox);
     * nothing of the workspace is bound, the base's prefix is (/usr: already). */
    char wsvenv[PATH_MAX + 16], wspy[PATH_MAX + 32];
    snprintf(wsvenv, sizeof wsvenv, "%s/.venv", ws);
    snprintf(wspy, sizeof wspy, "%s/bin/python", wsvenv);
    free(info.prefix);
    info.prefix = strdup(wsvenv);
    free(info.interpreter);
    info.interpreter = strdup(wspy);
    info.workspace_venv = 1;
    assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), 0);
    assert_string_equal(spec.argv[0], wspy);
    assert_string_equal(spec.ro_paths[0], want_ro);
    assert_null(spec.ro_paths[1]);
    snprintf(want_env, sizeof want_env, "VIRTUAL_ENV=%s", wsvenv);
    assert_string_equal(spec.env[1], want_env);
    kspec_clear(&spec);
    /* ...but a workspace venv whose prefix is outside the workspace is not. */
    free(info.prefix);
    info.prefix = strdup("/etc");
    assert_int_equal(pykernel_fill_spec(&info, share, ws, &spec, err, sizeof err), -1);
    kspec_clear(&spec);
    pydetect_info_clear(&info);
}

static void test_pyvenv_home(void **state)
{
    char *h = pydetect_pyvenv_home("home = /usr/bin\nversion = 3.11.2\n");
    assert_string_equal(h, "/usr/bin");
    free(h);
    h = pydetect_pyvenv_home("  HOME\t=  /opt/py/bin \r\nhome=/last\n");
    assert_string_equal(h, "/last"); /* the last one wins, as in site.py */
    free(h);
    h = pydetect_pyvenv_home("homer = /x\n# home\n");
    assert_null(h);
    assert_null(pydetect_pyvenv_home(""));
}

/* Each of these workspace venvs is refused with a reason naming the venv,
 * and nothing in the workspace ever runs on the host (the marker). */
static void test_workspace_venv_attacks(void **state)
{
    pydetect_info info = {0};
    char err[2048], mark[PATH_MAX], script[PATH_MAX * 2];
    const char *ws = strdup(mkdir_p("wsa"));
    snprintf(mark, sizeof mark, "%s/pwned", tmpdir);
    snprintf(script, sizeof script, "#!/bin/sh\ntouch '%s'\nexec /usr/bin/python3 \"$@\"\n", mark);
    pydetect_sources src = {NULL, NULL, ws, NULL, "/usr/bin:/bin"};

    /* (1) a script as .venv/bin/python, no pyvenv.cfg */
    write_script("wsa/.venv/bin/python", script);
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "workspace venv"));
    assert_non_null(strstr(err, "/wsa/.venv"));
    assert_non_null(strstr(err, "pyvenv.cfg: missing"));
    assert_null(info.interpreter);
    assert_false(exists("pwned"));

    /* (2) with a valid pyvenv.cfg the venv is accepted, and the script is
     * what the sandbox will run: still not run here. */
    write_script("wsa/.venv/pyvenv.cfg", "home = /usr/bin\n");
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_true(info.workspace_venv);
    assert_string_equal(info.base_prefix, "/usr");
    pydetect_info_clear(&info);
    assert_false(exists("pwned"));

    /* (3) forged homes: a host directory without python, a relative one,
     * one in the workspace (even holding a real ELF python), none at all */
    const char *bad_cfgs[][2] = {
        {"home = /etc\n", "/etc/python3 is not an ELF executable"},
        {"home = /root\n", "no base interpreter"},
        {"home = usr/bin\n", "not an absolute path"},
        {"version = 3.11\n", "has no \"home\""},
    };
    for (size_t i = 0; i < sizeof bad_cfgs / sizeof *bad_cfgs; i++) {
        write_script("wsa/.venv/pyvenv.cfg", bad_cfgs[i][0]);
        assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
        if (!strstr(err, bad_cfgs[i][1]))
            fail_msg("%s: %s", bad_cfgs[i][0], err);
        assert_non_null(strstr(err, "workspace venv"));
    }
    char cfg[PATH_MAX + 32], cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s/hb' && cp /usr/bin/python3 '%s/hb/python3'", ws, ws);
    assert_int_equal(system(cmd), 0);
    snprintf(cfg, sizeof cfg, "home = %s/hb\n", ws);
    write_script("wsa/.venv/pyvenv.cfg", cfg);
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "inside the workspace"));
    /* a home outside the workspace that is a symlink into it */
    symlink_at(ws, "ws-link");
    snprintf(cfg, sizeof cfg, "home = %s/ws-link/hb\n", tmpdir);
    write_script("wsa/.venv/pyvenv.cfg", cfg);
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "inside the workspace"));
    /* a script (not ELF) as the base */
    write_script("hs/python3", script);
    snprintf(cfg, sizeof cfg, "home = %s/hs\n", tmpdir);
    write_script("wsa/.venv/pyvenv.cfg", cfg);
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "not an ELF executable"));

    /* (4) pyvenv.cfg as a symlink to a host file, a FIFO, too large */
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/.venv/pyvenv.cfg", ws);
    unlink(p);
    assert_int_equal(symlink("/etc/hostname", p), 0);
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "symbolic link"));
    unlink(p);
    assert_int_equal(mkfifo(p, 0644), 0);
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "not a regular file"));
    unlink(p);
    char *big = malloc(PYDETECT_PYVENV_MAX + 64);
    memset(big, '#', PYDETECT_PYVENV_MAX + 63);
    memcpy(big, "home = /usr/bin\n", 16);
    big[PYDETECT_PYVENV_MAX + 63] = '\0';
    write_script("wsa/.venv/pyvenv.cfg", big);
    free(big);
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "larger than"));

    /* (5) .venv itself a symlink (to a real venv outside): refused */
    write_script("outvenv/pyvenv.cfg", "home = /usr/bin\n");
    mkdir_p("outvenv/bin");
    symlink_at("/usr/bin/python3", "outvenv/bin/python");
    snprintf(cmd, sizeof cmd, "rm -rf '%s/.venv'", ws);
    assert_int_equal(system(cmd), 0);
    char outv[PATH_MAX];
    snprintf(outv, sizeof outv, "%s/outvenv", tmpdir);
    symlink_at(outv, "wsa/.venv");
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "symbolic link"));
    assert_false(exists("pwned"));
    free((char *)ws);
}

/* Explicit or PATH-found interpreters inside the workspace never run. */
static void test_workspace_interpreters_refused(void **state)
{
    pydetect_info info = {0};
    char err[2048], mark[PATH_MAX], script[PATH_MAX * 2], path[PATH_MAX * 2];
    const char *ws = strdup(mkdir_p("wsb"));
    snprintf(mark, sizeof mark, "%s/pwned-b", tmpdir);
    snprintf(script, sizeof script, "#!/bin/sh\ntouch '%s'\nexec /usr/bin/python3 \"$@\"\n", mark);
    write_script("wsb/tools/python3", script);
    char tool[PATH_MAX + 32];
    snprintf(tool, sizeof tool, "%s/tools/python3", ws);

    pydetect_sources src = {tool, NULL, ws, NULL, "/usr/bin:/bin"};
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "--python: "));
    assert_non_null(strstr(err, "is inside the workspace"));
    src.explicit_path = NULL;
    src.env_python = tool;
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "$KERNELMGR_PYTHON: "));
    /* even when named through a symlink outside the workspace */
    symlink_at(tool, "tool-link");
    snprintf(path, sizeof path, "%s/tool-link", tmpdir);
    src.env_python = path;
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "inside the workspace"));
    assert_int_equal(pydetect_probe(path, ws, NULL, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "never run on the host"));

    /* PATH entries in the workspace, empty and relative ones are skipped:
     * python3 is the host's, even with the cwd in the workspace. */
    char *cwd = getcwd(NULL, 0);
    snprintf(path, sizeof path, ":.:tools:%s/tools:/usr/bin", ws);
    assert_int_equal(chdir(tool[0] ? ws : "/"), 0);
    write_script("wsb/python3", script);
    src.env_python = NULL;
    src.path_env = path;
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, "PATH");
    assert_true(strncmp(info.interpreter, "/usr/", 5) == 0);
    pydetect_info_clear(&info);
    src.explicit_path = "python3";
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_true(strncmp(info.interpreter, "/usr/", 5) == 0);
    pydetect_info_clear(&info);
    assert_int_equal(chdir(cwd), 0);
    free(cwd);

    /* --python naming a workspace venv's bin/python, and $VIRTUAL_ENV
     * inside the workspace: handled as workspace venvs (sandbox only). */
    write_script("wsb/env/pyvenv.cfg", "home = /usr/bin\n");
    mkdir_p("wsb/env/bin");
    symlink_at("/usr/bin/python3", "wsb/env/bin/python");
    snprintf(path, sizeof path, "%s/env/bin/python", ws);
    src.explicit_path = path;
    src.path_env = "/usr/bin";
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, "--python");
    assert_true(info.workspace_venv);
    assert_string_equal(info.interpreter, path);
    pydetect_info_clear(&info);
    char venv[PATH_MAX + 8];
    snprintf(venv, sizeof venv, "%s/env", ws);
    src.explicit_path = NULL;
    src.virtual_env = venv;
    assert_int_equal(pydetect_find(&src, &info, err, sizeof err), 0);
    assert_string_equal(info.source, "$VIRTUAL_ENV");
    assert_true(info.workspace_venv);
    assert_string_equal(info.prefix, venv);
    pydetect_info_clear(&info);
    assert_false(exists("pwned-b"));
    free((char *)ws);
}

/* The host-side probe: -I -S, cwd "/", scrubbed environment. Planted
 * modules in the cwd or on PYTHONPATH and LD_PRELOAD are not used. */
static void test_probe_isolation(void **state)
{
    pydetect_info info = {0};
    char err[1024], mark[PATH_MAX], mod[PATH_MAX * 2], cache[PATH_MAX];
    snprintf(mark, sizeof mark, "%s/pwned-c", tmpdir);
    snprintf(mod, sizeof mod, "open('%s', 'w').write('x')\n", mark);
    write_script("plant/json.py", mod);
    write_script("plant/sitecustomize.py", mod);
    write_script("plant/usercustomize.py", mod);
    write_script("plant/encodings/__init__.py", mod);
    snprintf(cache, sizeof cache, "%s/cache-iso", tmpdir);
    setenv("XDG_CACHE_HOME", cache, 1); /* empty: a real probe runs */
    char *cwd = getcwd(NULL, 0);
    char plant[PATH_MAX + 8];
    snprintf(plant, sizeof plant, "%s/plant", tmpdir);
    assert_int_equal(chdir(plant), 0);
    setenv("PYTHONPATH", plant, 1);
    setenv("PYTHONHOME", plant, 1);
    setenv("PYTHONSTARTUP", plant, 1);
    setenv("LD_PRELOAD", "libnonexistent-h1.so", 1);
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, ":", &info, err, sizeof err), 0);
    assert_string_equal(info.prefix, "/usr");
    pydetect_info_clear(&info);
    unsetenv("PYTHONPATH");
    unsetenv("PYTHONHOME");
    unsetenv("PYTHONSTARTUP");
    unsetenv("LD_PRELOAD");
    assert_int_equal(chdir(cwd), 0);
    free(cwd);
    assert_false(exists("pwned-c"));

    setenv("PYTHONPATH", "/x", 1);
    setenv("LD_LIBRARY_PATH", ":/x", 1);
    char **env = pydetect_probe_env(":/usr/bin:.:rel::/bin:");
    assert_non_null(env);
    assert_string_equal(env[0], "PATH=/usr/bin:/bin");
    for (size_t i = 0; env[i]; i++) {
        assert_true(strncmp(env[i], "PYTHON", 6) != 0);
        assert_true(strncmp(env[i], "LD_", 3) != 0);
    }
    pydetect_free_env(env);
    env = pydetect_probe_env("::");
    assert_string_equal(env[0], "PATH=/usr/local/bin:/usr/bin:/bin");
    pydetect_free_env(env);
    unsetenv("PYTHONPATH");
    unsetenv("LD_LIBRARY_PATH");
    unsetenv("XDG_CACHE_HOME");
}

/* The probe cache: a forged entry (prefix /etc) is re-validated and
 * replaced; a cache directory that is a symlink is not used. */
static void test_probe_cache_poisoning(void **state)
{
    pydetect_info info = {0};
    char err[1024], cache[PATH_MAX], dir[PATH_MAX + 16], cmd[PATH_MAX * 3];
    snprintf(cache, sizeof cache, "%s/cache-p", tmpdir);
    setenv("XDG_CACHE_HOME", cache, 1);
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, NULL, &info, err, sizeof err), 0);
    pydetect_info_clear(&info);
    snprintf(dir, sizeof dir, "%s/kernelmgr", cache);
    /* forge: keep the key line, replace the value */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && f=$(ls pyprobe-* | head -1) && test -n \"$f\" && "
             "{ head -1 \"$f\"; printf '%%s' '{\"executable\": \"/usr/bin/python3\", \"version\": "
             "\"3.11.0\", \"prefix\": \"/etc\", \"base_prefix\": \"/etc\"}'; } > x && "
             "chmod 600 x && mv x \"$f\" && grep -q /etc \"$f\"",
             dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, NULL, &info, err, sizeof err), 0);
    assert_string_equal(info.prefix, "/usr");
    assert_string_equal(info.base_prefix, "/usr");
    pydetect_info_clear(&info);
    snprintf(cmd, sizeof cmd, "! grep -q /etc '%s'/pyprobe-*", dir);
    assert_int_equal(system(cmd), 0); /* rewritten with the real answer */

    /* a symlinked cache directory: never read or written */
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/c2' '%s/evil' && chmod 700 '%s/evil' && ln -s '%s/evil' "
             "'%s/c2/kernelmgr'",
             tmpdir, tmpdir, tmpdir, tmpdir, tmpdir);
    assert_int_equal(system(cmd), 0);
    snprintf(cache, sizeof cache, "%s/c2", tmpdir);
    setenv("XDG_CACHE_HOME", cache, 1);
    assert_int_equal(pydetect_probe("/usr/bin/python3", NULL, NULL, &info, err, sizeof err), 0);
    pydetect_info_clear(&info);
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/evil')\"", tmpdir);
    assert_int_equal(system(cmd), 0);
    unsetenv("XDG_CACHE_HOME");
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
        cmocka_unit_test(test_pyvenv_home),
        cmocka_unit_test(test_workspace_venv_attacks),
        cmocka_unit_test(test_workspace_interpreters_refused),
        cmocka_unit_test(test_probe_isolation),
        cmocka_unit_test(test_probe_cache_poisoning),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
