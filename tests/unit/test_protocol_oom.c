/* Out-of-memory paths of protocol/: jansson's allocator is replaced by one
 * that fails after N allocations, for every N until the operation succeeds.
 * Each attempt must end in success or JP_ERR_NOMEM / NULL (JP_ERR_JSON where
 * jansson itself cannot tell) — never a crash, another error code or a leak
 * (valgrind checks the latter). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jp.h"

static long budget = -1; /* allocations left; -1 = unlimited */
static int failures;

static void *limited_malloc(size_t size)
{
    if (budget == 0) {
        failures++;
        return NULL;
    }
    if (budget > 0)
        budget--;
    return malloc(size);
}

static void limit(long n)
{
    budget = n;
    failures = 0;
    json_set_alloc_funcs(limited_malloc, free);
}

static void unlimit(void)
{
    budget = -1;
}

static int teardown(void **state)
{
    (void)state;
    unlimit();
    json_set_alloc_funcs(malloc, free);
    return 0;
}

static jmsg *sample(void)
{
    jmsg *m = jmsg_new("execute_request", "s", "u", NULL);
    jmsg_set_content(m, json_pack("{s:s, s:[i,f,n], s:{s:b}}", "code", "x = 1", "list", 1, 2.5,
                                  "nested", "flag", 1));
    jmsg_add_buffer(m, "buf", 3);
    return m;
}

static void test_jmsg_new_oom(void **state)
{
    (void)state;
    jmsg *parent = sample();
    for (long n = 0;; n++) {
        limit(n);
        jmsg *m = jmsg_new("x", "s", "u", parent);
        unlimit();
        if (m) {
            assert_int_equal(failures, 0);
            jmsg_destroy(&m);
            break;
        }
        assert_true(failures > 0);
        assert_true(n < 1000);
    }
    jmsg_destroy(&parent);
}

static void test_encode_decode_oom(void **state)
{
    (void)state;
    jp_session *s = jp_session_new("k", 1, NULL, NULL);
    jmsg *m = sample();
    jp_frame *good = NULL;
    size_t good_n = 0;
    jp_error err;
    assert_int_equal(jp_session_encode(s, m, &good, &good_n, &err), JP_OK);

    for (long n = 0;; n++) {
        jp_frame *f = NULL;
        size_t fn = 0;
        limit(n);
        jp_status st = jp_session_encode(s, m, &f, &fn, &err);
        unlimit();
        if (st == JP_OK) {
            jp_frames_free(&f, fn);
            break;
        }
        assert_int_equal(st, JP_ERR_NOMEM);
        assert_null(f);
        assert_true(n < 1000);
    }
    for (long n = 0;; n++) {
        jmsg *d = NULL;
        limit(n);
        jp_status st = jp_session_decode(s, good, good_n, &d, &err);
        unlimit();
        if (st == JP_OK) {
            assert_true(json_equal(d->content, m->content));
            jmsg_destroy(&d);
            break;
        }
        /* The message must not have been remembered (it decodes once memory
         * is back). jansson's lexer reports an allocation failure inside a
         * string as a syntax error, so JP_ERR_JSON is possible too. */
        if (st != JP_ERR_NOMEM && st != JP_ERR_JSON)
            fail_msg("budget %ld: %s: %s", n, jp_strerror(st), err.reason);
        assert_null(d);
        assert_true(n < 1000);
    }
    jp_frames_free(&good, good_n);
    jmsg_destroy(&m);
    jp_session_destroy(&s);
}

static void test_connection_oom(void **state)
{
    (void)state;
    jp_connection c;
    jp_error err;
    assert_int_equal(jp_connection_init(&c, "tcp", NULL, "k", &err), JP_OK);
    char path[64];
    snprintf(path, sizeof path, "/tmp/jp-oom-%d.json", (int)getpid());
    for (long n = 0;; n++) {
        limit(n);
        jp_status st = jp_connection_write(path, &c, &err);
        unlimit();
        if (st == JP_OK)
            break;
        assert_int_equal(st, JP_ERR_NOMEM);
        assert_true(n < 1000);
    }
    for (long n = 0;; n++) {
        jp_connection r;
        limit(n);
        jp_status st = jp_connection_read(path, &r, &err);
        unlimit();
        if (st == JP_OK) {
            assert_memory_equal(&r, &c, sizeof r);
            break;
        }
        if (st != JP_ERR_NOMEM && st != JP_ERR_JSON) /* see above */
            fail_msg("budget %ld: %s: %s", n, jp_strerror(st), err.reason);
        assert_true(n < 1000);
    }
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_jmsg_new_oom, teardown),
        cmocka_unit_test_teardown(test_encode_decode_oom, teardown),
        cmocka_unit_test_teardown(test_connection_oom, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
