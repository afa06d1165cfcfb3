/*
 * sandbox_run — run one command in a sandbox sandbox, for tests and
 * for poking at the sandbox by hand without a kernel server.
 *
 *   sandbox-run [options] [--] /abs/path/cmd [args...]
 *     --level strict|none   (default strict)
 *     --workspace DIR       read-write, the cwd (default: the cwd)
 *     --ro PATH             extra read-only path (repeatable)
 *     --network             user-mode networking (slirp4netns)
 *     --memory SIZE  --procs N  --tmp SIZE  --nofile N  --fsize SIZE
 *                           SIZE takes k/m/g suffixes (powers of 1024)
 *     --inotify N  --inotify-watches N  --sigpending N  --msgqueue SIZE
 *     --memlock SIZE        per-user kernel quota ceilings (sandbox.h)
 *     --cpus N              CPU rate cap in CPUs, e.g. 0.5 (sandbox.h)
 *     --timeout SECONDS     SIGKILL the whole sandbox after this long
 *     --loopback-listen PORT  a listener on the sandbox's 127.0.0.1:PORT,
 *                           served from outside: every connection gets
 *                           "hello from outside\n" and is closed
 *     --check               print sandbox_check() and the protections, exit
 *
 * The command gets fds 0, 1, 2 and the caller's environment. SIGINT, SIGTERM
 * and SIGHUP received by sandbox-run are forwarded with sandbox_signal().
 * On exit it prints, on stderr, "sandbox-run: limit: <reason>" when a limit
 * killed the worker, "sandbox-run: timeout" on timeout and
 * "sandbox-run: cpu_ns=N", and "sandbox-run: cpu-capped=0|1" when --cpus
 * was given. Exit status: the worker's code, 128+signal, or
 * 125 when the sandbox could not be set up (reason on stderr).
 *
 * Build: gcc -std=gnu11 -D_GNU_SOURCE -I. tests/tools/sandbox_run.c
 *        sandbox/(*).c $(pkg-config --cflags --libs jansson libseccomp)
 */
#include "sandbox/sandbox.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static volatile sig_atomic_t pending_sig;

static void on_signal(int sig)
{
    pending_sig = sig;
}

static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

/* Serves the sandbox's loopback listener from outside until killed. */
static pid_t serve_listener(int lfd)
{
    pid_t pid = fork();
    if (pid != 0) {
        close(lfd);
        return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        static const char hello[] = "hello from outside\n";
        if (write(c, hello, sizeof hello - 1) < 0) {
        }
        close(c);
    }
}

static void usage(void)
{
    fprintf(stderr, "usage: sandbox-run [--level strict|none] [--workspace DIR] [--ro PATH]... "
                    "[--network] [--memory SIZE] [--procs N] [--tmp SIZE] [--nofile N] "
                    "[--fsize SIZE] [--inotify N] [--inotify-watches N] [--sigpending N] "
                    "[--msgqueue SIZE] [--memlock SIZE] [--cpus N] [--timeout S] "
                    "[--loopback-listen PORT] "
                    "[--check] [--] CMD [ARGS...]\n");
}

int main(int argc, char **argv)
{
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    const char *ro[64];
    int nro = 0, check = 0;
    double timeout = 0;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        perror("sandbox-run: getcwd");
        return 125;
    }
    cfg.workspace = cwd;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t n;
        if (!strcmp(o, "--")) {
            i++;
            break;
        } else if (!strcmp(o, "--network")) {
            cfg.network = 1;
            continue;
        } else if (!strcmp(o, "--check")) {
            check = 1;
            continue;
        } else if (!v) {
            usage();
            return 125;
        }
        i++;
        if (!strcmp(o, "--level")) {
            if (!strcmp(v, "strict"))
                cfg.level = SANDBOX_STRICT;
            else if (!strcmp(v, "none"))
                cfg.level = SANDBOX_NONE;
            else {
                fprintf(stderr, "sandbox-run: unknown level %s\n", v);
                return 125;
            }
        } else if (!strcmp(o, "--workspace")) {
            cfg.workspace = v;
        } else if (!strcmp(o, "--ro")) {
            if (nro == 63) {
                fprintf(stderr, "sandbox-run: too many --ro\n");
                return 125;
            }
            ro[nro++] = v;
        } else if (!strcmp(o, "--timeout")) {
            timeout = atof(v);
        } else if (!strcmp(o, "--cpus")) {
            char *end;
            errno = 0;
            cfg.cpus = strtod(v, &end);
            if (errno || end == v || *end || !(cfg.cpus > 0)) {
                fprintf(stderr, "sandbox-run: bad value for --cpus: %s\n", v);
                return 125;
            }
        } else if (!strcmp(o, "--loopback-listen")) {
            cfg.loopback_listen_port = (unsigned short)atoi(v);
        } else if (parse_size(v, &n) < 0) {
            fprintf(stderr, "sandbox-run: bad value for %s: %s\n", o, v);
            return 125;
        } else if (!strcmp(o, "--memory")) {
            cfg.memory_bytes = n;
        } else if (!strcmp(o, "--procs")) {
            cfg.max_procs = (unsigned)n;
        } else if (!strcmp(o, "--tmp")) {
            cfg.tmp_bytes = n;
        } else if (!strcmp(o, "--nofile")) {
            cfg.max_open_files = (unsigned)n;
        } else if (!strcmp(o, "--fsize")) {
            cfg.max_file_bytes = n;
        } else if (!strcmp(o, "--inotify")) {
            cfg.max_inotify_instances = (unsigned)n;
        } else if (!strcmp(o, "--inotify-watches")) {
            cfg.max_inotify_watches = (unsigned)n;
        } else if (!strcmp(o, "--sigpending")) {
            cfg.max_sigpending = n;
        } else if (!strcmp(o, "--msgqueue")) {
            cfg.max_msgqueue_bytes = n;
        } else if (!strcmp(o, "--memlock")) {
            cfg.max_memlock_bytes = n;
        } else {
            fprintf(stderr, "sandbox-run: unknown option %s\n", o);
            usage();
            return 125;
        }
    }
    ro[nro] = NULL;
    cfg.ro_paths = ro;
    char err[1024];
    if (check) {
        int rc = sandbox_check(&cfg, err, sizeof err);
        printf("check: %s\n", rc == 0 ? "ok" : err);
        json_t *p = sandbox_protections(&cfg);
        char *s = json_dumps(p, JSON_COMPACT);
        printf("protections: %s\n", s ? s : "null");
        free(s);
        json_decref(p);
        return rc == 0 ? 0 : 1;
    }
    if (i >= argc) {
        usage();
        return 125;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    int fds[3] = {0, 1, 2};
    sandbox *sb = sandbox_spawn(&cfg, argv + i, environ, fds, 3, err, sizeof err);
    if (!sb) {
        fprintf(stderr, "sandbox-run: %s\n", err);
        return 125;
    }
    pid_t server = -1;
    int lfd = sandbox_take_listen_fd(sb);
    if (cfg.loopback_listen_port && lfd < 0) {
        fprintf(stderr, "sandbox-run: no loopback listener\n");
        sandbox_destroy(&sb);
        return 125;
    }
    if (lfd >= 0)
        server = serve_listener(lfd);
    if (cfg.cpus > 0)
        fprintf(stderr, "sandbox-run: cpu-capped=%d\n", sandbox_cpu_capped(sb));
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int st = 0, timed_out = 0;
    for (;;) {
        pid_t w = waitpid(sandbox_pid(sb), &st, WNOHANG);
        if (w == sandbox_pid(sb))
            break;
        if (w < 0 && errno != EINTR) {
            perror("sandbox-run: waitpid");
            break;
        }
        if (pending_sig) {
            sandbox_signal(sb, pending_sig);
            pending_sig = 0;
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double el = (double)(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
        if (timeout > 0 && el > timeout && !timed_out) {
            timed_out = 1;
            fprintf(stderr, "sandbox-run: timeout\n");
            sandbox_signal(sb, SIGKILL);
        }
        struct timespec ts = {0, 5 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    char why[256];
    const char *hit = sandbox_limit_hit(sb, st, why, sizeof why);
    if (hit)
        fprintf(stderr, "sandbox-run: limit: %s\n", hit);
    fprintf(stderr, "sandbox-run: cpu_ns=%llu\n", (unsigned long long)sandbox_cpu_ns(sb));
    sandbox_destroy(&sb);
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return 125;
}
