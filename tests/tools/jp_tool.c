/*
 * jp_tool — a small command-line bridge to protocol/ for the interop tests
 * (tests/e2e/test_protocol_interop.py builds it with gcc from this file and
 * the protocol/ sources). Frames travel as JSON arrays of hex strings.
 *
 *   jp_tool encode KEY   stdin {"msg_type","session","username","content",
 *                        "metadata","parent_header","ids":[hex],"buffers":[hex]}
 *                        stdout {"frames":[hex,...]}
 *   jp_tool decode KEY   stdin {"frames":[hex,...]}
 *                        stdout {"status":"ok","header",...,"buffers":[hex]}
 *                        or {"status":"error","code":N,"name":S,"reason":S}, exit 1
 *   jp_tool serve KEY ENDPOINT COUNT
 *                        binds a ROUTER, handles COUNT messages (10 s timeout each):
 *                        replies "<type>_echo" with the request's content and
 *                        buffers; prints one JSON status line per message.
 *   jp_tool conn-init PATH TRANSPORT IP
 *                        jp_connection_init + jp_connection_write; prints the fields
 *   jp_tool conn-read PATH
 *                        jp_connection_read; prints the fields or the error (exit 1)
 * KEY is used as bytes; "" disables signing.
 */
#include "jp.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static json_t *frames_to_json(const jp_frame *f, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        char *hex = malloc(f[i].size * 2 + 1);
        sodium_bin2hex(hex, f[i].size * 2 + 1, f[i].data, f[i].size);
        json_array_append_new(a, json_string(hex));
        free(hex);
    }
    return a;
}

static jp_frame *json_to_frames(json_t *a, size_t *n)
{
    *n = json_array_size(a);
    jp_frame *f = calloc(*n ? *n : 1, sizeof *f);
    for (size_t i = 0; i < *n; i++) {
        const char *hex = json_string_value(json_array_get(a, i));
        size_t len = hex ? strlen(hex) : 0;
        f[i].data = malloc(len / 2 + 1);
        if (sodium_hex2bin(f[i].data, len / 2 + 1, hex ? hex : "", len, NULL, &f[i].size, NULL)) {
            fprintf(stderr, "bad hex in frame %zu\n", i);
            exit(2);
        }
    }
    return f;
}

static void print_error(const jp_error *e)
{
    json_t *o = json_pack("{s:s, s:i, s:s, s:s}", "status", "error", "code", (int)e->code, "name",
                          jp_strerror(e->code), "reason", e->reason);
    char *s = json_dumps(o, JSON_COMPACT);
    printf("%s\n", s);
    fflush(stdout);
    free(s);
    json_decref(o);
}

static json_t *msg_to_json(const jmsg *m)
{
    return json_pack("{s:s, s:O, s:O, s:O, s:O, s:o, s:o}", "status", "ok", "header", m->header,
                     "parent_header", m->parent_header, "metadata", m->metadata, "content",
                     m->content, "ids", frames_to_json(m->ids, m->n_ids), "buffers",
                     frames_to_json(m->buffers, m->n_buffers));
}

static int cmd_encode(jp_session *s)
{
    json_error_t je;
    json_t *in = json_loadf(stdin, JSON_ALLOW_NUL, &je);
    if (!in) {
        fprintf(stderr, "stdin: %s\n", je.text);
        return 2;
    }
    jmsg *m = jmsg_new(json_string_value(json_object_get(in, "msg_type")),
                       json_string_value(json_object_get(in, "session")),
                       json_string_value(json_object_get(in, "username")), NULL);
    if (json_object_get(in, "content"))
        jmsg_set_content(m, json_incref(json_object_get(in, "content")));
    if (json_object_get(in, "metadata"))
        jmsg_set_metadata(m, json_incref(json_object_get(in, "metadata")));
    if (json_object_get(in, "parent_header")) {
        json_decref(m->parent_header);
        m->parent_header = json_incref(json_object_get(in, "parent_header"));
    }
    size_t n;
    jp_frame *f = json_to_frames(json_object_get(in, "ids"), &n);
    jmsg_set_ids(m, f, n);
    jp_frames_free(&f, n);
    f = json_to_frames(json_object_get(in, "buffers"), &n);
    for (size_t i = 0; i < n; i++)
        jmsg_add_buffer(m, f[i].data, f[i].size);
    jp_frames_free(&f, n);
    json_decref(in);

    jp_error err;
    if (jp_session_encode(s, m, &f, &n, &err) != JP_OK) {
        print_error(&err);
        jmsg_destroy(&m);
        return 1;
    }
    json_t *o = json_pack("{s:o}", "frames", frames_to_json(f, n));
    char *text = json_dumps(o, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(o);
    jp_frames_free(&f, n);
    jmsg_destroy(&m);
    return 0;
}

static int cmd_decode(jp_session *s)
{
    json_error_t je;
    json_t *in = json_loadf(stdin, JSON_ALLOW_NUL, &je);
    if (!in) {
        fprintf(stderr, "stdin: %s\n", je.text);
        return 2;
    }
    size_t n;
    jp_frame *f = json_to_frames(json_object_get(in, "frames"), &n);
    json_decref(in);
    jmsg *m = NULL;
    jp_error err;
    jp_status st = jp_session_decode(s, f, n, &m, &err);
    jp_frames_free(&f, n);
    if (st != JP_OK) {
        print_error(&err);
        return 1;
    }
    json_t *o = msg_to_json(m);
    char *text = json_dumps(o, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(o);
    jmsg_destroy(&m);
    return 0;
}

static int cmd_serve(jp_session *s, const char *endpoint, int count)
{
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    int linger = 1000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(sock, endpoint) != 0) {
        fprintf(stderr, "bind %s: %s\n", endpoint, zmq_strerror(zmq_errno()));
        return 2;
    }
    printf("{\"status\":\"listening\"}\n");
    fflush(stdout);
    int rc = 0;
    for (int i = 0; i < count; i++) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 10000) <= 0) {
            fprintf(stderr, "timeout waiting for message %d\n", i + 1);
            rc = 3;
            break;
        }
        jmsg *req = NULL;
        jp_error err;
        if (jp_session_recv(s, sock, ZMQ_DONTWAIT, &req, &err) != JP_OK) {
            print_error(&err);
            continue;
        }
        char type[128];
        snprintf(type, sizeof type, "%s_echo", jmsg_type(req));
        jmsg *rep = jmsg_new(type, jmsg_session(req), "jp_tool", req);
        jmsg_set_content(rep, json_incref(req->content));
        for (size_t b = 0; b < req->n_buffers; b++)
            jmsg_add_buffer(rep, req->buffers[b].data, req->buffers[b].size);
        json_t *o = msg_to_json(req);
        char *text = json_dumps(o, JSON_COMPACT);
        printf("%s\n", text);
        fflush(stdout);
        free(text);
        json_decref(o);
        if (jp_session_send(s, sock, rep, 0, &err) != JP_OK)
            print_error(&err);
        jmsg_destroy(&rep);
        jmsg_destroy(&req);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return rc;
}

static int print_connection(const jp_connection *c)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:[i,i,i,i,i]}", "transport", c->transport,
                          "ip", c->ip, "key", c->key, "signature_scheme", c->signature_scheme,
                          "kernel_name", c->kernel_name, "ports", c->ports[0], c->ports[1],
                          c->ports[2], c->ports[3], c->ports[4]);
    for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++) {
        char ep[300];
        jp_connection_endpoint(c, (jp_channel)ch, ep, sizeof ep);
        json_object_set_new(o, jp_channel_name((jp_channel)ch), json_string(ep));
    }
    char *text = json_dumps(o, JSON_COMPACT);
    printf("%s\n", text);
    free(text);
    json_decref(o);
    return 0;
}

static int cmd_conn(int argc, char **argv)
{
    jp_connection c;
    jp_error err;
    if (strcmp(argv[1], "conn-init") == 0 && argc == 5) {
        if (jp_connection_init(&c, argv[3], argv[4][0] ? argv[4] : NULL, "jp_tool", &err) ||
            jp_connection_write(argv[2], &c, &err)) {
            print_error(&err);
            return 1;
        }
        return print_connection(&c);
    }
    if (strcmp(argv[1], "conn-read") == 0 && argc == 3) {
        if (jp_connection_read(argv[2], &c, &err)) {
            print_error(&err);
            return 1;
        }
        return print_connection(&c);
    }
    fprintf(stderr, "usage: jp_tool conn-init PATH TRANSPORT IP | conn-read PATH\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strncmp(argv[1], "conn-", 5) == 0)
        return cmd_conn(argc, argv);
    if (argc < 3) {
        fprintf(stderr, "usage: jp_tool encode|decode KEY | serve KEY ENDPOINT COUNT\n");
        return 2;
    }
    jp_error err;
    jp_session *s = jp_session_new(argv[2], strlen(argv[2]), NULL, &err);
    if (!s) {
        print_error(&err);
        return 2;
    }
    int rc = 2;
    if (strcmp(argv[1], "encode") == 0)
        rc = cmd_encode(s);
    else if (strcmp(argv[1], "decode") == 0)
        rc = cmd_decode(s);
    else if (strcmp(argv[1], "serve") == 0 && argc == 5)
        rc = cmd_serve(s, argv[3], atoi(argv[4]));
    else
        fprintf(stderr, "unknown command %s\n", argv[1]);
    jp_session_destroy(&s);
    return rc;
}
