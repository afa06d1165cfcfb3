/*
 * klib_conn.c — the client's connection: connecting (the home's trust
 * check first, the same as the CLI's: kmhome.c), the initialize that pins
 * the API version, the line reader, and one JSON-RPC call with its event
 * notifications (docs/API.md "Transport and framing").
 */
#include "libkernelmgr/klib_int.h"
#include "kernelmgr/engine/kmhome.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

char *klib_reader_next(klib_reader *r, size_t *n, const char **why)
{
    for (;;) {
        char *nl = r->len > r->head ? memchr(r->buf + r->head, '\n', r->len - r->head) : NULL;
        if (nl) {
            char *line = r->buf + r->head;
            *nl = 0;
            *n = (size_t)(nl - line);
            r->head = (size_t)(nl - r->buf) + 1;
            return line;
        }
        if (r->head) {
            memmove(r->buf, r->buf + r->head, r->len - r->head);
            r->len -= r->head;
            r->head = 0;
        }
        if (r->len > KLIB_MAX_LINE) {
            *why = "the daemon sent a line longer than 64 MiB";
            return NULL;
        }
        if (r->cap - r->len < 65536) {
            size_t cap = r->cap ? r->cap * 2 : 131072;
            char *b = realloc(r->buf, cap);
            if (!b) {
                *why = "out of memory";
                return NULL;
            }
            r->buf = b;
            r->cap = cap;
        }
        ssize_t got = recv(r->fd, r->buf + r->len, r->cap - r->len, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            *why = got == 0 ? "the daemon closed the connection without a response (did it "
                              "stop? see daemon.log)"
                            : strerror(errno);
            return NULL;
        }
        r->len += (size_t)got;
    }
}

int klib_dial(const char *sock)
{
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(sock) >= sizeof sun.sun_path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    memcpy(sun.sun_path, sock, strlen(sock) + 1);
    while (connect(fd, (struct sockaddr *)&sun, sizeof sun)) {
        if (errno == EINTR)
            continue;
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int klib_error_code_of(const json_t *e)
{
    json_t *kc = json_object_get(json_object_get(e, "data"), "km_code");
    if (json_is_integer(kc) && json_integer_value(kc) > 0 && json_integer_value(kc) < 100)
        return (int)json_integer_value(kc);
    json_int_t rpc = json_integer_value(json_object_get(e, "code"));
    if (rpc <= -32000 && rpc > -32100)
        return (int)(-32000 - rpc);
    if (rpc == -32700 || rpc == -32600 || rpc == -32601 || rpc == -32602)
        return KERNELMGR_EUSAGE;
    return KERNELMGR_EINTERNAL;
}

/* Sends one request with id on fd and reads up to its response; events
 * go to ev. 0 with *result, -1 with *err (the daemon's error), or
 * BROKEN with *err (the connection cannot be used any more). */
#define BROKEN (-2)
static int roundtrip(int fd, klib_reader *r, long long id, const char *method, json_t *params,
                     const klib_events *ev, json_t **result, kernelmgr_error **err)
{
    *result = NULL;
    json_t *req = json_pack("{s:s s:I s:s s:o}", "jsonrpc", "2.0", "id", (json_int_t)id, "method",
                            method, "params", params ? params : json_object());
    char *line = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!line)
        return klib_fail(err, KERNELMGR_EINTERNAL, 0, "%s: out of memory", method);
    size_t n = strlen(line);
    line[n] = '\n'; /* json_dumps' NUL becomes the frame's newline */
    int sent = send_all(fd, line, n + 1);
    free(line);
    if (sent) {
        klib_fail(err, KERNELMGR_EDAEMON, 0, "%s: cannot send to the daemon: %s", method,
                  strerror(errno));
        return BROKEN;
    }
    for (;;) {
        const char *why = NULL;
        size_t len;
        char *text = klib_reader_next(r, &len, &why);
        if (!text) {
            klib_fail(err, KERNELMGR_EDAEMON, 0, "%s: %s", method, why);
            return BROKEN;
        }
        json_error_t jerr;
        json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
        if (!json_is_object(o)) {
            json_decref(o);
            klib_fail(err, KERNELMGR_EDAEMON, 0,
                      "%s: the daemon sent a line that is not a JSON object (%s)", method,
                      jerr.text);
            return BROKEN;
        }
        json_t *m = json_object_get(o, "method");
        if (m) {
            /* a notification: an event of our request */
            json_t *ps = json_object_get(o, "params");
            json_t *rid = json_object_get(ps, "request_id");
            if (json_is_string(m) && !strcmp(json_string_value(m), "event") && json_is_object(ps) &&
                json_is_integer(rid) && json_integer_value(rid) == id && ev && ev->on_event)
                ev->on_event(ev->ud, ps);
            json_decref(o);
            continue;
        }
        json_t *rid = json_object_get(o, "id");
        if (!json_is_null(rid) && !(json_is_integer(rid) && json_integer_value(rid) == id)) {
            json_decref(o);
            continue; /* not ours (a stale answer) */
        }
        json_t *e = json_object_get(o, "error");
        json_t *res = json_object_get(o, "result");
        int rc;
        if (json_is_object(e)) {
            const char *msg = json_string_value(json_object_get(e, "message"));
            rc = klib_fail(err, klib_error_code_of(e),
                           (int)json_integer_value(json_object_get(e, "code")), "%s",
                           msg ? msg : "the daemon reported an error without a message");
        } else if (res) {
            *result = json_incref(res);
            rc = 0;
        } else {
            rc = klib_fail(err, KERNELMGR_EDAEMON, 0,
                           "%s: the daemon sent a response without result or error", method);
        }
        json_decref(o);
        return rc;
    }
}

/* The client whose call this thread is in (its lock held, its events being
 * delivered): a call on it from an event callback would wait for itself. */
static _Thread_local kernelmgr_client *calling;

int klib_call(kernelmgr_client *c, const char *method, json_t *params, const klib_events *ev,
              json_t **result, kernelmgr_error **err)
{
    *result = NULL;
    if (calling == c) {
        json_decref(params);
        return klib_fail(err, KERNELMGR_EUSAGE, 0,
                         "%s: called from an event callback on the client that runs the exec "
                         "(only kernelmgr_session_interrupt may be)",
                         method);
    }
    pthread_mutex_lock(&c->lock);
    kernelmgr_client *outer = calling; /* a callback of another client's call */
    calling = c;
    int rc;
    if (c->fd < 0) {
        json_decref(params);
        rc = klib_fail(err, KERNELMGR_EDAEMON, 0,
                       "%s: the connection to the daemon was lost by an earlier call", method);
    } else {
        rc = roundtrip(c->fd, &c->r, ++c->next_id, method, params, ev, result, err);
        /* a broken connection stays broken: the next call says so */
        if (rc == BROKEN) {
            close(c->fd);
            c->fd = -1;
            rc = -1;
        }
    }
    calling = outer;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int klib_call_once(const char *sock, const char *method, json_t *params, json_t **result,
                   kernelmgr_error **err)
{
    *result = NULL;
    int fd = klib_dial(sock);
    if (fd < 0) {
        json_decref(params);
        return klib_fail(err, KERNELMGR_EDAEMON, 0, "%s: cannot connect to %s: %s", method, sock,
                         strerror(errno));
    }
    klib_reader r = {fd, NULL, 0, 0, 0};
    int rc = roundtrip(fd, &r, 1, method, params, NULL, result, err) ? -1 : 0;
    free(r.buf);
    close(fd);
    return rc;
}

static void client_free(kernelmgr_client *c)
{
    if (!c)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c->r.buf);
    free(c->home);
    free(c->sock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

KERNELMGR_API kernelmgr_client *kernelmgr_connect(const char *home, const char *daemon,
                                                  unsigned flags, kernelmgr_error **err)
{
    klib_ok(err);
    if (flags & ~KERNELMGR_AUTOSTART) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "kernelmgr_connect: unknown flags 0x%x",
                  flags & ~KERNELMGR_AUTOSTART);
        return NULL;
    }
    kernelmgr_client *c = calloc(1, sizeof *c);
    if (!c) {
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return NULL;
    }
    c->fd = -1;
    pthread_mutex_init(&c->lock, NULL);
    if (!(c->home = klib_home_resolve(home, err)))
        goto fail;
    struct sockaddr_un sun;
    if (asprintf(&c->sock, "%s/kernelmgr.sock", c->home) < 0) {
        c->sock = NULL;
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        goto fail;
    }
    if (strlen(c->sock) >= sizeof sun.sun_path) {
        klib_fail(err, KERNELMGR_EUSAGE, 0,
                  "socket path %s is longer than %zu bytes: use a shorter kernelmgr home", c->sock,
                  sizeof sun.sun_path - 1);
        goto fail;
    }
    /* a socket in a home that is not ours alone may be anyone's daemon */
    km_err why = {0};
    if (kmhome_prepare(c->home, 0, &why)) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "%s", why.msg);
        goto fail;
    }
    c->fd = klib_dial(c->sock);
    if (c->fd < 0 && !(flags & KERNELMGR_AUTOSTART)) {
        klib_fail(err, KERNELMGR_EDAEMON, 0, "no daemon is running for %s (%s: %s)", c->home,
                  c->sock, strerror(errno));
        goto fail;
    }
    if (c->fd < 0) {
        char *bin = klib_find_daemon(daemon, err);
        if (!bin)
            goto fail;
        if (kmhome_prepare(c->home, 1, &why)) {
            free(bin);
            klib_fail(err, KERNELMGR_EUSAGE, 0, "%s", why.msg);
            goto fail;
        }
        c->fd = klib_start_daemon(bin, c->home, c->sock, err);
        free(bin);
        if (c->fd < 0)
            goto fail;
    }
    c->r.fd = c->fd;
    json_t *res = NULL;
    if (klib_call(
            c, "initialize",
            json_pack("{s:i s:s}", "api_version", KERNELMGR_API_VERSION, "client", "libkernelmgr"),
            NULL, &res, err))
        goto fail;
    json_decref(res);
    return c;
fail:
    client_free(c);
    return NULL;
}

KERNELMGR_API const char *kernelmgr_client_home(const kernelmgr_client *c)
{
    return c ? c->home : NULL;
}

KERNELMGR_API void kernelmgr_client_free(kernelmgr_client *c)
{
    client_free(c);
}

KERNELMGR_API char *kernelmgr_call(kernelmgr_client *c, const char *method, const char *params_json,
                                   kernelmgr_error **err)
{
    klib_ok(err);
    if (!c || !method || !*method) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "kernelmgr_call: %s is NULL or empty",
                  !c ? "the client" : "the method");
        return NULL;
    }
    json_t *params = NULL;
    if (params_json) {
        json_error_t jerr;
        params = json_loads(params_json, JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(params)) {
            json_decref(params);
            klib_fail(err, KERNELMGR_EUSAGE, 0,
                      "kernelmgr_call: %s: params are not a JSON object (%s at line %d, "
                      "column %d)",
                      method, params ? "not an object" : jerr.text, jerr.line, jerr.column);
            return NULL;
        }
    }
    json_t *res = NULL;
    if (klib_call(c, method, params, NULL, &res, err))
        return NULL;
    char *text = json_dumps(res, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(res);
    if (!text)
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "%s: out of memory", method);
    return text;
}
