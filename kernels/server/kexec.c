/*
 * kexec.c — the request the worker is serving: its events become IOPub
 * messages and replies, its output becomes coalesced stream messages, and
 * its end (done, death, interrupt escalation) restores a working worker.
 */
#include "kernels/server/kserver.h"
#include "common/cm_utf8.h"

#include <errno.h>
#include <signal.h>
#include <unistd.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define KEXEC_DRAIN_LIMIT (8u << 20)          /* output read after a death, at most */
#define KEXEC_READY_TIMEOUT_NS 30000000000ull /* a worker must say "ready" within */
/* --cpu-time: the sandbox's CPU time is read no sooner than the budget left
 * could be used by every CPU at once, and at least this often: a cell is
 * stopped within KEXEC_CPU_CHECK_MIN_NS of CPU time per CPU it keeps busy
 * past its budget. */
#define KEXEC_CPU_CHECK_MIN_NS 50000000ull  /* 50 ms */
#define KEXEC_CPU_CHECK_MAX_NS 500000000ull /* 500 ms */

/* new references: v itself when it has the right type, else an empty one
 * (worker events are untrusted input). For the "o" pack format. */
static json_t *obj_or_empty(json_t *v)
{
    return json_is_object(v) ? json_incref(v) : json_object();
}

static json_t *array_or_empty(json_t *v)
{
    return json_is_array(v) ? json_incref(v) : json_array();
}

static const jmsg *output_parent(kserver *ks)
{
    return ks->cur ? ks->cur : ks->last_parent;
}

static void publish_stream(kserver *ks, kstream *s, int final)
{
    char *text = kstream_take(s, final, kworker_now_ns());
    if (!text)
        return;
    if (s == &ks->err)
        knetnote_scan(&ks->netnote, text, strlen(text));
    json_t *content = json_pack("{s:s, s:s}", "name", s->name, "text", text);
    free(text);
    kserver_publish(ks, "stream", content, output_parent(ks));
}

void kexec_flush_streams(kserver *ks, int final)
{
    /* The older buffer first, so arrival order is kept. */
    kstream *a = &ks->out, *b = &ks->err;
    if (b->len && (!a->len || b->first_ns < a->first_ns)) {
        a = &ks->err;
        b = &ks->out;
    }
    publish_stream(ks, a, final);
    publish_stream(ks, b, final);
    /* A final flush leaves nothing; a non-final one may keep a cut char. */
}

/* Reads a pipe until it is empty (or budget bytes were read), publishing full
 * buffers. Returns bytes read. */
static size_t read_pipe(kserver *ks, kworker_pipe p, size_t budget)
{
    kstream *s = p == KW_STDOUT ? &ks->out : &ks->err;
    kstream *other = p == KW_STDOUT ? &ks->err : &ks->out;
    size_t total = 0;
    while (ks->worker && kworker_fd(ks->worker, p) >= 0 && total < budget) {
        if (s->len >= KSTREAM_CHUNK)
            publish_stream(ks, s, 0);
        long r = kstream_read(s, kworker_fd(ks->worker, p), kworker_now_ns());
        if (r == 0 || r == -2) {
            kworker_close_fd(ks->worker, p);
            break;
        }
        if (r < 0)
            break;
        total += (size_t)r;
        /* What the other pipe delivered earlier goes out first. */
        if (other->len)
            publish_stream(ks, other, 0);
        if (s->len >= KSTREAM_CHUNK)
            publish_stream(ks, s, 0);
    }
    return total;
}

void kexec_read_output(kserver *ks, kworker_pipe p)
{
    /* A bounded amount per turn keeps the loop responsive under a flood. */
    if (!kiopub_congested(ks->iopub))
        read_pipe(ks, p, 1u << 20);
}

void kexec_drain_output(kserver *ks)
{
    read_pipe(ks, KW_STDOUT, 4u << 20);
    read_pipe(ks, KW_STDERR, 4u << 20);
}

int kexec_send_request(kserver *ks, const char *const *fields, size_t n)
{
    if (!ks->worker)
        return -1;
    if (kworker_send(ks->worker, fields, n) < 0) {
        kserver_log("cannot write a request to the worker (it is gone?)");
        kworker_close_fd(ks->worker, KW_REQUESTS);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- ending */

/* Forgets the current request; later output is attributed to it. */
static void end_request(kserver *ks)
{
    kexec_flush_streams(ks, 1);
    jmsg_destroy(&ks->last_parent);
    ks->last_parent = ks->cur;
    ks->cur = NULL;
    ks->cur_kind = KREQ_NONE;
    json_decref(ks->cur_error);
    ks->cur_error = NULL;
    ks->input_pending = 0;
    ks->interrupt_deadline_ns = 0;
    ks->interrupt_resend_ns = 0;
    ks->sigint_after_flush = 0;
    ks->cpu_check_ns = 0;
    ks->cpu_hit = 0;
    ks->cpu_hit_used_ns = 0;
}

static json_t *reply_metadata(kserver *ks, const char *status)
{
    json_t *md = json_pack("{s:s, s:b, s:s, s:s, s:I}", "started", ks->cur_started,
                           "dependencies_met", 1, "engine", ks->session_id, "status", status,
                           "worker_generation", (json_int_t)ks->worker_gen);
    if (ks->worker) {
        uint64_t cpu = sandbox_cpu_ns(kworker_sandbox(ks->worker));
        /* 0 is a measurement too (clock-tick precision: a worker that has
         * not yet run for a tick): the next cell starts from it rather than
         * walking /proc again. */
        ks->cpu_mark_ns = cpu;
        ks->cpu_mark_set = 1;
        if (cpu > 0 && cpu >= ks->cur_cpu_ns)
            json_object_set_new(md, "cpu_time_ms", json_real((double)(cpu - ks->cur_cpu_ns) / 1e6));
    }
    return md;
}

/* "256 MiB": exact multiples only move up a unit, so a limit is never rounded. */
static const char *size_text(uint64_t n, char *buf, size_t size)
{
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    unsigned u = 0;
    while (u + 1 < sizeof units / sizeof *units && n >= 1024 && n % 1024 == 0) {
        n /= 1024;
        u++;
    }
    snprintf(buf, size, "%llu %s", (unsigned long long)n, units[u]);
    return buf;
}

/* "CPU time limit of 2 s per block reached": the limits_hit entry of an
 * execution that used its --cpu-time budget. */
static const char *cpu_limit_text(const kserver *ks, char *buf, size_t size)
{
    snprintf(buf, size, "CPU time limit of %g s per block reached", ks->opts.cpu_time);
    return buf;
}

/* The network note of a cell that failed: its error's text is scanned as
 * its stderr was (knetnote.h). */
static int network_note_due(kserver *ks, int failed)
{
    if (!ks->netnote.active || !failed)
        return 0;
    json_t *e = ks->cur_error;
    const char *ev = json_string_value(json_object_get(e, "evalue"));
    if (ev)
        knetnote_scan(&ks->netnote, ev, strlen(ev));
    size_t i;
    json_t *line;
    json_array_foreach(json_object_get(e, "traceback"), i, line)
    {
        const char *t = json_string_value(line);
        if (t)
            knetnote_scan(&ks->netnote, t, strlen(t));
    }
    long long now = ks->worker ? sandbox_net_no_routes(kworker_sandbox(ks->worker)) : -1;
    if (ks->worker && ks->opts.egress.n)
        return knetnote_due_allow(&ks->netnote, failed, now,
                                  failed ? kworker_egress_refusals(ks->worker, NULL, 0) : -1);
    return knetnote_due(&ks->netnote, failed, now);
}

/* Limits the cell hit, in md's "limits_hit": a memory limit hit by any
 * process of the sandbox during the cell (a child of a Bash cell, not only
 * the worker: the memory cgroup's OOM-kill counter grew; also said on the
 * cell's stderr), its CPU-time budget (said when it was reached), and the
 * network policy when it is why the cell failed (only in the result). */
static void report_limits(kserver *ks, json_t *md, int failed)
{
    json_t *hits = json_array();
    char what[160];
    long long now =
        ks->worker && ks->cur_oom_kills >= 0 ? sandbox_oom_kills(kworker_sandbox(ks->worker)) : -1;
    if (now > ks->cur_oom_kills && ks->cur_oom_kills >= 0) {
        long long n = now - ks->cur_oom_kills;
        char lim[32], text[240];
        snprintf(what, sizeof what, "out of memory (limit %s): the kernel killed %lld process%s",
                 size_text(ks->opts.sandbox.memory_bytes, lim, sizeof lim), n, n == 1 ? "" : "es");
        json_array_append_new(hits, json_string(what));
        snprintf(text, sizeof text, "[%s] %s in this cell\n", ks->backend->name, what);
        kexec_flush_streams(ks, 1);
        kserver_publish(ks, "stream", json_pack("{s:s, s:s}", "name", "stderr", "text", text),
                        ks->cur);
        kserver_log("%s", what);
    }
    if (ks->cpu_hit)
        json_array_append_new(hits, json_string(cpu_limit_text(ks, what, sizeof what)));
    if (network_note_due(ks, failed)) {
        if (ks->worker && ks->opts.egress.n) {
            char list[600], last[600], note[1600];
            egpolicy_describe(&ks->opts.egress, list, sizeof list);
            long long n = kworker_egress_refusals(ks->worker, last, sizeof last);
            snprintf(note, sizeof note, "%s (allowed: %s)%s%s", KNETNOTE_ALLOW_TEXT, list,
                     n > ks->netnote.refused && last[0] ? "; the proxy refused: " : "",
                     n > ks->netnote.refused ? last : "");
            json_array_append_new(hits, json_string(note));
        } else {
            json_array_append_new(hits, json_string(KNETNOTE_TEXT));
        }
    }
    if (json_array_size(hits))
        json_object_set_new(md, "limits_hit", hits);
    else
        json_decref(hits);
}

/* Wall time until the next reading of the sandbox's CPU time, when left ns
 * of the budget remain: no sooner than every CPU the sandbox can use
 * (online CPUs, or fewer under --cpus) could use them up. */
static uint64_t cpu_check_delay(const kserver *ks, uint64_t left)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    double cpus = online > 0 ? (double)online : 1.0;
    if (ks->opts.sandbox.cpus > 0 && ks->opts.sandbox.cpus < cpus)
        cpus = ks->opts.sandbox.cpus;
    double d = (double)left / cpus;
    if (d < (double)KEXEC_CPU_CHECK_MIN_NS)
        return KEXEC_CPU_CHECK_MIN_NS;
    return d > (double)KEXEC_CPU_CHECK_MAX_NS ? KEXEC_CPU_CHECK_MAX_NS : (uint64_t)d;
}

/* --cpu-time: reads the sandbox's CPU time; once the execution used its
 * budget, says so on its stderr and interrupts it (killed after the grace,
 * like a timeout); otherwise schedules the next reading. */
static void check_cpu_budget(kserver *ks, uint64_t now)
{
    ks->cpu_check_ns = 0;
    if (!ks->worker || !ks->cur || ks->cur_kind != KREQ_EXECUTE || ks->cpu_hit ||
        !(ks->opts.cpu_time > 0))
        return;
    uint64_t cpu = sandbox_cpu_ns(kworker_sandbox(ks->worker));
    uint64_t used = cpu > ks->cpu_budget_base_ns ? cpu - ks->cpu_budget_base_ns : 0;
    uint64_t budget = (uint64_t)(ks->opts.cpu_time * 1e9);
    if (used < budget) {
        ks->cpu_check_ns = now + cpu_check_delay(ks, budget - used);
        return;
    }
    ks->cpu_hit = 1;
    ks->cpu_hit_used_ns = used;
    char what[160], text[300];
    cpu_limit_text(ks, what, sizeof what);
    snprintf(text, sizeof text, "[%s] %s (%.2f s used): the block is interrupted\n",
             ks->backend->name, what, (double)used / 1e9);
    kexec_flush_streams(ks, 0);
    kserver_publish(ks, "stream", json_pack("{s:s, s:s}", "name", "stderr", "text", text), ks->cur);
    kserver_log("%s (%.2f s used): interrupting the execution", what, (double)used / 1e9);
    kexec_interrupt(ks);
}

void kexec_cell_starts(kserver *ks)
{
    ks->cur_oom_kills = ks->worker ? sandbox_oom_kills(kworker_sandbox(ks->worker)) : -1;
    if (ks->worker && ks->opts.egress.n)
        knetnote_start_allow(&ks->netnote, sandbox_net_no_routes(kworker_sandbox(ks->worker)),
                             kworker_egress_refusals(ks->worker, NULL, 0));
    else
        knetnote_start(&ks->netnote,
                       ks->worker && ks->opts.sandbox.level == SANDBOX_STRICT &&
                           !ks->opts.sandbox.network,
                       ks->worker ? sandbox_net_no_routes(kworker_sandbox(ks->worker)) : -1);
    ks->cpu_hit = 0;
    ks->cpu_hit_used_ns = 0;
    ks->cpu_check_ns = 0;
    if (ks->worker && ks->opts.cpu_time > 0) {
        /* a reading of its own: the budget is this execution's alone (the
         * end-of-cell mark also counts what ran between cells) */
        ks->cpu_budget_base_ns = sandbox_cpu_ns(kworker_sandbox(ks->worker));
        ks->cpu_check_ns =
            kworker_now_ns() + cpu_check_delay(ks, (uint64_t)(ks->opts.cpu_time * 1e9));
    }
    if (!ks->lost_reason || ks->cur_silent)
        return;
    char *text = NULL;
    if (asprintf(&text,
                 "[%s] Kernel restarted before this cell: %s. Its state (variables, functions, "
                 "working directory, environment) was lost.\n",
                 ks->backend->name, ks->lost_reason) < 0)
        return;
    kserver_publish(ks, "stream", json_pack("{s:s, s:s}", "name", "stderr", "text", text), ks->cur);
    free(text);
}

/* Sends the execute_reply and the idle status; content and metadata stolen. */
static void finish_execute(kserver *ks, const char *status, int exit_code, json_t *user_expr,
                           json_t *payload, json_t *extra_md)
{
    kexec_flush_streams(ks, 1);
    /* Reached its CPU-time budget and stopped (the worker survived): an
     * error naming the limit, whatever the interrupted code reported; its
     * traceback (where the code was) is kept. */
    if (ks->cpu_hit && !extra_md) {
        char what[160], value[300];
        cpu_limit_text(ks, what, sizeof what);
        snprintf(value, sizeof value, "%s (%.2f s used); the block was interrupted", what,
                 (double)ks->cpu_hit_used_ns / 1e9);
        json_t *tb = json_object_get(ks->cur_error, "traceback");
        tb = json_is_array(tb) ? json_deep_copy(tb) : json_array();
        json_array_append_new(tb, json_sprintf("CPUTimeLimit: %s", value));
        json_decref(ks->cur_error);
        ks->cur_error =
            json_pack("{s:s, s:s, s:o}", "ename", "CPUTimeLimit", "evalue", value, "traceback", tb);
        kserver_publish(ks, "error", json_deep_copy(ks->cur_error), ks->cur);
        status = "error";
    }
    if (!strcmp(status, "error") && !ks->cur_error) {
        char ev[64];
        snprintf(ev, sizeof ev, "%d", exit_code);
        ks->cur_error = json_pack("{s:s, s:s, s:[s]}", "ename", "Error", "evalue", ev, "traceback",
                                  "the execution failed");
    }
    json_t *content =
        json_pack("{s:s, s:i, s:o, s:o}", "status", status, "execution_count", ks->cur_count,
                  "user_expressions", user_expr ? user_expr : json_object(), "payload",
                  payload ? payload : json_array());
    if (!strcmp(status, "error") && ks->cur_error)
        json_object_update(content, ks->cur_error);
    json_t *md = reply_metadata(ks, status);
    json_object_set_new(md, "exit_code", json_integer(exit_code));
    report_limits(ks, md, !strcmp(status, "error") || exit_code != 0);
    if (extra_md) {
        json_object_update(md, extra_md);
        json_decref(extra_md);
    }
    /* A worker lost earlier (idle, in a silent cell, in a completion): say
     * so until a cell the user sees has said it. A death in this very cell
     * has its own reason in extra_md and supersedes it. */
    if (ks->lost_reason && !json_object_get(md, "kernel_restarted")) {
        json_object_set_new(md, "kernel_restarted", json_true());
        json_object_set_new(md, "state_preserved", json_false());
        json_object_set_new(md, "reason", json_string(ks->lost_reason));
    }
    if (!ks->cur_silent) {
        free(ks->lost_reason);
        ks->lost_reason = NULL;
    }
    int stop = !strcmp(status, "error") && ks->cur_stop_on_error;
    /* Requests that arrived before this reply count as queued and are
     * aborted; a request sent in answer to the reply must not be. */
    if (stop)
        kshell_receive_all(ks, ks->shell, 1024);
    jmsg *req = ks->cur;
    kserver_reply(ks, ks->shell, "execute_reply", content, md, req);
    kserver_status(ks, "idle", req);
    end_request(ks);
    if (stop)
        kshell_abort_queued(ks, NULL);
}

/* Sends the reply of a complete/inspect/is_complete request and idle. */
static void finish_other(kserver *ks, const char *reply_type, json_t *content)
{
    kserver_reply(ks, ks->shell, reply_type, content, NULL, ks->cur);
    kserver_status(ks, "idle", ks->cur);
    end_request(ks);
}

/* The worker's snapshot_reply, passed on as the reply (its "type" and
 * "sync" dropped). A successful load brought the state back: the loss of
 * an earlier worker is no longer news, and the execution count goes on
 * from the snapshot's. No IOPub: a snapshot is not a cell. */
static void finish_snapshot(kserver *ks, json_t *content)
{
    kserver_reply(ks, ks->shell, "kernelmgr_snapshot_reply", content, NULL, ks->cur);
    end_request(ks);
}

static void on_snapshot_reply(kserver *ks, json_t *ev)
{
    json_t *c = json_deep_copy(ev);
    json_object_del(c, "type");
    json_object_del(c, "sync");
    const char *st = json_string_value(json_object_get(c, "status"));
    int ok = st && !strcmp(st, "ok");
    json_object_set_new(c, "status", json_string(ok ? "ok" : "error"));
    const char *action = json_string_value(json_object_get(ks->cur->content, "action"));
    if (ok && action && !strcmp(action, "load")) {
        json_t *cnt = json_object_get(c, "execution_count");
        if (json_is_integer(cnt) && json_integer_value(cnt) > ks->execution_count &&
            json_integer_value(cnt) < 1000000000)
            ks->execution_count = (int)json_integer_value(cnt);
        free(ks->lost_reason);
        ks->lost_reason = NULL;
    }
    json_object_set_new(c, "worker_generation", json_integer((json_int_t)ks->worker_gen));
    finish_snapshot(ks, c);
}

static const char *reply_type_of(kreq_kind kind)
{
    const kshell_msg *m = kshell_msg_of_kind(kind);
    return m ? m->reply : "execute_reply";
}

/* ---------------------------------------------------------------- events */

/* display_data "decode_base64": text types the worker sent base64-encoded
 * (a shell cannot cheaply escape a whole file into a JSON string). */
static void decode_base64_entries(json_t *data, json_t *which)
{
    size_t i;
    json_t *v;
    json_array_foreach(which, i, v)
    {
        const char *mime = json_string_value(v);
        const char *b64 = mime ? json_string_value(json_object_get(data, mime)) : NULL;
        if (!b64)
            continue;
        size_t len = strlen(b64), out_len = 0;
        unsigned char *bin = malloc(len / 4 * 3 + 4);
        if (!bin)
            continue;
        if (sodium_base642bin(bin, len / 4 * 3 + 4, b64, len, " \n\r", &out_len, NULL,
                              sodium_base64_VARIANT_ORIGINAL) == 0) {
            char *text = cm_utf8_sanitize(bin, out_len, NULL);
            if (text)
                json_object_set_new(data, mime, json_string(text));
            free(text);
        }
        free(bin);
    }
}

static void on_display(kserver *ks, json_t *ev)
{
    json_t *data = json_object_get(ev, "data");
    if (!json_is_object(data))
        return;
    data = json_deep_copy(data);
    json_t *which = json_object_get(ev, "decode_base64");
    if (json_is_array(which))
        decode_base64_entries(data, which);
    json_t *content = json_pack("{s:o, s:o, s:o}", "data", data, "metadata",
                                obj_or_empty(json_object_get(ev, "metadata")), "transient",
                                obj_or_empty(json_object_get(ev, "transient")));
    kexec_flush_streams(ks, 0);
    kserver_publish(
        ks, json_is_true(json_object_get(ev, "update")) ? "update_display_data" : "display_data",
        content, output_parent(ks));
}

static void on_error(kserver *ks, json_t *ev)
{
    const char *ename = json_string_value(json_object_get(ev, "ename"));
    const char *evalue = json_string_value(json_object_get(ev, "evalue"));
    json_t *tb = json_object_get(ev, "traceback");
    json_t *err = json_pack("{s:s, s:s, s:o}", "ename", ename ? ename : "Error", "evalue",
                            evalue ? evalue : "", "traceback", array_or_empty(tb));
    if (!err)
        return;
    kexec_flush_streams(ks, 0);
    /* The error of a cell stopped at its CPU-time budget (KeyboardInterrupt)
     * is replaced by one naming the limit when it ends (finish_execute). */
    if (!(ks->cpu_hit && ks->cur && ks->cur_kind == KREQ_EXECUTE))
        kserver_publish(ks, "error", json_deep_copy(err), output_parent(ks));
    if (ks->cur && ks->cur_kind == KREQ_EXECUTE) {
        json_decref(ks->cur_error);
        ks->cur_error = err;
    } else {
        json_decref(err);
    }
}

void kexec_stdin_clear(kserver *ks)
{
    if (ks->stdin_wait)
        jp_frames_free(&ks->stdin_wait, ks->stdin_wait_n);
    ks->stdin_wait = NULL;
    ks->stdin_wait_n = 0;
}

void kexec_stdin_retry(kserver *ks, uint64_t now)
{
    if (!ks->stdin_wait)
        return;
    if (!ks->input_pending) { /* the request ended (interrupt, death) */
        kexec_stdin_clear(ks);
        return;
    }
    jp_frame *f = ks->stdin_wait;
    size_t n = ks->stdin_wait_n;
    int sent = 1;
    for (size_t i = 0; i < n && sent; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);
        while (zmq_send(ks->stdin_sock, f[i].data, f[i].size, flags) < 0) {
            if (errno == EINTR)
                continue;
            if (i > 0)
                kserver_log("input_request: sending failed mid-message: %s", zmq_strerror(errno));
            sent = 0;
            break;
        }
    }
    if (sent) {
        kexec_stdin_clear(ks);
    } else if (now >= ks->stdin_wait_until) {
        kserver_log("input_request not delivered: the client's stdin channel did not connect "
                    "within %llu s; the input is cancelled",
                    (unsigned long long)(KSERVER_STDIN_WAIT_NS / 1000000000ull));
        kexec_stdin_clear(ks);
        const char *c[] = {"input_cancel"};
        kexec_send_request(ks, c, 1);
        ks->input_pending = 0;
    }
}

static void on_input_request(kserver *ks, json_t *ev)
{
    kexec_flush_streams(ks, 0);
    if (!ks->cur || ks->cur_kind != KREQ_EXECUTE || !ks->cur_allow_stdin) {
        const char *f[] = {"input_cancel"};
        kexec_send_request(ks, f, 1);
        return;
    }
    const char *prompt = json_string_value(json_object_get(ev, "prompt"));
    int password = json_is_true(json_object_get(ev, "password"));
    ks->input_pending = 1; /* before the send: an undelivered request waits on it */
    kserver_reply(ks, ks->stdin_sock, "input_request",
                  json_pack("{s:s, s:b}", "prompt", prompt ? prompt : "", "password", password),
                  NULL, ks->cur);
}

static int expect(kserver *ks, kreq_kind kind, const char *type)
{
    if (ks->cur && ks->cur_kind == kind)
        return 1;
    kserver_log("ignoring worker event '%s' outside of its request", type);
    return 0;
}

/* The features a worker's ready event may list, a row each. */
static const struct {
    const char *name;
    unsigned flag;
} kfeat_names[] = {
    {"interrupt", KFEAT_INTERRUPT},
    {"execute_options", KFEAT_EXEC_OPTIONS},
    {"debugger", KFEAT_DEBUG},
    {"snapshot", KFEAT_SNAPSHOT},
};

static void ev_ready(kserver *ks, json_t *ev)
{
    ks->worker_ready = 1;
    ks->start_failures = 0;
    ks->worker_features = 0;
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(ev, "features"), i, f)
    {
        const char *name = json_string_value(f);
        for (size_t k = 0; name && k < sizeof kfeat_names / sizeof *kfeat_names; k++)
            if (!strcmp(name, kfeat_names[k].name)) {
                /* the debugger only when this worker was started with one */
                if (kfeat_names[k].flag != KFEAT_DEBUG || kworker_has_debug(ks->worker))
                    ks->worker_features |= kfeat_names[k].flag;
                break;
            }
    }
    ks->debugger_seen = (ks->worker_features & KFEAT_DEBUG) != 0;
    kdbg_worker_ready(ks);
}

static void ev_log(kserver *ks, json_t *ev)
{
    const char *m = json_string_value(json_object_get(ev, "message"));
    kserver_log("worker: %s", m ? m : "");
}

/* Structured text output (not from the pipes): keep the order. */
static void ev_stream(kserver *ks, json_t *ev)
{
    const char *name = json_string_value(json_object_get(ev, "name"));
    const char *text = json_string_value(json_object_get(ev, "text"));
    if (!text)
        return;
    kexec_flush_streams(ks, 0);
    int err = name && !strcmp(name, "stderr");
    if (err)
        knetnote_scan(&ks->netnote, text, json_string_length(json_object_get(ev, "text")));
    kserver_publish(ks, "stream",
                    json_pack("{s:s, s:s}", "name", err ? "stderr" : "stdout", "text", text),
                    output_parent(ks));
}

static void ev_execute_result(kserver *ks, json_t *ev)
{
    if (ks->cur_silent)
        return;
    json_t *data = json_object_get(ev, "data"), *md = json_object_get(ev, "metadata");
    kexec_flush_streams(ks, 0);
    kserver_publish(ks, "execute_result",
                    json_pack("{s:i, s:o, s:o}", "execution_count", ks->cur_count, "data",
                              obj_or_empty(data), "metadata", obj_or_empty(md)),
                    ks->cur);
}

static void ev_clear_output(kserver *ks, json_t *ev)
{
    kexec_flush_streams(ks, 0);
    kserver_publish(ks, "clear_output",
                    json_pack("{s:b}", "wait", json_is_true(json_object_get(ev, "wait"))),
                    output_parent(ks));
}

static void ev_done(kserver *ks, json_t *ev)
{
    const char *status = json_string_value(json_object_get(ev, "status"));
    json_t *code = json_object_get(ev, "exit_code");
    json_t *ue = json_object_get(ev, "user_expressions");
    json_t *pl = json_object_get(ev, "payload");
    finish_execute(ks, status && !strcmp(status, "error") ? "error" : "ok",
                   json_is_integer(code) ? (int)json_integer_value(code) : 0,
                   json_is_object(ue) ? json_incref(ue) : NULL,
                   json_is_array(pl) ? json_incref(pl) : NULL, NULL);
}

static void ev_complete_reply(kserver *ks, json_t *ev)
{
    json_t *m = json_object_get(ev, "matches"), *cs = json_object_get(ev, "cursor_start"),
           *ce = json_object_get(ev, "cursor_end"), *md = json_object_get(ev, "metadata");
    finish_other(
        ks, "complete_reply",
        json_pack("{s:s, s:o, s:I, s:I, s:o}", "status", "ok", "matches", array_or_empty(m),
                  "cursor_start", (json_int_t)(json_is_integer(cs) ? json_integer_value(cs) : 0),
                  "cursor_end", (json_int_t)(json_is_integer(ce) ? json_integer_value(ce) : 0),
                  "metadata", obj_or_empty(md)));
}

static void ev_inspect_reply(kserver *ks, json_t *ev)
{
    json_t *d = json_object_get(ev, "data"), *md = json_object_get(ev, "metadata");
    finish_other(ks, "inspect_reply",
                 json_pack("{s:s, s:b, s:o, s:o}", "status", "ok", "found",
                           json_is_true(json_object_get(ev, "found")), "data", obj_or_empty(d),
                           "metadata", obj_or_empty(md)));
}

static void ev_is_complete_reply(kserver *ks, json_t *ev)
{
    const char *st = json_string_value(json_object_get(ev, "status"));
    json_t *c = json_pack("{s:s}", "status", st ? st : "unknown");
    const char *indent = json_string_value(json_object_get(ev, "indent"));
    if (st && !strcmp(st, "incomplete"))
        json_object_set_new(c, "indent", json_string(indent ? indent : ""));
    finish_other(ks, "is_complete_reply", c);
}

/* The worker's events (WORKER_PROTOCOL.md), one row each: its type, the
 * request it belongs to (KREQ_NONE: any time; otherwise ignored, and
 * logged, outside of that request) and its handler. */
static const struct worker_event {
    const char *type;
    kreq_kind during;
    void (*fn)(kserver *ks, json_t *ev);
} worker_events[] = {
    {"ready", KREQ_NONE, ev_ready},
    {"log", KREQ_NONE, ev_log},
    {"stream", KREQ_NONE, ev_stream},
    {"execute_result", KREQ_EXECUTE, ev_execute_result},
    {"display_data", KREQ_NONE, on_display},
    {"clear_output", KREQ_NONE, ev_clear_output},
    {"error", KREQ_NONE, on_error},
    {"input_request", KREQ_NONE, on_input_request},
    {"done", KREQ_EXECUTE, ev_done},
    {"complete_reply", KREQ_COMPLETE, ev_complete_reply},
    {"inspect_reply", KREQ_INSPECT, ev_inspect_reply},
    {"is_complete_reply", KREQ_IS_COMPLETE, ev_is_complete_reply},
    {"snapshot_reply", KREQ_SNAPSHOT, on_snapshot_reply},
};

static void dispatch_event(kserver *ks, json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    for (size_t i = 0; i < sizeof worker_events / sizeof *worker_events; i++) {
        const struct worker_event *w = &worker_events[i];
        if (strcmp(type, w->type))
            continue;
        if (w->during == KREQ_NONE || expect(ks, w->during, type))
            w->fn(ks, ev);
        return;
    }
    kserver_log("ignoring unknown worker event '%s'", type);
}

void kexec_on_event(void *arg, json_t *ev)
{
    kserver *ks = arg;
    /* Everything the worker wrote to its pipes before this event was in
     * them before the event line was: read it now, after the event was
     * read (events come in batches, so a drain before the read of the
     * batch is not enough), and publish it first. */
    kexec_drain_output(ks);
    dispatch_event(ks, ev);
    /* The worker waits for this before it writes anything else, so its
     * later output cannot overtake the event (see WORKER_PROTOCOL.md). */
    if (json_is_true(json_object_get(ev, "sync"))) {
        const char *f[] = {"sync"};
        kexec_send_request(ks, f, 1);
    }
}

/* ---------------------------------------------------------------- lifecycle */

void kexec_start_worker(kserver *ks)
{
    char err[512];
    ks->restart_at_ns = 0;
    ks->kill_at_ns = 0;
    ks->worker_ready = 0;
    ks->worker_features = 0;
    ks->sigint_after_flush = 0;
    ks->cpu_mark_set = 0;
    ks->worker = kworker_start(&ks->spec, &ks->opts.sandbox, &ks->opts.egress, err, sizeof err);
    if (ks->worker) {
        ks->worker_gen++;
        ks->ready_by_ns = kworker_now_ns() + KEXEC_READY_TIMEOUT_NS;
        return;
    }
    ks->start_failures++;
    kserver_log("cannot start the worker: %s", err);
    if (ks->start_failures >= 3) {
        char why[640];
        snprintf(why, sizeof why, "the %s worker cannot be started: %s", ks->backend->name, err);
        kshell_abort_queued(ks, why);
    }
    unsigned shift = ks->start_failures < 6 ? (unsigned)ks->start_failures : 6;
    ks->restart_at_ns = kworker_now_ns() + (100000000ull << shift);
}

static void drain_after_death(kserver *ks)
{
    for (int k = 0; k < 1024 && ks->worker; k++) {
        if (kworker_read_events(ks->worker, kexec_on_event, ks) != 0)
            break;
    }
    /* Output written before those events was read by their handlers; what is
     * left is the tail. A background process may keep the pipes open and
     * busy: take a bounded amount. */
    read_pipe(ks, KW_STDOUT, KEXEC_DRAIN_LIMIT);
    read_pipe(ks, KW_STDERR, KEXEC_DRAIN_LIMIT);
    kexec_flush_streams(ks, 1);
}

void kexec_worker_gone(kserver *ks)
{
    if (!ks->worker)
        return;
    kexec_drain_output(ks);
    drain_after_death(ks);
    char how[300], what[600];
    kworker_describe_exit(ks->worker, how, sizeof how);
    int exit_code = kworker_exit_code(ks->worker);
    int was_ready = ks->worker_ready;
    if (ks->kill_reason)
        snprintf(what, sizeof what, "the %s worker %s", ks->backend->name, ks->kill_reason);
    else
        snprintf(what, sizeof what, "the %s worker %s", ks->backend->name, how);
    kserver_log("%s", what);
    kdbg_worker_gone(ks, what);
    /* State is lost unless this worker never got ready (it had none) or the
     * running execute's own reply says so below. */
    if (was_ready && !(ks->cur && ks->cur_kind == KREQ_EXECUTE && !ks->cur_silent)) {
        char *lost = NULL;
        int r;
        if (!ks->cur)
            r = ks->execution_count
                    ? asprintf(&lost, "%s while idle, after cell %d", what, ks->execution_count)
                    : asprintf(&lost, "%s while idle, before the first cell", what);
        else if (ks->cur_kind == KREQ_EXECUTE)
            r = asprintf(&lost, "%s during a silent execution", what);
        else
            r = asprintf(&lost, "%s during a %s", what, kshell_msg_of_kind(ks->cur_kind)->what);
        if (r >= 0) {
            free(ks->lost_reason);
            ks->lost_reason = lost;
        }
    }
    char msg[900];
    snprintf(msg, sizeof msg,
             "Kernel restarted: %s. Its state (variables, functions, working directory, "
             "environment) was lost.",
             what);
    if (ks->cur) {
        json_decref(ks->cur_error);
        ks->cur_error = json_pack("{s:s, s:s, s:[s]}", "ename", "KernelRestarted", "evalue", msg,
                                  "traceback", msg);
        if (ks->cur_kind == KREQ_SNAPSHOT) {
            finish_snapshot(ks, json_pack("{s:s, s:s, s:s, s:[]}", "status", "error", "ename",
                                          "KernelRestarted", "evalue", msg, "lost"));
        } else if (ks->cur_kind == KREQ_EXECUTE) {
            kserver_publish(ks, "error", json_deep_copy(ks->cur_error), ks->cur);
            json_t *md = json_pack("{s:b, s:b, s:s}", "kernel_restarted", 1, "state_preserved", 0,
                                   "reason", what);
            finish_execute(ks, "error", exit_code, NULL, NULL, md);
        } else {
            json_t *c = json_pack("{s:s, s:s, s:s, s:[s]}", "status", "error", "ename",
                                  "KernelRestarted", "evalue", msg, "traceback", msg);
            kserver_publish(ks, "error", json_deep_copy(ks->cur_error), ks->cur);
            finish_other(ks, reply_type_of(ks->cur_kind), c);
        }
    } else {
        char text[1000];
        snprintf(text, sizeof text, "[%s] %s\n", ks->backend->name, msg);
        kserver_publish(ks, "stream", json_pack("{s:s, s:s}", "name", "stderr", "text", text),
                        ks->last_parent);
    }
    kworker_destroy(&ks->worker);
    ks->worker_ready = 0;
    ks->kill_reason = NULL;
    ks->interrupt_deadline_ns = 0;
    ks->interrupt_resend_ns = 0;
    ks->kill_at_ns = 0;
    ks->input_pending = 0;
    if (!was_ready) {
        ks->start_failures++;
        if (ks->start_failures >= 3) {
            char why[700];
            snprintf(why, sizeof why, "the %s worker cannot start: %s", ks->backend->name, how);
            kshell_abort_queued(ks, why);
        }
        unsigned shift = ks->start_failures < 6 ? (unsigned)ks->start_failures : 6;
        ks->restart_at_ns = kworker_now_ns() + (50000000ull << shift);
        return;
    }
    kexec_start_worker(ks);
}

/* Sends one SIGINT for the current request. A worker that declared the
 * "interrupt" feature first gets an `interrupt` request with a new
 * generation number: a SIGINT only counts when such a request is waiting in
 * its pipe, so a signal that arrives late (the sandbox's init forwards it
 * asynchronously) or twice cannot interrupt the next cell or disturb the
 * reading of a request. The marker must be in the pipe before the signal
 * can arrive: when the pipe is full, the SIGINT waits until it was written. */
static void send_sigint(kserver *ks)
{
    if (ks->worker_features & KFEAT_INTERRUPT) {
        char gen[24];
        snprintf(gen, sizeof gen, "%llu", (unsigned long long)++ks->interrupt_gen);
        const char *f[] = {"interrupt", gen};
        if (kexec_send_request(ks, f, 2) < 0)
            return;
        if (kworker_wants_write(ks->worker)) {
            ks->sigint_after_flush = 1;
            return;
        }
    }
    kworker_signal(ks->worker, SIGINT);
}

void kexec_interrupt(kserver *ks)
{
    if (!ks->worker || !ks->cur) {
        kserver_log("interrupt: nothing is running");
        return;
    }
    send_sigint(ks);
    if (!ks->interrupt_deadline_ns) {
        uint64_t grace = (uint64_t)(ks->opts.interrupt_grace * 1e9);
        ks->interrupt_deadline_ns = kworker_now_ns() + grace;
        ks->interrupt_resend_ns = kworker_now_ns() + grace / 2;
    }
    if (ks->input_pending) {
        const char *f[] = {"input_cancel"};
        ks->input_pending = 0;
        kexec_send_request(ks, f, 1);
    }
}

void kexec_timers(kserver *ks, uint64_t now)
{
    if (kstream_due(&ks->out, now))
        publish_stream(ks, &ks->out, 0);
    if (kstream_due(&ks->err, now))
        publish_stream(ks, &ks->err, 0);
    /* A SIGINT that reaches a child between fork and exec is taken by the
     * shell's handler copy and lost: ask once more at half the grace. */
    if (ks->worker && ks->interrupt_resend_ns && now >= ks->interrupt_resend_ns) {
        ks->interrupt_resend_ns = 0;
        if (ks->cur)
            send_sigint(ks);
    }
    if (ks->worker && ks->sigint_after_flush && !kworker_wants_write(ks->worker)) {
        ks->sigint_after_flush = 0;
        kworker_signal(ks->worker, SIGINT);
    }
    if (ks->worker && ks->cpu_check_ns && now >= ks->cpu_check_ns)
        check_cpu_budget(ks, now);
    if (ks->worker && ks->interrupt_deadline_ns && now >= ks->interrupt_deadline_ns) {
        static char reason[256];
        if (ks->cpu_hit)
            snprintf(reason, sizeof reason,
                     "reached the CPU time limit of %g s per block and did not stop within %g s "
                     "after the interrupt; it was killed",
                     ks->opts.cpu_time, ks->opts.interrupt_grace);
        else
            snprintf(reason, sizeof reason,
                     "did not stop within %g s after an interrupt and was killed",
                     ks->opts.interrupt_grace);
        ks->kill_reason = reason;
        ks->interrupt_deadline_ns = 0;
        ks->interrupt_resend_ns = 0;
        kworker_signal(ks->worker, SIGKILL);
        ks->kill_at_ns = now + 2000000000ull;
    }
    if (ks->worker && !ks->worker_ready && !ks->kill_reason && now >= ks->ready_by_ns) {
        ks->kill_reason = "did not start within 30 s and was killed";
        kworker_signal(ks->worker, SIGKILL);
        ks->kill_at_ns = now + 2000000000ull;
    }
    if (ks->worker && ks->kill_at_ns && now >= ks->kill_at_ns) {
        /* The event pipe closed (or SIGKILL was sent) but the process has not
         * been reaped: make sure it ends, then let the reaper take over. */
        ks->kill_at_ns = 0;
        kworker_signal(ks->worker, SIGKILL);
        if (!kworker_reap(ks->worker))
            ks->kill_at_ns = now + 1000000000ull;
    }
    if (!ks->worker && ks->restart_at_ns && now >= ks->restart_at_ns)
        kexec_start_worker(ks);
}
