/*
 * daemon_http.h — the daemon's one HTTP gateway (gateway.h): started with the
 * daemon when its configuration names an address ("http", `serve --http`),
 * or later by the API's http.start, which `kernelmgr serve --http` sends
 * when the home's daemon already runs (started by an agent's `exec`, say):
 * the running daemon then serves its live sessions over HTTP too.
 *
 * Only kernelmgr-gateway has a gateway; `serve` continues in it whenever it
 * is beside kernelmgr (cli.c), so every daemon can serve HTTP later. A
 * daemon of the plain binary refuses with how to restart it.
 *
 * The service layer does not know the gateway (a frontend): the serve
 * command registers its operations (frontends/gwdaemon.h) before
 * daemon_serve(); without them the daemon serves no HTTP and says so. One
 * gateway per process; the functions may be called from any thread.
 */
#ifndef KERNELMGR_DAEMON_HTTP_H
#define KERNELMGR_DAEMON_HTTP_H

#include "kernelmgr/engine/km.h"

#include <stddef.h>

/* Where to listen (every pointer borrowed, only for the call). */
typedef struct daemon_http_listen {
    const char *listen;   /* "[ADDR:]PORT" (gateway.h) */
    const char *tls_cert; /* PEM files, absolute, both or neither; NULL/"": plain HTTP */
    const char *tls_key;
    int insecure; /* a non-loopback address without TLS */
} daemon_http_listen;

/* Serves m (borrowed; outlives the gateway) over HTTP at l (NULL: the
 * "http" and TLS keys of m's configuration), every other option from m's
 * configuration (token, origin, limits). When a gateway already serves: 0
 * with *started = 0 if l asks for what it serves (its address, port 0 or
 * its port, the same scheme), else KM_EUSAGE naming its URL (one gateway per
 * daemon). 0 with *started = 1 once listening (HOME/http.json written, a
 * line in the daemon's log), or a KM_E* code with err. url (urlsize bytes)
 * gets the gateway's URL, port its port. */
/* The gateway's operations (start and stop as below; borrowed, static). */
typedef struct daemon_http_ops {
    int (*start)(km_manager *m, const daemon_http_listen *l, int *started, char *url,
                 size_t urlsize, int *port, km_err *err);
    void (*stop)(void);
} daemon_http_ops;

/* Registers ops (NULL: none); before daemon_serve(), from one thread. */
void daemon_http_register(const daemon_http_ops *ops);

int daemon_http_start(km_manager *m, const daemon_http_listen *l, int *started, char *url,
                      size_t urlsize, int *port, km_err *err);

/* Stops the gateway, if any (every connection closed). */
void daemon_http_stop(void);

#endif
