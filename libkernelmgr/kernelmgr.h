/*
 * kernelmgr.h — libkernelmgr, the C client library of the kernelmgr daemon.
 * This is the library's one public header; docs/EMBEDDING.md is its manual
 * and docs/API.md the daemon API it speaks (JSON-RPC 2.0 on the unix
 * socket $KERNELMGR_HOME/kernelmgr.sock).
 *
 * Ownership. Every pointer a function returns is one of two kinds, said at
 * each function:
 *   - "new": the caller owns it and frees it with the matching *_free
 *     function (kernelmgr_free for plain buffers and strings);
 *   - "borrowed": it belongs to the object it was read from and stays valid
 *     until that object is freed; never free it.
 * Pointers passed in are only read during the call (nothing is kept),
 * except where a function says it keeps a reference (a session keeps its
 * client: free every session of a client before the client).
 *
 * Errors. One convention: every function that can fail takes a last
 * argument kernelmgr_error **err (may be NULL). On failure it returns NULL
 * or -1 and, when err is not NULL, stores a new error object in *err (free
 * it with kernelmgr_error_free); on success it sets *err to NULL. The
 * error's code is a kernelmgr_code (the same numbers as the CLI's exit
 * statuses), its message a sentence naming what failed — for an error of
 * the daemon, the daemon's own message (e.g. `session.create: field
 * "memory": must be a size of at least 16M, ...`).
 *
 * Threads. All functions may be called from any thread. A client is one
 * connection to the daemon, which answers one request at a time: calls on
 * the same client from several threads are serialised by the client's
 * lock (open one client per thread for parallel work: executions in
 * different sessions run in parallel). kernelmgr_session_interrupt is the
 * exception: it uses a short connection of its own and never waits for the
 * client's lock, so it may be called from another thread while an exec runs
 * on the session, and from an exec's event callback. An event callback runs
 * on the thread that called kernelmgr_exec, with the client's lock held:
 * calling any other function on the same client from it fails with
 * KERNELMGR_EUSAGE (it would wait for itself).
 *
 * Signals. The library never installs a signal handler; writes to the
 * socket use MSG_NOSIGNAL, so a daemon that goes away is an error, not a
 * SIGPIPE.
 */
#ifndef KERNELMGR_H
#define KERNELMGR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the library's exported functions: the library is built with
 * -fvisibility=hidden and a version script, so nothing else is exported. */
#if defined(__GNUC__) || defined(__clang__)
#define KERNELMGR_API __attribute__((visibility("default")))
#else
#define KERNELMGR_API
#endif

#define KERNELMGR_VERSION_MAJOR 0
#define KERNELMGR_VERSION_MINOR 1
#define KERNELMGR_VERSION_PATCH 0
/* The daemon API version this library speaks (docs/API.md "Versioning"). */
#define KERNELMGR_API_VERSION 1

/* The library's version, "0.1.0" (static string). */
KERNELMGR_API const char *kernelmgr_version(void);

/* ------------------------------------------------------------------ errors */

typedef enum kernelmgr_code {
    KERNELMGR_OK = 0,
    KERNELMGR_EUSAGE = 2,     /* refused input: an invalid argument, an option or field the
                                 daemon refused (it names it), a bad session name or path */
    KERNELMGR_ENOSESSION = 3, /* no such session */
    KERNELMGR_EKERNEL = 4,    /* a kernel could not be started */
    KERNELMGR_EDAEMON = 5,    /* the daemon could not be reached or started, broke the
                                 protocol, closed the connection, or is busy */
    KERNELMGR_EINTERNAL = 6,  /* I/O error, out of memory, the daemon's internal error */
} kernelmgr_code;

typedef struct kernelmgr_error kernelmgr_error;

/* The error's kernelmgr_code. */
KERNELMGR_API int kernelmgr_error_code(const kernelmgr_error *e);
/* The JSON-RPC error code when the daemon answered with an error (e.g.
 * -32602 for invalid params, -32003 for no such session), else 0. */
KERNELMGR_API int kernelmgr_error_rpc_code(const kernelmgr_error *e);
/* The message (borrowed from e). */
KERNELMGR_API const char *kernelmgr_error_message(const kernelmgr_error *e);
KERNELMGR_API void kernelmgr_error_free(kernelmgr_error *e);

/* Frees a buffer or string the library returned as "new" (NULL is fine). */
KERNELMGR_API void kernelmgr_free(void *p);

/* ------------------------------------------------------------------ client */

typedef struct kernelmgr_client kernelmgr_client;

/* kernelmgr_connect flags */
#define KERNELMGR_AUTOSTART 1u /* start a daemon (`kernelmgr serve`) when none answers */

/* Connects to the daemon of home; new client (kernelmgr_client_free), or
 * NULL with *err.
 *   home: the kernelmgr home, or NULL to resolve it as the CLI does:
 *     $KERNELMGR_HOME, else $XDG_STATE_HOME/kernelmgr, else
 *     $HOME/.local/state/kernelmgr (a relative one is made absolute).
 *     The home must be the caller's own and writable by no one else (the
 *     CLI's check): a socket in a home others can write may be anyone's.
 *   daemon: with KERNELMGR_AUTOSTART, the `kernelmgr` binary to start, or
 *     NULL for the first of: $KERNELMGR_BIN, the kernelmgr installed with
 *     this library (BINDIR/kernelmgr of its build), `kernelmgr` on PATH.
 *     The daemon is started detached (its own session), with
 *     KERNELMGR_HOME=home and its log in home/daemon.log; the call waits up
 *     to 45 s for its socket.
 * The connection speaks API version KERNELMGR_API_VERSION (an initialize
 * request pins it: a daemon of another version is refused here). */
KERNELMGR_API kernelmgr_client *kernelmgr_connect(const char *home, const char *daemon,
                                                  unsigned flags, kernelmgr_error **err);
/* The client's home (borrowed). */
KERNELMGR_API const char *kernelmgr_client_home(const kernelmgr_client *c);
/* Closes the connection and frees c (NULL is fine). Sessions of c must be
 * freed before, and no call on c may be running in another thread. */
KERNELMGR_API void kernelmgr_client_free(kernelmgr_client *c);

/* One request: method with params_json (a JSON object as text, NULL = {});
 * returns the result as compact JSON text (new), or NULL with *err. For
 * methods this header has no function for (docs/API.md). */
KERNELMGR_API char *kernelmgr_call(kernelmgr_client *c, const char *method, const char *params_json,
                                   kernelmgr_error **err);

/* ----------------------------------------------------------- session options */

/* A set of session options (docs/API.md "Session options": memory, cpus,
 * cpu_time, network, python, workspace, sandbox, env). Keys are passed to
 * the daemon as given and validated there: an unknown key or a bad value
 * is the daemon's refusal (KERNELMGR_EUSAGE naming the field) at
 * kernelmgr_session_open. Setting a key again replaces its value. */
typedef struct kernelmgr_options kernelmgr_options;

/* New, empty options (kernelmgr_options_free), or NULL when out of memory. */
KERNELMGR_API kernelmgr_options *kernelmgr_options_new(void);
KERNELMGR_API void kernelmgr_options_free(kernelmgr_options *o);
/* A string option ("memory" "512M", "network" "on", "sandbox" "strict",
 * "python" "/usr/bin/python3"). 0, or -1 with *err (a NULL or empty key,
 * text that is not UTF-8, out of memory). */
KERNELMGR_API int kernelmgr_options_set(kernelmgr_options *o, const char *key, const char *value,
                                        kernelmgr_error **err);
/* A number option ("cpus" 0.5, "cpu_time" 10, "memory" in bytes). */
KERNELMGR_API int kernelmgr_options_set_number(kernelmgr_options *o, const char *key, double value,
                                               kernelmgr_error **err);
/* One variable of the "env" option (NAME=value for the code). */
KERNELMGR_API int kernelmgr_options_set_env(kernelmgr_options *o, const char *name,
                                            const char *value, kernelmgr_error **err);

/* ------------------------------------------------------------------ sessions */

typedef struct kernelmgr_session kernelmgr_session;

/* Creates the session name (no kernel starts until code runs) or opens the
 * existing one (session.create). opts may be NULL (the configuration's
 * defaults); they apply when the session is created — for an existing
 * session with other values they are not applied and
 * kernelmgr_session_warning says so. New handle (kernelmgr_session_free),
 * which keeps a reference to c, or NULL with *err. */
KERNELMGR_API kernelmgr_session *kernelmgr_session_open(kernelmgr_client *c, const char *name,
                                                        const kernelmgr_options *opts,
                                                        kernelmgr_error **err);
/* Borrowed from s: its name, its workspace directory (the host path). */
KERNELMGR_API const char *kernelmgr_session_name(const kernelmgr_session *s);
KERNELMGR_API const char *kernelmgr_session_workspace(const kernelmgr_session *s);
/* 1 when kernelmgr_session_open created it, 0 when it existed. */
KERNELMGR_API int kernelmgr_session_created(const kernelmgr_session *s);
/* The warnings of session.create (borrowed; i < kernelmgr_session_warnings). */
KERNELMGR_API size_t kernelmgr_session_warnings(const kernelmgr_session *s);
KERNELMGR_API const char *kernelmgr_session_warning(const kernelmgr_session *s, size_t i);
/* Frees the handle only: the session lives on in the daemon (NULL is fine). */
KERNELMGR_API void kernelmgr_session_free(kernelmgr_session *s);

/* Stops what runs in the session, state kept. Uses a connection of its
 * own: callable from any thread while an exec runs, and from an event
 * callback. 0, or -1 with *err. */
KERNELMGR_API int kernelmgr_session_interrupt(kernelmgr_session *s, kernelmgr_error **err);
/* Fresh kernels: variables cleared, workspace kept. 0, or -1 with *err. */
KERNELMGR_API int kernelmgr_session_restart(kernelmgr_session *s, kernelmgr_error **err);
/* Stops the kernels and removes the session (its workspace, outputs and
 * packages too unless keep). The handle must still be freed. */
KERNELMGR_API int kernelmgr_session_close(kernelmgr_session *s, int keep, kernelmgr_error **err);
/* The session's history as an nbformat 4 notebook, JSON text (new), or
 * NULL with *err. */
KERNELMGR_API char *kernelmgr_session_export(kernelmgr_session *s, kernelmgr_error **err);

/* Snapshots (docs/LIFECYCLE.md "State model"): the kernels' variables and
 * the workspace, saved by session.snapshot under tag (NULL: the daemon's
 * default tag). Returns the snapshot's manifest as compact JSON text (new:
 * free()) — "tag", "at", "bytes", per kernel the names "lost" with their
 * reasons — or NULL with *err (KERNELMGR_EUSAGE naming a bound that was
 * hit, such as snapshot_max). */
KERNELMGR_API char *kernelmgr_session_snapshot(kernelmgr_session *s, const char *tag,
                                               kernelmgr_error **err);
/* The session's snapshots (session.snapshots), JSON text (new), or NULL. */
KERNELMGR_API char *kernelmgr_session_snapshots(kernelmgr_session *s, kernelmgr_error **err);
/* Brings the session back to snapshot tag (NULL: the newest): variables of
 * each kernel and the workspace. 0, or -1 with *err. */
KERNELMGR_API int kernelmgr_session_restore(kernelmgr_session *s, const char *tag,
                                            kernelmgr_error **err);
/* A new session new_name from s (session.fork): its own sandbox, a copy of
 * the workspace and of the variables (of snapshot tag, or of now when tag
 * is NULL); afterwards the two share nothing. The reply as JSON text (new),
 * or NULL with *err; open the new session with kernelmgr_session_open. */
KERNELMGR_API char *kernelmgr_session_fork(kernelmgr_session *s, const char *new_name,
                                           const char *tag, kernelmgr_error **err);

/* ------------------------------------------------------------------ results */

/* The result of one kernelmgr_exec: one block per fenced code block (one
 * for plain code). Every string is borrowed from the result. Index
 * arguments out of range give NULL / 0 / -1, never a crash. */
typedef struct kernelmgr_result kernelmgr_result;

KERNELMGR_API void kernelmgr_result_free(kernelmgr_result *r);
/* The number of blocks that ran (or were reported). */
KERNELMGR_API size_t kernelmgr_result_blocks(const kernelmgr_result *r);
/* 1 when a block failed (an exception, a timeout, a non-zero exit of Bash
 * ... as the daemon's "failed"), else 0. */
KERNELMGR_API int kernelmgr_result_failed(const kernelmgr_result *r);
/* "ok", "error", "timeout" or "killed" (docs/CLI.md "The result"). */
KERNELMGR_API const char *kernelmgr_result_status(const kernelmgr_result *r, size_t block);
KERNELMGR_API const char *kernelmgr_result_language(const kernelmgr_result *r, size_t block);
/* The block's exit code (Bash: the last command's status; Python: 0 or 1;
 * 124 on timeout, 137 when killed); -1 when the block has none. */
KERNELMGR_API int kernelmgr_result_exit_code(const kernelmgr_result *r, size_t block);
/* The block's output, NUL-terminated; *len (when not NULL) its length. */
KERNELMGR_API const char *kernelmgr_result_stdout(const kernelmgr_result *r, size_t block,
                                                  size_t *len);
KERNELMGR_API const char *kernelmgr_result_stderr(const kernelmgr_result *r, size_t block,
                                                  size_t *len);
/* The block's error (NULL when it had none): name ("ZeroDivisionError",
 * "Timeout", ...), value, and its traceback lines. */
KERNELMGR_API const char *kernelmgr_result_error_name(const kernelmgr_result *r, size_t block);
KERNELMGR_API const char *kernelmgr_result_error_value(const kernelmgr_result *r, size_t block);
KERNELMGR_API size_t kernelmgr_result_traceback_lines(const kernelmgr_result *r, size_t block);
KERNELMGR_API const char *kernelmgr_result_traceback_line(const kernelmgr_result *r, size_t block,
                                                          size_t i);
/* Rich outputs with MIME data: the block's displays in order, then its
 * result (the value of its last expression) when it has one. */
KERNELMGR_API size_t kernelmgr_result_outputs(const kernelmgr_result *r, size_t block);
/* 1 when output i is the block's result, 0 for a display. */
KERNELMGR_API int kernelmgr_result_output_is_result(const kernelmgr_result *r, size_t block,
                                                    size_t i);
/* The MIME types of output i: j < kernelmgr_result_output_mimes. */
KERNELMGR_API size_t kernelmgr_result_output_mimes(const kernelmgr_result *r, size_t block,
                                                   size_t i);
KERNELMGR_API const char *kernelmgr_result_output_mime(const kernelmgr_result *r, size_t block,
                                                       size_t i, size_t j);
/* The data of output i for MIME type mime ("text/plain"; "image/png" is
 * base64 text, as Jupyter sends it), NULL when it has none; *len its
 * length. A JSON value (application/json) is given as JSON text. */
KERNELMGR_API const char *kernelmgr_result_output_data(const kernelmgr_result *r, size_t block,
                                                       size_t i, const char *mime, size_t *len);
/* The workspace files the block created, modified or deleted: path
 * (relative to the workspace) and change ("created", "modified",
 * "deleted"). */
KERNELMGR_API size_t kernelmgr_result_files(const kernelmgr_result *r, size_t block);
KERNELMGR_API const char *kernelmgr_result_file_path(const kernelmgr_result *r, size_t block,
                                                     size_t i);
KERNELMGR_API const char *kernelmgr_result_file_change(const kernelmgr_result *r, size_t block,
                                                       size_t i);
/* The whole result as the daemon sent it, compact JSON text (borrowed):
 * everything the accessors above do not cover (truncation notes, images,
 * durations, warnings). */
KERNELMGR_API const char *kernelmgr_result_json(const kernelmgr_result *r);

/* ------------------------------------------------------------------ exec */

typedef enum kernelmgr_event_kind {
    KERNELMGR_EVENT_STDOUT = 1, /* text printed on stdout */
    KERNELMGR_EVENT_STDERR = 2, /* text printed on stderr */
    KERNELMGR_EVENT_NOTICE = 3, /* a message from the daemon (the block waits for another cell) */
    KERNELMGR_EVENT_RESULT = 4, /* a block finished: result has that one block, with its
                                   displays, result, error and files */
} kernelmgr_event_kind;

/* An event of a running exec. Every pointer is borrowed for the duration
 * of the callback only (copy what you keep). */
typedef struct kernelmgr_event {
    kernelmgr_event_kind kind;
    int block;                      /* the block it belongs to (0 first) */
    const char *text;               /* STDOUT/STDERR: the text; NOTICE: the message */
    size_t len;                     /* the length of text */
    const kernelmgr_result *result; /* RESULT: one block (index 0), else NULL */
} kernelmgr_event;

/* Called for each event as it arrives; return 0 to go on, non-zero to
 * interrupt the running code (asked once; the exec still returns its
 * result, with status "error"/"timeout" for the interrupted block). */
typedef int (*kernelmgr_event_cb)(const kernelmgr_event *ev, void *ud);

/* kernelmgr_exec flags */
#define KERNELMGR_EXEC_CONTINUE_ON_ERROR 1u /* run the remaining blocks after a failing one */

/* Runs code in session s: lang "python", "bash", "auto" (Markdown fences
 * route each block) or NULL (auto); timeout in seconds per block (<= 0:
 * the daemon's default). cb (may be NULL) hears the events as they arrive.
 * A block that fails is not an error: it is a result with its status and
 * error. New result (kernelmgr_result_free), or NULL with *err. */
KERNELMGR_API kernelmgr_result *kernelmgr_exec(kernelmgr_session *s, const char *code,
                                               const char *lang, double timeout, unsigned flags,
                                               kernelmgr_event_cb cb, void *ud,
                                               kernelmgr_error **err);

/* ------------------------------------------------------------------ files */

/* kernelmgr_file_write flags */
#define KERNELMGR_FILE_APPEND 1u /* append instead of replacing the file */

/* Writes len bytes of data to path (relative to the workspace; missing
 * directories are created, symbolic links are never written through).
 * Sent in requests of at most 4 MiB each (the first replaces the file
 * unless KERNELMGR_FILE_APPEND, the others append). 0, or -1 with *err. */
KERNELMGR_API int kernelmgr_file_write(kernelmgr_session *s, const char *path, const void *data,
                                       size_t len, unsigned flags, kernelmgr_error **err);
/* Reads the whole file path (requests of 1 MiB). max > 0 bounds the bytes
 * read: a larger file is an error naming its size and max. New buffer of
 * *len bytes plus a NUL (kernelmgr_free), or NULL with *err. */
KERNELMGR_API void *kernelmgr_file_read(kernelmgr_session *s, const char *path, size_t max,
                                        size_t *len, kernelmgr_error **err);

/* A listing of the workspace (files.list); strings borrowed from it. */
typedef struct kernelmgr_filelist kernelmgr_filelist;

/* Lists the workspace, or its sub-directory subdir (NULL: all of it). New
 * list (kernelmgr_filelist_free), or NULL with *err. */
KERNELMGR_API kernelmgr_filelist *kernelmgr_file_list(kernelmgr_session *s, const char *subdir,
                                                      kernelmgr_error **err);
KERNELMGR_API size_t kernelmgr_filelist_count(const kernelmgr_filelist *l);
KERNELMGR_API const char *kernelmgr_filelist_path(const kernelmgr_filelist *l, size_t i);
/* "file", "symlink", "fifo" or "other" (directories are not listed); NULL
 * when i is out of range */
KERNELMGR_API const char *kernelmgr_filelist_type(const kernelmgr_filelist *l, size_t i);
KERNELMGR_API const char *kernelmgr_filelist_mime(const kernelmgr_filelist *l, size_t i);
/* the size in bytes, -1 when i is out of range */
KERNELMGR_API int64_t kernelmgr_filelist_size(const kernelmgr_filelist *l, size_t i);
/* 1 when a limit or an unreadable directory left part of the workspace
 * unlisted (kernelmgr_filelist_json says why). */
KERNELMGR_API int kernelmgr_filelist_incomplete(const kernelmgr_filelist *l);
KERNELMGR_API const char *kernelmgr_filelist_json(const kernelmgr_filelist *l);
KERNELMGR_API void kernelmgr_filelist_free(kernelmgr_filelist *l);

#ifdef __cplusplus
}
#endif

#endif
