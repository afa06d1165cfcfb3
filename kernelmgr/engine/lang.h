/*
 * lang.h — the languages the manager runs, as data.
 *
 * One table (km_langs) holds every language: the two built-ins of lang.c
 * (python, bash) first, then those the configuration's "kernels" key
 * defines. An entry says everything the manager needs to know about its
 * language: its name and aliases (fence info words, --lang synonyms), how
 * its kernel starts (a kernel-server backend binary that gets the sandbox
 * options, or a Jupyter kernelspec), whether it takes --python, its package
 * kind for install_packages, names for kernelspecs, the notebook
 * language_info, the cell magic that runs it in another language's notebook,
 * and its role for the --lang auto guesser. Every other file loops over the
 * table; adding a language is an entry here (built-in) or in config.json.
 *
 * "kernels" in the configuration (km_langs_configure):
 *   "python": "python3"            a built-in run by another Jupyter kernelspec
 *   "python": null                 back to the built-in backend
 *   "ir": "ir"                     a new language run by a Jupyter kernelspec
 *   "sh": {"backend": "kernel-bash" | "/abs/path",  (exactly one of the two)
 *          "kernelspec": "NAME",
 *          "aliases": ["posix"], "display_name": "...", "file_extension": ".sh",
 *          "cell_magic": "%%bash", "packages": "pip" | "npm" | null}
 * Names and aliases: [a-z][a-z0-9_-]{0,31}. A configured name may take over
 * an alias of a built-in (then that word means the configured language);
 * otherwise a name or alias that another language already uses is refused.
 */
#ifndef KERNELMGR_LANG_H
#define KERNELMGR_LANG_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>

#define KM_LANG_MAX 8       /* languages in one table */
#define KM_LANG_NAME_MAX 32 /* bytes of a name or alias */
#define KM_LANG_ALIAS_MAX 8 /* aliases per language */
#define KM_LANG_BACKEND_MAX 1024

typedef enum km_lang_role {
    KM_LANG_ROLE_NONE = 0,
    KM_LANG_ROLE_PYTHON, /* unfenced code the guesser finds python-like runs here */
    KM_LANG_ROLE_SHELL,  /* shell-like code, console transcripts, "#!...sh" */
} km_lang_role;

typedef enum km_lang_pkg {
    KM_LANG_PKG_NONE = 0, /* the kernel gets no package directory */
    KM_LANG_PKG_PIP,      /* PYTHONPATH=packages/python */
    KM_LANG_PKG_NPM,      /* NODE_PATH, PATH from packages/npm */
} km_lang_pkg;

typedef struct km_lang {
    char name[KM_LANG_NAME_MAX + 1]; /* "python": results, history, session.json */
    char id[KM_LANG_NAME_MAX + 1];   /* in kernel ids: "py" */
    char aliases[KM_LANG_ALIAS_MAX][KM_LANG_NAME_MAX + 1];
    int naliases;
    char backend[KM_LANG_BACKEND_MAX]; /* "kernel-python" (in the kernel dir) or an
                                          absolute path; "" when only kernelspec */
    char kernelspec[256];              /* a Jupyter kernelspec that runs it instead */
    int takes_python;                  /* its backend takes --python */
    km_lang_pkg packages;
    char title[64];          /* "Python": the gateway's display names */
    char display_name[128];  /* "Python 3 (kernelmgr sandbox)": kernelspec install */
    char file_extension[16]; /* notebook language_info; "" = not written */
    char mimetype[64];       /* ""  = not written */
    char vscode_id[32];      /* cell metadata.vscode.languageId; "" = none */
    char cell_magic[32];     /* "%%bash": its cells in an IPython notebook; "" = none */
    char warm_code[16];      /* a silent no-op the warm pool runs first; "" = none */
    km_lang_role role;
    int builtin;
    int string_form; /* configured as "NAME": "KERNELSPEC" (km_langs_to_json) */
} km_lang;

typedef struct km_langs {
    km_lang v[KM_LANG_MAX];
    int n;
} km_langs;

/* Fills t with the built-in languages (python, bash). */
void km_langs_builtin(km_langs *t);

/* Index of the language named word (its name or an alias, exact), or -1. */
int km_langs_find(const km_langs *t, const char *word);

/* km_langs_find, ignoring case (Markdown fence info words). */
int km_langs_find_nocase(const km_langs *t, const char *word);

/* Index of the first language with role r, or -1. */
int km_langs_role(const km_langs *t, km_lang_role r);

/* Applies one entry of the configuration's "kernels" object (see above):
 * name = the key, v = its value (borrowed). A new name is appended (or
 * replaces an earlier configured one). Returns the entry's index, or -1 with
 * "kernels.NAME[.FIELD]: reason" in err; t is unchanged then. */
int km_langs_configure(km_langs *t, const char *name, const json_t *v, km_err *err);

/* "python, bash, sh" into buf (truncated to len). Returns buf. */
const char *km_langs_names(const km_langs *t, char *buf, size_t len);

/* new: the "kernels" configuration value of t (built-ins: their kernelspec or
 * null; configured: the string or object form). */
json_t *km_langs_to_json(const km_langs *t);

/* new (free()): the backend binary of l: its absolute path, else the name
 * in $KERNELMGR_KERNEL_DIR, else in the helper directory (cm_install.h: beside
 * the binary in the build tree, LIBEXECDIR/kernelmgr installed; kernel_dir,
 * when not NULL, wins over both). NULL with the reason (naming the path) in
 * err when l has no backend or it is not an executable file. */
char *km_lang_backend_path(const km_lang *l, const char *kernel_dir, km_err *err);

#endif
