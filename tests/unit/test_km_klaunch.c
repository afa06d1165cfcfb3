/* Unit tests of kernelmgr/klaunch.c: waiting for and stopping a kernel
 * process (klaunch_wait_exit, klaunch_stop_begin, klaunch_stop) with real
 * child processes. Nothing measures time: only outcomes are checked. (Under
 * valgrind, which does not know pidfd_open, the polling fallback runs.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernelmgr/engine/klaunch.h"

/* new: a kproc for a child in its own process group that runs `behaviour`:
 * 0 sleeps (default SIGTERM), 1 ignores SIGTERM and sleeps. */
static kproc *child(int behaviour)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setpgid(0, 0);
        if (behaviour == 1)
            signal(SIGTERM, SIG_IGN);
        for (;;)
            pause();
    }
    setpgid(pid, pid);
    kproc *kp = calloc(1, sizeof *kp); /* after fork: the child holds none */
    assert_non_null(kp);
    kp->pid = pid;
    strcpy(kp->conn.transport, "tcp"); /* no ipc sockets to remove */
    return kp;
}

static void wait_times_out_while_alive_then_sees_exit(void **state)
{
    (void)state;
    kproc *kp = child(0);
    assert_int_equal(klaunch_wait_exit(kp, 0.05), 0);
    assert_true(klaunch_alive(kp));
    kill(kp->pid, SIGKILL);
    assert_int_equal(klaunch_wait_exit(kp, 30), 1);
    assert_false(klaunch_alive(kp));
    assert_true(kp->exited && WIFSIGNALED(kp->status) && WTERMSIG(kp->status) == SIGKILL);
    free(kp);
}

static void stop_begin_then_stop_terminates_once(void **state)
{
    (void)state;
    kproc *a = child(0), *b = child(0);
    pid_t pa = a->pid, pb = b->pid;
    klaunch_stop_begin(a);
    klaunch_stop_begin(b);
    assert_true(a->term_sent && b->term_sent);
    klaunch_stop_begin(a); /* no second signal, no harm */
    klaunch_stop(&a, 30);
    klaunch_stop(&b, 30);
    assert_null(a);
    assert_null(b);
    /* reaped: the pids are gone (not zombies of ours) */
    assert_int_equal(waitpid(pa, NULL, WNOHANG), -1);
    assert_int_equal(waitpid(pb, NULL, WNOHANG), -1);
}

static void stop_kills_what_ignores_sigterm(void **state)
{
    (void)state;
    kproc *kp = child(1);
    pid_t pid = kp->pid;
    klaunch_stop(&kp, 0.1);
    assert_null(kp);
    assert_int_equal(waitpid(pid, NULL, WNOHANG), -1);
    assert_int_equal(kill(pid, 0), -1);
}

static void null_safe(void **state)
{
    (void)state;
    klaunch_stop_begin(NULL);
    klaunch_stop(NULL, 1);
    kproc *none = NULL;
    klaunch_stop(&none, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(wait_times_out_while_alive_then_sees_exit),
        cmocka_unit_test(stop_begin_then_stop_terminates_once),
        cmocka_unit_test(stop_kills_what_ignores_sigterm),
        cmocka_unit_test(null_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
