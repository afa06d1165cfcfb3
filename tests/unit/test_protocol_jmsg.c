/* Unit tests for protocol/jmsg.c: the message model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "jp.h"

static void test_new_fills_header(void **state)
{
    (void)state;
    jmsg *m = jmsg_new("execute_request", "sess-1", "alice", NULL);
    assert_non_null(m);
    assert_string_equal(jmsg_type(m), "execute_request");
    assert_string_equal(jmsg_session(m), "sess-1");
    assert_int_equal(strlen(jmsg_id(m)), 36);
    assert_string_equal(json_string_value(json_object_get(m->header, "username")), "alice");
    assert_string_equal(json_string_value(json_object_get(m->header, "version")), "5.3");
    const char *date = json_string_value(json_object_get(m->header, "date"));
    assert_non_null(date);
    assert_int_equal(strlen(date), 27);
    assert_int_equal(date[26], 'Z');
    assert_int_equal(json_object_size(m->header), 6);
    assert_true(json_is_object(m->parent_header) && json_object_size(m->parent_header) == 0);
    assert_true(json_is_object(m->metadata) && json_object_size(m->metadata) == 0);
    assert_true(json_is_object(m->content) && json_object_size(m->content) == 0);
    assert_null(m->ids);
    assert_int_equal(m->n_ids, 0);
    assert_null(m->buffers);
    assert_int_equal(m->n_buffers, 0);
    jmsg_destroy(&m);
    assert_null(m);
}

static void test_new_defaults_and_null_type(void **state)
{
    (void)state;
    assert_null(jmsg_new(NULL, "s", "u", NULL));
    jmsg *m = jmsg_new("status", NULL, NULL, NULL);
    assert_non_null(m);
    assert_string_equal(jmsg_session(m), "");
    assert_string_equal(json_string_value(json_object_get(m->header, "username")), "kernel");
    jmsg *m2 = jmsg_new("status", NULL, NULL, NULL);
    assert_string_not_equal(jmsg_id(m), jmsg_id(m2));
    jmsg_destroy(&m);
    jmsg_destroy(&m2);
    jmsg_destroy(&m2); /* NULL-safe */
    jmsg_destroy(NULL);
}

static void test_reply_copies_parent_header_and_ids(void **state)
{
    (void)state;
    jmsg *req = jmsg_new("kernel_info_request", "client", "bob", NULL);
    jp_frame ids[2] = {{"id-one", 6}, {NULL, 0}};
    assert_int_equal(jmsg_set_ids(req, ids, 2), 0);
    jmsg *rep = jmsg_new("kernel_info_reply", "kernel", NULL, req);
    assert_non_null(rep);
    assert_true(json_equal(rep->parent_header, req->header));
    assert_ptr_not_equal(rep->parent_header, req->header); /* deep copy */
    assert_int_equal(rep->n_ids, 2);
    assert_int_equal(rep->ids[0].size, 6);
    assert_memory_equal(rep->ids[0].data, "id-one", 6);
    assert_ptr_not_equal(rep->ids[0].data, req->ids[0].data);
    assert_int_equal(rep->ids[1].size, 0);
    assert_string_not_equal(jmsg_id(rep), jmsg_id(req));
    jmsg_destroy(&req);
    /* The reply owns its copies. */
    assert_string_equal(json_string_value(json_object_get(rep->parent_header, "msg_type")),
                        "kernel_info_request");
    jmsg_destroy(&rep);
}

static void test_set_content_and_metadata(void **state)
{
    (void)state;
    jmsg *m = jmsg_new("execute_request", "s", "u", NULL);
    assert_int_equal(jmsg_set_content(m, json_pack("{s:s}", "code", "1+1")), 0);
    assert_string_equal(json_string_value(json_object_get(m->content, "code")), "1+1");
    /* Not an object: refused, and the reference is still released (valgrind). */
    assert_int_equal(jmsg_set_content(m, json_array()), -1);
    assert_int_equal(jmsg_set_content(m, NULL), -1);
    assert_string_equal(json_string_value(json_object_get(m->content, "code")), "1+1");
    assert_int_equal(jmsg_set_metadata(m, json_pack("{s:b}", "trusted", 1)), 0);
    assert_true(json_is_true(json_object_get(m->metadata, "trusted")));
    assert_int_equal(jmsg_set_metadata(m, json_string("x")), -1);
    assert_int_equal(jmsg_set_content(NULL, json_object()), -1);
    assert_int_equal(jmsg_set_metadata(NULL, json_object()), -1);
    jmsg_destroy(&m);
}

static void test_add_buffer(void **state)
{
    (void)state;
    jmsg *m = jmsg_new("comm_msg", "s", "u", NULL);
    char big[5000];
    memset(big, 0xab, sizeof big);
    assert_int_equal(jmsg_add_buffer(m, "\0\1\2", 3), 0);
    assert_int_equal(jmsg_add_buffer(m, NULL, 0), 0);
    assert_int_equal(jmsg_add_buffer(m, big, sizeof big), 0);
    assert_int_equal(jmsg_add_buffer(m, NULL, 5), -1);
    assert_int_equal(jmsg_add_buffer(NULL, "x", 1), -1);
    assert_int_equal(m->n_buffers, 3);
    assert_memory_equal(m->buffers[0].data, "\0\1\2", 3);
    assert_int_equal(m->buffers[1].size, 0);
    assert_int_equal(m->buffers[2].size, sizeof big);
    assert_memory_equal(m->buffers[2].data, big, sizeof big);
    jmsg_destroy(&m);
}

static void test_set_ids(void **state)
{
    (void)state;
    jmsg *m = jmsg_new("x", "s", "u", NULL);
    jp_frame ids[1] = {{"abc", 3}};
    assert_int_equal(jmsg_set_ids(m, ids, 1), 0);
    assert_int_equal(m->n_ids, 1);
    /* Replacing with its own ids is safe (copied before freeing). */
    assert_int_equal(jmsg_set_ids(m, m->ids, m->n_ids), 0);
    assert_memory_equal(m->ids[0].data, "abc", 3);
    jp_frame bad[1] = {{NULL, 4}};
    assert_int_equal(jmsg_set_ids(m, bad, 1), -1);
    assert_int_equal(m->n_ids, 1); /* unchanged on failure */
    assert_int_equal(jmsg_set_ids(m, NULL, 1), -1);
    assert_int_equal(jmsg_set_ids(m, NULL, 0), 0);
    assert_null(m->ids);
    assert_int_equal(m->n_ids, 0);
    assert_int_equal(jmsg_set_ids(NULL, ids, 1), -1);
    jmsg_destroy(&m);
}

static void test_accessors_on_odd_headers(void **state)
{
    (void)state;
    assert_string_equal(jmsg_type(NULL), "");
    assert_string_equal(jmsg_id(NULL), "");
    assert_string_equal(jmsg_session(NULL), "");
    jmsg *m = jmsg_new("x", "s", "u", NULL);
    json_object_set_new(m->header, "msg_type", json_integer(3));
    json_object_del(m->header, "session");
    assert_string_equal(jmsg_type(m), "");
    assert_string_equal(jmsg_session(m), "");
    json_decref(m->header);
    m->header = NULL;
    assert_string_equal(jmsg_id(m), "");
    jmsg_destroy(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_fills_header),
        cmocka_unit_test(test_new_defaults_and_null_type),
        cmocka_unit_test(test_reply_copies_parent_header_and_ids),
        cmocka_unit_test(test_set_content_and_metadata),
        cmocka_unit_test(test_add_buffer),
        cmocka_unit_test(test_set_ids),
        cmocka_unit_test(test_accessors_on_odd_headers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
