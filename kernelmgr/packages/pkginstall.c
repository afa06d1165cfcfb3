/*
 * pkginstall.c — allowlisted installs, each in its own sandbox whose only
 * way out is egproxy to the configured index (see pkginstall.h).
 *
 * The sequence for one request:
 *   1. every requested string passes allowlist_check() (else: refused, and
 *      nothing ran);
 *   2. resolve without installing, in the sandbox: pip `install --dry-run
 *      --report -` (wheels only), npm `install --package-lock-only`;
 *   3. every package of the resolved set must be on the allowlist (the
 *      dependency policy); else refused, naming the missing ones;
 *   4. install exactly the resolved set, in the sandbox: pip `--no-deps
 *      --only-binary :all: --target DIR name==version...`, npm `install
 *      --ignore-scripts` from the lock of step 2;
 *   5. report name and version of everything installed.
 *
 * The sandbox (sandbox/sandbox.h) runs the installer with the
 * network off and a loopback listener: a socket listening on
 * 127.0.0.1:PKGINST_PROXY_PORT inside the sandbox's empty network namespace,
 * handed to us (sandbox_take_listen_fd()) and served by egproxy, which
 * connects only to the index's host:port and the allowlist's allowed_hosts.
 * Nothing else leads outside: the namespace routes only its own loopback,
 * and nothing inside can take the listener's port. A sandbox without SANDBOX_HAS_LOOPBACK_LISTEN
 * makes every install refuse with that reason rather than run unconfined.
 */
#include "kernelmgr/packages/pkginstall.h"
#include "common/cm_clock.h"
#include "common/cm_path.h"
#include "kernels/server/kenv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/sandbox.h"
#include "kernelmgr/engine/kmfs.h"
#include "kernelmgr/engine/pkgdirs.h"
#include "kernels/egress/egproxy.h"
#include "kernelmgr/engine/wsfile.h"

#define PKGINST_PROXY_PORT 3128
#define PKGINST_TIMEOUT_S 300
#define PKGINST_OUT_MAX ((size_t)8 << 20)
#define PKGINST_FILE_MAX ((size_t)64 << 20) /* package.json / lock read back */
#define PKGINST_CA_FILE "/etc/ssl/certs/ca-certificates.crt"

#ifndef SANDBOX_HAS_LOOPBACK_LISTEN

json_t *pkginst_install(const allowlist *al, allowlist_mgr m, const char *home, const char *session,
                        const json_t *packages, km_err *err)
{
    (void)al;
    (void)m;
    (void)home;
    (void)session;
    (void)packages;
    km_err_set(err, KM_EUSAGE,
               "installs are disabled in this build: the install sandbox needs a loopback listener "
               "inside the sandbox's network namespace (SANDBOX_HAS_LOOPBACK_LISTEN in "
               "sandbox/sandbox.h), which this sandbox does not provide yet; kernelmgr "
               "will not run an installer with unrestricted network access");
    return NULL;
}

#else

static const char *const policy_text =
    "dependencies are resolved first; the install runs only when every resolved package is "
    "on the allowlist (nothing else is ever installed); pip: wheels only (no build scripts run); "
    "npm: --ignore-scripts";

/* The proxy's targets: the index's host:port, then the manager's
 * allowed_hosts. */
typedef struct proxy_targets {
    char buf[1 + ALLOWLIST_HOSTS_MAX][300];
    const char *list[1 + ALLOWLIST_HOSTS_MAX + 1];
} proxy_targets;

static void targets_init(proxy_targets *t, const allowlist *al, allowlist_mgr m, const char *host,
                         unsigned port)
{
    size_t n = 0;
    snprintf(t->buf[0], sizeof t->buf[0], strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
    t->list[n++] = t->buf[0];
    for (size_t i = 0; i < ALLOWLIST_HOSTS_MAX; i++) {
        const char *h = allowlist_allowed_host(al, m, i);
        if (!h)
            break;
        snprintf(t->buf[n], sizeof t->buf[n], "%s", h);
        t->list[n] = t->buf[n];
        n++;
    }
    t->list[n] = NULL;
}

/* Appends name to a ", "-separated list when it fits (else drops it). */
static void list_append(char *list, size_t size, const char *name)
{
    size_t n = strlen(list);
    if (n + strlen(name) + 3 < size)
        snprintf(list + n, size - n, "%s%s", n ? ", " : "", name);
}

/* Appends what the proxy refused ("; the proxy refused: a:1, b:2 (only the
 * index and allowed_hosts are reachable)") to buf (size bytes). */
static void note_refusals(egproxy *px, char *buf, size_t size)
{
    json_t *r = egproxy_report(px);
    json_t *refused = json_object_get(r, "refused");
    size_t i;
    json_t *it;
    char list[600] = "";
    int host_only = 0;
    json_array_foreach(refused, i, it)
    {
        const char *t = json_string_value(json_object_get(it, "target"));
        const char *why = json_string_value(json_object_get(it, "reason"));
        if (why && strcmp(why, EGPROXY_HOST_ONLY) == 0)
            host_only = 1;
        if (t && !strstr(list, t))
            list_append(list, sizeof list, t);
    }
    json_decref(r);
    size_t n = strlen(buf);
    if (list[0] && n + 1 < size)
        snprintf(buf + n, size - n,
                 "; the install proxy refused: %s (only the index and the allowlist's "
                 "allowed_hosts are reachable%s)",
                 list,
                 host_only ? "; a listed name that resolves only to this host's own addresses "
                             "(loopback, link-local, the host's interfaces) is refused by policy "
                             "unless the allowlist names the address itself"
                           : "");
}

/* Runs argv in a fresh install sandbox (workspace = dir, network only to
 * the targets, through the proxy). *out (new, NUL-terminated) gets stdout,
 * *log stderr. Returns the exit status (0..255), or -1 with err. *refusals
 * (PKGINST_REFUSALS_MAX bytes) gets what the proxy refused, or "". */
#define PKGINST_REFUSALS_MAX 800
static int run_sandboxed(const char *dir, const proxy_targets *targets, char *const argv[],
                         char *const envp[], char **out, char **log, char *refusals, km_err *err)
{
    refusals[0] = '\0';
    *out = *log = NULL;
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    cfg.level = SANDBOX_STRICT;
    cfg.workspace = dir;
    cfg.network = 0;
    cfg.loopback_listen_port = PKGINST_PROXY_PORT;
    cfg.memory_bytes = 1ull << 30;
    int o[2], e[2], nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nul < 0 || pipe2(o, O_CLOEXEC) < 0) {
        km_err_set(err, KM_EUSAGE, "pipe: %s", strerror(errno));
        if (nul >= 0)
            close(nul);
        return -1;
    }
    if (pipe2(e, O_CLOEXEC) < 0) {
        km_err_set(err, KM_EUSAGE, "pipe: %s", strerror(errno));
        close(nul);
        close(o[0]);
        close(o[1]);
        return -1;
    }
    int fds[3] = {nul, o[1], e[1]};
    char why[512];
    sandbox *sb = sandbox_spawn(&cfg, argv, envp, fds, 3, why, sizeof why);
    close(nul);
    close(o[1]);
    close(e[1]);
    if (!sb) {
        km_err_set(err, KM_EUSAGE, "the install sandbox cannot start: %s", why);
        close(o[0]);
        close(e[0]);
        return -1;
    }
    egproxy *px = NULL;
    int lfd = sandbox_take_listen_fd(sb);
    if (lfd >= 0)
        px = egproxy_start(lfd, targets->list, why, sizeof why);
    if (!px) {
        km_err_set(err, KM_EUSAGE, "the install proxy cannot start: %s",
                   lfd < 0 ? "no listening socket from the sandbox" : why);
        sandbox_destroy(&sb);
        close(o[0]);
        close(e[0]);
        return -1;
    }
    /* Collect both streams until the installer exits or times out. */
    size_t cap[2] = {65536, 65536}, len[2] = {0, 0};
    char *buf[2] = {malloc(cap[0]), malloc(cap[1])};
    int open_[2] = {1, 1}, fdv[2] = {o[0], e[0]};
    double deadline = cm_mono_s() + PKGINST_TIMEOUT_S;
    int timed_out = 0;
    while ((open_[0] || open_[1]) && buf[0] && buf[1]) {
        struct pollfd p[2] = {{.fd = open_[0] ? fdv[0] : -1, .events = POLLIN},
                              {.fd = open_[1] ? fdv[1] : -1, .events = POLLIN}};
        int left = (int)((deadline - cm_mono_s()) * 1000);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        if (poll(p, 2, left) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents)
                continue;
            if (len[i] + 4096 > cap[i] && cap[i] < PKGINST_OUT_MAX) {
                char *nb = realloc(buf[i], cap[i] * 2);
                if (nb) {
                    buf[i] = nb;
                    cap[i] *= 2;
                }
            }
            ssize_t r;
            if (len[i] + 4096 <= cap[i])
                r = read(fdv[i], buf[i] + len[i], cap[i] - len[i] - 1);
            else {
                char sink[4096]; /* beyond the cap: drained, dropped */
                r = read(fdv[i], sink, sizeof sink);
                if (r > 0)
                    continue;
            }
            if (r <= 0) {
                if (r < 0 && errno == EINTR)
                    continue;
                open_[i] = 0;
            } else {
                len[i] += (size_t)r;
            }
        }
    }
    if (timed_out)
        sandbox_signal(sb, SIGKILL);
    int st = 0;
    while (waitpid(sandbox_pid(sb), &st, 0) < 0 && errno == EINTR)
        ;
    note_refusals(px, refusals, PKGINST_REFUSALS_MAX);
    egproxy_stop(&px);
    char limit[200];
    const char *hit = sandbox_limit_hit(sb, st, limit, sizeof limit);
    sandbox_destroy(&sb);
    close(o[0]);
    close(e[0]);
    for (int i = 0; i < 2; i++)
        if (buf[i])
            buf[i][len[i]] = '\0';
    *out = buf[0];
    *log = buf[1];
    if (!buf[0] || !buf[1]) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return -1;
    }
    if (timed_out) {
        km_err_set(err, KM_EUSAGE, "the installer took longer than %d s and was killed",
                   PKGINST_TIMEOUT_S);
        return -1;
    }
    if (hit) {
        km_err_set(err, KM_EUSAGE, "the installer hit a limit: %s", hit);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static const char *last_lines(const char *log)
{
    size_t n = strlen(log);
    if (n <= 1500)
        return log;
    return log + n - 1500;
}

static char *const *base_env(char *buf[], const char *extra)
{
    int n = 0;
    buf[n++] = "PATH=" KENV_SANDBOX_PATH;
    buf[n++] = "HOME=" KENV_SANDBOX_HOME;
    buf[n++] = "LANG=C.UTF-8";
    if (extra)
        buf[n++] = (char *)extra;
    buf[n] = NULL;
    return buf;
}

static void policy_refusal(km_err *err, allowlist_mgr m, const char *missing)
{
    km_err_set(err, KM_EUSAGE,
               "the request needs packages that are not on the %s allowlist: %s (dependency "
               "policy: every resolved package must be listed; nothing was installed)",
               allowlist_mgr_name(m), missing);
}

/* What both managers need before the installer runs: the session's package
 * directory for m (created) in *dir (new), the proxy URL the installer is
 * pointed at in proxy (64 bytes) and the proxy's targets. Returns the index
 * URL (borrowed from al), or NULL with err and *dir NULL. */
static const char *install_prepare(const allowlist *al, allowlist_mgr m, const char *home,
                                   const char *session, char **dir, char *proxy,
                                   proxy_targets *targets, km_err *err)
{
    char host[256];
    unsigned port;
    int tls;
    const char *index = allowlist_index(al, m);
    *dir = pkgdirs_path(home, session, m == ALLOWLIST_PIP ? "python" : "npm");
    if (!*dir || kmfs_mkdirs(*dir, 0755) < 0) {
        km_err_set(err, KM_EUSAGE, "cannot create the package directory for session %s: %s",
                   session, strerror(errno));
        free(*dir);
        *dir = NULL;
        return NULL;
    }
    if (allowlist_parse_url(index, host, sizeof host, &port, &tls, err) < 0) {
        free(*dir);
        *dir = NULL;
        return NULL;
    }
    snprintf(proxy, 64, "http://127.0.0.1:%d", PKGINST_PROXY_PORT);
    targets_init(targets, al, m, host, port);
    return index;
}

/* run_sandboxed() for one step of an install: a non-zero exit becomes err
 * ("WHAT (exit N)<proxy refusals>: <end of stderr>"). 0 with *out (new;
 * NULL: dropped) set, or -1 with err. */
static int run_step(const char *dir, const proxy_targets *targets, char *const argv[],
                    char *const envp[], const char *what, char **out, km_err *err)
{
    char *o, *log, refused[PKGINST_REFUSALS_MAX];
    int rc = run_sandboxed(dir, targets, argv, envp, &o, &log, refused, err);
    if (rc > 0)
        km_err_set(err, KM_EUSAGE, "%s (exit %d)%s: %s", what, rc, refused, last_lines(log));
    free(log);
    if (rc != 0 || !out) {
        free(o);
        o = NULL;
    }
    if (out)
        *out = o;
    return rc == 0 ? 0 : -1;
}

/* The pip install into py through the proxy (install_prepare's). */
static json_t *install_pip(const allowlist *al, const char *py, const char *proxy,
                           const proxy_targets *targets, const char *index,
                           char specs[][ALLOWLIST_NAME_MAX + ALLOWLIST_SPEC_MAX + 2], size_t nspec,
                           km_err *err)
{
    char *envb[8];
    char *const *envp = base_env(envb, NULL);

    /* 2. resolve. */
    char *argv[80 + 100];
    int a = 0;
    const char *common[] = {"/usr/bin/python3",
                            "-m",
                            "pip",
                            "install",
                            "--isolated",
                            "--no-cache-dir",
                            "--disable-pip-version-check",
                            "--no-input",
                            "--no-compile",
                            "--only-binary",
                            ":all:",
                            "--index-url",
                            index,
                            "--proxy",
                            proxy,
                            NULL};
    for (int i = 0; common[i]; i++)
        argv[a++] = (char *)common[i];
    if (access(PKGINST_CA_FILE, R_OK) == 0) {
        argv[a++] = "--cert";
        argv[a++] = PKGINST_CA_FILE;
    }
    int a0 = a;
    argv[a++] = "--dry-run";
    argv[a++] = "--ignore-installed";
    argv[a++] = "--quiet";
    argv[a++] = "--report";
    argv[a++] = "-";
    for (size_t i = 0; i < nspec && a < 170; i++)
        argv[a++] = specs[i];
    argv[a] = NULL;
    char *out;
    if (run_step(py, targets, argv, envp, "pip could not resolve the request", &out, err) < 0)
        return NULL;
    json_error_t jerr;
    json_t *report = json_loads(out, 0, &jerr);
    free(out);
    json_t *items = json_object_get(report, "install");
    if (!json_is_array(items)) {
        /* the report is the sandbox's output: reasons only, never its bytes */
        if (report)
            km_err_set(err, KM_EUSAGE, "pip's resolution report has no \"install\" list");
        else
            km_err_set(err, KM_EUSAGE,
                       "pip's resolution report does not parse: %s at line %d, column %d",
                       allowlist_json_reason(&jerr), jerr.line, jerr.column);
        json_decref(report);
        return NULL;
    }
    /* 3. the dependency policy. */
    json_t *installed = json_array();
    char missing[1024] = "";
    static char pinned[100][ALLOWLIST_NAME_MAX + ALLOWLIST_SPEC_MAX + 2];
    size_t npinned = 0, i;
    json_t *it;
    json_array_foreach(items, i, it)
    {
        json_t *md = json_object_get(it, "metadata");
        const char *name = json_string_value(json_object_get(md, "name"));
        const char *version = json_string_value(json_object_get(md, "version"));
        if (!name || !version)
            continue;
        char aspec[ALLOWLIST_SPEC_MAX + 1];
        if (!allowlist_has(al, ALLOWLIST_PIP, name, aspec)) {
            list_append(missing, sizeof missing, name);
            continue;
        }
        if (npinned < 100)
            snprintf(pinned[npinned++], sizeof pinned[0], "%s==%s%s%s", name, version,
                     aspec[0] ? "," : "", aspec);
        json_array_append_new(installed, json_pack("{s:s,s:s}", "name", name, "version", version));
    }
    json_decref(report);
    if (missing[0]) {
        policy_refusal(err, ALLOWLIST_PIP, missing);
        json_decref(installed);
        return NULL;
    }
    /* 4. install exactly the resolved set. */
    a = a0;
    argv[a++] = "--no-deps";
    argv[a++] = "--upgrade";
    argv[a++] = "--quiet";
    argv[a++] = "--target";
    argv[a++] = (char *)py;
    for (size_t k = 0; k < npinned; k++)
        argv[a++] = pinned[k];
    argv[a] = NULL;
    if (run_step(py, targets, argv, envp, "pip failed", NULL, err) < 0) {
        json_decref(installed);
        return NULL;
    }
    return json_pack("{s:s,s:o,s:s,s:s,s:s}", "manager", "pip", "installed", installed, "target",
                     py, "index", index, "policy", policy_text);
}

/* Walks package-lock.json's "packages" (lockfile v2/v3): every entry but the
 * root is "node_modules/NAME" or nested ".../node_modules/NAME". The prefix
 * is written inside the install sandbox, so its files are read through
 * wsfile (no symlink followed, regular files only, at most
 * PKGINST_FILE_MAX bytes). */
static json_t *npm_lock_packages(const char *npmdir, km_err *err)
{
    km_err why = {0};
    char *text = NULL;
    size_t len = 0;
    int rootfd = wsfile_root_open(npmdir, &why);
    if (rootfd >= 0) {
        wsfile_slurp(rootfd, "package-lock.json", PKGINST_FILE_MAX, &text, &len, &why);
        close(rootfd);
    }
    json_error_t jerr;
    json_t *lock = text ? json_loadb(text, len, 0, &jerr) : NULL;
    free(text);
    json_t *pk = json_object_get(lock, "packages");
    if (!json_is_object(pk)) {
        /* the file was written in the sandbox: reasons only, never its bytes */
        char where[64] = "";
        if (!why.msg[0] && !lock)
            snprintf(where, sizeof where, " at line %d, column %d", jerr.line, jerr.column);
        km_err_set(err, KM_EUSAGE, "npm's lock file %s/package-lock.json does not parse: %s%s",
                   npmdir,
                   why.msg[0] ? why.msg
                   : lock     ? "no \"packages\" object"
                              : allowlist_json_reason(&jerr),
                   where);
        json_decref(lock);
        return NULL;
    }
    json_t *out = json_array();
    const char *key;
    json_t *v;
    json_object_foreach(pk, key, v)
    {
        const char *nm = strstr(key, "node_modules/");
        if (!nm)
            continue;
        const char *last;
        while ((last = strstr(nm + 13, "node_modules/")) != NULL)
            nm = last;
        json_array_append_new(out,
                              json_pack("{s:s,s:s}", "name", nm + 13, "version",
                                        json_string_value(json_object_get(v, "version")) ?: "?"));
    }
    json_decref(lock);
    return out;
}

/* A file's bytes kept aside, so a refused or failed npm request leaves the
 * prefix's package.json and lock as they were (npm edits them while it
 * resolves). Read and written back through wsfile, like the lock. */
typedef struct saved_file {
    const char *dir, *name;
    char *data; /* NULL: the file did not exist (or could not be kept: skip) */
    size_t len;
    int skip; /* not readable as a regular file: left alone on restore */
} saved_file;

static void save_file(saved_file *f, const char *dir, const char *name)
{
    f->dir = dir;
    f->name = name;
    f->data = NULL;
    f->len = 0;
    f->skip = 1;
    int rootfd = wsfile_root_open(dir, NULL);
    if (rootfd < 0)
        return;
    if (wsfile_slurp(rootfd, name, PKGINST_FILE_MAX, &f->data, &f->len, NULL) == 0 ||
        errno == ENOENT)
        f->skip = 0;
    close(rootfd);
}

static void restore_file(saved_file *f)
{
    if (f->skip)
        return;
    int rootfd = wsfile_root_open(f->dir, NULL);
    if (rootfd < 0)
        return;
    if (!f->data)
        unlinkat(rootfd, f->name, 0);
    else
        wsfile_replace(rootfd, f->name, f->data, f->len, 0644, NULL);
    close(rootfd);
}

static void free_saved(saved_file *f)
{
    free(f->data);
    f->data = NULL;
}

/* Puts n saved files back as they were when restore, then frees the
 * copies. */
static void saved_release(saved_file *f, size_t n, int restore)
{
    for (size_t i = 0; i < n; i++) {
        if (restore)
            restore_file(&f[i]);
        free_saved(&f[i]);
    }
}

/* The npm install into the prefix npm through the proxy (install_prepare's). */
static json_t *install_npm(const allowlist *al, const char *npm, const char *proxy,
                           const proxy_targets *targets, const char *registry,
                           char specs[][ALLOWLIST_NAME_MAX + ALLOWLIST_SPEC_MAX + 2], size_t nspec,
                           km_err *err)
{
    char *envb[8];
    char *const *envp = base_env(envb, "npm_config_cache=/tmp/.npm");
    char *argv[60 + 100];
    int a = 0;
    const char *common[] = {"/usr/bin/npm",
                            "install",
                            "--prefix",
                            npm,
                            "--ignore-scripts",
                            "--no-audit",
                            "--no-fund",
                            "--no-update-notifier",
                            "--omit=dev",
                            "--omit=optional",
                            "--omit=peer",
                            "--registry",
                            registry,
                            "--proxy",
                            proxy,
                            "--https-proxy",
                            proxy,
                            "--userconfig",
                            "/dev/null",
                            NULL};
    for (int i = 0; common[i]; i++)
        argv[a++] = (char *)common[i];
    /* The host's trust store (bound read-only into the sandbox): a TLS
     * inspecting proxy's CA, where there is one, is installed there. */
    if (access(PKGINST_CA_FILE, R_OK) == 0) {
        argv[a++] = "--cafile";
        argv[a++] = PKGINST_CA_FILE;
    }
    int a0 = a;
    argv[a++] = "--package-lock-only";
    for (size_t i = 0; i < nspec && a < 150; i++)
        argv[a++] = specs[i];
    argv[a] = NULL;
    saved_file kept[2];
    save_file(&kept[0], npm, "package.json");
    save_file(&kept[1], npm, "package-lock.json");
    json_t *resolved = NULL;
    if (run_step(npm, targets, argv, envp, "npm could not resolve the request", NULL, err) == 0)
        resolved = npm_lock_packages(npm, err);
    if (!resolved) {
        saved_release(kept, 2, 1);
        return NULL;
    }
    char missing[1024] = "";
    size_t i;
    json_t *it;
    json_array_foreach(resolved, i, it)
    {
        const char *name = json_string_value(json_object_get(it, "name"));
        char needle[ALLOWLIST_NAME_MAX + 4];
        snprintf(needle, sizeof needle, ", %s,", name);
        char hay[sizeof missing + 4];
        snprintf(hay, sizeof hay, ", %s,", missing);
        if (!allowlist_has(al, ALLOWLIST_NPM, name, NULL) && !strstr(hay, needle))
            list_append(missing, sizeof missing, name);
    }
    if (missing[0]) {
        policy_refusal(err, ALLOWLIST_NPM, missing);
        json_decref(resolved);
        saved_release(kept, 2, 1);
        return NULL;
    }
    /* Install from the lock just checked: nothing is re-resolved. */
    a = a0;
    argv[a] = NULL;
    if (run_step(npm, targets, argv, envp, "npm failed", NULL, err) < 0) {
        json_decref(resolved);
        saved_release(kept, 2, 1);
        return NULL;
    }
    saved_release(kept, 2, 0);
    return json_pack("{s:s,s:o,s:s,s:s,s:s}", "manager", "npm", "installed", resolved, "target",
                     npm, "index", registry, "policy", policy_text);
}

json_t *pkginst_install(const allowlist *al, allowlist_mgr m, const char *home, const char *session,
                        const json_t *packages, km_err *err)
{
    static char specs[50][ALLOWLIST_NAME_MAX + ALLOWLIST_SPEC_MAX + 2];
    static pthread_mutex_t one_at_a_time = PTHREAD_MUTEX_INITIALIZER;
    size_t n = json_array_size(packages);
    if (n == 0 || n > 50) {
        km_err_set(err, KM_EUSAGE, "give 1 to 50 packages");
        return NULL;
    }
    pthread_mutex_lock(&one_at_a_time);
    for (size_t i = 0; i < n; i++) {
        char name[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1];
        if (allowlist_check(al, m, json_string_value(json_array_get(packages, i)), name, spec,
                            err) < 0) {
            pthread_mutex_unlock(&one_at_a_time);
            return NULL;
        }
        snprintf(specs[i], sizeof specs[i], m == ALLOWLIST_NPM && spec[0] ? "%s@%s" : "%s%s", name,
                 spec);
    }
    char proxy[64], *dir = NULL;
    proxy_targets targets = {0};
    const char *index = install_prepare(al, m, home, session, &dir, proxy, &targets, err);
    json_t *r = NULL;
    if (index && m == ALLOWLIST_PIP)
        r = install_pip(al, dir, proxy, &targets, index, specs, n, err);
    else if (index)
        r = install_npm(al, dir, proxy, &targets, index, specs, n, err);
    free(dir);
    pthread_mutex_unlock(&one_at_a_time);
    return r;
}

#endif
