/*
 * kiopub.c — IOPub publishing with a bounded wait queue and the
 * stuck-subscriber escape, see kiopub.h.
 */
#include "kernels/server/kiopub.h"

#include <errno.h>
#include <linux/sockios.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <zmq.h>

#include "kernels/server/kserver.h"

#define KIOPUB_MAX_PEERS 64
#define KIOPUB_LOSSY_AFTER 5 /* stall periods without a culprit: go lossy */

typedef struct kiopub_item {
    jp_frame *frames; /* owned */
    size_t n;
    size_t next;  /* first frame not yet accepted by the socket */
    size_t bytes; /* total size of the frames, for congestion accounting */
    struct kiopub_item *link;
} kiopub_item;

typedef struct kiopub_peer {
    int fd;    /* libzmq's connection fd (borrowed: never closed here) */
    long outq; /* unsent bytes at the last sample, -1 = not sampled */
} kiopub_peer;

struct kiopub {
    void *zsock;
    void *mon; /* PAIR socket receiving zsock's monitor events, or NULL */
    const jp_session *session;
    kiopub_item *head, *tail;
    size_t pending;
    size_t count;        /* items in the queue */
    uint64_t stalled_ns; /* start of the current stall period; 0 = moving */
    int stall_periods;   /* consecutive periods without progress */
    int lossy;           /* ZMQ_XPUB_NODROP is off */
    kiopub_peer peers[KIOPUB_MAX_PEERS];
    size_t npeers;
    int peers_overflow; /* more connections than we track */
};

kiopub *kiopub_new(void *ctx, void *zsock, const jp_session *session)
{
    kiopub *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->zsock = zsock;
    q->session = session;
    /* The monitor tells us the fd of each subscriber's connection: the only
     * way to find out which one stopped reading (XPUB does not say). */
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://kiopub-monitor-%p", (void *)q);
    if (ctx && zmq_socket_monitor(zsock, ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) == 0) {
        q->mon = zmq_socket(ctx, ZMQ_PAIR);
        int zero = 0;
        if (q->mon) {
            zmq_setsockopt(q->mon, ZMQ_LINGER, &zero, sizeof zero);
            if (zmq_connect(q->mon, ep) < 0) {
                zmq_close(q->mon);
                q->mon = NULL;
            }
        }
    }
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
    if (q->mon) {
        zmq_socket_monitor(q->zsock, NULL, 0);
        zmq_close(q->mon);
    }
    free(q);
    *pq = NULL;
}

/* ---------------------------------------------------------------- peers */

static void peer_add(kiopub *q, int fd)
{
    for (size_t i = 0; i < q->npeers; i++)
        if (q->peers[i].fd == fd)
            return;
    if (q->npeers == KIOPUB_MAX_PEERS) {
        q->peers_overflow = 1;
        return;
    }
    q->peers[q->npeers++] = (kiopub_peer){fd, -1};
}

static void peer_remove(kiopub *q, int fd)
{
    for (size_t i = 0; i < q->npeers; i++) {
        if (q->peers[i].fd == fd) {
            q->peers[i] = q->peers[--q->npeers];
            return;
        }
    }
}

static void read_monitor(kiopub *q)
{
    if (!q->mon)
        return;
    for (int k = 0; k < 256; k++) {
        unsigned char ev[6];
        char addr[256];
        int n = zmq_recv(q->mon, ev, sizeof ev, ZMQ_DONTWAIT);
        if (n < 0)
            return;
        int more = 0;
        size_t ml = sizeof more;
        zmq_getsockopt(q->mon, ZMQ_RCVMORE, &more, &ml);
        if (more)
            zmq_recv(q->mon, addr, sizeof addr, 0); /* the endpoint: unused */
        if (n != 6)
            continue;
        uint16_t id;
        uint32_t value;
        memcpy(&id, ev, 2);
        memcpy(&value, ev + 2, 4);
        if (id == ZMQ_EVENT_ACCEPTED)
            peer_add(q, (int)value);
        else if (id == ZMQ_EVENT_DISCONNECTED)
            peer_remove(q, (int)value);
    }
}

/* Bytes written to fd that its reader has not taken yet, or -1. */
static long peer_outq(int fd)
{
    int n = 0;
    return ioctl(fd, SIOCOUTQ, &n) == 0 ? n : -1;
}

/* Called once per stall period while the socket refuses everything: a peer
 * whose connection holds unread bytes and has not taken a single one since
 * the last period is the one that stopped reading. Cutting its connection
 * frees its queue (libzmq drops the pipe); its client reconnects by itself
 * and goes on from then, having missed what it did not read — what
 * ipykernel's plain PUB gives such a client, while everyone else keeps
 * lossless delivery. Returns the number of connections cut. */
static int cut_stuck_peers(kiopub *q)
{
    read_monitor(q);
    int cut = 0;
    for (size_t i = 0; i < q->npeers; i++) {
        kiopub_peer *p = &q->peers[i];
        long outq = peer_outq(p->fd);
        if (outq > 0 && outq == p->outq) {
            kserver_log("an IOPub subscriber has not read anything for %.1f s with %ld bytes "
                        "waiting: disconnecting it (it reconnects and misses what it did not "
                        "read; the other clients get everything)",
                        KIOPUB_STALL_NS / 1e9, outq);
            shutdown(p->fd, SHUT_RDWR);
            p->outq = -1;
            cut++;
            continue;
        }
        p->outq = outq;
    }
    return cut;
}

/* ---------------------------------------------------------------- sending */

/* Sends the remaining frames of one item. 1 when all went out, 0 when the
 * socket refused (try again later), -1 on a hard error (item dropped). */
static int send_item(kiopub *q, kiopub_item *it)
{
    while (it->next < it->n) {
        jp_frame *f = &it->frames[it->next];
        int more = it->next + 1 < it->n ? ZMQ_SNDMORE : 0;
        if (zmq_send(q->zsock, f->data, f->size, more | ZMQ_DONTWAIT) < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                if (!q->stalled_ns) {
                    q->stalled_ns = kworker_now_ns();
                    q->stall_periods = 0;
                    for (size_t i = 0; i < q->npeers; i++)
                        q->peers[i].outq = peer_outq(q->peers[i].fd);
                }
                return 0;
            }
            return -1;
        }
        it->next++;
        q->stalled_ns = 0;
    }
    return 1;
}

static void set_lossy(kiopub *q, int lossy)
{
    int nodrop = !lossy;
    if (q->lossy == lossy)
        return;
    if (zmq_setsockopt(q->zsock, ZMQ_XPUB_NODROP, &nodrop, sizeof nodrop) == 0)
        q->lossy = lossy;
}

size_t kiopub_flush(kiopub *q)
{
    uint64_t now;
    if (q->head && q->stalled_ns && (now = kworker_now_ns()) - q->stalled_ns >= KIOPUB_STALL_NS) {
        q->stalled_ns = now;
        if (cut_stuck_peers(q) == 0 && ++q->stall_periods >= KIOPUB_LOSSY_AFTER) {
            /* No culprit found (no monitor, too many peers, a transport
             * without SIOCOUTQ): never stall forever; drop like PUB does. */
            kserver_log("IOPub has not moved for %.0f s: now dropping messages for subscribers "
                        "that are %d messages behind",
                        KIOPUB_LOSSY_AFTER * KIOPUB_STALL_NS / 1e9, KIOPUB_HWM);
            set_lossy(q, 1);
            q->stalled_ns = 0;
        }
    }
    while (q->head) {
        kiopub_item *it = q->head;
        if (send_item(q, it) == 0)
            break;
        q->head = it->link;
        if (!q->head)
            q->tail = NULL;
        q->pending -= it->bytes;
        q->count--;
        item_free(it);
    }
    if (!q->head)
        q->stalled_ns = 0;
    return q->count;
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
    q->count++;
    return 0;
}

size_t kiopub_pending(const kiopub *q)
{
    return q->pending;
}

uint64_t kiopub_deadline(const kiopub *q)
{
    return q->head && q->stalled_ns ? q->stalled_ns + KIOPUB_STALL_NS : 0;
}

int kiopub_congested(const kiopub *q)
{
    return q->pending > KIOPUB_CONGESTED_BYTES;
}

int kiopub_lossy(const kiopub *q)
{
    return q->lossy;
}

void kiopub_drain_subscriptions(kiopub *q)
{
    char buf[256];
    read_monitor(q);
    for (int i = 0; i < 1024; i++) {
        int n = zmq_recv(q->zsock, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n < 0)
            break;
        /* "\0topic": a subscriber left (XPUB_VERBOSER reports every one);
         * maybe the stuck one: lossless again until proven otherwise. */
        if (n >= 1 && buf[0] == 0 && q->lossy) {
            kserver_log("an IOPub subscriber left: IOPub is lossless again");
            set_lossy(q, 0);
        }
    }
}
