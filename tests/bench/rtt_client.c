/*
 * rtt_client.c — the benchmark's own Jupyter client, written on protocol/jp.h
 * the way kernelmgr talks to its kernels: a DEALER on shell, a SUB on iopub.
 *
 * It times one execute_request from send to the moment both its
 * execute_reply and its status:idle have arrived, which is what a caller of
 * code_exec waits for. Python clients add hundreds of microseconds of their
 * own per message; this one measures the kernel.
 *
 *   rtt_client CONNECTION_FILE CODE ITERATIONS [WARMUP [TIMEOUT_SECONDS]]
 *
 * Prints one JSON object on stdout:
 *   {"n":N,"lat_us":[...],"stream_bytes":B,"newlines":L,"iopub_msgs":M,
 *    "status":"ok"|"error", "ready_us":T}
 * ready_us is the time until the kernel first answered (iopub connected).
 * Exit status 0, 1 on a kernel/protocol error or timeout (reason on stderr),
 * 2 on usage errors.
 */
#include "protocol/jp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

typedef struct rtt_client {
    void *ctx, *shell, *iopub;
    jp_session *session;
    char session_id[37];
    double timeout_s;
} rtt_client;

static double rtt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void rtt_die(const char *what, const char *reason)
{
    fprintf(stderr, "rtt_client: %s: %s\n", what, reason);
    exit(1);
}

static void *rtt_socket(rtt_client *c, int type, const jp_connection *conn, jp_channel ch)
{
    char ep[600];
    void *s = zmq_socket(c->ctx, type);
    if (!s)
        rtt_die("zmq_socket", zmq_strerror(zmq_errno()));
    int linger = 0, ivl = 2;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    /* The kernel may not have bound yet: retry fast rather than every 100 ms. */
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
    if (type == ZMQ_SUB)
        zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    if (jp_connection_endpoint(conn, ch, ep, sizeof ep) || zmq_connect(s, ep))
        rtt_die("connect", ep);
    return s;
}

static jmsg *rtt_request(rtt_client *c, const char *type, json_t *content)
{
    jmsg *m = jmsg_new(type, c->session_id, "bench", NULL);
    if (!m || jmsg_set_content(m, content))
        rtt_die("jmsg_new", "out of memory");
    jp_error err;
    if (jp_session_send(c->session, c->shell, m, 0, &err) != JP_OK)
        rtt_die("send", err.reason);
    return m;
}

static int rtt_is_child_of(const jmsg *m, const char *msg_id)
{
    const char *p = json_string_value(json_object_get(m->parent_header, "msg_id"));
    return p && !strcmp(p, msg_id);
}

/* Waits up to the timeout for a message on either socket. Returns the socket
 * that has one, or NULL on timeout. */
static void *rtt_wait(rtt_client *c, double deadline)
{
    zmq_pollitem_t items[2] = {{c->shell, 0, ZMQ_POLLIN, 0}, {c->iopub, 0, ZMQ_POLLIN, 0}};
    for (;;) {
        double left = deadline - rtt_now();
        if (left <= 0)
            return NULL;
        int rc = zmq_poll(items, 2, (long)(left * 1000) + 1);
        if (rc < 0 && zmq_errno() == EINTR)
            continue;
        if (rc < 0)
            rtt_die("zmq_poll", zmq_strerror(zmq_errno()));
        if (items[1].revents & ZMQ_POLLIN)
            return c->iopub; /* iopub first: output must not pile up */
        if (items[0].revents & ZMQ_POLLIN)
            return c->shell;
    }
}

typedef struct rtt_counts {
    size_t stream_bytes, newlines, iopub_msgs;
    int error;
} rtt_counts;

/* Receives until both the reply to msg_id and its idle arrived. */
static int rtt_collect(rtt_client *c, const char *msg_id, rtt_counts *k)
{
    int got_reply = 0, got_idle = 0;
    double deadline = rtt_now() + c->timeout_s;
    while (!(got_reply && got_idle)) {
        void *s = rtt_wait(c, deadline);
        if (!s)
            return -1;
        jmsg *m = NULL;
        jp_error err;
        if (jp_session_recv(c->session, s, 0, &m, &err) != JP_OK) {
            if (err.code == JP_ERR_AGAIN)
                continue;
            rtt_die("recv", err.reason);
        }
        if (rtt_is_child_of(m, msg_id)) {
            const char *t = jmsg_type(m);
            if (s == c->shell) {
                got_reply = 1;
                const char *st = json_string_value(json_object_get(m->content, "status"));
                if (!st || strcmp(st, "ok"))
                    k->error = 1;
            } else {
                k->iopub_msgs++;
                if (!strcmp(t, "stream")) {
                    const char *txt = json_string_value(json_object_get(m->content, "text"));
                    size_t n = json_string_length(json_object_get(m->content, "text"));
                    k->stream_bytes += n;
                    for (size_t i = 0; txt && i < n; i++)
                        k->newlines += txt[i] == '\n';
                } else if (!strcmp(t, "status")) {
                    const char *st =
                        json_string_value(json_object_get(m->content, "execution_state"));
                    if (st && !strcmp(st, "idle"))
                        got_idle = 1;
                } else if (!strcmp(t, "error")) {
                    k->error = 1;
                }
            }
        }
        jmsg_destroy(&m);
    }
    return 0;
}

/* A SUB socket misses what was published before it connected: poke the
 * kernel with kernel_info_request until its iopub answers, then drain the
 * replies so the timed loop starts clean. */
static void rtt_wait_ready(rtt_client *c)
{
    double deadline = rtt_now() + c->timeout_s;
    int sent = 0, replies = 0, iopub_seen = 0;
    double next_send = 0;
    while (!iopub_seen) {
        double now = rtt_now();
        if (now > deadline)
            rtt_die("startup", "the kernel did not answer on shell and iopub in time");
        if (now >= next_send) {
            jmsg *m = rtt_request(c, "kernel_info_request", json_object());
            jmsg_destroy(&m);
            sent++;
            next_send = now + 0.05;
        }
        zmq_pollitem_t items[2] = {{c->shell, 0, ZMQ_POLLIN, 0}, {c->iopub, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 2, 10) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            jmsg *m = NULL;
            jp_error err;
            if (jp_session_recv(c->session, items[i].socket, 0, &m, &err) == JP_OK) {
                if (i == 0)
                    replies++;
                else
                    iopub_seen = 1;
            }
            jmsg_destroy(&m);
        }
    }
    /* every kernel_info_request gets a reply; the rest of iopub is noise */
    double drain_until = rtt_now() + c->timeout_s;
    while (replies < sent && rtt_now() < drain_until) {
        void *s = rtt_wait(c, drain_until);
        if (!s)
            break;
        jmsg *m = NULL;
        jp_error err;
        if (jp_session_recv(c->session, s, 0, &m, &err) == JP_OK && s == c->shell)
            replies++;
        jmsg_destroy(&m);
    }
    /* let the idle of the last request arrive, then drop it */
    double quiet = rtt_now() + 0.05;
    void *s;
    while ((s = rtt_wait(c, quiet))) {
        jmsg *m = NULL;
        jp_error err;
        jp_session_recv(c->session, s, 0, &m, &err);
        jmsg_destroy(&m);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4 || argc > 6) {
        fprintf(stderr,
                "usage: rtt_client CONNECTION_FILE CODE ITERATIONS [WARMUP [TIMEOUT_SECONDS]]\n");
        return 2;
    }
    long iters = strtol(argv[3], NULL, 10);
    long warmup = argc > 4 ? strtol(argv[4], NULL, 10) : 5;
    double timeout_s = argc > 5 ? strtod(argv[5], NULL) : 60;
    if (iters < 1 || iters > 10000000 || warmup < 0 || timeout_s <= 0) {
        fprintf(stderr, "rtt_client: ITERATIONS >= 1, WARMUP >= 0, TIMEOUT > 0\n");
        return 2;
    }
    jp_connection conn;
    jp_error err;
    if (jp_connection_read(argv[1], &conn, &err) != JP_OK)
        rtt_die(argv[1], err.reason);

    rtt_client c = {0};
    c.timeout_s = timeout_s;
    jp_uuid4(c.session_id);
    c.session = jp_session_new(conn.key, strlen(conn.key), conn.signature_scheme, &err);
    if (!c.session)
        rtt_die("session", err.reason);
    /* a replayed signature would be a bug in the kernel, but a benchmark
     * must not trip over its own bounded cache: keep the default size */
    c.ctx = zmq_ctx_new();
    c.shell = rtt_socket(&c, ZMQ_DEALER, &conn, JP_SHELL);
    c.iopub = rtt_socket(&c, ZMQ_SUB, &conn, JP_IOPUB);

    double t0 = rtt_now();
    rtt_wait_ready(&c);
    double ready_us = (rtt_now() - t0) * 1e6;

    double *lat = calloc((size_t)iters, sizeof *lat);
    if (!lat)
        rtt_die("calloc", "out of memory");
    rtt_counts total = {0};
    for (long i = 0; i < warmup + iters; i++) {
        rtt_counts k = {0};
        json_t *content =
            json_pack("{s:s s:b s:b s:{} s:b s:b}", "code", argv[2], "silent", 0, "store_history",
                      1, "user_expressions", "allow_stdin", 0, "stop_on_error", 1);
        double s = rtt_now();
        jmsg *req = rtt_request(&c, "execute_request", content);
        if (rtt_collect(&c, jmsg_id(req), &k))
            rtt_die("execute", "no execute_reply + idle before the timeout");
        double e = rtt_now();
        jmsg_destroy(&req);
        if (i >= warmup) {
            lat[i - warmup] = (e - s) * 1e6;
            total.stream_bytes += k.stream_bytes;
            total.newlines += k.newlines;
            total.iopub_msgs += k.iopub_msgs;
            total.error |= k.error;
        }
    }

    printf("{\"n\":%ld,\"ready_us\":%.1f,\"stream_bytes\":%zu,\"newlines\":%zu,"
           "\"iopub_msgs\":%zu,\"status\":\"%s\",\"lat_us\":[",
           iters, ready_us, total.stream_bytes, total.newlines, total.iopub_msgs,
           total.error ? "error" : "ok");
    for (long i = 0; i < iters; i++)
        printf("%s%.1f", i ? "," : "", lat[i]);
    printf("]}\n");

    free(lat);
    zmq_close(c.shell);
    zmq_close(c.iopub);
    zmq_ctx_term(c.ctx);
    jp_session_destroy(&c.session);
    return 0;
}
