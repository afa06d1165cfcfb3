/*
 * test_knetnote.c — the network note: due only for a failed cell with the
 * policy active, after an unroutable connect or a resolver failure, also
 * one split across output chunks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <string.h>

#include "kernels/server/knetnote.h"

static void scan(knetnote *n, const char *s)
{
    knetnote_scan(n, s, strlen(s));
}

static void resolver_messages(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "curl: (6) Could not resolve host: example.com\n",
        "urlopen error [Errno -3] Temporary failure in name resolution>",
        "socket.gaierror: [Errno -2] Name or service not known",
        "wget: unable to resolve host address 'example.com'\n",
        "Error: getaddrinfo EAI_AGAIN example.com",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        knetnote n;
        knetnote_start(&n, 1, 0);
        assert_false(knetnote_due(&n, 1, 0));
        scan(&n, texts[i]);
        assert_true(knetnote_due(&n, 1, 0));
        assert_false(knetnote_due(&n, 0, 0)); /* the cell succeeded */
    }
}

static void no_route_counter(void **state)
{
    (void)state;
    knetnote n;
    knetnote_start(&n, 1, 3);
    assert_false(knetnote_due(&n, 1, 3));
    assert_true(knetnote_due(&n, 1, 4));
    assert_false(knetnote_due(&n, 0, 4));
    knetnote_start(&n, 1, -1); /* unknown at the start: never from the counter */
    assert_false(knetnote_due(&n, 1, 5));
}

static void inactive_never(void **state)
{
    (void)state;
    knetnote n;
    knetnote_start(&n, 0, 0);
    scan(&n, "Could not resolve host: x");
    assert_false(knetnote_due(&n, 1, 9));
}

static void other_errors_are_not_the_network(void **state)
{
    (void)state;
    knetnote n;
    knetnote_start(&n, 1, 0);
    scan(&n, "ConnectionRefusedError: [Errno 111] Connection refused\n");
    scan(&n, "ValueError: could not resolve the expression\n");
    assert_false(knetnote_due(&n, 1, 0));
}

/* A message split at every position, and dribbled out byte by byte. */
static void split_across_chunks(void **state)
{
    (void)state;
    const char *msg = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                      "Temporary failure in name resolution yyy";
    size_t len = strlen(msg);
    for (size_t cut = 1; cut < len; cut++) {
        knetnote n;
        knetnote_start(&n, 1, 0);
        knetnote_scan(&n, msg, cut);
        knetnote_scan(&n, msg + cut, len - cut);
        assert_true(knetnote_due(&n, 1, 0));
    }
    knetnote n;
    knetnote_start(&n, 1, 0);
    for (size_t i = 0; i < len; i++)
        knetnote_scan(&n, msg + i, 1);
    assert_true(knetnote_due(&n, 1, 0));
    /* Only the message's own bytes count, not ones far apart. */
    knetnote_start(&n, 1, 0);
    scan(&n, "Could not res");
    scan(&n, "..........................................................");
    scan(&n, "olve host");
    assert_false(knetnote_due(&n, 1, 0));
}

static void allow_list_refusals(void **state)
{
    (void)state;
    knetnote n;
    knetnote_start_allow(&n, 0, 5);
    assert_false(knetnote_due_allow(&n, 1, 0, 5)); /* failed for another reason */
    assert_true(knetnote_due_allow(&n, 1, 0, 6));  /* the proxy refused during the cell */
    assert_false(knetnote_due_allow(&n, 0, 0, 9)); /* it refused, the cell succeeded */
    assert_true(knetnote_due_allow(&n, 1, 1, 5));  /* an unroutable connect (no proxy used) */
    scan(&n, "curl: (6) Could not resolve host: pypi.org\n");
    assert_true(knetnote_due_allow(&n, 1, 0, 5)); /* no DNS inside */
    knetnote_start(&n, 1, 0);                     /* network off: no refusal count */
    assert_false(knetnote_due_allow(&n, 1, 0, 100));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(resolver_messages),   cmocka_unit_test(no_route_counter),
        cmocka_unit_test(inactive_never),      cmocka_unit_test(other_errors_are_not_the_network),
        cmocka_unit_test(split_across_chunks), cmocka_unit_test(allow_list_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
