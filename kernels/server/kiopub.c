/*
 * kiopub.c — IOPub publishing with a bounded wait queue, see kiopub.h.
 */
#include "kernels/server/kiopub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

typedef struct kiopub_item {
    jp_frame *frames; /* owned */
    size_t n;
    size_t next;  /* first frame not yet accepted by the socket */
    size_t bytes; /* total size of the frames, for congestion accounting */
    struct kiopub_item *link;
} kiopub_item;

struct kiopub {
    void *zsock;
    const jp_session *session;
    kiopub_item *head, *tail;
    size_t pending;
};

kiopub *kiopub_new(void *zsock, const jp_session *session)
{
    kiopub *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->zsock = zsock;
    q->session = session;
    return q;
}

static void item_free(kiopub_item *it)
{
    jp_frames_free(&it->frames, it->n);
    free(it);
}

void kiopub_destroy(kiopub **pq)
{
    if (!pq || !*pq)
        return;
    kiopub *q = *pq;
    while (q->head) {
        kiopub_item *it = q->head;
        q->head = it->link;
        item_free(it);
    }
    free(q);
    *pq = NULL;
}

/* Sends the remaining frames of one item. 1 when all went out, 0 when the
 * socket refused (try again later), -1 on a hard error (item dropped). */
static int send_item(kiopub *q, kiopub_item *it)
{
    while (it->next < it->n) {
        jp_frame *f = &it->frames[it->next];
        int more = it->next + 1 < it->n ? ZMQ_SNDMORE : 0;
        if (zmq_send(q->zsock, f->data, f->size, more | ZMQ_DONTWAIT) < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            return -1;
        }
        it->next++;
    }
    return 1;
}

size_t kiopub_flush(kiopub *q)
{
    while (q->head) {
        kiopub_item *it = q->head;
        if (send_item(q, it) == 0)
            break;
        q->head = it->link;
        if (!q->head)
            q->tail = NULL;
        q->pending -= it->bytes;
        item_free(it);
    }
    size_t n = 0;
    for (kiopub_item *it = q->head; it; it = it->link)
        n++;
    return n;
}

int kiopub_publish(kiopub *q, const jmsg *msg, jp_error *err)
{
    kiopub_item *it = calloc(1, sizeof *it);
    if (!it) {
        if (err) {
            err->code = JP_ERR_NOMEM;
            snprintf(err->reason, sizeof err->reason, "out of memory");
        }
        return -1;
    }
    if (jp_session_encode(q->session, msg, &it->frames, &it->n, err) != JP_OK) {
        free(it);
        return -1;
    }
    for (size_t i = 0; i < it->n; i++)
        it->bytes += it->frames[i].size;
    /* Keep order: only send directly when nothing is waiting. */
    if (!q->head && send_item(q, it) != 0) {
        item_free(it);
        return 0;
    }
    if (q->tail)
        q->tail->link = it;
    else
        q->head = it;
    q->tail = it;
    q->pending += it->bytes;
    return 0;
}

size_t kiopub_pending(const kiopub *q)
{
    return q->pending;
}

int kiopub_congested(const kiopub *q)
{
    return q->pending > KIOPUB_CONGESTED_BYTES;
}

void kiopub_drain_subscriptions(kiopub *q)
{
    char buf[256];
    for (int i = 0; i < 1024; i++) {
        if (zmq_recv(q->zsock, buf, sizeof buf, ZMQ_DONTWAIT) < 0)
            break;
    }
}
