/*
 * klib_session.c — session options, sessions (session.create, interrupt,
 * restart, close, export) and exec with its streamed events.
 */
#include "libkernelmgr/klib_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- options */

KERNELMGR_API kernelmgr_options *kernelmgr_options_new(void)
{
    kernelmgr_options *o = calloc(1, sizeof *o);
    if (o && !(o->obj = json_object())) {
        free(o);
        return NULL;
    }
    return o;
}

KERNELMGR_API void kernelmgr_options_free(kernelmgr_options *o)
{
    if (!o)
        return;
    json_decref(o->obj);
    free(o);
}

static int set_value(kernelmgr_options *o, const char *key, json_t *v, kernelmgr_error **err)
{
    klib_ok(err);
    if (!o || !key || !*key) {
        json_decref(v);
        return klib_fail(err, KERNELMGR_EUSAGE, 0, "session option: %s is NULL or empty",
                         !o ? "the options" : "the key");
    }
    if (!v)
        return klib_fail(err, KERNELMGR_EUSAGE, 0,
                         "session option \"%s\": the value is NULL or not UTF-8", key);
    if (json_object_set_new(o->obj, key, v))
        return klib_fail(err, KERNELMGR_EUSAGE, 0,
                         "session option: the key is not UTF-8 (or out of memory)");
    return 0;
}

KERNELMGR_API int kernelmgr_options_set(kernelmgr_options *o, const char *key, const char *value,
                                        kernelmgr_error **err)
{
    return set_value(o, key, value ? json_string(value) : NULL, err);
}

KERNELMGR_API int kernelmgr_options_set_number(kernelmgr_options *o, const char *key, double value,
                                               kernelmgr_error **err)
{
    if (!isfinite(value))
        return klib_fail(err, KERNELMGR_EUSAGE, 0,
                         "session option \"%s\": the number is not finite", key ? key : "?");
    /* whole numbers go as integers ("memory" in bytes must be one); the
     * range is checked before the cast, which would be undefined outside */
    int whole = value > -9e15 && value < 9e15 && value == (double)(json_int_t)value;
    json_t *v = whole ? json_integer((json_int_t)value) : json_real(value);
    return set_value(o, key, v, err);
}

KERNELMGR_API int kernelmgr_options_set_env(kernelmgr_options *o, const char *name,
                                            const char *value, kernelmgr_error **err)
{
    klib_ok(err);
    if (!o || !name || !*name || !value)
        return klib_fail(err, KERNELMGR_EUSAGE, 0, "session option \"env\": %s is NULL or empty",
                         !o                ? "the options"
                         : !name || !*name ? "the name"
                                           : "the value");
    json_t *env = json_object_get(o->obj, "env");
    if (!json_is_object(env)) {
        env = json_object();
        if (!env || json_object_set_new(o->obj, "env", env))
            return klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
    }
    json_t *v = json_string(value);
    if (!v || json_object_set_new(env, name, v))
        return klib_fail(err, KERNELMGR_EUSAGE, 0,
                         "session option \"env\": the name or value is not UTF-8");
    return 0;
}

/* --------------------------------------------------------------- sessions */

json_t *klib_session_params(const kernelmgr_session *s)
{
    return json_pack("{s:s}", "session", s->name);
}

static void session_free(kernelmgr_session *s)
{
    if (!s)
        return;
    free(s->name);
    free(s->workspace);
    json_decref(s->warnings);
    free(s);
}

KERNELMGR_API kernelmgr_session *kernelmgr_session_open(kernelmgr_client *c, const char *name,
                                                        const kernelmgr_options *opts,
                                                        kernelmgr_error **err)
{
    klib_ok(err);
    if (!c || !name) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "kernelmgr_session_open: %s is NULL",
                  !c ? "the client" : "the name");
        return NULL;
    }
    json_t *p = opts ? json_deep_copy(opts->obj) : json_object();
    json_t *nm = json_string(name);
    if (!p || !nm || json_object_set_new(p, "session", nm)) {
        json_decref(p);
        klib_fail(err, KERNELMGR_EUSAGE, 0,
                  "kernelmgr_session_open: the name is not UTF-8 (or out of memory)");
        return NULL;
    }
    json_t *res = NULL;
    if (klib_call(c, "session.create", p, NULL, &res, err))
        return NULL;
    kernelmgr_session *s = calloc(1, sizeof *s);
    const char *ws = json_string_value(json_object_get(res, "workspace"));
    json_t *w = json_object_get(res, "warnings");
    if (!s || !(s->name = strdup(name)) || !(s->workspace = strdup(ws ? ws : "")) ||
        !(s->warnings = json_is_array(w) ? json_incref(w) : json_array())) {
        session_free(s);
        json_decref(res);
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return NULL;
    }
    s->c = c;
    s->created = json_is_true(json_object_get(res, "created"));
    json_decref(res);
    return s;
}

KERNELMGR_API const char *kernelmgr_session_name(const kernelmgr_session *s)
{
    return s ? s->name : NULL;
}

KERNELMGR_API const char *kernelmgr_session_workspace(const kernelmgr_session *s)
{
    return s ? s->workspace : NULL;
}

KERNELMGR_API int kernelmgr_session_created(const kernelmgr_session *s)
{
    return s ? s->created : 0;
}

KERNELMGR_API size_t kernelmgr_session_warnings(const kernelmgr_session *s)
{
    return s ? json_array_size(s->warnings) : 0;
}

KERNELMGR_API const char *kernelmgr_session_warning(const kernelmgr_session *s, size_t i)
{
    return s ? json_string_value(json_array_get(s->warnings, i)) : NULL;
}

KERNELMGR_API void kernelmgr_session_free(kernelmgr_session *s)
{
    session_free(s);
}

/* A method taking only {"session"} (plus extra, stolen, merged in):
 * 0, or -1 with *err. */
static int simple(kernelmgr_session *s, const char *method, json_t *extra, json_t **res,
                  kernelmgr_error **err)
{
    klib_ok(err);
    *res = NULL;
    if (!s) {
        json_decref(extra);
        return klib_fail(err, KERNELMGR_EUSAGE, 0, "%s: the session is NULL", method);
    }
    json_t *p = klib_session_params(s);
    if (p && extra)
        json_object_update(p, extra);
    json_decref(extra);
    if (!p)
        return klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
    return klib_call(s->c, method, p, NULL, res, err);
}

KERNELMGR_API int kernelmgr_session_interrupt(kernelmgr_session *s, kernelmgr_error **err)
{
    klib_ok(err);
    if (!s)
        return klib_fail(err, KERNELMGR_EUSAGE, 0, "interrupt: the session is NULL");
    json_t *p = klib_session_params(s), *res = NULL;
    if (!p)
        return klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
    int rc = klib_call_once(s->c->sock, "interrupt", p, &res, err);
    json_decref(res);
    return rc;
}

KERNELMGR_API int kernelmgr_session_restart(kernelmgr_session *s, kernelmgr_error **err)
{
    json_t *res;
    int rc = simple(s, "restart", NULL, &res, err);
    json_decref(res);
    return rc;
}

KERNELMGR_API int kernelmgr_session_close(kernelmgr_session *s, int keep, kernelmgr_error **err)
{
    json_t *res;
    int rc = simple(s, "close", keep ? json_pack("{s:b}", "keep", 1) : NULL, &res, err);
    json_decref(res);
    return rc;
}

/* The reply of a simple call as compact JSON text (new), or NULL with *err. */
static char *simple_text(kernelmgr_session *s, const char *method, json_t *extra,
                         kernelmgr_error **err)
{
    json_t *res;
    if (simple(s, method, extra, &res, err))
        return NULL;
    char *text = json_dumps(res, JSON_COMPACT);
    json_decref(res);
    if (!text)
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
    return text;
}

/* {"tag": tag} (new), or NULL for no tag */
static json_t *tag_param(const char *tag)
{
    return tag ? json_pack("{s:s}", "tag", tag) : NULL;
}

KERNELMGR_API char *kernelmgr_session_snapshot(kernelmgr_session *s, const char *tag,
                                               kernelmgr_error **err)
{
    return simple_text(s, "session.snapshot", tag_param(tag), err);
}

KERNELMGR_API char *kernelmgr_session_snapshots(kernelmgr_session *s, kernelmgr_error **err)
{
    return simple_text(s, "session.snapshots", NULL, err);
}

KERNELMGR_API int kernelmgr_session_restore(kernelmgr_session *s, const char *tag,
                                            kernelmgr_error **err)
{
    json_t *res;
    int rc = simple(s, "session.restore", tag_param(tag), &res, err);
    json_decref(res);
    return rc;
}

KERNELMGR_API char *kernelmgr_session_fork(kernelmgr_session *s, const char *new_name,
                                           const char *tag, kernelmgr_error **err)
{
    if (!new_name) {
        klib_ok(err);
        klib_fail(err, KERNELMGR_EUSAGE, 0, "fork: new_name is NULL");
        return NULL;
    }
    json_t *extra = json_pack("{s:s}", "new_session", new_name);
    if (extra && tag)
        json_object_set_new(extra, "tag", json_string(tag));
    return simple_text(s, "session.fork", extra, err);
}

KERNELMGR_API char *kernelmgr_session_export(kernelmgr_session *s, kernelmgr_error **err)
{
    json_t *res;
    if (simple(s, "export", NULL, &res, err))
        return NULL;
    json_t *nb = json_object_get(res, "notebook");
    char *text = json_is_object(nb) ? json_dumps(nb, JSON_COMPACT) : NULL;
    if (!text)
        klib_fail(err, json_is_object(nb) ? KERNELMGR_EINTERNAL : KERNELMGR_EDAEMON, 0,
                  "export: %s",
                  json_is_object(nb) ? "out of memory" : "the daemon's result has no notebook");
    json_decref(res);
    return text;
}

/* ------------------------------------------------------------------- exec */

typedef struct exec_ctx {
    kernelmgr_session *s;
    kernelmgr_event_cb cb;
    void *ud;
    int interrupted; /* the callback asked once */
} exec_ctx;

/* The event kinds by the daemon's event name (and a stream's name). */
static const struct {
    const char *event, *name;
    kernelmgr_event_kind kind;
} event_kinds[] = {
    {"stream", "stdout", KERNELMGR_EVENT_STDOUT},
    {"stream", "stderr", KERNELMGR_EVENT_STDERR},
    {"notice", NULL, KERNELMGR_EVENT_NOTICE},
    {"result", NULL, KERNELMGR_EVENT_RESULT},
};

static void on_event(void *ud, const json_t *ps)
{
    exec_ctx *x = ud;
    const char *event = json_string_value(json_object_get(ps, "event"));
    const char *name = json_string_value(json_object_get(ps, "name"));
    kernelmgr_event ev = {0};
    for (size_t i = 0; event && i < sizeof event_kinds / sizeof event_kinds[0]; i++)
        if (!strcmp(event, event_kinds[i].event) &&
            (!event_kinds[i].name || (name && !strcmp(name, event_kinds[i].name))))
            ev.kind = event_kinds[i].kind;
    if (!ev.kind)
        return; /* an event this library does not know: additions are allowed */
    ev.block = (int)json_integer_value(json_object_get(ps, "block"));
    kernelmgr_result *one = NULL;
    if (ev.kind == KERNELMGR_EVENT_RESULT) {
        json_t *r = json_object_get(ps, "result");
        if (!json_is_object(r) || !(one = klib_result_new(json_incref(r), 1, NULL)))
            return;
        ev.result = one;
    } else {
        json_t *t = json_object_get(ps, ev.kind == KERNELMGR_EVENT_NOTICE ? "message" : "text");
        ev.text = json_string_value(t);
        if (!ev.text)
            return;
        ev.len = json_string_length(t);
    }
    int stop = x->cb(&ev, x->ud);
    kernelmgr_result_free(one);
    if (stop && !x->interrupted) {
        x->interrupted = 1;
        kernelmgr_session_interrupt(x->s, NULL);
    }
}

KERNELMGR_API kernelmgr_result *kernelmgr_exec(kernelmgr_session *s, const char *code,
                                               const char *lang, double timeout, unsigned flags,
                                               kernelmgr_event_cb cb, void *ud,
                                               kernelmgr_error **err)
{
    klib_ok(err);
    if (!s || !code) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "exec: %s is NULL", !s ? "the session" : "the code");
        return NULL;
    }
    if (flags & ~KERNELMGR_EXEC_CONTINUE_ON_ERROR) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "exec: unknown flags 0x%x",
                  flags & ~KERNELMGR_EXEC_CONTINUE_ON_ERROR);
        return NULL;
    }
    json_t *p = klib_session_params(s);
    json_t *jc = json_string(code);
    if (!p || !jc || json_object_set_new(p, "code", jc)) {
        json_decref(p);
        klib_fail(err, KERNELMGR_EUSAGE, 0, "exec: the code is not valid UTF-8");
        return NULL;
    }
    if (lang && json_object_set_new(p, "lang", json_string(lang))) {
        json_decref(p);
        klib_fail(err, KERNELMGR_EUSAGE, 0, "exec: the language is not valid UTF-8");
        return NULL;
    }
    if (timeout > 0)
        json_object_set_new(p, "timeout", json_real(timeout));
    if (flags & KERNELMGR_EXEC_CONTINUE_ON_ERROR)
        json_object_set_new(p, "continue_on_error", json_true());
    if (cb)
        json_object_set_new(p, "stream", json_true());
    exec_ctx x = {s, cb, ud, 0};
    klib_events ev = {on_event, &x};
    json_t *res = NULL;
    if (klib_call(s->c, "exec", p, cb ? &ev : NULL, &res, err))
        return NULL;
    return klib_result_new(res, 0, err);
}
