/*
 * session.h — internals shared by the manager's files (session.c, which
 * implements km.h, session_store.c, export.c): where a session keeps its
 * files. The manager's shared state is in session_int.h.
 *
 *   $KERNELMGR_HOME/sessions/NAME/session.json   options, kernels (pids)
 *   $KERNELMGR_HOME/sessions/NAME/history.jsonl  one executed block per line
 *   $KERNELMGR_HOME/sessions/NAME/workspace/     the shared cwd of both kernels
 *   $KERNELMGR_HOME/sessions/NAME/LANG.log       kernel stdout/stderr
 *   $KERNELMGR_HOME/outputs/NAME/                spill files and saved images
 *   $KERNELMGR_HOME/run/                         connection files, ipc sockets
 *   $KERNELMGR_HOME/pool/ID/workspace            workspaces of warm-pool kernels
 *                                                (a session taken from the pool keeps
 *                                                it; sessions/NAME/workspace links it)
 *
 * outputs/ is bounded: a session's outputs go with `close` (unless kept);
 * those of one-shot `run`s (named run-PID-TIME) stay after the run, pruned
 * to the outputs_keep_runs newest and outputs_max_age; a starting daemon
 * removes outputs of sessions that no longer exist.
 */
#ifndef KERNELMGR_SESSION_H
#define KERNELMGR_SESSION_H

#include "kernelmgr/engine/km.h"

/* One history line: {"language","code","execution_count","status","outputs"}
 * (and "client" when it is not NULL: a cell another client of the kernel
 * ran, "websocket" for the gateway's kernel WebSockets, "jupyter" for any
 * other; NULL for the manager's own exec).
 * The file stays under max bytes (0: no cap): when the line would pass it,
 * the newest complete lines that fit in max/2 are kept (temp + rename); a
 * line whose outputs alone exceed max/2 gets a note instead of its outputs.
 * A torn last line is dropped first; a failed write is taken back. 0, or -1
 * with the reason (what failed, where) in err. */
int session_history_append(const char *session_dir, const char *id, const char *language,
                           const char *client, const char *code, const json_t *result,
                           const json_t *nb_outputs, uint64_t max, km_err *err);

/* A cell's life in the history: before its code is sent to a kernel, a
 * "started" record {"event":"started","id","language","code","time",
 * "manager"[,"client"]} is appended; when its result arrives, session_history_append
 * with the same id appends the complete record plus {"event":"finished",
 * "id"}. A started record with no finished one is a cell whose manager
 * stopped while it ran (export.c says so; "manager" is export_manager_id()
 * of the process that ran it). Same bounds and errors as above. */
int session_history_start(const char *session_dir, const char *id, const char *language,
                          const char *client, const char *code, uint64_t max, km_err *err);

/* Removes a directory tree without following symlinks. 0 or -1. */
int session_rmtree(const char *path);

#endif
