/* Unit tests of kernelmgr/gwwire.c: the kernel WebSocket message forms.
 * The byte layouts are the ones jupyter_server writes and reads
 * (serialize_binary_message, serialize_msg_to_ws_v1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/frontends/gwwire.h"

static jmsg *sample(int nbuf)
{
    jmsg *m = jmsg_new("execute_request", "sess", "user", NULL);
    assert_non_null(m);
    assert_int_equal(jmsg_set_content(m, json_pack("{s:s}", "code", "x = 1")), 0);
    for (int i = 0; i < nbuf; i++) {
        char b[3] = {'b', (char)('0' + i), 0};
        assert_int_equal(jmsg_add_buffer(m, b, (size_t)(i + 1)), 0);
    }
    return m;
}

static void same(const jmsg *a, const jmsg *b)
{
    assert_true(json_equal(a->header, b->header));
    assert_true(json_equal(a->parent_header, b->parent_header));
    assert_true(json_equal(a->metadata, b->metadata));
    assert_true(json_equal(a->content, b->content));
    assert_int_equal(a->n_buffers, b->n_buffers);
    for (size_t i = 0; i < a->n_buffers; i++) {
        assert_int_equal(a->buffers[i].size, b->buffers[i].size);
        assert_memory_equal(a->buffers[i].data, b->buffers[i].data, a->buffers[i].size);
    }
}

/* Encoding is for kernel messages (any channel); decoding takes client ones
 * (shell/control/stdin): a round trip on shell and control. */
static void round_trips(void **state)
{
    (void)state;
    gw_form forms[] = {GW_FORM_JSON, GW_FORM_V1};
    jp_channel chans[] = {JP_SHELL, JP_CONTROL, JP_STDIN};
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 3; c++)
            for (int nb = 0; nb < 3; nb++) {
                jmsg *m = sample(nb);
                unsigned char *data;
                size_t len;
                int binary;
                assert_int_equal(gwwire_encode(forms[f], chans[c], m, &data, &len, &binary), 0);
                assert_int_equal(binary, forms[f] == GW_FORM_V1 || nb > 0);
                jp_channel ch;
                jmsg *back = NULL;
                km_err err = {0};
                if (gwwire_decode(forms[f], binary, data, len, &ch, &back, &err))
                    fail_msg("form %d chan %d nbuf %d: %s", f, c, nb, err.msg);
                assert_int_equal(ch, chans[c]);
                same(m, back);
                jmsg_destroy(&back);
                jmsg_destroy(&m);
                free(data);
            }
}

static void json_form_fields(void **state)
{
    (void)state;
    jmsg *m = sample(0);
    unsigned char *data;
    size_t len;
    int binary;
    assert_int_equal(gwwire_encode(GW_FORM_JSON, JP_IOPUB, m, &data, &len, &binary), 0);
    json_t *o = json_loadb((const char *)data, len, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "channel")), "iopub");
    assert_string_equal(json_string_value(json_object_get(o, "msg_type")), "execute_request");
    assert_string_equal(json_string_value(json_object_get(o, "msg_id")), jmsg_id(m));
    assert_true(json_is_array(json_object_get(o, "buffers")));
    json_decref(o);
    free(data);
    jmsg_destroy(&m);
}

/* What jupyter_server's serialize_binary_message writes for a 2-buffer
 * message, built by hand: u32be count 3, offsets 16, 16+len(json), ... */
static void legacy_binary_layout(void **state)
{
    (void)state;
    const char *js = "{\"header\":{\"msg_id\":\"a\",\"msg_type\":\"comm_msg\"},"
                     "\"parent_header\":{},\"metadata\":{},\"content\":{},\"channel\":\"shell\"}";
    size_t jl = strlen(js), total = 16 + jl + 2 + 3;
    unsigned char *b = malloc(total);
    uint32_t vals[4] = {3, 16, (uint32_t)(16 + jl), (uint32_t)(16 + jl + 2)};
    for (int i = 0; i < 4; i++) {
        b[4 * i] = (unsigned char)(vals[i] >> 24);
        b[4 * i + 1] = (unsigned char)(vals[i] >> 16);
        b[4 * i + 2] = (unsigned char)(vals[i] >> 8);
        b[4 * i + 3] = (unsigned char)vals[i];
    }
    memcpy(b + 16, js, jl);
    memcpy(b + 16 + jl, "ab", 2);
    memcpy(b + 16 + jl + 2, "cde", 3);
    jp_channel ch;
    jmsg *m = NULL;
    km_err err = {0};
    assert_int_equal(gwwire_decode(GW_FORM_JSON, 1, b, total, &ch, &m, &err), 0);
    assert_int_equal(m->n_buffers, 2);
    assert_memory_equal(m->buffers[0].data, "ab", 2);
    assert_memory_equal(m->buffers[1].data, "cde", 3);
    assert_string_equal(jmsg_type(m), "comm_msg");
    jmsg_destroy(&m);
    /* an offset past the end, or going backwards, is refused */
    b[8 + 3] = 0xff;
    assert_int_equal(gwwire_decode(GW_FORM_JSON, 1, b, total, &ch, &m, &err), -1);
    assert_null(m);
    assert_non_null(strstr(err.msg, "offsets"));
    free(b);
}

static void expect_refused(gw_form form, int binary, const char *data, size_t len, const char *why)
{
    jp_channel ch;
    jmsg *m = NULL;
    km_err err = {0};
    assert_int_equal(gwwire_decode(form, binary, data, len, &ch, &m, &err), -1);
    assert_null(m);
    if (!strstr(err.msg, why))
        fail_msg("reason \"%s\" does not name \"%s\"", err.msg, why);
}

#define S(lit) lit, sizeof(lit) - 1

static void refusals(void **state)
{
    (void)state;
    expect_refused(GW_FORM_JSON, 0, S("not json"), "not JSON");
    expect_refused(GW_FORM_JSON, 0, S("[1]"), "not a JSON object");
    expect_refused(GW_FORM_JSON, 0, S("{\"header\":{}}"), "header.msg_id");
    expect_refused(GW_FORM_JSON, 0, S("{\"header\":{\"msg_id\":\"a\"}}"), "header.msg_type");
    expect_refused(GW_FORM_JSON, 0, S("{\"header\":1}"), "header");
    expect_refused(GW_FORM_JSON, 0,
                   S("{\"header\":{\"msg_id\":\"a\",\"msg_type\":\"t\"},\"content\":[]}"),
                   "content");
    expect_refused(GW_FORM_JSON, 0,
                   S("{\"header\":{\"msg_id\":\"a\",\"msg_type\":\"t\"},\"channel\":\"iopub\"}"),
                   "channel \"iopub\"");
    expect_refused(GW_FORM_JSON, 0,
                   S("{\"header\":{\"msg_id\":\"a\",\"msg_type\":\"t\"},\"buffers\":[\"x\"]}"),
                   "binary frame");
    expect_refused(GW_FORM_JSON, 0, S("\xff\xfe"), "UTF-8");
    expect_refused(GW_FORM_JSON, 1, S("\x00\x00"), "too short");
    expect_refused(GW_FORM_JSON, 1, S("\xff\xff\xff\xff\x00\x00\x00\x08"), "part count");
    expect_refused(GW_FORM_V1, 0, S("{}"), "binary frames only");
    expect_refused(GW_FORM_V1, 1, S("\x02\x00\x00\x00\x00\x00\x00\x00"), "offset count");
    expect_refused(GW_FORM_V1, 1, S("\xff\xff\xff\xff\xff\xff\xff\xff"), "offset count");
}

static void v1_channel_checked(void **state)
{
    (void)state;
    jmsg *m = sample(1);
    unsigned char *data;
    size_t len;
    int binary;
    /* a message "from the client" on iopub: encoded (kernel direction) then
     * decoded (client direction) must be refused */
    assert_int_equal(gwwire_encode(GW_FORM_V1, JP_IOPUB, m, &data, &len, &binary), 0);
    jp_channel ch;
    jmsg *back = NULL;
    km_err err = {0};
    assert_int_equal(gwwire_decode(GW_FORM_V1, 1, data, len, &ch, &back, &err), -1);
    assert_non_null(strstr(err.msg, "iopub"));
    /* truncated by one byte: the last offset no longer matches */
    assert_int_equal(gwwire_decode(GW_FORM_V1, 1, data, len - 1, &ch, &back, &err), -1);
    free(data);
    jmsg_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trips),          cmocka_unit_test(json_form_fields),
        cmocka_unit_test(legacy_binary_layout), cmocka_unit_test(refusals),
        cmocka_unit_test(v1_channel_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
