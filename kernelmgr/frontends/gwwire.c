/*
 * gwwire.c — kernel WebSocket message forms (see gwwire.h).
 */
#include "kernelmgr/frontends/gwwire.h"
#include "common/cm_utf8.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((format(printf, 2, 3))) static int fail(km_err *err, const char *fmt, ...)
{
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    km_err_set(err, KM_EUSAGE, "%s", msg);
    return -1;
}

/* The channels a client may send on. */
static int channel_of(const char *name, size_t len, jp_channel *ch)
{
    static const jp_channel allowed[] = {JP_SHELL, JP_CONTROL, JP_STDIN};
    for (size_t i = 0; i < sizeof allowed / sizeof allowed[0]; i++) {
        const char *n = jp_channel_name(allowed[i]);
        if (strlen(n) == len && !memcmp(n, name, len)) {
            *ch = allowed[i];
            return 0;
        }
    }
    return -1;
}

/* Parses len bytes of JSON text that must be an object (new), or NULL. */
static json_t *parse_object(const void *data, size_t len, const char *what, km_err *err)
{
    if (!cm_utf8_valid(data, len)) {
        fail(err, "%s is not valid UTF-8", what);
        return NULL;
    }
    json_error_t je;
    json_t *v = json_loadb(data, len, JSON_ALLOW_NUL, &je);
    if (!v) {
        fail(err, "%s is not JSON: %s", what, je.text);
        return NULL;
    }
    if (!json_is_object(v)) {
        json_decref(v);
        fail(err, "%s is not a JSON object", what);
        return NULL;
    }
    return v;
}

/* Takes the four parts (each stolen, NULL = {}) into a new jmsg after the
 * checks every form shares. */
static jmsg *assemble(json_t *header, json_t *parent, json_t *metadata, json_t *content,
                      km_err *err)
{
    jmsg *m = NULL;
    const char *bad = !json_is_object(header)                                ? "header"
                      : parent && !json_is_object(parent)                    ? "parent_header"
                      : metadata && !json_is_object(metadata)                ? "metadata"
                      : content && !json_is_object(content)                  ? "content"
                      : !json_is_string(json_object_get(header, "msg_id"))   ? "header.msg_id"
                      : !json_is_string(json_object_get(header, "msg_type")) ? "header.msg_type"
                                                                             : NULL;
    if (bad) {
        fail(err, "%s is missing or not %s", bad, strchr(bad, '.') ? "a string" : "an object");
        goto out;
    }
    m = calloc(1, sizeof *m);
    if (!m) {
        fail(err, "out of memory");
        goto out;
    }
    m->header = header;
    m->parent_header = parent ? parent : json_object();
    m->metadata = metadata ? metadata : json_object();
    m->content = content ? content : json_object();
    if (!m->parent_header || !m->metadata || !m->content) {
        jmsg_destroy(&m);
        fail(err, "out of memory");
    }
    return m;
out:
    json_decref(header);
    json_decref(parent);
    json_decref(metadata);
    json_decref(content);
    return NULL;
}

static uint32_t get_u32be(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t get_u64le(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_u32be(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put_u64le(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/* Checks n offsets (already read) against len: ascending, within the data,
 * the first at hdr (the end of the offset table). */
static int offsets_ok(const uint64_t *off, size_t n, uint64_t hdr, size_t len)
{
    if (n == 0 || off[0] != hdr)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (off[i] > len || (i && off[i] < off[i - 1]))
            return 0;
    return 1;
}

static int add_buffers(jmsg *m, const unsigned char *data, const uint64_t *off, size_t from,
                       size_t to, size_t len, km_err *err)
{
    for (size_t i = from; i < to; i++) {
        uint64_t end = i + 1 < to ? off[i + 1] : len;
        if (jmsg_add_buffer(m, data + off[i], (size_t)(end - off[i])))
            return fail(err, "out of memory");
    }
    return 0;
}

#define GW_MAX_PARTS 1024u

static int decode_json_object(json_t *o, jp_channel *ch, jmsg **out, km_err *err)
{
    json_t *c = json_object_get(o, "channel");
    if (c && !json_is_null(c)) {
        if (!json_is_string(c))
            return fail(err, "channel is not a string");
        if (channel_of(json_string_value(c), json_string_length(c), ch))
            return fail(err,
                        "channel \"%s\" is not one a client may send on "
                        "(shell, control, stdin)",
                        json_string_value(c));
    } else {
        *ch = JP_SHELL;
    }
    json_t *b = json_object_get(o, "buffers");
    if (b && !(json_is_array(b) && json_array_size(b) == 0))
        return fail(err, "buffers must be sent in a binary frame");
    *out = assemble(json_incref(json_object_get(o, "header")),
                    json_incref(json_object_get(o, "parent_header")),
                    json_incref(json_object_get(o, "metadata")),
                    json_incref(json_object_get(o, "content")), err);
    return *out ? 0 : -1;
}

static int decode_legacy_binary(const unsigned char *d, size_t len, jp_channel *ch, jmsg **out,
                                km_err *err)
{
    if (len < 8)
        return fail(err, "binary message of %zu bytes is too short", len);
    uint32_t n = get_u32be(d);
    if (n < 1 || n > GW_MAX_PARTS || (uint64_t)4 * (n + 1) > len)
        return fail(err, "binary message: invalid part count %u", n);
    uint64_t off[GW_MAX_PARTS];
    for (uint32_t i = 0; i < n; i++)
        off[i] = get_u32be(d + 4 * (i + 1));
    if (!offsets_ok(off, n, (uint64_t)4 * (n + 1), len))
        return fail(err, "binary message: invalid offsets");
    size_t jend = n > 1 ? (size_t)off[1] : len;
    json_t *o = parse_object(d + off[0], jend - (size_t)off[0], "the message", err);
    if (!o)
        return -1;
    json_object_del(o, "buffers");
    int rc = decode_json_object(o, ch, out, err);
    json_decref(o);
    if (rc == 0 && add_buffers(*out, d, off, 1, n, len, err)) {
        jmsg_destroy(out);
        return -1;
    }
    return rc;
}

static int decode_v1(const unsigned char *d, size_t len, jp_channel *ch, jmsg **out, km_err *err)
{
    if (len < 8)
        return fail(err, "v1 message of %zu bytes is too short", len);
    uint64_t n = get_u64le(d);
    /* channel start, channel end = header start, header, parent, metadata,
     * content ends: at least 6 offsets */
    if (n < 6 || n > GW_MAX_PARTS || 8 * (n + 1) > len)
        return fail(err, "v1 message: invalid offset count %llu", (unsigned long long)n);
    uint64_t off[GW_MAX_PARTS];
    for (uint64_t i = 0; i < n; i++)
        off[i] = get_u64le(d + 8 * (i + 1));
    if (!offsets_ok(off, (size_t)n, 8 * (n + 1), len) || off[n - 1] != len)
        return fail(err, "v1 message: invalid offsets");
    if (channel_of((const char *)d + off[0], (size_t)(off[1] - off[0]), ch))
        return fail(err,
                    "v1 message: channel \"%.*s\" is not one a client may send on "
                    "(shell, control, stdin)",
                    (int)(off[1] - off[0] > 32 ? 32 : off[1] - off[0]), (const char *)d + off[0]);
    static const char *names[] = {"header", "parent_header", "metadata", "content"};
    json_t *parts[4] = {NULL, NULL, NULL, NULL};
    for (int i = 0; i < 4; i++) {
        parts[i] = parse_object(d + off[i + 1], (size_t)(off[i + 2] - off[i + 1]), names[i], err);
        if (!parts[i]) {
            for (int j = 0; j < i; j++)
                json_decref(parts[j]);
            return -1;
        }
    }
    *out = assemble(parts[0], parts[1], parts[2], parts[3], err);
    if (!*out)
        return -1;
    /* buffers: between offsets 5 .. n-1 */
    for (uint64_t i = 5; i + 1 < n; i++)
        if (jmsg_add_buffer(*out, d + off[i], (size_t)(off[i + 1] - off[i]))) {
            jmsg_destroy(out);
            return fail(err, "out of memory");
        }
    return 0;
}

int gwwire_decode(gw_form form, int binary, const void *data, size_t len, jp_channel *ch,
                  jmsg **out, km_err *err)
{
    *out = NULL;
    if (form == GW_FORM_V1) {
        if (!binary)
            return fail(err, "the %s subprotocol takes binary frames only", GW_SUBPROTOCOL_V1);
        return decode_v1(data, len, ch, out, err);
    }
    if (binary)
        return decode_legacy_binary(data, len, ch, out, err);
    json_t *o = parse_object(data, len, "the message", err);
    if (!o)
        return -1;
    int rc = decode_json_object(o, ch, out, err);
    json_decref(o);
    return rc;
}

/* ---------------------------------------------------------------- encode */

static int encode_json(jp_channel ch, const jmsg *msg, unsigned char **out, size_t *len,
                       int *binary)
{
    json_t *o =
        json_pack("{s:O s:O s:O s:O s:s s:s s:s}", "header", msg->header, "parent_header",
                  msg->parent_header, "metadata", msg->metadata, "content", msg->content, "channel",
                  jp_channel_name(ch), "msg_id", jmsg_id(msg), "msg_type", jmsg_type(msg));
    if (!o)
        return -1;
    if (msg->n_buffers == 0 && json_object_set_new(o, "buffers", json_array())) {
        json_decref(o);
        return -1;
    }
    char *text = json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(o);
    if (!text)
        return -1;
    size_t tl = strlen(text);
    if (msg->n_buffers == 0) {
        *out = (unsigned char *)text;
        *len = tl;
        *binary = 0;
        return 0;
    }
    size_t nb = msg->n_buffers + 1, total = 4 * (nb + 1) + tl;
    for (size_t i = 0; i < msg->n_buffers; i++)
        total += msg->buffers[i].size;
    if (total > UINT32_MAX) {
        free(text);
        return -1;
    }
    unsigned char *b = malloc(total);
    if (!b) {
        free(text);
        return -1;
    }
    put_u32be(b, (uint32_t)nb);
    size_t pos = 4 * (nb + 1);
    put_u32be(b + 4, (uint32_t)pos);
    memcpy(b + pos, text, tl);
    pos += tl;
    free(text);
    for (size_t i = 0; i < msg->n_buffers; i++) {
        put_u32be(b + 4 * (i + 2), (uint32_t)pos);
        if (msg->buffers[i].size)
            memcpy(b + pos, msg->buffers[i].data, msg->buffers[i].size);
        pos += msg->buffers[i].size;
    }
    *out = b;
    *len = total;
    *binary = 1;
    return 0;
}

static int encode_v1(jp_channel ch, const jmsg *msg, unsigned char **out, size_t *len)
{
    const json_t *parts[4] = {msg->header, msg->parent_header, msg->metadata, msg->content};
    char *text[4] = {NULL, NULL, NULL, NULL};
    size_t tl[4], nparts = 4 + msg->n_buffers, noff = nparts + 2;
    const char *cn = jp_channel_name(ch);
    size_t cl = strlen(cn), total = 8 * (noff + 1) + cl;
    int rc = -1;
    for (int i = 0; i < 4; i++) {
        text[i] = json_dumps(parts[i], JSON_COMPACT);
        if (!text[i])
            goto out;
        tl[i] = strlen(text[i]);
        total += tl[i];
    }
    for (size_t i = 0; i < msg->n_buffers; i++)
        total += msg->buffers[i].size;
    unsigned char *b = malloc(total);
    if (!b)
        goto out;
    put_u64le(b, noff);
    size_t pos = 8 * (noff + 1);
    put_u64le(b + 8, pos);
    memcpy(b + pos, cn, cl);
    pos += cl;
    for (size_t i = 0; i < nparts; i++) {
        put_u64le(b + 8 * (i + 2), pos);
        const void *src = i < 4 ? (const void *)text[i] : msg->buffers[i - 4].data;
        size_t sl = i < 4 ? tl[i] : msg->buffers[i - 4].size;
        if (sl)
            memcpy(b + pos, src, sl);
        pos += sl;
    }
    put_u64le(b + 8 * (nparts + 2), pos);
    *out = b;
    *len = total;
    rc = 0;
out:
    for (int i = 0; i < 4; i++)
        free(text[i]);
    return rc;
}

int gwwire_encode(gw_form form, jp_channel ch, const jmsg *msg, unsigned char **out, size_t *len,
                  int *binary)
{
    *out = NULL;
    *len = 0;
    if (form == GW_FORM_V1) {
        *binary = 1;
        return encode_v1(ch, msg, out, len);
    }
    return encode_json(ch, msg, out, len, binary);
}
