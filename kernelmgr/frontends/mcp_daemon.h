/*
 * mcp_daemon.h — the MCP server's link to the kernelmgr daemon.
 *
 * Every tool is one request of the daemon's API (docs/API.md), made with
 * the daemon's own client (daemon_call); the daemon is started when none
 * runs (as `kernelmgr exec` does), so sessions, workspaces and packages
 * live there and outlive this MCP process. Every connection is at the
 * daemon's mcp tier. This file only adds what an MCP
 * call needs around a request: live events, a heartbeat for progress
 * notifications, and cancellation.
 */
#ifndef KERNELMGR_MCP_DAEMON_H
#define KERNELMGR_MCP_DAEMON_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>

#include "kernelmgr/frontends/mcp_int.h"

/* Fixes what the operator gave this server (o borrowed: its allowlist, made
 * absolute, and --allow-unsafe-session-options) for every connection to
 * the daemon: each declares the mcp tier (docs/API.md "Tiers") with them,
 * so nothing a model sends can name a host path. Call once at start. */
void mcpd_configure(const mcp_options *o);

/* A live event of a running request (borrowed), e.g. streamed output. */
typedef void (*mcpd_event_fn)(void *ud, const json_t *event);
/* Called about five times a second while a request runs. Returning 1 asks
 * for the running execution to be interrupted (sent once). */
typedef int (*mcpd_tick_fn)(void *ud, double elapsed_s);

/* new: the result of API method `method` with params (stolen), or NULL with
 * a reason in err when the daemon cannot be reached or started, or answered
 * with an error (then err holds the daemon's message). ev and tick may be
 * NULL; with ev the request streams (exec). When tick asks for an
 * interrupt, an interrupt of params.session goes to the daemon on a second
 * connection, and the wait goes on for the response, which then reports the
 * interrupted execution. */
json_t *mcpd_request(const char *method, json_t *params, mcpd_event_fn ev, mcpd_tick_fn tick,
                     void *ud, km_err *err);

#endif
