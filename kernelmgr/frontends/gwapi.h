/*
 * gwapi.h — the kernelmgr API (docs/API.md) for remote agents, through the
 * gateway: each JSON-RPC request from an HTTP client is checked here and
 * passed to the daemon's own unix socket, so HTTP clients get exactly the
 * API local clients get, from the same code.
 *
 * Every connection to the daemon declares the http tier first
 * (daemon_declare_tier): what an HTTP client may call and send — the
 * methods, each field, the session options under the operator's ceilings —
 * is the daemon's table (kernelmgr/service/dtier.h), refused there with
 * JSON-RPC error -32602 naming the field and the tier, and its replies carry
 * no host paths. The operator's http_allow_unsafe_session_options relaxes
 * the tier as documented (docs/GATEWAY.md).
 */
#ifndef KERNELMGR_GWAPI_H
#define KERNELMGR_GWAPI_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>

/* Checks the shape of one request (borrowed): NULL when it may go to the
 * daemon, else a JSON-RPC error response for it (new). With scope (the
 * request's /s/NAME/ prefix or X-Kernelmgr-Session header; NULL or "" for
 * none), a params.session other than scope is refused (-32602 naming
 * both). Everything else is the daemon's to judge, with its own
 * configuration for the http tier. */
json_t *gwapi_check(const json_t *req, const char *scope);

/* One call: sends req (borrowed, already checked) to the daemon of home and
 * returns the daemon's JSON-RPC response (new); notifications before it are
 * dropped. On a failure to talk to the daemon, a JSON-RPC error response. */
json_t *gwapi_call(const char *home, const json_t *req, size_t max_line);

/* A streaming connection: lines both ways between a WebSocket client and
 * the daemon, on a thread of its own (wake(ud) when lines wait). */
typedef struct gwapi_conn gwapi_conn;

/* new: connected to the daemon of home, every request checked against
 * scope (gwapi_check; copied, NULL or "" for none); NULL with a reason in
 * err. */
gwapi_conn *gwapi_open(const char *home, const char *scope, size_t max_pending,
                       void (*wake)(void *), void *ud, km_err *err);
void gwapi_close(gwapi_conn **c);

/* Takes one client message (text, len bytes): a JSON-RPC request is checked
 * and passed on; a refused or malformed one is answered on the connection.
 * 0, or -1 when the connection has failed (gwapi_failed says why). */
int gwapi_send(gwapi_conn *c, const char *text, size_t len);

/* The next line for the client: 1 with *line new (free()), 0 none. */
int gwapi_pop(gwapi_conn *c, char **line, size_t *len);

/* 1 with why when the connection failed (daemon gone, client too slow). */
int gwapi_failed(gwapi_conn *c, km_err *why);

#endif
