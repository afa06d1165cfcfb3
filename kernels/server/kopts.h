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

#include "sandbox/sandbox.h"
#include "kernels/server/backend.h"
#include "kernels/server/kenv.h"
#include "kernels/egress/egpolicy.h"

#define KSERVER_VERSION "0.1.0"

/* --env, repeatable, and the entries of --env-file, counted together: the
 * user's variables (kenv.h limits) plus room for those the manager adds
 * itself (package directories). */
#define KOPTS_MAX_ENV (KENV_MAX_VARS + 8)
#define KOPTS_MAX_ENV_BYTES (KENV_MAX_TOTAL + (32u << 10))
/* --env-file: the largest file read (every entry plus its NUL). */
#define KOPTS_MAX_ENV_FILE (KOPTS_MAX_ENV_BYTES + KOPTS_MAX_ENV)
#define KOPTS_MAX_RO 8                       /* --ro-path, repeatable */
#define KOPTS_ZYGOTE_FORKS_MAX 100000u       /* --zygote (the sandbox's own bound) */
#define KOPTS_LOG_MAX_DEFAULT (1u << 20)     /* --log-max */
#define KOPTS_HISTORY_MAX_DEFAULT (8u << 20) /* --history-max */
#define KOPTS_CPUS_MIN 0.01                  /* --cpus: 1 ms per 100 ms period */
#define KOPTS_CPUS_MAX 4096.0
#define KOPTS_CPU_TIME_MAX (86400.0 * 365) /* --cpu-time, seconds */

typedef struct kopts {
    const char *connection_file; /* borrowed from argv; NULL when not given */
    const char *workspace_arg;   /* borrowed from argv; NULL: the cwd */
    sandbox_config sandbox;      /* level and limits; workspace filled by the caller */
    /* --network allow:HOST[,HOST...]: the sandbox's network is off but for
     * the egress proxy this server runs outside it (kworker.h); strict
     * only. egress.n == 0: no allow-list (on or off). */
    egpolicy egress;
    double interrupt_grace; /* seconds between SIGINT and kill+restart */
    /* --cpu-time S: CPU seconds (every process of the sandbox together) an
     * execute request may use; past it the request is interrupted like a
     * timeout (kill after interrupt_grace) and its reply says so. 0: none. */
    double cpu_time;
    uint64_t log_max;     /* --log-max: the kernel log file's size cap (bytes) */
    uint64_t history_max; /* --history-max: the history file's size cap (bytes) */
    /* --env NAME=VALUE (borrowed from argv) and the entries of --env-file
     * (pointing into env_file_data), in command-line order, and --ro-path
     * DIR (borrowed from argv), NULL-terminated; applied to the worker spec
     * after the backend's prepare() (so they win over the backend's
     * variables; a later one of the same name wins) by kopts_apply_spec(). */
    const char *env[KOPTS_MAX_ENV + 1];
    const char *ro_paths[KOPTS_MAX_RO + 1];
    /* --env-file FILE: its content, owned (kopts_clear() wipes and frees
     * it). The manager passes the session's variables this way, so that
     * they never show on a command line (/proc/PID/cmdline is readable by
     * every user of the host). */
    char *env_file_data;
    /* --owner-fd N: an inherited fd, the read end of a pipe whose write end
     * the owner (the manager) keeps; end-of-file or a hang-up on it shuts
     * the kernel down as SIGTERM does. -1 when not given. */
    int owner_fd;
    /* --allow-non-loopback-ip: bind a tcp connection file's ip even when it is
     * not a loopback address (jp_connection_is_loopback); refused without it,
     * since whoever reaches that address can read IOPub (JP_TCP_EXPOSURE) */
    int allow_non_loopback_ip;
    int help;    /* --help was given */
    int version; /* --version was given */
} kopts;

/* Parses argv into o (defaults first). Returns 0, or -1 with a message in err
 * for a usage error (the caller exits with status 2; o then holds nothing to
 * free). After a 0 the caller calls kopts_clear(o).
 *
 * --env-file FILE (at most once): FILE holds NUL-separated NAME=VALUE
 * entries (a final NUL is optional). It is opened O_RDONLY | O_NOFOLLOW |
 * O_NONBLOCK and must be a regular file owned by this process's effective
 * uid, with no group or other permission bits (0600), of at most
 * KOPTS_MAX_ENV_FILE bytes; each entry is checked as an --env value is, and
 * counts toward the same KOPTS_MAX_ENV / KOPTS_MAX_ENV_BYTES limits. Errors
 * name the file, the entry (by number and variable name; never its value)
 * and the limit. */
int kopts_parse(kopts *o, int argc, char **argv, const kbackend *backend, char *err, size_t errlen);

/* Frees what kopts_parse() allocated (the --env-file content, zeroed first)
 * and empties o->env; the other fields stay valid. NULL-safe; idempotent. */
void kopts_clear(kopts *o);

/* Adds o's --env entries (replacing the backend's value of the same name)
 * and --ro-path entries to spec. 0, or -1 with a reason in err. */
int kopts_apply_spec(const kopts *o, kworker_spec *spec, char *err, size_t errlen);

/* Writes the --help text for the kernel binary of backend. */
void kopts_usage(FILE *out, const kbackend *backend);

/* Parses "512M", "2G", "2GiB", "1048576" into bytes. 0 or -1. */
int kopts_parse_size(const char *s, uint64_t *out);

#endif
