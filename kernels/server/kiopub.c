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
#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <stddef.h>
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
    int fd;                    /* libzmq's connection fd (borrowed: never closed here) */
    long outq;                 /* unsent bytes at the last sample, -1 = not sampled */
    uint64_t acked;            /* TCP: bytes the peer acknowledged at the last sample */
    uint64_t last_progress_ns; /* it last took bytes (or the stall began) */
    uint64_t gap_ns;           /* longest wait between two of its reads seen */
} kiopub_peer;

struct kiopub {
    void *zsock;
    void *mon; /* PAIR socket receiving zsock's monitor events, or NULL */
    const jp_session *session;
    kiopub_item *head, *tail;
    size_t pending;
    size_t count;         /* items in the queue */
    uint64_t stalled_ns;  /* start of the current stall period; 0 = moving */
    int stall_periods;    /* consecutive periods without progress */
    int cut_in_period;    /* subscribers cut in the current period */
    int lossy;            /* ZMQ_XPUB_NODROP is off */
    size_t subscriptions; /* see kiopub_subscriptions */
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
    q->peers[q->npeers++] = (kiopub_peer){fd, -1, 0, kworker_now_ns(), 0};
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

/* TCP: bytes the peer has acknowledged so far (grows only when its
 * receive window opens, i.e. when it reads); 0 for other sockets. */
static uint64_t peer_acked(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked)
        return 0;
    return ti.tcpi_bytes_acked;
}

/* A stall begins: every peer gets the whole grace period from now on. */
static void peers_start_period(kiopub *q)
{
    uint64_t now = kworker_now_ns();
    for (size_t i = 0; i < q->npeers; i++) {
        q->peers[i].outq = peer_outq(q->peers[i].fd);
        q->peers[i].acked = peer_acked(q->peers[i].fd);
        q->peers[i].last_progress_ns = now;
    }
}

/* Samples every peer while the socket is stalled (each loop turn, at most
 * every few ms): a peer took bytes when its unread bytes went down at any
 * sample or (TCP) it acknowledged more. Two samples alone would not do: the
 * unread bytes of a peer that drains while another floods can sit at the
 * same (full) value at both ends of a period, libzmq refilling what it
 * read. The longest wait between a peer's reads is remembered: a client's
 * libzmq takes from its socket in batches (after its application consumed
 * half its receive queue), so a client that reads slowly shows progress
 * seldom, but regularly. */
static void peers_sample(kiopub *q, uint64_t now)
{
    for (size_t i = 0; i < q->npeers; i++) {
        kiopub_peer *p = &q->peers[i];
        long outq = peer_outq(p->fd);
        uint64_t acked = peer_acked(p->fd);
        if ((p->outq >= 0 && outq >= 0 && outq < p->outq) || acked > p->acked) {
            if (now - p->last_progress_ns > p->gap_ns)
                p->gap_ns = now - p->last_progress_ns;
            p->last_progress_ns = now;
        }
        p->outq = outq;
        p->acked = acked;
    }
}

/* How long a peer may take nothing before it counts as stuck: the grace
 * period, or four times the longest wait between its reads seen so far
 * (a slow reader is not a stuck one), at most KIOPUB_STALL_MAX_NS. */
static uint64_t peer_grace(const kiopub_peer *p)
{
    uint64_t g = 4 * p->gap_ns;
    if (g < KIOPUB_STALL_NS)
        g = KIOPUB_STALL_NS;
    return g > KIOPUB_STALL_MAX_NS ? KIOPUB_STALL_MAX_NS : g;
}

/* "127.0.0.1:4711" or "fd N" (a unix socket peer has no useful name). */
static const char *peer_name(int fd, char *buf, size_t size)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "";
    if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0 && ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(buf, size, "%s:%u", host, ntohs(a->sin_port));
    } else if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0 && ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(buf, size, "[%s]:%u", host, ntohs(a->sin6_port));
    } else {
        snprintf(buf, size, "fd %d", fd);
    }
    return buf;
}

/* Called once per stall period while the socket refuses everything: a peer
 * whose connection holds unread bytes and has not taken a single one during
 * the whole period (see peers_sample) is the one that stopped reading; a
 * peer that reads, however slowly, is never cut. Cutting its connection
 * frees its queue (libzmq drops the pipe); its client reconnects by itself
 * and goes on from then, having missed what it did not read — what
 * ipykernel's plain PUB gives such a client, while everyone else keeps
 * lossless delivery. Returns the number of connections cut. */
static int cut_stuck_peers(kiopub *q, uint64_t now)
{
    read_monitor(q);
    int cut = 0;
    for (size_t i = 0; i < q->npeers; i++) {
        kiopub_peer *p = &q->peers[i];
        if (p->outq > 0 && now - p->last_progress_ns >= peer_grace(p)) {
            char name[80];
            kserver_log("an IOPub subscriber has not read anything for %.1f s with %ld bytes "
                        "waiting (peer %s): disconnecting it (it reconnects and misses what it "
                        "did not read; the other clients get everything)",
                        (double)(now - p->last_progress_ns) / 1e9, p->outq,
                        peer_name(p->fd, name, sizeof name));
            shutdown(p->fd, SHUT_RDWR);
            p->outq = -1;
            p->last_progress_ns = now;
            cut++;
        }
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
                    q->cut_in_period = 0;
                    read_monitor(q);
                    peers_start_period(q);
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

/* While the socket refuses: cuts stuck subscribers, and after
 * KIOPUB_LOSSY_AFTER whole periods without a culprit falls back to lossy. */
static void handle_stall(kiopub *q)
{
    uint64_t now = kworker_now_ns();
    peers_sample(q, now);
    q->cut_in_period += cut_stuck_peers(q, now);
    if (now - q->stalled_ns < KIOPUB_STALL_NS)
        return;
    q->stalled_ns = now;
    int cut = q->cut_in_period;
    q->cut_in_period = 0;
    if (cut == 0 && ++q->stall_periods >= KIOPUB_LOSSY_AFTER) {
        /* No culprit found (no monitor, too many peers, a transport
         * without SIOCOUTQ): never stall forever; drop like PUB does. */
        kserver_log("IOPub has not moved for %.0f s: now dropping messages for subscribers "
                    "that are %d messages behind",
                    KIOPUB_LOSSY_AFTER * KIOPUB_STALL_NS / 1e9, KIOPUB_HWM);
        set_lossy(q, 1);
        q->stalled_ns = 0;
    }
}

size_t kiopub_flush(kiopub *q)
{
    if (q->head && q->stalled_ns)
        handle_stall(q);
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

size_t kiopub_count(const kiopub *q)
{
    return q->count;
}

int kiopub_lossy(const kiopub *q)
{
    return q->lossy;
}

size_t kiopub_subscriptions(const kiopub *q)
{
    return q->subscriptions;
}

/* Publishes the JEP 65 welcome for one new subscription (see kiopub.h). */
static void publish_welcome(kiopub *q, const char *session_id, const char *topic, size_t len)
{
    if (q->count > KIOPUB_BACKLOG_LOW)
        return;
    json_t *sub = json_stringn(topic, len); /* NULL: not UTF-8 */
    if (!sub)
        return;
    jmsg *m = jmsg_new("iopub_welcome", session_id, "kernel", NULL);
    if (!m) {
        json_decref(sub);
        return;
    }
    /* The topic frame must start with the subscription for the new
     * subscriber to receive it; "" (what jupyter_client subscribes to)
     * matches everything: use the usual kernel.<session>.<type> form. */
    char *own = NULL;
    jp_frame id = {(void *)topic, len};
    if (len == 0 && asprintf(&own, "kernel.%s.iopub_welcome", session_id) >= 0)
        id = (jp_frame){own, strlen(own)};
    jmsg_set_ids(m, &id, 1);
    free(own);
    jmsg_set_content(m, json_pack("{s:o}", "subscription", sub));
    jp_error err;
    if (kiopub_publish(q, m, &err) < 0)
        kserver_log("cannot publish iopub_welcome: %s", err.reason);
    jmsg_destroy(&m);
}

void kiopub_drain_subscriptions(kiopub *q, const char *session_id)
{
    char buf[KIOPUB_WELCOME_TOPIC_MAX + 1];
    read_monitor(q);
    for (int i = 0; i < 1024; i++) {
        int n = zmq_recv(q->zsock, buf, sizeof buf, ZMQ_DONTWAIT);
        if (n < 0)
            break;
        if (n >= 1 && buf[0] == 0) {
            /* "\0topic": a subscriber left (XPUB_VERBOSER reports every
             * one); maybe the stuck one: lossless again until proven
             * otherwise. */
            if (q->subscriptions)
                q->subscriptions--;
            if (q->lossy) {
                kserver_log("an IOPub subscriber left: IOPub is lossless again");
                set_lossy(q, 0);
            }
        } else if (n >= 1 && buf[0] == 1) {
            /* "\1topic": a new subscription (VERBOSER: every one, even a
             * topic already subscribed by another client). n > sizeof buf:
             * cut. */
            q->subscriptions++;
            if ((size_t)n <= sizeof buf && session_id)
                publish_welcome(q, session_id, buf + 1, (size_t)n - 1);
        }
    }
}
