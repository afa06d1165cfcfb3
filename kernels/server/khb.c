/*
 * khb.c — heartbeat echo thread, see khb.h. The proxy is steerable so that
 * shutdown is a "TERMINATE" message instead of tearing the context down
 * under the thread.
 */
#include "kernels/server/khb.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

struct khb {
    void *ctx;
    void *sock;    /* ROUTER, owned by the thread while it runs */
    void *ctl_in;  /* PAIR read by zmq_proxy_steerable */
    void *ctl_out; /* PAIR we write TERMINATE to */
    pthread_t thread;
    char ctl_endpoint[64];
};

static void *khb_run(void *arg)
{
    khb *hb = arg;
    /* Returns when TERMINATE arrives (or the context ends). */
    zmq_proxy_steerable(hb->sock, hb->sock, NULL, hb->ctl_in);
    return NULL;
}

static void close_all(khb *hb)
{
    int zero = 0;
    void *socks[3] = {hb->sock, hb->ctl_in, hb->ctl_out};
    for (int i = 0; i < 3; i++) {
        if (socks[i]) {
            zmq_setsockopt(socks[i], ZMQ_LINGER, &zero, sizeof zero);
            zmq_close(socks[i]);
        }
    }
}

khb *khb_start(void *ctx, const char *endpoint, char *err, size_t errlen)
{
    khb *hb = calloc(1, sizeof *hb);
    if (!hb) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    hb->ctx = ctx;
    snprintf(hb->ctl_endpoint, sizeof hb->ctl_endpoint, "inproc://khb-%p", (void *)hb);
    hb->sock = zmq_socket(ctx, ZMQ_ROUTER);
    hb->ctl_in = zmq_socket(ctx, ZMQ_PAIR);
    hb->ctl_out = zmq_socket(ctx, ZMQ_PAIR);
    if (!hb->sock || !hb->ctl_in || !hb->ctl_out) {
        snprintf(err, errlen, "heartbeat socket: %s", zmq_strerror(errno));
        goto fail;
    }
    /* Pings are a few bytes (jupyter_client sends 8): a peer announcing a
     * bigger frame is disconnected before libzmq allocates it. */
    int64_t maxmsg = KHB_MAX_FRAME;
    zmq_setsockopt(hb->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (zmq_bind(hb->sock, endpoint) < 0) {
        snprintf(err, errlen, "cannot bind heartbeat to %s: %s", endpoint, zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(hb->ctl_in, hb->ctl_endpoint) < 0 ||
        zmq_connect(hb->ctl_out, hb->ctl_endpoint) < 0) {
        snprintf(err, errlen, "heartbeat control: %s", zmq_strerror(errno));
        goto fail;
    }
    int rc = pthread_create(&hb->thread, NULL, khb_run, hb);
    if (rc != 0) {
        snprintf(err, errlen, "heartbeat thread: %s", strerror(rc));
        goto fail;
    }
    return hb;
fail:
    close_all(hb);
    free(hb);
    return NULL;
}

void khb_stop(khb **phb)
{
    if (!phb || !*phb)
        return;
    khb *hb = *phb;
    zmq_send(hb->ctl_out, "TERMINATE", 9, 0);
    pthread_join(hb->thread, NULL);
    close_all(hb);
    free(hb);
    *phb = NULL;
}
