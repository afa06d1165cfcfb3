/*
 * mcp.h — `kernelmgr mcp`: a Model Context Protocol server over stdio.
 *
 * The server is a client of the kernelmgr daemon: it starts the daemon when
 * none runs and translates MCP tool calls into daemon requests, so sessions
 * live in the daemon and survive across MCP connections.
 *
 * Wire: JSON-RPC 2.0, one UTF-8 JSON message per line on stdin/stdout; logs go
 * to stderr only. Both eras of the protocol are spoken (see mcp.c):
 *   legacy  — the `initialize` handshake, versions 2024-11-05, 2025-03-26,
 *             2025-06-18, 2025-11-25;
 *   modern  — the stateless revision 2026-07-28 (`server/discover`, the
 *             protocol version in every request's `_meta`, `resultType`).
 *
 * Internal pieces: mcp_tools.c (tool schemas and handlers: each tool is one
 * request of the daemon's API, docs/API.md), mcp_render.c (code_exec result
 * -> MCP content), mcp_daemon.c (daemon bridge), rpc.c (JSON-RPC framing,
 * shared with the daemon). Workspace files and package installs are the
 * daemon's (files.*, packages.install), done under the session's lock.
 */
#ifndef KERNELMGR_MCP_H
#define KERNELMGR_MCP_H

/* Entry point of `kernelmgr mcp [--allowlist FILE]`; argv[0] is "mcp".
 * Returns the process exit status: 0 at the end of stdin, 2 on usage errors. */
int mcp_main(int argc, char **argv);

#endif
