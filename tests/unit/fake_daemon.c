/*
 * fake_daemon.c — see fake_daemon.h.
 */
#include "tests/unit/fake_daemon.h"

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
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "common/cm_clock.h"
#include "kernelmgr/engine/config.h"
#include "kernelmgr/service/daemon.h"
#include "tests/unit/cli_child.h"
#include "tests/unit/fake_kernel.h"

void fake_daemon_config(const char *home, char *link, size_t size, json_t *extra)
{
    assert_int_equal(fake_kernel_link(home, link, size), 0);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", home);
    json_t *conf =
        json_pack("{s:{s:{s:s}}, s:s}", "kernels", "fake", "backend", link, "sandbox", "none");
    if (extra)
        json_object_update(conf, extra);
    assert_int_equal(json_dump_file(conf, path, 0), 0);
    json_decref(conf);
}

pid_t fake_daemon_start(const char *home, const daemon_http_ops *http)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* a test binary that dies (its watchdog) takes its daemon along */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        char log[PATH_MAX], conf[PATH_MAX];
        snprintf(log, sizeof log, "%s/daemon.test.log", home);
        snprintf(conf, sizeof conf, "%s/config.json", home);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0 || in < 0 || dup2(in, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(97);
        kmcfg cfg;
        kmcfg_defaults(&cfg);
        km_err err = {0};
        if (kmcfg_load_file(&cfg, conf, KMCFG_MUST_EXIST, &err))
            _exit(98);
        daemon_http_register(http);
        int rc = daemon_serve(home, &cfg, &err);
        if (rc)
            fprintf(stderr, "daemon_serve: %d %s\n", rc, err.msg);
        kmcfg_clear(&cfg);
        exit(rc);
    }
    double end = cm_mono_s() + 90; /* under valgrind on a loaded machine: slow */
    for (;;) {
        km_err err = {0};
        int fd = daemon_connect(home, 0, NULL, &err);
        if (fd >= 0) {
            close(fd);
            return pid;
        }
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            fail_msg("the daemon ended (status %d) before it answered", st);
        assert_true(cm_mono_s() < end);
        usleep(20 * 1000); /* polls a condition, with a deadline */
    }
}

void fake_daemon_stop(const char *home, pid_t pid)
{
    cli_child how = {home, NULL, NULL, NULL};
    cli_outcome r = cli_child_run(&how, (const char *[]){"serve", "--stop", NULL});
    if (r.status)
        print_message("serve --stop: exit %d\nstderr: %s\n", r.status, r.err);
    assert_int_equal(r.status, 0);
    cli_outcome_free(&r);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}
