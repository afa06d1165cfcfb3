/*
 * gateway.h — kernelmgr as a Jupyter kernel gateway: the Jupyter Server
 * kernels REST API and the kernel WebSocket over HTTP(S), served by the
 * daemon on libwebsockets, so JupyterLab, Notebook and VS Code (through
 * `--gateway-url`) and jupyter_server's GatewayClient list an agent's
 * sessions, open their kernels and run cells into the same live state.
 * Its files: gw_int.h.
 *
 * Routing by session (docs/MANY_MACHINES.md): every route below also
 * answers under /s/NAME/, and the header X-Kernelmgr-Session: NAME does the
 * same: the request is scoped to session NAME (its kernels only, kernels
 * started belong to it, a JSON-RPC request naming another session is
 * refused). GET /healthz and /readyz (503 while draining) need no token and
 * are answered before the Host check.
 *
 * Routes (all need the token: "Authorization: token T" or "?token=T"):
 *   GET    /api                         {"version", "kernelmgr"}
 *   GET    /api/kernelspecs             {"default", "kernelspecs": {...}}
 *   GET    /api/kernelspecs/NAME        one spec
 *   GET    /api/kernels                 every live kernel of every session
 *   POST   /api/kernels                 {"name", "kernelmgr"?: {"session", "env"}}
 *                                       -> 201 model; a new session "jupyter-XXXX"
 *                                       (or the named one) with the usual sandbox;
 *                                       "kernelmgr-LANG--SESSION" attaches to an
 *                                       existing session's kernel; the request's
 *                                       "env" (a frontend's own environment) is
 *                                       ignored
 *   GET    /api/kernels/ID              model
 *   DELETE /api/kernels/ID              closes a session the gateway created;
 *                                       409 for an agent's session
 *   POST   /api/kernels/ID/interrupt    204
 *   POST   /api/kernels/ID/restart      200 model
 *   POST   /api/kernelmgr               one JSON-RPC 2.0 request of the kernelmgr API
 *                                       (docs/API.md) -> its response (gwapi.h)
 *   GET    /api/kernelmgr/ws            WebSocket: JSON-RPC requests, responses and
 *                                       streamed exec events, one per text message
 *   GET    /api/kernels/ID/channels     WebSocket (JSON form, or the
 *                                       v1.kernel.websocket.jupyter.org
 *                                       subprotocol): relayed to the kernel
 * A kernel's ID is a UUID derived from (session, language) — with a
 * node_id, "NODE-" and 14 bytes of that hash, so a balancer routes a kernel
 * URL by its first field —: stable across kernel restarts and daemon
 * restarts. Its model carries
 * "kernelmgr": {"session", "language", "pid"}.
 *
 * Security: 127.0.0.1 unless told otherwise; a non-loopback address needs
 * TLS or insecure=1; the token is compared in constant time; request bodies,
 * WebSocket messages, connections and per-connection message rates are
 * bounded; WebSocket upgrades from another Origin than the Host (or the
 * configured origin) are refused; a slow client is disconnected, never
 * waited for. The HMAC key stays on the host side.
 *
 * Bounds before the token (docs/SECURITY.md): every connection is counted
 * from accept to close (gwpeers.h) and refused at accept over
 * http_max_unauth_per_peer / http_max_unauth unauthenticated connections or
 * over the connection budget (half of RLIMIT_NOFILE, less what WebSockets
 * may take; the rest is the daemon's); headers must arrive within
 * http_header_timeout; an unauthenticated connection gets one answer and is
 * closed. Every request's Host must name the gateway (listen address,
 * localhost on loopback, http_host): 403 otherwise. These four come from the
 * manager's configuration (config.h), not from gateway_opts. Session names
 * from clients are refused when invalid, never cut; REST answers and close
 * reasons name the home as $KERNELMGR_HOME.
 */
#ifndef KERNELMGR_GATEWAY_H
#define KERNELMGR_GATEWAY_H

#include "kernelmgr/engine/km.h"

#include <stddef.h>

typedef struct gateway_opts {
    const char *listen;       /* "[ADDR:]PORT"; ADDR defaults to 127.0.0.1, PORT 0 = any */
    const char *token;        /* the token (config http_token); NULL/"" = below */
    const char *token_file;   /* a file holding it (config http_token_file); NULL/"" = none.
                                 Precedence: $KERNELMGR_HTTP_TOKEN, token, token_file, else
                                 HOME/http-token (generated when missing, 0600) */
    const char *tls_cert;     /* PEM certificate file, with tls_key; NULL = plain HTTP */
    const char *tls_key;      /* PEM private key file */
    int insecure;             /* allow a non-loopback address without TLS */
    const char *origin;       /* another Origin allowed for WebSocket upgrades; NULL */
    size_t max_body;          /* request body bytes (0 = 1 MiB) */
    size_t max_message;       /* WebSocket message bytes from a client (0 = 64 MiB) */
    size_t max_pending;       /* bytes waiting for one client before it is cut (0 = 64 MiB) */
    unsigned max_connections; /* WebSocket connections at once (0 = 64) */
    double rate;              /* messages + requests per second per connection (0 = 500;
                                 bursts of twice that) */
} gateway_opts;

typedef struct gateway gateway;

/* new: serves m (borrowed; must outlive the gateway) in a thread of its own.
 * Writes HOME/http.json ({"url","port","pid"}, 0600) once listening. NULL
 * with a reason in err (address in use, refused address, TLS files, ...). */
gateway *gateway_start(km_manager *m, const gateway_opts *o, km_err *err);

/* Stops serving: every connection is closed, every relay ended. NULL-safe. */
void gateway_stop(gateway **g);

/* borrowed: where the token came from ("$KERNELMGR_HTTP_TOKEN", "the
 * configuration's http_token", or the file's path), for the log. */
const char *gateway_token_source(const gateway *g);

/* borrowed: "http://127.0.0.1:8888/" (https with TLS); the bound port. */
const char *gateway_url(const gateway *g);
int gateway_port(const gateway *g);

/* Checks a listen address without binding: 0, or -1 with a reason
 * (gwlisten.c). */
int gateway_listen_valid(const char *listen, int tls, int insecure, km_err *err);

/* Sets err (KM_EUSAGE) to the formatted reason and returns -1 (gwlisten.c). */
int gw_err(km_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "[ADDR:]PORT" into addr (alen bytes; default 127.0.0.1, IPv4 only) and
 * *port: 0, or -1 with a reason (gwlisten.c). */
int gw_parse_listen(const char *listen, char *addr, size_t alen, int *port, km_err *err);

/* Two binaries: libwebsockets and the OpenSSL it loads would cost every
 * `kernelmgr exec` ~1.5 ms of dynamic loading, so the `kernelmgr` binary is
 * built without gateway.c (gateway_none.c stands in) and `serve` execs
 * kernelmgr-gateway beside it: the same program with the gateway linked, so
 * a daemon can serve HTTP later too (daemon_http.h). 1 in the binary that
 * has it. */
int gateway_built_in(void);

#endif
