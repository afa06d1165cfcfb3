/*
 * kdbg.h — the Jupyter debug protocol's relay: debug_request messages (on
 * the control channel) go to the worker over its debug pipes
 * (WORKER_PROTOCOL.md "Debug pipes"), never over the request pipe, which a
 * cell stopped at a breakpoint keeps busy; the worker's answers become
 * debug_reply messages to their senders and its DAP events debug_event
 * messages on IOPub. The server understands no DAP: it only pairs each
 * reply with its request and bounds what is in flight.
 *
 * State lives in kserver.dbg (owned, made on the first request).
 */
#ifndef KERNELS_SERVER_KDBG_H
#define KERNELS_SERVER_KDBG_H

#include <jansson.h>

#include "jp.h"

struct kserver;
struct kshell_msg;

/* Requests in flight at most; one more is answered at once with a failure
 * naming the limit. */
#define KDBG_MAX_PENDING 256

/* The kshell_msgs[] handler of debug_request: msg is borrowed. */
void kdbg_answer(struct kserver *ks, void *sock, jmsg *msg, const struct kshell_msg *m);

/* One line the worker wrote to its debug pipe (ev borrowed): {"id": N,
 * "reply": {...}} answers request N, {"event": {...}} is published. */
void kdbg_on_line(void *ks, json_t *ev);

/* The worker said it is ready: requests held while it started are sent
 * (or refused when it has no debugger). */
void kdbg_worker_ready(struct kserver *ks);

/* The worker is gone (or was replaced): every request in flight is
 * answered with a failure naming why (borrowed). */
void kdbg_worker_gone(struct kserver *ks, const char *why);

/* Frees kserver.dbg. NULL-safe. */
void kdbg_free(struct kserver *ks);

#endif
