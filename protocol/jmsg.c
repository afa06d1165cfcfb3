/*
 * jmsg.c — the Jupyter message model: header, parent header, metadata,
 * content (jansson objects), routing ids and binary buffers.
 */
#include "jp_internal.h"

#include <stdlib.h>
#include <string.h>

/* Copies src[0..n) into a new frame array; *dst NULL when n == 0. */
static int frames_copy(jp_frame **dst, const jp_frame *src, size_t n)
{
    *dst = NULL;
    if (n == 0)
        return 0;
    if (!src)
        return -1;
    jp_frame *f = calloc(n, sizeof *f);
    if (!f)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (src[i].size == 0)
            continue;
        if (!src[i].data || !(f[i].data = malloc(src[i].size))) {
            jp_frames_free(&f, i);
            return -1;
        }
        memcpy(f[i].data, src[i].data, src[i].size);
        f[i].size = src[i].size;
    }
    *dst = f;
    return 0;
}

jmsg *jmsg_new(const char *msg_type, const char *session, const char *username, const jmsg *parent)
{
    if (!msg_type)
        return NULL;
    jmsg *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    char id[37], date[32];
    jp_uuid4(id);
    jp_now_iso8601(date);
    /* Same key order as jupyter_client's msg_header(), which helps when
     * comparing captures side by side. */
    m->header = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "msg_id", id, "msg_type", msg_type,
                          "username", username ? username : "kernel", "session",
                          session ? session : "", "date", date, "version", JP_PROTOCOL_VERSION);
    if (parent && parent->header)
        m->parent_header = json_deep_copy(parent->header);
    else
        m->parent_header = json_object();
    m->metadata = json_object();
    m->content = json_object();
    if (!m->header || !m->parent_header || !m->metadata || !m->content)
        goto fail;
    if (parent && frames_copy(&m->ids, parent->ids, parent->n_ids) < 0)
        goto fail;
    if (parent)
        m->n_ids = parent->n_ids;
    return m;
fail:
    jmsg_destroy(&m);
    return NULL;
}

void jmsg_destroy(jmsg **msg)
{
    if (!msg || !*msg)
        return;
    jmsg *m = *msg;
    jp_frames_free(&m->ids, m->n_ids);
    jp_frames_free(&m->buffers, m->n_buffers);
    json_decref(m->header);
    json_decref(m->parent_header);
    json_decref(m->metadata);
    json_decref(m->content);
    free(m);
    *msg = NULL;
}

static int replace_object(json_t **slot, json_t *value)
{
    if (!json_is_object(value)) {
        json_decref(value);
        return -1;
    }
    json_decref(*slot);
    *slot = value;
    return 0;
}

int jmsg_set_content(jmsg *msg, json_t *content)
{
    if (!msg) {
        json_decref(content);
        return -1;
    }
    return replace_object(&msg->content, content);
}

int jmsg_set_metadata(jmsg *msg, json_t *metadata)
{
    if (!msg) {
        json_decref(metadata);
        return -1;
    }
    return replace_object(&msg->metadata, metadata);
}

int jmsg_add_buffer(jmsg *msg, const void *data, size_t size)
{
    if (!msg || (size && !data))
        return -1;
    void *copy = NULL;
    if (size) {
        if (!(copy = malloc(size)))
            return -1;
        memcpy(copy, data, size);
    }
    jp_frame *grown = realloc(msg->buffers, (msg->n_buffers + 1) * sizeof *grown);
    if (!grown) {
        free(copy);
        return -1;
    }
    grown[msg->n_buffers].data = copy;
    grown[msg->n_buffers].size = size;
    msg->buffers = grown;
    msg->n_buffers++;
    return 0;
}

int jmsg_set_ids(jmsg *msg, const jp_frame *ids, size_t n)
{
    if (!msg)
        return -1;
    jp_frame *copy;
    if (frames_copy(&copy, ids, n) < 0)
        return -1;
    jp_frames_free(&msg->ids, msg->n_ids);
    msg->ids = copy;
    msg->n_ids = n;
    return 0;
}

static const char *header_string(const jmsg *msg, const char *key)
{
    if (!msg)
        return "";
    const char *s = json_string_value(json_object_get(msg->header, key));
    return s ? s : "";
}

const char *jmsg_type(const jmsg *msg)
{
    return header_string(msg, "msg_type");
}

const char *jmsg_id(const jmsg *msg)
{
    return header_string(msg, "msg_id");
}

const char *jmsg_session(const jmsg *msg)
{
    return header_string(msg, "session");
}
