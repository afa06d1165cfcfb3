/*
 * codeexec.c — run one block on a kernel and build its result.
 */
#include "kernelmgr/codeexec.h"
#include "common/cm_clock.h"
#include "common/cm_mime.h"
#include "kernelmgr/fsdiff.h"
#include "kernelmgr/outcap.h"
#include "kernelmgr/result.h"
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
    size_t n = len <= max ? len : jp_utf8_complete_prefix(s, max);
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

json_t *codeexec_run(kclient *kc, kproc *kp, const codeexec_params *p, const char *code,
                     codeexec_outcome *out)
{
    memset(out, 0, sizeof *out);
    out->nb_outputs = json_array();
    json_t *r = result_new(p->session, p->language);
    if (!r)
        return NULL;
    double t0 = cm_mono_s();
    fsdiff_snap *before = fsdiff_take(p->workspace, p->scan_max);

    static const char *names[2] = {"stdout", "stderr"};
    outcap *cap[2];
    for (int i = 0; i < 2; i++) {
        char *spill = NULL;
        cap[i] = asprintf(&spill, "%s/%s.%s", p->outdir, p->tag, names[i]) < 0
                     ? NULL
                     : outcap_new(p->output_cap, spill);
        free(spill);
        if (cap[i])
            outcap_set_limits(cap[i], p->spill_max, p->outputs_left, "session_outputs_max");
    }
    rich_acct acct;
    memset(&acct, 0, sizeof acct);
    mkdir(p->outdir, 0700);
    size_t nb_kept[2] = {0, 0};

    json_t *content =
        json_pack("{s:s s:b s:b s:{} s:b s:b}", "code", code, "silent", 0, "store_history", 1,
                  "user_expressions", "allow_stdin", 0, "stop_on_error", 1);
    char msg_id[37] = "";
    /* km_exec checked the code (cblocks_check_code); NULL here means it is
     * not UTF-8 text after all: nothing is sent and the kernel is kept */
    int unsendable = content == NULL;
    int sent =
        !unsendable && kclient_send(kc, JP_SHELL, "execute_request", content, NULL, msg_id) == 0;

    json_t *reply = NULL, *result = json_null(), *error = json_null();
    json_t *displays = json_array(), *images = json_array();
    int idle = 0, timed_out = 0, interrupted = 0, died = 0, stuck = 0, img_seq = 0;
    json_int_t exec_count = -1;
    double deadline = t0 + p->timeout, give_up = 0, last_alive_check = 0;
    int user_interrupt_seen = 0;

    while (sent && !(idle && reply)) {
        double now = cm_mono_s();
        if (p->interrupt_flag && *p->interrupt_flag && !user_interrupt_seen) {
            user_interrupt_seen = 1;
            interrupted = 1;
            give_up = now + p->grace + 2;
            interrupt_kernel(kc, kp);
        }
        if (!timed_out && now >= deadline) {
            timed_out = 1;
            if (!interrupted) {
                interrupted = 1;
                /* our kernels escalate by themselves after their own grace;
                 * the extra seconds let them report it before we kill */
                give_up = now + p->grace + 3;
                interrupt_kernel(kc, kp);
            }
        }
        if (interrupted && now >= give_up) {
            stuck = 1;
            break;
        }
        if (now - last_alive_check > 0.25) {
            last_alive_check = now;
            /* once dead, take what is still queued, then give up */
            if (!klaunch_alive(kp))
                died = 1;
        }
        jp_channel ch;
        jmsg *m = NULL;
        int rc = kclient_recv(kc, died ? 200 : 100, &ch, &m);
        if (rc < 0)
            break;
        if (rc == 0) {
            if (died)
                break;
            continue;
        }
        json_t *parent_id = json_object_get(m->parent_header, "msg_id");
        if (!json_is_string(parent_id) || strcmp(json_string_value(parent_id), msg_id)) {
            jmsg_destroy(&m);
            continue; /* someone else's (an attached console's) or an old request */
        }
        const char *type = jmsg_type(m);
        json_t *c = m->content;
        if (ch == JP_SHELL && !strcmp(type, "execute_reply")) {
            json_decref(reply);
            reply = json_incref(c);
            json_t *md = m->metadata;
            json_t *ec = json_object_get(md, "exit_code");
            if (json_is_integer(ec))
                json_object_set(r, "exit_code", ec);
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
                json_object_set(r, "limits_hit", lh);
            json_t *cnt = json_object_get(c, "execution_count");
            if (json_is_integer(cnt))
                exec_count = json_integer_value(cnt);
        } else if (ch == JP_IOPUB) {
            if (!strcmp(type, "status")) {
                const char *st = json_string_value(json_object_get(c, "execution_state"));
                if (st && !strcmp(st, "idle"))
                    idle = 1;
                else if (st && (!strcmp(st, "restarting") || !strcmp(st, "starting"))) {
                    out->state_lost = 1;
                    if (!out->reason[0])
                        snprintf(out->reason, sizeof out->reason,
                                 "the kernel restarted its worker; state was lost");
                }
            } else if (!strcmp(type, "execute_input")) {
                json_t *cnt = json_object_get(c, "execution_count");
                if (json_is_integer(cnt))
                    exec_count = json_integer_value(cnt);
            } else if (!strcmp(type, "stream")) {
                const char *name = json_string_value(json_object_get(c, "name"));
                const char *text = json_string_value(json_object_get(c, "text"));
                int si = name && !strcmp(name, "stderr") ? 1 : 0;
                if (text && cap[si]) {
                    outcap_add(cap[si], text, json_string_length(json_object_get(c, "text")));
                    nb_stream(out->nb_outputs, names[si], text, p->output_cap, &nb_kept[si]);
                    /* the kernel's string itself (no copy), and only for a listener */
                    if (p->fn)
                        emit(p, json_pack("{s:s s:i s:s s:O}", "event", "stream", "block", p->block,
                                          "name", names[si], "text", json_object_get(c, "text")));
                }
            } else if (!strcmp(type, "execute_result")) {
                json_t *data = json_object_get(c, "data");
                if (json_is_object(data) && rich_accept(p, &acct, bundle_bytes(data))) {
                    json_decref(result);
                    result = json_deep_copy(data);
                    save_images(p, data, images, &img_seq, &acct);
                    if (json_array_size(out->nb_outputs) < CODEEXEC_MAX_NB_OUTPUTS)
                        json_array_append_new(
                            out->nb_outputs,
                            nb_output(
                                "execute_result",
                                json_pack("{s:O s:{} s:O}", "data", data, "metadata",
                                          "execution_count",
                                          json_object_get(c, "execution_count") ?: json_null())));
                }
            } else if (!strcmp(type, "display_data") || !strcmp(type, "update_display_data")) {
                json_t *data = json_object_get(c, "data");
                json_t *md = json_object_get(c, "metadata");
                uint64_t db = json_is_object(data) ? bundle_bytes(data) : 0;
                if (json_is_object(md))
                    db += bundle_bytes(md);
                if (json_is_object(data) &&
                    (json_array_size(displays) >= CODEEXEC_MAX_DISPLAYS ||
                     json_array_size(out->nb_outputs) >= CODEEXEC_MAX_NB_OUTPUTS)) {
                    acct.received += db;
                    acct.omitted++;
                } else if (json_is_object(data) && rich_accept(p, &acct, db)) {
                    json_array_append(displays, data);
                    save_images(p, data, images, &img_seq, &acct);
                    json_array_append_new(
                        out->nb_outputs,
                        nb_output("display_data",
                                  json_pack("{s:O s:o}", "data", data, "metadata",
                                            json_is_object(md) ? json_incref(md) : json_object())));
                }
            } else if (!strcmp(type, "error")) {
                /* an error output is capped like a stream (output_cap for the
                 * value and for the traceback) and counted in display_max */
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
                             "[... kernelmgr: %zu bytes of the traceback omitted (output_cap) ...]",
                             tb_cut);
                    json_array_append_new(tb, json_string(note));
                }
                json_t *jen = json_object_get(c, "ename"), *jev = json_object_get(c, "evalue");
                size_t en_cut = 0, ev_cut = 0;
                char *en = json_is_string(jen) ? cut_text(json_string_value(jen),
                                                          json_string_length(jen), 256, &en_cut)
                                               : NULL;
                char *ev = json_is_string(jev)
                               ? cut_text(json_string_value(jev), json_string_length(jev),
                                          p->output_cap, &ev_cut)
                               : NULL;
                uint64_t eb = tb_bytes + (en ? strlen(en) : 0) + (ev ? strlen(ev) : 0);
                if (rich_accept(p, &acct, eb)) {
                    json_decref(error);
                    error = result_error(en ? en : "Error", ev ? ev : "", tb);
                    if (ev_cut)
                        json_object_set_new(error, "value_omitted_bytes",
                                            json_integer((json_int_t)ev_cut));
                    if (json_array_size(out->nb_outputs) < CODEEXEC_MAX_NB_OUTPUTS)
                        json_array_append_new(
                            out->nb_outputs,
                            nb_output("error",
                                      json_pack("{s:s s:s s:O}", "ename", en ? en : "Error",
                                                "evalue", ev ? ev : "", "traceback",
                                                json_object_get(error, "traceback"))));
                } else {
                    json_decref(tb);
                    if (json_is_null(error))
                        error = result_error(en ? en : "Error",
                                             "(error output omitted: display_max reached)", NULL);
                }
                free(en);
                free(ev);
            } else if (!strcmp(type, "clear_output")) {
                /* progress bars redraw: keep only what follows */
                json_array_clear(displays);
            }
        }
        jmsg_destroy(&m);
    }

    /* status */
    const char *status = "ok";
    char reason[512] = "";
    if (unsendable) {
        status = "error";
        error = result_error("InvalidCode", "the code is not valid UTF-8 text", NULL);
    } else if (!sent) {
        status = "killed";
        out->need_restart = 1;
        snprintf(reason, sizeof reason, "could not send the request to the kernel");
    } else if (died || (!reply && !klaunch_alive(kp))) {
        char how[128];
        status = "killed";
        out->need_restart = 1;
        snprintf(reason, sizeof reason, "kernel died during execution (%s)",
                 klaunch_describe_exit(kp, how, sizeof how));
    } else if (stuck) {
        status = "killed";
        out->need_restart = 1;
        snprintf(reason, sizeof reason,
                 "%s; the kernel did not stop within %.0f s of the interrupt and was killed",
                 timed_out ? "timeout" : "interrupted", p->grace);
    } else if (timed_out) {
        status = out->state_lost ? "killed" : "timeout";
        snprintf(reason, sizeof reason, "timeout after %.1f s; %.400s", p->timeout,
                 out->state_lost ? out->reason : "interrupted, state preserved");
    } else if (reply) {
        const char *st = json_string_value(json_object_get(reply, "status"));
        if (out->state_lost)
            status = "killed";
        else if (st && !strcmp(st, "ok"))
            status = "ok";
        else
            status = "error";
        if (st && !strcmp(st, "error") && json_is_null(error)) {
            const char *en = json_string_value(json_object_get(reply, "ename"));
            const char *ev = json_string_value(json_object_get(reply, "evalue"));
            error = result_error(en ? en : "Error", ev ? ev : "", NULL);
        }
        if (st && !strcmp(st, "aborted") && json_is_null(error))
            error = result_error("Aborted", "execution aborted by the kernel", NULL);
    }
    if (out->need_restart && !out->reason[0])
        snprintf(out->reason, sizeof out->reason, "%s", reason);
    json_object_set_new(r, "status", json_string(status));
    json_t *ecv = json_object_get(r, "exit_code");
    if (!strcmp(status, "timeout"))
        json_object_set_new(r, "exit_code", json_integer(124));
    else if (!strcmp(status, "killed"))
        json_object_set_new(r, "exit_code", json_integer(137));
    else if (!strcmp(status, "error") && json_integer_value(ecv) == 0)
        json_object_set_new(r, "exit_code", json_integer(1));
    if (!strcmp(status, "killed") && json_is_null(error))
        error = result_error("KernelKilled", out->reason[0] ? out->reason : reason, NULL);
    if (!strcmp(status, "timeout") && json_is_null(error))
        error = result_error("Timeout", reason, NULL);
    if (!strcmp(status, "timeout") || !strcmp(status, "killed")) {
        /* say it even when the kernel reported a KeyboardInterrupt */
        json_object_set_new(error, "timeout", json_boolean(timed_out));
    }
    if (strcmp(status, "ok") && json_is_object(error) && !nb_has_error(out->nb_outputs))
        /* the history (and an exported notebook) says how the cell ended */
        json_array_append_new(
            out->nb_outputs,
            nb_output("error", json_pack("{s:O s:O s:O}", "ename", json_object_get(error, "name"),
                                         "evalue", json_object_get(error, "value"), "traceback",
                                         json_object_get(error, "traceback"))));
    if (exec_count >= 0)
        json_object_set_new(r, "execution_count", json_integer(exec_count));

    json_t *trunc = json_object();
    for (int i = 0; i < 2; i++) {
        if (!cap[i])
            continue;
        size_t kept = 0;
        char *txt = outcap_text(cap[i], &kept);
        json_object_set_new(r, names[i], json_string(txt ? txt : ""));
        free(txt);
        if (outcap_truncated(cap[i])) {
            const char *sp = outcap_spill(cap[i]);
            json_t *t = json_pack("{s:I s:I s:o}", "total_bytes", (json_int_t)outcap_total(cap[i]),
                                  "kept_bytes", (json_int_t)kept, "spill",
                                  sp ? json_string(sp) : json_null());
            if (sp)
                json_object_set_new(t, "spill_bytes",
                                    json_integer((json_int_t)outcap_spill_bytes(cap[i])));
            if (outcap_spill_note(cap[i]))
                json_object_set_new(t, "spill_truncated", json_string(outcap_spill_note(cap[i])));
            if (outcap_spill_error(cap[i]))
                json_object_set_new(t, "spill_error", json_string(outcap_spill_error(cap[i])));
            json_object_set_new(trunc, names[i], t);
        }
        outcap_destroy(&cap[i]);
    }
    if (acct.omitted) {
        char sz[32];
        char why[160];
        snprintf(why, sizeof why, "display_max: %s of rich outputs per block",
                 outcap_fmt_size(p->display_max, sz, sizeof sz));
        json_object_set_new(trunc, "displays",
                            json_pack("{s:I s:I s:i s:s}", "total_bytes", (json_int_t)acct.received,
                                      "kept_bytes", (json_int_t)acct.kept, "omitted",
                                      (int)acct.omitted, "limit", why));
    }
    if (acct.images_omitted)
        json_object_set_new(
            trunc, "images",
            json_pack("{s:i s:s}", "omitted", (int)acct.images_omitted, "reason", acct.image_note));
    json_object_set_new(r, "truncated", trunc);
    json_object_set_new(r, "result", result);
    json_object_set_new(r, "displays", displays);
    json_object_set_new(r, "error", error);
    if (json_array_size(images))
        json_object_set_new(r, "images", images);
    else
        json_decref(images);

    fsdiff_snap *after = fsdiff_take(p->workspace, p->scan_max);
    size_t omitted = 0;
    json_t *files =
        before && after ? fsdiff_compare(before, after, p->files_max, &omitted) : json_array();
    json_object_set_new(r, "files", files ? files : json_array());
    if (omitted)
        json_object_set_new(r, "files_omitted", json_integer((json_int_t)omitted));
    fsdiff_destroy(&before);
    fsdiff_destroy(&after);
    if (out->state_lost || out->need_restart)
        result_set_kernel(r, 0, 0, out->reason[0] ? out->reason : reason);
    json_object_set_new(r, "duration_ms", json_real((cm_mono_s() - t0) * 1000.0));
    json_decref(reply);
    return r;
}
