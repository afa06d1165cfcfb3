/*
 * sandbox.c — sandbox_spawn() and the object that tracks a running sandbox.
 * Level "none" is implemented here (fork/exec with the fd plan, setsid,
 * PDEATHSIG, rlimits); level "strict" is assembled from the per-concern files
 * of this directory.
 */
#include "kernels/sandbox/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

struct sandbox {
    pid_t pid;       /* direct child the caller waits for */
    int reaped;      /* caller told us (via destroy) or we reaped it */
    sandbox_config cfg;
};

void sandbox_config_defaults(sandbox_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->level = SANDBOX_STRICT;
    cfg->memory_bytes = 2ull << 30;
    cfg->tmp_bytes = 512ull << 20;
    cfg->max_procs = 256;
    cfg->max_open_files = 1024;
    cfg->max_file_bytes = 1ull << 30;
}

/* In the child: moves fds[i] to i for every i, closes everything else. Uses
 * a temporary high range first so that fds[i] == j for j < i is handled. */
static int child_setup_fds(const int *fds, int nfds)
{
    int tmp[16];
    if (nfds > 16)
        return -1;
    for (int i = 0; i < nfds; i++) {
        tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 100);
        if (tmp[i] < 0)
            return -1;
    }
    for (int i = 0; i < nfds; i++)
        if (dup2(tmp[i], i) < 0)
            return -1;
    /* close_range(nfds, ~0U, 0): every inherited fd, libzmq's included. */
    if (syscall(SYS_close_range, (unsigned)nfds, ~0U, 0) < 0) {
        for (int fd = nfds; fd < 65536; fd++)
            close(fd);
    }
    return 0;
}

static void child_rlimits(const sandbox_config *cfg)
{
    struct rlimit r;
    r.rlim_cur = r.rlim_max = 0;
    setrlimit(RLIMIT_CORE, &r);
    if (cfg->max_open_files) {
        r.rlim_cur = r.rlim_max = cfg->max_open_files;
        setrlimit(RLIMIT_NOFILE, &r);
    }
    if (cfg->max_file_bytes) {
        r.rlim_cur = r.rlim_max = cfg->max_file_bytes;
        setrlimit(RLIMIT_FSIZE, &r);
    }
}

static sandbox *spawn_none(const sandbox_config *cfg, char *const argv[], char *const envp[],
                           const int *fds, int nfds, char *err, size_t errlen)
{
    sandbox *sb = calloc(1, sizeof *sb);
    if (!sb) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    sb->cfg = *cfg;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        free(sb);
        return NULL;
    }
    if (pid == 0) {
        /* New session and process group: interrupts go to the whole group and
         * the worker has no controlling terminal. */
        setsid();
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        for (int s = 1; s < NSIG; s++)
            if (s != SIGKILL && s != SIGSTOP)
                signal(s, SIG_DFL);
        if (child_setup_fds(fds, nfds) < 0)
            _exit(127);
        child_rlimits(cfg);
        if (cfg->workspace && chdir(cfg->workspace) < 0) {
            dprintf(2, "sandbox: chdir %s: %s\n", cfg->workspace, strerror(errno));
            _exit(127);
        }
        execve(argv[0], argv, envp);
        dprintf(2, "sandbox: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    sb->pid = pid;
    return sb;
}

sandbox *sandbox_spawn(const sandbox_config *cfg, char *const argv[], char *const envp[],
                       const int *fds, int nfds, char *err, size_t errlen)
{
    if (!cfg || !argv || !argv[0] || nfds < 0) {
        snprintf(err, errlen, "sandbox_spawn: invalid arguments");
        return NULL;
    }
    if (cfg->level == SANDBOX_NONE)
        return spawn_none(cfg, argv, envp, fds, nfds, err, errlen);
    snprintf(err, errlen, "sandbox level strict is not available in this build yet");
    return NULL;
}

pid_t sandbox_pid(const sandbox *sb)
{
    return sb ? sb->pid : -1;
}

int sandbox_signal(sandbox *sb, int sig)
{
    if (!sb || sb->pid <= 0)
        return -1;
    return kill(-sb->pid, sig);
}

const char *sandbox_limit_hit(sandbox *sb, int wait_status, char *buf, size_t size)
{
    (void)sb;
    if (WIFSIGNALED(wait_status) && WTERMSIG(wait_status) == SIGXFSZ) {
        snprintf(buf, size, "file size limit exceeded (limit %llu bytes)",
                 (unsigned long long)sb->cfg.max_file_bytes);
        return buf;
    }
    return NULL;
}

uint64_t sandbox_cpu_ns(sandbox *sb)
{
    (void)sb;
    return 0;
}

void sandbox_destroy(sandbox **psb)
{
    if (!psb || !*psb)
        return;
    sandbox *sb = *psb;
    if (sb->pid > 0) {
        kill(-sb->pid, SIGKILL);
        kill(sb->pid, SIGKILL);
        waitpid(sb->pid, NULL, 0); /* ECHILD if the caller reaped it: fine */
    }
    free(sb);
    *psb = NULL;
}

json_t *sandbox_protections(const sandbox_config *cfg)
{
    json_t *a = json_array();
    if (cfg->level == SANDBOX_NONE) {
        json_array_append_new(a, json_string("none"));
        return a;
    }
    return a;
}

int sandbox_check(const sandbox_config *cfg, char *err, size_t errlen)
{
    if (cfg->level == SANDBOX_NONE)
        return 0;
    snprintf(err, errlen, "sandbox level strict is not available in this build yet");
    return -1;
}
