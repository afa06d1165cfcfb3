/*
 * mcpinstall.h — `kernelmgr mcp install`: the MCP client configuration that
 * runs this kernelmgr (its absolute path) with a pinned interpreter.
 *
 * An MCP client starts `kernelmgr mcp` with its own environment (often no
 * PATH of the user's shell), so without a pin the agent's Python kernel can
 * be another interpreter than the one the user tried. The entry names the
 * binary by its real path and sets KERNELMGR_PYTHON (and KERNELMGR_HOME when
 * set here) in the entry's "env".
 *
 * The client files and their shapes:
 *   claude   $XDG_CONFIG_HOME/Claude/claude_desktop_config.json   {"mcpServers": {NAME: ENTRY}}
 *   cursor   ~/.cursor/mcp.json                                   {"mcpServers": {NAME: ENTRY}}
 *   vscode   ./.vscode/mcp.json (the workspace)                   {"servers": {NAME: ENTRY
 *                                                                  + "type": "stdio"}}
 *   generic  printed only (or --file FILE)                        {"mcpServers": {NAME: ENTRY}}
 * ENTRY = {"command": "/abs/kernelmgr", "args": ["mcp", ...], "env": {...}}.
 * An existing file is merged: only NAME under the servers key is replaced,
 * every other key is kept. A file that is not a JSON object (or whose
 * servers key is not an object) is refused and left untouched. The file is
 * replaced atomically (a temporary file renamed over it), keeping its mode;
 * a new one is created 0600 (client files can hold other servers' secrets).
 */
#ifndef KERNELMGR_MCPINSTALL_H
#define KERNELMGR_MCPINSTALL_H

/* argv[0] is "install". Exit status: 0 done, 2 usage or a refused file,
 * 6 the file could not be written. Messages on stderr, --print on stdout. */
int mcpinst_main(int argc, char **argv);

#endif
