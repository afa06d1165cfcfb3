/*
 * mkclient.h — a ZeroMQ client of one kernel, built on protocol/jp.h.
 *
 * Sockets: shell, control and stdin as DEALER, iopub as SUB (all topics),
 * hb as REQ. Every message received is verified (signature, replay, sizes)
 * by jp_session_recv; anything malformed is dropped with one log line on
 * stderr, so a misbehaving kernel cannot take the manager down.
 *
 * Not thread-safe: one thread at a time (the session's lock).
 */
#ifndef KERNELMGR_MKCLIENT_H
#define KERNELMGR_MKCLIENT_H

#include "kernelmgr/engine/kmerr.h"

#include "jp.h"

typedef struct kclient kclient;

/* borrowed: the process-wide ZeroMQ context (created on first use). */
void *kclient_zctx(void);

/* new: connects to the kernel of conn. NULL with a reason in err. */
kclient *kclient_new(const jp_connection *conn, const char *label, km_err *err);
void kclient_destroy(kclient **kc);

/* Sends a request msg_type with content (steals; NULL = {}) on ch (shell,
 * control or stdin). When parent is not NULL (borrowed) it becomes the
 * parent header. msg_id (may be NULL) receives the request's id. 0 or -1. */
int kclient_send(kclient *kc, jp_channel ch, const char *msg_type, json_t *content,
                 const jmsg *parent, char msg_id[37]);

/* Waits up to timeout_ms for one message on shell, iopub, control or stdin.
 * Returns 1 with *out (new) and *ch set, 0 on timeout, -1 on a socket error.
 * Malformed messages are logged and skipped (the wait goes on): 0 means no
 * good message was there, also with timeout_ms 0 (what a caller draining
 * everything that has arrived relies on). */
int kclient_recv(kclient *kc, int timeout_ms, jp_channel *ch, jmsg **out);

/* Reads and drops, without verifying or parsing, up to max whole IOPub
 * messages already queued; returns how many. For a kernel no execution is
 * reading: its IOPub must keep draining, or the kernel takes this client
 * for a stuck subscriber while another client floods it (and cuts it). */
unsigned long kclient_discard_iopub(kclient *kc, unsigned long max);

/* Sends a kernel_info_request every 500 ms until a reply arrives and iopub
 * has delivered a message too (so no output of the first execution is lost
 * to the PUB/SUB slow-joiner race), or until timeout_s passes, or alive()
 * returns 0. Returns the reply content (new) or NULL with a reason in err. */
json_t *kclient_wait_ready(kclient *kc, double timeout_s, int (*alive)(void *), void *ud,
                           km_err *err);

/* Heartbeat round trip within timeout_ms: 1 answered, 0 not. */
int kclient_heartbeat(kclient *kc, int timeout_ms);

/* borrowed: the Jupyter session id in the header of every message this
 * client sends (a reply's or output's parent_header.session names it), so a
 * message caused by another client's request is told from ours. */
const char *kclient_session_id(const kclient *kc);

/* Number of malformed messages dropped so far. */
unsigned long kclient_dropped(const kclient *kc);

/* Current monotonic time in seconds. */
double kclient_now(void);

#endif
