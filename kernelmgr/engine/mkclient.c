/*
 * mkclient.c — the manager's side of the Jupyter wire protocol.
 */
#include "kernelmgr/engine/mkclient.h"
#include "common/cm_clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <zmq.h>

/* Kernel messages above this are dropped: a kernel cannot make us buffer
 * more than this per message (outputs are capped later anyway). */
#define KCLIENT_MAX_BYTES (128u << 20)
#define KCLIENT_RECONNECT_MS 5
/* Messages of one kernel's IOPub queued in the manager at most. */
#define KCLIENT_IOPUB_HWM 1000
/* kernel_info is asked again this often until the kernel answers and IOPub
 * is seen to be connected (its subscription takes a moment to reach the
 * kernel: until then the status messages are lost). */
#define KCLIENT_READY_RESEND_S 0.02

struct kclient {
    void *sock[JP_CHANNEL__COUNT];
    jp_session *session;
    char session_id[37];
    char label[64];
    unsigned long dropped;
};

static void *zctx;
static pthread_once_t zctx_once = PTHREAD_ONCE_INIT;

static void zctx_init(void)
{
    zctx = zmq_ctx_new();
    if (!zctx)
        return;
    zmq_ctx_set(zctx, ZMQ_BLOCKY, 0);
    /* libzmq allows 1023 sockets per context by default: about 200 kernels
     * of five sockets each. A daemon's cap (max_kernels) follows its fd
     * limit, so the context does too, up to what libzmq takes. */
    struct rlimit rl;
    int limit = zmq_ctx_get(zctx, ZMQ_SOCKET_LIMIT);
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && limit > 0) {
        int want =
            rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (rlim_t)limit ? limit : (int)rl.rlim_max;
        if (want > zmq_ctx_get(zctx, ZMQ_MAX_SOCKETS))
            zmq_ctx_set(zctx, ZMQ_MAX_SOCKETS, want);
    }
}

void *kclient_zctx(void)
{
    pthread_once(&zctx_once, zctx_init);
    return zctx;
}

unsigned long kclient_discard_iopub(kclient *kc, unsigned long max)
{
    unsigned long n = 0;
    void *sock = kc->sock[JP_IOPUB];
    if (!sock)
        return 0;
    while (n < max) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        int rc = zmq_msg_recv(&part, sock, ZMQ_DONTWAIT);
        int more = rc >= 0 && zmq_msg_more(&part);
        zmq_msg_close(&part);
        if (rc < 0)
            break;
        if (!more)
            n++;
    }
    return n;
}

double kclient_now(void)
{
    return cm_mono_s();
}

void kclient_destroy(kclient **p)
{
    if (!p || !*p)
        return;
    kclient *kc = *p;
    for (int i = 0; i < JP_CHANNEL__COUNT; i++)
        if (kc->sock[i])
            zmq_close(kc->sock[i]);
    jp_session_destroy(&kc->session);
    free(kc);
    *p = NULL;
}

kclient *kclient_new(const jp_connection *conn, const char *label, km_err *err)
{
    void *ctx = kclient_zctx();
    if (!ctx) {
        km_err_set(err, KM_EKERNEL, "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        return NULL;
    }
    kclient *kc = calloc(1, sizeof *kc);
    if (!kc) {
        km_err_set(err, KM_EKERNEL, "out of memory");
        return NULL;
    }
    snprintf(kc->label, sizeof kc->label, "%s", label ? label : "kernel");
    jp_uuid4(kc->session_id);
    jp_error jerr;
    kc->session = jp_session_new(conn->key, strlen(conn->key), conn->signature_scheme, &jerr);
    if (!kc->session) {
        km_err_set(err, KM_EKERNEL, "signing session: %s", jerr.reason);
        goto fail;
    }
    jp_session_set_max_bytes(kc->session, KCLIENT_MAX_BYTES);
    static const int types[JP_CHANNEL__COUNT] = {ZMQ_DEALER, ZMQ_SUB, ZMQ_DEALER, ZMQ_DEALER,
                                                 ZMQ_REQ};
    for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++) {
        kc->sock[ch] = zmq_socket(ctx, types[ch]);
        if (!kc->sock[ch]) {
            km_err_set(err, KM_EKERNEL, "zmq_socket: %s", zmq_strerror(zmq_errno()));
            goto fail;
        }
        int zero = 0;
        zmq_setsockopt(kc->sock[ch], ZMQ_LINGER, &zero, sizeof zero);
        /* A fresh kernel binds a few ms after we connect: retry soon (libzmq
         * waits 100 ms by default), backing off for a kernel that is gone. */
        int ivl = KCLIENT_RECONNECT_MS, ivl_max = 200;
        zmq_setsockopt(kc->sock[ch], ZMQ_RECONNECT_IVL, &ivl, sizeof ivl);
        zmq_setsockopt(kc->sock[ch], ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
        int64_t maxmsg = KCLIENT_MAX_BYTES;
        zmq_setsockopt(kc->sock[ch], ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
        if (ch == JP_IOPUB) {
            /* Bounded: when the consumer is behind (a slow daemon client,
             * see dloop.c) we stop reading, this queue fills and the kernel's
             * lossless IOPub (kiopub.h) holds its output back, instead of the
             * manager buffering a whole flood (1 GiB of output once grew the
             * daemon to 518 MB). Same depth as the kernel's KIOPUB_HWM. */
            int hwm = KCLIENT_IOPUB_HWM;
            zmq_setsockopt(kc->sock[ch], ZMQ_RCVHWM, &hwm, sizeof hwm);
            zmq_setsockopt(kc->sock[ch], ZMQ_SUBSCRIBE, "", 0);
        }
        if (ch == JP_HB) {
            /* an unanswered ping must not lock the REQ socket forever */
            int one = 1;
            zmq_setsockopt(kc->sock[ch], ZMQ_REQ_RELAXED, &one, sizeof one);
            zmq_setsockopt(kc->sock[ch], ZMQ_REQ_CORRELATE, &one, sizeof one);
        }
        if (ch != JP_IOPUB && ch != JP_HB)
            zmq_setsockopt(kc->sock[ch], ZMQ_ROUTING_ID, kc->session_id, strlen(kc->session_id));
        char ep[512];
        if (jp_connection_endpoint(conn, (jp_channel)ch, ep, sizeof ep) ||
            zmq_connect(kc->sock[ch], ep)) {
            km_err_set(err, KM_EKERNEL, "connect %s: %s", ep, zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    return kc;
fail:
    kclient_destroy(&kc);
    return NULL;
}

int kclient_send(kclient *kc, jp_channel ch, const char *msg_type, json_t *content,
                 const jmsg *parent, char msg_id[37])
{
    jmsg *m = jmsg_new(msg_type, kc->session_id, "kernelmgr", NULL);
    if (!m) {
        json_decref(content);
        return -1;
    }
    if (content && jmsg_set_content(m, content)) {
        jmsg_destroy(&m);
        return -1;
    }
    if (parent) {
        json_decref(m->parent_header);
        m->parent_header = json_deep_copy(parent->header);
    }
    if (msg_id)
        snprintf(msg_id, 37, "%s", jmsg_id(m));
    jp_error jerr;
    jp_status st = jp_session_send(kc->session, kc->sock[ch], m, 0, &jerr);
    jmsg_destroy(&m);
    if (st != JP_OK) {
        fprintf(stderr, "kernelmgr: %s: send %s failed: %s\n", kc->label, msg_type, jerr.reason);
        return -1;
    }
    return 0;
}

const char *kclient_session_id(const kclient *kc)
{
    return kc->session_id;
}

int kclient_recv(kclient *kc, int timeout_ms, jp_channel *ch, jmsg **out)
{
    static const jp_channel order[4] = {JP_IOPUB, JP_SHELL, JP_CONTROL, JP_STDIN};
    double deadline = cm_mono_s() + timeout_ms / 1000.0;
    /* A malformed message is no reason to say "nothing here" while good
     * ones wait behind it (a caller reading everything that has arrived
     * stops at 0); past the deadline only this many are skipped, so a
     * kernel that sends nothing else cannot hold the caller. */
    int late_drops = 64;
    for (;;) {
        zmq_pollitem_t items[4];
        for (int i = 0; i < 4; i++)
            items[i] = (zmq_pollitem_t){kc->sock[order[i]], 0, ZMQ_POLLIN, 0};
        double left = deadline - cm_mono_s();
        long ms = left > 0 ? (long)(left * 1000) : 0;
        int rc = zmq_poll(items, 4, ms);
        if (rc < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return -1;
        }
        if (rc == 0)
            return 0;
        /* iopub first: output must be collected before the reply that ends it */
        int dropped = 0;
        for (int i = 0; i < 4; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            jp_error jerr;
            jmsg *m = NULL;
            jp_status st =
                jp_session_recv(kc->session, kc->sock[order[i]], ZMQ_DONTWAIT, &m, &jerr);
            if (st == JP_OK) {
                *ch = order[i];
                *out = m;
                return 1;
            }
            if (st != JP_ERR_AGAIN) {
                kc->dropped++;
                dropped = 1;
                fprintf(stderr, "kernelmgr: %s: dropped a malformed %s message: %s\n", kc->label,
                        jp_channel_name(order[i]), jerr.reason);
            }
        }
        if (cm_mono_s() >= deadline && (!dropped || --late_drops <= 0))
            return 0;
    }
}

json_t *kclient_wait_ready(kclient *kc, double timeout_s, int (*alive)(void *), void *ud,
                           km_err *err)
{
    double deadline = cm_mono_s() + timeout_s;
    double next_send = 0;
    json_t *reply = NULL;
    int iopub_seen = 0;
    while (cm_mono_s() < deadline) {
        if (alive && !alive(ud)) {
            km_err_set(err, KM_EKERNEL, "kernel process ended during start");
            json_decref(reply);
            return NULL;
        }
        if (cm_mono_s() >= next_send && !(reply && iopub_seen)) {
            kclient_send(kc, JP_SHELL, "kernel_info_request", NULL, NULL, NULL);
            next_send = cm_mono_s() + KCLIENT_READY_RESEND_S;
        }
        jp_channel ch;
        jmsg *m = NULL;
        int wait_ms = (int)((next_send - cm_mono_s()) * 1000) + 1;
        int rc = kclient_recv(kc, wait_ms < 1 ? 1 : wait_ms > 100 ? 100 : wait_ms, &ch, &m);
        if (rc < 0)
            break;
        if (rc == 0)
            continue;
        if (ch == JP_IOPUB)
            iopub_seen = 1;
        else if (ch == JP_SHELL && !strcmp(jmsg_type(m), "kernel_info_reply") && !reply)
            reply = json_incref(m->content);
        jmsg_destroy(&m);
        if (reply && iopub_seen) {
            /* Drop the kernel_info chatter that is already here; what comes
             * later has a parent nobody waits for and is skipped by then. */
            while (kclient_recv(kc, 0, &ch, &m) == 1)
                jmsg_destroy(&m);
            return reply;
        }
    }
    json_decref(reply);
    km_err_set(err, KM_EKERNEL, "kernel did not answer kernel_info within %.0f s", timeout_s);
    return NULL;
}

int kclient_heartbeat(kclient *kc, int timeout_ms)
{
    void *s = kc->sock[JP_HB];
    if (zmq_send(s, "ping", 4, ZMQ_DONTWAIT) < 0)
        return 0;
    zmq_pollitem_t it = {s, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) == 1) {
        char buf[64];
        zmq_recv(s, buf, sizeof buf, ZMQ_DONTWAIT);
        return 1;
    }
    return 0;
}

unsigned long kclient_dropped(const kclient *kc)
{
    return kc->dropped;
}
