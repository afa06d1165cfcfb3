/*
 * mcp_int.h — what the MCP server core (mcp.c) gives the tool handlers
 * (mcp_tools.c and friends). Not a public header.
 *
 * Threading: the core reads stdin on the main thread and runs every
 * tools/call on its own thread, so a long execution neither blocks pings nor
 * the notifications/cancelled that interrupts it. The end of input cancels
 * nothing (mcp.c end_of_input). Every write to stdout goes
 * through mcp_send(), which serialises whole lines under a lock.
 */
#ifndef KERNELMGR_MCP_INT_H
#define KERNELMGR_MCP_INT_H

#include <jansson.h>
#include <stddef.h>

typedef struct mcp_server mcp_server;

/* Options of one `kernelmgr mcp` process. Strings are owned by the server. */
typedef struct mcp_options {
    char *allowlist_path; /* package allowlist (JSON); NULL: the default path */
    /* --allow-unsafe-session-options: tools may ask for network "on" or
     * sandbox "none" (never a host path: the daemon's mcp tier) */
    int allow_unsafe_session_options;
} mcp_options;

/* One running request (a tools/call). Handlers get it borrowed. */
typedef struct mcp_call {
    mcp_server *srv;
    json_t *id;             /* borrowed: the JSON-RPC id */
    json_t *progress_token; /* borrowed: params._meta.progressToken, or NULL */
    int cancelled;          /* set (atomically) by notifications/cancelled */
    double progress;        /* last progress value sent; strictly increasing */
    int modern;             /* the request came in the 2026-07-28 era */
} mcp_call;

/* Writes msg as one line on stdout (steals msg). Thread-safe. */
void mcp_send(mcp_server *srv, json_t *msg);

/* Sends notifications/progress for call when the client asked for progress
 * (a progressToken); otherwise does nothing. progress is raised to keep the
 * sequence strictly increasing, as the protocol requires. message may be NULL. */
void mcp_call_progress(mcp_call *call, double progress, const char *message);

/* 1 once the client cancelled this call. */
int mcp_call_cancelled(mcp_call *call);

/* Says that the request of the tools/call running on this thread has
 * reached the daemon, which from then on finishes it whatever becomes of
 * this process: at end of input the server waits for no more than that
 * when nobody reads its answers (mcp.c). Called on the call's own thread;
 * elsewhere it does nothing. */
void mcp_call_delivered(void);

/* borrowed: the options this server runs with. */
const mcp_options *mcp_server_options(mcp_server *srv);

/* printf-style line on stderr, prefixed "kernelmgr mcp: ". Never on stdout. */
void mcp_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
