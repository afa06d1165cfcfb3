/*
 * daemon_int.h — what the files of the daemon share; the rest of the tree
 * uses daemon.h. One job per file:
 *
 *   daemon.c    `kernelmgr serve`: the home, the lock, signals, the socket,
 *               the pid file and the tick thread; wires the loop to the methods
 *   dloop.c     the event loop: connections, their input and bounded output,
 *               the worker pool with its reserve for short requests
 *   dreq.c      one request in flight: its replies, its exec's stream events
 *   dmethods.c  the methods: the table dmethods[] (the tiers and fields each
 *               takes, read by the tier check) and their handlers
 *   dclient.c   the client: connect (starting a daemon), call, the line reader
 *
 * Threads: the loop thread owns a connection's input, its registration and
 * busy; a worker runs one request of it at a time (a dreq on its stack); a
 * connection's output is under its mu, written by both.
 */
#ifndef KERNELMGR_DAEMON_INT_H
#define KERNELMGR_DAEMON_INT_H

#include "kernelmgr/service/daemon.h"
#include "kernelmgr/service/dtier.h"

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>

/* The longest line either side reads (a request, a response, the bytes of
 * a raw_text event). */
#define DAEMON_MAX_LINE (64u << 20)

/* The manager the daemon serves (daemon.c; set while daemon_serve runs). */
extern km_manager *daemon_mgr;
/* Set by a signal or the shutdown method: the loop and the tick thread end. */
extern volatile sig_atomic_t daemon_stop;

/* A connected fd to the unix socket at path sock, or -1 (dclient.c). */
int daemon_try_connect(const char *sock);

/* ------------------------------------------------------------- dloop.c */

/* One client connection. Freed by the last dconn_unref. */
typedef struct dconn {
    int fd;
    pid_t peer_pid; /* SO_PEERCRED at accept: named when another exec waits for this one */
    int refs;       /* loop thread only: 1 while registered + 1 per request in flight */
    int registered;
    /* input: loop thread only */
    char *rbuf;
    size_t rlen, rcap;
    int rd_eof;
    int busy; /* a request is queued or running */
    /* output: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* output drained or the connection dropped */
    int dead;          /* dropped or broken: nothing more is written */
    char *obuf;
    size_t ohead, olen, ocap;
    double last_progress;
    int discarding; /* stream events are being dropped for this client */
    unsigned long long discarded;
    json_int_t last_block;
    /* what this connection may do (dtier.h): owner until initialize lowers
     * it; set and read by the worker running its one request in flight */
    dtier_grant grant;
    char *allowlist;           /* the operator's allowlist given at initialize, or NULL */
    struct dconn *prev, *next; /* every registered connection (loop thread) */
} dconn;

/* new: a connection on fd (owned: closed by the last dconn_unref), tier
 * owner, one reference; NULL when out of memory (fd left open). */
dconn *dconn_new(int fd, pid_t peer_pid);
void dconn_unref(dconn *c);

/* Writes one line (s, n bytes with its '\n') to the client. An event may be
 * dropped for a client that does not read (dloop.c); a final reply is
 * always queued. Called by workers and by the loop. */
void dconn_write(dconn *c, const char *s, size_t n, int is_event);
/* o (borrowed) as one compact line. */
void dconn_write_json(dconn *c, const json_t *o, int is_event);

/* The loop: the listening socket, every registered connection. */
typedef struct dloop {
    int ep, lfd;
    dconn *all;
    unsigned nconns;
} dloop;

/* Sets up the loop on L->lfd (listening, non-blocking) and starts the worker
 * pool by cfg (daemon_workers, daemon_queue, client_buffer,
 * client_timeout); *workers says how many started. 0, or KM_EDAEMON with err. */
int dloop_start(dloop *L, const kmcfg *cfg, unsigned *workers, km_err *err);
/* Serves until daemon_stop. */
void dloop_run(dloop *L);
/* Wakes the loop (a finished request, a dead connection, daemon_stop). */
void dloop_wake(void);
/* Drops every connection (sending what the socket takes now), then reaps. */
void dloop_drop_all(dloop *L);
/* Finished requests release their connection (and the next line of each
 * still registered is served). */
void dloop_reap(dloop *L);
/* Closes the epoll fd (L->lfd is the caller's). */
void dloop_close(dloop *L);

/* -------------------------------------------------------------- dreq.c */

/* One request in flight, on the stack of the worker that runs it: where
 * its answer goes and the scratch its handler fills (err from a km_* call,
 * why for a refusal). */
typedef struct dreq {
    dconn *dc;
    json_t *id;         /* borrowed from the request */
    const char *method; /* the table's name (static) */
    int dead;           /* the client went away: keep running, stop writing */
    int raw;            /* exec with "raw_text": stream text follows its event line as bytes */
    dtier tier;         /* the connection's when the request started: what replies may carry */
    km_err err;         /* filled by the km_* call the handler makes */
    km_err why;         /* a refusal's reason, for rpc_unpack and its kin */
} dreq;

/* A request of c with id (borrowed) for method (static; NULL outside a
 * method), at c's tier now. */
void dreq_init(dreq *r, dconn *c, json_t *id, const char *method);

/* The replies; each sends exactly one response. */
/* result (stolen; NULL = {}), scrubbed for the tier */
void dreq_ok(dreq *r, json_t *result);
/* an error of the operation (a KM_E* code, rpc.h) */
void dreq_err(dreq *r, int km_code, const char *msg);
/* the error of the km_* call in r->err */
void dreq_fail(dreq *r);
/* by the outcome of a km_* call returning a result: res (stolen) or, when
 * it is NULL, r->err */
void dreq_reply(dreq *r, json_t *res);
/* a request refused before anything is done (invalid params): "method: why" */
void dreq_invalid(dreq *r, const char *why);
/* the same with the reason formatted into r->why */
void dreq_invalidf(dreq *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* km_exec's event callback (ud: the dreq): each event as a notification
 * {"method":"event","params":{"request_id","event",...}}. */
void dreq_on_event(void *ud, const json_t *ev);

/* ---------------------------------------------------------- dmethods.c */

/* One API method: its handler gets the validated request's params, once
 * the tier of the connection was found to permit the method and every
 * field it sent (dtier_check_fields) — an allowlist per tier. */
typedef struct dmethod {
    const char *name;
    void (*fn)(dreq *r, const json_t *params);
    int is_long;               /* may run code or start kernels: not on the reserve */
    unsigned tiers;            /* DT_* bits: the tiers that may call it */
    const char *why;           /* why the others may not */
    const dtier_field *fields; /* the fields it takes and who may send each */
    int sopts;                 /* it also takes the session options (dtier_sessopts) */
} dmethod;

/* Reads one request line of c (len bytes, no '\n'): answers what is not a
 * request for a known method (a parse error, an unknown method; the API
 * ignores notifications and responses) and returns NULL; else returns the
 * method with *req the whole request (new). */
const dmethod *dmethod_request(dconn *c, const char *line, size_t len, json_t **req);

/* Runs req (borrowed) of c for method d: the tier check, then the handler;
 * exactly one response is written to c. */
void dmethod_run(dconn *c, const json_t *req, const dmethod *d);

/* dmethod_request then dmethod_run, in the calling thread: one request
 * line through the method table with no loop or pool (a test's fake
 * connection, e.g. one end of a socketpair; daemon_mgr must be set). */
void dmethod_run_line(dconn *c, const char *line, size_t len);

#endif
