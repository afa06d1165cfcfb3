/*
 * mkforeign.h — the cells other clients run on one kernel of a session: a
 * Jupyter frontend on a gateway kernel WebSocket, `jupyter console
 * --existing`, anything holding the connection file.
 *
 * The manager's own client of the kernel subscribes to all of its IOPub, so
 * it sees such a cell as the kernel runs it: status busy (parent: the other
 * client's execute_request), execute_input (its code), its outputs, idle.
 * A kforeign follows that stream and records the cell in the session's
 * history exactly as km_exec records its own blocks (session.h: "started"
 * when the kernel starts it, "finished" with its outputs at idle, the same
 * caps: output_cap, display_max, history_max), with "client" naming who ran
 * it. It also knows whether such a cell runs now, so an exec waits for it
 * and says so (`waited`) instead of queueing unseen behind it in the kernel.
 *
 * Whoever reads the kernel's client feeds it (codeexec while a block runs,
 * km_exec while it waits, km_tick for idle sessions): the same thread rules
 * as the kclient (the session's lock). The history is the manager's
 * history.jsonl only; the kernel's own Jupyter history (khistory.c) is
 * another thing (history_request) and is not read for this.
 */
#ifndef KERNELMGR_MKFOREIGN_H
#define KERNELMGR_MKFOREIGN_H

#include "jp.h"

#include <stdint.h>

typedef struct kforeign kforeign;

/* new (kforeign_destroy): follows the kernel whose manager-side client
 * signs as own_session (kclient_session_id; copied: messages caused by that
 * client's requests are not foreign). session_dir and language are
 * borrowed and must outlive f: the session's own dir array, read at each
 * write (a warm-pool entry's kernels keep their kforeign when the entry
 * becomes a named session, whose dir it then is), and the language table's
 * name. NULL when out of memory. */
kforeign *kforeign_new(const char *own_session, const char *session_dir, const char *language,
                       uint64_t history_max, size_t output_cap, uint64_t display_max);

/* Ends the follow: a cell still running is recorded as finished with
 * status "killed" and why (the kernel stopped). NULL-safe. */
void kforeign_destroy(kforeign **f, const char *why);

/* One message (borrowed) received from the kernel on ch. Returns 1 when it
 * belongs to another client's execution (recorded), else 0 (ours, or not
 * an execution). */
int kforeign_feed(kforeign *f, jp_channel ch, const jmsg *m);

/* 1 while another client's cell runs on the kernel (busy seen, idle not
 * yet, none of its messages dropped unread: its idle may have been one), with *since (kclient_now()
 * when it was seen starting) and *client
 * ("websocket" or "jupyter", static) when not NULL. */
int kforeign_busy(const kforeign *f, double *since, const char **client);

/* n IOPub messages were dropped unread (kclient_discard_iopub: a flood
 * more than a tick reads): a cell running now says so in its outputs. */
void kforeign_lost(kforeign *f, unsigned long n);

/* The client of the last cell seen starting ("websocket", "jupyter"), or
 * NULL when none was. */
const char *kforeign_last_client(const kforeign *f);

/* Process-wide: the request msg_id (the execute_request a gateway relay
 * forwards) came from client (a static string, e.g. "websocket"), so the
 * history and `waited` can name it. The last KFOREIGN_NOTES are kept. */
#define KFOREIGN_NOTES 1024
void kforeign_note(const char *msg_id, const char *client);

/* A phrase for client: "a cell a WebSocket client of the gateway runs",
 * "a cell another Jupyter client of the kernel runs". */
const char *kforeign_describe(const char *client);

#endif
