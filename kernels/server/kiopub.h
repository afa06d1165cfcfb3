/*
 * kiopub.h — the IOPub publisher: lossless for clients that read, with
 * back-pressure, yet never held hostage by one that does not.
 *
 * IOPub is an XPUB socket with ZMQ_XPUB_NODROP: when a subscriber falls
 * KIOPUB_HWM messages behind, libzmq refuses new messages instead of
 * dropping them. Refused messages wait in a FIFO here, and
 * kiopub_congested() tells the server to stop reading the worker's pipes, so
 * a flood of output blocks the worker (the pipe fills) instead of growing
 * memory or losing output.
 *
 * libzmq refuses a message when *any* subscriber is full, so a subscriber
 * that stays connected but stops reading (an idle client that never polls
 * IOPub, a suspended `jupyter console`) would stall the kernel for everyone.
 * A socket monitor gives us each subscriber's connection fd; when the socket
 * has refused everything for KIOPUB_STALL_NS, a connection whose unread
 * bytes (SIOCOUTQ, sampled every loop turn) have not gone down once and
 * (TCP) that acknowledged nothing in that time is shut down; a subscriber
 * seen reading, however slowly, gets four times its longest wait between
 * reads (at most KIOPUB_STALL_MAX_NS). A subscriber that drains while
 * another client floods the kernel is therefore never cut; the flood is
 * slowed instead (kserver.c stops reading requests while IOPub is
 * backlogged).
 * libzmq drops its pipe and everyone else moves on, losslessly; the stuck
 * client reconnects by itself and misses what it did not read (which is
 * what ipykernel's plain PUB does to it). Should no culprit be found for
 * KIOPUB_LOSSY_AFTER periods, the socket falls back to lossy (PUB-like)
 * mode until a subscriber leaves.
 */
#ifndef KERNELS_SERVER_KIOPUB_H
#define KERNELS_SERVER_KIOPUB_H

#include <stddef.h>
#include <stdint.h>

#include "jp.h"

#define KIOPUB_CONGESTED_BYTES (1u << 20)
#define KIOPUB_HWM 1000               /* per-subscriber queue, messages (libzmq's default) */
#define KIOPUB_STALL_NS 2000000000ull /* no progress for this long: a subscriber is stuck */
/* ... or, for a subscriber seen reading in batches, four times its longest
 * wait between two reads, at most this long */
#define KIOPUB_STALL_MAX_NS 30000000000ull
/* Back-pressure on clients: above this many queued messages the server
 * stops reading shell and control requests, below KIOPUB_BACKLOG_LOW it
 * reads them again (see kserver.c). */
#define KIOPUB_BACKLOG_HIGH 256
#define KIOPUB_BACKLOG_LOW 64

typedef struct kiopub kiopub;

/* new: publishes on zsock (borrowed, an XPUB socket with NODROP and
 * VERBOSER of context ctx, borrowed) signing with session (borrowed). NULL
 * when out of memory. */
kiopub *kiopub_new(void *ctx, void *zsock, const jp_session *session);
void kiopub_destroy(kiopub **q);

/* Encodes msg (borrowed) now and sends it, or queues it behind earlier
 * messages. 0, or -1 when it could not be encoded (logged by the caller). */
int kiopub_publish(kiopub *q, const jmsg *msg, jp_error *err);

/* Sends as much of the queue as the socket accepts; when nothing could be
 * sent for KIOPUB_STALL_NS, switches to lossy mode first. Returns the number
 * of messages still waiting. */
size_t kiopub_flush(kiopub *q);

/* Bytes waiting in the queue. */
size_t kiopub_pending(const kiopub *q);

/* Monotonic time (ns) at which kiopub_flush() gives up on a stalled
 * subscriber, or 0 when the queue is empty. */
uint64_t kiopub_deadline(const kiopub *q);

/* Messages waiting in the queue. */
size_t kiopub_count(const kiopub *q);

/* 1 when the queue holds more than KIOPUB_CONGESTED_BYTES. */
int kiopub_congested(const kiopub *q);

/* 1 while in lossy mode (a stalled subscriber was detected). */
int kiopub_lossy(const kiopub *q);

/* Subscriptions live now: every subscription counted (XPUB_VERBOSER shows
 * each one, and each one's end when its subscriber leaves), never below 0.
 * A subscriber that subscribes one topic twice counts twice until it leaves
 * (libzmq reports one end): an overcount, never an undercount. */
size_t kiopub_subscriptions(const kiopub *q);

/* Receives subscription messages (XPUB delivers them to us) and monitor
 * events; a subscriber leaving re-arms lossless mode. Each new subscription
 * is answered with the welcome of Jupyter's kernel-subscription proposal
 * (JEP 65): msg_type "iopub_welcome", content {"subscription": TOPIC}, no
 * parent, published under a topic the new subscription matches, header
 * session session_id (borrowed). Every subscriber sees it (harmless: clients
 * ignore what they do not know); a client learns that its subscription is
 * live without waiting for the next status message (the slow joiner).
 * Welcomes are not sent while more than KIOPUB_BACKLOG_LOW messages wait
 * (subscription spam cannot grow the queue) nor for a topic that is not
 * UTF-8 or longer than KIOPUB_WELCOME_TOPIC_MAX bytes. */
#define KIOPUB_WELCOME_TOPIC_MAX 255
void kiopub_drain_subscriptions(kiopub *q, const char *session_id);

#endif
