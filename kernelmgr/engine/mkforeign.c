/*
 * mkforeign.c — other clients' cells on a kernel, into the history (see
 * mkforeign.h).
 */
#include "kernelmgr/engine/mkforeign.h"
#include "common/cm_clock.h"
#include "kernelmgr/engine/codeexec.h"
#include "kernelmgr/engine/mkclient.h"
#include "kernelmgr/engine/session.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The one cell of another client the kernel runs now (a kernel runs one
 * execute_request at a time: memory is one cell's, bounded by the caps). */
typedef struct fcell {
    char *msg_id;       /* any length: jupyter_client's are "UUID_PID_N" */
    const char *client; /* static */
    double since;
    char tag[96];       /* its history id, once "started" was written */
    char *code;         /* from execute_input; NULL until then */
    unsigned long lost; /* its messages dropped unread */
    codeexec_watch *w;
} fcell;

struct kforeign {
    char own[37];
    const char *dir, *language; /* borrowed (kforeign_new) */
    uint64_t history_max;
    size_t output_cap;
    uint64_t display_max;
    fcell *cur; /* NULL: none runs */
    const char *last_client;
    unsigned seq;
};

/* ------------------------------------------------------------------ notes */

static pthread_mutex_t notes_mu = PTHREAD_MUTEX_INITIALIZER;
/* a request id longer than a note holds is not noted (its cell is then
 * "jupyter"): never a wrong match by a cut id */
#define KFOREIGN_NOTE_ID_MAX 128
static struct {
    char id[KFOREIGN_NOTE_ID_MAX + 1];
    const char *client;
} notes[KFOREIGN_NOTES];
static unsigned notes_next;

void kforeign_note(const char *msg_id, const char *client)
{
    if (!msg_id || !client || strlen(msg_id) > KFOREIGN_NOTE_ID_MAX)
        return;
    pthread_mutex_lock(&notes_mu);
    snprintf(notes[notes_next].id, sizeof notes[0].id, "%s", msg_id);
    notes[notes_next].client = client;
    notes_next = (notes_next + 1) % KFOREIGN_NOTES;
    pthread_mutex_unlock(&notes_mu);
}

/* The client noted for msg_id (the note is taken), else "jupyter". */
static const char *note_take(const char *msg_id)
{
    const char *c = "jupyter";
    pthread_mutex_lock(&notes_mu);
    for (unsigned i = 0; i < KFOREIGN_NOTES; i++)
        if (notes[i].client && !strcmp(notes[i].id, msg_id)) {
            c = notes[i].client;
            notes[i].client = NULL;
            notes[i].id[0] = 0;
            break;
        }
    pthread_mutex_unlock(&notes_mu);
    return c;
}

const char *kforeign_describe(const char *client)
{
    if (client && !strcmp(client, "websocket"))
        return "a cell a WebSocket client of the gateway runs";
    return "a cell another Jupyter client of the kernel runs";
}

/* ------------------------------------------------------------------ cells */

kforeign *kforeign_new(const char *own_session, const char *session_dir, const char *language,
                       uint64_t history_max, size_t output_cap, uint64_t display_max)
{
    kforeign *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    snprintf(f->own, sizeof f->own, "%s", own_session);
    f->dir = session_dir;
    f->language = language;
    f->history_max = history_max;
    f->output_cap = output_cap;
    f->display_max = display_max;
    return f;
}

/* Writes the cell's "finished" record (when its "started" one was
 * written) with status; extra (stolen, may be NULL) is one more output. */
static void cell_finish(kforeign *f, fcell *c, const char *status, json_t *extra)
{
    if (c->tag[0]) {
        int errored = 0;
        json_int_t count = -1;
        json_t *outs = c->w ? codeexec_watch_outputs(c->w, &errored, &count) : json_array();
        if (outs && c->lost) {
            char note[200];
            snprintf(note, sizeof note,
                     "[... kernelmgr: %lu output messages of this cell were not read (the "
                     "kernel's output came faster than the manager reads it) ...]\n",
                     c->lost);
            json_array_append_new(outs, json_pack("{s:s s:s s:s}", "output_type", "stream", "name",
                                                  "stderr", "text", note));
        }
        if (outs && extra)
            json_array_append(outs, extra);
        json_t *r = json_pack("{s:o s:s}", "execution_count",
                              count >= 0 ? json_integer(count) : json_null(), "status",
                              status    ? status
                              : errored ? "error"
                                        : "ok");
        km_err err = {0};
        if (!r || !outs)
            fprintf(stderr, "kernelmgr: cannot record a %s cell in %s: out of memory\n", c->client,
                    f->dir);
        else if (session_history_append(f->dir, c->tag, f->language, c->client,
                                        c->code ? c->code : "", r, outs, f->history_max, &err))
            fprintf(stderr, "kernelmgr: %s\n", err.msg);
        json_decref(r);
        json_decref(outs);
    }
    json_decref(extra);
    codeexec_watch_destroy(&c->w);
    free(c->code);
    free(c->msg_id);
    free(c);
}

void kforeign_destroy(kforeign **pf, const char *why)
{
    if (!pf || !*pf)
        return;
    kforeign *f = *pf;
    if (f->cur) {
        const char *w = why ? why : "the kernel stopped while this cell ran";
        cell_finish(f, f->cur, "killed",
                    json_pack("{s:s s:s s:s s:[s]}", "output_type", "error", "ename",
                              "KernelStopped", "evalue", w, "traceback", w));
        f->cur = NULL;
    }
    free(f);
    *pf = NULL;
}

/* The cell of msg_id, begun when it is not the current one (a current cell
 * whose idle never came is finished as it is). NULL when out of memory. */
static fcell *cell_of(kforeign *f, const char *msg_id)
{
    if (f->cur && !strcmp(f->cur->msg_id, msg_id))
        return f->cur;
    if (f->cur) {
        cell_finish(f, f->cur, NULL, NULL);
        f->cur = NULL;
    }
    fcell *c = calloc(1, sizeof *c);
    if (!c || !(c->msg_id = strdup(msg_id))) {
        free(c);
        return NULL;
    }
    c->client = note_take(msg_id);
    f->last_client = c->client;
    c->since = kclient_now();
    c->w = codeexec_watch_new(f->output_cap, f->display_max);
    f->cur = c;
    return c;
}

/* execute_input: the cell's code is known, the history records it. */
static void cell_started(kforeign *f, fcell *c, const json_t *content)
{
    if (c->tag[0])
        return;
    const char *code = json_string_value(json_object_get(content, "code"));
    free(c->code);
    c->code = strdup(code ? code : "");
    snprintf(c->tag, sizeof c->tag, "%lld-%04u-%s-%.8s-%s", (long long)cm_wall_s(), ++f->seq,
             c->client, c->msg_id, f->language);
    km_err err = {0};
    if (session_history_start(f->dir, c->tag, f->language, c->client, c->code ? c->code : "",
                              f->history_max, &err))
        fprintf(stderr, "kernelmgr: %s\n", err.msg);
}

int kforeign_feed(kforeign *f, jp_channel ch, const jmsg *m)
{
    if (!f || ch != JP_IOPUB || !m)
        return 0;
    const json_t *ph = m->parent_header;
    const char *pid = json_string_value(json_object_get(ph, "msg_id"));
    const char *ptype = json_string_value(json_object_get(ph, "msg_type"));
    const char *psess = json_string_value(json_object_get(ph, "session"));
    if (!pid || !ptype || strcmp(ptype, "execute_request") || (psess && !strcmp(psess, f->own)))
        return 0;
    const char *type = jmsg_type(m);
    const json_t *content = m->content;
    if (!strcmp(type, "status")) {
        const char *st = json_string_value(json_object_get(content, "execution_state"));
        if (st && !strcmp(st, "busy")) {
            cell_of(f, pid);
        } else if (st && !strcmp(st, "idle") && f->cur && !strcmp(f->cur->msg_id, pid)) {
            cell_finish(f, f->cur, NULL, NULL);
            f->cur = NULL;
        }
        return 1;
    }
    /* an output whose busy was missed (e.g. sent before this client
     * subscribed) still belongs to a cell */
    fcell *c = cell_of(f, pid);
    if (!c)
        return 1;
    if (!strcmp(type, "execute_input"))
        cell_started(f, c, content);
    if (c->w)
        codeexec_watch_iopub(c->w, type, content);
    return 1;
}

int kforeign_busy(const kforeign *f, double *since, const char **client)
{
    /* a cell some of whose messages went unread may have ended unseen: not
     * waited for (an exec sent behind it still reports its queueing, from
     * the cell's later messages: codeexec's queued_s) */
    if (!f || !f->cur || f->cur->lost)
        return 0;
    if (since)
        *since = f->cur->since;
    if (client)
        *client = f->cur->client;
    return 1;
}

void kforeign_lost(kforeign *f, unsigned long n)
{
    if (f && f->cur)
        f->cur->lost += n;
}

const char *kforeign_last_client(const kforeign *f)
{
    return f ? f->last_client : NULL;
}
