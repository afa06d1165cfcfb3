/*
 * kernel-python: the generic kernel server with the Python backend.
 *
 * The backend only finds an interpreter (pydetect.h) and describes the worker
 * that runs share/kernelmgr/python/driver.py with it (pykernel.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/python/pydetect.h"
#include "kernels/python/pykernel.h"
#include "kernels/server/backend.h"

static const char *python_arg;
static int ipython_on; /* --ipython on: cells through IPython's shell (kipython.py) */

/* --ipython on|off (or --ipython=on|off): 1 or 2 entries consumed, -1. */
static int ipython_option(int argc, char **argv, char *err, size_t errlen)
{
    const char *v = argv[0][9] == '=' ? argv[0] + 10 : argc > 1 ? argv[1] : NULL;
    if (!v || (strcmp(v, "on") && strcmp(v, "off"))) {
        snprintf(err, errlen, "--ipython must be on or off (got \"%.40s\")", v ? v : "");
        return -1;
    }
    ipython_on = !strcmp(v, "on");
    return argv[0][9] == '=' ? 1 : 2;
}

static int python_option(int argc, char **argv, char *err, size_t errlen)
{
    if (strncmp(argv[0], "--ipython", 9) == 0 && (argv[0][9] == '=' || !argv[0][9]))
        return ipython_option(argc, argv, err, errlen);
    if (strncmp(argv[0], "--python=", 9) == 0) {
        python_arg = argv[0] + 9;
    } else if (strcmp(argv[0], "--python") == 0) {
        if (argc < 2) {
            snprintf(err, errlen, "--python needs a path (or a name on PATH)");
            return -1;
        }
        python_arg = argv[1];
        if (!*python_arg) {
            snprintf(err, errlen, "--python needs a path (or a name on PATH)");
            return -1;
        }
        return 2;
    } else {
        return 0;
    }
    if (!*python_arg) {
        snprintf(err, errlen, "--python needs a path (or a name on PATH)");
        return -1;
    }
    return 1;
}

static int python_prepare(const char *share_dir, const char *workspace, kworker_spec *spec,
                          char *err, size_t errlen)
{
    pydetect_sources src = {
        .explicit_path = python_arg,
        .env_python = getenv("KERNELMGR_PYTHON"),
        .workspace = workspace,
        .virtual_env = getenv("VIRTUAL_ENV"),
        .path_env = getenv("PATH"),
    };
    pydetect_info info = {0};
    if (pydetect_find(&src, &info, err, errlen) < 0)
        return -1;
    int rc = pykernel_fill_spec(&info, share_dir, workspace, spec, err, errlen);
    pydetect_info_clear(&info);
    /* the driver reads it (and the zygote's preload(): it is part of the
     * zygote's start-up environment, sbx_zygote.c keep_env) */
    if (!rc && ipython_on && kspec_add_env(spec, "KERNELMGR_IPYTHON", "1") < 0) {
        snprintf(err, errlen, "python backend: out of memory (or too many worker variables)");
        rc = -1;
    }
    return rc;
}

static const kbackend python_backend = {
    .name = "python",
    .option_help =
        "  --python PATH            Python interpreter (>= 3.8) that runs the code; a bare\n"
        "                           name is looked up on PATH. Default: $KERNELMGR_PYTHON,\n"
        "                           else WORKSPACE/.venv/bin/python (uv), else\n"
        "                           $VIRTUAL_ENV/bin/python, else python3 on PATH (pyenv\n"
        "                           shims resolved to the real interpreter). Nothing in the\n"
        "                           workspace runs on the host: a workspace venv runs in\n"
        "                           the sandbox only; its base interpreter (pyvenv.cfg's\n"
        "                           home) must be a real executable outside the workspace\n"
        "  --ipython on|off         on: every cell runs through IPython's shell, as in\n"
        "                           ipykernel (when IPython is importable; else the\n"
        "                           stdlib path, and the first cell says so). Default off\n",
    .option = python_option,
    .prepare = python_prepare,
};

int main(int c, char **v)
{
    return kserver_main(c, v, &python_backend);
}
