/*
 * pykernel.c — worker spec and kernel_info of the Python backend.
 */
#include "kernels/python/pykernel.h"

#include "common/cm_path.h"
#include "sandbox/sandbox.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/server/kenv.h"
#include "kernels/server/kopts.h"

#define PYKERNEL_MAX_RO 6

json_t *pykernel_kernel_info(const pydetect_info *info)
{
    char docs[64], *banner = NULL;
    snprintf(docs, sizeof docs, "https://docs.python.org/%d.%d", info->major, info->minor);
    if (asprintf(&banner,
                 "Python %s\nkernelmgr Python kernel %s: %s%s (found via %s)\n"
                 "display(), clear_output() and update_display() are builtins.",
                 info->version_full, KSERVER_VERSION, info->interpreter,
                 info->is_venv ? " (venv)" : "", info->source ? info->source : "?") < 0)
        return NULL;
    json_t *ki = json_pack(
        "{s:{s:s, s:s, s:s, s:s, s:s, s:{s:s, s:i}, s:s}, s:s, s:s, s:s, s:[{s:s, s:s}],"
        " s:{s:s, s:s, s:s, s:s, s:s, s:s, s:b, s:s}}",
        "language_info", "name", "python", "version", info->version, "mimetype", "text/x-python",
        "file_extension", ".py", "pygments_lexer", "ipython3", "codemirror_mode", "name", "ipython",
        "version", 3, "nbconvert_exporter", "python", "implementation", "kernelmgr",
        "implementation_version", KSERVER_VERSION, "banner", banner, "help_links", "text",
        "Python Reference", "url", docs, "interpreter", "path", info->interpreter, "executable",
        info->real_executable, "version", info->version, "implementation", info->implementation,
        "prefix", info->prefix, "base_prefix", info->base_prefix, "venv", info->is_venv, "source",
        info->source ? info->source : "");
    free(banner);
    return ki;
}

/* Adds the real path of dir to list unless the sandbox already sees it. */
static void add_ro(char **list, size_t *n, const char *dir, const char *workspace)
{
    char *real = realpath(dir, NULL);
    if (!real)
        return;
    if (real[0] != '/' || strcmp(real, "/") == 0 || sandbox_is_system_path(real) ||
        (workspace && cm_path_under(real, workspace)))
        goto skip;
    for (size_t i = 0; i < *n; i++) {
        if (cm_path_under(real, list[i]))
            goto skip;
        if (cm_path_under(list[i], real)) { /* the new one covers an older one */
            free(list[i]);
            list[i] = real;
            return;
        }
    }
    if (*n < PYKERNEL_MAX_RO) {
        list[(*n)++] = real;
        return;
    }
skip:
    free(real);
}

static char *dir_of(const char *path)
{
    char *d = strdup(path);
    if (!d)
        return NULL;
    char *slash = strrchr(d, '/');
    if (slash == d)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    return d;
}

int pykernel_fill_spec(const pydetect_info *info, const char *share_dir, const char *workspace,
                       kworker_spec *spec, char *err, size_t errlen)
{
    char driver[PATH_MAX], *driver_real = NULL, *ws_real = NULL, *bindir = NULL;
    char *ro[PYKERNEL_MAX_RO] = {0};
    size_t nro = 0;
    int rc = -1;

    snprintf(driver, sizeof driver, "%s/python/driver.py", share_dir);
    driver_real = realpath(driver, NULL);
    if (!driver_real) {
        snprintf(err, errlen, "python driver not found at %s: %s", driver, strerror(errno));
        return -1;
    }
    /* Nothing the probe reported is bound before it is checked: a prefix is
     * the interpreter's real location, never an arbitrary host path. */
    char why[1024];
    if (pydetect_validate(info, workspace, why, sizeof why) < 0) {
        snprintf(err, errlen, "python at %s: refusing its description: %s", info->interpreter, why);
        free(driver_real);
        return -1;
    }
    ws_real = workspace ? realpath(workspace, NULL) : NULL;
    bindir = dir_of(info->interpreter);
    if (!bindir)
        goto oom;
    /* An interpreter outside every prefix (a symlink in some bin directory
     * to the real one) would not exist in the sandbox: run its real file. */
    const char *exe = info->interpreter;
    if (!info->is_venv && !cm_path_under(bindir, info->prefix) &&
        !cm_path_under(bindir, info->base_prefix) && !sandbox_is_system_path(bindir)) {
        exe = info->real_executable;
        free(bindir);
        bindir = dir_of(exe);
        if (!bindir)
            goto oom;
    }

    /* No -u: the driver block-buffers stdout itself and flushes it before
     * events, fd-level writers (os.system, subprocesses) and every 50 ms
     * (driver.py, "output buffering"); an unbuffered stdout costs one
     * write() per print. No -I/-E/-s: PYTHONPATH and the user site are
     * honoured as in any Python, and a venv's pyvenv.cfg applies either way.
     * The driver runs as __main__ through PYKERNEL_BOOT (pykernel.h), which
     * uses its precompiled code when valid instead of compiling it on every
     * start as `python driver.py` would. */
    if (kspec_add_arg(spec, exe) < 0 || kspec_add_arg(spec, "-c") < 0 ||
        kspec_add_arg(spec, PYKERNEL_BOOT) < 0 || kspec_add_arg(spec, driver_real) < 0)
        goto oom;

    /* The zygote (kzygote.py beside the driver) is the same interpreter
     * and boot, pre-initialized; a workspace venv's interpreter (files the
     * sandbox writes) always starts cold. */
    if (!info->workspace_venv) {
        char zyg[PATH_MAX], *zyg_real = NULL;
        snprintf(zyg, sizeof zyg, "%s/python/kzygote.py", share_dir);
        zyg_real = realpath(zyg, NULL);
        if (zyg_real &&
            (kspec_add_zygote_arg(spec, exe) < 0 || kspec_add_zygote_arg(spec, "-c") < 0 ||
             kspec_add_zygote_arg(spec, PYKERNEL_BOOT) < 0 ||
             kspec_add_zygote_arg(spec, zyg_real) < 0)) {
            free(zyg_real);
            goto oom;
        }
        free(zyg_real);
    }

    /* User code that runs `python3`, `pip` or a console script of the venv
     * in a subprocess gets the kernel's own interpreter, as `source
     * .venv/bin/activate` (or pyenv's exec) would arrange. */
    char *path = NULL;
    /* Never the host's PATH: the sandbox's fixed one (kenv.h). */
    if (asprintf(&path, "%s:%s", bindir, KENV_SANDBOX_PATH) < 0)
        goto oom;
    int e = kspec_add_env(spec, "PATH", path);
    free(path);
    if (e < 0)
        goto oom;
    if (info->is_venv && kspec_add_env(spec, "VIRTUAL_ENV", info->prefix) < 0)
        goto oom;

    char *driver_dir = dir_of(driver_real);
    char *exe_dir = dir_of(info->real_executable);
    if (!driver_dir || !exe_dir) {
        free(driver_dir);
        free(exe_dir);
        goto oom;
    }
    /* Validated above: the driver's directory (ours), the prefixes, the
     * interpreter's directories. A workspace venv's prefix and bin are in
     * the workspace, which the sandbox sees anyway: never bound. */
    /* A workspace venv's base was named by sandbox-written pyvenv.cfg: its
     * executable's directory is bound only inside the base's prefix. */
    int exe_ok = !info->workspace_venv || cm_path_under(exe_dir, info->base_prefix);
    const char *dirs[] = {driver_dir, info->workspace_venv ? NULL : info->prefix, info->base_prefix,
                          info->workspace_venv ? NULL : bindir, exe_ok ? exe_dir : NULL};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
        if (dirs[i])
            add_ro(ro, &nro, dirs[i], ws_real);
    free(driver_dir);
    free(exe_dir);
    for (size_t i = 0; i < nro; i++)
        if (kspec_add_ro_path(spec, ro[i]) < 0)
            goto oom;

    /* debug_request goes to the driver over its own pipes (kdebug.py); the
     * driver declares "debugger" only when debugpy is importable. */
    spec->debug_pipes = 1;
    json_decref(spec->kernel_info);
    spec->kernel_info = pykernel_kernel_info(info);
    if (!spec->kernel_info)
        goto oom;
    rc = 0;
    goto out;
oom:
    snprintf(err, errlen, "python backend: out of memory (or too many worker arguments)");
out:
    for (size_t i = 0; i < nro; i++)
        free(ro[i]);
    free(bindir);
    free(ws_real);
    free(driver_real);
    return rc;
}
