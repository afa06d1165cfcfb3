/*
 * gwrelay.c — one WebSocket client to one kernel (see gwrelay.h).
 */
#include "kernelmgr/frontends/gwrelay.h"
#include "common/cm_clock.h"
#include "kernelmgr/engine/mkclient.h"
#include "kernelmgr/engine/mkforeign.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define GWRELAY_MAX_MSG_BYTES (128u << 20)
#define GWRELAY_WELCOME_WAIT_S 2.0

typedef struct gw_out {
    struct gw_out *next;
    unsigned char *data;
    size_t len;
    int binary;
} gw_out;

typedef struct gw_in {
    struct gw_in *next;
    jmsg *msg;
    jp_channel ch;
    size_t size;
} gw_in;

struct gwrelay {
    jp_connection conn;
    gw_form form;
    size_t max_pending;
    void (*wake)(void *);
    void *ud;
    int efd; /* eventfd: client messages waiting, or stop */
    pthread_t thread;
    int started;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ready; /* 1 set up, -1 failed to set up */
    int stop;
    int failed;
    char why[256];
    gw_out *out_head, *out_tail;
    size_t out_bytes;
    gw_in *in_head, *in_tail;
    size_t in_bytes;
};

static size_t msg_size(const jmsg *m)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_buffers; i++)
        n += m->buffers[i].size;
    return n + 1024; /* the JSON parts are counted when encoded; a floor here */
}

/* Marks the relay failed with a reason (first reason wins). Under mu. */
__attribute__((format(printf, 2, 3))) static void fail_locked(gwrelay *r, const char *fmt, ...)
{
    if (r->failed)
        return;
    r->failed = 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, sizeof r->why, fmt, ap);
    va_end(ap);
}

static void signal_efd(int fd)
{
    uint64_t one = 1;
    if (write(fd, &one, sizeof one) < 0) {
        /* a full eventfd counter still wakes the reader */
    }
}

static void *open_socket(void *ctx, int type, const jp_connection *c, jp_channel ch, km_err *err)
{
    char ep[600];
    if (jp_connection_endpoint(c, ch, ep, sizeof ep)) {
        km_err_set(err, KM_EUSAGE, "no endpoint for the %s channel", jp_channel_name(ch));
        return NULL;
    }
    void *s = zmq_socket(ctx, type);
    if (!s) {
        km_err_set(err, KM_EUSAGE, "zmq_socket: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    int zero = 0, hwm = 1000;
    int64_t maxsz = GWRELAY_MAX_MSG_BYTES;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxsz, sizeof maxsz);
    if (type == ZMQ_SUB)
        zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    if (zmq_connect(s, ep)) {
        km_err_set(err, KM_EUSAGE, "connect to %.400s: %s", ep, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* A kernel message for the client: encoded and queued, unless the client
 * is too far behind (then the relay fails). */
static void deliver(gwrelay *r, jp_channel ch, jmsg *m)
{
    unsigned char *data = NULL;
    size_t len = 0;
    int binary = 0;
    int ok = gwwire_encode(r->form, ch, m, &data, &len, &binary) == 0;
    gw_out *o = ok ? calloc(1, sizeof *o) : NULL;
    pthread_mutex_lock(&r->mu);
    if (!o) {
        fail_locked(r, "cannot encode a kernel message for the client (out of memory)");
        free(data);
    } else if (r->out_bytes + len > r->max_pending) {
        fail_locked(r, "the client did not read its messages: %llu bytes waiting (limit %llu)",
                    (unsigned long long)(r->out_bytes + len), (unsigned long long)r->max_pending);
        free(data);
        free(o);
    } else {
        o->data = data;
        o->len = len;
        o->binary = binary;
        if (r->out_tail)
            r->out_tail->next = o;
        else
            r->out_head = o;
        r->out_tail = o;
        r->out_bytes += len;
    }
    pthread_mutex_unlock(&r->mu);
    r->wake(r->ud);
}

static void *relay_main(void *arg)
{
    gwrelay *r = arg;
    km_err err = {0};
    void *ctx = kclient_zctx();
    void *sock[JP_CHANNEL__COUNT] = {NULL};
    jp_error je;
    jp_session *sess =
        jp_session_new(r->conn.key, strlen(r->conn.key), r->conn.signature_scheme, &je);
    if (!sess)
        km_err_set(&err, KM_EKERNEL, "signing session: %s", je.reason);
    static const jp_channel chans[] = {JP_SHELL, JP_CONTROL, JP_STDIN, JP_IOPUB};
    for (size_t i = 0; sess && i < 4 && !err.msg[0]; i++)
        sock[chans[i]] =
            open_socket(ctx, chans[i] == JP_IOPUB ? ZMQ_SUB : ZMQ_DEALER, &r->conn, chans[i], &err);
    if (sess)
        jp_session_set_max_bytes(sess, GWRELAY_MAX_MSG_BYTES);
    pthread_mutex_lock(&r->mu);
    r->ready = err.msg[0] ? -1 : 1;
    if (err.msg[0])
        snprintf(r->why, sizeof r->why, "%.*s", (int)sizeof r->why - 1, err.msg);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (err.msg[0])
        goto out;

    int welcomed = 0;
    double started = cm_mono_s();
    for (;;) {
        zmq_pollitem_t items[5] = {
            {sock[JP_SHELL], 0, ZMQ_POLLIN, 0}, {sock[JP_CONTROL], 0, ZMQ_POLLIN, 0},
            {sock[JP_STDIN], 0, ZMQ_POLLIN, 0}, {sock[JP_IOPUB], 0, ZMQ_POLLIN, 0},
            {NULL, r->efd, ZMQ_POLLIN, 0},
        };
        static const jp_channel ich[] = {JP_SHELL, JP_CONTROL, JP_STDIN, JP_IOPUB};
        long timeout = welcomed ? -1 : 50;
        if (zmq_poll(items, 5, timeout) < 0 && zmq_errno() != EINTR)
            break;
        if (items[4].revents & ZMQ_POLLIN) {
            uint64_t v;
            if (read(r->efd, &v, sizeof v) < 0) {
                /* EAGAIN: nothing to do */
            }
        }
        pthread_mutex_lock(&r->mu);
        int stop = r->stop || r->failed;
        pthread_mutex_unlock(&r->mu);
        if (stop)
            break;
        for (int i = 0; i < 4; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            for (int k = 0; k < 64; k++) {
                jmsg *m = NULL;
                jp_status st = jp_session_recv(sess, sock[ich[i]], ZMQ_DONTWAIT, &m, &je);
                if (st == JP_ERR_AGAIN)
                    break;
                if (st != JP_OK) {
                    fprintf(stderr, "kernelmgr gateway: dropped a %s message from the kernel: %s\n",
                            jp_channel_name(ich[i]), je.reason);
                    continue;
                }
                if (ich[i] == JP_IOPUB && !strcmp(jmsg_type(m), "iopub_welcome")) {
                    welcomed = 1;
                    jmsg_destroy(&m);
                    continue;
                }
                deliver(r, ich[i], m);
                jmsg_destroy(&m);
            }
        }
        if (!welcomed && cm_mono_s() - started > GWRELAY_WELCOME_WAIT_S)
            welcomed = 1; /* a kernel without JEP 65: go on */
        if (!welcomed)
            continue;
        /* client messages, in order */
        for (;;) {
            pthread_mutex_lock(&r->mu);
            gw_in *in = r->in_head;
            if (in) {
                r->in_head = in->next;
                if (!r->in_head)
                    r->in_tail = NULL;
                r->in_bytes -= in->size;
            }
            pthread_mutex_unlock(&r->mu);
            if (!in)
                break;
            /* the manager follows the cell from the kernel's IOPub into
             * the session's history and names its client there, and in
             * the `waited` of an exec that waits for it (mkforeign.h) */
            if (in->ch == JP_SHELL && !strcmp(jmsg_type(in->msg), "execute_request"))
                kforeign_note(jmsg_id(in->msg), "websocket");
            jp_status st = jp_session_send(sess, sock[in->ch], in->msg, 0, &je);
            if (st != JP_OK)
                fprintf(stderr, "kernelmgr gateway: cannot send a %s message to the kernel: %s\n",
                        jp_channel_name(in->ch), je.reason);
            jmsg_destroy(&in->msg);
            free(in);
        }
    }
out:
    for (int i = 0; i < JP_CHANNEL__COUNT; i++)
        if (sock[i])
            zmq_close(sock[i]);
    jp_session_destroy(&sess);
    return NULL;
}

gwrelay *gwrelay_new(const jp_connection *conn, gw_form form, size_t max_pending,
                     void (*wake)(void *ud), void *ud, km_err *err)
{
    gwrelay *r = calloc(1, sizeof *r);
    if (!r) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return NULL;
    }
    r->conn = *conn;
    r->form = form;
    r->max_pending = max_pending;
    r->wake = wake;
    r->ud = ud;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (r->efd < 0) {
        km_err_set(err, KM_EUSAGE, "eventfd: %s", strerror(errno));
        gwrelay_destroy(&r);
        return NULL;
    }
    if (pthread_create(&r->thread, NULL, relay_main, r)) {
        km_err_set(err, KM_EUSAGE, "cannot start the relay thread");
        gwrelay_destroy(&r);
        return NULL;
    }
    r->started = 1;
    pthread_mutex_lock(&r->mu);
    while (!r->ready)
        pthread_cond_wait(&r->cv, &r->mu);
    int ok = r->ready > 0;
    if (!ok)
        km_err_set(err, KM_EUSAGE, "%s", r->why);
    pthread_mutex_unlock(&r->mu);
    if (!ok)
        gwrelay_destroy(&r);
    return r;
}

void gwrelay_destroy(gwrelay **p)
{
    if (!p || !*p)
        return;
    gwrelay *r = *p;
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_mutex_unlock(&r->mu);
        signal_efd(r->efd);
        pthread_join(r->thread, NULL);
    }
    for (gw_out *o = r->out_head, *n; o; o = n) {
        n = o->next;
        free(o->data);
        free(o);
    }
    for (gw_in *in = r->in_head, *n; in; in = n) {
        n = in->next;
        jmsg_destroy(&in->msg);
        free(in);
    }
    if (r->efd >= 0)
        close(r->efd);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    free(r);
    *p = NULL;
}

int gwrelay_send(gwrelay *r, jp_channel ch, jmsg *msg)
{
    gw_in *in = calloc(1, sizeof *in);
    size_t size = msg_size(msg);
    pthread_mutex_lock(&r->mu);
    int rc = -1;
    if (!in)
        fail_locked(r, "out of memory");
    else if (r->failed)
        ;
    else if (r->in_bytes + size > r->max_pending)
        fail_locked(r,
                    "the kernel did not take the client's messages: %llu bytes waiting "
                    "(limit %llu)",
                    (unsigned long long)(r->in_bytes + size), (unsigned long long)r->max_pending);
    else {
        in->msg = msg;
        in->ch = ch;
        in->size = size;
        if (r->in_tail)
            r->in_tail->next = in;
        else
            r->in_head = in;
        r->in_tail = in;
        r->in_bytes += size;
        rc = 0;
    }
    pthread_mutex_unlock(&r->mu);
    if (rc) {
        free(in);
        jmsg_destroy(&msg);
        return -1;
    }
    signal_efd(r->efd);
    return 0;
}

int gwrelay_pop(gwrelay *r, unsigned char **data, size_t *len, int *binary)
{
    pthread_mutex_lock(&r->mu);
    gw_out *o = r->out_head;
    if (o) {
        r->out_head = o->next;
        if (!r->out_head)
            r->out_tail = NULL;
        r->out_bytes -= o->len;
    }
    pthread_mutex_unlock(&r->mu);
    if (!o)
        return 0;
    *data = o->data;
    *len = o->len;
    *binary = o->binary;
    free(o);
    return 1;
}

int gwrelay_failed(gwrelay *r, km_err *why)
{
    pthread_mutex_lock(&r->mu);
    int f = r->failed;
    if (f && why)
        km_err_set(why, KM_EUSAGE, "%s", r->why);
    pthread_mutex_unlock(&r->mu);
    return f;
}
