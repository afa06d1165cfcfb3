/* Unit tests of kernelmgr/mklaunch.c: waiting for and stopping a kernel
 * process (klaunch_wait_exit, klaunch_stop_begin, klaunch_stop) with real
 * child processes. Nothing measures time: only outcomes are checked. (Under
 * valgrind, which does not know pidfd_open, the polling fallback runs.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernelmgr/engine/mklaunch.h"

/* Whether this process runs under valgrind (its preloaded core is in
 * LD_PRELOAD). */
static int under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p && strstr(p, "vgpreload") != NULL;
}

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

/* What the started program saw, from its log: its fds 3 and 20, whether it
 * leads its process group, its ignored and blocked signals, its cwd. The
 * signals are read first, by the shell itself (builtins, no fork): a shell
 * blocks signals for a moment around each fork and while it waits for a
 * child, so a grep of the shell's status could see that mask instead. */
static const char probe[] =
    "while read -r l; do case $l in SigIgn:* | SigBlk:*) echo \"$l\" ;; esac; "
    "done </proc/$$/status; "
    "echo fd3=$(readlink /proc/$$/fd/3) fd20=$(readlink /proc/$$/fd/20 || echo none); "
    "set -- $(cut -d' ' -f5 /proc/$$/stat); echo pgrp=$1 pid=$$; "
    "echo cwd=$(pwd); echo cf=$0";

static void start_spawns_with_only_its_fds_and_default_signals(void **state)
{
    (void)state;
    char dir[] = "/tmp/km-klaunch-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char log[256], cf_expect[256];
    snprintf(log, sizeof log, "%s/k.log", dir);
    snprintf(cf_expect, sizeof cf_expect, "cf=%s/k1.json", dir);
    int life[2];
    assert_int_equal(pipe2(life, O_CLOEXEC), 0);
    /* a descriptor without close-on-exec, a blocked and an ignored signal:
     * none may reach the kernel */
    int stray = dup2(life[0], 20);
    assert_int_equal(stray, 20);
    sigset_t usr1, old;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &old);
    void (*oldpipe)(int) = signal(SIGPIPE, SIG_IGN);
    klaunch_cmd cmd = {.lifeline_fd = life[0]};
    /* a bare name: found on PATH, as execvp would */
    assert_int_equal(klaunch_cmd_add(&cmd, "sh"), 0);
    assert_int_equal(klaunch_cmd_add(&cmd, "-c"), 0);
    assert_int_equal(klaunch_cmd_add(&cmd, probe), 0);
    assert_int_equal(klaunch_cmd_add(&cmd, "{connection_file}"), 0);
    km_err err = {0};
    kproc *kp = klaunch_start(&cmd, dir, "k1", "tcp", log, "test", &err);
    sigprocmask(SIG_SETMASK, &old, NULL);
    signal(SIGPIPE, oldpipe);
    close(stray);
    assert_non_null(kp);
    assert_int_equal(klaunch_wait_exit(kp, 60), 1);
    assert_true(WIFEXITED(kp->status) && WEXITSTATUS(kp->status) == 0);
    char text[4096] = "";
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    struct stat st;
    assert_int_equal(fstat(life[0], &st), 0);
    char want[256];
    snprintf(want, sizeof want, "fd3=pipe:[%lu] fd20=none\n", (unsigned long)st.st_ino);
    assert_non_null(strstr(text, want));
    snprintf(want, sizeof want, "pgrp=%d pid=%d\n", (int)kp->pid, (int)kp->pid);
    assert_non_null(strstr(text, want));
    /* 1-31 at their default; glibc's posix_spawn leaves its own two
     * internal signals (32, 33) ignored, which glibc programs re-arm */
    const char *ign = strstr(text, "SigIgn:\t");
    unsigned long long ignored = ~0ULL;
    assert_non_null(ign);
    assert_int_equal(sscanf(ign, "SigIgn:\t%llx", &ignored), 1);
    assert_int_equal(ignored & 0x7fffffffULL, 0);
    /* Valgrind emulates the spawn's clone with its own signal mask still
     * in force, so the real mask the program inherits is valgrind's; the
     * ASan tier runs this natively and checks it there. */
    if (!under_valgrind())
        assert_non_null(strstr(text, "SigBlk:\t0000000000000000\n"));
    snprintf(want, sizeof want, "cwd=%s\n", dir);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, cf_expect));
    klaunch_stop(&kp, 1);

    /* a program that is not there: refused with the reason, nothing left */
    klaunch_cmd_clear(&cmd);
    assert_int_equal(klaunch_cmd_add(&cmd, "km-no-such-kernel-binary"), 0);
    assert_null(klaunch_start(&cmd, dir, "k2", "tcp", log, "test", &err));
    assert_non_null(strstr(err.msg, "km-no-such-kernel-binary"));
    char left[256];
    snprintf(left, sizeof left, "%s/k2.json", dir);
    assert_int_equal(access(left, F_OK), -1);
    klaunch_cmd_clear(&cmd);
    close(life[0]);
    close(life[1]);
    unlink(log);
    assert_int_equal(rmdir(dir), 0);
}

/* The run directory goes to a tmpfs of the user's own ($XDG_RUNTIME_DIR
 * first), in a 0700 directory named after the home's device and inode; a
 * base that is not tmpfs, or a directory another user made there first, is
 * passed over, never adopted. */
static void run_dir_prefers_a_private_tmpfs(void **state)
{
    (void)state;
    char home[] = "/tmp/km-home-XXXXXX", xdg[] = "/dev/shm/km-xdg-XXXXXX";
    assert_non_null(mkdtemp(home));
    assert_non_null(mkdtemp(xdg));
    struct stat hs, st;
    assert_int_equal(stat(home, &hs), 0);
    char *old = getenv("XDG_RUNTIME_DIR") ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;
    char out[4096], want[4096];
    km_err err = {0};
    snprintf(want, sizeof want, "%s/kernelmgr-%u-%llx-%llx", xdg, (unsigned)geteuid(),
             (unsigned long long)hs.st_dev, (unsigned long long)hs.st_ino);
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    assert_int_equal(klaunch_run_dir(home, out, sizeof out, &err), 0);
    assert_string_equal(out, want);
    assert_int_equal(lstat(out, &st), 0);
    assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700 && st.st_uid == geteuid());
    assert_int_equal(rmdir(out), 0);
    if (geteuid() == 0) {
        /* squatted by another user: not adopted */
        assert_int_equal(mkdir(want, 0700), 0);
        assert_int_equal(chown(want, 65534, 65534), 0);
        assert_int_equal(klaunch_run_dir(home, out, sizeof out, &err), 0);
        assert_string_not_equal(out, want);
        assert_int_equal(lstat(want, &st), 0);
        assert_int_equal((int)st.st_uid, 65534);
        rmdir(out);
        assert_int_equal(rmdir(want), 0);
    }
    /* a base on disk is not a runtime directory */
    setenv("XDG_RUNTIME_DIR", home, 1);
    snprintf(want, sizeof want, "%s/kernelmgr-%u-%llx-%llx", home, (unsigned)geteuid(),
             (unsigned long long)hs.st_dev, (unsigned long long)hs.st_ino);
    assert_int_equal(klaunch_run_dir(home, out, sizeof out, &err), 0);
    assert_string_not_equal(out, want);
    assert_int_equal(access(want, F_OK), -1);
    rmdir(out);
    if (old) {
        setenv("XDG_RUNTIME_DIR", old, 1);
        free(old);
    } else {
        unsetenv("XDG_RUNTIME_DIR");
    }
    assert_int_equal(rmdir(xdg), 0);
    assert_int_equal(rmdir(home), 0);
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
        cmocka_unit_test(start_spawns_with_only_its_fds_and_default_signals),
        cmocka_unit_test(run_dir_prefers_a_private_tmpfs),
        cmocka_unit_test(null_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
