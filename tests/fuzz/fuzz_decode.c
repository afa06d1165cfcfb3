/*
 * libFuzzer target: jp_session_decode on untrusted frames.
 *
 * Input: one flag byte, then frames separated by "|#|".
 *   bit 0  sign with a key (else: empty key, no signing)
 *   bit 1  replace the signature frame by the correct HMAC of the four JSON
 *          frames, so the fuzzer gets past verification into the parser
 *   bit 2  tight limits (8 frames, 512 bytes)
 *   bit 3  decode twice (the second must be refused as a replay when signed)
 * On success the message is re-encoded and decoded by a fresh session, and
 * the two must be equal: encode and decode are inverses.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jp.h"
#include "common/cm_utf8.h"

#define SEP "|#|"
#define FUZZ_KEY "fuzz-key"

static jp_frame *split(const uint8_t *p, size_t len, size_t *n)
{
    size_t cap = 8;
    jp_frame *f = malloc(cap * sizeof *f);
    *n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        int end = i == len;
        if (!end && !(i + 3 <= len && memcmp(p + i, SEP, 3) == 0))
            continue;
        if (*n == cap) {
            cap *= 2;
            jp_frame *g = realloc(f, cap * sizeof *f);
            if (!g)
                abort();
            f = g;
        }
        size_t sz = i - start;
        f[*n].size = sz;
        f[*n].data = sz ? malloc(sz) : NULL;
        if (sz)
            memcpy(f[*n].data, p + start, sz);
        (*n)++;
        if (end)
            break;
        start = i + 3;
        i += 2;
    }
    return f;
}

static void check_roundtrip(const jp_session *s, const jmsg *m, int keyed)
{
    jp_frame *f = NULL;
    size_t n = 0;
    jp_error err;
    if (jp_session_encode(s, m, &f, &n, &err) != JP_OK)
        abort();
    jp_session *fresh =
        jp_session_new(keyed ? FUZZ_KEY : NULL, keyed ? strlen(FUZZ_KEY) : 0, NULL, NULL);
    jmsg *back = NULL;
    jp_status st = jp_session_decode(fresh, f, n, &back, &err);
    if (st != JP_OK)
        abort();
    if (!json_equal(back->header, m->header) ||
        !json_equal(back->parent_header, m->parent_header) ||
        !json_equal(back->metadata, m->metadata) || !json_equal(back->content, m->content) ||
        back->n_ids != m->n_ids || back->n_buffers != m->n_buffers)
        abort();
    for (size_t i = 0; i < m->n_buffers; i++)
        if (back->buffers[i].size != m->buffers[i].size ||
            (m->buffers[i].size &&
             memcmp(back->buffers[i].data, m->buffers[i].data, m->buffers[i].size) != 0))
            abort();
    jmsg_destroy(&back);
    jp_session_destroy(&fresh);
    jp_frames_free(&f, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    int keyed = flags & 1;
    size_t n;
    jp_frame *frames = split(data + 1, size - 1, &n);

    jp_error err;
    jp_session *s =
        jp_session_new(keyed ? FUZZ_KEY : NULL, keyed ? strlen(FUZZ_KEY) : 0, NULL, &err);
    if (!s)
        abort();
    if (flags & 4) {
        jp_session_set_max_frames(s, 8);
        jp_session_set_max_bytes(s, 512);
    }
    if ((flags & 2) && keyed) {
        for (size_t d = 0; d < n; d++) {
            if (frames[d].size == 9 && memcmp(frames[d].data, JP_DELIMITER, 9) == 0) {
                if (n - d - 1 >= 5) {
                    char sig[JP_SIGNATURE_HEX_LEN + 1];
                    jp_session_sign(s, &frames[d + 2], sig);
                    free(frames[d + 1].data);
                    frames[d + 1].data = strdup(sig);
                    frames[d + 1].size = strlen(sig);
                }
                break;
            }
        }
    }

    jmsg *m = NULL;
    jp_status st = jp_session_decode(s, frames, n, &m, &err);
    if (st < 0 || st >= JP_ERR__COUNT)
        abort();
    if (st == JP_OK) {
        if (!m || !json_is_object(m->header) || !json_is_object(m->content) ||
            !json_is_string(json_object_get(m->header, "msg_id")))
            abort();
        (void)jmsg_type(m);
        check_roundtrip(s, m, keyed);
        if (flags & 8) {
            jmsg *again = NULL;
            st = jp_session_decode(s, frames, n, &again, &err);
            if (keyed && st != JP_ERR_REPLAY)
                abort();
            jmsg_destroy(&again);
        }
        jmsg_destroy(&m);
    } else {
        if (m || err.code != st || err.reason[0] == '\0')
            abort();
    }

    /* The UTF-8 helpers see the same bytes. */
    size_t clean_len;
    char *clean = cm_utf8_sanitize(data, size, &clean_len);
    if (!clean || !cm_utf8_valid(clean, clean_len) || memchr(clean, 0, clean_len))
        abort();
    free(clean);
    size_t cut = cm_utf8_complete_prefix(data, size);
    if (cut > size || (cm_utf8_valid(data, size) && cut != size))
        abort();

    jp_session_destroy(&s);
    jp_frames_free(&frames, n);
    return 0;
}
