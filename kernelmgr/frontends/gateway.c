/*
 * gateway.c — the gateway's lifecycle (see gateway.h; its files in
 * gw_int.h): the token, the libwebsockets context and vhost, the service
 * thread and the one lws callback, which hands each event to the HTTP side
 * (gwhttp.c), the REST routes (gwrest.c) or the WebSockets (gwws.c).
 *
 * Threads: libwebsockets runs in the gateway's own thread and never blocks
 * on the manager: every REST request runs as a job in a thread of its own
 * (a kernel start may take a while), whose response the service thread
 * writes once lws_cancel_service() wakes it. Each WebSocket connection has
 * a relay (gwrelay.c) with its own thread and ZeroMQ sockets.
 */
#include "kernelmgr/frontends/gw_int.h"
#include "common/cm_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define GW_DEFAULT_BODY (1u << 20)
#define GW_DEFAULT_MESSAGE (64u << 20)
#define GW_DEFAULT_PENDING (64u << 20)
#define GW_DEFAULT_CONNECTIONS 64u
#define GW_DEFAULT_RATE 500.0
/* The fd budget (gateway.h "Bounds before the token"): the gateway takes at
 * most GW_FD_SHARE of RLIMIT_NOFILE (the rest is the daemon's: its socket,
 * its clients, its kernels); a kernel WebSocket costs its socket plus its
 * relay's ZeroMQ context and sockets (GW_FDS_PER_WS; measured: 10), any other
 * connection its socket plus, while a REST job runs, both ends of that job's
 * connection to the daemon (GW_FDS_PER_CONN). lws's own table is capped at
 * GW_CONN_MAX connections: with a limit of its own it finds a socket's
 * connection by a linear search. */
#define GW_FD_SHARE 2
#define GW_FDS_PER_WS 16u
#define GW_FDS_PER_CONN 3u
#define GW_CONN_MAX 4096u
#define GW_LWS_OWN_FDS 4u /* the listen socket, the cancel pipe, slack */

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len)
{
    gw_conn *c = user;
    struct lws_vhost *vh = lws_get_vhost(wsi);
    gateway *g = vh ? lws_get_vhost_user(vh) : NULL;
    /* user is our gw_conn only for the connection reasons below (for the
     * TLS ones it is an OpenSSL object): set its gateway there */
    switch (reason) {
    case LWS_CALLBACK_HTTP:
    case LWS_CALLBACK_HTTP_BODY:
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
    case LWS_CALLBACK_HTTP_WRITEABLE:
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
    case LWS_CALLBACK_ESTABLISHED:
    case LWS_CALLBACK_RECEIVE:
    case LWS_CALLBACK_SERVER_WRITEABLE:
    case LWS_CALLBACK_TIMER:
    case LWS_CALLBACK_CLOSED:
        if (!c || !g)
            return reason == LWS_CALLBACK_CLOSED || reason == LWS_CALLBACK_CLOSED_HTTP ||
                           reason == LWS_CALLBACK_HTTP_DROP_PROTOCOL
                       ? 0
                       : -1;
        if (!c->g)
            c->g = g;
        break;
    default:
        break;
    }
    switch (reason) {
    case LWS_CALLBACK_HTTP:
        return gw_on_http(wsi, c, in ? (const char *)in : "/");
    case LWS_CALLBACK_HTTP_BODY:
        return gw_on_http_body(wsi, c, in, len);
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (c->path && !c->job && gw_start_job(c))
            gw_http_reply_now(wsi, c, 503,
                              gw_error_body("Service Unavailable", "cannot start a worker"));
        return 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        if (c->status)
            return gw_write_response(wsi, c);
        return 0;
    case LWS_CALLBACK_CLOSED_HTTP:
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        if (c && g) {
            pthread_mutex_lock(&g->mu);
            if (c->job) {
                c->job->conn = NULL; /* the job frees itself, or gw_on_cancelled does */
                /* a done job still on the list: detach it there too */
                c->job = NULL;
            }
            pthread_mutex_unlock(&g->mu);
            gw_http_reset(c);
            free(c->resp);
            c->resp = NULL;
            c->status = 0;
        }
        return 0;
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return g ? gw_confirm_upgrade(wsi, g, in) : -1;
    case LWS_CALLBACK_ESTABLISHED:
        return g ? gw_ws_established(wsi, c, g) : -1;
    case LWS_CALLBACK_RECEIVE:
        return gw_ws_receive(wsi, c, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return gw_ws_writeable(wsi, c);
    case LWS_CALLBACK_TIMER:
        if (c && c->is_ws && g && !c->api) {
            gw_ws_follow(g, c, c->session, c->lang);
            lws_set_timer_usecs(wsi, 1000000);
        }
        return 0;
    case LWS_CALLBACK_CLOSED:
        if (c)
            gw_ws_closed(c);
        return 0;
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
        if (g)
            gw_on_cancelled(g);
        return 0;
    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
        return g && user ? gw_filter_connection(g, user) : 1;
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
        return g ? gw_admit_connection(g, wsi) : -1;
    case LWS_CALLBACK_WSI_DESTROY:
        if (g)
            gw_release_connection(g, wsi);
        return 0;
    case LWS_CALLBACK_RAW_ADOPT:
    case LWS_CALLBACK_RAW_RX:
        /* an HTTP CONNECT turns the connection raw in lws, with no timeout
         * and no request to authenticate: nothing is served raw here */
        return -1;
    default:
        return 0;
    }
}

/* ---------------------------------------------------------------- start/stop */

int gateway_built_in(void)
{
    return 1;
}

/* A token from the environment or a file: visible ASCII (it goes into HTTP
 * headers and URLs), GW_TOKEN_MIN to GW_TOKEN_MAX bytes. NULL when fine,
 * else why. */
#define GW_TOKEN_MIN 16
#define GW_TOKEN_MAX 1024
#define GW_TOKEN_FILE_MAX 4096
static const char *token_invalid(const char *t)
{
    size_t n = strlen(t);
    if (n < GW_TOKEN_MIN)
        return "shorter than 16 characters";
    if (n > GW_TOKEN_MAX)
        return "longer than 1024 characters";
    for (const char *p = t; *p; p++)
        if (*p < 0x21 || *p > 0x7e)
            return "not visible ASCII (no spaces or control characters)";
    return NULL;
}

/* The token of http_token_file: its first line, from a regular file of
 * this user's that no one else may read or write (cm_read_regular). new, or
 * NULL with a reason. */
static char *token_from_file(const char *path, km_err *err)
{
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077)) {
        gw_err(err,
               "http_token_file %s: readable or writable by group or others (mode %03o): "
               "chmod 600 it",
               path, (unsigned)(st.st_mode & 0777));
        return NULL;
    }
    char *data = NULL;
    size_t len = 0;
    const char *why = NULL;
    if (cm_read_regular(path, GW_TOKEN_FILE_MAX, CM_RR_OWNED, &data, &len, &why)) {
        gw_err(err, "http_token_file %s: %s%s", path, why,
               why && strstr(why, "limit") ? " of 4096 bytes" : "");
        return NULL;
    }
    data[strcspn(data, "\r\n")] = 0;
    const char *bad = token_invalid(data);
    if (bad) {
        gw_err(err, "http_token_file %s: its token is %s", path, bad);
        sodium_memzero(data, len);
        free(data);
        return NULL;
    }
    return data;
}

/* The token, by precedence: $KERNELMGR_HTTP_TOKEN, the configuration's
 * http_token (given), its http_token_file, else HOME/http-token (0600; made
 * when missing or unusable). *source says which, for the log. new, or NULL
 * with a reason. */
static char *load_token(const char *home, const char *given, const char *file, char *source,
                        size_t srclen, km_err *err)
{
    const char *env = getenv("KERNELMGR_HTTP_TOKEN");
    if (env && *env) {
        const char *bad = token_invalid(env);
        if (bad) {
            gw_err(err, "KERNELMGR_HTTP_TOKEN is %s", bad);
            return NULL;
        }
        snprintf(source, srclen, "$KERNELMGR_HTTP_TOKEN");
        return strdup(env);
    }
    if (given && *given) {
        snprintf(source, srclen, "the configuration's http_token");
        return strdup(given);
    }
    if (file && *file) {
        snprintf(source, srclen, "%.1000s", file);
        return token_from_file(file, err);
    }
    char *path = NULL;
    if (asprintf(&path, "%s/http-token", home) < 0) {
        gw_err(err, "out of memory");
        return NULL;
    }
    snprintf(source, srclen, "%.1000s", path);
    char buf[128];
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        struct stat st;
        ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                            !(st.st_mode & 077)
                        ? read(fd, buf, sizeof buf - 1)
                        : -1;
        close(fd);
        if (n >= 32) {
            buf[n] = 0;
            buf[strcspn(buf, "\r\n")] = 0;
            if (strlen(buf) >= 32) {
                free(path);
                return strdup(buf);
            }
        }
        unlink(path); /* unusable: made anew */
    }
    unsigned char r[24];
    randombytes_buf(r, sizeof r);
    for (size_t i = 0; i < sizeof r; i++)
        snprintf(buf + 2 * i, 3, "%02x", r[i]);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, buf, strlen(buf)) != (ssize_t)strlen(buf) || write(fd, "\n", 1) != 1) {
        gw_err(err, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        free(path);
        return NULL;
    }
    close(fd);
    free(path);
    return strdup(buf);
}

static void *service_thread(void *arg)
{
    gateway *g = arg;
    while (!atomic_load(&g->stop)) {
        if (lws_service(g->ctx, 0) < 0)
            break;
    }
    lws_sul_cancel(&g->log_sul);
    gw_log_refusals(g, 1);
    return NULL;
}

static void write_info(gateway *g)
{
    char *path = NULL, *tmp = NULL;
    if (asprintf(&path, "%s/http.json", g->home) < 0)
        return;
    if (asprintf(&tmp, "%s.tmp", path) < 0) {
        free(path);
        return;
    }
    json_t *o = json_pack("{s:s s:i s:i s:b}", "url", g->url, "port", g->port, "pid", (int)getpid(),
                          "tls", g->tls);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    char *t = gw_json_text(o);
    if (fd >= 0 && t && write(fd, t, strlen(t)) == (ssize_t)strlen(t)) {
        close(fd);
        fd = -1;
        rename(tmp, path);
    }
    if (fd >= 0)
        close(fd);
    free(t);
    free(tmp);
    free(path);
}

/* The bounds before the token (gateway.h): the connection budget from
 * RLIMIT_NOFILE, the unauthenticated bounds and the names from the
 * manager's configuration. 0, or -1 with a reason. */
static int connection_bounds(gateway *g, km_err *err)
{
    const kmcfg *cfg = km_manager_config(g->m);
    struct rlimit rl;
    unsigned long lim = 1024; /* the kernel's default, if it cannot be read */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        lim = rl.rlim_cur == RLIM_INFINITY ? 1ul << 20 : (unsigned long)rl.rlim_cur;
    g->rlim = lim;
    unsigned long share = lim / GW_FD_SHARE,
                  ws = (unsigned long)g->o.max_connections * GW_FDS_PER_WS + GW_LWS_OWN_FDS;
    unsigned long conns = share > ws ? (share - ws) / GW_FDS_PER_CONN : 0;
    if (conns > GW_CONN_MAX)
        conns = GW_CONN_MAX;
    unsigned need = cfg->http_max_unauth + g->o.max_connections;
    if (conns < need)
        return gw_err(err,
                      "RLIMIT_NOFILE of %lu leaves the gateway (at most 1/%d of it) room for %lu "
                      "connections, fewer than http_max_unauth %u + http_max_connections %u: "
                      "raise the limit or lower those",
                      lim, GW_FD_SHARE, conns, cfg->http_max_unauth, g->o.max_connections);
    g->conn_budget = (unsigned)conns;
    g->header_timeout = cfg->http_header_timeout;
    g->peers = gwpeers_new(g->conn_budget, cfg->http_max_unauth, cfg->http_max_unauth_per_peer);
    if (!g->peers || (cfg->http_host[0] && !(g->host = strdup(cfg->http_host))))
        return gw_err(err, "out of memory");
    struct in_addr a4;
    if (inet_pton(AF_INET, g->listen_addr, &a4) == 1) {
        g->any_addr = a4.s_addr == htonl(INADDR_ANY);
        g->loopback = (ntohl(a4.s_addr) >> 24) == 127;
    }
    char *real = realpath(g->home, NULL);
    if (real && strcmp(real, g->home))
        g->home_real = real;
    else
        free(real);
    return 0;
}

/* Frees what gateway_start allocated (the context is already destroyed);
 * the token is wiped first. */
static void gateway_free(gateway *g)
{
    if (g->token)
        sodium_memzero(g->token, strlen(g->token));
    free(g->token);
    free(g->home);
    free(g->home_real);
    free(g->host);
    gwpeers_destroy(&g->peers);
    free(g->origin);
    free(g->listen_addr);
    free(g->tls_cert);
    free(g->tls_key);
    pthread_cond_destroy(&g->jobs_cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

gateway *gateway_start(km_manager *m, const gateway_opts *o, km_err *err)
{
    if (!o->listen || !*o->listen) {
        gw_err(err, "no HTTP listen address");
        return NULL;
    }
    int tls = o->tls_cert && *o->tls_cert;
    if (tls != (o->tls_key && *o->tls_key)) {
        gw_err(err, "TLS needs both a certificate (--tls-cert) and a key (--tls-key)");
        return NULL;
    }
    if (gateway_listen_valid(o->listen, tls, o->insecure, err))
        return NULL;
    if (sodium_init() < 0) {
        gw_err(err, "libsodium failed to initialise");
        return NULL;
    }
    gateway *g = calloc(1, sizeof *g);
    if (!g) {
        gw_err(err, "out of memory");
        return NULL;
    }
    g->m = m;
    g->o = *o;
    if (!g->o.max_body)
        g->o.max_body = GW_DEFAULT_BODY;
    if (!g->o.max_message)
        g->o.max_message = GW_DEFAULT_MESSAGE;
    if (!g->o.max_pending)
        g->o.max_pending = GW_DEFAULT_PENDING;
    if (!g->o.max_connections)
        g->o.max_connections = GW_DEFAULT_CONNECTIONS;
    if (g->o.rate <= 0)
        g->o.rate = GW_DEFAULT_RATE;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->jobs_cv, NULL);
    g->tls = tls;
    g->home = strdup(km_manager_home(m));
    g->origin = o->origin && *o->origin ? strdup(o->origin) : NULL;
    g->listen_addr = calloc(1, 64);
    g->o.listen = g->o.token = g->o.tls_cert = g->o.tls_key = g->o.origin = NULL;
    if (!g->home || !g->listen_addr ||
        gw_parse_listen(o->listen, g->listen_addr, 64, &g->port, err))
        goto fail;
    g->token =
        load_token(g->home, o->token, o->token_file, g->token_source, sizeof g->token_source, err);
    if (!g->token)
        goto fail;
    if (tls && (!(g->tls_cert = strdup(o->tls_cert)) || !(g->tls_key = strdup(o->tls_key))))
        goto fail;
    if (connection_bounds(g, err))
        goto fail;

    lws_set_log_level(LLL_ERR, NULL);
    g->protocols[0] = (struct lws_protocols){"http", callback, sizeof(gw_conn), 65536, 0, NULL, 0};
    g->protocols[1] =
        (struct lws_protocols){GW_SUBPROTOCOL_V1, callback, sizeof(gw_conn), 65536, 0, NULL, 0};
    struct lws_context_creation_info ci;
    memset(&ci, 0, sizeof ci);
    ci.options = LWS_SERVER_OPTION_EXPLICIT_VHOSTS | LWS_SERVER_OPTION_DISABLE_IPV6 |
                 (tls ? LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT : 0);
    ci.port = CONTEXT_PORT_NO_LISTEN;
    /* lws's own bounds, behind ours (gwpeers refuses first): its table of
     * connections, which stops accepting when full; and its timeout for
     * the TLS handshake and for a request's content to arrive */
    ci.fd_limit_per_thread = g->conn_budget + GW_LWS_OWN_FDS;
    ci.timeout_secs = g->header_timeout;
    g->ctx = lws_create_context(&ci);
    if (!g->ctx) {
        gw_err(err, "cannot create the HTTP server context");
        goto fail;
    }
    struct lws_context_creation_info vi;
    memset(&vi, 0, sizeof vi);
    vi.port = g->port;
    vi.iface = g->listen_addr;
    vi.protocols = g->protocols;
    vi.user = g;
    vi.vhost_name = "kernelmgr";
    vi.alpn = "http/1.1";
    vi.options = LWS_SERVER_OPTION_DISABLE_IPV6 | LWS_SERVER_OPTION_VALIDATE_UTF8;
    vi.ka_time = 0;
    /* the request line and headers must be in within http_header_timeout
     * of the connection (or of the previous response on a kept-alive one) */
    vi.timeout_secs_ah_idle = g->header_timeout;
    if (tls) {
        vi.ssl_cert_filepath = g->tls_cert;
        vi.ssl_private_key_filepath = g->tls_key;
        vi.options |= LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    }
    g->vh = lws_create_vhost(g->ctx, &vi);
    if (!g->vh) {
        gw_err(err,
               "cannot serve HTTP on %s:%d (address in use, not available, or the TLS files "
               "unreadable)",
               g->listen_addr, g->port);
        goto fail;
    }
    g->port = lws_get_vhost_listen_port(g->vh);
    fprintf(stderr,
            "kernelmgr gateway: at most %u connections (1/%d of RLIMIT_NOFILE %lu, less %u per "
            "WebSocket for http_max_connections %u), %u without the token (%u per address), "
            "headers within %u s\n",
            g->conn_budget, GW_FD_SHARE, g->rlim, GW_FDS_PER_WS, g->o.max_connections,
            gwpeers_limit_value(g->peers, GWPEERS_UNAUTH),
            gwpeers_limit_value(g->peers, GWPEERS_PEER), g->header_timeout);
    snprintf(g->url, sizeof g->url, "%s://%s:%d/", tls ? "https" : "http", g->listen_addr, g->port);
    if (pthread_create(&g->thread, NULL, service_thread, g)) {
        gw_err(err, "cannot start the HTTP thread");
        goto fail;
    }
    write_info(g);
    return g;
fail:
    if (g->ctx)
        lws_context_destroy(g->ctx);
    gateway_free(g);
    return NULL;
}

void gateway_stop(gateway **pg)
{
    if (!pg || !*pg)
        return;
    gateway *g = *pg;
    atomic_store(&g->stop, 1);
    lws_cancel_service(g->ctx);
    pthread_join(g->thread, NULL);
    /* jobs still running finish (they hold the manager, not the context) */
    pthread_mutex_lock(&g->mu);
    while (g->jobs)
        pthread_cond_wait(&g->jobs_cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    lws_context_destroy(g->ctx); /* closes every connection: relays end in gw_ws_closed */
    g->ctx = NULL;
    for (gw_job *j = g->done, *n; j; j = n) {
        n = j->next_done;
        gw_job_free(j);
    }
    char *path = NULL;
    if (asprintf(&path, "%s/http.json", g->home) >= 0) {
        unlink(path);
        free(path);
    }
    gateway_free(g);
    *pg = NULL;
}

const char *gateway_token_source(const gateway *g)
{
    return g->token_source;
}

const char *gateway_url(const gateway *g)
{
    return g->url;
}

int gateway_port(const gateway *g)
{
    return g->port;
}
