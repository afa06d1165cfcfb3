/*
 * doctor.c — the host capability report of `kernelmgr doctor`.
 *
 * Nothing here is inferred where it can be tried: the kernels are started
 * for real (a tiny cell each, through the configured sandbox, in a private
 * throw-away home), and the interpreter's packages are imported.
 */
#include "kernelmgr/frontends/doctor.h"
#include "common/cm_install.h"
#include "common/cm_path.h"
#include "kernelmgr/engine/km.h"
#include "kernelmgr/engine/wsfile.h"
#include "kernels/python/pydetect.h"
#include "sandbox/sandbox.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <seccomp.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* What `make demo` passes as --python (examples/demo.sh). */
#define DOCTOR_DEMO_PYTHON "/usr/bin/python3"
/* The packages a data-science cell usually wants. */
static const char *const doctor_packages[] = {"numpy", "pandas", "matplotlib"};
/* Seconds the package probe may take (pandas + matplotlib import cold). */
#define DOCTOR_PROBE_SECONDS 120

/* The bash the bash kernel runs: the first bash on PATH, else /bin/bash.
 * new string, or NULL. */
static char *doctor_find_bash(void)
{
    const char *path = getenv("PATH");
    char *found = pydetect_which("bash", path && *path ? path : "/usr/bin:/bin");
    if (!found && access("/bin/bash", X_OK) == 0)
        found = strdup("/bin/bash");
    return found;
}

/* Runs argv (stdin /dev/null, stderr discarded) and keeps up to size-1
 * bytes of its stdout in out; killed after seconds. Its exit status (0..255),
 * or -1 when it could not run, was killed or timed out. */
static int doctor_capture(char *const argv[], char *out, size_t size, int seconds)
{
    out[0] = 0;
    int p[2];
    if (pipe2(p, O_CLOEXEC))
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDWR);
        if (nul < 0 || dup2(nul, 0) < 0 || dup2(p[1], 1) < 0 || dup2(nul, 2) < 0)
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int timed_out = 0;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long left = seconds * 1000L -
                    ((now.tv_sec - t0.tv_sec) * 1000L + (now.tv_nsec - t0.tv_nsec) / 1000000L);
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd pf = {p[0], POLLIN, 0};
        int r = poll(&pf, 1, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            timed_out = r == 0;
            break;
        }
        char buf[4096];
        ssize_t k = read(p[0], buf, sizeof buf);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        size_t take = (size_t)k < size - 1 - n ? (size_t)k : size - 1 - n;
        memcpy(out + n, buf, take);
        n += take;
    }
    out[n] = 0;
    close(p[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    return timed_out || !WIFEXITED(st) ? -1 : WEXITSTATUS(st);
}

/* "5.2.15(1)-release", or "" when bash cannot be run. */
static void doctor_bash_version(const char *bash, char *out, size_t size)
{
    char *argv[] = {(char *)bash, "--norc", "--noprofile", "-c", "printf %s \"$BASH_VERSION\"",
                    NULL};
    if (doctor_capture(argv, out, size, 30) != 0)
        out[0] = 0;
}

/* {"numpy": {"ok": true, "version": "1.24.2"} | {"ok": false, "error": "..."}, ...}
 * as the interpreter imports them (-E -s: no PYTHON* variables, no user
 * site-packages, as in the kernel); NULL when it could not be asked. */
static json_t *doctor_packages_of(const char *interpreter)
{
    static const char probe[] =
        "import importlib, json, sys\n"
        "r = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try:\n"
        "        m = importlib.import_module(n)\n"
        "        r[n] = {'ok': True, 'version': str(getattr(m, '__version__', ''))}\n"
        "    except BaseException as e:\n"
        "        r[n] = {'ok': False, 'error': '%s: %s' % (type(e).__name__, e)}\n"
        "sys.stdout.write(json.dumps(r))\n";
    char *argv[5 + sizeof doctor_packages / sizeof doctor_packages[0] + 1];
    size_t k = 0;
    argv[k++] = (char *)interpreter;
    argv[k++] = "-E";
    argv[k++] = "-s";
    argv[k++] = "-c";
    argv[k++] = (char *)probe;
    for (size_t i = 0; i < sizeof doctor_packages / sizeof doctor_packages[0]; i++)
        argv[k++] = (char *)doctor_packages[i];
    argv[k] = NULL;
    char out[8192];
    if (doctor_capture(argv, out, sizeof out, DOCTOR_PROBE_SECONDS) != 0)
        return NULL;
    json_error_t je;
    json_t *o = json_loads(out, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The interpreter the python kernel would run given these sources; see
 * doctor.h for the object. */
static json_t *doctor_python_with(const char *explicit_path, const char *env_python,
                                  const char *virtual_env, const char *path_env)
{
    pydetect_sources src = {
        .explicit_path = explicit_path && *explicit_path ? explicit_path : NULL,
        .env_python = env_python && *env_python ? env_python : NULL,
        .workspace = NULL,
        .virtual_env = virtual_env && *virtual_env ? virtual_env : NULL,
        .path_env = path_env,
    };
    pydetect_info info = {0};
    char why[1024] = "";
    if (pydetect_find(&src, &info, why, sizeof why)) {
        pydetect_info_clear(&info);
        return json_pack("{s:b s:s}", "found", 0, "error", why);
    }
    json_t *o =
        json_pack("{s:b s:s s:s s:s s:s s:b s:s s:s*}", "found", 1, "interpreter", info.interpreter,
                  "version", info.version, "source", info.source, "implementation",
                  info.implementation ? info.implementation : "", "is_venv", info.is_venv, "prefix",
                  info.prefix ? info.prefix : "", "real_executable", info.real_executable);
    pydetect_info_clear(&info);
    return o;
}

static const char *sget(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* The value of NAME in a NUL-separated environment block, or NULL. */
static const char *env_block_get(const char *blk, size_t n, const char *name)
{
    size_t l = strlen(name);
    for (size_t i = 0; i < n;) {
        const char *e = blk + i;
        size_t el = strnlen(e, n - i);
        if (el > l && !strncmp(e, name, l) && e[l] == '=')
            return e + l + 1;
        i += el + 1;
    }
    return NULL;
}

/* The running daemon's interpreter: the same detection with the environment
 * it was started with (it keeps it), or NULL when none runs or it cannot be
 * read (another user's). */
static json_t *doctor_daemon_python(const kmcfg *cfg, const char *home)
{
    char *pidf = cm_path_join(home, "daemon.pid");
    FILE *f = pidf ? fopen(pidf, "re") : NULL;
    free(pidf);
    long pid = 0;
    if (!f)
        return NULL;
    if (fscanf(f, "%ld", &pid) != 1)
        pid = 0;
    fclose(f);
    if (pid <= 0 || kill((pid_t)pid, 0))
        return NULL;
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 1 << 20, n = 0;
    char *blk = malloc(cap + 1);
    ssize_t k;
    while (blk && n < cap && (k = read(fd, blk + n, cap - n)) > 0)
        n += (size_t)k;
    close(fd);
    if (!blk)
        return NULL;
    blk[n] = 0;
    json_t *o =
        doctor_python_with(cfg->python, env_block_get(blk, n, "KERNELMGR_PYTHON"),
                           env_block_get(blk, n, "VIRTUAL_ENV"), env_block_get(blk, n, "PATH"));
    free(blk);
    if (o)
        json_object_set_new(o, "pid", json_integer(pid));
    return o;
}

static json_t *doctor_python(const kmcfg *cfg, const char *home, json_t *warnings)
{
    json_t *py = doctor_python_with(cfg->python, getenv("KERNELMGR_PYTHON"), getenv("VIRTUAL_ENV"),
                                    getenv("PATH"));
    if (!py)
        return NULL;
    json_object_set_new(py, "used_by", json_pack("[s s s]", "exec", "mcp", "serve"));
    const char *interp = sget(py, "interpreter");
    if (json_is_true(json_object_get(py, "found"))) {
        json_t *pk = doctor_packages_of(interp);
        json_object_set_new(py, "packages", pk ? pk : json_null());
    }
    /* make demo's interpreter */
    char *demo = realpath(DOCTOR_DEMO_PYTHON, NULL);
    if (demo && json_is_true(json_object_get(py, "found"))) {
        int same = !strcmp(demo, sget(py, "real_executable")) &&
                   !json_is_true(json_object_get(py, "is_venv"));
        json_t *d = json_pack("{s:s s:b}", "interpreter", DOCTOR_DEMO_PYTHON, "same", same);
        if (!same) {
            json_t *pk = doctor_packages_of(DOCTOR_DEMO_PYTHON);
            json_object_set_new(d, "packages", pk ? pk : json_null());
            json_array_append_new(
                warnings, json_sprintf("`make demo` runs %s but exec, mcp and serve use %s (from "
                                       "%s): code that works in the demo may not here; give "
                                       "--python or set \"python\" in the configuration",
                                       DOCTOR_DEMO_PYTHON, interp, sget(py, "source")));
        }
        json_object_set_new(py, "demo", d);
    }
    free(demo);
    const json_t *pk = json_object_get(py, "packages");
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)pk, name, v)
    {
        if (!json_is_true(json_object_get(v, "ok")))
            json_array_append_new(
                warnings, json_sprintf("%s cannot import %s (%s)", interp, name, sget(v, "error")));
    }
    json_t *dp = doctor_daemon_python(cfg, home);
    if (dp) {
        if (strcmp(sget(dp, "interpreter"), interp))
            json_array_append_new(
                warnings,
                json_sprintf("the running daemon (pid %lld) uses %s, not %s: it keeps the "
                             "environment it started with (kernelmgr serve --stop to restart it)",
                             (long long)json_integer_value(json_object_get(dp, "pid")),
                             json_is_true(json_object_get(dp, "found")) ? sget(dp, "interpreter")
                                                                        : "no interpreter",
                             interp));
        json_object_set_new(py, "daemon", dp);
    }
    return py;
}

static json_t *doctor_sandbox(const kmcfg *cfg)
{
    json_t *levels = json_object();
    int ok_cfg = 0;
    for (int lv = 0; lv < 2; lv++) {
        sandbox_config sc;
        sandbox_config_defaults(&sc);
        sc.level = lv ? SANDBOX_STRICT : SANDBOX_NONE;
        sc.workspace = "/tmp";
        sc.network = cfg->network == KM_NET_ON;
        sc.loopback_listen_port = cfg->network == KM_NET_ALLOW && lv ? 3128 : 0;
        sc.cpus = cfg->cpus; /* the rate cap is listed, or said unavailable */
        char why[512] = "";
        int ok = sandbox_check(&sc, why, sizeof why) == 0;
        json_t *prot = sandbox_protections(&sc);
        const char *name = lv ? "strict" : "none";
        if (!strcmp(name, cfg->sandbox))
            ok_cfg = ok;
        json_object_set_new(levels, name,
                            json_pack("{s:b s:s* s:o}", "available", ok, "missing", ok ? NULL : why,
                                      "protections", prot ? prot : json_array()));
    }
    return json_pack("{s:s s:b s:o}", "configured", cfg->sandbox, "ok", ok_cfg, "levels", levels);
}

/* ------------------------------------------------------------ privileges */

/* The capabilities a root daemon needs, with what fails without each. */
static const struct {
    const char *name;
    int bit;
    const char *without;
} doctor_caps[] = {
    {"SYS_ADMIN", 21, "no namespaces or mounts: no kernel can start"},
    {"SETUID", 7, "the sandbox cannot take its own uid: no kernel can start"},
    {"SETGID", 6, "the sandbox cannot take its own gid: no kernel can start"},
    {"KILL", 5,
     "interrupts fail and sandbox processes outlive close and serve --stop (they run as "
     "other uids)"},
};

/* CapEff of this process, from /proc/self/status; -1 when unreadable. */
static long long doctor_cap_eff(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return -1;
    char line[256];
    long long v = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "CapEff:", 7)) {
            v = strtoll(line + 7, NULL, 16);
            break;
        }
    fclose(f);
    return v;
}

/* {"identity": "root|unprivileged|userns-root", "capabilities": {NAME: bool},
 *  "missing": [NAME...]}; problems get one line per missing capability a
 * root daemon needs. */
static json_t *doctor_privileges(json_t *problems, json_t *warnings)
{
    const char *id = sandbox_identity();
    long long eff = doctor_cap_eff();
    json_t *caps = json_object(), *missing = json_array();
    for (size_t i = 0; i < sizeof doctor_caps / sizeof doctor_caps[0]; i++) {
        int have = eff >= 0 && (eff >> doctor_caps[i].bit) & 1;
        json_object_set_new(caps, doctor_caps[i].name, json_boolean(have));
        if (!have && !strcmp(id, "root")) {
            json_array_append_new(missing, json_string(doctor_caps[i].name));
            json_array_append_new(problems,
                                  json_sprintf("root without CAP_%s: %s", doctor_caps[i].name,
                                               doctor_caps[i].without));
        }
    }
    if (!strcmp(id, "userns-root"))
        json_array_append_new(warnings,
                              json_string("root of a user namespace that maps too few uids: "
                                          "kernels run in the unprivileged mode (as nobody, "
                                          "sandboxes share one uid)"));
    return json_pack("{s:s s:o s:o}", "identity", id, "capabilities", caps, "missing", missing);
}

/* {"detected": bool, "kind": "docker|podman|...", "evidence": "..."} */
static json_t *doctor_container(void)
{
    static const struct {
        const char *file, *kind;
    } marks[] = {{"/run/.containerenv", "podman"}, {"/.dockerenv", "docker"}};
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
        if (access(marks[i].file, F_OK) == 0)
            return json_pack("{s:b s:s s:s}", "detected", 1, "kind", marks[i].kind, "evidence",
                             marks[i].file);
    const char *c = getenv("container"); /* systemd's convention, set by runtimes */
    if (c && *c)
        return json_pack("{s:b s:s s:s}", "detected", 1, "kind", c, "evidence", "$container");
    FILE *f = fopen("/proc/1/cgroup", "re");
    char line[512];
    static const char *const words[] = {"docker", "kubepods", "lxc", "libpod", "containerd"};
    while (f && fgets(line, sizeof line, f))
        for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
            if (strstr(line, words[i])) {
                fclose(f);
                return json_pack("{s:b s:s s:s}", "detected", 1, "kind", words[i], "evidence",
                                 "/proc/1/cgroup");
            }
    if (f)
        fclose(f);
    return json_pack("{s:b}", "detected", 0);
}

/* {"version": "v2|v1|hybrid|none", "writable": bool, "delegated": bool,
 *  "memory": "cgroup|rlimit", "cpu_rate_cap": bool}; warnings say what
 * degrades. */
static json_t *doctor_cgroup(const json_t *strict_protections, json_t *warnings)
{
    struct statfs fs;
    const char *ver = "none";
    int writable = 0, delegated = 0;
    if (statfs("/sys/fs/cgroup", &fs) == 0) {
        if (fs.f_type == CGROUP2_SUPER_MAGIC)
            ver = "v2";
        else if (fs.f_type == TMPFS_MAGIC) {
            struct statfs u;
            ver = statfs("/sys/fs/cgroup/unified", &u) == 0 && u.f_type == CGROUP2_SUPER_MAGIC
                      ? "hybrid"
                      : "v1";
        }
    }
    if (!strcmp(ver, "v2")) {
        /* our own cgroup ("0::/path"): delegated when we may write it */
        FILE *f = fopen("/proc/self/cgroup", "re");
        char line[1024];
        while (f && fgets(line, sizeof line, f)) {
            if (strncmp(line, "0::", 3))
                continue;
            line[strcspn(line, "\n")] = 0;
            char *dir = cm_path_fmt("/sys/fs/cgroup%s", line + 3);
            char *sub = dir ? cm_path_join(dir, "cgroup.subtree_control") : NULL;
            writable = dir && access(dir, W_OK) == 0;
            delegated = writable && sub && access(sub, W_OK) == 0;
            free(dir);
            free(sub);
        }
        if (f)
            fclose(f);
    } else if (strcmp(ver, "none")) {
        writable = access("/sys/fs/cgroup/memory", W_OK) == 0;
    }
    int memcg = 0, cpucap = 1;
    size_t i;
    json_t *p;
    json_array_foreach(strict_protections, i, p)
    {
        const char *s = json_string_value(p);
        if (s && !strncmp(s, "cgroup-", 7) && strstr(s, "-memory"))
            memcg = 1;
        if (s && !strcmp(s, "cpu-rate-cap-unavailable"))
            cpucap = 0;
    }
    if (!memcg)
        json_array_append_new(warnings,
                              json_sprintf("no usable memory cgroup (cgroup %s, %s): memory falls "
                                           "back to RLIMIT_DATA, an out-of-memory kill is not "
                                           "attributed and --cpus is not enforced",
                                           ver, writable ? "writable" : "read-only"));
    return json_pack("{s:s s:b s:b s:s s:b}", "version", ver, "writable", writable, "delegated",
                     delegated, "memory", memcg ? "cgroup" : "rlimit", "cpu_rate_cap",
                     memcg && cpucap);
}

/* ------------------------------------------------------------ trial starts */

static void doctor_no_event(void *ud, const json_t *ev)
{
    (void)ud;
    (void)ev;
}

/* The probe cell of a language and what it must print ("" = only succeed). */
static void doctor_probe(const km_lang *lg, const char **code, const char **want)
{
    if (lg->role == KM_LANG_ROLE_PYTHON) {
        *code = "print(6 * 7)";
        *want = "42\n";
    } else if (lg->role == KM_LANG_ROLE_SHELL) {
        *code = "echo $((6 * 7))";
        *want = "42\n";
    } else {
        *code = lg->warm_code[0] ? lg->warm_code : "";
        *want = "";
    }
}

/* {LANG: {"ok": bool, "error": "..."|null, "ms": N}} for every allowed
 * language: a real kernel start and a tiny cell through the configured
 * sandbox, in a private home that is removed afterwards. */
static json_t *doctor_trials(const kmcfg *cfg, json_t *problems)
{
    json_t *out = json_object();
    const char *tmp = getenv("TMPDIR");
    char *tmpl = cm_path_fmt("%s/kmdoctor-XXXXXX", tmp && *tmp && strlen(tmp) < 200 ? tmp : "/tmp");
    if (!tmpl || !mkdtemp(tmpl)) {
        json_array_append_new(
            problems,
            json_sprintf("trial start: cannot make a temporary home (%s)", strerror(errno)));
        free(tmpl);
        return out;
    }
    kmcfg c = *cfg; /* km_manager_new copies what it keeps */
    c.pool = 0;
    c.idle_timeout = 0;
    km_err err = {0, ""};
    km_manager *m = km_manager_new(tmpl, &c, 0, &err);
    if (!m)
        json_array_append_new(problems, json_sprintf("trial start: %s", err.msg));
    for (int l = 0; m && l < cfg->langs.n; l++) {
        const km_lang *lg = &cfg->langs.v[l];
        if (!cfg->allow[l])
            continue;
        const char *code, *want;
        doctor_probe(lg, &code, &want);
        char name[KM_NAME_MAX];
        snprintf(name, sizeof name, "doctor-%s", lg->name);
        km_session_opts so;
        km_session_opts_init(&so);
        km_exec_opts eo = {lg->name, 0, 0};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        json_t *res = km_exec(m, name, &so, &eo, code, doctor_no_event, NULL, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        const json_t *r = json_array_get(json_object_get(res, "results"), 0);
        const json_t *e = json_object_get(r, "error");
        char why[1200] = "";
        if (!res)
            snprintf(why, sizeof why, "%s", err.msg);
        else if (!r)
            snprintf(why, sizeof why, "no result");
        else if (json_is_object(e))
            snprintf(why, sizeof why, "%s: %s", sget(e, "name"), sget(e, "value"));
        else if (strcmp(sget(r, "status"), "ok"))
            snprintf(why, sizeof why, "status %s", sget(r, "status"));
        else if (want[0] && strcmp(sget(r, "stdout"), want))
            snprintf(why, sizeof why, "printed %.200s instead of %s", sget(r, "stdout"), want);
        json_decref(res);
        km_close(m, name, 0, NULL);
        json_object_set_new(out, lg->name,
                            json_pack("{s:b s:s* s:i}", "ok", !why[0], "error", why[0] ? why : NULL,
                                      "ms", (int)ms));
        if (why[0])
            json_array_append_new(problems, json_sprintf("the %s kernel cannot run a cell (sandbox "
                                                         "%s): %s",
                                                         lg->name, cfg->sandbox, why));
    }
    km_manager_destroy(&m);
    km_err rmerr = {0};
    if (wsfile_rmtree(tmpl, &rmerr))
        json_array_append_new(
            problems, json_sprintf("trial start: could not remove %s: %s", tmpl, rmerr.msg));
    free(tmpl);
    return out;
}

/* ------------------------------------------------------------ report */

json_t *doctor_report(const kmcfg *cfg, const char *home, const char *version)
{
    struct utsname u;
    uname(&u);
    int zmaj, zmin, zpat;
    zmq_version(&zmaj, &zmin, &zpat);
    const struct scmp_version *sv = seccomp_version();
    json_t *warnings = json_array(), *problems = json_array();

    char bver[128] = "";
    char *bash = doctor_find_bash();
    int have_bash = bash != NULL;
    if (have_bash)
        doctor_bash_version(bash, bver, sizeof bver);
    json_t *py = doctor_python(cfg, home, warnings);

    json_t *kernels = json_object();
    const char *env = getenv("KERNELMGR_KERNEL_DIR");
    char *self = env && *env ? strdup(env) : cm_install_helper_dir();
    int have_dir = self != NULL;
    /* one entry per language of the table (lang.h) */
    for (int l = 0; l < cfg->langs.n; l++) {
        const km_lang *lg = &cfg->langs.v[l];
        char *bin = NULL;
        int abs = lg->backend[0] == '/';
        if (!lg->backend[0])
            bin = NULL;
        else if (asprintf(&bin, "%s%s%s",
                          abs        ? ""
                          : have_dir ? self
                                     : "?",
                          abs ? "" : "/", lg->backend) < 0)
            bin = NULL;
        json_object_set_new(kernels, lg->name,
                            json_pack("{s:s s:b s:b s:s*}", "path", bin ? bin : "?", "found",
                                      bin && (abs || have_dir) && access(bin, X_OK) == 0, "allowed",
                                      cfg->allow[l], "kernelspec",
                                      lg->kernelspec[0] ? lg->kernelspec : NULL));
        free(bin);
    }
    json_t *versions =
        json_pack("{s:s s:o s:s s:s s:o s:o}", "kernelmgr", version, "libzmq",
                  json_sprintf("%d.%d.%d", zmaj, zmin, zpat), "libsodium", sodium_version_string(),
                  "jansson", jansson_version_str(), "libseccomp",
                  sv ? json_sprintf("%u.%u.%u", sv->major, sv->minor, sv->micro) : json_null(),
                  "bash", bver[0] ? json_string(bver) : json_null());
    json_object_set(versions, "python", json_object_get(py, "version") ?: json_null());

    json_t *sb = doctor_sandbox(cfg);
    if (!json_is_true(json_object_get(sb, "ok")))
        json_array_append_new(
            problems,
            json_sprintf(
                "sandbox %s is not available here: %s", cfg->sandbox,
                sget(json_object_get(json_object_get(sb, "levels"), cfg->sandbox), "missing")));
    json_t *priv = doctor_privileges(problems, warnings);
    json_t *cg = doctor_cgroup(
        json_object_get(json_object_get(json_object_get(sb, "levels"), "strict"), "protections"),
        warnings);
    json_t *trials = doctor_trials(cfg, problems);

    json_t *r = json_pack(
        "{s:s s:{s:s s:s s:s s:i} s:s s:o s:s* s:o s:o s:{s:b s:s s:s*} s:o s:o s:o s:o s:o "
        "s:o s:o s:b s:o}",
        "kernelmgr", version, "host", "system", u.sysname, "kernel", u.release, "arch", u.machine,
        "uid", (int)getuid(), "home", home, "versions", versions, "helpers", self, "kernels",
        kernels, "python", py ? py : json_null(), "bash", "found", have_bash && bver[0], "path",
        have_bash ? bash : "", "version", bver[0] ? bver : NULL, "sandbox", sb, "privileges", priv,
        "container", doctor_container(), "cgroup", cg, "trials", trials, "warnings", warnings,
        "problems", problems, "ok", json_array_size(problems) == 0, "config", kmcfg_to_json(cfg));
    free(self);
    free(bash);
    return r;
}

void doctor_render(FILE *out, const json_t *r)
{
    const json_t *host = json_object_get(r, "host");
    const json_t *v = json_object_get(r, "versions");
    fprintf(out, "kernelmgr %s on %s %s %s (uid %lld)\n", sget(r, "kernelmgr"),
            sget(host, "system"), sget(host, "kernel"), sget(host, "arch"),
            (long long)json_integer_value(json_object_get(host, "uid")));
    fprintf(out, "state:        %s\n", sget(r, "home"));
    fprintf(out, "libraries:    libzmq %s, libsodium %s, jansson %s, libseccomp %s\n",
            sget(v, "libzmq"), sget(v, "libsodium"), sget(v, "jansson"), sget(v, "libseccomp"));
    fprintf(out, "helpers:      %s\n", sget(r, "helpers")[0] ? sget(r, "helpers") : "NOT FOUND");
    const char *key;
    json_t *k;
    json_object_foreach((json_t *)json_object_get(r, "kernels"), key, k)
    {
        const char *spec = sget(k, "kernelspec");
        fprintf(out, "kernel %-6s %s%s%s%s\n", key, spec[0] ? "kernelspec " : sget(k, "path"), spec,
                json_is_true(json_object_get(k, "found")) || spec[0] ? "" : " (NOT FOUND)",
                json_is_true(json_object_get(k, "allowed")) ? "" : " (not allowed by config)");
    }
    const json_t *py = json_object_get(r, "python");
    if (json_is_true(json_object_get(py, "found"))) {
        fprintf(out, "python:       %s %s (%s, from %s%s), used by exec, mcp and serve\n",
                sget(py, "interpreter"), sget(py, "version"), sget(py, "implementation"),
                sget(py, "source"), json_is_true(json_object_get(py, "is_venv")) ? ", venv" : "");
        const json_t *pk = json_object_get(py, "packages");
        if (json_is_object(pk)) {
            fputs("  imports:", out);
            json_object_foreach((json_t *)pk, key, k)
            {
                if (json_is_true(json_object_get(k, "ok")))
                    fprintf(out, " %s %s;", key, sget(k, "version"));
                else
                    fprintf(out, " %s NO;", key);
            }
            fputc('\n', out);
        } else {
            fputs("  imports:    the interpreter could not be asked\n", out);
        }
        const json_t *d = json_object_get(py, "demo");
        if (d)
            fprintf(out, "  make demo:  %s%s\n", sget(d, "interpreter"),
                    json_is_true(json_object_get(d, "same")) ? " (the same)" : " (ANOTHER one)");
        const json_t *dp = json_object_get(py, "daemon");
        if (dp)
            fprintf(out, "  daemon:     pid %lld uses %s\n",
                    (long long)json_integer_value(json_object_get(dp, "pid")),
                    json_is_true(json_object_get(dp, "found")) ? sget(dp, "interpreter")
                                                               : "no interpreter");
    } else {
        fprintf(out, "python:       NOT FOUND: %s\n", sget(py, "error"));
    }
    const json_t *b = json_object_get(r, "bash");
    if (json_is_true(json_object_get(b, "found")))
        fprintf(out, "bash:         %s %s\n", sget(b, "path"), sget(b, "version"));
    else
        fprintf(out, "bash:         NOT FOUND\n");
    const json_t *sb = json_object_get(r, "sandbox");
    json_object_foreach((json_t *)json_object_get(sb, "levels"), key, k)
    {
        int avail = json_is_true(json_object_get(k, "available"));
        fprintf(out, "sandbox %-6s %s", key, avail ? "available" : "NOT AVAILABLE");
        if (!avail)
            fprintf(out, ": %s", sget(k, "missing"));
        fputc('\n', out);
        size_t i;
        json_t *p;
        if (avail && strcmp(key, "none")) {
            fputs("  protections:", out);
            json_array_foreach(json_object_get(k, "protections"), i, p)
            {
                fprintf(out, "%s%s", i % 6 ? ", " : "\n    ", json_string_value(p));
            }
            fputc('\n', out);
        }
    }
    const json_t *pr = json_object_get(r, "privileges");
    const char *id = sget(pr, "identity");
    fprintf(out, "identity:     %s\n",
            !strcmp(id, "root")          ? "root: each sandbox runs as its own host uid"
            : !strcmp(id, "userns-root") ? "root of a small user namespace: the unprivileged mode"
                                         : "unprivileged: sandboxes run as this uid");
    fputs("capabilities:", out);
    json_object_foreach((json_t *)json_object_get(pr, "capabilities"), key, k)
    {
        fprintf(out, " %s %s;", key, json_is_true(k) ? "yes" : "no");
    }
    fprintf(out, "%s\n", strcmp(id, "root") ? " (none needed: not root)" : "");
    const json_t *ct = json_object_get(r, "container");
    if (json_is_true(json_object_get(ct, "detected")))
        fprintf(out, "container:    %s (%s)\n", sget(ct, "kind"), sget(ct, "evidence"));
    else
        fprintf(out, "container:    none detected\n");
    const json_t *cg = json_object_get(r, "cgroup");
    fprintf(out, "cgroup:       %s, %s%s; memory limits by %s; CPU rate cap %s\n",
            sget(cg, "version"),
            json_is_true(json_object_get(cg, "writable")) ? "writable" : "read-only",
            json_is_true(json_object_get(cg, "delegated")) ? ", delegated" : "",
            !strcmp(sget(cg, "memory"), "cgroup") ? "cgroup" : "RLIMIT_DATA (fallback)",
            json_is_true(json_object_get(cg, "cpu_rate_cap")) ? "enforced" : "NOT enforced");
    json_object_foreach((json_t *)json_object_get(r, "trials"), key, k)
    {
        if (json_is_true(json_object_get(k, "ok")))
            fprintf(out, "trial %-7s ok (a cell ran in %lld ms)\n", key,
                    (long long)json_integer_value(json_object_get(k, "ms")));
        else
            fprintf(out, "trial %-7s FAILED: %s\n", key, sget(k, "error"));
    }
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(r, "warnings"), i, w)
    {
        fprintf(out, "warning: %s\n", json_string_value(w));
    }
    json_array_foreach(json_object_get(r, "problems"), i, w)
    {
        fprintf(out, "PROBLEM: %s\n", json_string_value(w));
    }
    fprintf(out, "configured sandbox: %s — %s\n", sget(sb, "configured"),
            json_is_true(json_object_get(r, "ok"))
                ? "ok (kernels started)"
                : "NOT OK: see the problems above (kernels will fail or misbehave)");
}
