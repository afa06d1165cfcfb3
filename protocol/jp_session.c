/*
 * jp_session.c — signing sessions: HMAC-SHA256 signatures, constant-time
 * verification, replay protection, and the frame encoding/decoding of
 * Jupyter messages (jupyter_client's Session.serialize / deserialize).
 */
#include "jp_internal.h"
#include "common/cm_utf8.h"

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

/* uthash aborts the process on allocation failure unless told otherwise; a
 * library must not, so an OOM inside HASH_ADD just raises this flag (per
 * thread, as sessions are) and the add is undone by uthash. */
static __thread int jp_session_hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (jp_session_hash_oom = 1)
#include <uthash.h>

#define JP_DIGEST_LEN crypto_auth_hmacsha256_BYTES

/* One remembered signature. Entries live in the ring (which owns them) and
 * are indexed by the hash for O(1) lookup. */
typedef struct jp_seen {
    unsigned char digest[JP_DIGEST_LEN];
    UT_hash_handle hh;
} jp_seen;

struct jp_session {
    unsigned char *key;
    size_t key_len;
    size_t max_bytes;
    size_t max_frames;
    /* Replay cache: a ring of the last `capacity` signatures, oldest at
     * `head` once full. jupyter_client culls a random 10% when its set is
     * full; forgetting the oldest first is deterministic and keeps the
     * messages most likely to be replayed (recent ones) the longest. */
    jp_seen **ring;
    size_t capacity;
    size_t count;
    size_t head;
    jp_seen *seen; /* uthash head */
};

jp_session *jp_session_new(const void *key, size_t key_len, const char *scheme, jp_error *err)
{
    jp_error_clear(err);
    if (scheme && strcmp(scheme, "hmac-sha256") != 0) {
        jp_error_set(err, JP_ERR_SCHEME,
                     "unsupported signature_scheme \"%.64s\" (only hmac-sha256 is supported)",
                     scheme);
        return NULL;
    }
    if (key_len && !key) {
        jp_error_set(err, JP_ERR_ARG, "key is NULL but key_len is %zu", key_len);
        return NULL;
    }
    if (jp_sodium_ready() < 0) {
        jp_error_set(err, JP_ERR_NOMEM, "libsodium failed to initialise");
        return NULL;
    }
    jp_session *s = calloc(1, sizeof *s);
    if (!s)
        goto nomem;
    if (key_len) {
        if (!(s->key = malloc(key_len)))
            goto nomem;
        memcpy(s->key, key, key_len);
        s->key_len = key_len;
    }
    s->max_bytes = JP_DEFAULT_MAX_BYTES;
    s->max_frames = JP_DEFAULT_MAX_FRAMES;
    s->capacity = JP_DEFAULT_REPLAY_CAPACITY;
    if (!(s->ring = calloc(s->capacity, sizeof *s->ring)))
        goto nomem;
    return s;
nomem:
    jp_session_destroy(&s);
    jp_error_set(err, JP_ERR_NOMEM, "out of memory creating a session");
    return NULL;
}

static void replay_clear(jp_session *s)
{
    HASH_CLEAR(hh, s->seen);
    for (size_t i = 0; i < s->count; i++)
        free(s->ring[(s->head + i) % s->capacity]);
    s->count = 0;
    s->head = 0;
}

void jp_session_destroy(jp_session **sp)
{
    if (!sp || !*sp)
        return;
    jp_session *s = *sp;
    if (s->ring)
        replay_clear(s);
    free(s->ring);
    if (s->key) {
        sodium_memzero(s->key, s->key_len);
        free(s->key);
    }
    free(s);
    *sp = NULL;
}

void jp_session_set_max_bytes(jp_session *s, size_t max_bytes)
{
    if (s)
        s->max_bytes = max_bytes ? max_bytes : JP_DEFAULT_MAX_BYTES;
}

void jp_session_set_max_frames(jp_session *s, size_t max_frames)
{
    if (s)
        s->max_frames = max_frames ? max_frames : JP_DEFAULT_MAX_FRAMES;
}

size_t jp_session_max_bytes(const jp_session *s)
{
    return s ? s->max_bytes : JP_DEFAULT_MAX_BYTES;
}

size_t jp_session_max_frames(const jp_session *s)
{
    return s ? s->max_frames : JP_DEFAULT_MAX_FRAMES;
}

void jp_session_set_replay_capacity(jp_session *s, size_t capacity)
{
    if (!s)
        return;
    if (capacity == 0)
        capacity = JP_DEFAULT_REPLAY_CAPACITY;
    if (capacity == s->capacity)
        return;
    jp_seen **ring = calloc(capacity, sizeof *ring);
    if (!ring)
        return; /* keep the old cache: still correct, just another size */
    /* Keep the newest min(count, capacity) entries, forget the rest. */
    size_t keep = s->count < capacity ? s->count : capacity;
    size_t drop = s->count - keep;
    for (size_t i = 0; i < s->count; i++) {
        jp_seen *e = s->ring[(s->head + i) % s->capacity];
        if (i < drop) {
            HASH_DEL(s->seen, e);
            free(e);
        } else {
            ring[i - drop] = e;
        }
    }
    free(s->ring);
    s->ring = ring;
    s->capacity = capacity;
    s->count = keep;
    s->head = 0;
}

static int replay_seen(const jp_session *s, const unsigned char digest[JP_DIGEST_LEN])
{
    jp_seen *e = NULL;
    HASH_FIND(hh, s->seen, digest, JP_DIGEST_LEN, e);
    return e != NULL;
}

static int replay_add(jp_session *s, const unsigned char digest[JP_DIGEST_LEN])
{
    jp_seen *e;
    if (s->count == s->capacity) {
        /* Full: recycle the oldest entry. */
        e = s->ring[s->head];
        HASH_DEL(s->seen, e);
        s->ring[s->head] = NULL;
        s->head = (s->head + 1) % s->capacity;
        s->count--;
    } else if (!(e = malloc(sizeof *e))) {
        return -1;
    }
    memcpy(e->digest, digest, JP_DIGEST_LEN);
    jp_session_hash_oom = 0;
    HASH_ADD(hh, s->seen, digest, JP_DIGEST_LEN, e);
    if (jp_session_hash_oom) {
        free(e);
        return -1;
    }
    s->ring[(s->head + s->count) % s->capacity] = e;
    s->count++;
    return 0;
}

/* ---------------------------------------------------------------- signing */

static void hmac_parts(const jp_session *s, const jp_frame parts[4],
                       unsigned char digest[JP_DIGEST_LEN])
{
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, s->key, s->key_len);
    for (int i = 0; i < 4; i++)
        if (parts[i].size)
            crypto_auth_hmacsha256_update(&st, parts[i].data, parts[i].size);
    crypto_auth_hmacsha256_final(&st, digest);
    sodium_memzero(&st, sizeof st);
}

void jp_session_sign(const jp_session *s, const jp_frame parts[4],
                     char out[JP_SIGNATURE_HEX_LEN + 1])
{
    out[0] = '\0';
    if (!s || !parts || s->key_len == 0)
        return;
    unsigned char digest[JP_DIGEST_LEN];
    hmac_parts(s, parts, digest);
    sodium_bin2hex(out, JP_SIGNATURE_HEX_LEN + 1, digest, sizeof digest);
}

/* ---------------------------------------------------------------- decode */

static int is_lower_hex(const unsigned char *p, size_t n)
{
    /* Branch-free over the whole signature: how far a forged one matches
     * must not show in the timing. */
    unsigned bad = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned c = p[i];
        unsigned digit = (unsigned)((c - '0') <= 9);
        unsigned lower = (unsigned)((c - 'a') <= 5);
        bad |= !(digit | lower);
    }
    return bad == 0;
}

static const char *const jp_frame_names[4] = {"header", "parent_header", "metadata", "content"};

/* Parses one JSON frame into an object. Returns JP_OK or an error. */
static jp_status parse_object(const jp_frame *f, int idx, json_t **out, jp_error *err)
{
    *out = NULL;
    const char *name = jp_frame_names[idx];
    if (!cm_utf8_valid(f->data, f->size))
        return jp_error_set(err, JP_ERR_UTF8, "%s frame is not valid UTF-8", name);
    /* Zeroed: jansson leaves the error untouched when its lexer cannot even
     * allocate, so an empty text means "out of memory" too. */
    json_error_t je;
    memset(&je, 0, sizeof je);
    /* JSON_DECODE_ANY: a scalar parses and then fails the object check below
     * with the clearer "wrong type" error. JSON_ALLOW_NUL: Python's json
     * writes "\u0000" for NUL characters (e.g. in program output) and the
     * message must still decode; strings keep their length. Duplicate keys
     * are accepted (last wins), like Python's json module. */
    json_t *j = json_loadb(f->data ? f->data : "", f->size, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j && (json_error_code(&je) == json_error_out_of_memory || je.text[0] == '\0'))
        return jp_error_set(err, JP_ERR_NOMEM, "%s frame: out of memory parsing JSON", name);
    if (!j)
        return jp_error_set(err, JP_ERR_JSON, "%s frame: %s (line %d, column %d)", name, je.text,
                            je.line, je.column);
    if (!json_is_object(j)) {
        json_decref(j);
        return jp_error_set(err, JP_ERR_FIELD_TYPE, "%s is not a JSON object", name);
    }
    *out = j;
    return JP_OK;
}

static jp_status take_frames(jp_frame **dst, jp_frame *src, size_t n, int steal, jp_error *err)
{
    *dst = NULL;
    if (n == 0)
        return JP_OK;
    jp_frame *f = calloc(n, sizeof *f);
    if (!f)
        return jp_error_set(err, JP_ERR_NOMEM, "out of memory copying frames");
    for (size_t i = 0; i < n; i++) {
        if (steal) {
            f[i] = src[i];
            src[i].data = NULL;
            src[i].size = 0;
            continue;
        }
        if (src[i].size == 0)
            continue;
        if (!(f[i].data = malloc(src[i].size))) {
            jp_frames_free(&f, i);
            return jp_error_set(err, JP_ERR_NOMEM, "out of memory copying frames");
        }
        memcpy(f[i].data, src[i].data, src[i].size);
        f[i].size = src[i].size;
    }
    *dst = f;
    return JP_OK;
}

jp_status jp_session_decode_frames(jp_session *s, jp_frame *frames, size_t n, int steal, jmsg **out,
                                   jp_error *err)
{
    jp_error_clear(err);
    if (!out)
        return jp_error_set(err, JP_ERR_ARG, "out is NULL");
    *out = NULL;
    if (!s || (n && !frames))
        return jp_error_set(err, JP_ERR_ARG, "session or frames is NULL");

    /* 1. Bounds, before looking at any content. */
    if (n > s->max_frames)
        return jp_error_set(err, JP_ERR_TOO_MANY_FRAMES, "message has %zu frames (limit %zu)", n,
                            s->max_frames);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (frames[i].size && !frames[i].data)
            return jp_error_set(err, JP_ERR_ARG, "frame %zu has size but no data", i);
        if (frames[i].size > s->max_bytes - total)
            return jp_error_set(err, JP_ERR_TOO_LARGE, "message exceeds %zu bytes", s->max_bytes);
        total += frames[i].size;
    }

    /* 2. Delimiter: everything before it is routing ids. */
    size_t d = 0;
    const size_t dlen = sizeof JP_DELIMITER - 1;
    while (d < n && !(frames[d].size == dlen && memcmp(frames[d].data, JP_DELIMITER, dlen) == 0))
        d++;
    if (d == n)
        return jp_error_set(err, JP_ERR_NO_DELIMITER, "no \"" JP_DELIMITER "\" frame among %zu", n);
    if (n - d - 1 < 5)
        return jp_error_set(err, JP_ERR_FRAME_COUNT,
                            "%zu frames after the delimiter, need signature + 4 JSON frames",
                            n - d - 1);
    const jp_frame *sig = &frames[d + 1];
    const jp_frame *parts = &frames[d + 2];

    /* 3. Signature: length and alphabet first, then the HMAC in constant
     * time, then replay — all before a single byte of JSON is parsed. With
     * no key, the signature frame is ignored, as in jupyter_client. */
    unsigned char digest[JP_DIGEST_LEN];
    if (s->key_len) {
        if (sig->size != JP_SIGNATURE_HEX_LEN)
            return jp_error_set(err, JP_ERR_SIG_LENGTH,
                                sig->size ? "signature is %zu bytes, expected %d hex digits"
                                          : "message is unsigned (%zu bytes), expected %d hex "
                                            "digits",
                                sig->size, JP_SIGNATURE_HEX_LEN);
        if (!is_lower_hex(sig->data, sig->size))
            return jp_error_set(err, JP_ERR_SIG_LENGTH, "signature is not lowercase hexadecimal");
        unsigned char given[JP_DIGEST_LEN];
        size_t bin_len = 0;
        if (sodium_hex2bin(given, sizeof given, sig->data, sig->size, NULL, &bin_len, NULL) != 0 ||
            bin_len != sizeof given)
            return jp_error_set(err, JP_ERR_SIG_LENGTH, "signature is not hexadecimal");
        hmac_parts(s, parts, digest);
        if (sodium_memcmp(given, digest, sizeof digest) != 0)
            return jp_error_set(err, JP_ERR_SIG_MISMATCH,
                                "HMAC-SHA256 signature does not match the message");
        if (replay_seen(s, digest))
            return jp_error_set(err, JP_ERR_REPLAY, "signature was already seen: message replayed");
    }

    /* 4. Only now parse. */
    jmsg *m = calloc(1, sizeof *m);
    if (!m)
        return jp_error_set(err, JP_ERR_NOMEM, "out of memory");
    json_t **slots[4] = {&m->header, &m->parent_header, &m->metadata, &m->content};
    jp_status st = JP_OK;
    for (int i = 0; i < 4 && st == JP_OK; i++)
        st = parse_object(&parts[i], i, slots[i], err);
    if (st != JP_OK)
        goto fail;

    /* 5. Header fields everyone downstream relies on. */
    static const char *const required[] = {"msg_id", "msg_type"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(m->header, required[i]);
        if (!v) {
            st = jp_error_set(err, JP_ERR_FIELD_MISSING, "header.%s is missing", required[i]);
            goto fail;
        }
        if (!json_is_string(v)) {
            st = jp_error_set(err, JP_ERR_FIELD_TYPE, "header.%s is not a string", required[i]);
            goto fail;
        }
    }

    if ((st = take_frames(&m->ids, frames, d, steal, err)) != JP_OK)
        goto fail;
    m->n_ids = d;
    if ((st = take_frames(&m->buffers, frames + d + 6, n - d - 6, steal, err)) != JP_OK)
        goto fail;
    m->n_buffers = n - d - 6;

    /* Remembered only once everything succeeded, so a message that failed
     * (even after a good HMAC) can be re-sent intact; replaying a message
     * that was accepted is what is refused. */
    if (s->key_len && replay_add(s, digest) < 0) {
        st = jp_error_set(err, JP_ERR_NOMEM, "out of memory remembering the signature");
        goto fail;
    }
    *out = m;
    return JP_OK;
fail:
    jmsg_destroy(&m);
    return st;
}

jp_status jp_session_decode(jp_session *s, const jp_frame *frames, size_t n, jmsg **out,
                            jp_error *err)
{
    /* Not stealing, so the const is honoured. */
    return jp_session_decode_frames(s, (jp_frame *)frames, n, 0, out, err);
}

/* ---------------------------------------------------------------- encode */

static char *dump_object(const json_t *obj)
{
    /* A missing parent_header/metadata/content is sent as {}, which is what
     * the protocol wants for "none". */
    if (!obj)
        return strdup("{}");
    /* Compact separators like jupyter_client's json_packer; insertion order
     * is kept by jansson >= 2.8. Non-ASCII stays UTF-8 (ensure_ascii=False
     * in jupyter_client too). */
    return json_dumps(obj, JSON_COMPACT | JSON_ENCODE_ANY);
}

jp_status jp_session_encode(const jp_session *s, const jmsg *msg, jp_frame **frames, size_t *n,
                            jp_error *err)
{
    jp_error_clear(err);
    if (!frames || !n)
        return jp_error_set(err, JP_ERR_ARG, "frames or n is NULL");
    *frames = NULL;
    *n = 0;
    if (!s || !msg)
        return jp_error_set(err, JP_ERR_ARG, "session or message is NULL");
    if (!json_is_object(msg->header))
        return jp_error_set(err, JP_ERR_FIELD_TYPE, "message header is not an object");
    const json_t *objs[4] = {msg->header, msg->parent_header, msg->metadata, msg->content};
    for (int i = 1; i < 4; i++)
        if (objs[i] && !json_is_object(objs[i]))
            return jp_error_set(err, JP_ERR_FIELD_TYPE, "message %s is not an object",
                                jp_frame_names[i]);
    if ((msg->n_ids && !msg->ids) || (msg->n_buffers && !msg->buffers))
        return jp_error_set(err, JP_ERR_ARG, "n_ids/n_buffers set but the arrays are NULL");

    for (size_t i = 0; i < msg->n_ids; i++)
        if (msg->ids[i].size && !msg->ids[i].data)
            return jp_error_set(err, JP_ERR_ARG, "routing id %zu has size but no data", i);
    for (size_t i = 0; i < msg->n_buffers; i++)
        if (msg->buffers[i].size && !msg->buffers[i].data)
            return jp_error_set(err, JP_ERR_ARG, "buffer %zu has size but no data", i);

    size_t count = msg->n_ids + 6 + msg->n_buffers;
    jp_frame *f = calloc(count, sizeof *f);
    if (!f)
        return jp_error_set(err, JP_ERR_NOMEM, "out of memory encoding");
    size_t k = 0;
    for (size_t i = 0; i < msg->n_ids; i++, k++) {
        const jp_frame *src = &msg->ids[i];
        if (src->size && !(f[k].data = malloc(src->size)))
            goto fail;
        if (src->size)
            memcpy(f[k].data, src->data, src->size);
        f[k].size = src->size;
    }
    if (!(f[k].data = strdup(JP_DELIMITER)))
        goto fail;
    f[k++].size = sizeof JP_DELIMITER - 1;
    size_t sig_at = k++;
    for (int i = 0; i < 4; i++, k++) {
        char *text = dump_object(objs[i]);
        if (!text)
            goto fail;
        f[k].data = text;
        f[k].size = strlen(text);
    }
    for (size_t i = 0; i < msg->n_buffers; i++, k++) {
        const jp_frame *src = &msg->buffers[i];
        if (src->size && !(f[k].data = malloc(src->size)))
            goto fail;
        if (src->size)
            memcpy(f[k].data, src->data, src->size);
        f[k].size = src->size;
    }
    char sig[JP_SIGNATURE_HEX_LEN + 1];
    jp_session_sign(s, &f[sig_at + 1], sig);
    if (!(f[sig_at].data = strdup(sig)))
        goto fail;
    f[sig_at].size = strlen(sig);
    *frames = f;
    *n = count;
    return JP_OK;
fail:
    jp_frames_free(&f, count);
    return jp_error_set(err, JP_ERR_NOMEM, "out of memory encoding");
}
