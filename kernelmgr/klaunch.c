/*
 * klaunch.c — kernel processes: connection files, fork/exec, stop.
 */
#include "kernelmgr/klaunch.h"

#include "kernels/server/kenvpath.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

void klaunch_cmd_clear(klaunch_cmd *cmd)
{
    for (int i = 0; i < KLAUNCH_MAX_ARGS && cmd->argv[i]; i++)
        free(cmd->argv[i]);
    memset(cmd, 0, sizeof *cmd);
}

int klaunch_cmd_add(klaunch_cmd *cmd, const char *arg)
{
    int i = 0;
    while (i < KLAUNCH_MAX_ARGS && cmd->argv[i])
        i++;
    if (i >= KLAUNCH_MAX_ARGS)
        return -1;
    cmd->argv[i] = strdup(arg);
    return cmd->argv[i] ? 0 : -1;
}

int klaunch_self_dir(char *out, size_t size)
{
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash)
        return -1;
    *slash = 0;
    if ((size_t)snprintf(out, size, "%s", buf) >= size)
        return -1;
    return 0;
}

int klaunch_cmd_from_kernelspec(klaunch_cmd *cmd, const char *name, char *err, size_t errlen)
{
    char dirs[8][PATH_MAX];
    int nd = 0;
    const char *jp = getenv("JUPYTER_PATH");
    char tmp[4096];
    if (jp) {
        snprintf(tmp, sizeof tmp, "%s", jp);
        char *save = NULL;
        for (char *t = strtok_r(tmp, ":", &save); t && nd < 4; t = strtok_r(NULL, ":", &save))
            snprintf(dirs[nd++], PATH_MAX, "%.4000s", t);
    }
    const char *home = getenv("HOME");
    if (home)
        snprintf(dirs[nd++], PATH_MAX, "%.4000s/.local/share/jupyter", home);
    snprintf(dirs[nd++], PATH_MAX, "/usr/local/share/jupyter");
    snprintf(dirs[nd++], PATH_MAX, "/usr/share/jupyter");
    for (int i = 0; i < nd; i++) {
        char dir[PATH_MAX], path[PATH_MAX + 32];
        snprintf(dir, sizeof dir, "%.3000s/kernels/%.200s", dirs[i], name);
        snprintf(path, sizeof path, "%s/kernel.json", dir);
        json_error_t jerr;
        json_t *spec = json_load_file(path, 0, &jerr);
        if (!spec)
            continue;
        json_t *argv = json_object_get(spec, "argv");
        if (!json_is_array(argv) || json_array_size(argv) == 0 ||
            json_array_size(argv) > KLAUNCH_MAX_ARGS) {
            snprintf(err, errlen, "kernelspec %s (%s): \"argv\" must be a non-empty array", name,
                     path);
            json_decref(spec);
            return -1;
        }
        klaunch_cmd_clear(cmd);
        size_t k;
        json_t *a;
        json_array_foreach(argv, k, a)
        {
            if (!json_is_string(a) || klaunch_cmd_add(cmd, json_string_value(a))) {
                snprintf(err, errlen, "kernelspec %s: argv[%zu] is not a string", name, k);
                klaunch_cmd_clear(cmd);
                json_decref(spec);
                return -1;
            }
        }
        snprintf(cmd->resource_dir, sizeof cmd->resource_dir, "%s", dir);
        const char *im = json_string_value(json_object_get(spec, "interrupt_mode"));
        cmd->interrupt_signal = !(im && !strcmp(im, "message"));
        const char *dn = json_string_value(json_object_get(spec, "display_name"));
        snprintf(cmd->display_name, sizeof cmd->display_name, "%s", dn ? dn : name);
        json_decref(spec);
        return 0;
    }
    snprintf(err, errlen,
             "no kernelspec named \"%s\" (looked in $JUPYTER_PATH, "
             "~/.local/share/jupyter, /usr/local/share/jupyter, /usr/share/jupyter)",
             name);
    return -1;
}

int klaunch_run_dir(const char *home, char *out, size_t size, char *err, size_t errlen)
{
    /* ipc endpoints are "STEM-N" with STEM = DIR/<32 hex>-<lang>: keep room */
    struct sockaddr_un sun;
    size_t need = strlen(home) + strlen("/run/") + 48;
    if (need < sizeof sun.sun_path) {
        snprintf(out, size, "%s/run", home);
    } else {
        /* a private directory named after the home, so two homes never share it */
        unsigned long h = 5381;
        for (const char *p = home; *p; p++)
            h = h * 33 + (unsigned char)*p;
        snprintf(out, size, "/tmp/kernelmgr-%u-%08lx", (unsigned)getuid(), h & 0xffffffffUL);
    }
    if (mkdir(out, 0700) && errno != EEXIST) {
        snprintf(err, errlen, "cannot create %s: %s", out, strerror(errno));
        return -1;
    }
    struct stat st;
    if (lstat(out, &st) || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) {
        snprintf(err, errlen, "%s is not a directory owned by uid %u", out, (unsigned)getuid());
        return -1;
    }
    if ((st.st_mode & 077) && chmod(out, 0700)) {
        snprintf(err, errlen, "cannot chmod %s: %s", out, strerror(errno));
        return -1;
    }
    return 0;
}

/* Substitutes placeholders in one argument. new (free()). */
static char *subst(const char *arg, const char *cf, const char *resdir)
{
    size_t cap = strlen(arg) + strlen(cf) * 4 + strlen(resdir) * 4 + 1;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t n = 0;
    for (const char *p = arg; *p;) {
        const char *rep = NULL;
        size_t skip = 0;
        if (!strncmp(p, "{connection_file}", 17)) {
            rep = cf;
            skip = 17;
        } else if (!strncmp(p, "{resource_dir}", 14)) {
            rep = resdir;
            skip = 14;
        }
        if (rep) {
            size_t l = strlen(rep);
            if (n + l + 1 > cap)
                break;
            memcpy(out + n, rep, l);
            n += l;
            p += skip;
        } else {
            if (n + 2 > cap)
                break;
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return out;
}

static void remove_ipc(const jp_connection *c)
{
    if (strcmp(c->transport, "ipc"))
        return;
    for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++) {
        char path[sizeof c->ip + 16];
        snprintf(path, sizeof path, "%s-%d", c->ip, c->ports[ch]);
        unlink(path);
    }
}

kproc *klaunch_start(const klaunch_cmd *cmd, const char *run_dir, const char *id,
                     const char *transport, const char *log_path, const char *kernel_name,
                     char *err, size_t errlen)
{
    if (!cmd->argv[0]) {
        snprintf(err, errlen, "empty kernel command");
        return NULL;
    }
    kproc *kp = calloc(1, sizeof *kp);
    if (!kp) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    kp->pid = -1;
    kp->interrupt_signal = cmd->interrupt_signal;
    /* The kernel server is a host process: it never starts in a workspace,
     * whose content sandboxed code writes (kernelmgr's kernels are told
     * their workspace with --workspace). It starts in the run directory,
     * named absolutely so the connection file path still works. */
    char *run_abs = run_dir[0] == '/' ? strdup(run_dir) : realpath(run_dir, NULL);
    if (!run_abs) {
        snprintf(err, errlen, "run directory %s: %s", run_dir, strerror(errno));
        free(kp);
        return NULL;
    }
    char stem[PATH_MAX - 16];
    snprintf(stem, sizeof stem, "%.3000s/%.64s", run_abs, id);
    snprintf(kp->cf_path, sizeof kp->cf_path, "%s.json", stem);
    jp_error jerr;
    int ipc = !strcmp(transport, "ipc");
    if (jp_connection_init(&kp->conn, ipc ? "ipc" : "tcp", ipc ? stem : NULL, kernel_name, &jerr) !=
            JP_OK ||
        jp_connection_write(kp->cf_path, &kp->conn, &jerr) != JP_OK) {
        snprintf(err, errlen, "connection file %s: %s", kp->cf_path, jerr.reason);
        free(run_abs);
        free(kp);
        return NULL;
    }

    /* everything the child needs is prepared before fork: after fork in a
     * threaded process only async-signal-safe calls are allowed. The
     * environment loses empty/relative PATH and LD_LIBRARY_PATH entries
     * (kenvpath.h): they would mean the cwd. */
    char *argv[KLAUNCH_MAX_ARGS + 1] = {0};
    char **envp = kenvpath_clean_environ(environ);
    int ok = envp != NULL;
    for (int i = 0; i < KLAUNCH_MAX_ARGS && cmd->argv[i]; i++)
        if (!(argv[i] = subst(cmd->argv[i], kp->cf_path, cmd->resource_dir)))
            ok = 0;
    int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (!ok || logfd < 0 || nullfd < 0) {
        snprintf(err, errlen, "cannot prepare kernel start (log %s): %s", log_path,
                 strerror(errno));
        goto fail;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, errlen, "fork: %s", strerror(errno));
        goto fail;
    }
    if (pid == 0) {
        setpgid(0, 0);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        if (dup2(nullfd, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(127);
        if (syscall(SYS_close_range, 3U, ~0U, 0U) != 0)
            for (int fd = 3; fd < 65536; fd++)
                close(fd);
        if (chdir(run_abs))
            _exit(126);
        execve(argv[0], argv, envp);
        /* execvp semantics for kernelspecs that name a program on PATH
         * (the cleaned PATH: environ is the cleaned copy from here on) */
        if (!strchr(argv[0], '/')) {
            environ = envp;
            execvp(argv[0], argv);
        }
        static const char msg[] = "kernelmgr: exec of kernel failed\n";
        if (write(2, msg, sizeof msg - 1) < 0) {
        }
        _exit(127);
    }
    setpgid(pid, pid); /* both sides: no race with an early kill */
    kp->pid = pid;
    close(logfd);
    close(nullfd);
    for (int i = 0; argv[i]; i++)
        free(argv[i]);
    kenvpath_free_environ(envp);
    free(run_abs);
    return kp;
fail:
    if (logfd >= 0)
        close(logfd);
    if (nullfd >= 0)
        close(nullfd);
    for (int i = 0; i < KLAUNCH_MAX_ARGS; i++)
        free(argv[i]);
    kenvpath_free_environ(envp);
    free(run_abs);
    unlink(kp->cf_path);
    free(kp);
    return NULL;
}

int klaunch_alive(kproc *kp)
{
    if (!kp || kp->pid <= 0)
        return 0;
    if (kp->exited)
        return 0;
    int st;
    pid_t r = waitpid(kp->pid, &st, WNOHANG);
    if (r == kp->pid || (r < 0 && errno == ECHILD)) {
        kp->exited = 1;
        kp->status = r == kp->pid ? st : 0;
        return 0;
    }
    return 1;
}

void klaunch_signal(kproc *kp, int sig)
{
    if (kp && kp->pid > 0 && !kp->exited) {
        if (kill(-kp->pid, sig) && errno == ESRCH)
            kill(kp->pid, sig);
    }
}

const char *klaunch_describe_exit(const kproc *kp, char *buf, size_t size)
{
    if (!kp->exited)
        snprintf(buf, size, "still running");
    else if (WIFSIGNALED(kp->status))
        snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(kp->status),
                 strsignal(WTERMSIG(kp->status)));
    else if (WIFEXITED(kp->status))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(kp->status));
    else
        snprintf(buf, size, "ended");
    return buf;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

void klaunch_stop(kproc **p, double grace)
{
    if (!p || !*p)
        return;
    kproc *kp = *p;
    if (klaunch_alive(kp)) {
        klaunch_signal(kp, SIGTERM);
        for (int i = 0; i < (int)(grace * 100) && klaunch_alive(kp); i++)
            sleep_ms(10);
        if (klaunch_alive(kp)) {
            klaunch_signal(kp, SIGKILL);
            int st;
            if (waitpid(kp->pid, &st, 0) == kp->pid) {
                kp->exited = 1;
                kp->status = st;
            }
        }
    }
    /* helpers left in the group (e.g. a kernel's own children) go too */
    if (kp->pid > 0)
        kill(-kp->pid, SIGKILL);
    unlink(kp->cf_path);
    remove_ipc(&kp->conn);
    free(kp);
    *p = NULL;
}
