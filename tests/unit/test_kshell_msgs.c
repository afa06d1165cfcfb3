/* Unit tests of the kernel server's message table (kshell_msgs[] in
 * kernels/server/kshell.c): it covers every request the server answers, on
 * the channels it answers them, each either answered at once or queued for
 * the worker, with the reply type the protocol names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/server/kserver.h"

static void entries(void **state)
{
    (void)state;
    for (const kshell_msg *m = kshell_msgs; m->type; m++) {
        for (const kshell_msg *o = kshell_msgs; o < m; o++)
            assert_string_not_equal(o->type, m->type);
        assert_true(m->channels != 0);
        /* answered at once, or queued: never both */
        assert_int_equal(m->answer != NULL, m->kind == KREQ_NONE);
        assert_int_equal(m->start != NULL, m->kind != KREQ_NONE);
        if (m->kind != KREQ_NONE) {
            /* the worker's requests come on shell only and name themselves
             * in a lost state's reason */
            assert_int_equal(m->channels, KCH_SHELL);
            assert_non_null(m->what);
            assert_ptr_equal(kshell_msg_of_kind(m->kind), m);
        }
        size_t n = strlen(m->type);
        if (n > 8 && !strcmp(m->type + n - 8, "_request")) {
            char reply[80];
            snprintf(reply, sizeof reply, "%.*s_reply", (int)(n - 8), m->type);
            assert_string_equal(m->reply, reply);
        } else {
            assert_int_equal(m->channels, KCH_STDIN); /* input_reply */
            assert_null(m->reply);
        }
        assert_ptr_equal(kshell_msg_find(m->type, m->channels), m);
    }
    for (kreq_kind k = KREQ_EXECUTE; k <= KREQ_IS_COMPLETE; k++)
        assert_non_null(kshell_msg_of_kind(k));
    assert_null(kshell_msg_of_kind(KREQ_NONE));
}

static void coverage(void **state)
{
    (void)state;
    static const char *const immediate[] = {"kernel_info_request", "comm_info_request",
                                            "history_request",     "shutdown_request",
                                            "interrupt_request",   NULL};
    static const char *const queued[] = {
        "execute_request",     "complete_request",           "inspect_request",
        "is_complete_request", "kernelmgr_snapshot_request", NULL};
    int n = 0;
    for (int i = 0; immediate[i]; i++, n++) {
        const kshell_msg *m = kshell_msg_find(immediate[i], KCH_CONTROL);
        assert_non_null(m);
        assert_ptr_equal(kshell_msg_find(immediate[i], KCH_SHELL), m);
        assert_int_equal(m->kind, KREQ_NONE);
        assert_null(kshell_msg_find(immediate[i], KCH_STDIN));
    }
    for (int i = 0; queued[i]; i++, n++) {
        const kshell_msg *m = kshell_msg_find(queued[i], KCH_SHELL);
        assert_non_null(m);
        assert_int_not_equal(m->kind, KREQ_NONE);
        assert_null(kshell_msg_find(queued[i], KCH_CONTROL));
    }
    assert_non_null(kshell_msg_find("input_reply", KCH_STDIN));
    assert_null(kshell_msg_find("input_reply", KCH_SHELL));
    n++;
    /* debug_request: control only (the shell is busy while a cell is stopped) */
    const kshell_msg *dbg = kshell_msg_find("debug_request", KCH_CONTROL);
    assert_non_null(dbg);
    assert_int_equal(dbg->kind, KREQ_NONE);
    assert_string_equal(dbg->reply, "debug_reply");
    assert_null(kshell_msg_find("debug_request", KCH_SHELL));
    n++;
    assert_null(kshell_msg_find("comm_open", KCH_SHELL));
    assert_null(kshell_msg_find("no_such_request", KCH_SHELL | KCH_CONTROL | KCH_STDIN));
    assert_null(kshell_msg_find(NULL, KCH_SHELL));
    int entries_n = 0;
    for (const kshell_msg *m = kshell_msgs; m->type; m++)
        entries_n++;
    assert_int_equal(entries_n, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(entries),
        cmocka_unit_test(coverage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
