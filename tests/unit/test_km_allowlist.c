/*
 * test_km_allowlist.c — the package allowlist: configuration parsing and the
 * validation of install requests (kernelmgr/allowlist.c).
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

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <time.h>

#include "kernelmgr/packages/allowlist.h"

static allowlist *load(const char *text)
{
    json_error_t jerr;
    json_t *cfg = json_loads(text, 0, &jerr);
    assert_non_null(cfg);
    km_err err = {0};
    allowlist *al = allowlist_from_json(cfg, &err);
    json_decref(cfg);
    if (!al)
        print_message("allowlist error: %s\n", err.msg);
    return al;
}

static const char *CFG = "{\"pip\": {\"index_url\": \"http://127.0.0.1:8765/simple/\","
                         "         \"packages\": {\"TinyPkg\": \"\", \"requests\": \">=2.31,<3\","
                         "                        \"zope.interface\": \"==6.*\"}},"
                         " \"npm\": {\"registry\": \"https://registry.npmjs.org/\","
                         "         \"packages\": {\"is-number\": \"^7.0.0\", \"@types/node\": \"\","
                         "                        \"left-pad\": \"*\"}}}";

/* Returns 0 when accepted (name/spec filled), -1 when refused (err filled). */
static int check(allowlist *al, allowlist_mgr m, const char *req, char *name, char *spec, char *err)
{
    name[0] = spec[0] = err[0] = '\0';
    km_err e = {0};
    int rc = allowlist_check(al, m, req, name, spec, &e);
    snprintf(err, 512, "%.511s", e.msg);
    if (rc < 0)
        assert_true(strlen(err) > 0);
    return rc;
}

static void test_empty_allows_nothing(void **state)
{
    (void)state;
    allowlist *al = allowlist_new();
    char name[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1], err[512];
    assert_int_equal(check(al, ALLOWLIST_PIP, "requests", name, spec, err), -1);
    assert_non_null(strstr(err, "allowlist for pip is empty"));
    assert_int_equal(check(al, ALLOWLIST_NPM, "is-number", name, spec, err), -1);
    assert_int_equal(allowlist_count(al, ALLOWLIST_PIP), 0);
    assert_null(allowlist_index(al, ALLOWLIST_PIP));
    allowlist_destroy(&al);
    assert_null(al);
    allowlist_destroy(&al); /* NULL-safe */
}

static void test_pip_accepts_listed(void **state)
{
    (void)state;
    allowlist *al = load(CFG);
    assert_non_null(al);
    char name[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1], err[512];

    assert_int_equal(check(al, ALLOWLIST_PIP, "tinypkg", name, spec, err), 0);
    assert_string_equal(name, "tinypkg");
    assert_string_equal(spec, "");
    /* PEP 503 normalisation both ways. */
    assert_int_equal(check(al, ALLOWLIST_PIP, "Tiny_Pkg", name, spec, err), -1);
    assert_int_equal(check(al, ALLOWLIST_PIP, "TINYPKG==1.0", name, spec, err), 0);
    assert_string_equal(name, "tinypkg");
    assert_string_equal(spec, "==1.0");
    assert_int_equal(check(al, ALLOWLIST_PIP, "Zope_Interface", name, spec, err), 0);
    assert_string_equal(name, "zope-interface");
    assert_string_equal(spec, "==6.*");
    /* The allowlist's specifier always applies: joined with the request's. */
    assert_int_equal(check(al, ALLOWLIST_PIP, "requests", name, spec, err), 0);
    assert_string_equal(spec, ">=2.31,<3");
    assert_int_equal(check(al, ALLOWLIST_PIP, " requests == 2.32.3 ", name, spec, err), 0);
    assert_string_equal(spec, ">=2.31,<3,== 2.32.3");
    assert_int_equal(check(al, ALLOWLIST_PIP, "requests~=2.31", name, spec, err), 0);
    assert_string_equal(spec, ">=2.31,<3,~=2.31");
    allowlist_destroy(&al);
}

static void test_pip_refusals(void **state)
{
    (void)state;
    allowlist *al = load(CFG);
    assert_non_null(al);
    char name[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1], err[512];
    struct {
        const char *req;
        const char *why;
    } cases[] = {
        {"numpy", "not on the pip allowlist"},
        {"--index-url=http://evil/simple", "options and flags"},
        {"--index-url", "options and flags"},
        {"--extra-index-url http://evil/", "options and flags"},
        {"-e", "options and flags"},
        {"-e git+https://github.com/x/tinypkg", "options and flags"},
        {"-r requirements.txt", "options and flags"},
        {"--pre", "options and flags"},
        {"git+https://github.com/psf/requests", "VCS links"},
        {"https://files.example/tinypkg-1.0-py3-none-any.whl", "URLs"},
        {"http://127.0.0.1:8765/simple/tinypkg/", "URLs"},
        {"./tinypkg", "local paths"},
        {"/tmp/tinypkg-1.0-py3-none-any.whl", "local paths"},
        {"tinypkg-1.0-py3-none-any.whl", "local paths"},
        {"tinypkg @ https://evil/tinypkg.whl", "direct references"},
        {"tinypkg@file:///x", "direct references"},
        {"tinypkg; python_version>'3'", "environment markers"},
        {"requests[socks]", "extras"},
        {"tinypkg==1.0 --index-url http://x", "URLs"},
        {"tinypkg==1.0 -i http://x", "not allowed"},
        {"tinypkg ==", "not a plain version"},
        {"tinypkg latest", "not a plain version"},
        {"tinypkg\n--index-url=http://x", "control"},
        {"", "empty"},
        {"-", "options and flags"},
        {"tinypkg/../x", "paths"},
        {"t\xc3\xa9", "non-ASCII"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = check(al, ALLOWLIST_PIP, cases[i].req, name, spec, err);
        if (rc != -1 || !strstr(err, cases[i].why))
            fail_msg("request '%s': rc %d, err '%s', expected '%s'", cases[i].req, rc, err,
                     cases[i].why);
    }
    allowlist_destroy(&al);
}

static void test_npm(void **state)
{
    (void)state;
    allowlist *al = load(CFG);
    assert_non_null(al);
    char name[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1], err[512];
    assert_int_equal(check(al, ALLOWLIST_NPM, "is-number", name, spec, err), 0);
    assert_string_equal(name, "is-number");
    assert_string_equal(spec, "^7.0.0");
    assert_int_equal(check(al, ALLOWLIST_NPM, "is-number@7.0.0", name, spec, err), 0);
    assert_string_equal(spec, "^7.0.0 7.0.0");
    assert_int_equal(check(al, ALLOWLIST_NPM, "@types/node", name, spec, err), 0);
    assert_string_equal(name, "@types/node");
    assert_int_equal(check(al, ALLOWLIST_NPM, "@types/node@^20", name, spec, err), 0);
    assert_string_equal(spec, "^20");
    assert_int_equal(check(al, ALLOWLIST_NPM, "left-pad", name, spec, err), 0);
    assert_string_equal(spec, "");

    const char *refused[] = {"is-odd",
                             "Is-Number",
                             "--registry=http://evil/",
                             "--ignore-scripts=false",
                             "is-number@latest",
                             "is-number@npm:evil",
                             "evil@npm:is-number@7",
                             "github:jonschlinkert/is-number",
                             "jonschlinkert/is-number",
                             "git+https://github.com/jonschlinkert/is-number.git",
                             "https://registry.npmjs.org/is-number/-/is-number-7.0.0.tgz",
                             "./is-number",
                             "file:../is-number",
                             "is-number-7.0.0.tgz",
                             "is-number@7 || >=0.0.0",
                             "is-number#semver:7",
                             "@types/../node",
                             ".bin"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (check(al, ALLOWLIST_NPM, refused[i], name, spec, err) != -1)
            fail_msg("npm request '%s' was accepted (spec '%s')", refused[i], spec);
    allowlist_destroy(&al);
}

static void test_config_errors(void **state)
{
    (void)state;
    struct {
        const char *cfg;
        const char *why;
    } cases[] = {
        {"[]", "must be a JSON object"},
        {"{\"cargo\": {}}", "cargo: unknown key"},
        {"{\"pip\": {\"index\": \"http://x/\"}}", "pip.index: unknown key"},
        {"{\"pip\": {\"packages\": [\"a\"]}}", "pip.index_url: required"},
        {"{\"pip\": {\"index_url\": \"ftp://x/\", \"packages\": []}}", "only http"},
        {"{\"pip\": {\"index_url\": \"http://u:p@x/\"}}", "credentials"},
        {"{\"pip\": {\"index_url\": \"http://x:99999/\"}}", "bad port"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": {\"a b\": \"\"}}}",
         "not a valid pip package name"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": {\"a\": \"@ http://x\"}}}",
         "not a valid version specifier"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": {\"a\": 1}}}", "must be a string"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": [\"A_b\", \"a.B\"]}}",
         "listed twice"},
        {"{\"npm\": {\"registry\": \"http://x/\", \"packages\": {\"Foo\": \"\"}}}",
         "not a valid npm package name"},
        {"{\"npm\": {\"registry\": \"http://x/\", \"packages\": {\"foo\": \"latest\"}}}",
         "not a valid version specifier"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *cfg = json_loads(cases[i].cfg, 0, NULL);
        assert_non_null(cfg);
        km_err err = {0};
        allowlist *al = allowlist_from_json(cfg, &err);
        json_decref(cfg);
        if (al || !strstr(err.msg, cases[i].why)) {
            allowlist_destroy(&al);
            fail_msg("config %s: err.msg '%s', expected '%s'", cases[i].cfg, err.msg, cases[i].why);
        }
    }
}

static void test_url_parse(void **state)
{
    (void)state;
    char host[256];
    km_err err = {0};
    unsigned port;
    int tls;
    assert_int_equal(
        allowlist_parse_url("http://127.0.0.1:8765/simple/", host, sizeof host, &port, &tls, &err),
        0);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(port, 8765);
    assert_int_equal(tls, 0);
    assert_int_equal(
        allowlist_parse_url("https://registry.npmjs.org/", host, sizeof host, &port, &tls, &err),
        0);
    assert_string_equal(host, "registry.npmjs.org");
    assert_int_equal(port, 443);
    assert_int_equal(tls, 1);
    assert_int_equal(allowlist_parse_url("http://[::1]:81/x", host, sizeof host, &port, &tls, &err),
                     0);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 81);
    assert_int_equal(allowlist_parse_url("http:///x", host, sizeof host, &port, &tls, &err), -1);
    assert_int_equal(allowlist_parse_url("http://a:b/x", host, sizeof host, &port, &tls, &err), -1);
    assert_int_equal(allowlist_parse_url("http://a b/x", host, sizeof host, &port, &tls, &err), -1);
}

static void test_allowed_hosts(void **state)
{
    (void)state;
    allowlist *al = load("{\"pip\": {\"index_url\": \"https://pypi.org/simple/\","
                         " \"allowed_hosts\": [\"Files.PythonHosted.org:443\", \"[::1]:8080\","
                         " \"10.0.0.1:81\"], \"packages\": [\"a\"]}}");
    assert_non_null(al);
    assert_string_equal(allowlist_allowed_host(al, ALLOWLIST_PIP, 0), "files.pythonhosted.org:443");
    assert_string_equal(allowlist_allowed_host(al, ALLOWLIST_PIP, 1), "[::1]:8080");
    assert_string_equal(allowlist_allowed_host(al, ALLOWLIST_PIP, 2), "10.0.0.1:81");
    assert_null(allowlist_allowed_host(al, ALLOWLIST_PIP, 3));
    assert_null(allowlist_allowed_host(al, ALLOWLIST_NPM, 0));
    assert_null(allowlist_allowed_host(al, ALLOWLIST_PIP, 1000));
    assert_null(allowlist_allowed_host(NULL, ALLOWLIST_PIP, 0));
    allowlist_destroy(&al);

    /* Each bad entry is refused with its index and a reason. */
    struct {
        const char *hosts;
        const char *why;
    } bad[] = {
        {"\"files.pythonhosted.org\"", "port is required"},
        {"\"https://files.pythonhosted.org:443\"", "no scheme"},
        {"\"files.pythonhosted.org:443/x\"", "no scheme, path"},
        {"\"u@files.pythonhosted.org:443\"", "credentials"},
        {"\"*.pythonhosted.org:443\"", "bad host"},
        {"\"a.org:0\"", "bad host or port"},
        {"\"a.org:65536\"", "bad host or port"},
        {"\"a.org:http\"", "bad host or port"},
        {"\"::1:80\"", "port is required"},
        {"\"\"", "expected host:port"},
        {"\"a b:80\"", "no scheme"},
        {"1", "must be a string"},
        {"\"a:1\", \"b:2\", \"c:3\", \"d:4\", \"e:5\", \"f:6\", \"g:7\", \"h:8\", \"i:9\"",
         "at most 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cfgtext[512];
        km_err err = {0};
        snprintf(cfgtext, sizeof cfgtext,
                 "{\"pip\": {\"index_url\": \"https://pypi.org/simple/\", \"allowed_hosts\": "
                 "[%s]}}",
                 bad[i].hosts);
        json_t *cfg = json_loads(cfgtext, 0, NULL);
        assert_non_null(cfg);
        allowlist *x = allowlist_from_json(cfg, &err);
        json_decref(cfg);
        if (x || !strstr(err.msg, bad[i].why) || !strstr(err.msg, "pip.allowed_hosts")) {
            allowlist_destroy(&x);
            fail_msg("allowed_hosts [%s]: err.msg '%s', expected '%s'", bad[i].hosts, err.msg,
                     bad[i].why);
        }
    }
    json_t *cfg = json_loads("{\"npm\": {\"registry\": \"https://r.example/\", "
                             "\"allowed_hosts\": \"x:1\"}}",
                             0, NULL);
    km_err err = {0};
    assert_null(allowlist_from_json(cfg, &err));
    assert_non_null(strstr(err.msg, "npm.allowed_hosts: must be an array"));
    json_decref(cfg);
}

static void test_load_file(void **state)
{
    (void)state;
    km_err err = {0};
    allowlist *al = allowlist_load("/nonexistent/allowlist.json", 0, &err);
    assert_non_null(al);
    assert_int_equal(allowlist_count(al, ALLOWLIST_NPM), 0);
    allowlist_destroy(&al);
    assert_null(allowlist_load("/nonexistent/allowlist.json", 1, &err));

    char path[] = "/tmp/test_km_allowlist_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"npm\": {\"registry\": \"https://registry.npmjs.org/\", "
                       "\"packages\": [\"is-number\"]}}";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    al = allowlist_load(path, 1, &err);
    assert_non_null(al);
    assert_int_equal(allowlist_count(al, ALLOWLIST_NPM), 1);
    assert_string_equal(allowlist_index(al, ALLOWLIST_NPM), "https://registry.npmjs.org/");
    json_t *j = allowlist_to_json(al, ALLOWLIST_NPM);
    assert_string_equal(json_string_value(json_object_get(j, "is-number")), "");
    json_decref(j);
    allowlist_destroy(&al);

    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "{bad", 4), 4);
    close(fd);
    assert_null(allowlist_load(path, 1, &err));
    assert_non_null(strstr(err.msg, path));
    unlink(path);
}

/* A temporary file holding text; path (PATH_MAX) gets its name. */
static void write_temp(char *path, const char *text, size_t len)
{
    strcpy(path, "/tmp/test_km_allowlist_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A path a client names may be anything: a symbolic link, a FIFO nobody
 * writes to, a directory. Each is refused, and at once. */
static void test_load_refuses_what_is_not_a_regular_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_km_allowlist_dir_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char good[PATH_MAX], link[PATH_MAX], fifo[PATH_MAX];
    km_err err = {0};
    write_temp(good, "{}", 2);
    snprintf(link, sizeof link, "%s/link.json", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    assert_int_equal(symlink(good, link), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);

    assert_null(allowlist_load(link, 1, &err));
    assert_non_null(strstr(err.msg, link));
    assert_non_null(strstr(err.msg, "symbolic link"));
    /* even when a missing file would be an empty list */
    assert_null(allowlist_load(link, 0, &err));

    /* a FIFO without a writer: a blocking open would wait forever; the
     * alarm turns that into a failure instead of a hung test */
    alarm(20);
    double t0 = now_s();
    assert_null(allowlist_load(fifo, 0, &err));
    assert_true(now_s() - t0 < 2.0);
    alarm(0);
    assert_non_null(strstr(err.msg, "not a regular file"));

    assert_null(allowlist_load(dir, 0, &err));
    assert_non_null(strstr(err.msg, "not a regular file"));

    unlink(link);
    unlink(fifo);
    unlink(good);
    rmdir(dir);
}

/* At most ALLOWLIST_FILE_MAX bytes: the limit itself is accepted. */
static void test_load_size_cap(void **state)
{
    (void)state;
    size_t n = ALLOWLIST_FILE_MAX;
    char *text = malloc(n + 1);
    assert_non_null(text);
    memset(text, ' ', n + 1);
    text[0] = '{';
    text[n - 1] = '}';
    char path[PATH_MAX];
    km_err err = {0};
    write_temp(path, text, n);
    allowlist *al = allowlist_load(path, 1, &err);
    assert_non_null(al);
    allowlist_destroy(&al);
    unlink(path);

    text[n - 1] = ' ';
    text[n] = '}';
    write_temp(path, text, n + 1);
    free(text);
    assert_null(allowlist_load(path, 1, &err));
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "larger than the limit"));
    unlink(path);
}

/* The file may be one the requester could not read: no error quotes a byte
 * of it — not jansson's "near 'token'", not a key, a name, a URL, a
 * specifier or a host. Each text hides "SECRET" where the error is. */
static void test_load_errors_never_quote_the_file(void **state)
{
    (void)state;
    struct {
        const char *text;
        const char *why;
    } cases[] = {
        {"root:$6$SECRET$hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",
         "not valid JSON at line 1, column "},
        {"SECRET", "not valid JSON at line 1, column "},
        {"{\"a\": SECRET}", "not valid JSON at line 1, column "},
        {"{\"SECRET\": 1, \"SECRET\": 2}", "a key occurs twice) at line 1, column "},
        {"{} SECRET", "more after the value) at line 1, column "},
        {"{\"SECRET\": ", "it ends early) at line 1, column "},
        {"[\"SECRET\"]", "must be a JSON object"},
        {"{\"SECRET\": {}}", "key 1 of the top-level object is unknown"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"SECRET\": 1}}", "pip: key 2 is unknown"},
        {"{\"pip\": {\"index_url\": \"http://user:SECRET@x/\"}}",
         "pip.index_url: credentials in the URL"},
        {"{\"pip\": {\"index_url\": \"ftp://SECRET/\"}}", "pip.index_url: only http"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": {\"a\": \"\", \"SECRET X\": "
         "\"\"}}}",
         "pip.packages[1]: not a valid pip package name"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": {\"a\": \"SECRET\"}}}",
         "pip.packages[0]: not a valid version specifier"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": {\"SECRET\": 1}}}",
         "pip.packages[0]: the version specifier must be a string"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"packages\": [\"SECRET\", \"secret\"]}}",
         "pip.packages[1]: the package is listed twice"},
        {"{\"npm\": {\"registry\": \"http://x/\", \"packages\": [\"SECRET\"]}}",
         "npm.packages[0]: not a valid npm package name"},
        {"{\"pip\": {\"index_url\": \"http://x/\", \"allowed_hosts\": [\"SECRET\"]}}",
         "pip.allowed_hosts[0]: expected host:port (the port is required)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[PATH_MAX];
        km_err err = {0};
        write_temp(path, cases[i].text, strlen(cases[i].text));
        allowlist *al = allowlist_load(path, 1, &err);
        unlink(path);
        if (al || !strstr(err.msg, path) || !strstr(err.msg, cases[i].why) ||
            strstr(err.msg, "SECRET") || strstr(err.msg, "root") || strstr(err.msg, "hash")) {
            allowlist_destroy(&al);
            fail_msg("file %s: err.msg '%s', expected '%s' and no byte of the file", cases[i].text,
                     err.msg, cases[i].why);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_allows_nothing),
        cmocka_unit_test(test_pip_accepts_listed),
        cmocka_unit_test(test_pip_refusals),
        cmocka_unit_test(test_npm),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_url_parse),
        cmocka_unit_test(test_allowed_hosts),
        cmocka_unit_test(test_load_file),
        cmocka_unit_test(test_load_refuses_what_is_not_a_regular_file),
        cmocka_unit_test(test_load_size_cap),
        cmocka_unit_test(test_load_errors_never_quote_the_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
