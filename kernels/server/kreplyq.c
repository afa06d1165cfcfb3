/*
 * kreplyq.c — the reply queue of the ROUTER sockets, see kreplyq.h.
 */
#include "kernels/server/kreplyq.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "kernels/server/kserver.h"

typedef struct kreply {
    void *sock;
    jp_frame *frames; /* owned */
    size_t n;
    uint64_t since; /* when it was first refused */
    struct kreply *next;
} kreply;

typedef struct kstuck {
    void *sock;
    void *id; /* owned: the peer's routing id */
    size_t id_len;
} kstuck;

struct kreplyq {
    kreply *head, *tail;
    size_t count;
    kstuck stuck[KREPLYQ_MAX_STUCK];
    size_t next_stuck; /* slot replaced next */
};

kreplyq *kreplyq_new(void)
{
    return calloc(1, sizeof(kreplyq));
}

static void reply_free(kreply *r)
{
    jp_frames_free(&r->frames, r->n);
    free(r);
}

void kreplyq_destroy(kreplyq **pq)
{
    if (!pq || !*pq)
        return;
    kreplyq *q = *pq;
    while (q->head) {
        kreply *r = q->head;
        q->head = r->next;
        reply_free(r);
    }
    for (size_t i = 0; i < KREPLYQ_MAX_STUCK; i++)
        free(q->stuck[i].id);
    free(q);
    *pq = NULL;
}

static kstuck *find_stuck(kreplyq *q, void *sock, const jp_frame *id)
{
    for (size_t i = 0; i < KREPLYQ_MAX_STUCK; i++) {
        kstuck *s = &q->stuck[i];
        if (s->id && s->sock == sock && s->id_len == id->size &&
            (id->size == 0 || !memcmp(s->id, id->data, id->size)))
            return s;
    }
    return NULL;
}

static void forget_stuck(kstuck *s)
{
    free(s->id);
    memset(s, 0, sizeof *s);
}

static void add_stuck(kreplyq *q, void *sock, const jp_frame *id)
{
    if (find_stuck(q, sock, id))
        return;
    kstuck *s = &q->stuck[q->next_stuck];
    q->next_stuck = (q->next_stuck + 1) % KREPLYQ_MAX_STUCK;
    forget_stuck(s);
    s->id = malloc(id->size ? id->size : 1);
    if (!s->id)
        return;
    if (id->size)
        memcpy(s->id, id->data, id->size);
    s->id_len = id->size;
    s->sock = sock;
}

/* 1 sent, 0 the peer's queue is full (nothing sent), -1 failed. */
static int send_frames(void *sock, jp_frame *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);
        while (zmq_send(sock, f[i].data, f[i].size, flags) < 0) {
            if (errno == EINTR)
                continue;
            if (i == 0 && errno == EAGAIN)
                return 0;
            return -1;
        }
    }
    return 1;
}

int kreplyq_send(kreplyq *q, void *sock, jp_frame *frames, size_t n, char *err, size_t errlen)
{
    if (n == 0) {
        jp_frames_free(&frames, n);
        return 0;
    }
    /* Keep each peer's order: behind its earlier waiting replies. */
    int behind = 0;
    for (kreply *r = q->head; r && !behind; r = r->next)
        behind = r->sock == sock && r->frames[0].size == frames[0].size &&
                 !memcmp(r->frames[0].data, frames[0].data, frames[0].size);
    int rc = behind ? 0 : send_frames(sock, frames, n);
    kstuck *s = find_stuck(q, sock, &frames[0]);
    if (rc == 1) {
        if (s)
            forget_stuck(s);
        jp_frames_free(&frames, n);
        return 0;
    }
    if (rc < 0 || s) {
        snprintf(err, errlen, "%s",
                 rc < 0 ? zmq_strerror(errno) : "the client does not read its replies: dropped");
        jp_frames_free(&frames, n);
        return -1;
    }
    kreply *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        jp_frames_free(&frames, n);
        return -1;
    }
    r->sock = sock;
    r->frames = frames;
    r->n = n;
    r->since = kworker_now_ns();
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    q->count++;
    return 0;
}

size_t kreplyq_flush(kreplyq *q)
{
    uint64_t now = kworker_now_ns();
    kreply **pp = &q->head, *last = NULL;
    /* Peers that refused in this pass: their later replies stay behind. */
    kreply *blocked[32];
    size_t nblocked = 0;
    while (*pp) {
        kreply *r = *pp;
        int skip = 0;
        for (size_t i = 0; i < nblocked && !skip; i++)
            skip = blocked[i]->sock == r->sock && blocked[i]->frames[0].size == r->frames[0].size &&
                   !memcmp(blocked[i]->frames[0].data, r->frames[0].data, r->frames[0].size);
        int rc = skip ? 0 : send_frames(r->sock, r->frames, r->n);
        if (rc == 0 && find_stuck(q, r->sock, &r->frames[0])) {
            rc = -1;
        } else if (rc == 0 && now - r->since >= KREPLYQ_STALL_NS) {
            if (!find_stuck(q, r->sock, &r->frames[0]))
                kserver_log("a client has not read its replies for %.1f s: dropping them (as "
                            "ZeroMQ does), and further ones while it stays stuck",
                            KREPLYQ_STALL_NS / 1e9);
            add_stuck(q, r->sock, &r->frames[0]);
            rc = -1;
        }
        if (rc == 0) {
            if (!skip && nblocked < sizeof blocked / sizeof *blocked)
                blocked[nblocked++] = r;
            last = r;
            pp = &r->next;
            continue;
        }
        *pp = r->next;
        q->count--;
        reply_free(r);
    }
    q->tail = last;
    return q->count;
}

size_t kreplyq_waiting(const kreplyq *q)
{
    return q->count;
}
