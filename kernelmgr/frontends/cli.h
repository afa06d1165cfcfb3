/*
 * cli.h — the kernelmgr command line (commands, options, rendering).
 */
#ifndef KERNELMGR_CLI_H
#define KERNELMGR_CLI_H

/* Runs `kernelmgr ARGS...`; returns the process exit status:
 * 0 ok, 1 a block failed, 2 usage or configuration error, 3 no such session,
 * 4 a kernel could not be started, 5 daemon unreachable, 6 internal error,
 * 130 interrupted twice with Ctrl-C. */
int cli_main(int argc, char **argv);

/* The MCP stdio server (kernelmgr/mcp.c, declared in kernelmgr/mcp.h). Not
 * weak: a weak reference does not pull mcp.o out of libkm.a. */
int mcp_main(int argc, char **argv);

#endif
