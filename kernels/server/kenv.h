/*
 * kenv.h — what environment code in a sandbox gets, and the rules for the
 * variables a user passes explicitly.
 *
 * The worker's environment is built from scratch (kworker.c), never from the
 * host's: a fixed PATH, HOME=/tmp (writable in every sandbox level), the
 * host's LANG, LANGUAGE, LC_*, TERM and TZ when their values are short and
 * printable, the worker's own KERNELMGR_REQ_FD / KERNELMGR_EVT_FD, the
 * backend's variables and exactly what the user passed with --env (kernel
 * binaries), `env` (kernelmgr config, daemon and MCP session creation).
 * Nothing else of the host (tokens, keys, LD_PRELOAD, PYTHONPATH, BASH_ENV…)
 * reaches the sandbox.
 */
#ifndef KERNELS_SERVER_KENV_H
#define KERNELS_SERVER_KENV_H

#include <jansson.h>
#include <stddef.h>

#define KENV_SANDBOX_PATH "/usr/local/bin:/usr/bin:/bin" /* PATH of every sandbox */
#define KENV_SANDBOX_HOME "/tmp"                         /* HOME of every sandbox */

/* Limits on the variables a user passes (per session, or per kernel). */
#define KENV_MAX_VARS 64            /* variables */
#define KENV_MAX_NAME 255           /* bytes of a name */
#define KENV_MAX_VALUE (32u << 10)  /* bytes of one value */
#define KENV_MAX_TOTAL (256u << 10) /* bytes of every NAME=VALUE together */
#define KENV_MAX_HOST_VALUE 256     /* longest host LANG, LC_x, TERM, TZ value copied */

/* Running totals of kenv_check(). Start zeroed. */
typedef struct kenv_budget {
    size_t count;
    size_t bytes;
} kenv_budget;

/* 1 when name[0..len) is [A-Za-z_][A-Za-z0-9_]* of at most KENV_MAX_NAME bytes. */
int kenv_name_valid(const char *name, size_t len);

/* 1 when name[0..len) is set by the kernel itself (KERNELMGR_REQ_FD,
 * KERNELMGR_EVT_FD) and cannot be passed. */
int kenv_name_reserved(const char *name, size_t len);

/* Checks one user variable name[0..nlen)=value and adds it to b (which may be
 * NULL: no totals). what names the source in messages ("--env", "env").
 * 0, or -1 with a message naming the variable, the limit and its value. */
int kenv_check(kenv_budget *b, const char *what, const char *name, size_t nlen, const char *value,
               char *err, size_t errlen);

/* Same for "NAME=VALUE". */
int kenv_check_entry(kenv_budget *b, const char *what, const char *entry, char *err, size_t errlen);

/* Checks a JSON object of NAME: "value" (borrowed; a string without NUL
 * bytes per name) with kenv_check(). b may be NULL (a fresh budget is used).
 * 0, or -1 with the reason. */
int kenv_check_object(kenv_budget *b, const char *what, const json_t *obj, char *err,
                      size_t errlen);

/* 1 when the host variable entry ("NAME=VALUE") passes into the sandbox:
 * LANG, LANGUAGE, LC_* (a valid name), TERM or TZ with a value of at most
 * KENV_MAX_HOST_VALUE printable ASCII bytes. */
int kenv_host_allowed(const char *entry);

#endif
