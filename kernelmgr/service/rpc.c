/*
 * rpc.c — JSON-RPC 2.0 messages over newline-delimited streams (rpc.h).
 *
 * What we follow (jsonrpc.org/specification): a request has "jsonrpc":"2.0",
 * "method" and an "id"; without an id it is a notification, which is never
 * answered, not even with an error; a response carries the id of its
 * request and either "result" or "error" {"code","message","data"?}; an
 * error that cannot be tied to an id is answered with id null. Params are
 * by name only (an object): every method of ours has named fields.
 */
#include "kernelmgr/service/rpc.h"
#include "kernelmgr/engine/km.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rpc_msg_clear(rpc_msg *m)
{
    json_decref(m->root);
    memset(m, 0, sizeof *m);
}

static int bad(rpc_msg *m, int code, km_err *why, const char *msg)
{
    km_err_set(why, KM_EUSAGE, "%s", msg);
    (void)m;
    return code;
}

int rpc_parse(const char *line, size_t len, rpc_msg *m, km_err *why)
{
    memset(m, 0, sizeof *m);
    json_error_t jerr;
    m->root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &jerr);
    if (!m->root) {
        km_err_set(why, KM_EUSAGE, "Parse error: %s (line %d, column %d)", jerr.text, jerr.line,
                   jerr.column);
        return RPC_PARSE_ERROR;
    }
    if (!json_is_object(m->root))
        return bad(m, RPC_INVALID_REQUEST, why,
                   json_is_array(m->root) ? "Invalid Request: batches are not supported"
                                          : "Invalid Request: a message must be a JSON object");
    json_t *id = json_object_get(m->root, "id");
    json_t *method = json_object_get(m->root, "method");
    json_t *params = json_object_get(m->root, "params");
    /* ids are strings or integers, never null; a bad id is answered with
     * id null since it cannot be echoed */
    if (id && !json_is_string(id) && !json_is_integer(id))
        return bad(m, RPC_INVALID_REQUEST, why,
                   "Invalid Request: id must be a string or an integer");
    m->id = id;
    const char *ver = json_string_value(json_object_get(m->root, "jsonrpc"));
    if (!ver || strcmp(ver, "2.0") != 0)
        return bad(m, RPC_INVALID_REQUEST, why, "Invalid Request: jsonrpc must be \"2.0\"");
    if (!method) {
        if (id && (json_object_get(m->root, "result") || json_object_get(m->root, "error")))
            return RPC_RESPONSE;
        return bad(m, RPC_INVALID_REQUEST, why, "Invalid Request: method is missing");
    }
    if (!json_is_string(method))
        return bad(m, RPC_INVALID_REQUEST, why, "Invalid Request: method must be a string");
    if (params && !json_is_object(params)) {
        m->silent = !id;
        return bad(m, RPC_INVALID_PARAMS, why, "Invalid params: params must be an object");
    }
    if (!params) {
        json_object_set_new(m->root, "params", json_object());
        params = json_object_get(m->root, "params");
    }
    m->method = json_string_value(method);
    m->params = params;
    return id ? RPC_REQUEST : RPC_NOTIFICATION;
}

json_t *rpc_result(const json_t *id, json_t *result)
{
    if (!result)
        result = json_object();
    return json_pack("{s:s s:O s:o}", "jsonrpc", "2.0", "id", id ? (json_t *)id : json_null(),
                     "result", result);
}

json_t *rpc_error(const json_t *id, int code, const char *message, json_t *data)
{
    json_t *e = json_pack("{s:i s:s}", "code", code, "message", message ? message : "error");
    if (e && data)
        json_object_set_new(e, "data", data);
    else
        json_decref(data);
    return json_pack("{s:s s:O s:o}", "jsonrpc", "2.0", "id", id ? (json_t *)id : json_null(),
                     "error", e);
}

json_t *rpc_error_km(const json_t *id, int km_code, const char *message)
{
    return rpc_error(id, rpc_code_from_km(km_code), message,
                     json_pack("{s:i}", "km_code", km_code));
}

json_t *rpc_error_params(const json_t *id, const char *message)
{
    return rpc_error(id, RPC_INVALID_PARAMS, message, json_pack("{s:i}", "km_code", KM_EUSAGE));
}

json_t *rpc_notification(const char *method, json_t *params)
{
    if (!params)
        params = json_object();
    return json_pack("{s:s s:s s:o}", "jsonrpc", "2.0", "method", method, "params", params);
}

json_t *rpc_request(const json_t *id, const char *method, json_t *params)
{
    if (!params)
        params = json_object();
    return json_pack("{s:s s:O s:s s:o}", "jsonrpc", "2.0", "id", (json_t *)id, "method", method,
                     "params", params);
}

char *rpc_line(const json_t *msg, size_t *len)
{
    char *s = json_dumps(msg, JSON_COMPACT);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = 0;
    *len = n + 1;
    return line;
}

int rpc_code_from_km(int km_code)
{
    return RPC_SERVER_ERROR - km_code;
}

int rpc_code_to_km(int rpc_code)
{
    if (rpc_code <= RPC_SERVER_ERROR && rpc_code > RPC_SERVER_ERROR - 100)
        return RPC_SERVER_ERROR - rpc_code;
    if (rpc_code == RPC_PARSE_ERROR || rpc_code == RPC_INVALID_REQUEST ||
        rpc_code == RPC_METHOD_NOT_FOUND || rpc_code == RPC_INVALID_PARAMS)
        return KM_EUSAGE;
    return KM_EINTERNAL;
}

/* ---------------------------------------------------------------- params */

#define RPC_MAX_FIELDS 40

const char *rpc_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

static int type_ok(char t, const json_t *v)
{
    switch (t) {
    case 's':
        return json_is_string(v);
    case 'b':
        return json_is_boolean(v);
    case 'i':
    case 'I':
        return json_is_integer(v);
    case 'F':
        return json_is_number(v);
    default:
        return 1;
    }
}

static const char *type_want(char t)
{
    switch (t) {
    case 's':
        return "a string";
    case 'b':
        return "a boolean";
    case 'i':
    case 'I':
        return "an integer";
    case 'F':
        return "a number";
    default:
        return "a value";
    }
}

int rpc_unpack(const json_t *params, km_err *why, const char *fmt, ...)
{
    va_list ap, walk;
    va_start(ap, fmt);
    va_copy(walk, ap);
    json_error_t jerr;
    int rc = json_vunpack_ex((json_t *)params, &jerr, JSON_STRICT, fmt, ap);
    va_end(ap);
    if (rc == 0) {
        va_end(walk);
        return 0;
    }
    /* The reason, naming the field: jansson's own text says what is wrong
     * but not where ("Expected string, got integer"). The format is walked
     * with the same arguments: a key is one const char *, a value one
     * pointer. */
    const char *keys[RPC_MAX_FIELDS];
    char types[RPC_MAX_FIELDS];
    int required[RPC_MAX_FIELDS];
    int n = 0;
    for (const char *p = fmt; *p && n < RPC_MAX_FIELDS; p++) {
        if (*p != 's')
            continue;
        keys[n] = va_arg(walk, const char *);
        p++;
        required[n] = *p != '?';
        if (*p == '?' || *p == ':')
            p++;
        types[n] = *p;
        (void)va_arg(walk, void *);
        n++;
        if (!*p)
            break;
    }
    va_end(walk);
    if (!json_is_object(params)) {
        km_err_set(why, KM_EUSAGE, "params must be an object");
        return -1;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)params, k, v)
    {
        int known = -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(keys[i], k))
                known = i;
        if (known < 0) {
            char list[600] = "";
            size_t used = 0;
            for (int i = 0; i < n && used < sizeof list; i++) {
                int w = snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", keys[i]);
                if (w < 0)
                    break;
                used += (size_t)w;
            }
            km_err_set(why, KM_EUSAGE, "unknown field \"%.80s\" (expected: %s)", k,
                       n ? list : "no fields");
            return -1;
        }
        if (!type_ok(types[known], v)) {
            km_err_set(why, KM_EUSAGE, "field \"%s\": expected %s, got %s", k,
                       type_want(types[known]), rpc_type_name(v));
            return -1;
        }
    }
    for (int i = 0; i < n; i++)
        if (required[i] && !json_object_get(params, keys[i])) {
            km_err_set(why, KM_EUSAGE, "missing field \"%s\"", keys[i]);
            return -1;
        }
    km_err_set(why, KM_EUSAGE, "invalid params: %s", jerr.text);
    return -1;
}
