/*
 * rpc.h — JSON-RPC 2.0 messages, one per line: the framing and validation
 * shared by the daemon's API (dmethods.c, docs/API.md) and the MCP server
 * (mcp.c).
 *
 * Wire: each message is one compact JSON object followed by '\n' (jansson's
 * compact output escapes every newline inside strings, so one dump is one
 * line). Batches are not supported. Ids are strings or integers (MCP's rule,
 * and ours: never null). A message with "method" and "id" is a request, with
 * "method" and no "id" a notification (never answered), with "result" or
 * "error" and no "method" a response.
 *
 * Errors: the standard codes (-32700 parse error, -32600 invalid request,
 * -32601 method not found, -32602 invalid params, -32603 internal error)
 * and, for failures of the operation itself, the server range: a kernelmgr
 * error code KM_E* N (kmerr.h) is -32000 - N (e.g. -32003 no such session),
 * with data {"km_code": N}. rpc_code_to_km() maps back (the CLI's exit
 * status).
 */
#ifndef KERNELMGR_RPC_H
#define KERNELMGR_RPC_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>

enum {
    RPC_PARSE_ERROR = -32700,
    RPC_INVALID_REQUEST = -32600,
    RPC_METHOD_NOT_FOUND = -32601,
    RPC_INVALID_PARAMS = -32602,
    RPC_INTERNAL_ERROR = -32603,
    RPC_SERVER_ERROR = -32000, /* - KM_E* code */
};

/* What a parsed line is. */
typedef enum rpc_kind {
    RPC_REQUEST = 1,
    RPC_NOTIFICATION,
    RPC_RESPONSE,
} rpc_kind;

typedef struct rpc_msg {
    json_t *root;       /* owned: the whole message (NULL when unparsable) */
    json_t *id;         /* borrowed: the id, NULL for a notification or when unusable */
    const char *method; /* borrowed: requests and notifications */
    json_t *params;     /* borrowed: always an object for requests and notifications
                           (an absent params is set to {}) */
    int silent;         /* an invalid notification: no error is sent for it */
} rpc_msg;

/* Parses and checks one line (without its '\n'). Returns an rpc_kind, or a
 * negative JSON-RPC error code with the reason in why ("Parse error: ...",
 * "Invalid Request: ...") to answer to m->id (NULL: id null), unless
 * m->silent (a notification: never answered). Always free m with
 * rpc_msg_clear. */
int rpc_parse(const char *line, size_t len, rpc_msg *m, km_err *why);
void rpc_msg_clear(rpc_msg *m);

/* new: {"jsonrpc":"2.0","id":id,"result":result}; steals result (NULL = {}). */
json_t *rpc_result(const json_t *id, json_t *result);
/* new: {"jsonrpc":"2.0","id":id|null,"error":{"code","message","data"?}};
 * steals data (may be NULL). */
json_t *rpc_error(const json_t *id, int code, const char *message, json_t *data);
/* new: an error of the operation: code -32000 - km_code, data {"km_code"}.
 * With rpc_error_params and rpc_code_from_km/rpc_code_to_km, the one place
 * a KM_E* code (kmerr.h) becomes a JSON-RPC code and back. */
json_t *rpc_error_km(const json_t *id, int km_code, const char *message);
/* new: invalid params of a request: -32602, data {"km_code": KM_EUSAGE}. */
json_t *rpc_error_params(const json_t *id, const char *message);
/* new: {"jsonrpc":"2.0","method":method,"params":params}; steals params. */
json_t *rpc_notification(const char *method, json_t *params);
/* new: {"jsonrpc":"2.0","id":id,"method":method,"params":params}; steals params. */
json_t *rpc_request(const json_t *id, const char *method, json_t *params);

/* malloc'd: msg as one compact line ending in '\n' (*len without the NUL),
 * or NULL (out of memory). msg is borrowed. */
char *rpc_line(const json_t *msg, size_t *len);

/* The JSON-RPC error code of a KM_E* code, and back: a server-range code
 * gives its KM_E* code; -32700/-32600/-32601/-32602 give KM_EUSAGE (2);
 * anything else KM_EINTERNAL (6). */
int rpc_code_from_km(int km_code);
int rpc_code_to_km(int rpc_code);

/* Validates and unpacks params (an object) in one pass: json_unpack_ex with
 * JSON_STRICT and fmt, which must be "{" then pairs "s:X" (required) or
 * "s?X" (optional), X one of s b i I F o, then "}". An unknown field, a
 * missing one or a wrong type is refused with a reason naming the field:
 *   unknown field "sesion" (expected: session, keep)
 *   missing field "session"
 *   field "keep": expected a boolean, got an integer
 * Returns 0, or -1 with the reason in why. */
int rpc_unpack(const json_t *params, km_err *why, const char *fmt, ...);

/* The JSON type of v as error messages name it ("an object", "a string",
 * "a number", ..., "null"); static. */
const char *rpc_type_name(const json_t *v);

#endif
