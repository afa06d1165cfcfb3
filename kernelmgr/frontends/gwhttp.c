/*
 * gwhttp.c — the gateway's HTTP side (gw_int.h): each request's Host, rate
 * and token checks, its body within http_max_body, its REST job on a thread
 * of its own and the response; the Origin check of WebSocket upgrades; the
 * bounds on connections before the token (gwpeers.h) and their log line.
 */
#include "kernelmgr/frontends/gw_int.h"
#include "common/cm_clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define GW_HDR_MAX 4096
#define GW_REFUSAL_LOG_S 10.0

/* ---------------------------------------------------------------- helpers */

int gw_rate_exceeded(gw_conn *c, double rate)
{
    double t = cm_mono_s();
    if (c->last == 0) {
        c->tokens = 2 * rate;
        c->last = t;
    }
    c->tokens += (t - c->last) * rate;
    if (c->tokens > 2 * rate)
        c->tokens = 2 * rate;
    c->last = t;
    if (c->tokens < 1)
        return 1;
    c->tokens -= 1;
    return 0;
}

char *gw_json_text(json_t *v) /* steals v; new (free()) */
{
    char *t = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    return t;
}

/* s (stolen) with every occurrence of the manager's home (as configured and
 * as resolved) replaced by "$KERNELMGR_HOME": what the gateway tells an
 * HTTP client names no host path (an engine error quotes the connection
 * file, a log, the socket). new (free()); NULL when s is. */
char *gw_redact_home(const gateway *g, char *s)
{
    const char *homes[2] = {g->home, g->home_real};
    for (int h = 0; h < 2 && s; h++) {
        const char *home = homes[h];
        size_t hl = home ? strlen(home) : 0;
        if (hl < 2 || !strstr(s, home))
            continue;
        static const char ph[] = "$KERNELMGR_HOME";
        size_t n = 0;
        for (const char *p = s; (p = strstr(p, home)); p += hl)
            n++;
        char *out = malloc(strlen(s) + n * sizeof ph + 1), *o = out;
        if (!out) {
            free(s);
            return NULL;
        }
        const char *p = s;
        for (const char *q; (q = strstr(p, home)); p = q + hl) {
            memcpy(o, p, (size_t)(q - p));
            o += q - p;
            memcpy(o, ph, sizeof ph - 1);
            o += sizeof ph - 1;
        }
        strcpy(o, p);
        free(s);
        s = out;
    }
    return s;
}

char *gw_error_body(const char *reason, const char *fmt, ...)
{
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    char *t = msg ? gw_json_text(json_pack("{s:s s:s}", "message", msg, "reason", reason)) : NULL;
    free(msg);
    return t;
}

void gw_job_free(gw_job *j)
{
    free(j->path);
    free(j->body);
    free(j->resp);
    free(j);
}

static void *job_thread(void *arg)
{
    gw_job *j = arg;
    gateway *g = j->g;
    gw_rest_run(j);
    if (!j->verbatim)
        j->resp = gw_redact_home(g, j->resp);
    if (!j->resp && j->status != 204)
        j->status = 500;
    pthread_mutex_lock(&g->mu);
    j->done = 1;
    if (j->conn) {
        j->next_done = g->done;
        g->done = j;
    } else {
        gw_job_free(j); /* the connection went away meanwhile */
    }
    /* under mu, before the count drops: gateway_stop destroys the context
     * only once no job is left */
    lws_cancel_service(g->ctx);
    if (--g->jobs == 0)
        pthread_cond_broadcast(&g->jobs_cv);
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* Starts the job of connection c (its method, path and body move into it). */
int gw_start_job(gw_conn *c)
{
    gateway *g = c->g;
    gw_job *j = calloc(1, sizeof *j);
    if (!j)
        return -1;
    j->g = g;
    j->conn = c;
    snprintf(j->method, sizeof j->method, "%s", c->method);
    memcpy(j->scope, c->scope, sizeof j->scope);
    j->path = c->path;
    j->body = c->body;
    j->body_len = c->body_len;
    c->path = NULL;
    c->body = NULL;
    c->body_len = 0;
    c->job = j;
    /* lws times the request's content with http_header_timeout; the job
     * (a kernel start, an exec) takes as long as it takes */
    lws_set_timeout(c->wsi, NO_PENDING_TIMEOUT, 0);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    pthread_mutex_lock(&g->mu);
    g->jobs++;
    int rc = pthread_create(&t, &attr, job_thread, j);
    if (rc) {
        g->jobs--;
        c->job = NULL;
    }
    pthread_mutex_unlock(&g->mu);
    pthread_attr_destroy(&attr);
    if (rc) {
        c->path = j->path;
        c->body = j->body;
        free(j);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- auth */

/* 0 when the request carries the token (header or ?token=). */
int gw_authorized(gateway *g, struct lws *wsi)
{
    char buf[GW_HDR_MAX];
    const char *tok = NULL;
    int n = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n > 0) {
        if (!strncasecmp(buf, "token ", 6))
            tok = buf + 6;
        else if (!strncasecmp(buf, "bearer ", 7))
            tok = buf + 7;
    }
    char qbuf[GW_HDR_MAX];
    if (!tok)
        tok = lws_get_urlarg_by_name(wsi, "token=", qbuf, sizeof qbuf);
    if (!tok)
        return -1;
    while (*tok == ' ')
        tok++;
    size_t tl = strlen(tok), kl = strlen(g->token);
    return tl == kl && sodium_memcmp(tok, g->token, kl) == 0 ? 0 : -1;
}

/* 0 when a WebSocket upgrade's Origin (if any) is the Host's or the
 * configured one. */
int gw_origin_ok(gateway *g, struct lws *wsi, km_err *why)
{
    char origin[512], host[512];
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN);
    if (n <= 0)
        return 0; /* not a browser: no Origin to check */
    if (n >= (int)sizeof origin ||
        lws_hdr_copy(wsi, origin, sizeof origin, WSI_TOKEN_ORIGIN) != n) {
        km_err_set(why, KM_EUSAGE,
                   "WebSocket refused: an Origin of %d bytes is over the limit of %zu", n,
                   sizeof origin - 1);
        return -1;
    }
    if (g->origin && !strcmp(origin, g->origin))
        return 0;
    if (lws_hdr_copy(wsi, host, sizeof host, WSI_TOKEN_HOST) > 0) {
        const char *o = strstr(origin, "://");
        if (o && !strcmp(o + 3, host))
            return 0;
    }
    km_err_set(why, KM_EUSAGE, "WebSocket from origin %.200s refused (allowed: the Host's%s%.200s)",
               origin, g->origin ? " or " : "", g->origin ? g->origin : "");
    return -1;
}

/* 0 when the request's Host names this gateway: its listen address (any
 * IP literal when that is 0.0.0.0), localhost when it listens on loopback,
 * or the configured http_host; the port is not compared (a port is no
 * defence against DNS rebinding, and a proxy or a port forward changes it).
 * A DNS name the gateway does not know is how DNS rebinding reaches a local
 * server, so it is refused before the token is even looked at. lws's own
 * check (LWS_SERVER_OPTION_VHOST_UPG_STRICT_HOST_CHECK) matches a prefix of
 * one name, only on upgrades, and hangs up without saying why. A request
 * without Host (HTTP/1.0) comes from no browser and passes. */
#define GW_HOST_MAX 255
int gw_host_ok(const gateway *g, struct lws *wsi, km_err *why)
{
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_HOST);
    if (n <= 0)
        return 0;
    char host[GW_HOST_MAX + 1];
    if (n > GW_HOST_MAX || lws_hdr_copy(wsi, host, sizeof host, WSI_TOKEN_HOST) != n) {
        km_err_set(why, KM_EUSAGE, "a Host of %d bytes is over the limit of %d", n, GW_HOST_MAX);
        return -1;
    }
    char *name = host;
    int v6 = 0;
    if (*name == '[') {
        char *end = strchr(name, ']');
        if (end) {
            *end = 0;
            name++;
            v6 = 1;
        }
    } else {
        char *colon = strchr(name, ':');
        if (colon)
            *colon = 0;
    }
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcasecmp(name, g->listen_addr) ||
        ((g->loopback || g->any_addr) && !strcasecmp(name, "localhost")) ||
        (g->host && !strcasecmp(name, g->host)) ||
        (g->any_addr &&
         (v6 ? inet_pton(AF_INET6, name, &a6) == 1 : inet_pton(AF_INET, name, &a4) == 1)))
        return 0;
    km_err_set(why, KM_EUSAGE,
               "the Host header names neither this gateway's address (%s)%s nor a configured "
               "name (http_host%s%s): refused as DNS rebinding",
               g->any_addr ? "any IP address" : g->listen_addr,
               g->loopback || g->any_addr ? " nor localhost" : "", g->host ? " " : " unset",
               g->host ? g->host : "");
    return -1;
}

/* ---------------------------------------------------------------- HTTP */

int gw_write_response(struct lws *wsi, gw_conn *c)
{
    size_t n = c->resp ? strlen(c->resp) : 0;
    unsigned char *buf = malloc(LWS_PRE + 2048 + n);
    if (!buf)
        return -1;
    unsigned char *start = buf + LWS_PRE, *p = start, *end = start + 2048 - 1;
    const char *ctype = c->status == 204 ? NULL : "application/json";
    if (lws_add_http_common_headers(wsi, c->status, ctype, n, &p, end) ||
        (c->status == 401 &&
         lws_add_http_header_by_name(wsi, (const unsigned char *)"www-authenticate:",
                                     (const unsigned char *)"token", 5, &p, end)) ||
        lws_finalize_write_http_header(wsi, start, &p, end)) {
        free(buf);
        return -1;
    }
    int rc = 0;
    if (n) {
        memcpy(start, c->resp, n);
        if (lws_write(wsi, start, n, LWS_WRITE_HTTP_FINAL) != (int)n)
            rc = -1;
    }
    free(buf);
    free(c->resp);
    c->resp = NULL;
    c->status = 0;
    /* a connection that never showed the token gets one answer and is
     * closed: it cannot hold its place by keeping the connection alive */
    if (rc || !gwpeers_is_authenticated(lws_get_opaque_user_data(wsi)) ||
        lws_http_transaction_completed(wsi))
        return -1;
    return 0;
}

void gw_http_reply_now(struct lws *wsi, gw_conn *c, unsigned status, char *body)
{
    free(c->resp);
    c->status = status;
    c->resp = body;
    lws_callback_on_writable(wsi);
}

void gw_http_reset(gw_conn *c)
{
    free(c->path);
    free(c->body);
    c->path = NULL;
    c->body = NULL;
    c->body_len = 0;
}

/* ---------------------------------------------------------------- routing by session */

#define GW_SCOPE_PREFIX "/s/"
#define GW_SCOPE_HEADER "x-kernelmgr-session:"

int gw_request_scope(struct lws *wsi, const char *uri, const char **rest,
                     char scope[KM_NAME_MAX + 1], km_err *why)
{
    scope[0] = 0;
    *rest = uri;
    char name[KM_NAME_MAX + 1] = "";
    if (!strncmp(uri, GW_SCOPE_PREFIX, strlen(GW_SCOPE_PREFIX))) {
        const char *n = uri + strlen(GW_SCOPE_PREFIX);
        size_t nl = strcspn(n, "/");
        if (nl == 0 || nl > KM_NAME_MAX) {
            km_err_set(why, KM_EUSAGE,
                       "the URL's session prefix /s/NAME/ names %s (a session name is letters, "
                       "digits, _ - ., at most %d bytes, not starting with '.')",
                       nl ? "a name over the limit" : "no session", KM_NAME_MAX);
            return -1;
        }
        memcpy(name, n, nl);
        name[nl] = 0;
        if (!km_name_valid(name)) {
            km_err_set(why, KM_EUSAGE,
                       "the URL's session prefix /s/%s/ is not a valid session name (letters, "
                       "digits, _ - ., at most %d bytes, not starting with '.')",
                       name, KM_NAME_MAX);
            return -1;
        }
        *rest = n[nl] ? n + nl : "/";
        memcpy(scope, name, nl + 1);
    }
    int hl = lws_hdr_custom_length(wsi, GW_SCOPE_HEADER, (int)strlen(GW_SCOPE_HEADER));
    if (hl > 0) {
        char hv[KM_NAME_MAX + 1];
        if (hl > KM_NAME_MAX ||
            lws_hdr_custom_copy(wsi, hv, sizeof hv, GW_SCOPE_HEADER,
                                (int)strlen(GW_SCOPE_HEADER)) != hl ||
            !km_name_valid(hv)) {
            km_err_set(why, KM_EUSAGE,
                       "the X-Kernelmgr-Session header (%d bytes) is not a valid session name "
                       "(letters, digits, _ - ., at most %d bytes, not starting with '.')",
                       hl, KM_NAME_MAX);
            return -1;
        }
        if (scope[0] && strcmp(scope, hv)) {
            km_err_set(why, KM_EUSAGE,
                       "the URL's session prefix /s/%s/ and the X-Kernelmgr-Session header \"%s\" "
                       "name different sessions",
                       scope, hv);
            return -1;
        }
        snprintf(scope, KM_NAME_MAX + 1, "%s", hv);
    }
    return 0;
}

/* GET /healthz (alive) and /readyz (ready for new sessions: 503 while
 * draining), also under /s/NAME/: answered before the Host check and the
 * token, with nothing but the status (no version, no counts, no names). 1
 * when uri was one of them (answered), 0 otherwise. */
static int health(struct lws *wsi, gw_conn *c, const char *uri)
{
    if (!lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI))
        return 0;
    if (!strncmp(uri, GW_SCOPE_PREFIX, strlen(GW_SCOPE_PREFIX))) {
        const char *n = uri + strlen(GW_SCOPE_PREFIX);
        uri = n + strcspn(n, "/");
    }
    if (!strcmp(uri, "/healthz")) {
        gw_http_reply_now(wsi, c, 200, strdup("{\"status\":\"ok\"}"));
        return 1;
    }
    if (!strcmp(uri, "/readyz")) {
        int draining = km_draining(c->g->m);
        gw_http_reply_now(
            wsi, c, draining ? 503 : 200,
            strdup(draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ready\"}"));
        return 1;
    }
    return 0;
}

int gw_on_http(struct lws *wsi, gw_conn *c, const char *uri)
{
    gateway *g = c->g;
    gw_http_reset(c);
    c->wsi = wsi;
    gwpeers_request(lws_get_opaque_user_data(wsi));
    if (health(wsi, c, uri))
        return 0;
    km_err why = {0};
    if (gw_host_ok(g, wsi, &why)) {
        gw_http_reply_now(wsi, c, 403, gw_error_body("Forbidden", "%s", why.msg));
        return 0;
    }
    if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI))
        snprintf(c->method, sizeof c->method, "GET");
    else if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI))
        snprintf(c->method, sizeof c->method, "POST");
    else if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI))
        snprintf(c->method, sizeof c->method, "DELETE");
    else {
        gw_http_reply_now(wsi, c, 405, gw_error_body("Method Not Allowed", "method not allowed"));
        return 0;
    }
    if (gw_rate_exceeded(c, g->o.rate)) {
        gw_http_reply_now(wsi, c, 429,
                          gw_error_body("Too Many Requests",
                                        "rate limit of %.0f requests per second per connection "
                                        "exceeded",
                                        g->o.rate));
        return 0;
    }
    if (gw_authorized(g, wsi)) {
        gw_http_reply_now(wsi, c, 401,
                          gw_error_body("Unauthorized", "a valid token is required "
                                                        "(header \"Authorization: token ...\")"));
        return 0;
    }
    gwpeers_authenticated(g->peers, lws_get_opaque_user_data(wsi));
    const char *rest;
    if (gw_request_scope(wsi, uri, &rest, c->scope, &why)) {
        gw_http_reply_now(wsi, c, 400, gw_error_body("Bad Request", "%s", why.msg));
        return 0;
    }
    c->path = strdup(rest);
    if (!c->path)
        return -1;
    if (!strcmp(c->method, "POST")) {
        char cl[32];
        if (lws_hdr_copy(wsi, cl, sizeof cl, WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0) {
            unsigned long long len = strtoull(cl, NULL, 10);
            if (len > g->o.max_body) {
                gw_http_reset(c);
                gw_http_reply_now(
                    wsi, c, 413,
                    gw_error_body("Payload Too Large",
                                  "request body of %llu bytes is over the limit of %zu "
                                  "bytes",
                                  len, g->o.max_body));
                return 0;
            }
            if (len > 0)
                return 0; /* the body comes in LWS_CALLBACK_HTTP_BODY */
        }
    }
    if (gw_start_job(c))
        gw_http_reply_now(wsi, c, 503,
                          gw_error_body("Service Unavailable", "cannot start a worker"));
    return 0;
}

int gw_on_http_body(struct lws *wsi, gw_conn *c, const void *in, size_t len)
{
    gateway *g = c->g;
    if (!c->path)
        return 0; /* already answered */
    if (c->body_len + len > g->o.max_body) {
        gw_http_reset(c);
        gw_http_reply_now(wsi, c, 413,
                          gw_error_body("Payload Too Large",
                                        "request body over the limit of %zu bytes", g->o.max_body));
        return 0;
    }
    unsigned char *nb = realloc(c->body, c->body_len + len + 1);
    if (!nb)
        return -1;
    memcpy(nb + c->body_len, in, len);
    c->body = nb;
    c->body_len += len;
    c->body[c->body_len] = 0;
    return 0;
}

void gw_on_cancelled(gateway *g)
{
    pthread_mutex_lock(&g->mu);
    gw_job *d = g->done;
    g->done = NULL;
    for (gw_job *j = d, *n; j; j = n) {
        n = j->next_done;
        gw_conn *c = j->conn;
        if (c) {
            c->job = NULL;
            free(c->resp);
            c->status = j->status;
            c->resp = j->resp;
            j->resp = NULL;
            lws_callback_on_writable(c->wsi);
        }
        gw_job_free(j);
    }
    pthread_mutex_unlock(&g->mu);
    for (gw_conn *c = g->ws; c; c = c->next)
        lws_callback_on_writable(c->wsi);
}

/* ---------------------------------------------------------------- connections */

static uint32_t peer_addr(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ((const struct sockaddr_in *)ss)->sin_addr.s_addr;
    return 0; /* the listener is IPv4 only: anything else is one bucket */
}

static void log_held_back(lws_sorted_usec_list_t *sul)
{
    gw_log_refusals(lws_container_of(sul, gateway, log_sul), 0);
}

/* One line at most every GW_REFUSAL_LOG_S seconds, counting what was
 * refused or timed out since the last (a flood never floods the log); what
 * comes within the window is written when it ends (an lws timer). */
void gw_log_refusals(gateway *g, int force)
{
    unsigned long n = g->idle_closed;
    for (int v = 0; v <= GWPEERS_TOTAL; v++)
        n += g->refused[v];
    double t = cm_mono_s();
    if (!n)
        return;
    if (!force && g->last_log && t - g->last_log < GW_REFUSAL_LOG_S) {
        if (!atomic_load(&g->stop))
            lws_sul_schedule(g->ctx, 0, &g->log_sul, log_held_back,
                             (lws_usec_t)((GW_REFUSAL_LOG_S - (t - g->last_log)) * 1e6) + 1000);
        return;
    }
    fprintf(stderr,
            "kernelmgr gateway: refused %lu connections (%lu over http_max_unauth_per_peer %u, "
            "%lu over http_max_unauth %u, %lu over the connection budget %u) and closed %lu "
            "without the token that sent no complete request (http_header_timeout %u s); "
            "%u open, %u without the token\n",
            g->refused[GWPEERS_PEER] + g->refused[GWPEERS_UNAUTH] + g->refused[GWPEERS_TOTAL],
            g->refused[GWPEERS_PEER], gwpeers_limit_value(g->peers, GWPEERS_PEER),
            g->refused[GWPEERS_UNAUTH], gwpeers_limit_value(g->peers, GWPEERS_UNAUTH),
            g->refused[GWPEERS_TOTAL], g->conn_budget, g->idle_closed, g->header_timeout,
            gwpeers_total(g->peers), gwpeers_unauth(g->peers));
    memset(g->refused, 0, sizeof g->refused);
    g->idle_closed = 0;
    g->last_log = t;
}

/* A connection over a bound: counted, and told so in one write when that is
 * cheap (plain HTTP; nothing is read) before the caller closes it. */
static void refuse_connection(gateway *g, gwpeers_verdict v, int fd)
{
    g->refused[v]++;
    if (!g->tls && fd >= 0) {
        char body[320], msg[512];
        int bl = snprintf(body, sizeof body,
                          "{\"message\":\"%s (%s: %u)\",\"reason\":\"Service Unavailable\"}",
                          v == GWPEERS_PEER     ? "too many connections without the token from "
                                                  "this address"
                          : v == GWPEERS_UNAUTH ? "too many connections without the token"
                                                : "the gateway is at its connection budget",
                          gwpeers_limit_name(v), gwpeers_limit_value(g->peers, v));
        int ml = snprintf(msg, sizeof msg,
                          "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                          "content-length: %d\r\nconnection: close\r\n\r\n%s",
                          bl, body);
        if (bl > 0 && ml > 0 && ml < (int)sizeof msg &&
            send(fd, msg, (size_t)ml, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            /* the peer is gone or not reading: it is closed all the same */
        }
    }
    gw_log_refusals(g, 0);
}

/* LWS_CALLBACK_FILTER_NETWORK_CONNECTION: just accepted, nothing allocated
 * for it yet. 0 to go on, 1 for lws to close it. */
int gw_filter_connection(gateway *g, const struct lws_filter_network_conn_args *a)
{
    gwpeers_verdict v = gwpeers_check(g->peers, peer_addr(&a->cli_addr));
    if (v == GWPEERS_OK)
        return 0;
    refuse_connection(g, v, a->accept_fd);
    return 1;
}

/* LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED: the connection is counted
 * from here until LWS_CALLBACK_WSI_DESTROY (its record is the wsi's opaque
 * user data), unauthenticated until a request shows the token. */
int gw_admit_connection(gateway *g, struct lws *wsi)
{
    if (lws_get_opaque_user_data(wsi))
        return 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    int fd = lws_get_socket_fd(wsi);
    memset(&ss, 0, sizeof ss);
    if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &sl))
        ss.ss_family = AF_UNSPEC;
    gwpeers_verdict v;
    gwpeers_conn *pc = gwpeers_admit(g->peers, peer_addr(&ss), &v);
    if (!pc) {
        refuse_connection(g, v, fd);
        return -1;
    }
    lws_set_opaque_user_data(wsi, pc);
    return 0;
}

void gw_release_connection(gateway *g, struct lws *wsi)
{
    gwpeers_conn *pc = lws_get_opaque_user_data(wsi);
    if (!pc)
        return;
    lws_set_opaque_user_data(wsi, NULL);
    if (gwpeers_release(g->peers, &pc)) {
        g->idle_closed++;
        gw_log_refusals(g, 0);
    }
}
