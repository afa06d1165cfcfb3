/*
 * kopts.h — the kernel's command line: connection file, workspace, sandbox
 * level and limits, interrupt grace. Backend options are forwarded to the
 * backend's option() hook.
 */
#ifndef KERNELS_SERVER_KOPTS_H
#define KERNELS_SERVER_KOPTS_H

#include <limits.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/sandbox/sandbox.h"
#include "kernels/server/backend.h"

#define KSERVER_VERSION "0.1.0"

#define KOPTS_MAX_ENV 16 /* --env, repeatable */
#define KOPTS_MAX_RO 8   /* --ro-path, repeatable */

typedef struct kopts {
    const char *connection_file; /* borrowed from argv; NULL when not given */
    const char *workspace_arg;   /* borrowed from argv; NULL: the cwd */
    sandbox_config sandbox;      /* level and limits; workspace filled by the caller */
    double interrupt_grace;      /* seconds between SIGINT and kill+restart */
    /* --env NAME=VALUE and --ro-path DIR, borrowed from argv, NULL-terminated;
     * applied to the worker spec after the backend's prepare() (so --env
     * wins over the backend's variables) by kopts_apply_spec(). */
    const char *env[KOPTS_MAX_ENV + 1];
    const char *ro_paths[KOPTS_MAX_RO + 1];
    int help;    /* --help was given */
    int version; /* --version was given */
} kopts;

/* Parses argv into o (defaults first). Returns 0, or -1 with a message in err
 * for a usage error (the caller exits with status 2). */
int kopts_parse(kopts *o, int argc, char **argv, const kbackend *backend, char *err, size_t errlen);

/* Adds o's --env entries (replacing the backend's value of the same name)
 * and --ro-path entries to spec. 0, or -1 with a reason in err. */
int kopts_apply_spec(const kopts *o, kworker_spec *spec, char *err, size_t errlen);

/* Writes the --help text for the kernel binary of backend. */
void kopts_usage(FILE *out, const kbackend *backend);

/* Parses "512M", "2G", "2GiB", "1048576" into bytes. 0 or -1. */
int kopts_parse_size(const char *s, uint64_t *out);

#endif
