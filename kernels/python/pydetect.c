/*
 * pydetect.c — find and describe the Python interpreter (see pydetect.h).
 */
#include "kernels/python/pydetect.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels/server/kcache.h"

extern char **environ;

/* Slow shims (pyenv runs a few shell scripts) and cold disks need a while;
 * a hung interpreter must still not hang the kernel's start forever. */
#define PYDETECT_PROBE_TIMEOUT_MS 20000
#define PYDETECT_PROBE_MAX_OUTPUT 65536

/* Python 2 compatible, so an old interpreter is refused by its version rather
 * than by a syntax error. */
const char pydetect_probe_script[] =
    "import sys, json\n"
    "sys.stdout.write(json.dumps({\n"
    " 'executable': sys.executable or '',\n"
    " 'version': '%d.%d.%d' % tuple(sys.version_info[:3]),\n"
    " 'version_full': sys.version,\n"
    " 'prefix': sys.prefix,\n"
    " 'base_prefix': getattr(sys, 'base_prefix', sys.prefix),\n"
    " 'implementation': getattr(getattr(sys, 'implementation', None), 'name', 'cpython')}))\n";

void pydetect_info_clear(pydetect_info *info)
{
    if (!info)
        return;
    free(info->interpreter);
    free(info->real_executable);
    free(info->version);
    free(info->version_full);
    free(info->prefix);
    free(info->base_prefix);
    free(info->implementation);
    memset(info, 0, sizeof *info);
}

static int parse_uint(const char **p, int *out)
{
    const char *s = *p;
    long v = 0;
    if (*s < '0' || *s > '9')
        return -1;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v > 100000)
            return -1;
        s++;
    }
    *out = (int)v;
    *p = s;
    return 0;
}

int pydetect_parse_version(const char *s, int *major, int *minor, int *micro)
{
    int ma, mi, mc = 0;
    if (!s || parse_uint(&s, &ma) < 0 || *s++ != '.' || parse_uint(&s, &mi) < 0)
        return -1;
    if (*s == '.') {
        s++;
        if (parse_uint(&s, &mc) < 0)
            return -1;
    }
    *major = ma;
    *minor = mi;
    *micro = mc;
    return 0;
}

int pydetect_version_ok(int major, int minor)
{
    return major > PYDETECT_MIN_MAJOR ||
           (major == PYDETECT_MIN_MAJOR && minor >= PYDETECT_MIN_MINOR);
}

static int is_exec_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

static char *absolute(const char *path)
{
    char cwd[PATH_MAX];
    char *out;
    if (path[0] == '/')
        return strdup(path);
    if (!getcwd(cwd, sizeof cwd))
        return NULL;
    if (asprintf(&out, "%s/%s", cwd, path) < 0)
        return NULL;
    return out;
}

char *pydetect_which(const char *name, const char *path_env)
{
    if (!name || !*name)
        return NULL;
    if (strchr(name, '/'))
        return is_exec_file(name) ? absolute(name) : NULL;
    if (!path_env)
        return NULL;
    const char *p = path_env;
    for (;;) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char *cand;
        if (asprintf(&cand, "%.*s/%s", (int)(len ? len : 1), len ? p : ".", name) < 0)
            return NULL;
        if (is_exec_file(cand)) {
            char *abs = absolute(cand);
            free(cand);
            return abs;
        }
        free(cand);
        if (!end)
            return NULL;
        p = end + 1;
    }
}

static char *dup_member(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? strdup(s) : NULL;
}

int pydetect_parse_probe(const char *candidate, const char *output, pydetect_info *info, char *err,
                         size_t errlen)
{
    json_error_t jerr;
    pydetect_info_clear(info);
    json_t *obj = json_loads(output ? output : "", JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "%s printed no interpreter description (is it Python?)", candidate);
        json_decref(obj);
        return -1;
    }
    char *exe = dup_member(obj, "executable");
    info->version = dup_member(obj, "version");
    info->version_full = dup_member(obj, "version_full");
    info->prefix = dup_member(obj, "prefix");
    info->base_prefix = dup_member(obj, "base_prefix");
    info->implementation = dup_member(obj, "implementation");
    json_decref(obj);
    if (!info->version || !info->prefix || !info->base_prefix || !exe ||
        pydetect_parse_version(info->version, &info->major, &info->minor, &info->micro) < 0) {
        snprintf(err, errlen, "%s printed an incomplete interpreter description", candidate);
        free(exe);
        pydetect_info_clear(info);
        return -1;
    }
    if (!info->version_full)
        info->version_full = strdup(info->version);
    if (!info->implementation)
        info->implementation = strdup("cpython");
    info->is_venv = strcmp(info->prefix, info->base_prefix) != 0;

    /* sys.executable names the interpreter that really ran: for a pyenv shim
     * the version's own python, for a venv its bin/python (not the symlink's
     * target, which would lose pyvenv.cfg and the venv's site-packages). An
     * embedded or odd build may leave it empty: then the candidate itself. */
    if (exe[0] == '/' && is_exec_file(exe)) {
        info->interpreter = exe;
    } else {
        free(exe);
        info->interpreter = absolute(candidate);
    }
    char *real = info->interpreter ? realpath(info->interpreter, NULL) : NULL;
    info->real_executable = real ? real : (info->interpreter ? strdup(info->interpreter) : NULL);
    if (!info->interpreter || !info->real_executable || !info->version_full ||
        !info->implementation) {
        snprintf(err, errlen, "out of memory");
        pydetect_info_clear(info);
        return -1;
    }
    return 0;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Appends what fd has to buf (capped); returns 0 at end of file, 1 if more may
 * come, -1 on error. */
static int slurp(int fd, char *buf, size_t *len, size_t cap)
{
    char tmp[4096];
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : -1;
    if (n == 0)
        return 0;
    size_t keep = (size_t)n;
    if (*len + keep > cap)
        keep = cap - *len;
    memcpy(buf + *len, tmp, keep);
    *len += keep;
    return 1;
}

/* Runs argv with stdout and stderr captured (NUL-terminated, capped), cwd dir.
 * Returns the wait status, or -1 with a reason in err. */
static int run_capture(char *const argv[], const char *dir, char *out, char *errout, size_t cap,
                       char *err, size_t errlen)
{
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int rc, status = -1;

    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "pipe: %s", strerror(errno));
        goto out_pipes;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    if (dir)
        posix_spawn_file_actions_addchdir_np(&fa, dir);
    rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(po[1]);
    close(pe[1]);
    po[1] = pe[1] = -1;
    if (rc != 0) {
        snprintf(err, errlen, "cannot run %s: %s", argv[0], strerror(rc));
        goto out_pipes;
    }

    size_t olen = 0, elen = 0;
    int open_o = 1, open_e = 1;
    long deadline = now_ms() + PYDETECT_PROBE_TIMEOUT_MS;
    while (open_o || open_e) {
        struct pollfd pfd[2] = {{open_o ? po[0] : -1, POLLIN, 0}, {open_e ? pe[0] : -1, POLLIN, 0}};
        long left = deadline - now_ms();
        if (left <= 0)
            break;
        int n = poll(pfd, 2, (int)left);
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (pfd[0].revents && slurp(po[0], out, &olen, cap - 1) <= 0)
            open_o = 0;
        if (pfd[1].revents && slurp(pe[0], errout, &elen, cap - 1) <= 0)
            open_e = 0;
    }
    out[olen] = '\0';
    errout[elen] = '\0';
    if (open_o || open_e) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        snprintf(err, errlen, "%s did not answer within %d s", argv[0],
                 PYDETECT_PROBE_TIMEOUT_MS / 1000);
        status = -1;
        goto out_pipes;
    }
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            snprintf(err, errlen, "waitpid: %s", strerror(errno));
            status = -1;
            break;
        }
    }
out_pipes:
    for (int i = 0; i < 2; i++) {
        if (po[i] >= 0)
            close(po[i]);
        if (pe[i] >= 0)
            close(pe[i]);
    }
    return status;
}

/* First non-empty line of s, trimmed to fit a message. */
static void first_line(const char *s, char *buf, size_t size)
{
    const char *last = NULL;
    /* Python's fatal errors put the useful line last. */
    for (const char *p = s; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 0)
            last = p;
        if (!e)
            break;
        p = e + 1;
    }
    if (!last) {
        snprintf(buf, size, "no error output");
        return;
    }
    size_t len = strcspn(last, "\n");
    snprintf(buf, size, "%.*s", (int)(len > 200 ? 200 : len), last);
}

/* The cache key of a probe, or -1 when the result must not be cached: only
 * a real executable (ELF) is; a script (pyenv's shim) can pick a different
 * Python per directory or environment. A venv's pyvenv.cfg next to or above
 * the candidate, and $PYTHONHOME, change the answer: they are in the key. */
static int probe_cache_key(const char *candidate, char *key, size_t size)
{
    char real[PATH_MAX], magic[4];
    if (!realpath(candidate, real))
        return -1;
    int fd = open(real, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, magic, 4);
    close(fd);
    if (n != 4 || memcmp(magic, "\177ELF", 4) != 0)
        return -1;
    const char *home = getenv("PYTHONHOME");
    snprintf(key, size, "pydetect-1;PYTHONHOME=%s;", home ? home : "");
    char *dir = strdup(candidate), cfg[PATH_MAX + 16];
    if (!dir)
        return -1;
    int rc = kcache_file_key(candidate, key, size);
    for (int up = 0; up < 2 && rc == 0; up++) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            break;
        *slash = '\0';
        snprintf(cfg, sizeof cfg, "%s/pyvenv.cfg", dir);
        rc = kcache_file_key(cfg, key, size);
    }
    free(dir);
    return rc;
}

int pydetect_probe(const char *candidate, const char *workspace, pydetect_info *info, char *err,
                   size_t errlen)
{
    char key[4 * PATH_MAX];
    int cacheable;
    char *out = NULL, *errout = NULL;
    int rc = -1;
    struct stat st;

    pydetect_info_clear(info);
    if (stat(candidate, &st) < 0) {
        snprintf(err, errlen, "python not found at %s (%s)", candidate, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode) || access(candidate, X_OK) < 0) {
        snprintf(err, errlen, "%s is not an executable file", candidate);
        return -1;
    }
    /* The probe costs a Python start (~20 ms): reuse an earlier answer for
     * the very same interpreter file. */
    cacheable = probe_cache_key(candidate, key, sizeof key) == 0;
    if (cacheable) {
        char *cached = kcache_get("pyprobe", key);
        if (cached) {
            int ok = pydetect_parse_probe(candidate, cached, info, err, errlen) == 0 &&
                     pydetect_version_ok(info->major, info->minor);
            free(cached);
            if (ok)
                return 0;
            pydetect_info_clear(info);
        }
    }
    out = malloc(PYDETECT_PROBE_MAX_OUTPUT);
    errout = malloc(PYDETECT_PROBE_MAX_OUTPUT);
    if (!out || !errout) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    char *argv[] = {(char *)candidate, "-c", (char *)pydetect_probe_script, NULL};
    char why[256];
    int status =
        run_capture(argv, workspace, out, errout, PYDETECT_PROBE_MAX_OUTPUT, why, sizeof why);
    if (status == -1) {
        snprintf(err, errlen, "python at %s: %s", candidate, why);
        goto done;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char line[256];
        first_line(errout, line, sizeof line);
        if (WIFSIGNALED(status))
            snprintf(err, errlen, "python at %s was killed by signal %d: %s", candidate,
                     WTERMSIG(status), line);
        else
            snprintf(err, errlen, "python at %s failed (exit status %d): %s", candidate,
                     WEXITSTATUS(status), line);
        goto done;
    }
    if (pydetect_parse_probe(candidate, out, info, err, errlen) < 0)
        goto done;
    if (cacheable && pydetect_version_ok(info->major, info->minor))
        kcache_put("pyprobe", key, out);
    if (!pydetect_version_ok(info->major, info->minor)) {
        snprintf(err, errlen, "python %s at %s is too old: kernelmgr needs Python >= %d.%d",
                 info->version, info->interpreter, PYDETECT_MIN_MAJOR, PYDETECT_MIN_MINOR);
        pydetect_info_clear(info);
        goto done;
    }
    rc = 0;
done:
    free(out);
    free(errout);
    return rc;
}

/* Probes an explicitly chosen interpreter: failure is final. */
static int probe_named(const char *source, const char *name, const pydetect_sources *src,
                       pydetect_info *info, char *err, size_t errlen)
{
    char why[1024];
    char *path = pydetect_which(name, src->path_env);
    if (!path) {
        if (strchr(name, '/'))
            snprintf(err, errlen, "%s: python not found at %s (missing or not executable)", source,
                     name);
        else
            snprintf(err, errlen, "%s: no executable named %s on PATH", source, name);
        return -1;
    }
    int rc = pydetect_probe(path, src->workspace, info, why, sizeof why);
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", source, why);
    else
        info->source = source;
    free(path);
    return rc;
}

int pydetect_find(const pydetect_sources *src, pydetect_info *info, char *err, size_t errlen)
{
    char path[PATH_MAX];
    struct stat st;

    pydetect_info_clear(info);
    if (src->explicit_path && *src->explicit_path)
        return probe_named("--python", src->explicit_path, src, info, err, errlen);
    if (src->env_python && *src->env_python)
        return probe_named("$KERNELMGR_PYTHON", src->env_python, src, info, err, errlen);
    /* A workspace venv that exists but is broken (e.g. its base interpreter
     * was removed) is an error, not a reason to silently use another Python. */
    if (src->workspace && *src->workspace) {
        snprintf(path, sizeof path, "%s/.venv/bin/python", src->workspace);
        if (lstat(path, &st) == 0)
            return probe_named(".venv", path, src, info, err, errlen);
    }
    if (src->virtual_env && *src->virtual_env) {
        snprintf(path, sizeof path, "%s/bin/python", src->virtual_env);
        if (lstat(path, &st) == 0)
            return probe_named("$VIRTUAL_ENV", path, src, info, err, errlen);
    }
    char *found = pydetect_which("python3", src->path_env);
    if (found) {
        free(found);
        return probe_named("PATH", "python3", src, info, err, errlen);
    }
    snprintf(err, errlen,
             "no Python interpreter found (tried --python, $KERNELMGR_PYTHON, %s/.venv/bin/python, "
             "$VIRTUAL_ENV%s, python3 on PATH): install Python >= %d.%d or pass --python PATH",
             src->workspace ? src->workspace : "<workspace>",
             src->virtual_env && *src->virtual_env ? " (no bin/python)" : " (unset)",
             PYDETECT_MIN_MAJOR, PYDETECT_MIN_MINOR);
    return -1;
}
