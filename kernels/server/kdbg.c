/*
 * kdbg.c — the debug_request relay, see kdbg.h.
 */
#include "kernels/server/kdbg.h"
#include "kernels/server/kserver.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A request the worker has not answered yet. */
typedef struct kdbg_pending {
    uint64_t id;
    jmsg *parent;    /* owned: header and routing ids of the request */
    json_t *request; /* owned: its "seq" and "command", for a failure reply */
    char *held;      /* owned: the line, while it waits for the worker to be ready */
    struct kdbg_pending *next;
} kdbg_pending;

struct kdbg {
    kdbg_pending *head;
    unsigned n;
    uint64_t next_id;
    jmsg *last_parent; /* owned: the parent of debug events */
};

/* new: a message that stands for msg as a parent (its header, routing ids). */
static jmsg *parent_copy(const jmsg *msg)
{
    jmsg *c = jmsg_new(jmsg_type(msg), jmsg_session(msg), "kernel", NULL);
    if (!c)
        return NULL;
    json_decref(c->header);
    c->header = json_deep_copy(msg->header);
    if (!c->header || jmsg_set_ids(c, msg->ids, msg->n_ids) < 0) {
        jmsg_destroy(&c);
        return NULL;
    }
    return c;
}

/* new: a DAP response to request that failed for why. */
static json_t *failure(const json_t *request, const char *why)
{
    json_t *seq = json_object_get(request, "seq");
    const char *cmd = json_string_value(json_object_get(request, "command"));
    return json_pack("{s:s, s:i, s:I, s:b, s:s, s:s, s:{}}", "type", "response", "seq", 0,
                     "request_seq",
                     (json_int_t)(json_is_integer(seq) ? json_integer_value(seq) : 0), "success", 0,
                     "command", cmd ? cmd : "", "message", why, "body");
}

static const char *no_debugger(const kserver *ks)
{
    return ks->spec.debug_pipes ? "no debugger: debugpy is not importable by this kernel's "
                                  "Python (Debian: python3-debugpy; or pip install debugpy)"
                                : "this kernel has no debugger";
}

static void reply_to(kserver *ks, const jmsg *parent, json_t *content)
{
    kserver_reply(ks, ks->control, "debug_reply", content, NULL, parent);
    kserver_status(ks, "idle", parent);
}

static struct kdbg *state(kserver *ks)
{
    if (!ks->dbg)
        ks->dbg = calloc(1, sizeof *ks->dbg);
    return ks->dbg;
}

void kdbg_answer(kserver *ks, void *sock, jmsg *msg, const kshell_msg *m)
{
    json_t *req = msg->content;
    kserver_status(ks, "busy", msg);
    const char *why = NULL;
    char buf[160];
    struct kdbg *d = state(ks);
    if (!json_is_string(json_object_get(req, "command")))
        why = "a debug_request's content must be a DAP request with a string \"command\"";
    else if (!d)
        why = "out of memory";
    else if (!ks->worker)
        why = "the kernel's worker is restarting; try again";
    else if (ks->worker_ready &&
             (!(ks->worker_features & KFEAT_DEBUG) || !kworker_has_debug(ks->worker)))
        why = no_debugger(ks);
    else if (d->n >= KDBG_MAX_PENDING) {
        snprintf(buf, sizeof buf, "too many debug requests in flight (limit %d)", KDBG_MAX_PENDING);
        why = buf;
    }
    kdbg_pending *p = NULL;
    char *line = NULL;
    if (!why) {
        p = calloc(1, sizeof *p);
        json_t *wrapped =
            p ? json_pack("{s:I, s:O}", "id", (json_int_t)(d->next_id + 1), "request", req) : NULL;
        line = wrapped ? json_dumps(wrapped, JSON_COMPACT) : NULL;
        json_decref(wrapped);
        if (p)
            p->parent = parent_copy(msg);
        if (!line || !p->parent) {
            why = "out of memory";
        } else if (!ks->worker_ready) {
            /* a worker still starting: sent once it is ready (kdbg_worker_ready) */
            p->held = line;
            line = NULL;
        } else if (kworker_debug_send(ks->worker, line, strlen(line)) < 0) {
            why = "the worker's debug pipe is closed";
        }
    }
    free(line);
    if (why) {
        if (p)
            jmsg_destroy(&p->parent);
        free(p);
        reply_to(ks, msg, failure(req, why));
        return;
    }
    p->id = ++d->next_id;
    p->request = json_pack("{s:O?, s:O?}", "seq", json_object_get(req, "seq"), "command",
                           json_object_get(req, "command"));
    p->next = d->head;
    d->head = p;
    d->n++;
    jmsg_destroy(&d->last_parent);
    d->last_parent = parent_copy(msg);
}

static kdbg_pending *take(struct kdbg *d, uint64_t id)
{
    for (kdbg_pending **pp = &d->head; *pp; pp = &(*pp)->next) {
        if ((*pp)->id == id) {
            kdbg_pending *p = *pp;
            *pp = p->next;
            d->n--;
            return p;
        }
    }
    return NULL;
}

static void pending_free(kdbg_pending *p)
{
    free(p->held);
    jmsg_destroy(&p->parent);
    json_decref(p->request);
    free(p);
}

void kdbg_on_line(void *arg, json_t *ev)
{
    kserver *ks = arg;
    struct kdbg *d = ks->dbg;
    json_t *id = json_object_get(ev, "id"), *reply = json_object_get(ev, "reply"),
           *event = json_object_get(ev, "event");
    if (json_is_integer(id) && json_is_object(reply)) {
        kdbg_pending *p = d ? take(d, (uint64_t)json_integer_value(id)) : NULL;
        if (!p) {
            kserver_log("worker: ignoring a debug reply to no request in flight");
            return;
        }
        reply_to(ks, p->parent, json_incref(reply));
        pending_free(p);
    } else if (json_is_object(event)) {
        kserver_publish(ks, "debug_event", json_incref(event), d ? d->last_parent : NULL);
    } else {
        kserver_log("worker: ignoring a malformed debug line (neither a reply nor an event)");
    }
}

void kdbg_worker_ready(kserver *ks)
{
    struct kdbg *d = ks->dbg;
    if (!d)
        return;
    /* oldest first: the list is newest first, so collect then send */
    kdbg_pending *held[KDBG_MAX_PENDING] = {0};
    size_t n = 0;
    for (kdbg_pending *p = d->head; p && n < KDBG_MAX_PENDING; p = p->next)
        if (p->held)
            held[n++] = p;
    while (n--) {
        kdbg_pending *p = held[n];
        char *line = p->held;
        p->held = NULL;
        const char *why = NULL;
        if (!(ks->worker_features & KFEAT_DEBUG) || !kworker_has_debug(ks->worker))
            why = no_debugger(ks);
        else if (kworker_debug_send(ks->worker, line, strlen(line)) < 0)
            why = "the worker's debug pipe is closed";
        free(line);
        if (why) {
            take(d, p->id);
            reply_to(ks, p->parent, failure(p->request, why));
            pending_free(p);
        }
    }
}

void kdbg_worker_gone(kserver *ks, const char *why)
{
    struct kdbg *d = ks->dbg;
    while (d && d->head) {
        kdbg_pending *p = d->head;
        d->head = p->next;
        d->n--;
        reply_to(ks, p->parent, failure(p->request, why));
        pending_free(p);
    }
}

void kdbg_free(kserver *ks)
{
    struct kdbg *d = ks->dbg;
    if (!d)
        return;
    while (d->head) {
        kdbg_pending *p = d->head;
        d->head = p->next;
        pending_free(p);
    }
    jmsg_destroy(&d->last_parent);
    free(d);
    ks->dbg = NULL;
}
