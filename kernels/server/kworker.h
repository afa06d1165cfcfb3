/*
 * kworker.h — the worker process: the one place where it is spawned (through
 * sandbox_spawn), its five pipes (kernels/WORKER_PROTOCOL.md), the request
 * writer and the event-line reader, reaping and exit descriptions.
 *
 * All pipe ends held here are non-blocking and close-on-exec.
 */
#ifndef KERNELS_SERVER_KWORKER_H
#define KERNELS_SERVER_KWORKER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sandbox/sandbox.h"
#include "kernels/server/backend.h"
#include "kernels/egress/egpolicy.h"

#define KWORKER_MAX_EVENT (64u << 20) /* longest event line accepted */

typedef enum kworker_pipe {
    KW_STDOUT = 0,
    KW_STDERR,
    KW_EVENTS,
    KW_REQUESTS,
    KW_DEBUG_REQ, /* server -> worker debug lines (spec->debug_pipes only) */
    KW_DEBUG_EVT, /* worker -> server debug lines (spec->debug_pipes only) */
    KW__COUNT
} kworker_pipe;

typedef struct kworker kworker;

/* The port the egress proxy listens on inside the sandbox (127.0.0.1):
 * squid's customary one. Nothing in the sandbox can listen on it. */
#define KWORKER_EGRESS_PORT 3128
#define KWORKER_EGRESS_PORT_S "3128"

/* new: starts spec's argv in a sandbox configured by cfg (borrowed; its
 * workspace and level are used as given, ro_paths come from spec). With
 * egress (borrowed; NULL or no entries: none) the sandbox's network is off
 * but for a listener on 127.0.0.1:KWORKER_EGRESS_PORT inside it, which this
 * process serves from outside with the egress proxy for the worker's
 * lifetime (egproxy_start_policy: the list, SNI, DNS here only); the worker
 * gets http_proxy, https_proxy, HTTP_PROXY, HTTPS_PROXY pointing at it and
 * no_proxy / NO_PROXY "localhost,127.0.0.1,::1". In a session sandbox
 * (cfg->session_socket) the listener and its proxy are the session's, served
 * by its holder (kernelmgr-sandbox) for every kernel at that same address:
 * this process starts none. NULL with a reason in err. */
kworker *kworker_start(const kworker_spec *spec, const sandbox_config *cfg, const egpolicy *egress,
                       char *err, size_t errlen);

/* Kills every process of the worker's sandbox, reaps it, closes the pipes.
 * NULL-safe; sets *w to NULL. */
void kworker_destroy(kworker **w);

pid_t kworker_pid(const kworker *w);

/* borrowed: the egress proxy of a worker started with an allow-list, else
 * NULL. */
struct egproxy *kworker_egress(kworker *w);

/* How many requests the worker's egress proxy refused so far, the last
 * reason in last (may be NULL): its own proxy's, or, in a session sandbox,
 * the session's one proxy's, which its holder serves for every kernel of
 * the session (asked over the holder's socket). -1: no allow-list, or the
 * holder did not answer. */
long long kworker_egress_refusals(kworker *w, char *last, size_t lastlen);

/* borrowed: the sandbox, for limit and CPU queries. */
sandbox *kworker_sandbox(kworker *w);

/* The parent's end of a pipe, or -1 once it was closed. */
int kworker_fd(const kworker *w, kworker_pipe p);
void kworker_close_fd(kworker *w, kworker_pipe p);

/* Queues one request: fields (borrowed) each written with a terminating NUL;
 * NUL bytes inside a field are dropped. Then writes what the pipe accepts.
 * 0, or -1 when out of memory or the pipe is broken. */
int kworker_send(kworker *w, const char *const *fields, size_t n);

/* 1 when queued request bytes wait for the pipe to accept them. */
int kworker_wants_write(const kworker *w);

/* Writes queued request bytes. 0, or -1 when the pipe is broken. */
int kworker_write(kworker *w);

/* Called for each complete event: ev is borrowed (an object with a string
 * "type"). */
typedef void (*kworker_event_fn)(void *ctx, json_t *ev);

/* Reads what the event pipe has (one read) and calls fn for each complete
 * line. Returns 1 at end of file, 0 after progress, -1 when nothing was there. */
int kworker_read_events(kworker *w, kworker_event_fn fn, void *ctx);

/* The debug pipes (WORKER_PROTOCOL.md "Debug pipes"), for a worker
 * started with spec->debug_pipes: 1 when it has them (and they are open). */
int kworker_has_debug(const kworker *w);

/* Queues one debug line (len bytes, borrowed, without a newline: one is
 * added) and writes what the pipe accepts. 0, or -1 when out of memory, the
 * line holds a newline, or the pipe is broken or absent. */
int kworker_debug_send(kworker *w, const char *line, size_t len);
int kworker_debug_wants_write(const kworker *w);
/* Writes queued debug bytes. 0, or -1 when the pipe is broken. */
int kworker_debug_write(kworker *w);

/* Reads what the debug pipe has (one read) and calls fn for each complete
 * line that is a JSON object (borrowed). Returns as kworker_read_events. */
int kworker_read_debug(kworker *w, kworker_event_fn fn, void *ctx);

/* Reaps the worker if it has exited (non-blocking). 1 when it has (status
 * available), 0 while it runs. */
int kworker_reap(kworker *w);
int kworker_exited(const kworker *w);

/* Writes how the worker ended ("exited with status 1", "was killed by signal
 * 9 (Killed): out of memory (limit 2 GiB)") into buf and returns buf. */
const char *kworker_describe_exit(kworker *w, char *buf, size_t size);

/* Exit code for the reply metadata: the exit status, or 128 + signal. */
int kworker_exit_code(const kworker *w);

/* Delivers sig to the worker's process group. 0 or -1. */
int kworker_signal(kworker *w, int sig);

/* Nanoseconds since the worker was started (monotonic). */
uint64_t kworker_age_ns(const kworker *w);

/* Monotonic clock in nanoseconds. */
uint64_t kworker_now_ns(void);

#endif
