/*
 * gwws.c — the gateway's WebSockets (gw_int.h): the kernel channels
 * (/api/kernels/ID/channels, relayed by gwrelay.h with the kernel's key on
 * this side) and the kernelmgr API (/api/kernelmgr/ws, gwapi.h), their
 * upgrade checks, message limits, rate and close reasons.
 */
#include "kernelmgr/frontends/gw_int.h"

#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---------------------------------------------------------------- WebSocket */

static void relay_wake(void *ud)
{
    gateway *g = ud;
    lws_cancel_service(g->ctx);
}

/* The kernel id of ".../api/kernels/ID/channels", or -1. */
#define GW_API_PATH "/api/kernelmgr"
#define GW_API_WS_PATH "/api/kernelmgr/ws"

static int channels_path(const char *uri, char id[GW_KERNEL_ID_MAX + 1])
{
    const char *pre = "/api/kernels/";
    const char *p = strstr(uri, pre);
    if (!p || p != uri)
        return -1;
    p += strlen(pre);
    const char *slash = strchr(p, '/');
    if (!slash || slash - p > GW_KERNEL_ID_MAX || slash == p || strcmp(slash, "/channels"))
        return -1;
    memcpy(id, p, (size_t)(slash - p));
    id[slash - p] = 0;
    return 0;
}

/* A refused upgrade: answered; an unauthenticated connection is then closed
 * (-1: lws hangs up), an authenticated one kept (1). */
static int refuse_upgrade(struct lws *wsi, unsigned status, const char *why)
{
    lws_return_http_status(wsi, status, why);
    return gwpeers_is_authenticated(lws_get_opaque_user_data(wsi)) ? 1 : -1;
}

int gw_confirm_upgrade(struct lws *wsi, gateway *g, const char *upgrade)
{
    char uri[1024], id[GW_KERNEL_ID_MAX + 1], scope[KM_NAME_MAX + 1];
    km_err why = {0}, swhy = {0};
    const char *rest = uri;
    gwpeers_request(lws_get_opaque_user_data(wsi));
    if (gw_host_ok(g, wsi, &why))
        return refuse_upgrade(wsi, 403, why.msg);
    if (!upgrade || strcasecmp(upgrade, "websocket"))
        return refuse_upgrade(wsi, 400, "only a WebSocket upgrade is served");
    if (lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI) <= 0)
        return refuse_upgrade(wsi, 404, "no WebSocket here: use /api/kernels/ID/channels");
    /* a bad /s/NAME/ prefix or header is said once the token was shown */
    int bad_scope = gw_request_scope(wsi, uri, &rest, scope, &swhy);
    if (!bad_scope && channels_path(rest, id) && strcmp(rest, GW_API_WS_PATH))
        return refuse_upgrade(wsi, 404, "no WebSocket here: use /api/kernels/ID/channels");
    if (gw_authorized(g, wsi))
        return refuse_upgrade(wsi, 401, "a valid token is required");
    gwpeers_authenticated(g->peers, lws_get_opaque_user_data(wsi));
    if (bad_scope)
        return refuse_upgrade(wsi, 400, swhy.msg);
    if (gw_origin_ok(g, wsi, &why)) {
        lws_return_http_status(wsi, 403, why.msg);
        return 1;
    }
    if (g->n_ws >= g->o.max_connections) {
        km_err_set(&why, KM_EUSAGE, "too many WebSocket connections (limit %u)",
                   g->o.max_connections);
        lws_return_http_status(wsi, 503, why.msg);
        return 1;
    }
    return 0;
}

static void ws_unlink(gateway *g, gw_conn *c)
{
    for (gw_conn **pp = &g->ws; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            g->n_ws--;
            return;
        }
}

/* (Re)connects c's relay to the kernel's current connection file cf
 * (stolen). 0, or -1 with why. */
static int ws_connect(gateway *g, gw_conn *c, char *cf, km_err *why)
{
    jp_connection conn;
    jp_error je;
    int rc = -1;
    gwrelay_destroy(&c->relay);
    free(c->cf);
    c->cf = cf;
    if (jp_connection_read(cf, &conn, &je) != JP_OK)
        km_err_set(why, KM_EUSAGE, "the kernel's connection file: %s", je.reason);
    else if ((c->relay = gwrelay_new(&conn, c->form, g->o.max_pending, relay_wake, g, why)))
        rc = 0;
    sodium_memzero(&conn, sizeof conn);
    return rc;
}

/* Every second: a kernel restarted by someone else (the agent, a restart
 * after a crash) has a new connection file; the relay follows it. */
void gw_ws_follow(gateway *g, gw_conn *c, const char *session, const char *lang)
{
    char *cf = gw_live_cf(g, session, lang);
    if (cf && c->cf && strcmp(cf, c->cf)) {
        km_err why = {0};
        if (ws_connect(g, c, cf, &why))
            fprintf(stderr, "kernelmgr gateway: cannot follow kernel %s to its restart: %s\n",
                    c->kernel_id, why.msg);
        lws_callback_on_writable(c->wsi);
        return;
    }
    free(cf);
}

/* Closes a WebSocket with status and why as its close reason (at most 120
 * bytes: a close frame's reason must fit in 123); returns -1 for the lws
 * callback to return. */
static int ws_close(struct lws *wsi, enum lws_close_status status, const char *why)
{
    struct lws_vhost *vh = lws_get_vhost(wsi);
    const gateway *g = vh ? lws_get_vhost_user(vh) : NULL;
    char *r = g ? gw_redact_home(g, strdup(why)) : NULL;
    const char *t = r ? r : why;
    size_t n = strlen(t);
    lws_close_reason(wsi, status, (unsigned char *)t, n > 120 ? 120 : n);
    free(r);
    return -1;
}

int gw_ws_established(struct lws *wsi, gw_conn *c, gateway *g)
{
    char uri[1024];
    c->g = g;
    c->wsi = wsi;
    c->is_ws = 1;
    const struct lws_protocols *pr = lws_get_protocol(wsi);
    c->form = pr && pr->name && !strcmp(pr->name, GW_SUBPROTOCOL_V1) ? GW_FORM_V1 : GW_FORM_JSON;
    const char *rest;
    km_err swhy = {0};
    if (lws_hdr_copy(wsi, uri, sizeof uri, WSI_TOKEN_GET_URI) <= 0 ||
        gw_request_scope(wsi, uri, &rest, c->scope, &swhy))
        return -1; /* checked at the upgrade */
    if (!strcmp(rest, GW_API_WS_PATH)) {
        km_err why = {0};
        snprintf(c->kernel_id, sizeof c->kernel_id, "api");
        c->api = gwapi_open(g->home, c->scope, g->o.max_pending, relay_wake, g, &why);
        if (!c->api) {
            return ws_close(wsi, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, why.msg);
        }
        c->next = g->ws;
        g->ws = c;
        g->n_ws++;
        return 0;
    }
    if (channels_path(rest, c->kernel_id))
        return -1;
    gw_kernel gk = {0};
    km_err why = {0};
    const char *node = km_manager_config(g->m)->node_id;
    if (gw_find_kernel(g, c->kernel_id, &gk)) {
        km_err_set(&why, KM_EUSAGE, "no kernel %s%s%s%s", c->kernel_id, node[0] ? " on node " : "",
                   node, node[0] ? " (a kernel id's first field names its node)" : "");
    } else if (c->scope[0] && strcmp(gk.session, c->scope)) {
        km_err_set(&why, KM_EUSAGE, "kernel %s is not a kernel of session %s (the URL's /s/%s/)",
                   c->kernel_id, c->scope, c->scope);
    } else {
        km_err e = {0};
        char cf[4096];
        char *dup = NULL;
        snprintf(c->session, sizeof c->session, "%s", gk.session);
        snprintf(c->lang, sizeof c->lang, "%s", gk.lang);
        if (km_connection_file(g->m, gk.session, gk.lang, cf, sizeof cf, &e))
            km_err_set(&why, KM_EUSAGE, "%.500s", e.msg);
        else if (!(dup = strdup(cf)))
            km_err_set(&why, KM_EUSAGE, "out of memory");
        else
            ws_connect(g, c, dup, &why);
    }
    json_decref(gk.model);
    if (!c->relay) {
        fprintf(stderr, "kernelmgr gateway: WebSocket for kernel %s refused: %s\n", c->kernel_id,
                why.msg);
        return ws_close(wsi, LWS_CLOSE_STATUS_UNEXPECTED_CONDITION, why.msg);
    }
    c->next = g->ws;
    g->ws = c;
    g->n_ws++;
    lws_set_timer_usecs(wsi, 1000000);
    return 0;
}

int gw_ws_receive(struct lws *wsi, gw_conn *c, const void *in, size_t len)
{
    gateway *g = c->g;
    if (!c->relay && !c->api)
        return -1;
    if (lws_is_first_fragment(wsi)) {
        c->rx_len = 0;
        c->rx_too_big = 0;
    }
    if (!c->rx_too_big) {
        if (c->rx_len + len > g->o.max_message) {
            c->rx_too_big = 1;
        } else {
            if (c->rx_len + len > c->rx_cap) {
                size_t cap = c->rx_cap ? c->rx_cap : 4096;
                while (cap < c->rx_len + len)
                    cap *= 2;
                unsigned char *nb = realloc(c->rx, cap);
                if (!nb)
                    return -1;
                c->rx = nb;
                c->rx_cap = cap;
            }
            memcpy(c->rx + c->rx_len, in, len);
            c->rx_len += len;
        }
    }
    if (!lws_is_final_fragment(wsi) || lws_remaining_packet_payload(wsi))
        return 0;
    km_err why = {0};
    /* A limit closes the connection with a close frame saying which limit;
     * the close waits for the next writeable callback, so that what the
     * client already sent is read (closing with unread input would reset
     * the connection and lose the close frame). Input meanwhile is dropped. */
    if (c->closing)
        return 0;
    if (c->rx_too_big || gw_rate_exceeded(c, g->o.rate)) {
        c->closing = 1;
        c->close_status =
            c->rx_too_big ? LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE : LWS_CLOSE_STATUS_POLICY_VIOLATION;
        if (c->rx_too_big)
            snprintf(c->close_why, sizeof c->close_why, "message over the limit of %zu bytes",
                     g->o.max_message);
        else
            snprintf(c->close_why, sizeof c->close_why,
                     "rate limit of %.0f messages per second exceeded", g->o.rate);
        fprintf(stderr, "kernelmgr gateway: closing a WebSocket of kernel %s: %s\n", c->kernel_id,
                c->close_why);
        lws_callback_on_writable(wsi);
        return 0;
    }
    if (c->api) {
        if (gwapi_send(c->api, (const char *)c->rx, c->rx_len)) {
            gwapi_failed(c->api, &why);
            return ws_close(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, why.msg);
        }
        return 0;
    }
    jp_channel ch;
    jmsg *m = NULL;
    km_err err = {0};
    if (gwwire_decode(c->form, lws_frame_is_binary(wsi), c->rx, c->rx_len, &ch, &m, &err)) {
        /* like jupyter_server: a bad message is logged and dropped, the
         * connection stays */
        fprintf(stderr, "kernelmgr gateway: dropped a client message for kernel %s: %s\n",
                c->kernel_id, err.msg);
        return 0;
    }
    if (gwrelay_send(c->relay, ch, m)) {
        gwrelay_failed(c->relay, &why);
        return ws_close(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, why.msg);
    }
    return 0;
}

/* Writes one frame (data stolen) behind LWS_PRE bytes of headroom and asks
 * for the next writeable callback (more may wait). 0 or -1 (close). */
static int ws_write_frame(struct lws *wsi, gw_conn *c, unsigned char *data, size_t len, int binary)
{
    if (LWS_PRE + len > c->tx_cap) {
        unsigned char *nb = realloc(c->tx, LWS_PRE + len);
        if (!nb) {
            free(data);
            return -1;
        }
        c->tx = nb;
        c->tx_cap = LWS_PRE + len;
    }
    memcpy(c->tx + LWS_PRE, data, len);
    free(data);
    if (lws_write(wsi, c->tx + LWS_PRE, len, binary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT) < (int)len)
        return -1;
    lws_callback_on_writable(wsi);
    return 0;
}

int gw_ws_writeable(struct lws *wsi, gw_conn *c)
{
    if (c->closing) {
        if (lws_partial_buffered(wsi)) { /* what was sent before goes first */
            lws_callback_on_writable(wsi);
            return 0;
        }
        lws_close_reason(wsi, c->close_status, (unsigned char *)c->close_why, strlen(c->close_why));
        return -1;
    }
    km_err why = {0};
    if (c->api) {
        char *line;
        size_t n;
        if (gwapi_pop(c->api, &line, &n))
            return ws_write_frame(wsi, c, (unsigned char *)line, n, 0);
        if (gwapi_failed(c->api, &why)) {
            return ws_close(wsi, LWS_CLOSE_STATUS_GOINGAWAY, why.msg);
        }
        return 0;
    }
    if (!c->relay)
        return -1;
    unsigned char *data;
    size_t len;
    int binary;
    if (gwrelay_pop(c->relay, &data, &len, &binary))
        return ws_write_frame(wsi, c, data, len, binary);
    if (gwrelay_failed(c->relay, &why)) {
        return ws_close(wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, why.msg);
    }
    return 0;
}

void gw_ws_closed(gw_conn *c)
{
    if (!c->is_ws)
        return;
    ws_unlink(c->g, c);
    gwrelay_destroy(&c->relay);
    gwapi_close(&c->api);
    free(c->rx);
    free(c->tx);
    free(c->cf);
    c->cf = NULL;
    c->rx = c->tx = NULL;
    c->is_ws = 0;
}

/* Jobs that finished: their connections may write now. */
