/*
 * daemon.h — `kernelmgr serve`: the manager behind a unix socket, and the
 * client side the CLI uses.
 *
 * Socket: $KERNELMGR_HOME/kernelmgr.sock (mode 0600, in a 0700 directory).
 * Protocol: one JSON object per line each way. A request names an "op"; an
 * optional "id" is echoed in every line answering it. The last line of an
 * answer has "ok": true/false; before it, an exec with "stream": true gets
 * event lines ({"event":"stream"|"result", ...}, see km.h). An exec that
 * also has "raw_text": true gets each stream event with its text as bytes:
 * the event line carries "text_bytes": N instead of "text", and exactly N
 * bytes of UTF-8 text follow its '\n' (no escaping; a long output costs
 * neither side a JSON encode and parse of the text). Other events, and
 * stream events of other clients, stay JSON lines. Errors:
 *   {"id":..,"ok":false,"error":{"code":N,"message":"..."}}   (code: KM_E*)
 * Ops: ping, exec, sessions, close, interrupt, restart, files, export,
 * connection_file, shutdown (fields documented in daemon.c and README).
 * Requests on one connection are answered in order; open several
 * connections for concurrency (executions in different sessions run in
 * parallel, one session's executions are serialised).
 *
 * Server: one epoll event loop (accept, non-blocking reads and buffered
 * writes; an idle connection costs no thread) and a bounded pool of worker
 * threads (config daemon_workers, daemon_queue) that run requests; output
 * to a client is bounded per connection (client_buffer) and a client that
 * reads nothing for client_timeout seconds is dropped while its request
 * runs on. Details at the top of the server part of daemon.c.
 */
#ifndef KERNELMGR_DAEMON_H
#define KERNELMGR_DAEMON_H

#include "kernelmgr/km.h"

#include <signal.h>

/* Writes home/kernelmgr.sock into buf. 0, or -1 when it would not fit in a
 * sockaddr_un (err says so). */
int daemon_socket_path(const char *home, char *buf, size_t size, km_err *err);

/* Runs the daemon in the foreground until SIGTERM/SIGINT or a shutdown
 * request. Returns the exit status (0; 0 too when another daemon already
 * serves this home, after saying so). */
int daemon_serve(const char *home, const kmcfg *cfg, km_err *err);

/* Connects to the daemon of home; when none answers and autostart is set,
 * starts one (`kernelmgr serve`, detached, log in home/daemon.log; argv_extra
 * NULL-terminated options for it, e.g. --config PATH) and waits for it.
 * Returns the fd or -1 with err. */
int daemon_connect(const char *home, int autostart, char *const argv_extra[], km_err *err);

/* Writes o (borrowed) to fd as one line of compact JSON (the socket's
 * framing, both ways). 0, or -1 with errno. */
int daemon_send_json(int fd, const json_t *o);

/* Sends req (borrowed) and reads lines until the final one, which goes to
 * *reply (new). Event lines go to on_event (a "raw_text" stream event with
 * its "text" filled in from the bytes that follow it). While waiting, when *cancel
 * becomes non-zero, on_cancel(ud) is called once (e.g. to send an
 * interrupt on another connection). 0, or KM_EDAEMON with err. */
int daemon_call(int fd, const json_t *req, void (*on_event)(void *, const json_t *),
                void (*on_cancel)(void *), void *ud, volatile sig_atomic_t *cancel, json_t **reply,
                km_err *err);

#endif
