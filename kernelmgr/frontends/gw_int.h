/*
 * gw_int.h — what the gateway's files share (gateway.h is the interface):
 * the gateway, its connections and REST jobs, and the functions each file
 * offers the others. Only the files linked into kernelmgr-gateway include
 * it (they use libwebsockets):
 *
 *   gateway.c  lifecycle: the token, the lws context and vhost, the service
 *              thread, the one lws callback (it dispatches to the others),
 *              start and stop
 *   gwhttp.c   HTTP: requests and bodies, the Host, Origin and token checks,
 *              the rate limit, responses, REST jobs on their own threads,
 *              connection admission before the token (gwpeers.h)
 *   gwrest.c   the Jupyter REST routes table and its handlers, kernel ids
 *              and models
 *   gwws.c     WebSockets: the kernel channels (gwrelay.h) and the
 *              kernelmgr API (gwapi.h)
 *
 * Threads: everything here runs on the service thread, except a REST job
 * (gw_rest_run and what it calls), which runs on its own thread and touches
 * only its job, the manager and g->mu.
 */
#ifndef KERNELMGR_GW_INT_H
#define KERNELMGR_GW_INT_H

#include "kernelmgr/frontends/gateway.h"
#include "kernelmgr/frontends/gwapi.h"
#include "kernelmgr/frontends/gwpeers.h"
#include "kernelmgr/frontends/gwrelay.h"
#include "kernelmgr/frontends/gwwire.h"

#include <jansson.h>
#include <libwebsockets.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

/* A kernel id: a UUID, or with a node_id "NODE-" and 14 bytes of hash in
 * hex (gwrest.c): at most 32 + 1 + 31 bytes. */
#define GW_KERNEL_ID_MAX 72

typedef struct gw_job gw_job;

/* Per-connection data (lws allocates it zeroed, one per wsi). */
typedef struct gw_conn {
    gateway *g;
    struct lws *wsi;
    /* HTTP */
    char method[8];
    char *path;                  /* after the /s/NAME/ prefix */
    char scope[KM_NAME_MAX + 1]; /* the request's session (gw_request_scope); "" none */
    unsigned char *body;
    size_t body_len;
    gw_job *job;
    unsigned status;
    char *resp;
    size_t resp_len;
    /* rate limit (token bucket) */
    double tokens, last;
    /* WebSocket */
    int is_ws;
    gw_form form;
    char kernel_id[GW_KERNEL_ID_MAX + 1];
    char session[KM_NAME_MAX + 1],
        lang[KM_LANG_NAME_MAX + 1]; /* the kernel's, found at the upgrade */
    char *cf;                       /* the connection file the relay was made from */
    gwrelay *relay;
    gwapi_conn *api; /* instead of relay: /api/kernelmgr/ws, the kernelmgr API */
    unsigned char *rx;
    size_t rx_len, rx_cap;
    int rx_too_big;
    int closing; /* a limit was hit: close (with close_why) once writeable */
    enum lws_close_status close_status;
    char close_why[124];
    unsigned char *tx; /* LWS_PRE + frame scratch */
    size_t tx_cap;
    struct gw_conn *next; /* gateway's WebSocket list (service thread only) */
} gw_conn;

struct gw_job {
    gateway *g;
    gw_conn *conn; /* NULL once the connection closed before the job ended */
    char method[8];
    char *path;
    char scope[KM_NAME_MAX + 1];
    unsigned char *body;
    size_t body_len;
    unsigned status;
    char *resp;
    int verbatim; /* the kernelmgr API's own response: passed on as the daemon wrote it */
    int done;
    gw_job *next_done;
};

struct gateway {
    km_manager *m;
    gateway_opts o;
    char *token, *home, *home_real, *listen_addr, *origin, *tls_cert, *tls_key;
    char token_source[1024]; /* where the token came from (gateway_token_source) */
    int port, tls;
    char url[128];
    struct lws_context *ctx;
    struct lws_vhost *vh;
    pthread_t thread;
    atomic_int stop;
    pthread_mutex_t mu;     /* done jobs, running job count */
    gw_job *done;           /* under mu */
    unsigned jobs;          /* running job threads, under mu */
    pthread_cond_t jobs_cv; /* jobs reached 0 */
    gw_conn *ws;            /* service thread only */
    unsigned n_ws;          /* service thread only */
    struct lws_protocols protocols[3];
    /* before the token (service thread only) */
    gwpeers *peers;
    unsigned conn_budget;    /* connections at once, from RLIMIT_NOFILE */
    unsigned header_timeout; /* http_header_timeout */
    unsigned long rlim;      /* RLIMIT_NOFILE at start */
    char *host;              /* http_host: another name the gateway answers to */
    int any_addr, loopback;  /* listening on 0.0.0.0 / on 127.0.0.0/8 */
    unsigned long refused[GWPEERS_TOTAL + 1], idle_closed; /* since the last log line */
    double last_log;
    lws_sorted_usec_list_t log_sul; /* the next log line, when one is held back */
};

/* A kernel of the manager found by id: session and language, whether it
 * is live, and its model (new). 0 found, -1 not. */
typedef struct gw_kernel {
    char session[KM_NAME_MAX + 1];
    char lang[KM_LANG_NAME_MAX + 1];
    int live;
    json_t *model;
} gw_kernel;

/* ---------------------------------------------------------------- gwhttp.c */

/* The token bucket of one connection: 0 when this event is within the rate. */
int gw_rate_exceeded(gw_conn *c, double rate);
/* steals v; new (free()) */
char *gw_json_text(json_t *v);
/* s (stolen) with every occurrence of the manager's home (as configured and
 * as resolved) replaced by "$KERNELMGR_HOME". new (free()); NULL when s is. */
char *gw_redact_home(const gateway *g, char *s);
/* Jupyter's error body: {"message": ..., "reason": ...}. new (free()). */
char *gw_error_body(const char *reason, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The session a request is scoped to (docs/MANY_MACHINES.md): the /s/NAME/
 * prefix of uri (*rest then points past it, "/" when nothing follows)
 * and/or the X-Kernelmgr-Session header. 0 with scope ("" for none), or -1
 * with why (not a valid session name; prefix and header disagree). */
int gw_request_scope(struct lws *wsi, const char *uri, const char **rest,
                     char scope[KM_NAME_MAX + 1], km_err *why);

/* 0 when the request carries the token (header or ?token=). */
int gw_authorized(gateway *g, struct lws *wsi);
/* 0 when a WebSocket upgrade's Origin (if any) is the Host's or the
 * configured one; -1 with why. */
int gw_origin_ok(gateway *g, struct lws *wsi, km_err *why);
/* 0 when the request's Host names this gateway; -1 with why. */
int gw_host_ok(const gateway *g, struct lws *wsi, km_err *why);

/* LWS_CALLBACK_HTTP, _HTTP_BODY; the lws callback's return value. */
int gw_on_http(struct lws *wsi, gw_conn *c, const char *uri);
int gw_on_http_body(struct lws *wsi, gw_conn *c, const void *in, size_t len);
/* LWS_CALLBACK_HTTP_WRITEABLE with a response waiting. */
int gw_write_response(struct lws *wsi, gw_conn *c);
/* Answers now: body (stolen) goes out on the next writeable callback. */
void gw_http_reply_now(struct lws *wsi, gw_conn *c, unsigned status, char *body);
/* Frees the request (path, body) of c. */
void gw_http_reset(gw_conn *c);

/* Starts the job of connection c (its method, path and body move into it):
 * 0, or -1 (no thread). */
int gw_start_job(gw_conn *c);
void gw_job_free(gw_job *j);
/* LWS_CALLBACK_EVENT_WAIT_CANCELLED: finished jobs' connections may write,
 * and so may every WebSocket. */
void gw_on_cancelled(gateway *g);

/* Connections before the token (gwpeers.h): at accept (0 go on, 1 close),
 * once instantiated (0, or -1 close), when destroyed. */
int gw_filter_connection(gateway *g, const struct lws_filter_network_conn_args *a);
int gw_admit_connection(gateway *g, struct lws *wsi);
void gw_release_connection(gateway *g, struct lws *wsi);
/* One log line of what was refused since the last (at most every 10 s
 * unless force). */
void gw_log_refusals(gateway *g, int force);

/* ---------------------------------------------------------------- gwrest.c */

/* Runs the REST request of j (its thread): the routes table. */
void gw_rest_run(gw_job *j);
/* The kernel of id: 0 with *out filled (out->model new), -1 none. */
int gw_find_kernel(gateway *g, const char *id, gw_kernel *out);
/* The answer for a kernel id that is not here: 404, naming this node when
 * the id names another (*body new). */
void gw_kernel_missing(const gateway *g, const char *id, unsigned *status, char **body);
/* The connection file of the live kernel (session, lang), new (free()), or
 * NULL when it is not running. Never starts one. */
char *gw_live_cf(gateway *g, const char *session, const char *lang);

/* ---------------------------------------------------------------- gwws.c */

/* LWS_CALLBACK_HTTP_CONFIRM_UPGRADE, _ESTABLISHED, _RECEIVE,
 * _SERVER_WRITEABLE: the lws callback's return value. */
int gw_confirm_upgrade(struct lws *wsi, gateway *g, const char *upgrade);
int gw_ws_established(struct lws *wsi, gw_conn *c, gateway *g);
int gw_ws_receive(struct lws *wsi, gw_conn *c, const void *in, size_t len);
int gw_ws_writeable(struct lws *wsi, gw_conn *c);
/* LWS_CALLBACK_CLOSED: the WebSocket's relay or API connection ends. */
void gw_ws_closed(gw_conn *c);
/* Every second: a kernel restarted by someone else has a new connection
 * file; the relay follows it. */
void gw_ws_follow(gateway *g, gw_conn *c, const char *session, const char *lang);

#endif
