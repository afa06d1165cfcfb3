/*
 * pydetect.h — find the Python interpreter a kernel runs, and describe it.
 *
 * Order (first that applies wins): --python PATH, $KERNELMGR_PYTHON, the
 * workspace's .venv/bin/python (as `uv venv` / `uv sync` make it),
 * $VIRTUAL_ENV/bin/python, python3 on $PATH. An explicitly named interpreter
 * (the first two) must work; the others are skipped when absent.
 *
 * Trust. The workspace is written by sandboxed code, so nothing in it is
 * ever executed, imported or followed on the host:
 *  - Only interpreters outside the workspace ("trusted": --python,
 *    $KERNELMGR_PYTHON, $VIRTUAL_ENV/bin/python, python3 on PATH) are run on
 *    the host, once, with a probe script that prints sys.executable, version,
 *    prefix and base_prefix as JSON. The probe runs as `PYTHON -I -S -c
 *    SCRIPT` (no site, no PYTHON* variables, no cwd on sys.path), in "/",
 *    with a scrubbed environment (pydetect_probe_env). That resolves shims (a
 *    pyenv shim execs the real python, whose sys.executable is the real path)
 *    while keeping a venv's own bin/python. A candidate whose path or real
 *    path lies in the workspace is never run on the host (PATH entries that
 *    lead there are skipped; an explicit one is refused unless it is a
 *    workspace venv's bin/python, see next).
 *  - A venv inside the workspace (WORKSPACE/.venv, or one named by
 *    $VIRTUAL_ENV or --python inside the workspace) is never run on the host.
 *    Its pyvenv.cfg is read without following symlinks (bounded); its `home`
 *    names the base interpreter's directory, which must hold a real ELF
 *    executable outside the workspace: that base is probed as a trusted one,
 *    and the worker runs the venv's bin/python inside the sandbox only.
 *  - Every probe result is validated (pydetect_validate) before any of its
 *    paths is bound into the sandbox, cached or not.
 */
#ifndef KERNELS_PYTHON_PYDETECT_H
#define KERNELS_PYTHON_PYDETECT_H

#include <stddef.h>

#define PYDETECT_MIN_MAJOR 3
#define PYDETECT_MIN_MINOR 8
#define PYDETECT_PYVENV_MAX (64u << 10) /* bytes of pyvenv.cfg read */

/* Where the detection looks; NULL members are "unset". Borrowed strings. */
typedef struct pydetect_sources {
    const char *explicit_path; /* --python PATH (a bare name is looked up on path_env) */
    const char *env_python;    /* $KERNELMGR_PYTHON */
    const char *workspace;     /* absolute workspace directory */
    const char *virtual_env;   /* $VIRTUAL_ENV */
    const char *path_env;      /* $PATH */
} pydetect_sources;

/* What was found. Every string is owned; pydetect_info_clear() frees them. */
typedef struct pydetect_info {
    char *interpreter;     /* absolute path the worker runs (a venv's bin/python as is) */
    char *real_executable; /* realpath() of the (base) interpreter that was probed */
    char *version;         /* "3.11.2" */
    int major, minor, micro;
    char *version_full;   /* sys.version, for the banner */
    char *prefix;         /* sys.prefix (a workspace venv: its directory) */
    char *base_prefix;    /* sys.base_prefix (== prefix outside a venv) */
    char *implementation; /* sys.implementation.name, e.g. "cpython" */
    const char *source;   /* static: "--python", "$KERNELMGR_PYTHON", ".venv",
                             "$VIRTUAL_ENV" or "PATH" */
    int is_venv;          /* prefix != base_prefix */
    int workspace_venv;   /* prefix is a venv inside the workspace: run in the
                             sandbox only, never bound, never probed */
} pydetect_info;

/* Frees the owned strings and zeroes info. NULL-safe. */
void pydetect_info_clear(pydetect_info *info);

/* Parses "3.11.2", "3.12.0rc1", "3.8" (micro 0). Returns 0, or -1 when s does
 * not start with MAJOR.MINOR. */
int pydetect_parse_version(const char *s, int *major, int *minor, int *micro);

/* 1 when major.minor >= PYDETECT_MIN_MAJOR.PYDETECT_MIN_MINOR. */
int pydetect_version_ok(int major, int minor);

/* new: absolute path of the first executable `name` in the ':'-separated
 * path_env, or NULL. Empty, "." and relative entries are ignored (they would
 * mean the cwd). A name containing '/' is returned as is (made absolute
 * against the cwd) when it is executable. */
char *pydetect_which(const char *name, const char *path_env);

/* The probe script run as `PYTHON -I -S -c SCRIPT`: prints one JSON object.
 * Without site.py a venv's sys.prefix is unset on Python < 3.11: the script
 * finds the venv's pyvenv.cfg itself the way site.venv() does. */
extern const char pydetect_probe_script[];

/* new (pydetect_free_env()): the environment a host-side probe runs with:
 * PATH (path_env without empty/relative entries, or a default), and HOME,
 * LANG, LC_ALL, PYENV_ROOT, PYENV_VERSION when set. Nothing else: no
 * PYTHON*, no LD_*. NULL on OOM. */
char **pydetect_probe_env(const char *path_env);
void pydetect_free_env(char **env);

/* Parses the probe's output for candidate (the path that was run) into info
 * (cleared first); decides the interpreter path (shim resolved, venv kept).
 * Does not check the version or the paths (pydetect_validate does). Returns
 * 0, or -1 with a reason in err. */
int pydetect_parse_probe(const char *candidate, const char *output, pydetect_info *info, char *err,
                         size_t errlen);

/* Checks what info says before anything is bound into the sandbox:
 * real_executable is an absolute, normalised regular file outside the
 * workspace; base_prefix (and prefix, unless info->workspace_venv, where it
 * must be WORKSPACE/<dir>) is an absolute, normalised (realpath-equal),
 * existing directory, not "/", not in the workspace, and an ancestor of the
 * interpreter or its real executable or holding lib/pythonX.Y.
 * workspace may be NULL. Returns 0, or -1 with a reason in err. */
int pydetect_validate(const pydetect_info *info, const char *workspace, char *err, size_t errlen);

/* Runs the trusted candidate with the probe (-I -S, cwd "/", scrubbed
 * environment with PATH from path_env) — or takes a cached answer — parses
 * and validates it, and refuses versions below the minimum. A candidate in
 * workspace (may be NULL) is refused without being run. Returns 0, or -1
 * with a reason in err. */
int pydetect_probe(const char *candidate, const char *workspace, const char *path_env,
                   pydetect_info *info, char *err, size_t errlen);

/* The `home` value of a pyvenv.cfg text (last "home = VALUE" line, key case
 * insensitive, value trimmed), as site.py reads it. new (free()), or NULL
 * when there is none. */
char *pydetect_pyvenv_home(const char *cfg_text);

/* Whether the interpreter of info (a trusted one: never a workspace venv)
 * can import the top-level module `name` (letters, digits, '_'): it is
 * found on its sys.path or site directories, nothing of it is imported or
 * executed (`-I -S`, cwd "/", scrubbed environment, as the probe). 1 yes,
 * 0 no, -1 with a reason in err (not run: workspace venv, bad name, spawn
 * failed). Not cached: installing a package changes the answer. */
int pydetect_has_module(const pydetect_info *info, const char *name, char *err, size_t errlen);

/* Detection in the documented order. Returns 0 and fills info (source set),
 * or -1 with a reason in err naming what was tried. */
int pydetect_find(const pydetect_sources *src, pydetect_info *info, char *err, size_t errlen);

#endif
