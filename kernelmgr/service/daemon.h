/*
 * daemon.h — `kernelmgr serve`: the kernelmgr API behind a unix socket, and
 * the client side the CLI and the MCP server use.
 *
 * Socket: $KERNELMGR_HOME/kernelmgr.sock (mode 0600, in a 0700 directory;
 * only the daemon's uid may connect). Protocol: JSON-RPC 2.0, one message
 * per line each way (rpc.h); the reference of every method, its params,
 * results, events and error codes is docs/API.md. An exec with
 * "stream": true gets its events as notifications ("method": "event",
 * params {"request_id", "event", ...}) before its response; with
 * "raw_text": true too, a stream event carries "text_bytes": N instead of
 * "text" and exactly N bytes of UTF-8 text follow its '\n' (no escaping; a
 * long output costs neither side a JSON encode and parse of the text).
 * Requests on one connection are answered in order; open several
 * connections for concurrency (executions in different sessions run in
 * parallel, one session's executions are serialised).
 *
 * Server: one epoll event loop (accept, non-blocking reads and buffered
 * writes; an idle connection costs no thread) and a bounded pool of worker
 * threads (config daemon_workers, daemon_queue) that run requests; output
 * to a client is bounded per connection (client_buffer) and a client that
 * reads nothing for client_timeout seconds is dropped while its request
 * runs on. Details at the top of dloop.c.
 */
#ifndef KERNELMGR_DAEMON_H
#define KERNELMGR_DAEMON_H

#include "kernelmgr/engine/km.h"

#include <signal.h>

/* The API's version (ping and initialize say it; initialize refuses
 * another). Raised when a method or field changes incompatibly. */
#define DAEMON_API_VERSION 1
#define DAEMON_VERSION "0.1.0"
/* The method of the notifications an exec streams. */
#define DAEMON_EVENT_METHOD "event"

/* Writes home/kernelmgr.sock into buf. 0, or -1 when it would not fit in a
 * sockaddr_un (err says so). */
int daemon_socket_path(const char *home, char *buf, size_t size, km_err *err);

/* What daemon_serve returns when another daemon already serves the home:
 * nothing was done; the caller says so (or asks that daemon, e.g. to serve
 * HTTP with http.start). */
#define DAEMON_SERVE_ALREADY (-1)

/* Runs the daemon in the foreground until SIGTERM/SIGINT or a shutdown
 * request. Returns 0 after serving, DAEMON_SERVE_ALREADY, or a KM_E* code
 * with err (the HTTP gateway of cfg->http could not start, for one). */
int daemon_serve(const char *home, const kmcfg *cfg, km_err *err);

/* Connects to the daemon of home; when none answers and autostart is set,
 * starts one (`kernelmgr serve`, detached, log in home/daemon.log; argv_extra
 * NULL-terminated options for it, e.g. --config PATH) and waits for it.
 * Returns the fd or -1 with err. */
int daemon_connect(const char *home, int autostart, char *const argv_extra[], km_err *err);

/* Writes o (borrowed) to fd as one line of compact JSON (the socket's
 * framing, both ways). 0, or -1 with errno. */
int daemon_send_json(int fd, const json_t *o);

/* What a caller of daemon_call hears while its request runs. Any member
 * may be NULL. */
typedef struct daemon_callbacks {
    /* an event notification's params (borrowed): {"request_id","event",...};
     * a "raw_text" stream event has its "text" filled in from its bytes */
    void (*on_event)(void *ud, const json_t *params);
    /* about five times a second while waiting; non-zero asks to cancel */
    int (*on_tick)(void *ud);
    /* called once, the first time on_tick asks to cancel (e.g. to send an
     * interrupt on another connection); the wait goes on for the response */
    void (*on_cancel)(void *ud);
    void *ud;
} daemon_callbacks;

/* Sends request `method` with params (stolen; NULL = {}) and waits for its
 * response. 0 with *result (new), or a KM_E* code with err: the daemon's
 * error (its message; the code from the error's data.km_code, else from
 * rpc_code_to_km) or KM_EDAEMON when the daemon could not be talked to. */
int daemon_call(int fd, const char *method, json_t *params, const daemon_callbacks *cb,
                json_t **result, km_err *err);

/* Lowers the tier of connection fd to tier ("mcp" or "http"; dtier.h,
 * docs/API.md "Tiers") with an initialize request; what the operator gave
 * the lowering party goes with it, fixed for the connection before its
 * tier drops: allowlist (an absolute path or NULL: the daemon's default)
 * for packages.install, and unsafe (the operator's opt-in to the values
 * that relax the sandbox). 0, or a KM_E* code with err. */
int daemon_declare_tier(int fd, const char *tier, const char *allowlist, int unsafe, km_err *err);

/* One request on a fresh connection (daemon_connect with autostart; argv_extra
 * as there); same results as daemon_call. */
int daemon_request(const char *home, char *const argv_extra[], const char *method, json_t *params,
                   const daemon_callbacks *cb, json_t **result, km_err *err);

#endif
