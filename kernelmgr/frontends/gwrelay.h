/*
 * gwrelay.h — relays one kernel WebSocket connection to one kernel's ZeroMQ
 * channels (shell, control, stdin as DEALER; iopub as SUB), signing what the
 * client sends with the kernel's key and verifying what the kernel sends.
 *
 * A relay runs its own thread, which owns the ZeroMQ sockets. The
 * WebSocket side (another thread) hands it client messages with
 * gwrelay_send and takes encoded frames for the client with gwrelay_pop;
 * the relay calls wake(ud) from its thread whenever frames are waiting.
 *
 * Bounds: frames waiting for a slow client are capped at max_pending bytes;
 * past it the relay fails ("the client did not read N bytes (limit M)") and
 * the connection is to be closed: a slow or vanished client never stalls the
 * kernel (whose IOPub drops a stuck subscriber in turn). Client messages
 * waiting for the kernel are capped the same way.
 *
 * Until the kernel's JEP 65 iopub_welcome shows that the IOPub subscription
 * is live (or 2 s pass, for kernels that send none), client messages are
 * held, so no output of a first request is lost to the slow-joiner race.
 * iopub_welcome messages themselves are not forwarded.
 *
 * The relay records nothing itself: the manager's own client of the kernel
 * sees every cell on its IOPub and writes the session's history
 * (mkforeign.h); the relay only notes which execute_requests came from a
 * WebSocket, so the history and `waited` can say so. Nothing the client
 * sends is held back, dropped or reordered for it.
 */
#ifndef KERNELMGR_GWRELAY_H
#define KERNELMGR_GWRELAY_H

#include "kernelmgr/engine/kmerr.h"

#include "kernelmgr/frontends/gwwire.h"

#include <stddef.h>

typedef struct gwrelay gwrelay;

/* new: a relay to the kernel of conn (borrowed, copied) speaking form to its
 * client. NULL with a reason in err when the sockets cannot be set up. */
gwrelay *gwrelay_new(const jp_connection *conn, gw_form form, size_t max_pending,
                     void (*wake)(void *ud), void *ud, km_err *err);

/* Stops the thread, closes the sockets, frees what is queued. NULL-safe. */
void gwrelay_destroy(gwrelay **r);

/* Queues msg (stolen) for the kernel's channel ch. 0, or -1 when the relay
 * has failed or its queue is over the limit (reason via gwrelay_failed). */
int gwrelay_send(gwrelay *r, jp_channel ch, jmsg *msg);

/* Takes the next frame for the client: 1 with *data new (free()), *len and
 * *binary set; 0 when none waits. */
int gwrelay_pop(gwrelay *r, unsigned char **data, size_t *len, int *binary);

/* 1 when the relay has failed (it relays nothing more), with why. */
int gwrelay_failed(gwrelay *r, km_err *why);

#endif
