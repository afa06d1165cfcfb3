/*
 * gwdaemon.c — the daemon's one gateway, started at the daemon's start or
 * by http.start: the daemon_http_ops (service/daemon_http.h) the serve
 * command registers (gwdaemon.h).
 */
#include "kernelmgr/frontends/gwdaemon.h"
#include "kernelmgr/frontends/gateway.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t http_mu = PTHREAD_MUTEX_INITIALIZER;
static gateway *http_gw; /* under http_mu */

/* 0 when l names what g serves: the same address and scheme, and port 0 or
 * g's port. */
static int same_listen(const gateway *g, const daemon_http_listen *l)
{
    char addr[64], want[sizeof addr + 32];
    km_err why = {0};
    int port = 0;
    if (gw_parse_listen(l->listen, addr, sizeof addr, &port, &why))
        return -1;
    int tls = l->tls_cert && *l->tls_cert;
    snprintf(want, sizeof want, "%s://%s:%d/", tls ? "https" : "http", addr,
             port ? port : gateway_port(g));
    return strcmp(want, gateway_url(g)) ? -1 : 0;
}

static int gw_http_start(km_manager *m, const daemon_http_listen *l, int *started, char *url,
                         size_t urlsize, int *port, km_err *err)
{
    const kmcfg *cfg = km_manager_config(m);
    daemon_http_listen from_cfg = {cfg->http, cfg->http_tls_cert, cfg->http_tls_key,
                                   cfg->http_insecure};
    if (!l)
        l = &from_cfg;
    *started = 0;
    if (!gateway_built_in()) {
        char why[900];
        snprintf(why, sizeof why,
                 "this daemon (pid %d) cannot serve HTTP: it runs the kernelmgr binary without "
                 "the gateway (kernelmgr-gateway was not beside it when it started). Stop it "
                 "with `kernelmgr serve --stop` (its kernels end: variables are lost, "
                 "workspaces and sessions stay), then run `kernelmgr serve --http %s`",
                 (int)getpid(), l->listen ? l->listen : "[ADDR:]PORT");
        return km_err_set(err, KM_EUSAGE, "%s", why);
    }
    pthread_mutex_lock(&http_mu);
    int rc = 0;
    if (http_gw) {
        if (same_listen(http_gw, l)) {
            char why[600];
            snprintf(why, sizeof why,
                     "the daemon already serves HTTP at %s (one address per daemon): stop it "
                     "with `kernelmgr serve --stop` to serve elsewhere",
                     gateway_url(http_gw));
            rc = km_err_set(err, KM_EUSAGE, "%s", why);
        }
    } else {
        gateway_opts go = {
            .listen = l->listen,
            .token = cfg->http_token,
            .token_file = cfg->http_token_file,
            .tls_cert = l->tls_cert,
            .tls_key = l->tls_key,
            .insecure = l->insecure,
            .origin = cfg->http_origin,
            .max_body = (size_t)cfg->http_max_body,
            .max_message = (size_t)cfg->http_max_message,
            .max_pending = (size_t)cfg->http_max_pending,
            .max_connections = cfg->http_max_connections,
            .rate = cfg->http_rate,
        };
        km_err why = {0};
        http_gw = gateway_start(m, &go, &why);
        if (!http_gw) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot serve HTTP: %.511s", why.msg);
            rc = km_err_set(err, KM_EUSAGE, "%s", msg);
        } else {
            *started = 1;
            fprintf(stderr, "kernelmgr: Jupyter gateway at %s (token from %s)\n",
                    gateway_url(http_gw), gateway_token_source(http_gw));
        }
    }
    if (!rc) {
        if (url)
            snprintf(url, urlsize, "%s", gateway_url(http_gw));
        if (port)
            *port = gateway_port(http_gw);
    }
    pthread_mutex_unlock(&http_mu);
    return rc;
}

static void gw_http_stop(void)
{
    pthread_mutex_lock(&http_mu);
    gateway_stop(&http_gw);
    pthread_mutex_unlock(&http_mu);
}

const daemon_http_ops gwdaemon_ops = {gw_http_start, gw_http_stop};
