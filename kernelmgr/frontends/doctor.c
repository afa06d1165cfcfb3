/*
 * doctor.c — the host capability report of `kernelmgr doctor`.
 */
#include "kernelmgr/frontends/doctor.h"
#include "kernelmgr/engine/klaunch.h"
#include "kernels/python/pydetect.h"
#include "sandbox/sandbox.h"

#include <seccomp.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <zmq.h>

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

/* "5.2.15(1)-release", or "" when bash cannot be run. */
static void doctor_bash_version(const char *bash, char *out, size_t size)
{
    out[0] = 0;
    if (strchr(bash, '\''))
        return;
    char *cmd = NULL;
    if (asprintf(&cmd,
                 "'%s' --norc --noprofile -c 'printf %%s \"$BASH_VERSION\"' </dev/null 2>/dev/null",
                 bash) < 0)
        return;
    FILE *p = popen(cmd, "r");
    free(cmd);
    if (!p)
        return;
    if (!fgets(out, (int)size, p))
        out[0] = 0;
    pclose(p);
}

static json_t *doctor_python(const kmcfg *cfg)
{
    pydetect_sources src = {
        .explicit_path = cfg->python[0] ? cfg->python : NULL,
        .env_python = getenv("KERNELMGR_PYTHON"),
        .workspace = NULL,
        .virtual_env = getenv("VIRTUAL_ENV"),
        .path_env = getenv("PATH"),
    };
    if (src.env_python && !*src.env_python)
        src.env_python = NULL;
    if (src.virtual_env && !*src.virtual_env)
        src.virtual_env = NULL;
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

json_t *doctor_report(const kmcfg *cfg, const char *home, const char *version)
{
    struct utsname u;
    uname(&u);
    int zmaj, zmin, zpat;
    zmq_version(&zmaj, &zmin, &zpat);
    const struct scmp_version *sv = seccomp_version();

    char bver[128] = "";
    char *bash = doctor_find_bash();
    int have_bash = bash != NULL;
    if (have_bash)
        doctor_bash_version(bash, bver, sizeof bver);
    json_t *py = doctor_python(cfg);

    json_t *kernels = json_object();
    const char *env = getenv("KERNELMGR_KERNEL_DIR");
    char *self = env && *env ? strdup(env) : klaunch_exe_dir();
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
    free(self);
    json_t *versions =
        json_pack("{s:s s:o s:s s:s s:o s:o}", "kernelmgr", version, "libzmq",
                  json_sprintf("%d.%d.%d", zmaj, zmin, zpat), "libsodium", sodium_version_string(),
                  "jansson", jansson_version_str(), "libseccomp",
                  sv ? json_sprintf("%u.%u.%u", sv->major, sv->minor, sv->micro) : json_null(),
                  "bash", bver[0] ? json_string(bver) : json_null());
    json_object_set(versions, "python", json_object_get(py, "version") ?: json_null());

    json_t *r = json_pack(
        "{s:s s:{s:s s:s s:s s:i} s:s s:o s:o s:o s:{s:b s:s s:s*} s:o s:o}", "kernelmgr", version,
        "host", "system", u.sysname, "kernel", u.release, "arch", u.machine, "uid", (int)getuid(),
        "home", home, "versions", versions, "kernels", kernels, "python", py, "bash", "found",
        have_bash && bver[0], "path", have_bash ? bash : "", "version", bver[0] ? bver : NULL,
        "sandbox", doctor_sandbox(cfg), "config", kmcfg_to_json(cfg));
    free(bash);
    return r;
}

static const char *sget(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
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
    const char *key;
    json_t *k;
    json_object_foreach((json_t *)json_object_get(r, "kernels"), key, k)
    {
        const char *spec = sget(k, "kernelspec");
        fprintf(out, "kernel %-6s %s%s%s%s%s\n", key, spec[0] ? "kernelspec " : sget(k, "path"),
                spec, json_is_true(json_object_get(k, "found")) || spec[0] ? "" : " (NOT FOUND)",
                json_is_true(json_object_get(k, "allowed")) ? "" : " (not allowed by config)", "");
    }
    const json_t *py = json_object_get(r, "python");
    if (json_is_true(json_object_get(py, "found")))
        fprintf(out, "python:       %s %s (%s, from %s%s)\n", sget(py, "interpreter"),
                sget(py, "version"), sget(py, "implementation"), sget(py, "source"),
                json_is_true(json_object_get(py, "is_venv")) ? ", venv" : "");
    else
        fprintf(out, "python:       NOT FOUND: %s\n", sget(py, "error"));
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
    fprintf(out, "configured sandbox: %s — %s\n", sget(sb, "configured"),
            json_is_true(json_object_get(sb, "ok"))
                ? "ok"
                : "NOT AVAILABLE on this host: kernels will refuse to start");
}
