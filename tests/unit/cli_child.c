/*
 * cli_child.c — see cli_child.h.
 */
#include "tests/unit/cli_child.h"
#include "kernelmgr/frontends/cli.h"

#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

char *cli_child_slurp(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        print_message("cannot read %s\n", path);
    assert_non_null(f);
    size_t cap = 4096, n = 0, r;
    char *buf = malloc(cap);
    assert_non_null(buf);
    while ((r = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            char *bigger = realloc(buf, cap);
            assert_non_null(bigger);
            buf = bigger;
        }
    }
    buf[n] = 0;
    fclose(f);
    return buf;
}

cli_outcome cli_child_run(const cli_child *how, const char *const *args)
{
    char in[PATH_MAX], out[PATH_MAX], err[PATH_MAX];
    snprintf(in, sizeof in, "%s/cli.in", how->dir);
    snprintf(out, sizeof out, "%s/cli.out", how->dir);
    snprintf(err, sizeof err, "%s/cli.err", how->dir);
    if (how->in) {
        FILE *f = fopen(in, "we");
        assert_non_null(f);
        assert_true(fputs(how->in, f) >= 0);
        assert_int_equal(fclose(f), 0);
    }
    char *argv[32];
    int argc = 0;
    argv[argc++] = "kernelmgr";
    for (; args[argc - 1]; argc++) {
        assert_true(argc < 31);
        argv[argc] = (char *)args[argc - 1];
    }
    argv[argc] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int i = open(how->in ? in : "/dev/null", O_RDONLY | O_CLOEXEC);
        int o = open(how->out_path ? how->out_path : out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                     0600);
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (i < 0 || o < 0 || e < 0 || dup2(i, 0) < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(97);
        setenv("KERNELMGR_HOME", how->dir, 1);
        unsetenv("XDG_STATE_HOME");
        unsetenv("KERNELMGR_ALLOWLIST");
        for (int k = 0; how->env && how->env[k]; k++)
            putenv((char *)how->env[k]);
        exit(cli_main(argc, argv));
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st))
        print_message("kernelmgr %s: ended by signal %d\n", args[0] ? args[0] : "", WTERMSIG(st));
    assert_true(WIFEXITED(st));
    cli_outcome r = {WEXITSTATUS(st), how->out_path ? strdup("") : cli_child_slurp(out),
                     cli_child_slurp(err)};
    return r;
}

void cli_outcome_free(cli_outcome *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}
