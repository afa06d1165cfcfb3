/*
 * kreplyq.h — replies on the shell and control ROUTER sockets without
 * losing them to a client that reads slowly.
 *
 * A ROUTER socket silently drops a message for a peer whose queue is full
 * (ZMQ_SNDHWM). With ZMQ_ROUTER_MANDATORY it says EAGAIN instead; such a
 * reply waits here, and while anything waits the server reads no new
 * requests (kreplyq_waiting()), so a client that floods requests and reads
 * its replies slowly is slowed down instead of losing replies. A peer that
 * takes nothing for KREPLYQ_STALL_NS is "stuck": its waiting replies are
 * dropped (logged) and later ones that would block are dropped at once, as
 * a plain ROUTER does, until one is accepted again; so a client that never
 * reads holds the others up once, for that grace period, not again and
 * again.
 */
#ifndef KERNELS_SERVER_KREPLYQ_H
#define KERNELS_SERVER_KREPLYQ_H

#include <stddef.h>
#include <stdint.h>

#include "jp.h"

#define KREPLYQ_STALL_NS 2000000000ull
#define KREPLYQ_MAX_STUCK 16 /* stuck peers remembered (oldest forgotten) */

typedef struct kreplyq kreplyq;

/* new, or NULL when out of memory. */
kreplyq *kreplyq_new(void);
void kreplyq_destroy(kreplyq **q);

/* Sends frames (stolen, n of them: routing ids first) on sock (borrowed, a
 * ROUTER with ZMQ_ROUTER_MANDATORY) now, or queues them when the peer's
 * queue is full. 0, or -1 when dropped (peer gone, stuck, or out of
 * memory; reason in err). */
int kreplyq_send(kreplyq *q, void *sock, jp_frame *frames, size_t n, char *err, size_t errlen);

/* Sends what the peers accept now, drops what waited too long. Returns the
 * number of replies still waiting. */
size_t kreplyq_flush(kreplyq *q);

/* Replies waiting. */
size_t kreplyq_waiting(const kreplyq *q);

#endif
