/*
 * km.h — the manager's API: sessions and code_exec. The one header the CLI,
 * the daemon and the MCP server call; everything else in kernelmgr/ is an
 * implementation detail behind it.
 *
 * A km_manager owns sessions. A session is a workspace directory plus a Python
 * and a Bash kernel started lazily, sharing it. Calls are thread-safe:
 * executions in one session are serialised by the session's lock, different
 * sessions run concurrently. JSON returned is "new" (json_decref it).
 *
 * Errors (kmerr.h): functions returning int give 0 or a KM_E* code (never 0) and fill
 * err (may be NULL) with a reason; functions returning json_t* give NULL on
 * failure with err filled.
 */
#ifndef KERNELMGR_KM_H
#define KERNELMGR_KM_H

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/kmerr.h"

#include "kernelmgr/engine/netopt.h"
#include <jansson.h>
#include <stddef.h>

#define KM_NAME_MAX 64
/* The longest kernelmgr home (KERNELMGR_HOME) km_manager_new accepts: every
 * path the manager builds under it (at most home + ~150 bytes) then fits its
 * buffers, so none is ever truncated. */
#define KM_HOME_MAX 2048

/* Options fixed when a session is created; restart does not change them.
 * NULL / -1 = config. Given to an existing session with another value, they
 * are not applied: km_exec reports each in "warnings" (see km_exec). */
typedef struct km_session_opts {
    int network;               /* -1 (config), KM_NET_OFF, KM_NET_ON, KM_NET_ALLOW (netopt.h) */
    const char *network_allow; /* KM_NET_ALLOW: the canonical "allow:..." text (borrowed) */

    /* where dtier_sopts_fill writes network_allow */
    char network_allow_buf[KM_NET_ALLOW_MAX];

    unsigned long long memory; /* 0 = config */
    const char *python;        /* interpreter path */
    const char *workspace;     /* existing directory used instead of a fresh one */
    const char *sandbox;       /* "strict" | "none" */
    const json_t *env;         /* borrowed: {NAME: "value"} for the code's environment,
                                  on top of the configuration's "env"; NULL = none */
    /* the plain options (sessopt.def): a BOOL -1 (config), 0, 1; a NUMBER
     * or SIZE 0 (config) */
#include "kernelmgr/engine/sessopt_fields.def"
    int no_create; /* 1: a session that does not exist (neither live nor kept
                      on disk) is KM_ENOSESSION, never made (the API's
                      "create": false) */
} km_session_opts;

void km_session_opts_init(km_session_opts *o);

typedef struct km_exec_opts {
    const char *lang;      /* a name or alias of the language table (lang.h: "python",
                              "bash", configured ones) | "auto" (NULL = auto) */
    double timeout;        /* seconds; <= 0 = config */
    int continue_on_error; /* run the remaining blocks after a failure */
} km_exec_opts;

/* Names the client of the calling thread's next executions (the daemon's
 * peer pid, from SO_PEERCRED; 0 = this process): an execution that has to
 * wait for one of them says "waited 12.3 s for a cell started by another
 * client (pid 4711) to finish". */
void km_exec_set_client(int pid);

/* Live events while code runs. event (borrowed) is one of
 *   {"event":"stream","block":I,"name":"stdout|stderr","text":"..."}
 *   {"event":"result","block":I,"result":{...the block's result...}}
 * Called from the executing thread. */
typedef void (*km_event_fn)(void *ud, const json_t *event);

typedef struct km_manager km_manager;

/* new: a manager rooted at home (created 0700; sessions/ under it). When
 * resume is 1, sessions persisted by an earlier manager are loaded: their
 * workspaces are kept and each kernel that was live comes back fresh on first
 * use, the result saying state was lost. NULL with err on failure. */
km_manager *km_manager_new(const char *home, const kmcfg *cfg, int resume, km_err *err);
/* Stops every kernel; workspaces stay. NULL-safe. */
void km_manager_destroy(km_manager **m);

/* borrowed */
const kmcfg *km_manager_config(const km_manager *m);
const char *km_manager_home(const km_manager *m);

/* Runs code in session `name` (created when absent, with sopts). Returns
 * {"results": [result, ...], "failed": 0|1, "skipped": N} where each result
 * is the JSON of DESIGN.md; NULL with err when nothing could run (bad session
 * name, kernel start failure is reported as a result, not here). When the
 * session already existed and sopts asks for other values than it has,
 * "warnings": ["session \"s\" already exists: --network on was ignored ..."]
 * is added to the reply and to the first result. */
json_t *km_exec(km_manager *m, const char *name, const km_session_opts *sopts,
                const km_exec_opts *opts, const char *code, km_event_fn fn, void *ud, km_err *err);

/* [{"name","workspace","created","last_used","busy","kernels":{"python":
 *   {"state":"idle|busy|stopped","pid":N,"connection_file":P}|null, ...}}]
 * ("kernels": one key per language of the table, in table order) */
json_t *km_sessions(km_manager *m);

/* Interrupts what runs in the session (both kernels). */
int km_interrupt(km_manager *m, const char *name, km_err *err);
/* Restarts the session's live kernels: state cleared, workspace kept. */
int km_restart(km_manager *m, const char *name, km_err *err);
/* Closes a session: kernels stopped; the session directory, its outputs and
 * its workspace (when it is the session's own) removed, unless flags has
 * KM_KEEP (everything stays on disk; a later exec with the same name reopens
 * the workspace) or KM_KEEP_OUTPUTS (spill files and images stay). */
#define KM_KEEP 1
#define KM_KEEP_OUTPUTS 2
int km_close(km_manager *m, const char *name, int flags, km_err *err);
/* km_close; a workspace the session owns is removed only when it is the
 * manager's (below the home, or the directory the manager made: its device
 * and inode recorded in session.json), otherwise kept with a warning string
 * appended to warnings (an array; NULL: said on stderr only). */
int km_close_warn(km_manager *m, const char *name, int flags, json_t *warnings, km_err *err);
/* Repairs a damaged session (its session.json
 * could not be used and was set aside). A running session's file is
 * rewritten from its options ("action": "rewritten"); a stored one is
 * recreated with the configuration's defaults, its own workspace directory
 * kept when it exists ("recreated"); a sound one is left alone ("none").
 * {"session","action","message"[,"workspace","workspace_kept","set_aside"]},
 * or NULL with err (KM_ENOSESSION when there is no such session). */
json_t *km_session_repair(km_manager *m, const char *name, km_err *err);
/* {"session","workspace","files":[{"path","size","mime","type"}],"incomplete":bool,
 * "truncated"?:{"files":{why, fsdiff_incomplete_json}},"files_omitted"?:N}: at most
 * KM_FILES_LIST_MAX entries, and files_scan_max / files_scan_bytes walked */
#define KM_FILES_LIST_MAX 10000
json_t *km_files(km_manager *m, const char *name, km_err *err);
/* Snapshots (snapshot.h; docs/LIFECYCLE.md "State model"). tag NULL: a new
 * one named by the time (snapshot), the newest (restore), a fresh snapshot
 * of src (fork). km_snapshot returns the manifest; km_snapshots
 * {"session","snapshots":[manifests]}; km_restore {"session","tag",
 * "kernels":{LANG: {"restored"} or {"pending": true}},"workspace_restored"};
 * km_fork {"session","from","tag","workspace"}: a new session with its own
 * workspace (a copy, no file shared) whose kernels load the state on their
 * first start. NULL with err (KM_ENOSESSION, KM_EUSAGE: a bad tag, a bound
 * hit, an existing fork target). */
json_t *km_snapshot(km_manager *m, const char *name, const char *tag, km_err *err);
json_t *km_snapshots(km_manager *m, const char *name, km_err *err);
json_t *km_restore(km_manager *m, const char *name, const char *tag, km_err *err);
json_t *km_fork(km_manager *m, const char *src, const char *dst, const char *tag, km_err *err);
/* Moving a session to another daemon (sessionarch.h; docs/MANY_MACHINES.md).
 * km_session_export: offset 0 without archive builds a new archive of the
 * session (a snapshot of its live kernels and workspace taken now, plus the
 * states of kernels waiting to be restored) and returns its first chunk;
 * later calls read [offset, offset + length) of archive (the id the first
 * reply gave; length at most KM_ARCHIVE_CHUNK_MAX). {"session","archive","size",
 * "offset","length","data" (base64),"eof"}, plus {"entries","kernels",
 * "skipped"} when it was built. km_session_import: appends data[0..len) at
 * offset (0 starts anew) to the upload for session name, bounded by
 * import_max_bytes; with final, checks the archive as hostile input, makes
 * the session with sopts (refused while draining, or when it exists) and
 * extracts the archive's snapshot as its snapshot "imported", whose
 * workspace is the session's and whose kernel states the next exec
 * restores. {"session","received"}, or when final {"session","tag","from",
 * "kernels","entries","bytes","workspace"}. NULL with err. */
#define KM_ARCHIVE_CHUNK_MAX (1u << 20) /* bytes of one session.export chunk */
json_t *km_session_export(km_manager *m, const char *name, const char *archive, uint64_t offset,
                          uint64_t length, km_err *err);
json_t *km_session_import(km_manager *m, const char *name, const km_session_opts *sopts,
                          uint64_t offset, const void *data, size_t len, int final, km_err *err);
/* The session's history as an nbformat 4 notebook (see export.h). */
json_t *km_export(km_manager *m, const char *name, const char *kernel_name, km_err *err);
/* Starts the language's kernel if needed; writes its connection file path. */
int km_connection_file(km_manager *m, const char *name, const char *lang, char *out, size_t size,
                       km_err *err);

/* new: creates session `name` with sopts when it does not exist (no kernel
 * is started; a warm-pool entry is taken as by km_exec). Returns
 * {"session","workspace","created":bool,"from_pool":bool} plus "warnings"
 * (as km_exec) when it existed with other options; NULL with err. */
json_t *km_session_create(km_manager *m, const char *name, const km_session_opts *sopts,
                          km_err *err);
/* new: wsfile_read (wsfile.h) of rel in the session's workspace, plus
 * "session". NULL with err (KM_ENOSESSION, KM_EUSAGE for a refused path). */
json_t *km_file_read(km_manager *m, const char *name, const char *rel, uint64_t offset,
                     uint64_t length, const char *encoding, km_err *err);
/* new: wsfile_write (missing directories created) of data[0..len) to rel in
 * the session's workspace, under the session's lock (a running cell of the
 * session finishes first; close waits for the write). {"path","size",
 * "created","session"} or NULL with err. */
json_t *km_file_write(km_manager *m, const char *name, const char *rel, const void *data,
                      size_t len, int append, km_err *err);
/* Runs fn(m, name, live, arg, err) for session `name`: when the session is
 * live (live 1) under its operation lock (a running cell finishes first;
 * close waits for fn), else (live 0) under the manager's package lock, so
 * never during a close of the name. What the package installer
 * (kernelmgr/packages/pkgsession.h) runs installs under. fn's result, or
 * NULL with err (KM_EUSAGE for a bad name, KM_ENOSESSION when the session
 * closed meanwhile). */
typedef json_t *(*km_locked_fn)(km_manager *m, const char *name, int live, void *arg, km_err *err);
json_t *km_with_session_or_name(km_manager *m, const char *name, km_locked_fn fn, void *arg,
                                km_err *err);
/* new: wsfile_remove (wsfile.h) of rel in the session's workspace, under the
 * session's lock as km_file_write. {"path","type","session"} or NULL with
 * err (KM_ENOSESSION, KM_EUSAGE with the reason). */
json_t *km_file_remove(km_manager *m, const char *name, const char *rel, km_err *err);

/* new: the warm pool: {"size": configured entries, "ready": started entries,
 * "live_kernels": N, "entries": [{"python": pid|null, "bash": pid|null, ...}]} (one key per
 * language). A new session created with default options takes a ready entry (its kernels are
 * already running); km_tick refills the pool. */
json_t *km_pool_status(km_manager *m);

/* Periodic work for a long-running manager: idle culling (kernels idle for
 * longer than idle_timeout are stopped; the session's next result says
 * "culled" and that state was lost) and warm pool refill (never beyond
 * max_kernels). Call it every km_tick_interval() seconds. */
void km_tick(km_manager *m);
double km_tick_interval(const km_manager *m);

/* Draining (the API's daemon.drain): while on, no new session is made —
 * km_exec, km_session_create and the gateway's kernel starts refuse a name
 * that does not exist with KM_EDAEMON naming the node — and existing
 * sessions (live or kept on disk) keep working. Not persisted. */
void km_set_draining(km_manager *m, int on);
int km_draining(const km_manager *m);

/* 1 when name is a valid session name: [A-Za-z0-9_.-]{1,64}, not "." first. */
int km_name_valid(const char *name);

#endif
