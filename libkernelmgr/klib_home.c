/*
 * klib_home.c — where the daemon is: the home resolved as the CLI resolves
 * it (kmcfg_home in kernelmgr/engine/config.c, made absolute like the CLI's
 * resolve_home), the `kernelmgr` binary to start, and starting it detached
 * the way the CLI does (dclient.c spawn_daemon), safely from a
 * multi-threaded host program: everything the child needs is built before
 * fork, and between fork and exec it calls only async-signal-safe functions.
 */
#include "libkernelmgr/klib_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef KLIB_BINDIR
#define KLIB_BINDIR "/usr/local/bin"
#endif

extern char **environ;

char *klib_home_resolve(const char *given, kernelmgr_error **err)
{
    const char *h = getenv("KERNELMGR_HOME");
    const char *x = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    char *path = NULL;
    int n;
    if (given && *given)
        n = asprintf(&path, "%s", given);
    else if (h && *h)
        n = asprintf(&path, "%s", h);
    else if (x && *x)
        n = asprintf(&path, "%s/kernelmgr", x);
    else
        n = asprintf(&path, "%s/.local/state/kernelmgr", home && *home ? home : "/tmp");
    if (n < 0) {
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return NULL;
    }
    if (path[0] != '/') {
        char *cwd = getcwd(NULL, 0);
        char *abs = NULL;
        if (!cwd || asprintf(&abs, "%s/%s", cwd, path) < 0) {
            klib_fail(err, KERNELMGR_EINTERNAL, 0, "cannot make the kernelmgr home %s absolute: %s",
                      path, strerror(errno));
            free(cwd);
            free(path);
            return NULL;
        }
        free(cwd);
        free(path);
        path = abs;
    }
    return path;
}

static int executable(const char *p)
{
    struct stat st;
    return !stat(p, &st) && S_ISREG(st.st_mode) && !access(p, X_OK);
}

char *klib_find_daemon(const char *given, kernelmgr_error **err)
{
    const char *env = getenv("KERNELMGR_BIN");
    const char *pick = given && *given ? given : env && *env ? env : NULL;
    if (pick) {
        if (!executable(pick)) {
            klib_fail(err, KERNELMGR_EDAEMON, 0,
                      "cannot start the daemon: %s (%s) is not an "
                      "executable file",
                      pick, pick == given ? "the daemon argument" : "KERNELMGR_BIN");
            return NULL;
        }
        char *r = strdup(pick);
        if (!r)
            klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return r;
    }
    if (executable(KLIB_BINDIR "/kernelmgr")) {
        char *r = strdup(KLIB_BINDIR "/kernelmgr");
        if (!r)
            klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return r;
    }
    /* PATH: only absolute entries, so the cwd never picks the daemon */
    const char *path = getenv("PATH");
    char *copy = strdup(path ? path : "");
    char *save = NULL, *found = NULL;
    for (char *d = copy ? strtok_r(copy, ":", &save) : NULL; d && !found;
         d = strtok_r(NULL, ":", &save)) {
        char *cand = NULL;
        if (d[0] != '/' || asprintf(&cand, "%s/kernelmgr", d) < 0)
            continue;
        if (executable(cand))
            found = cand;
        else
            free(cand);
    }
    free(copy);
    if (!found)
        klib_fail(err, KERNELMGR_EDAEMON, 0,
                  "cannot start the daemon: no kernelmgr binary (give its path, set "
                  "KERNELMGR_BIN, or put kernelmgr on PATH; %s/kernelmgr does not exist)",
                  KLIB_BINDIR);
    return found;
}

/* environ with KERNELMGR_HOME=home instead of any other value: new array
 * (free the array and its first entry), or NULL. */
static char **daemon_env(const char *home)
{
    size_t n = 0;
    while (environ && environ[n])
        n++;
    char **env = calloc(n + 2, sizeof *env);
    char *kv = NULL;
    if (!env || asprintf(&kv, "KERNELMGR_HOME=%s", home) < 0) {
        free(env);
        return NULL;
    }
    size_t k = 0;
    env[k++] = kv;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "KERNELMGR_HOME=", 15))
            env[k++] = environ[i];
    env[k] = NULL;
    return env;
}

/* The last line of home/daemon.log (new), or NULL. */
static char *log_tail(const char *home)
{
    char *p = NULL;
    if (asprintf(&p, "%s/daemon.log", home) < 0)
        return NULL;
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    free(p);
    if (fd < 0)
        return NULL;
    char buf[1024];
    off_t end = lseek(fd, 0, SEEK_END);
    off_t at = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = end > 0 ? pread(fd, buf, sizeof buf - 1, at) : 0;
    close(fd);
    if (n <= 0)
        return NULL;
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = 0;
    char *nl = strrchr(buf, '\n');
    return strdup(nl ? nl + 1 : buf);
}

/* 0 when pid has exited: gone, or a zombie its new parent has not reaped
 * (a container's init may never reap it). */
static int alive(pid_t pid)
{
    if (kill(pid, 0) && errno == ESRCH)
        return 0;
    char p[64], buf[256];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 1;
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return !(rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X'));
}

/* The child between fork and exec: async-signal-safe calls only. Reports
 * the daemon's pid, then (if exec fails) its errno, on report. */
static void child(const char *daemon, char *const argv[], char *const envp[], int nullfd, int logfd,
                  int report)
{
    setsid();
    pid_t pid = fork();
    if (pid != 0)
        _exit(pid < 0 ? 1 : 0);
    /* above stdio first: the host program may have closed 0-2, so any of
     * these fds may be one of them */
    nullfd = fcntl(nullfd, F_DUPFD_CLOEXEC, 10);
    logfd = fcntl(logfd, F_DUPFD_CLOEXEC, 10);
    report = fcntl(report, F_DUPFD_CLOEXEC, 10);
    if (nullfd < 0 || logfd < 0 || report < 0)
        _exit(127);
    pid = getpid();
    if (write(report, &pid, sizeof pid) != (ssize_t)sizeof pid)
        _exit(127);
    dup2(nullfd, 0);
    dup2(logfd, 1);
    dup2(logfd, 2);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP)
            signal(s, SIG_DFL);
    /* every other fd of the host program; report stays until exec (it is
     * O_CLOEXEC) */
    if (close_range(3, (unsigned)report - 1, 0) || close_range((unsigned)report + 1, ~0U, 0))
        for (int fd = 3; fd < 65536; fd++)
            if (fd != report)
                close(fd);
    execve(daemon, argv, envp);
    int e = errno;
    if (write(report, &e, sizeof e) < 0)
        _exit(127);
    _exit(127);
}

int klib_start_daemon(const char *daemon, const char *home, const char *sock, kernelmgr_error **err)
{
    char *argv[] = {(char *)daemon, "serve", NULL};
    char **envp = daemon_env(home);
    char *logp = NULL;
    if (!envp || asprintf(&logp, "%s/daemon.log", home) < 0) {
        if (envp)
            free(envp[0]);
        free(envp);
        return klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
    }
    int logfd =
        open(logp, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int pp[2] = {-1, -1};
    int rc = -1;
    if (logfd < 0 || nullfd < 0 || pipe2(pp, O_CLOEXEC)) {
        klib_fail(err, KERNELMGR_EDAEMON, 0, "cannot start the daemon: %s: %s", logp,
                  strerror(errno));
        goto out;
    }
    pid_t pid = fork();
    if (pid < 0) {
        klib_fail(err, KERNELMGR_EDAEMON, 0, "cannot start the daemon: fork: %s", strerror(errno));
        goto out;
    }
    if (pid == 0)
        child(daemon, argv, envp, nullfd, logfd, pp[1]);
    close(pp[1]);
    pp[1] = -1;
    /* the intermediate child exits at once; ECHILD when the host program
     * ignores SIGCHLD is fine */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    pid_t dpid = 0;
    int e = 0;
    ssize_t got = read(pp[0], &dpid, sizeof dpid);
    if (got == (ssize_t)sizeof dpid && read(pp[0], &e, sizeof e) == (ssize_t)sizeof e) {
        klib_fail(err, KERNELMGR_EDAEMON, 0, "cannot start the daemon: %s: %s", daemon,
                  strerror(e));
        goto out;
    }
    if (got != (ssize_t)sizeof dpid) {
        klib_fail(err, KERNELMGR_EDAEMON, 0,
                  "cannot start the daemon: its process ended "
                  "before it ran %s",
                  daemon);
        goto out;
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int fd = klib_dial(sock);
        if (fd >= 0) {
            rc = fd;
            break;
        }
        /* a daemon that exited (another one won the race to serve the
         * home, or it refused its configuration): one more try, then say */
        if (!alive(dpid)) {
            fd = klib_dial(sock);
            if (fd >= 0) {
                rc = fd;
                break;
            }
            char *tail = log_tail(home);
            klib_fail(err, KERNELMGR_EDAEMON, 0,
                      "the daemon (%s serve) exited at start%s%s "
                      "(see %s)",
                      daemon, tail ? ": " : "", tail ? tail : "", logp);
            free(tail);
            break;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= KLIB_START_SECONDS) {
            klib_fail(err, KERNELMGR_EDAEMON, 0, "the daemon did not come up within %d s (see %s)",
                      KLIB_START_SECONDS, logp);
            break;
        }
        poll(NULL, 0, 50);
    }
out:
    if (pp[0] >= 0)
        close(pp[0]);
    if (pp[1] >= 0)
        close(pp[1]);
    if (logfd >= 0)
        close(logfd);
    if (nullfd >= 0)
        close(nullfd);
    free(logp);
    free(envp[0]);
    free(envp);
    return rc;
}
