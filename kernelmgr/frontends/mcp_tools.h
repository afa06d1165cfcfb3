/*
 * mcp_tools.h — the tools `kernelmgr mcp` offers: their input schemas and
 * descriptions (written for a model to read) and their handlers.
 */
#ifndef KERNELMGR_MCP_TOOLS_H
#define KERNELMGR_MCP_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "kernelmgr/frontends/mcp_int.h"

/* One tool: what tools/list shows of it and the handler tools/call runs.
 * input_schema and annotations are JSON text (parsed by mcpt_list); with
 * session_options, the session options the mcp tier may set (dtier.h) are
 * added to the schema's properties. The handler gets args borrowed (an
 * object) and returns a new CallToolResult. */
typedef struct mcpt_tool {
    const char *name;
    const char *title;
    const char *description;
    const char *input_schema;
    const char *annotations;
    int session_options;
    json_t *(*handler)(mcp_call *call, json_t *args);
} mcpt_tool;

/* The tools, ended by an entry with a NULL name: the one list both
 * tools/list and tools/call read. */
extern const mcpt_tool mcpt_tools[];

/* borrowed: the tool called name, or NULL. */
const mcpt_tool *mcpt_find(const char *name);

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
