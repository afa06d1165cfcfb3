/*
 * sbx_init.c — PID 1 of the sandbox.
 *
 * The kernel gives PID 1 of a pid namespace two properties this relies on:
 * signals without a handler are not delivered to it (so it must catch and
 * forward SIGINT, or interrupts would never reach the code), and when it
 * exits every other process of the namespace is killed (so nothing started
 * with nohup, setsid or a double fork outlives the worker). Init therefore
 * forwards, reaps orphans, and exits as soon as the worker does.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const int sbx_init_forwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

static void sbx_init_noop(int sig)
{
    (void)sig;
}

static void sbx_init_set(sigset_t *set)
{
    sigemptyset(set);
    for (size_t i = 0; i < sizeof sbx_init_forwarded / sizeof *sbx_init_forwarded; i++)
        sigaddset(set, sbx_init_forwarded[i]);
    sigaddset(set, SIGCHLD);
}

void sbx_init_block_signals(void)
{
    sigset_t set;
    sbx_init_set(&set);
    /* Handlers make the kernel deliver these to PID 1 at all; they never
     * run, the signals are taken with sigwaitinfo(). */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sbx_init_noop;
    for (size_t i = 0; i < sizeof sbx_init_forwarded / sizeof *sbx_init_forwarded; i++)
        sigaction(sbx_init_forwarded[i], &sa, NULL);
    sigaction(SIGCHLD, &sa, NULL);
    sigprocmask(SIG_BLOCK, &set, NULL);
}

int sbx_init_run(pid_t worker, int status_fd)
{
    sigset_t set;
    sbx_init_set(&set);
    for (;;) {
        siginfo_t si;
        int sig = sigwaitinfo(&set, &si);
        if (sig < 0) {
            if (errno == EINTR)
                continue;
            return 127;
        }
        if (sig != SIGCHLD) {
            /* The worker's process group (it called setsid); its pid when the
             * group is gone but the worker is not (it changed its group). */
            if (kill(-worker, sig) < 0)
                kill(worker, sig);
            continue;
        }
        int st;
        pid_t p;
        while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
            if (p != worker)
                continue;
            ssize_t w = write(status_fd, &st, sizeof st);
            (void)w;
            if (WIFEXITED(st))
                return WEXITSTATUS(st);
            return 128 + WTERMSIG(st);
        }
    }
}
