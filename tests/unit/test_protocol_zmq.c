/* Unit tests for protocol/jp_zmq.c: whole-message send/recv over real
 * ZeroMQ sockets (inproc), draining of rejected messages, non-blocking use. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "jp.h"

#define KEY "zmq-test-key"

struct fixture {
    void *ctx;
    void *router; /* "kernel" side */
    void *dealer; /* "client" side */
    jp_session *ks;
    jp_session *cs;
};

static int setup(void **state)
{
    struct fixture *fx = calloc(1, sizeof *fx);
    fx->ctx = zmq_ctx_new();
    fx->router = zmq_socket(fx->ctx, ZMQ_ROUTER);
    fx->dealer = zmq_socket(fx->ctx, ZMQ_DEALER);
    int zero = 0, timeout = 5000;
    zmq_setsockopt(fx->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(fx->dealer, ZMQ_LINGER, &zero, sizeof zero);
    /* Blocking receives in tests must never hang the suite. */
    zmq_setsockopt(fx->router, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(fx->dealer, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_setsockopt(fx->dealer, ZMQ_ROUTING_ID, "client-1", 8);
    *state = fx;
    if (zmq_bind(fx->router, "inproc://jp-test") != 0 ||
        zmq_connect(fx->dealer, "inproc://jp-test") != 0)
        return -1;
    fx->ks = jp_session_new(KEY, strlen(KEY), NULL, NULL);
    fx->cs = jp_session_new(KEY, strlen(KEY), NULL, NULL);
    return 0;
}

static int teardown(void **state)
{
    struct fixture *fx = *state;
    jp_session_destroy(&fx->ks);
    jp_session_destroy(&fx->cs);
    zmq_close(fx->router);
    zmq_close(fx->dealer);
    zmq_ctx_term(fx->ctx);
    free(fx);
    return 0;
}

static void send_parts(void *sock, const char *const *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_true(zmq_send(sock, parts[i], strlen(parts[i]), i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

/* A good request from the client, so we can check the socket is in sync. */
static void roundtrip_ok(struct fixture *fx, const char *tag)
{
    jmsg *req = jmsg_new("kernel_info_request", "client", "u", NULL);
    jmsg_set_content(req, json_pack("{s:s}", "tag", tag));
    jp_error err;
    assert_int_equal(jp_session_send(fx->cs, fx->dealer, req, 0, &err), JP_OK);
    jmsg *got = NULL;
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &got, &err), JP_OK);
    assert_string_equal(json_string_value(json_object_get(got->content, "tag")), tag);
    assert_string_equal(jmsg_id(got), jmsg_id(req));
    jmsg_destroy(&got);
    jmsg_destroy(&req);
}

static void test_request_reply_with_routing_and_buffers(void **state)
{
    struct fixture *fx = *state;
    jmsg *req = jmsg_new("comm_msg", "client", "u", NULL);
    jmsg_set_content(req, json_pack("{s:s}", "comm_id", "c1"));
    char big[200000];
    for (size_t i = 0; i < sizeof big; i++)
        big[i] = (char)(i * 7);
    jmsg_add_buffer(req, big, sizeof big);
    jmsg_add_buffer(req, NULL, 0);
    jp_error err;
    assert_int_equal(jp_session_send(fx->cs, fx->dealer, req, ZMQ_DONTWAIT, &err), JP_OK);

    jmsg *got = NULL;
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &got, &err), JP_OK);
    assert_int_equal(got->n_ids, 1);
    assert_int_equal(got->ids[0].size, 8);
    assert_memory_equal(got->ids[0].data, "client-1", 8);
    assert_int_equal(got->n_buffers, 2);
    assert_int_equal(got->buffers[0].size, sizeof big);
    assert_memory_equal(got->buffers[0].data, big, sizeof big);
    assert_int_equal(got->buffers[1].size, 0);

    /* The reply carries the ids back to the dealer. */
    jmsg *rep = jmsg_new("comm_msg_reply", "kernel", NULL, got);
    assert_int_equal(jp_session_send(fx->ks, fx->router, rep, 0, &err), JP_OK);
    jmsg *back = NULL;
    assert_int_equal(jp_session_recv(fx->cs, fx->dealer, 0, &back, &err), JP_OK);
    assert_int_equal(back->n_ids, 0);
    assert_string_equal(jmsg_type(back), "comm_msg_reply");
    assert_string_equal(json_string_value(json_object_get(back->parent_header, "msg_id")),
                        jmsg_id(req));
    jmsg_destroy(&back);
    jmsg_destroy(&rep);
    jmsg_destroy(&got);
    jmsg_destroy(&req);
}

static void test_nonblocking_recv_nothing_waiting(void **state)
{
    struct fixture *fx = *state;
    jmsg *m = (jmsg *)0x1;
    jp_error err;
    assert_int_equal(jp_session_recv(fx->ks, fx->router, ZMQ_DONTWAIT, &m, &err), JP_ERR_AGAIN);
    assert_null(m);
    assert_int_equal(err.code, JP_ERR_AGAIN);
}

static void test_nonblocking_send_would_block(void **state)
{
    (void)state;
    /* A DEALER without peers cannot queue anything. */
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    jp_session *s = jp_session_new(KEY, strlen(KEY), NULL, NULL);
    jmsg *m = jmsg_new("x", "s", "u", NULL);
    jp_error err;
    assert_int_equal(jp_session_send(s, d, m, ZMQ_DONTWAIT, &err), JP_ERR_AGAIN);
    jmsg_destroy(&m);
    jp_session_destroy(&s);
    zmq_close(d);
    zmq_ctx_term(ctx);
}

static void test_zmq_errors_and_args(void **state)
{
    struct fixture *fx = *state;
    jp_error err;
    jmsg *m = jmsg_new("x", "s", "u", NULL);
    /* PUB cannot receive, SUB cannot send: libzmq errors come through. */
    void *pub = zmq_socket(fx->ctx, ZMQ_PUB);
    void *sub = zmq_socket(fx->ctx, ZMQ_SUB);
    jmsg *got = NULL;
    assert_int_equal(jp_session_recv(fx->ks, pub, 0, &got, &err), JP_ERR_ZMQ);
    assert_true(strlen(err.reason) > 0);
    assert_int_equal(jp_session_send(fx->ks, sub, m, 0, &err), JP_ERR_ZMQ);
    zmq_close(pub);
    zmq_close(sub);
    assert_int_equal(jp_session_send(NULL, fx->dealer, m, 0, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_send(fx->cs, NULL, m, 0, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_send(fx->cs, fx->dealer, NULL, 0, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_send(fx->cs, fx->dealer, m, ZMQ_SNDMORE, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, NULL, &err), JP_ERR_ARG);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 12345, &got, &err), JP_ERR_ARG);
    /* Encode errors pass through send. */
    json_decref(m->header);
    m->header = json_array();
    assert_int_equal(jp_session_send(fx->cs, fx->dealer, m, 0, &err), JP_ERR_FIELD_TYPE);
    jmsg_destroy(&m);
    roundtrip_ok(fx, "after-errors");
}

static void test_rejected_messages_are_drained(void **state)
{
    struct fixture *fx = *state;
    jp_error err;
    jmsg *m = NULL;

    const char *no_delim[] = {"a", "b", "c", "d", "e", "f", "g"};
    send_parts(fx->dealer, no_delim, 7);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &m, &err), JP_ERR_NO_DELIMITER);
    roundtrip_ok(fx, "1");

    const char *short_msg[] = {JP_DELIMITER, "sig", "{}"};
    send_parts(fx->dealer, short_msg, 3);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &m, &err), JP_ERR_FRAME_COUNT);
    roundtrip_ok(fx, "2");

    const char *forged[] = {JP_DELIMITER,
                            "0000000000000000000000000000000000000000000000000000000000000000",
                            "{\"msg_id\":\"x\",\"msg_type\":\"shutdown_request\"}",
                            "{}",
                            "{}",
                            "{}",
                            "extra buffer"};
    send_parts(fx->dealer, forged, 7);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &m, &err), JP_ERR_SIG_MISMATCH);
    assert_null(m);
    roundtrip_ok(fx, "3");
}

static void test_oversized_messages_discarded(void **state)
{
    struct fixture *fx = *state;
    jp_error err;
    jmsg *m = NULL;
    jp_session_set_max_bytes(fx->ks, 4096);
    jmsg *big = jmsg_new("x", "s", "u", NULL);
    char *blob = calloc(1, 10000);
    jmsg_add_buffer(big, blob, 10000);
    jmsg_add_buffer(big, blob, 10);
    free(blob);
    assert_int_equal(jp_session_send(fx->cs, fx->dealer, big, 0, &err), JP_OK);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &m, &err), JP_ERR_TOO_LARGE);
    assert_null(m);
    roundtrip_ok(fx, "after-large");
    jp_session_set_max_bytes(fx->ks, 0);

    jp_session_set_max_frames(fx->ks, 8);
    for (int i = 0; i < 5; i++)
        jmsg_add_buffer(big, "b", 1);
    assert_int_equal(jp_session_send(fx->cs, fx->dealer, big, 0, &err), JP_OK);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &m, &err), JP_ERR_TOO_MANY_FRAMES);
    roundtrip_ok(fx, "after-many");
    jp_session_set_max_frames(fx->ks, 0);
    jmsg_destroy(&big);
}

static void test_replay_over_the_wire(void **state)
{
    struct fixture *fx = *state;
    jp_error err;
    jmsg *req = jmsg_new("execute_request", "client", "u", NULL);
    jp_frame *f;
    size_t n;
    assert_int_equal(jp_session_encode(fx->cs, req, &f, &n, &err), JP_OK);
    for (int round = 0; round < 2; round++)
        for (size_t i = 0; i < n; i++)
            zmq_send(fx->dealer, f[i].data, f[i].size, i + 1 < n ? ZMQ_SNDMORE : 0);
    jmsg *m = NULL;
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &m, &err), JP_OK);
    jmsg_destroy(&m);
    assert_int_equal(jp_session_recv(fx->ks, fx->router, 0, &m, &err), JP_ERR_REPLAY);
    roundtrip_ok(fx, "after-replay");
    jp_frames_free(&f, n);
    jmsg_destroy(&req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_request_reply_with_routing_and_buffers, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_nonblocking_recv_nothing_waiting, setup, teardown),
        cmocka_unit_test(test_nonblocking_send_would_block),
        cmocka_unit_test_setup_teardown(test_zmq_errors_and_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rejected_messages_are_drained, setup, teardown),
        cmocka_unit_test_setup_teardown(test_oversized_messages_discarded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_replay_over_the_wire, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
