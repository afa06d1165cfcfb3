/*
 * test_km_session_store.c — the parts of session_store.c that need no
 * manager: reading a session.json strictly (a damaged one is refused with
 * a reason that never quotes its contents) and setting it aside without
 * overwriting an earlier copy.
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

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"

static char dir[] = "/tmp/test_km_session_storeXXXXXX";
static char path[128];

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof path, "%s/session.json", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return session_rmtree(dir);
}

static void put(const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

/* session_json_read of text must fail with want in the reason, and the
 * reason must not quote the file (secret). */
static void refused(const char *text, const char *want)
{
    put(text);
    km_err why = {0};
    errno = 0;
    json_t *o = session_json_read(path, &why);
    assert_null(o);
    assert_int_equal(errno, EINVAL);
    if (!strstr(why.msg, want) || !strstr(why.msg, path)) {
        print_message("reason '%s' lacks '%s' or the path\n", why.msg, want);
        fail();
    }
    assert_null(strstr(why.msg, "SECRET"));
}

static void test_read_good_and_missing(void **state)
{
    (void)state;
    km_err why = {0};
    errno = 0;
    assert_null(session_json_read(path, &why));
    assert_int_equal(errno, ENOENT);
    put("{\"workspace\": \"/w\", \"own_workspace\": true, \"options\": {\"memory\": 5},"
        " \"kernels\": {}}");
    json_t *o = session_json_read(path, &why);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "workspace")), "/w");
    json_decref(o);
    unlink(path);
}

static void test_read_refuses_damage(void **state)
{
    (void)state;
    refused("", "is empty");
    refused("{\"workspace\": \"SECRET", "is not valid JSON (it ends early");
    refused("{\"a\": 1, \"a\": 2}", "is not valid JSON");
    refused("[\"SECRET\"]", "is not a JSON object");
    refused("{\"workspace\": \"rel/SECRET\", \"own_workspace\": true, \"options\": {}}",
            "no \"workspace\" that is an absolute path");
    refused("{\"workspace\": \"/w\\u0000x\", \"own_workspace\": true, \"options\": {}}",
            "is not valid JSON"); /* a NUL: jansson refuses it */
    refused("{\"workspace\": \"/w\", \"own_workspace\": 1, \"options\": {}}",
            "no \"own_workspace\" that is true or false");
    refused("{\"workspace\": \"/w\", \"own_workspace\": false}", "no \"options\" object");
    refused("{\"workspace\": \"/w\", \"own_workspace\": false, \"options\": {\"memory\": -1}}",
            "\"options.memory\" that is not a number of bytes");
    refused("{\"workspace\": \"/w\", \"own_workspace\": false, \"options\": {}, \"kernels\": []}",
            "\"kernels\" that is not an object");
    /* not a regular file: refused by the trusted-state read, not parsed */
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    km_err why = {0};
    assert_null(session_json_read(path, &why));
    assert_non_null(strstr(why.msg, path));
    unlink(path);
}

static void test_set_aside(void **state)
{
    (void)state;
    char a[256], b[256], found[256];
    assert_int_equal(session_set_aside_find(dir, found, sizeof found), 0);
    put("damaged one");
    assert_int_equal(session_json_set_aside(path, a, sizeof a), 0);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(access(a, F_OK), 0);
    assert_non_null(strstr(a, "/session.json.corrupt-"));
    /* a second one in the same second never overwrites the first */
    put("damaged two");
    assert_int_equal(session_json_set_aside(path, b, sizeof b), 0);
    assert_string_not_equal(a, b);
    assert_int_equal(access(a, F_OK), 0);
    assert_int_equal(access(b, F_OK), 0);
    assert_int_equal(session_set_aside_find(dir, found, sizeof found), 1);
    assert_true(!strcmp(found, a) || !strcmp(found, b));
    /* nothing to set aside */
    errno = 0;
    assert_int_equal(session_json_set_aside(path, a, sizeof a), -1);
    assert_int_equal(errno, ENOENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_read_good_and_missing),
        cmocka_unit_test(test_read_refuses_damage),
        cmocka_unit_test(test_set_aside),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
