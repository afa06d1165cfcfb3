/*
 * mcp_tools.h — the tools `kernelmgr mcp` offers: their input schemas and
 * descriptions (written for a model to read) and their handlers.
 */
#ifndef KERNELMGR_MCP_TOOLS_H
#define KERNELMGR_MCP_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "kernelmgr/frontends/mcp_int.h"

/* new: the array of Tool objects for tools/list. */
json_t *mcpt_list(void);

/* new: a CallToolResult for tools/call of tool `name` with `args` (borrowed,
 * an object). Failures of the tool itself (bad arguments, a failed block, a
 * file outside the workspace) are results with isError true, so the model
 * can read them and correct itself. Returns NULL only for protocol errors
 * (unknown tool): *rpc_code gets the JSON-RPC code, msg the reason. */
json_t *mcpt_call(mcp_call *call, const char *name, json_t *args, int *rpc_code, char *msg,
                  size_t msglen);

#endif
