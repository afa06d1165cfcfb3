/*
 * pydetect.h — find the Python interpreter a kernel runs, and describe it.
 *
 * Order (first that applies wins): --python PATH, $KERNELMGR_PYTHON, the
 * workspace's .venv/bin/python (as `uv venv` / `uv sync` make it),
 * $VIRTUAL_ENV/bin/python, python3 on $PATH. An explicitly named interpreter
 * (the first two) must work; the others are skipped when absent.
 *
 * The chosen candidate is run once with a tiny probe script that prints
 * sys.executable, version, prefix and base_prefix as JSON. That resolves
 * shims (a pyenv shim is a script that execs the real python, whose
 * sys.executable is the real path) while keeping a venv's own bin/python,
 * so its pyvenv.cfg — and thus its site-packages — stays in effect.
 */
#ifndef KERNELS_PYTHON_PYDETECT_H
#define KERNELS_PYTHON_PYDETECT_H

#include <stddef.h>

#define PYDETECT_MIN_MAJOR 3
#define PYDETECT_MIN_MINOR 8

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
    char *real_executable; /* realpath() of interpreter */
    char *version;         /* "3.11.2" */
    int major, minor, micro;
    char *version_full;   /* sys.version, for the banner */
    char *prefix;         /* sys.prefix */
    char *base_prefix;    /* sys.base_prefix (== prefix outside a venv) */
    char *implementation; /* sys.implementation.name, e.g. "cpython" */
    const char *source;   /* static: "--python", "$KERNELMGR_PYTHON", ".venv",
                             "$VIRTUAL_ENV" or "PATH" */
    int is_venv;          /* prefix != base_prefix */
} pydetect_info;

/* Frees the owned strings and zeroes info. NULL-safe. */
void pydetect_info_clear(pydetect_info *info);

/* Parses "3.11.2", "3.12.0rc1", "3.8" (micro 0). Returns 0, or -1 when s does
 * not start with MAJOR.MINOR. */
int pydetect_parse_version(const char *s, int *major, int *minor, int *micro);

/* 1 when major.minor >= PYDETECT_MIN_MAJOR.PYDETECT_MIN_MINOR. */
int pydetect_version_ok(int major, int minor);

/* new: absolute path of the first executable `name` in the ':'-separated
 * path_env (empty entries mean "."), or NULL. A name containing '/' is
 * returned as is (made absolute against the cwd) when it is executable. */
char *pydetect_which(const char *name, const char *path_env);

/* The probe script run as `PYTHON -c SCRIPT`: prints one JSON object. */
extern const char pydetect_probe_script[];

/* Parses the probe's output for candidate (the path that was run) into info
 * (cleared first); decides the interpreter path (shim resolved, venv kept).
 * Does not check the version. Returns 0, or -1 with a reason in err. */
int pydetect_parse_probe(const char *candidate, const char *output, pydetect_info *info, char *err,
                         size_t errlen);

/* Runs candidate with the probe (cwd: workspace when not NULL, so pyenv's
 * .python-version there applies), parses it, and refuses versions below the
 * minimum. Returns 0, or -1 with a reason in err. */
int pydetect_probe(const char *candidate, const char *workspace, pydetect_info *info, char *err,
                   size_t errlen);

/* Detection in the documented order. Returns 0 and fills info (source set),
 * or -1 with a reason in err naming what was tried. */
int pydetect_find(const pydetect_sources *src, pydetect_info *info, char *err, size_t errlen);

#endif
