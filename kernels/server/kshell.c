/*
 * kshell.c — messages from clients. Requests the server can answer itself
 * (kernel_info, comm_info, history, shutdown, interrupt) are answered at once,
 * even while code runs; requests that need the worker (execute, complete,
 * inspect, is_complete) wait in a FIFO and go to the worker one at a time.
 * Which is which, on which channels, and what each reply is called is one
 * table, kshell_msgs[] (kserver.h), that every part here reads.
 */
#include "kernels/server/kserver.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static unsigned channel_bit(kserver *ks, void *sock)
{
    if (sock == ks->shell)
        return KCH_SHELL;
    if (sock == ks->control)
        return KCH_CONTROL;
    return KCH_STDIN;
}

static const char *channel_of(kserver *ks, void *sock)
{
    if (sock == ks->shell)
        return "shell";
    if (sock == ks->control)
        return "control";
    return "stdin";
}

/* Logs a rejected message, at most 20 per minute: whoever floods us with
 * forged messages must not also flood the log. */
static void log_rejected(const char *channel, const char *reason)
{
    static uint64_t window_start;
    static unsigned logged, suppressed;
    uint64_t now = kworker_now_ns();
    if (now - window_start > 60000000000ull) {
        if (suppressed)
            kserver_log("(%u more rejected messages were not logged)", suppressed);
        window_start = now;
        logged = suppressed = 0;
    }
    if (logged++ < 20)
        kserver_log("rejected a message on %s: %s", channel, reason);
    else
        suppressed++;
}

void kshell_receive_all(kserver *ks, void *sock, int max)
{
    for (int i = 0; i < max && !ks->quit; i++) {
        jmsg *m = NULL;
        jp_error err;
        jp_status st = jp_session_recv(ks->session, sock, ZMQ_DONTWAIT, &m, &err);
        if (st == JP_ERR_AGAIN)
            break;
        if (st != JP_OK) {
            log_rejected(channel_of(ks, sock), err.reason);
            continue;
        }
        kshell_handle(ks, sock, m);
    }
}

static void enqueue(kserver *ks, jmsg *msg, const kshell_msg *m)
{
    kqueued *q = calloc(1, sizeof *q);
    if (!q) {
        kserver_log("out of memory: dropping %s", jmsg_type(msg));
        jmsg_destroy(&msg);
        return;
    }
    q->msg = msg;
    q->m = m;
    if (ks->qtail)
        ks->qtail->next = q;
    else
        ks->qhead = q;
    ks->qtail = q;
}

static void answer_directly(kserver *ks, void *sock, jmsg *msg, const char *reply_type,
                            json_t *content)
{
    kserver_status(ks, "busy", msg);
    kserver_reply(ks, sock, reply_type, content, NULL, msg);
    kserver_status(ks, "idle", msg);
}

static void answer_kernel_info(kserver *ks, void *sock, jmsg *msg, const kshell_msg *m)
{
    answer_directly(ks, sock, msg, m->reply, kserver_kernel_info(ks));
}

static void answer_comm_info(kserver *ks, void *sock, jmsg *msg, const kshell_msg *m)
{
    answer_directly(ks, sock, msg, m->reply, json_pack("{s:s, s:{}}", "status", "ok", "comms"));
}

static void answer_history(kserver *ks, void *sock, jmsg *msg, const kshell_msg *m)
{
    json_t *hist = khistory_query(ks->history, msg->content);
    answer_directly(ks, sock, msg, m->reply,
                    json_pack("{s:s, s:o}", "status", "ok", "history", hist ? hist : json_array()));
}

static void answer_shutdown(kserver *ks, void *sock, jmsg *msg, const kshell_msg *m)
{
    int restart = json_is_true(json_object_get(msg->content, "restart"));
    json_t *content = json_pack("{s:s, s:b}", "status", "ok", "restart", restart);
    kserver_status(ks, "busy", msg);
    kserver_reply(ks, sock, m->reply, json_deep_copy(content), NULL, msg);
    /* Other clients learn about it on IOPub, as with ipykernel. With
     * restart true the kernel still exits: the manager starts a new one. */
    kserver_publish(ks, m->reply, content, msg);
    kserver_status(ks, "idle", msg);
    kserver_log("shutdown requested (restart=%s)", restart ? "true" : "false");
    ks->quit = 1;
}

static void answer_interrupt(kserver *ks, void *sock, jmsg *msg, const kshell_msg *m)
{
    kserver_status(ks, "busy", msg);
    kexec_interrupt(ks);
    kserver_reply(ks, sock, m->reply, json_pack("{s:s}", "status", "ok"), NULL, msg);
    kserver_status(ks, "idle", msg);
}

static void answer_input(kserver *ks, void *sock, jmsg *msg, const kshell_msg *m)
{
    if (!ks->input_pending || !ks->worker) {
        kserver_log("ignoring an input_reply nobody asked for");
        return;
    }
    const char *value = json_string_value(json_object_get(msg->content, "value"));
    const char *fields[2] = {"input_reply", value ? value : ""};
    ks->input_pending = 0;
    kexec_send_request(ks, fields, 2);
}

void kshell_handle(kserver *ks, void *sock, jmsg *msg)
{
    const char *type = jmsg_type(msg);
    const kshell_msg *m = kshell_msg_find(type, channel_bit(ks, sock));
    if (m && m->kind != KREQ_NONE) {
        enqueue(ks, msg, m);
        return; /* owned by the queue now */
    }
    if (m)
        m->answer(ks, sock, msg, m);
    else if (sock == ks->stdin_sock)
        kserver_log("ignoring %s on stdin", type);
    else if (!strncmp(type, "comm_", 5))
        /* No comm targets are registered: nothing to open or deliver to. */
        kserver_log("ignoring %s (no comms)", type);
    else
        kserver_log("ignoring unknown message type '%s' on %s", type, channel_of(ks, sock));
    jmsg_destroy(&msg);
}

static int get_bool(const json_t *content, const char *key, int dflt)
{
    json_t *v = json_object_get(content, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* Answers a request that cannot run with status "error" (or "aborted"). */
static void refuse(kserver *ks, jmsg *msg, const kshell_msg *m, const char *status,
                   const char *ename, const char *evalue)
{
    json_t *content = json_pack("{s:s}", "status", status);
    if (m->kind == KREQ_EXECUTE)
        json_object_set_new(content, "execution_count", json_integer(ks->execution_count));
    if (ename) {
        json_object_set_new(content, "ename", json_string(ename));
        json_object_set_new(content, "evalue", json_string(evalue));
        json_object_set_new(content, "traceback", json_pack("[s]", evalue));
    }
    json_t *md = json_pack("{s:s, s:s, s:b, s:I}", "status", status, "engine", ks->session_id,
                           "dependencies_met", 1, "worker_generation", (json_int_t)ks->worker_gen);
    kserver_status(ks, "busy", msg);
    kserver_reply(ks, ks->shell, m->reply, content, md, msg);
    kserver_status(ks, "idle", msg);
}

void kshell_abort_queued(kserver *ks, const char *why)
{
    kqueued **pp = &ks->qhead, *keep_tail = NULL;
    while (*pp) {
        kqueued *q = *pp;
        int is_exec = q->m->kind == KREQ_EXECUTE;
        if (why || is_exec) {
            if (why)
                refuse(ks, q->msg, q->m, "error", "KernelUnavailable", why);
            else
                refuse(ks, q->msg, q->m, "aborted", NULL, NULL);
            *pp = q->next;
            jmsg_destroy(&q->msg);
            free(q);
        } else {
            keep_tail = q;
            pp = &q->next;
        }
    }
    ks->qtail = keep_tail;
}

static void start_execute(kserver *ks, jmsg *msg, const kshell_msg *m)
{
    json_t *code = json_object_get(msg->content, "code");
    if (!json_is_string(code)) {
        refuse(ks, msg, m, "error", "InvalidRequest", "execute_request: 'code' must be a string");
        jmsg_destroy(&msg);
        return;
    }
    ks->cur = msg;
    ks->cur_kind = KREQ_EXECUTE;
    ks->cur_silent = get_bool(msg->content, "silent", 0);
    ks->cur_store = ks->cur_silent ? 0 : get_bool(msg->content, "store_history", 1);
    ks->cur_allow_stdin = get_bool(msg->content, "allow_stdin", 1);
    ks->cur_stop_on_error = get_bool(msg->content, "stop_on_error", 1);
    if (ks->cur_store)
        ks->execution_count++;
    ks->cur_count = ks->execution_count;
    jp_now_iso8601(ks->cur_started);
    /* Without cgroups the query walks /proc: once per cell boundary, not
     * twice (time between cells, e.g. of background jobs, counts for the
     * next cell). */
    ks->cur_cpu_ns =
        ks->cpu_mark_set ? ks->cpu_mark_ns : sandbox_cpu_ns(kworker_sandbox(ks->worker));
    kserver_status(ks, "busy", msg);
    if (!ks->cur_silent)
        kserver_publish(ks, "execute_input",
                        json_pack("{s:O, s:i}", "code", code, "execution_count", ks->cur_count),
                        msg);
    kexec_cell_starts(ks);
    if (ks->cur_store)
        khistory_add(ks->history, ks->cur_count, json_string_value(code));
    char silent[2] = {ks->cur_silent ? '1' : '0', 0}, store[2] = {ks->cur_store ? '1' : '0', 0},
         stdin_ok[2] = {ks->cur_allow_stdin ? '1' : '0', 0}, count[16];
    snprintf(count, sizeof count, "%d", ks->cur_count);
    /* Options go as `execute_ext` (execute plus a JSON field), only to a
     * worker that declared "execute_options" and only when there is
     * something to say: the common request stays the original `execute`. */
    char *options = NULL;
    json_t *ue = json_object_get(msg->content, "user_expressions");
    if ((ks->worker_features & KFEAT_EXEC_OPTIONS) && json_is_object(ue) &&
        json_object_size(ue) > 0) {
        json_t *o = json_pack("{s:O}", "user_expressions", ue);
        options = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
    }
    const char *fields[] = {options ? "execute_ext" : "execute",
                            json_string_value(code),
                            silent,
                            store,
                            stdin_ok,
                            count,
                            options};
    kexec_send_request(ks, fields, options ? 7 : 6);
    free(options);
}

/* Number of code points of a UTF-8 string (the protocol's cursor unit). */
static size_t codepoints(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

static void start_other(kserver *ks, jmsg *msg, const kshell_msg *m)
{
    kreq_kind kind = m->kind;
    const char *code = json_string_value(json_object_get(msg->content, "code"));
    if (!code) {
        refuse(ks, msg, m, "error", "InvalidRequest", "'code' must be a string");
        jmsg_destroy(&msg);
        return;
    }
    json_t *cp = json_object_get(msg->content, "cursor_pos");
    long long cursor = json_is_integer(cp) ? json_integer_value(cp) : -1;
    if (cursor < 0)
        cursor = (long long)codepoints(code);
    char cursor_s[24], detail[8];
    snprintf(cursor_s, sizeof cursor_s, "%lld", cursor);
    json_t *dl = json_object_get(msg->content, "detail_level");
    snprintf(detail, sizeof detail, "%d", json_is_integer(dl) && json_integer_value(dl) ? 1 : 0);
    ks->cur = msg;
    ks->cur_kind = kind;
    kserver_status(ks, "busy", msg);
    if (kind == KREQ_COMPLETE) {
        const char *f[] = {"complete", code, cursor_s};
        kexec_send_request(ks, f, 3);
    } else if (kind == KREQ_INSPECT) {
        const char *f[] = {"inspect", code, cursor_s, detail};
        kexec_send_request(ks, f, 4);
    } else {
        const char *f[] = {"is_complete", code};
        kexec_send_request(ks, f, 2);
    }
}

/* kernelmgr_snapshot_request {"action": "save"|"load", "path": DIR,
 * "max_bytes": N}: the worker saves its state into (or loads it from) the
 * directory DIR, which its sandbox sees at that path (WORKER_PROTOCOL.md,
 * "Snapshots"). Not a cell: no execution count, no history, no status or
 * output on IOPub; the reply is {"status": "ok"|"error", ...} with what the
 * worker said. A worker without the "snapshot" feature is refused. */
static void start_snapshot(kserver *ks, jmsg *msg, const kshell_msg *m)
{
    const char *action = json_string_value(json_object_get(msg->content, "action"));
    const char *path = json_string_value(json_object_get(msg->content, "path"));
    json_t *maxj = json_object_get(msg->content, "max_bytes");
    const char *bad = NULL;
    if (!action || (strcmp(action, "save") && strcmp(action, "load")))
        bad = "'action' must be \"save\" or \"load\"";
    else if (!path || path[0] != '/' || strlen(path) > 4000)
        bad = "'path' must be an absolute path";
    else if (!json_is_integer(maxj) || json_integer_value(maxj) < 0)
        bad = "'max_bytes' must be a non-negative integer";
    else if (!(ks->worker_features & KFEAT_SNAPSHOT))
        bad = "this kernel's worker cannot save or load its state (no \"snapshot\" feature)";
    if (bad) {
        kserver_reply(ks, ks->shell, m->reply,
                      json_pack("{s:s, s:s, s:s}", "status", "error", "ename", "SnapshotRefused",
                                "evalue", bad),
                      NULL, msg);
        jmsg_destroy(&msg);
        return;
    }
    char max[24];
    snprintf(max, sizeof max, "%lld", (long long)json_integer_value(maxj));
    ks->cur = msg;
    ks->cur_kind = KREQ_SNAPSHOT;
    const char *f[] = {"snapshot", action, path, max};
    kexec_send_request(ks, f, 4);
}

void kshell_start_next(kserver *ks)
{
    while (!ks->cur && ks->worker && ks->worker_ready && ks->qhead && !ks->quit) {
        kqueued *q = ks->qhead;
        ks->qhead = q->next;
        if (!ks->qhead)
            ks->qtail = NULL;
        jmsg *msg = q->msg;
        const kshell_msg *m = q->m;
        free(q);
        m->start(ks, msg, m);
    }
}

/* ---------------------------------------------------------------- the table */

#define KCH_CLIENT (KCH_SHELL | KCH_CONTROL)

const kshell_msg kshell_msgs[] = {
    {"kernel_info_request", "kernel_info_reply", KCH_CLIENT, KREQ_NONE, NULL, answer_kernel_info,
     NULL},
    {"comm_info_request", "comm_info_reply", KCH_CLIENT, KREQ_NONE, NULL, answer_comm_info, NULL},
    {"history_request", "history_reply", KCH_CLIENT, KREQ_NONE, NULL, answer_history, NULL},
    {"shutdown_request", "shutdown_reply", KCH_CLIENT, KREQ_NONE, NULL, answer_shutdown, NULL},
    {"interrupt_request", "interrupt_reply", KCH_CLIENT, KREQ_NONE, NULL, answer_interrupt, NULL},
    {"debug_request", "debug_reply", KCH_CONTROL, KREQ_NONE, NULL, kdbg_answer, NULL},
    {"input_reply", NULL, KCH_STDIN, KREQ_NONE, NULL, answer_input, NULL},
    {"execute_request", "execute_reply", KCH_SHELL, KREQ_EXECUTE, "execution", NULL, start_execute},
    {"complete_request", "complete_reply", KCH_SHELL, KREQ_COMPLETE, "completion request", NULL,
     start_other},
    {"inspect_request", "inspect_reply", KCH_SHELL, KREQ_INSPECT, "inspect request", NULL,
     start_other},
    {"is_complete_request", "is_complete_reply", KCH_SHELL, KREQ_IS_COMPLETE, "is_complete request",
     NULL, start_other},
    {"kernelmgr_snapshot_request", "kernelmgr_snapshot_reply", KCH_SHELL, KREQ_SNAPSHOT, "snapshot",
     NULL, start_snapshot},
    {NULL, NULL, 0, KREQ_NONE, NULL, NULL, NULL},
};

const kshell_msg *kshell_msg_find(const char *type, unsigned channel)
{
    for (const kshell_msg *m = kshell_msgs; type && m->type; m++)
        if ((m->channels & channel) && !strcmp(m->type, type))
            return m;
    return NULL;
}

const kshell_msg *kshell_msg_of_kind(kreq_kind kind)
{
    for (const kshell_msg *m = kshell_msgs; kind != KREQ_NONE && m->type; m++)
        if (m->kind == kind)
            return m;
    return NULL;
}
