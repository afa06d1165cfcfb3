/*
 * mcp_render.h — a code_exec result as an MCP CallToolResult.
 *
 * content:
 *   1. one text item, compact, for the model: per block its language and
 *      status, stdout, stderr, the last expression's value, the error with
 *      the end of its traceback, the files changed, truncation notes (with
 *      the spill file holding the full output), kernel restarts, the limits
 *      hit (limits_hit: memory, CPU time, the network policy);
 *   2. every image output (image/png, image/jpeg, image/gif, image/webp) as
 *      an image item when its base64 is at most MCPR_IMAGE_MAX bytes, else a
 *      resource_link to the saved file (file:// URI) when the manager saved
 *      one, else a note in the text.
 * structuredContent: {"session": S, "failed": bool, "blocks": [result...]}
 *   where each result is DESIGN.md's JSON of one block, except that image
 *   data in "displays" is replaced by a short string naming the content item
 *   that carries it (clients may show structuredContent to the model as
 *   text, and base64 is no use there).
 * isError: true when a block failed (status other than "ok").
 */
#ifndef KERNELMGR_MCP_RENDER_H
#define KERNELMGR_MCP_RENDER_H

#include <jansson.h>
#include <stddef.h>

#define MCPR_IMAGE_MAX ((size_t)1 << 20)  /* base64 bytes of one inline image */
#define MCPR_TEXT_MAX ((size_t)100 << 10) /* per stream in the text item */

/* new: the CallToolResult for exec_reply (borrowed): {"results": [...],
 * "failed": 0|1} as the manager returns it. workspace (may be NULL) resolves
 * relative image file paths for resource links. */
json_t *mcpr_exec_result(const json_t *exec_reply, const char *session, const char *workspace);

/* new: a CallToolResult with one text item; isError as given. */
json_t *mcpr_text_result(const char *text, int is_error);

/* new: a CallToolResult with a text item (the JSON pretty-printed, or text
 * when not NULL) and structuredContent = obj (stolen). */
json_t *mcpr_json_result(json_t *obj, const char *text, int is_error);

#endif
