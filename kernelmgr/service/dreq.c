/*
 * dreq.c — one request in flight: its replies (scrubbed for the tier of its
 * connection, daemon_int.h) and its exec's stream events.
 */
#include "kernelmgr/service/daemon_int.h"
#include "kernelmgr/service/rpc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dreq_init(dreq *r, dconn *c, json_t *id, const char *method)
{
    memset(r, 0, sizeof *r);
    r->dc = c;
    r->id = id;
    r->method = method;
    r->tier = c->grant.tier;
}

static int dreq_dead(dreq *r)
{
    pthread_mutex_lock(&r->dc->mu);
    int d = r->dc->dead;
    pthread_mutex_unlock(&r->dc->mu);
    return d;
}

static void dreq_send(dreq *r, json_t *o /* steals */)
{
    if (o)
        dconn_write_json(r->dc, o, 0);
    json_decref(o);
}

void dreq_err(dreq *r, int km_code, const char *msg)
{
    char m2[sizeof((km_err *)0)->msg + 64];
    snprintf(m2, sizeof m2, "%s", msg);
    dtier_scrub_text(r->tier, m2, sizeof m2, km_manager_home(daemon_mgr));
    dreq_send(r, rpc_error_km(r->id, km_code, m2));
}

void dreq_fail(dreq *r)
{
    dreq_err(r, r->err.code, r->err.msg);
}

void dreq_invalid(dreq *r, const char *why)
{
    char msg[1200];
    snprintf(msg, sizeof msg, "%s: %s", r->method, why);
    dtier_scrub_text(r->tier, msg, sizeof msg, km_manager_home(daemon_mgr));
    dreq_send(r, rpc_error_params(r->id, msg));
}

void dreq_invalidf(dreq *r, const char *fmt, ...)
{
    char msg[sizeof r->why.msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    km_err_set(&r->why, KM_EUSAGE, "%s", msg);
    dreq_invalid(r, r->why.msg);
}

void dreq_ok(dreq *r, json_t *result)
{
    dtier_scrub(r->tier, result, km_manager_home(daemon_mgr));
    dreq_send(r, rpc_result(r->id, result));
}

void dreq_reply(dreq *r, json_t *res)
{
    if (!res)
        return dreq_fail(r);
    dreq_ok(r, res);
}

/* A stream event for a "raw_text" client: the notification without "text"
 * but with "text_bytes": N, then the N bytes of the text (UTF-8, as the
 * kernel sent them), in one write unit. JSON-escaping the text here and
 * parsing it again in the client was most of the CPU of a long output
 * (the text of `yes` is half escapes). 0, or -1: send it the usual way. */
static int on_event_raw(dreq *r, const json_t *ev)
{
    json_t *t = json_object_get(ev, "text");
    json_t *block = json_object_get(ev, "block");
    json_t *name = json_object_get(ev, "name");
    if (!json_is_string(t) || !json_is_integer(block) || !json_is_string(name))
        return -1;
    size_t tn = json_string_length(t);
    json_t *h =
        rpc_notification(DAEMON_EVENT_METHOD,
                         json_pack("{s:O s:s s:O s:O s:I}", "request_id", r->id, "event", "stream",
                                   "block", block, "name", name, "text_bytes", (json_int_t)tn));
    char *hs = h ? json_dumps(h, JSON_COMPACT) : NULL;
    json_decref(h);
    if (!hs)
        return -1;
    size_t hn = strlen(hs);
    char *unit = malloc(hn + 1 + tn);
    if (!unit) {
        free(hs);
        return -1;
    }
    memcpy(unit, hs, hn);
    unit[hn] = '\n';
    memcpy(unit + hn + 1, json_string_value(t), tn);
    free(hs);
    pthread_mutex_lock(&r->dc->mu);
    r->dc->last_block = json_integer_value(block);
    pthread_mutex_unlock(&r->dc->mu);
    dconn_write(r->dc, unit, hn + 1 + tn, 1);
    free(unit);
    return 0;
}

void dreq_on_event(void *ud, const json_t *ev)
{
    dreq *r = ud;
    if (r->dead || (r->dead = dreq_dead(r)))
        return;
    if (r->tier != DT_HTTP && r->raw && json_is_string(json_object_get(ev, "text")) &&
        !strcmp(json_string_value(json_object_get(ev, "event")) ?: "", "stream") &&
        on_event_raw(r, ev) == 0)
        return;
    json_t *params = json_deep_copy(ev);
    if (!params)
        return;
    json_object_set(params, "request_id", r->id);
    dtier_scrub(r->tier, params, km_manager_home(daemon_mgr));
    if (json_is_object(json_object_get(params, "result"))) /* a block's result */
        dtier_scrub(r->tier, json_object_get(params, "result"), km_manager_home(daemon_mgr));
    json_t *b = json_object_get(params, "block");
    if (json_is_integer(b)) {
        pthread_mutex_lock(&r->dc->mu);
        r->dc->last_block = json_integer_value(b);
        pthread_mutex_unlock(&r->dc->mu);
    }
    json_t *o = rpc_notification(DAEMON_EVENT_METHOD, params);
    if (o)
        dconn_write_json(r->dc, o, 1);
    json_decref(o);
}
