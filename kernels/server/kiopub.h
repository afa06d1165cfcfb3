/*
 * kiopub.h — the IOPub publisher with back-pressure.
 *
 * IOPub is an XPUB socket with ZMQ_XPUB_NODROP: when a subscriber is slow,
 * libzmq refuses new messages instead of dropping them. Refused messages wait
 * in a FIFO here, and kiopub_congested() tells the server to stop reading the
 * worker's pipes, so a flood of output blocks the worker (the pipe fills)
 * instead of growing memory or losing output.
 */
#ifndef KERNELS_SERVER_KIOPUB_H
#define KERNELS_SERVER_KIOPUB_H

#include <stddef.h>

#include "jp.h"

#define KIOPUB_CONGESTED_BYTES (1u << 20)

typedef struct kiopub kiopub;

/* new: publishes on zsock (borrowed, an XPUB socket) signing with session
 * (borrowed). NULL when out of memory. */
kiopub *kiopub_new(void *zsock, const jp_session *session);
void kiopub_destroy(kiopub **q);

/* Encodes msg (borrowed) now and sends it, or queues it behind earlier
 * messages. 0, or -1 when it could not be encoded (logged by the caller). */
int kiopub_publish(kiopub *q, const jmsg *msg, jp_error *err);

/* Sends as much of the queue as the socket accepts. Returns the number of
 * messages still waiting. */
size_t kiopub_flush(kiopub *q);

/* Bytes waiting in the queue. */
size_t kiopub_pending(const kiopub *q);

/* 1 when the queue holds more than KIOPUB_CONGESTED_BYTES. */
int kiopub_congested(const kiopub *q);

/* Receives and discards subscription messages (XPUB delivers them to us). */
void kiopub_drain_subscriptions(kiopub *q);

#endif
