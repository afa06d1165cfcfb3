/*
 * cli_int.h — what the CLI's files share (cli.c: the command table, parsing
 * and dispatch; cli_run.c: run and exec; cli_cmds.c: the one-request
 * commands, serve, install, kernelspec, doctor; cli_files.c: files and
 * session archives). Not for use outside kernelmgr/frontends/cli*.c.
 */
#ifndef KERNELMGR_CLI_INT_H
#define KERNELMGR_CLI_INT_H

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/km.h"
#include "kernelmgr/engine/kmhome.h"
#include "kernels/server/kenv.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#define KM_VERSION "0.1.0"

/* The elapsed-time ticker of a running command, and what it interrupts: a
 * thread (ticker_main) that shows "[running N s]" on a terminal and turns
 * Ctrl-C or a `run`'s stop signal into interrupts. Owned by the command's
 * cli; stop, cond under lock; on, shown, t0 under out_lock. */
typedef struct cli_ticker {
    int on, shown;
    double t0;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* ticker_end() wakes the thread at once */
    int stop;
    km_manager *mgr;      /* `run`: the in-process manager, else NULL */
    const char *session;  /* `run`: its session */
    double stop_deadline; /* `run` stopped by a signal: give up on the cell */
} cli_ticker;

typedef struct cli {
    const char *cmd;
    const char *lang, *code, *file, *session, *workspace, *python, *sandbox, *config;
    const char *output, *kernel_name, *prefix, *memory_s, *manager, *allowlist;
    const char *tag;                       /* --tag of snapshot, restore, fork */
    const char *http, *tls_cert, *tls_key; /* serve --http ... */
    int insecure;
    json_t *env; /* --env: {NAME: "value"}, NULL when none was given */
    kenv_budget env_budget;
    double timeout;
    int network;                      /* -1 unset, else KM_NET_* */
    char net_allow[KM_NET_ALLOW_MAX]; /* KM_NET_ALLOW: the canonical list */
    uint64_t memory;
    /* the plain session options (sessopt.def: their flags' rows name the
     * field), unset when not given; the others are the fields above */
    km_session_opts so;
    int json, continue_on_error, keep, user, stop, pool;
    const char *repair; /* sessions --repair NAME */
    size_t code_len;    /* bytes of the code read from FILE or stdin */
    int npos;
    char *pos[64];
    char home[KM_HOME_MAX + 1];
    kmcfg cfg;
    cli_ticker ticker;
    char *serve_extra[4]; /* connect_daemon: options for an autostarted daemon */
    int argc;             /* the command line (borrowed), for exec_gateway_binary */
    char **argv;
} cli;

/* ---------------------------------------------------------------- cli.c */

/* Says "kernelmgr: MESSAGE" and the --help hint on stderr; KM_EUSAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* prefix, then msg escaped on a terminal (it may quote sandbox output). */
void cli_put_msg(const char *prefix, const char *msg);
/* Says msg on stderr; returns code. */
int cli_fail(int code, const char *msg);
/* o as one compact line on stdout. */
void cli_print_json(const json_t *o);
/* A reply's "warnings" on stderr (every mode). */
void cli_print_warnings(const json_t *rep);

/* ---------------------------------------------------------------- cli_run.c */

int cli_cmd_run(cli *c);
int cli_cmd_exec(cli *c);
/* sessions --repair NAME */
int cli_cmd_repair(cli *c);
/* A connection to c's daemon (started when autostart and none runs); -1
 * with err. */
int cli_connect_daemon(cli *c, int autostart, km_err *err);
/* One API request (method, params stolen) to the daemon; returns the exit
 * status, *reply (new: the result) on success. With --json a failure is
 * also printed as {"error":{"code","message"}}. ev(ud, event): its events. */
int cli_call(cli *c, const char *method, json_t *params, int autostart,
             void (*ev)(void *, const json_t *), void *ud, json_t **reply);
/* The command running (what a failed stdout write interrupts); NULL after. */
void cli_set_active(cli *c);
/* Flushes and closes stdout at the end of a command: st, or KM_EOUTPUT
 * (said on stderr) when any write failed. */
int cli_output_close(int st);

/* ---------------------------------------------------------------- cli_cmds.c */

/* What a one-request command adds to its request, and how it prints the
 * reply (the command table in cli.c names them). */
void cli_build_close(cli *c, json_t *req);
void cli_build_connection_file(cli *c, json_t *req);
void cli_build_export(cli *c, json_t *req);
void cli_build_tag(cli *c, json_t *req);
void cli_build_fork(cli *c, json_t *req);
int cli_fork_check(cli *c);
int cli_sessions_repair(cli *c);
void cli_sessions_no_daemon(cli *c);
int cli_print_sessions(cli *c, const char *name, json_t *rep);
int cli_print_files(cli *c, const char *name, json_t *rep);
int cli_print_export(cli *c, const char *name, json_t *rep);
int cli_print_connection_file(cli *c, const char *name, json_t *rep);
int cli_print_snapshot(cli *c, const char *name, json_t *rep);
int cli_print_restore(cli *c, const char *name, json_t *rep);
int cli_cmd_drain(cli *c);
int cli_cmd_install(cli *c);
int cli_cmd_serve(cli *c);
int cli_cmd_kernelspec(cli *c);
int cli_cmd_doctor(cli *c);

/* ---------------------------------------------------------------- cli_files.c */

int cli_cmd_files_get(cli *c);
int cli_cmd_files_put(cli *c);
int cli_cmd_files_ls(cli *c);
int cli_cmd_files_rm(cli *c);
int cli_cmd_session_export(cli *c);
int cli_cmd_session_import(cli *c);

#endif
