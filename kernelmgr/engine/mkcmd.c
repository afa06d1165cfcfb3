/*
 * mkcmd.c — the command line of a session's kernel (session_int.h): its
 * options, its environment file (package variables, the user's env) and the
 * Python interpreter resolved once for sessions that chose none.
 */
#include "common/cm_path.h"
#include "kernelmgr/engine/pkgdirs.h"
#include "kernelmgr/engine/session_int.h"
#include "kernels/python/pydetect.h"
#include "kernels/server/kenv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- kernels */

/* new: the variables of a session's code: the configuration's "env" with
 * the session's own on top. NULL when out of memory. */
static json_t *session_env_merged(const km_manager *m, const json_t *own)
{
    json_t *all = m->cfg.env ? json_deep_copy(m->cfg.env) : json_object();
    if (all && own && json_object_update(all, (json_t *)own)) {
        json_decref(all);
        return NULL;
    }
    return all;
}

/* Checks own (a session's env, or NULL), together with the configuration's,
 * against kenv.h's rules and limits. 0, or -1 with the reason. */
int session_env_check(const km_manager *m, const json_t *own, km_err *err)
{
    if (own && !json_is_object(own)) {
        km_err_set(err, KM_EUSAGE, "env must be an object of NAME: \"value\"");
        return -1;
    }
    json_t *all = session_env_merged(m, own);
    if (!all) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return -1;
    }
    char why[sizeof err->msg];
    int rc = kenv_check_object(NULL, "env", all, why, sizeof why);
    json_decref(all);
    if (rc)
        km_err_set(err, KM_EUSAGE, "%s", why);
    return rc;
}

/* Writes a kernel's variables (data[0..len): NAME=VALUE entries, each
 * ending in a NUL) to s->dir/env for its --env-file: never on a command line,
 * where /proc/PID/cmdline shows them to every user of the host. A 0600 file
 * created under a fresh name (O_EXCL | O_NOFOLLOW) and renamed over the old
 * one, so a kernel reads either the whole old or the whole new file; it goes
 * with the session directory. The path (new) or NULL with a reason. */
static char *write_env_file(const session *s, const char *data, size_t len, km_err *err)
{
    char *path = NULL, *tmp = NULL;
    char u[37];
    jp_uuid4(u);
    if (asprintf(&path, "%s/env", s->dir) < 0) {
        path = NULL;
        goto oom;
    }
    if (asprintf(&tmp, "%s/.env-%.8s.tmp", s->dir, u) < 0) {
        tmp = NULL;
        goto oom;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        km_err_set(err, KM_EUSAGE, "cannot write the kernel's environment file %s: %s", tmp,
                   strerror(errno));
        goto fail;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            km_err_set(err, KM_EUSAGE, "cannot write the kernel's environment file %s: %s", tmp,
                       w < 0 ? strerror(errno) : "short write");
            close(fd);
            unlink(tmp);
            goto fail;
        }
        off += (size_t)w;
    }
    if (close(fd) < 0 || rename(tmp, path) < 0) {
        km_err_set(err, KM_EUSAGE, "cannot write the kernel's environment file %s: %s", path,
                   strerror(errno));
        unlink(tmp);
        goto fail;
    }
    free(tmp);
    return path;
oom:
    km_err_set(err, KM_EUSAGE, "out of memory");
fail:
    free(tmp);
    free(path);
    return NULL;
}

/* ---------------------------------------------------------------- interpreter, shared
 *
 * A Python kernel of a session that chose no interpreter would detect one
 * itself, running the probe (pydetect.h) on the host: under a burst of
 * kernel starts that is one probe per kernel (a pyenv shim is not cacheable
 * by the kernel's own probe cache). The manager resolves it once per inputs
 * (config python, $KERNELMGR_PYTHON, $VIRTUAL_ENV, $PATH, $PYENV_VERSION,
 * $PYENV_ROOT, $HOME) with the same detection and passes `--python
 * INTERPRETER` (a venv's bin/python as is, a shim resolved to the real
 * interpreter). The answer is reused for KM_PYRESOLVE_TTL seconds (a changed
 * `pyenv global` is seen after that). Never for a workspace with a .venv
 * (the kernel finds it; nothing of the workspace is resolved on the host),
 * nor an answer that lies in the workspace. A failed resolution passes
 * nothing: the kernel detects and reports itself. */

#define KM_PYRESOLVE_TTL 60.0

static struct {
    pthread_mutex_t mu;
    char *key;
    char *interp; /* NULL: resolution failed */
    double at;
} pyres = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* new (free()): the interpreter to pass as --python, or NULL for "let the
 * kernel detect". explicit_py: the configuration's python ("" = none). */
char *kcmd_python_resolved(const char *explicit_py, const char *workspace)
{
    char *venv = NULL;
    struct stat st;
    if (asprintf(&venv, "%s/.venv", workspace) < 0)
        return NULL;
    int has_venv = lstat(venv, &st) == 0;
    free(venv);
    if (has_venv)
        return NULL;
    const char *vars[] = {"KERNELMGR_PYTHON", "VIRTUAL_ENV", "PATH",
                          "PYENV_VERSION",    "PYENV_ROOT",  "HOME"};
    char *key = NULL;
    size_t klen = 0;
    FILE *ks = open_memstream(&key, &klen);
    if (!ks)
        return NULL;
    fprintf(ks, "python=%s", explicit_py);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        fprintf(ks, "%c%s%c%s", 1, vars[i], v ? '=' : '!', v ? v : "");
    }
    if (fclose(ks)) {
        free(key);
        return NULL;
    }
    char *out = NULL;
    pthread_mutex_lock(&pyres.mu);
    double now = kclient_now();
    if (!pyres.key || strcmp(pyres.key, key) || now - pyres.at > KM_PYRESOLVE_TTL ||
        (pyres.interp && access(pyres.interp, X_OK))) {
        pydetect_sources src = {
            .explicit_path = explicit_py[0] ? explicit_py : NULL,
            .env_python = getenv("KERNELMGR_PYTHON"),
            .workspace = NULL,
            .virtual_env = getenv("VIRTUAL_ENV"),
            .path_env = getenv("PATH"),
        };
        pydetect_info info = {0};
        char why[512];
        free(pyres.interp);
        pyres.interp = NULL;
        if (pydetect_find(&src, &info, why, sizeof why) == 0 && info.interpreter &&
            !info.workspace_venv)
            pyres.interp = strdup(info.interpreter);
        else
            fprintf(stderr,
                    "kernelmgr: no shared Python interpreter (each kernel detects its "
                    "own): %s\n",
                    why);
        pydetect_info_clear(&info);
        free(pyres.key);
        pyres.key = key;
        key = NULL;
        pyres.at = kclient_now();
    }
    if (pyres.interp && !cm_path_under(pyres.interp, workspace))
        out = strdup(pyres.interp);
    pthread_mutex_unlock(&pyres.mu);
    free(key);
    return out;
}

int kcmd_pkg_root(const km_manager *m, const session *s, char *root)
{
    struct stat st;
    char pool[PATH_MAX];
    int have_pool = s->pool_dir[0] &&
                    snprintf(pool, sizeof pool, "%.4000s/packages", s->pool_dir) < (int)sizeof pool;
    /* handed out: the pool's path only while it leads to the session's
     * root (the symlink pkgdirs_adopt made) */
    if (have_pool && (s->pool_entry || (lstat(pool, &st) == 0 && S_ISLNK(st.st_mode)))) {
        memcpy(root, pool, strlen(pool) + 1);
        return 0;
    }
    return s->pool_entry ? -1 : pkgdirs_session_root(m->home, s->name, root);
}

const char *kcmd_net_text(const km_manager *m, const session *s)
{
    return s->network < 0 ? km_net_text(m->cfg.network, m->cfg.network_allow)
                          : km_net_text(s->network, s->net_allow);
}

int kcmd_add_limits(km_manager *m, session *s, klaunch_cmd *cmd)
{
    char num[64];
    int rc = 0;
    unsigned long long mem = s->memory ? s->memory : m->cfg.memory;
    if (mem) {
        snprintf(num, sizeof num, "%llu", mem);
        rc |= klaunch_cmd_add(cmd, "--memory") | klaunch_cmd_add(cmd, num);
    }
    double cpus = s->cpus > 0 ? s->cpus : m->cfg.cpus;
    if (cpus > 0) {
        snprintf(num, sizeof num, "%.6g", cpus);
        rc |= klaunch_cmd_add(cmd, "--cpus") | klaunch_cmd_add(cmd, num);
    }
    return rc;
}

int kernel_cmd(km_manager *m, session *s, int lang, klaunch_cmd *cmd, km_err *err)
{
    memset(cmd, 0, sizeof *cmd);
    const km_lang *lg = &m->cfg.langs.v[lang];
    if (lg->kernelspec[0])
        return klaunch_cmd_from_kernelspec(cmd, lg->kernelspec, err);
    /* a backend of the kernel server: the built-ins' binaries or a
     * configured one, all launched alike (sandbox options, lifeline) */
    char *bin = km_lang_backend_path(lg, NULL, err);
    if (!bin)
        return -1;
    char num[64];
    int rc = klaunch_cmd_add(cmd, bin);
    free(bin);
    /* the lifeline: our kernel dies with this process however it ends
     * (kernels of a user's kernelspec have no such option: the next
     * start-up scan reaps them) */
    if (m->lifeline[0] > 2) {
        snprintf(num, sizeof num, "%d", KLAUNCH_OWNER_FD);
        rc |= klaunch_cmd_add(cmd, "--owner-fd") | klaunch_cmd_add(cmd, num);
        cmd->lifeline_fd = m->lifeline[0];
    }
    rc |= klaunch_cmd_add(cmd, "-f") | klaunch_cmd_add(cmd, "{connection_file}") |
          klaunch_cmd_add(cmd, "--workspace") | klaunch_cmd_add(cmd, s->workspace) |
          klaunch_cmd_add(cmd, "--sandbox") |
          klaunch_cmd_add(cmd, s->sandbox[0] ? s->sandbox : m->cfg.sandbox) |
          klaunch_cmd_add(cmd, "--network") | klaunch_cmd_add(cmd, kcmd_net_text(m, s));
    rc |= kcmd_add_limits(m, s, cmd);
    double cpu_time = s->cpu_time > 0 ? s->cpu_time : m->cfg.cpu_time;
    if (cpu_time > 0) {
        snprintf(num, sizeof num, "%.6g", cpu_time);
        rc |= klaunch_cmd_add(cmd, "--cpu-time") | klaunch_cmd_add(cmd, num);
    }
    const char *py = s->python[0] ? s->python : m->cfg.python;
    /* resolved once for all kernels of sessions that chose none */
    char *shared_py =
        lg->takes_python && !s->python[0] ? kcmd_python_resolved(py, s->workspace) : NULL;
    if (shared_py)
        py = shared_py;
    if (lg->takes_python && py[0])
        rc |= klaunch_cmd_add(cmd, "--python") | klaunch_cmd_add(cmd, py);
    free(shared_py);
    /* cells through IPython's shell (kernel-python's --ipython; its
     * zygote then preloads IPython) */
    if (lg->takes_python && (s->ipython >= 0 ? s->ipython : m->cfg.ipython))
        rc |= klaunch_cmd_add(cmd, "--ipython") | klaunch_cmd_add(cmd, "on");
    snprintf(num, sizeof num, "%g", m->cfg.interrupt_grace);
    rc |= klaunch_cmd_add(cmd, "--interrupt-grace") | klaunch_cmd_add(cmd, num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)m->cfg.kernel_log_max);
    rc |= klaunch_cmd_add(cmd, "--log-max") | klaunch_cmd_add(cmd, num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)m->cfg.history_max);
    rc |= klaunch_cmd_add(cmd, "--history-max") | klaunch_cmd_add(cmd, num);
    /* The session's installed packages (install_packages): read-only in the
     * sandbox, on PYTHONPATH / NODE_PATH and PATH. A warm-pool entry has no
     * name yet: its directory moves to the session's at hand-out. */
    char root[PATH_MAX], ro[PATH_MAX];
    int have_root = kcmd_pkg_root(m, s, root) == 0;
    char **penv = have_root ? pkgdirs_kernel_env(root,
                                                 lg->packages == KM_LANG_PKG_PIP   ? "pip"
                                                 : lg->packages == KM_LANG_PKG_NPM ? "npm"
                                                                                   : NULL,
                                                 ro)
                            : NULL;
    if (!penv) {
        klaunch_cmd_clear(cmd);
        km_err_set(err, KM_EUSAGE, "cannot prepare the package directory of session %s: %s",
                   s->name, strerror(errno));
        return -1;
    }
    /* The package variables, then the user's (configuration "env", then the
     * session's own; a later one of a name wins); the sandbox gets no other
     * variable of the manager's (kenv.h). They reach the kernel in a file
     * (--env-file), never as arguments. */
    char *ebuf = NULL;
    size_t elen = 0;
    FILE *ms = open_memstream(&ebuf, &elen);
    for (char **e = penv; ms && *e; e++)
        fwrite(*e, 1, strlen(*e) + 1, ms);
    json_t *uenv = session_env_merged(m, s->env);
    const char *ename;
    json_t *ev;
    json_object_foreach(uenv, ename, ev)
    {
        if (ms)
            fprintf(ms, "%s=%s%c", ename, json_string_value(ev) ?: "", '\0');
    }
    int mem_ok = ms && uenv && !ferror(ms);
    if (ms && fclose(ms))
        mem_ok = 0;
    json_decref(uenv);
    pkgdirs_env_free(&penv);
    char *env_path = mem_ok ? write_env_file(s, ebuf, elen, err) : NULL;
    if (ebuf) {
        explicit_bzero(ebuf, elen);
        free(ebuf);
    }
    if (!env_path) {
        if (!mem_ok)
            km_err_set(err, KM_EUSAGE, "out of memory");
        klaunch_cmd_clear(cmd);
        return -1;
    }
    rc |= klaunch_cmd_add(cmd, "--env-file") | klaunch_cmd_add(cmd, env_path);
    free(env_path);
    if (ro[0])
        rc |= klaunch_cmd_add(cmd, "--ro-path") | klaunch_cmd_add(cmd, ro);
    /* the session's one sandbox (mksbx.c), when it has one */
    const char *sock = ksbx_socket(s);
    if (sock)
        rc |= klaunch_cmd_add(cmd, "--session-sandbox") | klaunch_cmd_add(cmd, sock);
    if (sock && (s->zygote >= 0 ? s->zygote : m->cfg.zygote)) {
        char zn[16];
        snprintf(zn, sizeof zn, "%u", m->cfg.zygote_forks);
        rc |= klaunch_cmd_add(cmd, "--zygote") | klaunch_cmd_add(cmd, zn);
    }
    cmd->interrupt_signal = 0;
    if (rc) {
        klaunch_cmd_clear(cmd);
        km_err_set(err, KM_EUSAGE, "kernel command too long");
        return -1;
    }
    return 0;
}
