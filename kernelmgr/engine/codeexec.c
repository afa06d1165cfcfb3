/*
 * codeexec.c — run one block on a kernel and build its result.
 */
#include "kernelmgr/engine/codeexec.h"
#include "common/cm_utf8.h"
#include "common/cm_clock.h"
#include "common/cm_mime.h"
#include "kernelmgr/engine/fsdiff.h"
#include "kernelmgr/engine/outcap.h"
#include "kernelmgr/engine/result.h"
#include "jp.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CODEEXEC_MAX_DISPLAYS 64
#define CODEEXEC_MAX_NB_OUTPUTS 256

void codeexec_strip_ansi(char *s)
{
    char *w = s;
    for (char *r = s; *r;) {
        if (*r == '\x1b' && r[1] == '[') {
            r += 2;
            while (*r && !(*r >= '@' && *r <= '~'))
                r++;
            if (*r)
                r++;
            continue;
        }
        *w++ = *r++;
    }
    *w = 0;
}

static void emit(const codeexec_params *p, json_t *ev)
{
    if (p->fn && ev)
        p->fn(p->ud, ev);
    json_decref(ev);
}

/* The file extension of an image type the manager saves (cm_mime.h), or NULL. */
static const char *image_ext(const char *mime)
{
    return cm_mime_is_image(mime) ? cm_mime_ext(mime) : NULL;
}

/* What the block's rich outputs were allowed to keep and what they lost. */
typedef struct rich_acct {
    uint64_t received; /* bytes of every rich output that arrived */
    uint64_t kept;     /* bytes accepted (never decreases: clear_output does not reset it) */
    unsigned omitted;
    unsigned images_omitted;
    char image_note[600]; /* why the last image was not saved */
} rich_acct;

/* Size of a mime bundle as it will be held: its strings, and the serialised
 * size of anything else. */
static uint64_t bundle_bytes(const json_t *data)
{
    uint64_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)data, k, v)
    {
        n += strlen(k);
        if (json_is_string(v)) {
            n += json_string_length(v);
        } else {
            char *d = json_dumps(v, JSON_COMPACT);
            n += d ? strlen(d) : 0;
            free(d);
        }
    }
    return n;
}

/* 1 when a rich output of n bytes fits in the block's display_max. */
static int rich_accept(const codeexec_params *p, rich_acct *a, uint64_t n)
{
    a->received += n;
    if (a->kept + n > p->display_max) {
        a->omitted++;
        return 0;
    }
    a->kept += n;
    return 1;
}

static int write_file(const char *path, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    const char *b = buf;
    while (len) {
        ssize_t w = write(fd, b, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w == 0 ? ENOSPC : errno;
            close(fd);
            unlink(path); /* never leave a partial image */
            errno = e;
            return -1;
        }
        b += w;
        len -= (size_t)w;
    }
    if (close(fd) < 0) {
        int e = errno;
        unlink(path);
        errno = e;
        return -1;
    }
    return 0;
}

/* Saves every image of a mime bundle under outdir, within the session's
 * outputs budget; appends to images. */
static void save_images(const codeexec_params *p, json_t *bundle, json_t *images, int *seq,
                        rich_acct *acct)
{
    if (!p->outdir)
        return; /* a watched cell: images stay in its outputs */
    const char *mime;
    json_t *v;
    json_object_foreach(bundle, mime, v)
    {
        const char *ext = image_ext(mime);
        if (!ext || !json_is_string(v))
            continue;
        const char *txt = json_string_value(v);
        size_t tl = json_string_length(v);
        unsigned char *bin = NULL;
        size_t bl = 0;
        if (!strcmp(ext, "svg")) {
            bin = (unsigned char *)strdup(txt);
            bl = tl;
        } else {
            bin = malloc(tl / 4 * 3 + 4);
            if (bin && sodium_base642bin(bin, tl / 4 * 3 + 4, txt, tl, "\n\r ", &bl, NULL,
                                         sodium_base64_VARIANT_ORIGINAL)) {
                free(bin);
                bin = NULL;
            }
        }
        if (!bin)
            continue;
        if (p->outputs_left && bl > *p->outputs_left) {
            char sz[32];
            acct->images_omitted++;
            snprintf(acct->image_note, sizeof acct->image_note,
                     "not saved: the session's outputs reached their limit "
                     "(session_outputs_max, %s left)",
                     outcap_fmt_size(*p->outputs_left, sz, sizeof sz));
            free(bin);
            continue;
        }
        mkdir(p->outdir, 0700);
        char *path = NULL;
        if (asprintf(&path, "%s/%s-image%d.%s", p->outdir, p->tag, ++*seq, ext) < 0) {
            free(bin);
            continue;
        }
        if (write_file(path, bin, bl) == 0) {
            if (p->outputs_left)
                *p->outputs_left -= bl;
            json_array_append_new(images, json_pack("{s:s s:s s:I}", "path", path, "mime", mime,
                                                    "size", (json_int_t)bl));
        } else {
            acct->images_omitted++;
            snprintf(acct->image_note, sizeof acct->image_note, "not saved: %s (%.500s)",
                     strerror(errno), path);
        }
        free(path);
        free(bin);
    }
}

/* new: a copy of s cut to at most max bytes at a character boundary;
 * *cut gets the number of bytes left out. */
static char *cut_text(const char *s, size_t len, size_t max, size_t *cut)
{
    size_t n = len <= max ? len : cm_utf8_complete_prefix(s, max);
    *cut = len - n;
    return strndup(s, n);
}

static json_t *nb_output(const char *type, json_t *fields)
{
    json_object_set_new(fields, "output_type", json_string(type));
    return fields;
}

/* Appends stream text to the notebook outputs, merging with a previous
 * output of the same stream (what nbconvert does), within the cap. */
static void nb_stream(json_t *outs, const char *name, const char *text, size_t cap, size_t *kept)
{
    if (*kept >= cap)
        return;
    size_t len = strlen(text);
    if (*kept + len > cap)
        len = cap - *kept;
    *kept += len;
    char *t = strndup(text, len);
    if (!t)
        return;
    size_t n = json_array_size(outs);
    json_t *last = n ? json_array_get(outs, n - 1) : NULL;
    if (last && !strcmp(json_string_value(json_object_get(last, "output_type")) ?: "", "stream") &&
        !strcmp(json_string_value(json_object_get(last, "name")) ?: "", name)) {
        const char *old = json_string_value(json_object_get(last, "text"));
        size_t ol = strlen(old);
        char *joined = malloc(ol + strlen(t) + 1);
        if (joined) {
            memcpy(joined, old, ol);
            strcpy(joined + ol, t);
            json_object_set_new(last, "text", json_string(joined));
            free(joined);
        }
    } else if (n < CODEEXEC_MAX_NB_OUTPUTS) {
        json_array_append_new(outs,
                              nb_output("stream", json_pack("{s:s s:s}", "name", name, "text", t)));
    }
    free(t);
}

/* 1 when the notebook outputs already hold an error output. */
static int nb_has_error(const json_t *outs)
{
    size_t i;
    json_t *o;
    json_array_foreach((json_t *)outs, i, o)
    {
        const char *t = json_string_value(json_object_get(o, "output_type"));
        if (t && !strcmp(t, "error"))
            return 1;
    }
    return 0;
}

/* The interrupt the kernel asked for in its kernelspec: SIGINT, or an
 * interrupt_request on the control channel. */
static void interrupt_kernel(kclient *kc, kproc *kp)
{
    if (kp->interrupt_signal)
        klaunch_signal(kp, SIGINT);
    else
        kclient_send(kc, JP_CONTROL, "interrupt_request", NULL, NULL, NULL);
}

static const char *const stream_names[2] = {"stdout", "stderr"};

/* What one execution collects while it waits for its reply and idle
 * (codeexec_run): the result being built, the output caps and the state of
 * the wait. Owned by codeexec_run; the json_t members are new references
 * until they are set into r. */
typedef struct exec_state {
    const codeexec_params *p;
    codeexec_outcome *out;
    json_t *r;         /* the result (result_new) */
    outcap *cap[2];    /* stdout, stderr; NULL when out of memory */
    size_t nb_kept[2]; /* stream bytes in the notebook outputs */
    rich_acct acct;    /* display_max accounting */
    json_t *reply;     /* the execute_reply's content, or NULL */
    json_t *result;    /* the execute_result's data, or JSON null */
    json_t *error;     /* result_error, or JSON null */
    json_t *displays;  /* display_data bundles */
    json_t *images;    /* saved image files */
    int idle, timed_out, interrupted, died, stuck, no_reply, img_seq;
    int watched;     /* another client's cell (codeexec_watch): no outcap, no files */
    int started;     /* a message of ours came: the kernel started the request */
    int other_first; /* another client's cell ran before ours started */
    double t_started;
    json_int_t exec_count;
    char msg_id[37]; /* of the execute_request */
    /* The kernel's own clock (its header dates, wall time; 0: not seen):
     * when it took the cell up. A stall of the manager (load, swap, SIGSTOP,
     * a debugger) does not move it, so it and the date of the kernel's
     * answer to the probe, not the manager's clock, say how long the cell
     * ran. */
    double k_busy;
    /* The question asked at the deadline (exec_probe): its id, and when the
     * kernel answered it (its idle status, or else its reply), by its clock */
    char probe_id[37];
    int probe_idle, probe_reply;
    double probe_date, probe_sent, probe_reply_seen;
    /* The manager's clock: when the request was sent, and how long the
     * manager was stalled since (gaps in exec_wait) */
    double t_sent, stalled;
} exec_state;

/* The header date of m by the kernel's clock, or 0. */
static double msg_date(const jmsg *m)
{
    double t = 0;
    if (jp_iso8601_parse(json_string_value(json_object_get(m->header, "date")), &t))
        return 0;
    return t;
}

static void exec_on_display(exec_state *x, const json_t *c);

/* A "page" payload of the execute_reply (`obj?` on an IPython kernel: ours
 * and ipykernel send help that way, for a frontend's pager): shown like a
 * display, its text without the inspector's colours, since an agent has no
 * pager. */
static void exec_on_page(exec_state *x, const json_t *payload)
{
    size_t i;
    json_t *pl;
    json_array_foreach(payload, i, pl)
    {
        const char *src = json_string_value(json_object_get(pl, "source"));
        json_t *data = json_object_get(pl, "data");
        if (!src || strcmp(src, "page") || !json_is_object(data))
            continue;
        json_t *d = json_deep_copy(data);
        const char *txt = json_string_value(json_object_get(d, "text/plain"));
        if (txt) {
            char *plain = strdup(txt);
            if (plain) {
                codeexec_strip_ansi(plain);
                json_object_set_new(d, "text/plain", json_string(plain));
                free(plain);
            }
        }
        json_t *c = json_pack("{s:o s:{}}", "data", d, "metadata");
        if (c)
            exec_on_display(x, c);
        json_decref(c);
    }
}

/* The execute_reply: exit code, lost state, limits hit, execution count. */
static void exec_on_reply(exec_state *x, const jmsg *m)
{
    codeexec_outcome *out = x->out;
    json_t *c = m->content;
    json_decref(x->reply);
    x->reply = json_incref(c);
    exec_on_page(x, json_object_get(c, "payload"));
    json_t *md = m->metadata;
    json_t *ec = json_object_get(md, "exit_code");
    if (json_is_integer(ec))
        json_object_set(x->r, "exit_code", ec);
    /* a kernel that restarted its worker says the state is gone */
    json_t *sp = json_object_get(md, "state_preserved");
    json_t *kr = json_object_get(md, "kernelmgr");
    if (json_is_object(kr) && !sp)
        sp = json_object_get(kr, "state_preserved");
    if (json_is_false(sp) || json_is_true(json_object_get(md, "worker_restarted"))) {
        out->state_lost = 1;
        const char *why = json_string_value(json_object_get(md, "reason"));
        if (!why && json_is_object(kr))
            why = json_string_value(json_object_get(kr, "reason"));
        snprintf(out->reason, sizeof out->reason, "%s",
                 why ? why : "the kernel restarted its worker; state was lost");
    }
    /* a limit that killed a process of the cell (e.g. a child's OOM
     * kill): named in the result, not only in its stderr */
    json_t *lh = json_object_get(md, "limits_hit");
    if (json_is_array(lh) && json_array_size(lh) > 0)
        json_object_set(x->r, "limits_hit", lh);
    json_t *cnt = json_object_get(c, "execution_count");
    if (json_is_integer(cnt))
        x->exec_count = json_integer_value(cnt);
    /* when the kernel started the cell (ipykernel and ours say it), should
     * its busy status have been missed */
    double started = 0;
    if (!x->k_busy &&
        jp_iso8601_parse(json_string_value(json_object_get(md, "started")), &started) == 0)
        x->k_busy = started;
}

/* An IOPub status: idle ends the wait (with the reply); a restarting
 * kernel lost its state. */
static void exec_on_status(exec_state *x, const json_t *c, double date)
{
    const char *st = json_string_value(json_object_get(c, "execution_state"));
    if (st && !strcmp(st, "busy") && !x->k_busy)
        x->k_busy = date;
    if (st && !strcmp(st, "idle"))
        x->idle = 1;
    else if (st && (!strcmp(st, "restarting") || !strcmp(st, "starting"))) {
        x->out->state_lost = 1;
        if (!x->out->reason[0])
            snprintf(x->out->reason, sizeof x->out->reason,
                     "the kernel restarted its worker; state was lost");
    }
}

/* Stream text: into its cap, the notebook outputs and a listener's event. */
static void exec_on_stream(exec_state *x, const json_t *c)
{
    const codeexec_params *p = x->p;
    const char *name = json_string_value(json_object_get(c, "name"));
    const char *text = json_string_value(json_object_get(c, "text"));
    int si = name && !strcmp(name, "stderr") ? 1 : 0;
    if (text && (x->cap[si] || x->watched)) {
        if (x->cap[si])
            outcap_add(x->cap[si], text, json_string_length(json_object_get(c, "text")));
        nb_stream(x->out->nb_outputs, stream_names[si], text, p->output_cap, &x->nb_kept[si]);
        /* the kernel's string itself (no copy), and only for a listener */
        if (p->fn)
            emit(p, json_pack("{s:s s:i s:s s:O}", "event", "stream", "block", p->block, "name",
                              stream_names[si], "text", json_object_get(c, "text")));
    }
}

static void exec_on_execute_result(exec_state *x, const json_t *c)
{
    json_t *data = json_object_get(c, "data");
    if (json_is_object(data) && rich_accept(x->p, &x->acct, bundle_bytes(data))) {
        json_decref(x->result);
        x->result = json_deep_copy(data);
        save_images(x->p, data, x->images, &x->img_seq, &x->acct);
        if (json_array_size(x->out->nb_outputs) < CODEEXEC_MAX_NB_OUTPUTS)
            json_array_append_new(
                x->out->nb_outputs,
                nb_output("execute_result",
                          json_pack("{s:O s:{} s:O}", "data", data, "metadata", "execution_count",
                                    json_object_get(c, "execution_count") ?: json_null())));
    }
}

/* display_data and update_display_data: kept within display_max and the
 * count caps, else counted as omitted. */
static void exec_on_display(exec_state *x, const json_t *c)
{
    json_t *data = json_object_get(c, "data");
    json_t *md = json_object_get(c, "metadata");
    uint64_t db = json_is_object(data) ? bundle_bytes(data) : 0;
    if (json_is_object(md))
        db += bundle_bytes(md);
    if (json_is_object(data) && (json_array_size(x->displays) >= CODEEXEC_MAX_DISPLAYS ||
                                 json_array_size(x->out->nb_outputs) >= CODEEXEC_MAX_NB_OUTPUTS)) {
        x->acct.received += db;
        x->acct.omitted++;
    } else if (json_is_object(data) && rich_accept(x->p, &x->acct, db)) {
        json_array_append(x->displays, data);
        save_images(x->p, data, x->images, &x->img_seq, &x->acct);
        json_array_append_new(
            x->out->nb_outputs,
            nb_output("display_data",
                      json_pack("{s:O s:o}", "data", data, "metadata",
                                json_is_object(md) ? json_incref(md) : json_object())));
    }
}

/* An error output: capped like a stream (output_cap for the value and for
 * the traceback) and counted in display_max. */
static void exec_on_error(exec_state *x, const json_t *c)
{
    const codeexec_params *p = x->p;
    json_t *tb = json_array();
    size_t i, tb_bytes = 0, tb_cut = 0, cut = 0;
    json_t *line;
    json_array_foreach(json_object_get(c, "traceback"), i, line)
    {
        if (!json_is_string(line))
            continue;
        size_t ll = json_string_length(line);
        if (i >= 200 || tb_bytes >= p->output_cap) {
            tb_cut += ll;
            continue;
        }
        char *s = cut_text(json_string_value(line), ll, p->output_cap - tb_bytes, &cut);
        tb_cut += cut;
        if (s) {
            codeexec_strip_ansi(s);
            tb_bytes += strlen(s);
            json_array_append_new(tb, json_string(s));
            free(s);
        }
    }
    if (tb_cut) {
        char note[200];
        snprintf(note, sizeof note,
                 "[... kernelmgr: %zu bytes of the traceback omitted (output_cap) ...]", tb_cut);
        json_array_append_new(tb, json_string(note));
    }
    json_t *jen = json_object_get(c, "ename"), *jev = json_object_get(c, "evalue");
    size_t en_cut = 0, ev_cut = 0;
    char *en = json_is_string(jen)
                   ? cut_text(json_string_value(jen), json_string_length(jen), 256, &en_cut)
                   : NULL;
    char *ev = json_is_string(jev) ? cut_text(json_string_value(jev), json_string_length(jev),
                                              p->output_cap, &ev_cut)
                                   : NULL;
    uint64_t eb = tb_bytes + (en ? strlen(en) : 0) + (ev ? strlen(ev) : 0);
    if (rich_accept(p, &x->acct, eb)) {
        json_decref(x->error);
        x->error = result_error(en ? en : "Error", ev ? ev : "", tb);
        if (ev_cut)
            json_object_set_new(x->error, "value_omitted_bytes", json_integer((json_int_t)ev_cut));
        if (json_array_size(x->out->nb_outputs) < CODEEXEC_MAX_NB_OUTPUTS)
            json_array_append_new(
                x->out->nb_outputs,
                nb_output("error", json_pack("{s:s s:s s:O}", "ename", en ? en : "Error", "evalue",
                                             ev ? ev : "", "traceback",
                                             json_object_get(x->error, "traceback"))));
    } else {
        json_decref(tb);
        if (json_is_null(x->error))
            x->error = result_error(en ? en : "Error",
                                    "(error output omitted: display_max reached)", NULL);
    }
    free(en);
    free(ev);
}

/* The IOPub messages an execution reads, a row per message type (others
 * are not this collector's); date: the message's header date by the
 * kernel's clock, 0 when unknown. */
static void iopub_status(exec_state *x, const json_t *c, double date)
{
    exec_on_status(x, c, date);
}

static void iopub_execute_input(exec_state *x, const json_t *c, double date)
{
    json_t *cnt = json_object_get(c, "execution_count");
    if (json_is_integer(cnt))
        x->exec_count = json_integer_value(cnt);
}

static void iopub_stream(exec_state *x, const json_t *c, double date)
{
    exec_on_stream(x, c);
}

static void iopub_execute_result(exec_state *x, const json_t *c, double date)
{
    exec_on_execute_result(x, c);
}

static void iopub_display(exec_state *x, const json_t *c, double date)
{
    exec_on_display(x, c);
}

static void iopub_error(exec_state *x, const json_t *c, double date)
{
    exec_on_error(x, c);
}

static void iopub_clear_output(exec_state *x, const json_t *c, double date)
{
    /* progress bars redraw: keep only what follows */
    json_array_clear(x->displays);
}

static const struct {
    const char *type;
    void (*fn)(exec_state *x, const json_t *c, double date);
} iopub_handlers[] = {
    {"status", iopub_status},        {"execute_input", iopub_execute_input},
    {"stream", iopub_stream},        {"execute_result", iopub_execute_result},
    {"display_data", iopub_display}, {"update_display_data", iopub_display},
    {"error", iopub_error},          {"clear_output", iopub_clear_output},
};

/* One IOPub message of this execution. */
static void exec_on_iopub(exec_state *x, const char *type, const json_t *c, double date)
{
    for (size_t i = 0; i < sizeof iopub_handlers / sizeof *iopub_handlers; i++)
        if (!strcmp(type, iopub_handlers[i].type)) {
            iopub_handlers[i].fn(x, c, date);
            return;
        }
}

/* After its idle status, the execute_reply (sent before it) is waited for
 * this long at most: a kernel that never sends it is not waited on forever. */
#define CODEEXEC_REPLY_AFTER_IDLE_S 10.0
/* A gap between two turns of exec_wait longer than this is a stall of the
 * manager (SIGSTOP, swap, a debugger), not time the kernel had. */
#define CODEEXEC_STALL_S 2.0
/* A user's interrupt waits for the kernel to take the cell at most this
 * long (a kernel that never says it started is interrupted anyway). */
#define CODEEXEC_INTERRUPT_WAIT_S 2.0
/* What a read of "everything that has arrived" takes at most: about the
 * depth of the manager's IOPub queue (mkclient.c), and a second. */
#define CODEEXEC_DRAIN_MAX 1024
#define CODEEXEC_DRAIN_S 1.0

/* One message of the kernel: this execution's, or the answer to its probe;
 * anything else (an attached console's, an old request's) is dropped. */
static void exec_handle(exec_state *x, jp_channel ch, jmsg *m)
{
    const char *parent = json_string_value(json_object_get(m->parent_header, "msg_id"));
    const char *type = jmsg_type(m);
    if (parent && !strcmp(parent, x->msg_id)) {
        if (!x->started) {
            x->started = 1;
            x->t_started = cm_mono_s();
        }
        if (ch == JP_SHELL && !strcmp(type, "execute_reply"))
            exec_on_reply(x, m);
        else if (ch == JP_IOPUB)
            exec_on_iopub(x, type, m->content, msg_date(m));
    } else if (!(parent && x->probe_id[0] && !strcmp(parent, x->probe_id))) {
        /* someone else's (a frontend's on the same kernel) or an old
         * request: another client's cell is followed by p->other */
        if (x->p->other && x->p->other(x->p->other_ud, ch, m) && !x->started)
            x->other_first = 1;
    } else {
        const char *st = json_string_value(json_object_get(m->content, "execution_state"));
        if (ch == JP_IOPUB && !strcmp(type, "status") && st && !strcmp(st, "idle")) {
            x->probe_idle = 1;
            x->probe_date = msg_date(m);
        } else if (ch == JP_CONTROL && !strcmp(type, "kernel_info_reply") && !x->probe_reply) {
            x->probe_reply = 1;
            x->probe_reply_seen = cm_mono_s();
            if (!x->probe_idle)
                x->probe_date = msg_date(m);
        }
    }
}

/* Handles the messages that have already arrived, at most
 * CODEEXEC_DRAIN_MAX or for CODEEXEC_DRAIN_S: a kernel still writing output
 * keeps the queue full (and a listener's back-pressure can slow each
 * message), so "everything" would never end; what is left is read by the
 * wait as usual, and a deadline is settled by the probe's answer, which
 * comes after it. -1 on a socket error. */
static int exec_drain(exec_state *x, kclient *kc)
{
    double end = cm_mono_s() + CODEEXEC_DRAIN_S;
    for (int n = 0; n < CODEEXEC_DRAIN_MAX && cm_mono_s() < end; n++) {
        jp_channel ch;
        jmsg *m = NULL;
        int rc = kclient_recv(kc, 0, &ch, &m);
        if (rc <= 0)
            return rc;
        exec_handle(x, ch, m);
        jmsg_destroy(&m);
    }
    return 0;
}

/* The manager's clock says the deadline has passed; does the kernel's?
 * Asked after everything that has arrived was read: a kernel_info_request
 * on control, which the kernel answers while it runs code, with a busy and
 * an idle status on IOPub — after any status of the cell it published
 * before. Returns 1 when the cell has run its timeout by the kernel's clock
 * (or the kernel cannot tell: it does not answer within wait_s), 0 when it
 * has not (yet: *deadline is moved to what is left), -1 while the answer
 * is awaited. */
static int exec_probe(exec_state *x, kclient *kc, double now, double wait_s, double *deadline)
{
    if (!x->probe_id[0]) {
        x->probe_idle = x->probe_reply = 0;
        x->probe_date = 0;
        x->probe_sent = now;
        if (kclient_send(kc, JP_CONTROL, "kernel_info_request", NULL, NULL, x->probe_id))
            return 1;
        return -1;
    }
    /* the idle status orders the answer after the cell's statuses; a
     * kernel that publishes none for control requests has its reply (and
     * a moment for the IOPub already under way) */
    int answered = x->probe_idle || (x->probe_reply && now - x->probe_reply_seen >= 0.5);
    if (!answered)
        return now - x->probe_sent >= wait_s ? 1 : -1;
    x->probe_id[0] = 0;
    /* The kernel's clock, from busy to its answer; when it says nothing of
     * this cell (not taken up yet: the request is still on its way, or it
     * waits behind another client's cell) ours decides, without the time
     * the manager was seen to stall */
    double ran =
        x->k_busy && x->probe_date ? x->probe_date - x->k_busy : now - x->t_sent - x->stalled;
    double left = x->p->timeout - ran;
    if (left <= 0.001)
        return 1;
    *deadline = now + left;
    return 0;
}

/* Waits for the execute_reply and idle of the request x->msg_id, handling
 * its messages, the user's interrupt, the timeout (interrupt, then grace)
 * and a kernel that dies. The deadline counts from x->t_sent.
 *
 * Whatever has arrived is read before anything is judged, and the timeout
 * is judged by the kernel's clock (exec_probe): a manager that stalled past
 * the deadline (SIGSTOP, swap, a debugger) while the cell finished in time
 * reports the finished cell, not a timeout, and a kernel already idle for
 * this cell is never interrupted. */
static void exec_wait(exec_state *x, kclient *kc, kproc *kp)
{
    const codeexec_params *p = x->p;
    double deadline = x->t_sent + p->timeout, give_up = 0, last_alive_check = 0, idle_seen = 0;
    double probe_wait = p->grace > 2 ? p->grace : 2, last_now = x->t_sent;
    int user_interrupt_seen = 0;
    double interrupt_asked = 0;

    while (!(x->idle && x->reply)) {
        double now = cm_mono_s();
        /* a turn of this loop takes at most a receive (0.2 s) and a listener's
         * back-pressure (1 s): a longer gap is the manager stalled, time the
         * kernel's grace, the probe's wait and the reply's wait do not lose
         * (the deadline itself is the kernel's clock's: exec_probe) */
        if (last_now && now - last_now > CODEEXEC_STALL_S) {
            double gap = now - last_now;
            x->stalled += gap;
            give_up += give_up ? gap : 0;
            x->probe_sent += x->probe_id[0] ? gap : 0;
            idle_seen += idle_seen ? gap : 0;
        }
        last_now = now;
        if (x->idle && !idle_seen)
            idle_seen = now;
        if (x->idle && now - idle_seen >= CODEEXEC_REPLY_AFTER_IDLE_S) {
            x->no_reply = 1;
            break;
        }
        /* An interrupt asked for before the kernel took the cell would
         * reach a kernel with nothing to interrupt (the control channel can
         * overtake the shell one), and the cell would then run on until the
         * grace's kill: it is sent once the cell started, or after
         * CODEEXEC_INTERRUPT_WAIT_S when the kernel never says so. */
        if (p->interrupt_flag && atomic_load(p->interrupt_flag) && !interrupt_asked)
            interrupt_asked = now;
        if (interrupt_asked && !user_interrupt_seen &&
            (x->started || now - interrupt_asked >= CODEEXEC_INTERRUPT_WAIT_S)) {
            user_interrupt_seen = 1;
            if (exec_drain(x, kc) < 0)
                break;
            if (!x->idle) {
                x->interrupted = 1;
                give_up = now + p->grace + 2;
                interrupt_kernel(kc, kp);
            }
        }
        if (!x->timed_out && !x->idle && now >= deadline) {
            if (exec_drain(x, kc) < 0)
                break;
            int over = x->idle ? 0 : exec_probe(x, kc, now, probe_wait, &deadline);
            if (over == 1) {
                x->timed_out = 1;
                if (!x->interrupted) {
                    x->interrupted = 1;
                    /* our kernels escalate by themselves after their own
                     * grace; the extra seconds let them report it before
                     * we kill */
                    give_up = now + p->grace + 3;
                    interrupt_kernel(kc, kp);
                }
            }
        }
        if (x->interrupted && !x->idle && now >= give_up) {
            if (exec_drain(x, kc) < 0)
                break;
            if (!x->idle) {
                x->stuck = 1;
                break;
            }
        }
        if (now - last_alive_check > 0.25) {
            last_alive_check = now;
            /* once dead, take what is still queued, then give up */
            if (!klaunch_alive(kp))
                x->died = 1;
        }
        jp_channel ch;
        jmsg *m = NULL;
        int rc = kclient_recv(kc, x->died ? 200 : 100, &ch, &m);
        if (rc < 0)
            break;
        if (rc == 0) {
            if (x->died)
                break;
            continue;
        }
        exec_handle(x, ch, m);
        jmsg_destroy(&m);
    }
}

/* How the execution ended: the status, and (reason, for a kernel that must
 * be restarted or a timeout) why; sets out->need_restart and the error
 * where the kernel gave none. */
static result_status exec_status(exec_state *x, kproc *kp, int unsendable, int sent, char *reason,
                                 size_t rsize)
{
    codeexec_outcome *out = x->out;
    result_status status = RESULT_OK;
    if (unsendable) {
        status = RESULT_ERROR;
        x->error = result_error("InvalidCode", "the code is not valid UTF-8 text", NULL);
    } else if (!sent) {
        status = RESULT_KILLED;
        out->need_restart = 1;
        snprintf(reason, rsize, "could not send the request to the kernel");
    } else if (x->died || (!x->reply && !klaunch_alive(kp))) {
        char how[128];
        status = RESULT_KILLED;
        out->need_restart = 1;
        snprintf(reason, rsize, "kernel died during execution (%s)",
                 klaunch_describe_exit(kp, how, sizeof how));
    } else if (x->stuck) {
        status = RESULT_KILLED;
        out->need_restart = 1;
        snprintf(reason, rsize,
                 "%s; the kernel did not stop within %.0f s of the interrupt and was killed",
                 x->timed_out ? "timeout" : "interrupted", x->p->grace);
    } else if (x->timed_out) {
        status = out->state_lost ? RESULT_KILLED : RESULT_TIMEOUT;
        snprintf(reason, rsize, "timeout after %.1f s; %.400s", x->p->timeout,
                 out->state_lost ? out->reason : "interrupted, state preserved");
    } else if (x->no_reply) {
        char why[200];
        status = RESULT_ERROR;
        snprintf(why, sizeof why,
                 "the kernel went idle after this cell but sent no execute_reply within %.0f s; "
                 "its output so far is kept",
                 CODEEXEC_REPLY_AFTER_IDLE_S);
        x->error = result_error("NoReply", why, NULL);
    } else if (x->reply) {
        const char *st = json_string_value(json_object_get(x->reply, "status"));
        if (out->state_lost)
            status = RESULT_KILLED;
        else if (st && !strcmp(st, "ok"))
            status = RESULT_OK;
        else
            status = RESULT_ERROR;
        if (st && !strcmp(st, "error") && json_is_null(x->error)) {
            const char *en = json_string_value(json_object_get(x->reply, "ename"));
            const char *ev = json_string_value(json_object_get(x->reply, "evalue"));
            x->error = result_error(en ? en : "Error", ev ? ev : "", NULL);
        }
        if (st && !strcmp(st, "aborted") && json_is_null(x->error))
            x->error = result_error("Aborted", "execution aborted by the kernel", NULL);
    }
    return status;
}

/* Puts the status into the result: status, exit_code, the error a timeout
 * or a kill implies, the notebook's error output, the execution count. */
static void exec_set_status(exec_state *x, result_status status, const char *reason)
{
    codeexec_outcome *out = x->out;
    json_t *r = x->r;
    if (out->need_restart && !out->reason[0])
        snprintf(out->reason, sizeof out->reason, "%s", reason);
    result_set_status(r, status);
    if (status == RESULT_KILLED && json_is_null(x->error))
        x->error = result_error("KernelKilled", out->reason[0] ? out->reason : reason, NULL);
    if (status == RESULT_TIMEOUT && json_is_null(x->error))
        x->error = result_error("Timeout", reason, NULL);
    if (status == RESULT_TIMEOUT || status == RESULT_KILLED) {
        /* say it even when the kernel reported a KeyboardInterrupt */
        json_object_set_new(x->error, "timeout", json_boolean(x->timed_out));
    }
    if (status != RESULT_OK && json_is_object(x->error) && !nb_has_error(out->nb_outputs))
        /* the history (and an exported notebook) says how the cell ended */
        json_array_append_new(
            out->nb_outputs,
            nb_output("error",
                      json_pack("{s:O s:O s:O}", "ename", json_object_get(x->error, "name"),
                                "evalue", json_object_get(x->error, "value"), "traceback",
                                json_object_get(x->error, "traceback"))));
    if (x->exec_count >= 0)
        json_object_set_new(r, "execution_count", json_integer(x->exec_count));
}

/* Moves what was captured into the result: stdout/stderr (and what their
 * caps cut), the omitted displays and images, result, displays, error and
 * images. The caps are destroyed; the json_t members are given to r. */
static void exec_set_outputs(exec_state *x)
{
    json_t *r = x->r;
    json_t *trunc = json_object();
    for (int i = 0; i < 2; i++) {
        if (!x->cap[i])
            continue;
        size_t kept = 0;
        char *txt = outcap_text(x->cap[i], &kept);
        json_object_set_new(r, stream_names[i], json_string(txt ? txt : ""));
        free(txt);
        if (outcap_truncated(x->cap[i])) {
            const char *sp = outcap_spill(x->cap[i]);
            json_t *t = json_pack("{s:I s:I s:o}", "total_bytes",
                                  (json_int_t)outcap_total(x->cap[i]), "kept_bytes",
                                  (json_int_t)kept, "spill", sp ? json_string(sp) : json_null());
            if (sp)
                json_object_set_new(t, "spill_bytes",
                                    json_integer((json_int_t)outcap_spill_bytes(x->cap[i])));
            if (outcap_spill_note(x->cap[i]))
                json_object_set_new(t, "spill_truncated",
                                    json_string(outcap_spill_note(x->cap[i])));
            if (outcap_spill_error(x->cap[i]))
                json_object_set_new(t, "spill_error", json_string(outcap_spill_error(x->cap[i])));
            json_object_set_new(trunc, stream_names[i], t);
        }
        outcap_destroy(&x->cap[i]);
    }
    if (x->acct.omitted) {
        char sz[32];
        char why[160];
        snprintf(why, sizeof why, "display_max: %s of rich outputs per block",
                 outcap_fmt_size(x->p->display_max, sz, sizeof sz));
        json_object_set_new(trunc, "displays",
                            json_pack("{s:I s:I s:i s:s}", "total_bytes",
                                      (json_int_t)x->acct.received, "kept_bytes",
                                      (json_int_t)x->acct.kept, "omitted", (int)x->acct.omitted,
                                      "limit", why));
    }
    if (x->acct.images_omitted)
        json_object_set_new(trunc, "images",
                            json_pack("{s:i s:s}", "omitted", (int)x->acct.images_omitted, "reason",
                                      x->acct.image_note));
    json_object_set_new(r, "truncated", trunc);
    json_object_set_new(r, "result", x->result);
    json_object_set_new(r, "displays", x->displays);
    json_object_set_new(r, "error", x->error);
    if (json_array_size(x->images))
        json_object_set_new(r, "images", x->images);
    else
        json_decref(x->images);
}

/* The workspace's changes since before (destroyed) into r's "files". */
static void exec_set_files(json_t *r, const codeexec_params *p, fsdiff_snap **before)
{
    fsdiff_snap *after = fsdiff_take(p->workspace, p->scan_max, p->scan_bytes);
    size_t omitted = 0;
    json_t *files =
        *before && after ? fsdiff_compare(*before, after, p->files_max, &omitted) : json_array();
    json_object_set_new(r, "files", files ? files : json_array());
    if (omitted)
        json_object_set_new(r, "files_omitted", json_integer((json_int_t)omitted));
    /* what either walk did not see: the report is not the whole change */
    json_t *why = *before && after ? fsdiff_incomplete_json(after, *before) : fsdiff_untaken_json();
    if (why)
        json_object_set_new(json_object_get(r, "truncated"), "files", why);
    fsdiff_destroy(before);
    fsdiff_destroy(&after);
}

json_t *codeexec_run(kclient *kc, kproc *kp, const codeexec_params *p, const char *code,
                     codeexec_outcome *out)
{
    memset(out, 0, sizeof *out);
    out->nb_outputs = json_array();
    json_t *r = result_new(p->session, p->language);
    if (!r)
        return NULL;
    double t0 = cm_mono_s();
    fsdiff_snap *before = fsdiff_take(p->workspace, p->scan_max, p->scan_bytes);

    exec_state x;
    memset(&x, 0, sizeof x);
    x.p = p;
    x.out = out;
    x.r = r;
    for (int i = 0; i < 2; i++) {
        char *spill = NULL;
        x.cap[i] = asprintf(&spill, "%s/%s.%s", p->outdir, p->tag, stream_names[i]) < 0
                       ? NULL
                       : outcap_new(p->output_cap, spill);
        free(spill);
        if (x.cap[i])
            outcap_set_limits(x.cap[i], p->spill_max, p->outputs_left, "session_outputs_max");
    }
    mkdir(p->outdir, 0700);

    json_t *content =
        json_pack("{s:s s:b s:b s:{} s:b s:b}", "code", code, "silent", 0, "store_history", 1,
                  "user_expressions", "allow_stdin", 0, "stop_on_error", 1);
    /* km_exec checked the code (cblocks_check_code); NULL here means it is
     * not UTF-8 text after all: nothing is sent and the kernel is kept */
    int unsendable = content == NULL;
    int sent =
        !unsendable && kclient_send(kc, JP_SHELL, "execute_request", content, NULL, x.msg_id) == 0;

    x.result = json_null();
    x.error = json_null();
    x.displays = json_array();
    x.images = json_array();
    x.exec_count = -1;
    if (sent) {
        x.t_sent = cm_mono_s();
        exec_wait(&x, kc, kp);
    }
    if (x.other_first && x.started)
        out->queued_s = x.t_started - x.t_sent;

    char reason[512] = "";
    result_status status = exec_status(&x, kp, unsendable, sent, reason, sizeof reason);
    exec_set_status(&x, status, reason);
    exec_set_outputs(&x);
    exec_set_files(r, p, &before);
    if (out->state_lost || out->need_restart)
        result_set_kernel(r, 0, 0, out->reason[0] ? out->reason : reason);
    json_object_set_new(r, "duration_ms", json_real((cm_mono_s() - t0) * 1000.0));
    json_decref(x.reply);
    return r;
}

/* ------------------------------------------------------------ watched cells */

struct codeexec_watch {
    codeexec_params p; /* the caps; no outdir, no listener */
    codeexec_outcome out;
    exec_state x;
};

codeexec_watch *codeexec_watch_new(size_t output_cap, uint64_t display_max)
{
    codeexec_watch *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->p.output_cap = output_cap;
    w->p.display_max = display_max;
    w->out.nb_outputs = json_array();
    exec_state *x = &w->x;
    x->p = &w->p;
    x->out = &w->out;
    x->watched = 1;
    x->r = json_object();
    x->result = json_null();
    x->error = json_null();
    x->displays = json_array();
    x->images = json_array();
    x->exec_count = -1;
    if (!w->out.nb_outputs || !x->r || !x->displays || !x->images) {
        codeexec_watch_destroy(&w);
        return NULL;
    }
    return w;
}

void codeexec_watch_iopub(codeexec_watch *w, const char *type, const json_t *content)
{
    exec_on_iopub(&w->x, type, content, 0);
}

int codeexec_watch_idle(const codeexec_watch *w)
{
    return w->x.idle;
}

json_t *codeexec_watch_outputs(const codeexec_watch *w, int *errored, json_int_t *count)
{
    *errored = nb_has_error(w->out.nb_outputs);
    *count = w->x.exec_count;
    return json_deep_copy(w->out.nb_outputs);
}

void codeexec_watch_destroy(codeexec_watch **pw)
{
    if (!pw || !*pw)
        return;
    codeexec_watch *w = *pw;
    json_decref(w->out.nb_outputs);
    json_decref(w->x.r);
    json_decref(w->x.reply);
    json_decref(w->x.result);
    json_decref(w->x.error);
    json_decref(w->x.displays);
    json_decref(w->x.images);
    free(w);
    *pw = NULL;
}
