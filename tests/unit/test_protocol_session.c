/* Unit tests for protocol/jp_session.c: signing, encode/decode, every
 * decode error, replay protection and limits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jp.h"

#define KEY "test-key-0123456789"

static jp_session *session(const char *key)
{
    jp_error err;
    jp_session *s = jp_session_new(key, strlen(key), "hmac-sha256", &err);
    assert_non_null(s);
    return s;
}

static jp_frame frame_str(const char *s)
{
    jp_frame f = {NULL, strlen(s)};
    if (f.size) {
        f.data = malloc(f.size);
        memcpy(f.data, s, f.size);
    }
    return f;
}

/* Frames [DELIM, sig, h, p, m, c] signed by s (sig overridable). */
static jp_frame *raw_message(const jp_session *s, const char *h, const char *p, const char *m,
                             const char *c, const char *sig_override, size_t *n)
{
    jp_frame *f = calloc(6, sizeof *f);
    f[0] = frame_str(JP_DELIMITER);
    f[2] = frame_str(h);
    f[3] = frame_str(p);
    f[4] = frame_str(m);
    f[5] = frame_str(c);
    char sig[JP_SIGNATURE_HEX_LEN + 1];
    jp_session_sign(s, &f[2], sig);
    f[1] = frame_str(sig_override ? sig_override : sig);
    *n = 6;
    return f;
}

#define GOOD_HEADER "{\"msg_id\":\"m1\",\"msg_type\":\"status\",\"session\":\"s\"}"

static jp_status decode_raw(jp_session *s, const char *h, const char *p, const char *m,
                            const char *c, jp_error *err)
{
    size_t n;
    jp_frame *f = raw_message(s, h, p, m, c, NULL, &n);
    jmsg *msg = (jmsg *)0x1;
    jp_status st = jp_session_decode(s, f, n, &msg, err);
    if (st == JP_OK) {
        assert_non_null(msg);
        jmsg_destroy(&msg);
    } else {
        assert_null(msg);
        assert_int_equal(err->code, st);
        assert_true(strlen(err->reason) > 0);
    }
    jp_frames_free(&f, n);
    return st;
}

static void test_new_schemes_and_args(void **state)
{
    (void)state;
    jp_error err;
    jp_session *s = jp_session_new("k", 1, NULL, &err);
    assert_non_null(s);
    jp_session_destroy(&s);
    assert_null(s);
    jp_session_destroy(&s);
    jp_session_destroy(NULL);
    s = jp_session_new(NULL, 0, "hmac-sha256", NULL);
    assert_non_null(s);
    jp_session_destroy(&s);
    assert_null(jp_session_new("k", 1, "hmac-md5", &err));
    assert_int_equal(err.code, JP_ERR_SCHEME);
    assert_non_null(strstr(err.reason, "hmac-md5"));
    assert_null(jp_session_new("k", 1, "", NULL));
    assert_null(jp_session_new(NULL, 3, NULL, &err));
    assert_int_equal(err.code, JP_ERR_ARG);
}

static void test_sign_known_vector(void **state)
{
    (void)state;
    /* RFC 4231 test case 2, the data split over the four parts: the HMAC
     * covers their concatenation. */
    jp_session *s = session("Jefe");
    jp_frame parts[4] = {{"what do ya", 10}, {" want ", 6}, {NULL, 0}, {"for nothing?", 12}};
    char sig[JP_SIGNATURE_HEX_LEN + 1];
    jp_session_sign(s, parts, sig);
    assert_string_equal(sig, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    jp_session_destroy(&s);

    s = jp_session_new(NULL, 0, NULL, NULL);
    jp_session_sign(s, parts, sig);
    assert_string_equal(sig, "");
    jp_session_destroy(&s);
}

static void test_encode_decode_roundtrip(void **state)
{
    (void)state;
    jp_session *s = session(KEY);
    jmsg *m = jmsg_new("execute_request", "sess", "user", NULL);
    jmsg_set_content(m, json_pack("{s:s, s:b, s:s#}", "code", "print('h\xc3\xa9')", "silent", 0,
                                  "nul", "a\0b", (size_t)3));
    jmsg_set_metadata(m, json_pack("{s:i}", "n", 7));
    jp_frame ids[2] = {{"peer-a", 6}, {"\0\1", 2}};
    jmsg_set_ids(m, ids, 2);
    jmsg_add_buffer(m, "\xff\x00\x01", 3);
    jmsg_add_buffer(m, NULL, 0);

    jp_frame *f = NULL;
    size_t n = 0;
    jp_error err;
    assert_int_equal(jp_session_encode(s, m, &f, &n, &err), JP_OK);
    assert_int_equal(n, 2 + 6 + 2);
    assert_int_equal(f[2].size, strlen(JP_DELIMITER));
    assert_memory_equal(f[2].data, JP_DELIMITER, f[2].size);
    assert_int_equal(f[3].size, JP_SIGNATURE_HEX_LEN);
    /* Compact JSON, as jupyter_client's packer writes it. */
    assert_memory_equal(f[7].data, "{\"code\":", 8);
    assert_null(memchr(f[7].data, ' ', 8));

    jmsg *d = NULL;
    assert_int_equal(jp_session_decode(s, f, n, &d, &err), JP_OK);
    assert_true(json_equal(d->header, m->header));
    assert_true(json_equal(d->parent_header, m->parent_header));
    assert_true(json_equal(d->metadata, m->metadata));
    assert_true(json_equal(d->content, m->content));
    assert_int_equal(json_string_length(json_object_get(d->content, "nul")), 3);
    assert_int_equal(d->n_ids, 2);
    assert_memory_equal(d->ids[1].data, "\0\1", 2);
    assert_int_equal(d->n_buffers, 2);
    assert_memory_equal(d->buffers[0].data, "\xff\x00\x01", 3);
    assert_int_equal(d->buffers[1].size, 0);
    assert_string_equal(jmsg_id(d), jmsg_id(m));
    jmsg_destroy(&d);
    jp_frames_free(&f, n);
    jmsg_destroy(&m);
    jp_session_destroy(&s);
}

static void test_encode_errors(void **state)
{
    (void)state;
    jp_session *s = session(KEY);
    jmsg *m = jmsg_new("x", "s", "u", NULL);
    jp_frame *f = (jp_frame *)0x1;
    size_t n = 5;
    jp_error err;
    assert_int_equal(jp_session_encode(NULL, m, &f, &n, &err), JP_ERR_ARG);
    assert_null(f);
    assert_int_equal(n, 0);
    assert_int_equal(jp_session_encode(s, NULL, &f, &n, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_encode(s, m, NULL, &n, &err), JP_ERR_ARG);

    json_decref(m->content);
    m->content = json_array();
    assert_int_equal(jp_session_encode(s, m, &f, &n, &err), JP_ERR_FIELD_TYPE);
    assert_non_null(strstr(err.reason, "content"));
    json_decref(m->content);
    m->content = NULL; /* absent parts are sent as {} */
    json_decref(m->parent_header);
    m->parent_header = NULL;
    assert_int_equal(jp_session_encode(s, m, &f, &n, &err), JP_OK);
    assert_int_equal(f[3].size, 2);
    assert_memory_equal(f[3].data, "{}", 2);
    jp_frames_free(&f, n);

    m->n_buffers = 2; /* count without an array */
    assert_int_equal(jp_session_encode(s, m, &f, &n, &err), JP_ERR_ARG);
    m->n_buffers = 0;

    json_decref(m->header);
    m->header = json_string("nope");
    assert_int_equal(jp_session_encode(s, m, &f, &n, &err), JP_ERR_FIELD_TYPE);
    jmsg_destroy(&m);
    jp_session_destroy(&s);
}

static void test_decode_limits(void **state)
{
    (void)state;
    jp_session *s = session(KEY);
    size_t n;
    jp_frame *f = raw_message(s, GOOD_HEADER, "{}", "{}", "{}", NULL, &n);
    jmsg *m = NULL;
    jp_error err;

    jp_session_set_max_frames(s, 5);
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_ERR_TOO_MANY_FRAMES);
    assert_null(m);
    jp_session_set_max_frames(s, 0); /* default again */
    jp_session_set_max_bytes(s, 40);
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_ERR_TOO_LARGE);
    assert_non_null(strstr(err.reason, "40"));
    jp_session_set_max_bytes(s, 0);
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_OK);
    jmsg_destroy(&m);

    /* Caller mistakes. */
    assert_int_equal(jp_session_decode(s, f, n, NULL, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_decode(NULL, f, n, &m, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_decode(s, NULL, 3, &m, &err), JP_ERR_ARG);
    jp_frames_free(&f, n);
    jp_session_destroy(&s);
}

static void test_decode_framing_errors(void **state)
{
    (void)state;
    jp_session *s = session(KEY);
    jp_error err;
    jmsg *m = NULL;
    size_t n;
    jp_frame *f = raw_message(s, GOOD_HEADER, "{}", "{}", "{}", NULL, &n);

    /* No delimiter: drop it. */
    assert_int_equal(jp_session_decode(s, f + 1, n - 1, &m, &err), JP_ERR_NO_DELIMITER);
    assert_int_equal(jp_session_decode(s, NULL, 0, &m, &err), JP_ERR_NO_DELIMITER);
    /* Too few frames after it. */
    assert_int_equal(jp_session_decode(s, f, n - 1, &m, &err), JP_ERR_FRAME_COUNT);
    assert_int_equal(jp_session_decode(s, f, 1, &m, &err), JP_ERR_FRAME_COUNT);
    jp_frames_free(&f, n);

    /* Signatures: wrong length, empty, uppercase, not hex, wrong value. */
    const char *bad_len[] = {"abc", "",
                             "5BDCC146BF60754E6A042426089575C75A003F089D2739839DEC58B964EC3843",
                             "zzdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"};
    for (size_t i = 0; i < 4; i++) {
        f = raw_message(s, GOOD_HEADER, "{}", "{}", "{}", bad_len[i], &n);
        assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_ERR_SIG_LENGTH);
        jp_frames_free(&f, n);
    }
    f = raw_message(s, GOOD_HEADER, "{}", "{}", "{}",
                    "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", &n);
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_ERR_SIG_MISMATCH);
    assert_null(m);
    jp_frames_free(&f, n);
    jp_session_destroy(&s);
}

static void test_decode_checks_signature_before_parsing(void **state)
{
    (void)state;
    /* Garbage JSON with a bad signature must report the signature, proving
     * the parser never saw it. */
    jp_session *s = session(KEY);
    jp_session *other = session("other");
    size_t n;
    jp_frame *f = raw_message(other, "{{{{", "\xff", "[", "1", NULL, &n);
    jmsg *m = NULL;
    jp_error err;
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_ERR_SIG_MISMATCH);
    jp_frames_free(&f, n);
    jp_session_destroy(&other);
    jp_session_destroy(&s);
}

static void test_decode_content_errors(void **state)
{
    (void)state;
    jp_session *s = session(KEY);
    jp_error err;
    assert_int_equal(decode_raw(s, GOOD_HEADER, "{}", "{}", "{\"t\":\"\xc3(\"}", &err),
                     JP_ERR_UTF8);
    assert_non_null(strstr(err.reason, "content"));
    assert_int_equal(decode_raw(s, "{\"msg_id\":\"\xed\xa0\x80\"}", "{}", "{}", "{}", &err),
                     JP_ERR_UTF8);
    assert_int_equal(decode_raw(s, GOOD_HEADER, "{", "{}", "{}", &err), JP_ERR_JSON);
    assert_non_null(strstr(err.reason, "parent_header"));
    assert_int_equal(decode_raw(s, GOOD_HEADER, "{}", "{}", "{} x", &err), JP_ERR_JSON);
    assert_int_equal(decode_raw(s, GOOD_HEADER, "{}", "", "{}", &err), JP_ERR_JSON);
    assert_int_equal(decode_raw(s, "{\"msg_type\":\"x\"}", "{}", "{}", "{}", &err),
                     JP_ERR_FIELD_MISSING);
    assert_non_null(strstr(err.reason, "msg_id"));
    assert_int_equal(decode_raw(s, "{\"msg_id\":\"x\"}", "{}", "{}", "{}", &err),
                     JP_ERR_FIELD_MISSING);
    assert_non_null(strstr(err.reason, "msg_type"));
    assert_int_equal(decode_raw(s, "{\"msg_id\":\"x\",\"msg_type\":5}", "{}", "{}", "{}", &err),
                     JP_ERR_FIELD_TYPE);
    assert_int_equal(decode_raw(s, "{\"msg_id\":null,\"msg_type\":\"a\"}", "{}", "{}", "{}", &err),
                     JP_ERR_FIELD_TYPE);
    assert_int_equal(decode_raw(s, "[]", "{}", "{}", "{}", &err), JP_ERR_FIELD_TYPE);
    assert_int_equal(decode_raw(s, GOOD_HEADER, "null", "{}", "{}", &err), JP_ERR_FIELD_TYPE);
    assert_int_equal(decode_raw(s, GOOD_HEADER, "{}", "7", "{}", &err), JP_ERR_FIELD_TYPE);
    assert_int_equal(decode_raw(s, GOOD_HEADER, "{}", "{}", "\"str\"", &err), JP_ERR_FIELD_TYPE);
    assert_non_null(strstr(err.reason, "content"));
    /* Deep nesting is refused by the parser, not by the stack. */
    char deep[20001];
    memset(deep, '[', 20000);
    deep[20000] = '\0';
    assert_int_equal(decode_raw(s, GOOD_HEADER, "{}", "{}", deep, &err), JP_ERR_JSON);
    jp_session_destroy(&s);
}

static void test_replay_rejected_and_bounded(void **state)
{
    (void)state;
    jp_session *s = session(KEY);
    jp_error err;
    char h[3][128];
    size_t n[3];
    jp_frame *f[3];
    for (int i = 0; i < 3; i++) {
        snprintf(h[i], sizeof h[i], "{\"msg_id\":\"m%d\",\"msg_type\":\"status\"}", i);
        f[i] = raw_message(s, h[i], "{}", "{}", "{}", NULL, &n[i]);
    }
    jmsg *m = NULL;
    assert_int_equal(jp_session_decode(s, f[0], n[0], &m, &err), JP_OK);
    jmsg_destroy(&m);
    assert_int_equal(jp_session_decode(s, f[0], n[0], &m, &err), JP_ERR_REPLAY);
    assert_null(m);
    assert_non_null(strstr(err.reason, "replay"));

    /* Capacity 2: after two newer messages the first is forgotten. */
    jp_session_set_replay_capacity(s, 2);
    assert_int_equal(jp_session_decode(s, f[0], n[0], &m, &err), JP_ERR_REPLAY);
    assert_int_equal(jp_session_decode(s, f[1], n[1], &m, &err), JP_OK);
    jmsg_destroy(&m);
    assert_int_equal(jp_session_decode(s, f[2], n[2], &m, &err), JP_OK);
    jmsg_destroy(&m);
    assert_int_equal(jp_session_decode(s, f[1], n[1], &m, &err), JP_ERR_REPLAY);
    assert_int_equal(jp_session_decode(s, f[2], n[2], &m, &err), JP_ERR_REPLAY);
    assert_int_equal(jp_session_decode(s, f[0], n[0], &m, &err), JP_OK);
    jmsg_destroy(&m);
    /* Shrinking keeps the newest (m0), forgets m2. */
    jp_session_set_replay_capacity(s, 1);
    assert_int_equal(jp_session_decode(s, f[0], n[0], &m, &err), JP_ERR_REPLAY);
    assert_int_equal(jp_session_decode(s, f[2], n[2], &m, &err), JP_OK);
    jmsg_destroy(&m);
    /* Growing keeps everything. */
    jp_session_set_replay_capacity(s, 0);
    assert_int_equal(jp_session_decode(s, f[2], n[2], &m, &err), JP_ERR_REPLAY);
    jp_session_set_replay_capacity(NULL, 3);
    for (int i = 0; i < 3; i++)
        jp_frames_free(&f[i], n[i]);
    jp_session_destroy(&s);
}

static void test_failed_message_not_remembered(void **state)
{
    (void)state;
    jp_session *s = session(KEY);
    jp_error err;
    size_t n;
    jp_frame *f = raw_message(s, GOOD_HEADER, "{}", "{}", "{\"a\":1}", NULL, &n);
    jmsg *m = NULL;
    /* Tampered copy fails; the genuine one is then accepted. */
    char *saved = f[5].data;
    f[5].data = "{\"a\":2}";
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_ERR_SIG_MISMATCH);
    f[5].data = saved;
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_OK);
    jmsg_destroy(&m);
    jp_frames_free(&f, n);
    jp_session_destroy(&s);
}

static void test_many_signatures_in_replay_cache(void **state)
{
    (void)state;
    /* More messages than the default capacity: the ring wraps. */
    jp_session *s = session(KEY);
    jp_session_set_replay_capacity(s, 100);
    jp_error err;
    jp_frame *first = NULL;
    size_t first_n = 0;
    for (int i = 0; i < 250; i++) {
        char h[128];
        snprintf(h, sizeof h, "{\"msg_id\":\"id-%d\",\"msg_type\":\"t\"}", i);
        size_t n;
        jp_frame *f = raw_message(s, h, "{}", "{}", "{}", NULL, &n);
        jmsg *m = NULL;
        assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_OK);
        jmsg_destroy(&m);
        assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_ERR_REPLAY);
        if (i == 0) {
            first = f;
            first_n = n;
        } else {
            jp_frames_free(&f, n);
        }
    }
    jmsg *m = NULL;
    assert_int_equal(jp_session_decode(s, first, first_n, &m, &err), JP_OK);
    jmsg_destroy(&m);
    jp_frames_free(&first, first_n);
    jp_session_destroy(&s);
}

static void test_empty_key_skips_signature(void **state)
{
    (void)state;
    jp_session *s = jp_session_new("", 0, NULL, NULL);
    jp_error err;
    size_t n;
    jp_frame *f = raw_message(s, GOOD_HEADER, "{}", "{}", "{}", "whatever", &n);
    jmsg *m = NULL;
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_OK);
    jmsg_destroy(&m);
    /* No signature, no replay cache: the same message twice is fine. */
    assert_int_equal(jp_session_decode(s, f, n, &m, &err), JP_OK);
    jmsg_destroy(&m);
    jp_frames_free(&f, n);

    jmsg *out = jmsg_new("x", "s", "u", NULL);
    assert_int_equal(jp_session_encode(s, out, &f, &n, &err), JP_OK);
    assert_int_equal(f[1].size, 0);
    jp_frames_free(&f, n);
    jmsg_destroy(&out);
    jp_session_destroy(&s);
}

static void test_ids_and_delimiter_position(void **state)
{
    (void)state;
    /* Routing ids before the delimiter are kept; an id that looks like JSON
     * does not confuse the framing. */
    jp_session *s = session(KEY);
    size_t n;
    jp_frame *inner = raw_message(s, GOOD_HEADER, "{}", "{}", "{}", NULL, &n);
    jp_frame *f = calloc(n + 3, sizeof *f);
    f[0] = frame_str("{}");
    f[1] = frame_str("");
    memcpy(f + 2, inner, n * sizeof *f);
    f[n + 2] = frame_str("buf");
    free(inner);
    jmsg *m = NULL;
    jp_error err;
    assert_int_equal(jp_session_decode(s, f, n + 3, &m, &err), JP_OK);
    assert_int_equal(m->n_ids, 2);
    assert_int_equal(m->ids[1].size, 0);
    assert_int_equal(m->n_buffers, 1);
    assert_memory_equal(m->buffers[0].data, "buf", 3);
    jmsg_destroy(&m);
    jp_frames_free(&f, n + 3);
    jp_session_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_schemes_and_args),
        cmocka_unit_test(test_sign_known_vector),
        cmocka_unit_test(test_encode_decode_roundtrip),
        cmocka_unit_test(test_encode_errors),
        cmocka_unit_test(test_decode_limits),
        cmocka_unit_test(test_decode_framing_errors),
        cmocka_unit_test(test_decode_checks_signature_before_parsing),
        cmocka_unit_test(test_decode_content_errors),
        cmocka_unit_test(test_replay_rejected_and_bounded),
        cmocka_unit_test(test_failed_message_not_remembered),
        cmocka_unit_test(test_many_signatures_in_replay_cache),
        cmocka_unit_test(test_empty_key_skips_signature),
        cmocka_unit_test(test_ids_and_delimiter_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
