/*
 * pydetect.c — find and describe the Python interpreter (see pydetect.h).
 */
#include "kernels/python/pydetect.h"
#include "common/cm_clock.h"
#include "common/cm_io.h"
#include "common/cm_path.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <linux/openat2.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels/server/kcache.h"
#include "kernels/server/kenvpath.h"

/* Slow shims (pyenv runs a few shell scripts) and cold disks need a while;
 * a hung interpreter must still not hang the kernel's start forever. */
#define PYDETECT_PROBE_TIMEOUT_MS 20000
#define PYDETECT_PROBE_MAX_OUTPUT 65536
#define PYDETECT_DEFAULT_PATH "/usr/local/bin:/usr/bin:/bin"
#define PYDETECT_SHIM_MAX 4096 /* bytes of a pyenv shim read (it has ~300) */

/* Run as `python -I -S -c`: -I (no PYTHON* variables, no user site, no cwd
 * or script directory on sys.path) and -S (no site.py, so no .pth files).
 * Without site, Python < 3.11 leaves a venv's sys.prefix at the base: the
 * venv is found as site.venv() finds it (pyvenv.cfg beside the executable or
 * one directory up; the prefix is the executable's directory's parent). */
const char pydetect_probe_script[] =
    "import sys, os, json\n"
    "e = sys.executable or ''\n"
    "p = sys.prefix\n"
    "b = getattr(sys, 'base_prefix', p)\n"
    "if p == b and e:\n"
    "    d = os.path.dirname(os.path.abspath(e))\n"
    "    for c in (d, os.path.dirname(d)):\n"
    "        if os.path.isfile(os.path.join(c, 'pyvenv.cfg')):\n"
    "            p = os.path.dirname(d)\n"
    "            break\n"
    "sys.stdout.write(json.dumps({\n"
    " 'executable': e,\n"
    " 'version': '%d.%d.%d' % tuple(sys.version_info[:3]),\n"
    " 'version_full': sys.version,\n"
    " 'prefix': p,\n"
    " 'base_prefix': b,\n"
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

/* 1 when the real file behind path starts with the ELF magic. Opened
 * non-blocking (a FIFO must not hang us) and checked to be regular. */
static int is_elf(const char *path)
{
    char magic[4];
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st;
    int ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && read(fd, magic, 4) == 4 &&
             memcmp(magic, "\177ELF", 4) == 0;
    close(fd);
    return ok;
}

static char *absolute(const char *path)
{
    char *out;
    if (path[0] == '/')
        return strdup(path);
    char *cwd = getcwd(NULL, 0);
    if (!cwd)
        return NULL;
    if (asprintf(&out, "%s/%s", cwd, path) < 0)
        out = NULL;
    free(cwd);
    return out;
}

/* new: realpath of path's directory + "/" + its last component: a path
 * without symlinks in its directories (the last component may be one).
 * NULL when the directory does not resolve. */
static char *canonical_dir_path(const char *path)
{
    char *abs = absolute(path);
    if (!abs)
        return NULL;
    char *slash = strrchr(abs, '/');
    char *out = NULL;
    *slash = '\0';
    char *dir = realpath(abs[0] ? abs : "/", NULL);
    if (dir && asprintf(&out, "%s/%s", strcmp(dir, "/") ? dir : "", slash + 1) < 0)
        out = NULL;
    free(dir);
    free(abs);
    return out;
}

/* 1 when path lies in the workspace by any reading: as written, with its
 * directories resolved, or fully resolved. ws and ws_real may be NULL. */
static int in_workspace(const char *path, const char *ws, const char *ws_real)
{
    if (!ws && !ws_real)
        return 0;
    char *abs = absolute(path);
    int in = !abs || cm_path_under(abs, ws) || cm_path_under(abs, ws_real);
    free(abs);
    if (!in) {
        char *c = canonical_dir_path(path);
        in = c && (cm_path_under(c, ws) || cm_path_under(c, ws_real));
        free(c);
    }
    if (!in) {
        char *r = realpath(path, NULL);
        in = r && (cm_path_under(r, ws) || cm_path_under(r, ws_real));
        free(r);
    }
    return in;
}

/* First executable `name` on path_env, skipping empty/relative entries
 * (kenvpath_clean) and, when ws/ws_real are set, entries and files in the
 * workspace. new. */
static char *which_ex(const char *name, const char *path_env, const char *ws, const char *ws_real)
{
    if (!name || !*name)
        return NULL;
    if (strchr(name, '/'))
        return is_exec_file(name) ? absolute(name) : NULL;
    char *clean = path_env ? kenvpath_clean(path_env, ':') : NULL;
    char *found = NULL, *save = NULL;
    for (char *dir = clean ? strtok_r(clean, ":", &save) : NULL; dir && !found;
         dir = strtok_r(NULL, ":", &save)) {
        char *cand;
        if (asprintf(&cand, "%s/%s", dir, name) < 0)
            break;
        if (is_exec_file(cand) && !in_workspace(cand, ws, ws_real))
            found = cand;
        else
            free(cand);
    }
    free(clean);
    return found;
}

char *pydetect_which(const char *name, const char *path_env)
{
    return which_ex(name, path_env, NULL, NULL);
}

char **pydetect_probe_env(const char *path_env)
{
    static const char *const keep[] = {"HOME", "LANG", "LC_ALL", "PYENV_ROOT", "PYENV_VERSION"};
    char **env = calloc(sizeof keep / sizeof *keep + 2, sizeof *env);
    if (!env)
        return NULL;
    size_t n = 0;
    char *path = kenvpath_clean(path_env ? path_env : "", ':');
    if (!path || asprintf(&env[n++], "PATH=%s", *path ? path : PYDETECT_DEFAULT_PATH) < 0) {
        free(path);
        env[--n] = NULL;
        pydetect_free_env(env);
        return NULL;
    }
    free(path);
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++) {
        const char *v = getenv(keep[i]);
        if (!v)
            continue;
        if (asprintf(&env[n], "%s=%s", keep[i], v) < 0) {
            env[n] = NULL;
            pydetect_free_env(env);
            return NULL;
        }
        n++;
    }
    return env;
}

void pydetect_free_env(char **env)
{
    if (!env)
        return;
    for (size_t i = 0; env[i]; i++)
        free(env[i]);
    free(env);
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

/* Checks one directory the probe reported (what = "prefix"...). */
static int check_prefix(const pydetect_info *info, const char *what, const char *dir,
                        const char *ws, const char *ws_real, char *err, size_t errlen)
{
    struct stat st;
    if (dir[0] != '/') {
        snprintf(err, errlen, "%s %s is not an absolute path", what, dir);
        return -1;
    }
    char *real = realpath(dir, NULL);
    if (!real || strcmp(real, dir) != 0) {
        snprintf(err, errlen, "%s %s is not a normalised path of an existing directory", what, dir);
        free(real);
        return -1;
    }
    free(real);
    if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s %s is not a directory", what, dir);
        return -1;
    }
    if (strcmp(dir, "/") == 0) {
        snprintf(err, errlen, "%s is \"/\": the whole host would be exposed", what);
        return -1;
    }
    if (cm_path_under(dir, ws) || cm_path_under(dir, ws_real)) {
        snprintf(err, errlen, "%s %s is inside the workspace", what, dir);
        return -1;
    }
    if (cm_path_under(info->real_executable, dir))
        return 0;
    char *idir = info->workspace_venv ? NULL : canonical_dir_path(info->interpreter);
    int ok = idir && cm_path_under(idir, dir);
    free(idir);
    if (ok)
        return 0;
    char *lib = NULL;
    if (asprintf(&lib, "%s/lib/python%d.%d", dir, info->major, info->minor) < 0)
        lib = NULL;
    ok = lib && stat(lib, &st) == 0 && S_ISDIR(st.st_mode);
    free(lib);
    if (ok)
        return 0;
    snprintf(err, errlen,
             "%s %s is not where the interpreter %s lives (not its ancestor and no "
             "lib/python%d.%d in it)",
             what, dir, info->real_executable, info->major, info->minor);
    return -1;
}

int pydetect_validate(const pydetect_info *info, const char *workspace, char *err, size_t errlen)
{
    struct stat st;
    int rc = -1;
    char *ws_real = workspace ? realpath(workspace, NULL) : NULL;
    const char *ws = workspace;
    if (!info->interpreter || !info->real_executable || !info->prefix || !info->base_prefix) {
        snprintf(err, errlen, "incomplete interpreter description");
        goto out;
    }
    char *real = realpath(info->real_executable, NULL);
    int normal = real && strcmp(real, info->real_executable) == 0;
    free(real);
    if (!normal || stat(info->real_executable, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "executable %s is not the normalised path of a regular file",
                 info->real_executable);
        goto out;
    }
    if (cm_path_under(info->real_executable, ws) || cm_path_under(info->real_executable, ws_real)) {
        snprintf(err, errlen, "executable %s is inside the workspace", info->real_executable);
        goto out;
    }
    if (info->interpreter[0] != '/') {
        snprintf(err, errlen, "interpreter %s is not an absolute path", info->interpreter);
        goto out;
    }
    if (info->workspace_venv) {
        if (!(cm_path_under(info->prefix, ws) || cm_path_under(info->prefix, ws_real)) ||
            !cm_path_under(info->interpreter, info->prefix)) {
            snprintf(err, errlen, "workspace venv %s is not in the workspace", info->prefix);
            goto out;
        }
    } else {
        if (in_workspace(info->interpreter, ws, ws_real)) {
            snprintf(err, errlen, "interpreter %s is inside the workspace", info->interpreter);
            goto out;
        }
        if (check_prefix(info, "prefix", info->prefix, ws, ws_real, err, errlen) < 0)
            goto out;
    }
    if (check_prefix(info, "base_prefix", info->base_prefix, ws, ws_real, err, errlen) < 0)
        goto out;
    rc = 0;
out:
    free(ws_real);
    return rc;
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

/* Runs argv with environment envp, cwd "/", stdout and stderr captured
 * (NUL-terminated, capped). Returns the wait status, or -1 with a reason in
 * err. */
static int run_capture(char *const argv[], char *const envp[], char *out, char *errout, size_t cap,
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
    posix_spawn_file_actions_addchdir_np(&fa, "/");
    rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
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
    long deadline = (long)cm_mono_ms() + PYDETECT_PROBE_TIMEOUT_MS;
    while (open_o || open_e) {
        struct pollfd pfd[2] = {{open_o ? po[0] : -1, POLLIN, 0}, {open_e ? pe[0] : -1, POLLIN, 0}};
        long left = deadline - (long)cm_mono_ms();
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

/* The cache key of a probe of the trusted candidate, or -1 when the result
 * must not be cached: only a real executable (ELF) is; a script (pyenv's
 * shim) can pick a different Python per environment. The key names the real
 * executable's identity (path, dev, inode, size, mtime) and that of a venv's
 * pyvenv.cfg next to or above the candidate, which change the answer. */
static int probe_cache_key(const char *candidate, char *key, size_t size)
{
    char *real = realpath(candidate, NULL);
    int elf = real && is_elf(real);
    free(real);
    if (!elf)
        return -1;
    snprintf(key, size, "pydetect-2;");
    char *dir = strdup(candidate);
    if (!dir)
        return -1;
    int rc = kcache_file_key(candidate, key, size);
    for (int up = 0; up < 2 && rc == 0; up++) {
        char *slash = strrchr(dir, '/');
        char *cfg = NULL;
        if (!slash)
            break;
        *slash = '\0';
        if (asprintf(&cfg, "%s/pyvenv.cfg", dir) < 0) {
            rc = -1;
            break;
        }
        rc = kcache_file_key(cfg, key, size);
        free(cfg);
    }
    free(dir);
    return rc;
}

/* The PYENV_ROOT a pyenv shim exports (new, free()), or NULL when path is
 * not a pyenv shim: a small script that exports PYENV_ROOT="ROOT" and execs
 * "ROOT/libexec/pyenv" exec "$program" (what `pyenv rehash` writes). */
static char *pyenv_shim_root(const char *path)
{
    char buf[PYDETECT_SHIM_MAX + 1];
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    ssize_t n = cm_read_full(fd, buf, sizeof buf - 1);
    size_t len = n > 0 ? (size_t)n : 0;
    close(fd);
    buf[len] = '\0';
    if (len == sizeof buf - 1 || strncmp(buf, "#!", 2) != 0 || strlen(buf) != len)
        return NULL; /* too big for a shim, not a script, or binary */
    static const char exp[] = "\nexport PYENV_ROOT=\"";
    const char *r = strstr(buf, exp);
    if (!r)
        return NULL;
    r += sizeof exp - 1;
    size_t rl = strcspn(r, "\"\n$`\\");
    if (rl == 0 || r[rl] != '"' || r[0] != '/')
        return NULL;
    char *root = strndup(r, rl), *execline = NULL;
    if (!root || asprintf(&execline, "\nexec \"%s/libexec/pyenv\" exec \"$program\"", root) < 0) {
        free(root);
        return NULL;
    }
    int ok = strstr(buf, execline) != NULL;
    free(execline);
    if (!ok) {
        free(root);
        return NULL;
    }
    return root;
}

/* The cache key of a probe of a pyenv shim, or -1 (not a shim, or too
 * long). A shim's answer depends on what pyenv reads to pick a version: the
 * shim itself, PYENV_VERSION, PYENV_ROOT (the environment's and the one the
 * shim exports), HOME, the probe's PATH ("system"), the global version file
 * $ROOT/version, the versions directory, pyenv itself, and /.python-version
 * (the probe runs in "/", never in the workspace: a workspace's
 * .python-version cannot matter). The answer names a real executable whose
 * identity is stored with it and checked on use (shim_from_cache). */
static int shim_cache_key(const char *path, const char *path_env, char *key, size_t size)
{
    char *root = pyenv_shim_root(path);
    if (!root)
        return -1;
    const char *ver = getenv("PYENV_VERSION"), *envroot = getenv("PYENV_ROOT");
    const char *home = getenv("HOME");
    char *clean = kenvpath_clean(path_env ? path_env : "", ':');
    int rc = -1;
    snprintf(key, size, "pydetect-shim-1;");
    if (clean && kcache_file_key(path, key, size) == 0) {
        size_t used = strlen(key);
        int n = snprintf(key + used, size - used,
                         "PYENV_VERSION%s%s;PYENV_ROOT%s%s;HOME%s%s;shimroot=%s;PATH=%s;",
                         ver ? "=" : "-", ver ? ver : "", envroot ? "=" : "-",
                         envroot ? envroot : "", home ? "=" : "-", home ? home : "", root,
                         *clean ? clean : PYDETECT_DEFAULT_PATH);
        rc = n < 0 || (size_t)n >= size - used ? -1 : 0;
    }
    static const char *const files[] = {"version", "versions", "libexec/pyenv"};
    for (size_t i = 0; rc == 0 && i < sizeof files / sizeof *files; i++) {
        char *f = NULL;
        if (asprintf(&f, "%s/%s", root, files[i]) < 0)
            rc = -1;
        else
            rc = kcache_file_key(f, key, size);
        free(f);
    }
    if (rc == 0)
        rc = kcache_file_key("/.python-version", key, size);
    free(clean);
    free(root);
    return rc;
}

/* A cached shim answer: "IDENTITY\nPROBE-OUTPUT", IDENTITY being
 * kcache_file_key() of the interpreter it named when it was stored. 0 and
 * info filled when it still names the same unchanged real executable. */
static int shim_from_cache(const char *path, const char *cached, pydetect_info *info)
{
    char why[1024], ident[4096] = "";
    const char *nl = strchr(cached, '\n');
    if (!nl)
        return -1;
    if (pydetect_parse_probe(path, nl + 1, info, why, sizeof why) < 0)
        return -1;
    if (!is_elf(info->real_executable) ||
        kcache_file_key(info->interpreter, ident, sizeof ident) < 0 ||
        strlen(ident) != (size_t)(nl - cached) || memcmp(ident, cached, strlen(ident)) != 0) {
        pydetect_info_clear(info);
        return -1;
    }
    return 0;
}

/* Stores a fresh shim answer with the identity of what it names. */
static void shim_put(const char *key, const pydetect_info *info, const char *out)
{
    char ident[4096] = "";
    char *value = NULL;
    if (!is_elf(info->real_executable) ||
        kcache_file_key(info->interpreter, ident, sizeof ident) < 0 ||
        asprintf(&value, "%s\n%s", ident, out) < 0)
        return;
    kcache_put("pyshim", key, value);
    free(value);
}

/* Version, path and sanity checks of a parsed probe (cached or fresh). */
static int accept_probe(const char *candidate, const char *ws, pydetect_info *info, char *err,
                        size_t errlen)
{
    char why[1024];
    if (!pydetect_version_ok(info->major, info->minor)) {
        snprintf(err, errlen, "python %s at %s is too old: kernelmgr needs Python >= %d.%d",
                 info->version, candidate, PYDETECT_MIN_MAJOR, PYDETECT_MIN_MINOR);
        pydetect_info_clear(info);
        return -1;
    }
    if (pydetect_validate(info, ws, why, sizeof why) < 0) {
        snprintf(err, errlen, "python at %s gave an unusable description: %s", candidate, why);
        pydetect_info_clear(info);
        return -1;
    }
    return 0;
}

/* argv[1]: the module name. With -S, `import site` does not run site.main()
 * (no .pth file is processed); getsitepackages() only names directories. */
static const char has_module_script[] =
    "import sys, os, site, importlib.machinery as m\n"
    "e = sys.executable or ''\n"
    "p = sys.prefix\n"
    "if p == getattr(sys, 'base_prefix', p) and e:\n"
    "    d = os.path.dirname(os.path.abspath(e))\n"
    "    if os.path.isfile(os.path.join(os.path.dirname(d), 'pyvenv.cfg')):\n"
    "        p = os.path.dirname(d)\n"
    "paths = list(sys.path) + site.getsitepackages([p])\n"
    "sys.stdout.write('1' if m.PathFinder.find_spec(sys.argv[1], paths) else '0')\n";

int pydetect_has_module(const pydetect_info *info, const char *name, char *err, size_t errlen)
{
    if (!info->interpreter || info->workspace_venv) {
        snprintf(err, errlen, "a workspace venv is never run on the host");
        return -1;
    }
    if (!*name || strlen(name) > 100 ||
        strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU"
                     "VWXYZ0123456789_") != strlen(name)) {
        snprintf(err, errlen, "not a top-level module name");
        return -1;
    }
    char **envp = pydetect_probe_env(getenv("PATH"));
    char out[64] = "", errout[1024] = "";
    char *argv[] = {info->interpreter,         "-I",         "-S", "-c",
                    (char *)has_module_script, (char *)name, NULL};
    int st = envp ? run_capture(argv, envp, out, errout, sizeof out - 1, err, errlen) : -1;
    if (!envp)
        snprintf(err, errlen, "out of memory");
    pydetect_free_env(envp);
    if (st < 0)
        return -1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || (strcmp(out, "1") && strcmp(out, "0"))) {
        snprintf(err, errlen, "%s could not tell whether %s is importable", info->interpreter,
                 name);
        return -1;
    }
    return out[0] == '1';
}

int pydetect_probe(const char *candidate, const char *workspace, const char *path_env,
                   pydetect_info *info, char *err, size_t errlen)
{
    char key[16384];
    int cacheable, shim;
    char *out = NULL, *errout = NULL, *path = NULL, *ws_real = NULL;
    char **envp = NULL;
    int rc = -1;
    struct stat st;

    pydetect_info_clear(info);
    ws_real = workspace ? realpath(workspace, NULL) : NULL;
    if (in_workspace(candidate, workspace, ws_real)) {
        snprintf(err, errlen,
                 "%s is inside the workspace, which sandboxed code can write: it is never run "
                 "on the host (use a venv in the workspace, or an interpreter outside it)",
                 candidate);
        goto done;
    }
    /* Run the candidate by a path whose directories hold no symlink. */
    path = canonical_dir_path(candidate);
    if (!path || stat(path, &st) < 0) {
        snprintf(err, errlen, "python not found at %s (%s)", candidate,
                 path ? strerror(errno) : "no such directory");
        goto done;
    }
    if (!S_ISREG(st.st_mode) || access(path, X_OK) < 0) {
        snprintf(err, errlen, "%s is not an executable file", candidate);
        goto done;
    }
    /* The probe costs a Python start (~20 ms): reuse an earlier answer for
     * the very same interpreter file (validated again like a fresh one). */
    cacheable = probe_cache_key(path, key, sizeof key) == 0;
    /* A pyenv shim runs pyenv (~300 ms of bash): its answer is cached too,
     * keyed on everything pyenv decides by (shim_cache_key) and re-checked:
     * the real executable it named must be unchanged, and the answer is
     * validated like a fresh one. */
    shim = !cacheable && shim_cache_key(path, path_env, key, sizeof key) == 0;
    if (shim) {
        char *cached = kcache_get("pyshim", key);
        if (cached) {
            char why[1024];
            int ok = shim_from_cache(path, cached, info) == 0 &&
                     accept_probe(path, workspace, info, why, sizeof why) == 0;
            free(cached);
            if (ok) {
                rc = 0;
                goto done;
            }
            pydetect_info_clear(info);
        }
    }
    if (cacheable) {
        char *cached = kcache_get("pyprobe", key);
        if (cached) {
            char why[1024];
            int ok = pydetect_parse_probe(path, cached, info, why, sizeof why) == 0 &&
                     accept_probe(path, workspace, info, why, sizeof why) == 0;
            free(cached);
            if (ok) {
                rc = 0;
                goto done;
            }
            pydetect_info_clear(info);
        }
    }
    out = malloc(PYDETECT_PROBE_MAX_OUTPUT);
    errout = malloc(PYDETECT_PROBE_MAX_OUTPUT);
    envp = pydetect_probe_env(path_env);
    if (!out || !errout || !envp) {
        snprintf(err, errlen, "out of memory");
        goto done;
    }
    char *argv[] = {path, "-I", "-S", "-c", (char *)pydetect_probe_script, NULL};
    char why[256];
    int status = run_capture(argv, envp, out, errout, PYDETECT_PROBE_MAX_OUTPUT, why, sizeof why);
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
    if (pydetect_parse_probe(path, out, info, err, errlen) < 0 ||
        accept_probe(candidate, workspace, info, err, errlen) < 0)
        goto done;
    if (cacheable)
        kcache_put("pyprobe", key, out);
    else if (shim)
        shim_put(key, info, out);
    rc = 0;
done:
    pydetect_free_env(envp);
    free(out);
    free(errout);
    free(path);
    free(ws_real);
    return rc;
}

char *pydetect_pyvenv_home(const char *text)
{
    char *home = NULL;
    for (const char *p = text; p && *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq) {
            const char *k = p, *ke = eq;
            while (k < ke && (*k == ' ' || *k == '\t'))
                k++;
            while (ke > k && (ke[-1] == ' ' || ke[-1] == '\t'))
                ke--;
            if (ke - k == 4 && strncasecmp(k, "home", 4) == 0) {
                const char *v = eq + 1, *ve = p + len;
                while (v < ve && (*v == ' ' || *v == '\t'))
                    v++;
                while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t' || ve[-1] == '\r'))
                    ve--;
                free(home);
                home = strndup(v, (size_t)(ve - v));
            }
        }
        if (!e)
            break;
        p = e + 1;
    }
    return home;
}

/* An fd for rel beneath dirfd, never following a symlink (not even one that
 * stays inside): openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS), or a per-component O_NOFOLLOW walk where openat2 is
 * missing or filtered. rel is relative, without ".." (checked by callers). */
static int ws_openat(int dirfd, const char *rel, int flags)
{
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC);
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int fd = (int)syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM))
        return fd;
    char *buf = strdup(rel);
    if (!buf)
        return -1;
    int cur = dup(dirfd);
    char *save = NULL;
    for (char *comp = strtok_r(buf, "/", &save); comp && cur >= 0;) {
        char *next = strtok_r(NULL, "/", &save);
        /* O_PATH|O_NOFOLLOW opens a symlink itself (O_DIRECTORY does not
         * refuse it): a directory on the way is checked with fstat. */
        int nfd = next ? openat(cur, comp, O_PATH | O_NOFOLLOW | O_CLOEXEC)
                       : openat(cur, comp, flags | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        struct stat st = {0};
        if (nfd >= 0 && next && (fstat(nfd, &st) < 0 || !S_ISDIR(st.st_mode))) {
            e = S_ISLNK(st.st_mode) ? ELOOP : ENOTDIR;
            close(nfd);
            nfd = -1;
        }
        close(cur);
        cur = nfd;
        errno = e;
        comp = next;
    }
    free(buf);
    return cur;
}

static const char *ws_reason(int e)
{
    switch (e) {
    case ELOOP:
        return "the path goes through a symbolic link";
    case EXDEV:
        return "the path leads outside the workspace";
    case ENOENT:
        return "missing";
    default:
        return strerror(e);
    }
}

/* new (free()): pyvenv.cfg of the workspace venv rel_venv, read through
 * ws_fd without following symlinks, at most PYDETECT_PYVENV_MAX bytes. */
static char *read_pyvenv_cfg(int ws_fd, const char *rel_venv, char *err, size_t errlen)
{
    char *rel = NULL, *buf = NULL;
    if (asprintf(&rel, "%s/pyvenv.cfg", rel_venv) < 0) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int fd = ws_openat(ws_fd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY);
    free(rel);
    if (fd < 0) {
        snprintf(err, errlen, "pyvenv.cfg: %s", ws_reason(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "pyvenv.cfg is not a regular file");
        goto fail;
    }
    size_t got = 0;
    if (cm_read_all(fd, PYDETECT_PYVENV_MAX, &buf, &got) < 0) {
        if (errno == EFBIG)
            snprintf(err, errlen, "pyvenv.cfg is larger than %u bytes", PYDETECT_PYVENV_MAX);
        else
            snprintf(err, errlen, "pyvenv.cfg: %s", strerror(errno));
        goto fail;
    }
    if (strlen(buf) != got) {
        snprintf(err, errlen, "pyvenv.cfg contains a NUL byte");
        goto fail;
    }
    close(fd);
    return buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

/* A venv inside the workspace: ws/rel_venv, worker ws/rel_venv/bin/name.
 * Nothing of it is executed on the host: its pyvenv.cfg's home must hold the
 * base interpreter (a real ELF outside the workspace), which is probed as a
 * trusted one; the venv's own bin/python runs in the sandbox only. */
static int probe_ws_venv(const char *source, const char *ws, const char *ws_real,
                         const char *rel_venv, const char *name, const char *path_env,
                         pydetect_info *info, char *err, size_t errlen)
{
    char why[1024] = "", link[256] = "", *cfg = NULL, *home = NULL, *rel_bin = NULL;
    char *base = NULL, *venv_dir = NULL, *interp = NULL;
    int rc = -1, bin_fd = -1;
    const char *cands[3] = {"python3", "python", NULL};

    pydetect_info_clear(info);
    int ws_fd = open(ws_real, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (ws_fd < 0) {
        snprintf(why, sizeof why, "workspace %s: %s", ws_real, strerror(errno));
        goto out;
    }
    if (asprintf(&rel_bin, "%s/bin", rel_venv) < 0)
        goto oom;
    bin_fd = ws_openat(ws_fd, rel_bin, O_PATH | O_DIRECTORY);
    if (bin_fd < 0) {
        snprintf(why, sizeof why, "bin: %s", ws_reason(errno));
        goto out;
    }
    struct stat st;
    if (fstatat(bin_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        snprintf(why, sizeof why, "bin/%s: %s", name, ws_reason(errno));
        goto out;
    }
    /* The name of bin/python's link target ("python3.11") is a candidate
     * in home too; the link itself is never followed on the host. */
    if (S_ISLNK(st.st_mode)) {
        ssize_t n = readlinkat(bin_fd, name, link, sizeof link - 1);
        if (n > 0) {
            link[n] = '\0';
            char *b = strrchr(link, '/');
            if (b)
                memmove(link, b + 1, strlen(b + 1) + 1);
            if (link[0] && strcmp(link, ".") && strcmp(link, ".."))
                cands[2] = link;
        }
    }
    cfg = read_pyvenv_cfg(ws_fd, rel_venv, why, sizeof why);
    if (!cfg)
        goto out;
    home = pydetect_pyvenv_home(cfg);
    if (!home || !*home) {
        snprintf(why, sizeof why, "pyvenv.cfg has no \"home\" (the base interpreter's directory)");
        goto out;
    }
    if (home[0] != '/') {
        snprintf(why, sizeof why, "pyvenv.cfg's home %.200s is not an absolute path", home);
        goto out;
    }
    if (in_workspace(home, ws, ws_real)) {
        snprintf(why, sizeof why,
                 "pyvenv.cfg's home %.200s is inside the workspace (a base interpreter there "
                 "would run on the host)",
                 home);
        goto out;
    }
    for (int i = 0; i < 3 && !base && cands[i]; i++) {
        char *p = NULL;
        if (asprintf(&p, "%s/%s", home, cands[i]) < 0)
            goto oom;
        char *real = realpath(p, NULL);
        free(p);
        if (!real)
            continue;
        if (in_workspace(real, ws, ws_real)) {
            snprintf(why, sizeof why, "base interpreter %.200s is inside the workspace", real);
            free(real);
            goto out;
        }
        if (is_elf(real) && access(real, X_OK) == 0)
            base = real;
        else {
            snprintf(why, sizeof why, "%.200s/%s is not an ELF executable", home, cands[i]);
            free(real);
        }
    }
    if (!base) {
        if (!why[0])
            snprintf(why, sizeof why,
                     "no base interpreter (python3, python%s%s) in its home %.200s",
                     cands[2] ? ", " : "", cands[2] ? cands[2] : "", home);
        goto out;
    }
    pydetect_info b = {0};
    char bwhy[1024];
    if (pydetect_probe(base, ws, path_env, &b, bwhy, sizeof bwhy) < 0) {
        snprintf(why, sizeof why, "base interpreter: %.900s", bwhy);
        goto out;
    }
    if (asprintf(&venv_dir, "%s/%s", ws, rel_venv) < 0 ||
        asprintf(&interp, "%s/bin/%s", venv_dir, name) < 0) {
        pydetect_info_clear(&b);
        goto oom;
    }
    *info = b;
    free(info->interpreter);
    info->interpreter = interp;
    interp = NULL;
    free(info->prefix);
    info->prefix = venv_dir;
    venv_dir = NULL;
    info->is_venv = 1;
    info->workspace_venv = 1;
    info->source = source;
    if (pydetect_validate(info, ws, bwhy, sizeof bwhy) < 0) {
        snprintf(why, sizeof why, "%s", bwhy);
        pydetect_info_clear(info);
        goto out;
    }
    rc = 0;
    goto out;
oom:
    snprintf(why, sizeof why, "out of memory");
out:
    if (rc < 0)
        snprintf(err, errlen,
                 "%s: workspace venv %s/%s is unusable: %s (a workspace venv only ever runs in "
                 "the sandbox; fix or remove it)",
                 source, ws, rel_venv, why);
    if (bin_fd >= 0)
        close(bin_fd);
    if (ws_fd >= 0)
        close(ws_fd);
    free(cfg);
    free(home);
    free(rel_bin);
    free(base);
    free(venv_dir);
    free(interp);
    return rc;
}

/* When path (absolute) is VENV/bin/NAME inside the workspace, the venv's
 * workspace-relative directory (new) and *name; else NULL. */
static char *ws_venv_of(const char *path, const char *ws, const char *ws_real, const char **name)
{
    const char *rel = NULL;
    size_t n;
    if (cm_path_under(path, ws)) {
        n = strlen(ws);
        while (n > 1 && ws[n - 1] == '/')
            n--;
        rel = path + n;
    } else if (cm_path_under(path, ws_real)) {
        rel = path + strlen(ws_real);
    }
    if (!rel || *rel != '/')
        return NULL;
    rel++;
    /* no ".", "..", or empty components */
    for (const char *p = rel;;) {
        const char *e = strchr(p, '/');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == 0 || (len == 1 && p[0] == '.') || (len == 2 && !strncmp(p, "..", 2)))
            return NULL;
        if (!e)
            break;
        p = e + 1;
    }
    const char *last = strrchr(rel, '/');
    if (!last || last - rel < 4 || strncmp(last - 4, "/bin", 4) != 0)
        return NULL;
    *name = last + 1;
    return strndup(rel, (size_t)(last - 4 - rel));
}

/* Probes an explicitly chosen or found interpreter: failure is final. An
 * interpreter inside the workspace is only accepted as a workspace venv's
 * bin/python (never run on the host); anything else there is refused. */
static int probe_named(const char *source, const char *name, const pydetect_sources *src,
                       const char *ws_real, pydetect_info *info, char *err, size_t errlen)
{
    char why[2048];
    const char *ws = src->workspace;
    char *path = which_ex(name, src->path_env, ws, ws_real);
    if (!path) {
        if (strchr(name, '/'))
            snprintf(err, errlen, "%s: python not found at %s (missing or not executable)", source,
                     name);
        else
            snprintf(err, errlen, "%s: no executable named %s on PATH%s", source, name,
                     ws ? " (outside the workspace)" : "");
        return -1;
    }
    int rc;
    if (in_workspace(path, ws, ws_real)) {
        const char *exe = NULL;
        char *venv = ws_venv_of(path, ws, ws_real, &exe);
        if (venv) {
            rc = probe_ws_venv(source, ws, ws_real, venv, exe, src->path_env, info, err, errlen);
            free(venv);
            free(path);
            return rc;
        }
        snprintf(err, errlen,
                 "%s: %s is inside the workspace, which sandboxed code can write: it is never "
                 "run on the host (name an interpreter outside the workspace, or a workspace "
                 "venv's bin/python)",
                 source, path);
        free(path);
        return -1;
    }
    rc = pydetect_probe(path, ws, src->path_env, info, why, sizeof why);
    if (rc < 0)
        snprintf(err, errlen, "%s: %s", source, why);
    else
        info->source = source;
    free(path);
    return rc;
}

/* 1 when ws/.venv/bin/python exists (as any file type, a dangling symlink
 * included), -1 when the path to it goes through a symlink, 0 when absent. */
static int ws_venv_present(const char *ws_real)
{
    int ws_fd = open(ws_real, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (ws_fd < 0)
        return 0;
    int fd = ws_openat(ws_fd, ".venv/bin/python", O_PATH | O_NOFOLLOW);
    int e = errno;
    close(ws_fd);
    if (fd >= 0) {
        close(fd);
        return 1;
    }
    return e == ELOOP || e == EXDEV ? -1 : 0;
}

int pydetect_find(const pydetect_sources *src, pydetect_info *info, char *err, size_t errlen)
{
    int rc = -1;
    pydetect_info_clear(info);
    const char *ws = src->workspace && *src->workspace ? src->workspace : NULL;
    char *ws_real = ws ? realpath(ws, NULL) : NULL;
    if (ws && !ws_real)
        ws_real = strdup(ws);
    pydetect_sources s = *src;
    s.workspace = ws;

    if (src->explicit_path && *src->explicit_path) {
        rc = probe_named("--python", src->explicit_path, &s, ws_real, info, err, errlen);
        goto out;
    }
    if (src->env_python && *src->env_python) {
        rc = probe_named("$KERNELMGR_PYTHON", src->env_python, &s, ws_real, info, err, errlen);
        goto out;
    }
    /* A workspace venv that exists but is broken (e.g. its base interpreter
     * was removed) is an error, not a reason to silently use another Python. */
    if (ws) {
        int present = ws_venv_present(ws_real);
        if (present < 0) {
            snprintf(err, errlen,
                     ".venv: workspace venv %s/.venv is unusable: the path to its bin/python "
                     "goes through a symbolic link (fix or remove it)",
                     ws);
            goto out;
        }
        if (present) {
            rc = probe_ws_venv(".venv", ws, ws_real, ".venv", "python", src->path_env, info, err,
                               errlen);
            goto out;
        }
    }
    if (src->virtual_env && *src->virtual_env) {
        char *path = NULL;
        struct stat st;
        if (asprintf(&path, "%s/bin/python", src->virtual_env) < 0) {
            snprintf(err, errlen, "out of memory");
            goto out;
        }
        if (lstat(path, &st) == 0 || in_workspace(path, ws, ws_real)) {
            rc = probe_named("$VIRTUAL_ENV", path, &s, ws_real, info, err, errlen);
            free(path);
            goto out;
        }
        free(path);
    }
    char *found = which_ex("python3", src->path_env, ws, ws_real);
    if (found) {
        free(found);
        rc = probe_named("PATH", "python3", &s, ws_real, info, err, errlen);
        goto out;
    }
    snprintf(err, errlen,
             "no Python interpreter found (tried --python, $KERNELMGR_PYTHON, %s/.venv/bin/python, "
             "$VIRTUAL_ENV%s, python3 on PATH): install Python >= %d.%d or pass --python PATH",
             ws ? ws : "<workspace>",
             src->virtual_env && *src->virtual_env ? " (no bin/python)" : " (unset)",
             PYDETECT_MIN_MAJOR, PYDETECT_MIN_MINOR);
out:
    free(ws_real);
    return rc;
}
