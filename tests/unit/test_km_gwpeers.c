/* Unit tests of kernelmgr/frontends/gwpeers.c: the gateway's accounting of
 * connections before and after the token. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/frontends/gwpeers.h"

/* addresses are opaque keys here */
#define A 0x0100007fu
#define B 0x0200007fu

/* One address reaches its own bound; another address still gets in. */
static void test_per_peer_bound(void **state)
{
    (void)state;
    gwpeers *p = gwpeers_new(100, 50, 3);
    assert_non_null(p);
    gwpeers_conn *c[4] = {0};
    gwpeers_verdict v;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(gwpeers_check(p, A), GWPEERS_OK);
        c[i] = gwpeers_admit(p, A, &v);
        assert_non_null(c[i]);
        assert_int_equal(v, GWPEERS_OK);
    }
    assert_int_equal(gwpeers_check(p, A), GWPEERS_PEER);
    assert_null(gwpeers_admit(p, A, &v));
    assert_int_equal(v, GWPEERS_PEER);
    assert_string_equal(gwpeers_limit_name(v), "http_max_unauth_per_peer");
    assert_int_equal(gwpeers_limit_value(p, v), 3);
    c[3] = gwpeers_admit(p, B, &v);
    assert_non_null(c[3]);
    assert_int_equal(gwpeers_unauth(p), 4);
    assert_int_equal(gwpeers_total(p), 4);
    /* closing one makes room for that address again */
    assert_int_equal(gwpeers_release(p, &c[0]), 1); /* no request: counted as idle */
    assert_null(c[0]);
    assert_int_equal(gwpeers_check(p, A), GWPEERS_OK);
    for (int i = 1; i < 4; i++)
        gwpeers_release(p, &c[i]);
    assert_int_equal(gwpeers_total(p), 0);
    assert_int_equal(gwpeers_unauth(p), 0);
    gwpeers_destroy(&p);
    assert_null(p);
}

/* The token frees a connection's place among the unauthenticated ones but
 * it still counts in the total. */
static void test_authenticated_leaves_the_unauth_bounds(void **state)
{
    (void)state;
    gwpeers *p = gwpeers_new(4, 2, 1);
    gwpeers_verdict v;
    gwpeers_conn *a = gwpeers_admit(p, A, &v);
    assert_non_null(a);
    assert_int_equal(gwpeers_check(p, A), GWPEERS_PEER);
    gwpeers_request(a);
    gwpeers_authenticated(p, a);
    gwpeers_authenticated(p, a); /* idempotent */
    assert_true(gwpeers_is_authenticated(a));
    assert_int_equal(gwpeers_unauth(p), 0);
    assert_int_equal(gwpeers_check(p, A), GWPEERS_OK);
    gwpeers_conn *b = gwpeers_admit(p, A, &v);
    gwpeers_conn *c = gwpeers_admit(p, B, &v);
    assert_non_null(b);
    assert_non_null(c);
    /* two unauthenticated open: the all-peers bound */
    assert_int_equal(gwpeers_check(p, 0x0300007fu), GWPEERS_UNAUTH);
    gwpeers_authenticated(p, b);
    gwpeers_conn *d = gwpeers_admit(p, 0x0300007fu, &v);
    assert_non_null(d);
    /* four open: the total */
    assert_int_equal(gwpeers_check(p, 0x0400007fu), GWPEERS_TOTAL);
    assert_null(gwpeers_admit(p, 0x0400007fu, &v));
    assert_int_equal(v, GWPEERS_TOTAL);
    assert_int_equal(gwpeers_limit_value(p, GWPEERS_TOTAL), 4);
    assert_int_equal(gwpeers_release(p, &a), 0); /* authenticated: not idle */
    gwpeers_request(c);
    assert_int_equal(gwpeers_release(p, &c), 0); /* made a request: not idle */
    gwpeers_release(p, &b);
    gwpeers_release(p, &d);
    assert_int_equal(gwpeers_total(p), 0);
    assert_int_equal(gwpeers_unauth(p), 0);
    gwpeers_destroy(&p);
}

/* Many peers come and go: the table forgets each once it has nothing open. */
static void test_many_peers(void **state)
{
    (void)state;
    enum { N = 2000 };
    gwpeers *p = gwpeers_new(N, N, 1);
    gwpeers_conn **c = calloc(N, sizeof *c);
    gwpeers_verdict v;
    for (uint32_t i = 0; i < N; i++) {
        c[i] = gwpeers_admit(p, i + 1, &v);
        assert_non_null(c[i]);
    }
    assert_int_equal(gwpeers_check(p, 5), GWPEERS_TOTAL);
    for (uint32_t i = 0; i < N; i += 2)
        gwpeers_release(p, &c[i]);
    for (uint32_t i = 0; i < N; i += 2) {
        c[i] = gwpeers_admit(p, i + 1, &v);
        assert_non_null(c[i]);
    }
    for (uint32_t i = 0; i < N; i++)
        gwpeers_release(p, &c[i]);
    assert_int_equal(gwpeers_total(p), 0);
    free(c);
    gwpeers_destroy(&p);
    gwpeers_destroy(&p); /* NULL-safe */
    gwpeers_release(NULL, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_per_peer_bound),
        cmocka_unit_test(test_authenticated_leaves_the_unauth_bounds),
        cmocka_unit_test(test_many_peers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
