/*
 * sessionexec.c — code_exec (km_exec): a session acquired (or created), its
 * lock taken in turn with the other executions and with other clients'
 * cells on its kernels (waits said live and in the result), each block run
 * on its language's kernel, a kernel that came back from a snapshot said so,
 * and the history and outputs written. The shared state and its locking
 * rules: session_int.h.
 */
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/codeexec.h"
#include "kernelmgr/engine/result.h"
#include "kernelmgr/engine/session_int.h"
#include "kernelmgr/engine/snapshot.h"
#include "common/cm_clock.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Takes s->lock for an execution. Executions in a session are serialised:
 * one that finds another running waits for it (a cell whose client went
 * away runs on to its end or its timeout, its result going to the history).
 * The wait is said, live (a "notice" event) and afterwards: returns new
 * {"seconds","message"[,"holder_pid"]} when it waited, else NULL. */
static _Thread_local int exec_client_pid;

void km_exec_set_client(int pid)
{
    exec_client_pid = pid;
}

static int feed_other(void *ud, jp_channel ch, const jmsg *m)
{
    return kforeign_feed(ud, ch, m);
}

static json_t *session_lock_exec(km_manager *m, session *s, km_event_fn fn, void *ud)
{
    json_t *waited = NULL;
    if (pthread_mutex_trylock(&s->lock) != 0) {
        double t0 = kclient_now();
        pthread_mutex_lock(&m->lock);
        int holding = s->holding, pid = s->holder_pid;
        double since = s->holder_since;
        pthread_mutex_unlock(&m->lock);
        char who[160];
        if (!holding)
            snprintf(who, sizeof who,
                     "another operation on session \"%s\" (close, restart or "
                     "a kernel start)",
                     s->name);
        else if (pid > 0 && pid != getpid())
            snprintf(who, sizeof who, "a cell started by another client (pid %d)", pid);
        else
            snprintf(who, sizeof who, "a cell started by another request");
        if (fn) {
            char msg[300];
            if (holding)
                snprintf(msg, sizeof msg, "waiting for %s to finish (running for %.1f s)", who,
                         t0 - since);
            else
                snprintf(msg, sizeof msg, "waiting for %s to finish", who);
            json_t *ev = json_pack("{s:s s:i s:s}", "event", "notice", "block", 0, "message", msg);
            fn(ud, ev);
            json_decref(ev);
        }
        pthread_mutex_lock(&s->lock);
        double w = kclient_now() - t0;
        char msg[300];
        snprintf(msg, sizeof msg, "waited %.1f s for %s to finish", w, who);
        waited = json_pack("{s:f s:s s:s}", "seconds", w, "message", msg, "for",
                           holding ? "exec" : "operation");
        if (holding && pid > 0 && pid != getpid())
            json_object_set_new(waited, "holder_pid", json_integer(pid));
    }
    pthread_mutex_lock(&m->lock);
    s->holding = 1;
    s->holder_pid = exec_client_pid > 0 ? exec_client_pid : (int)getpid();
    s->holder_since = kclient_now();
    pthread_mutex_unlock(&m->lock);
    return waited;
}

/* Adds a wait of secs for client (kforeign: "websocket", "jupyter") to
 * *waited (created when NULL): seconds summed, "for" the last one waited
 * for, the message saying each. */
static void waited_add(json_t **waited, double secs, const char *client, const char *lang)
{
    char msg[600];
    const char *prev = *waited ? json_string_value(json_object_get(*waited, "message")) : NULL;
    snprintf(msg, sizeof msg, "%.300s%swaited %.1f s for %s on the %s kernel to finish",
             prev ? prev : "", prev ? "; then " : "", secs, kforeign_describe(client), lang);
    double before = *waited ? json_real_value(json_object_get(*waited, "seconds")) : 0;
    if (!*waited)
        *waited = json_object();
    if (!*waited)
        return;
    json_object_set_new(*waited, "seconds", json_real(before + secs));
    json_object_set_new(*waited, "message", json_string(msg));
    json_object_set_new(*waited, "for", json_string(client));
    json_object_del(*waited, "holder_pid");
}

/* After another client's cell ended on slot k's kernel: up to
 * KM_FOREIGN_SETTLE_S for the kernel to start a request of that client
 * queued behind it (it does so at once; the time is for the message to
 * arrive). Caller holds the session lock. */
#define KM_FOREIGN_SETTLE_S 0.05
static void foreign_settle(kslot *k)
{
    double end = kclient_now() + KM_FOREIGN_SETTLE_S;
    while (!kforeign_busy(k->foreign, NULL, NULL)) {
        double left = end - kclient_now();
        jp_channel ch;
        jmsg *msg = NULL;
        if (left <= 0 || kclient_recv(k->client, (int)(left * 1000) + 1, &ch, &msg) != 1)
            return;
        kforeign_feed(k->foreign, ch, msg);
        jmsg_destroy(&msg);
    }
}

/* Before a block runs on slot l: another client's cell that the kernel is
 * running (kforeign) is waited for, so the block starts when the kernel is
 * free and the result says how long it waited, for whom. At most timeout
 * seconds: then -1 (the block is not sent; the other cell runs on); -2 when
 * the user interrupted the wait (the other client's cell is not
 * interrupted). 0 when the kernel is free, with *secs and *client set when
 * it waited. Caller holds s->lock. */
static int foreign_wait(km_manager *m, session *s, int l, int block, double timeout, km_event_fn fn,
                        void *ud, double *secs, const char **client)
{
    kslot *k = &s->k[l];
    *secs = 0;
    *client = NULL;
    slot_follow(k, 100000); /* what happened since the last tick */
    double since = 0;
    if (!kforeign_busy(k->foreign, &since, client))
        return 0;
    double t0 = kclient_now();
    if (fn) {
        char msg[300];
        snprintf(msg, sizeof msg, "waiting for %s on the %s kernel to finish (running for %.1f s)",
                 kforeign_describe(*client), kmcfg_lang_name(&m->cfg, l), t0 - since);
        json_t *ev = json_pack("{s:s s:i s:s}", "event", "notice", "block", block, "message", msg);
        fn(ud, ev);
        json_decref(ev);
    }
    int rc = 0;
    double last_alive = t0;
    while (kforeign_busy(k->foreign, NULL, client)) {
        double now = kclient_now();
        if (atomic_load(&s->interrupt_flag)) {
            rc = -2;
            break;
        }
        if (now - t0 >= timeout) {
            rc = -1;
            break;
        }
        if (now - last_alive > 0.25) {
            last_alive = now;
            if (!klaunch_alive(k->proc))
                break; /* the block finds the dead kernel and says so */
        }
        jp_channel ch;
        jmsg *msg = NULL;
        int got = kclient_recv(k->client, 100, &ch, &msg);
        if (got < 0)
            break;
        if (got == 1) {
            kforeign_feed(k->foreign, ch, msg);
            jmsg_destroy(&msg);
        }
        /* the other cell ended: a request queued behind it (a frontend
         * sends several) starts at once; it goes before this block, as in
         * the kernel's queue, rather than get in between unseen */
        if (!kforeign_busy(k->foreign, NULL, NULL))
            foreign_settle(k);
    }
    *secs = kclient_now() - t0;
    k->last_used = kclient_now();
    return rc;
}

/* A kernel whose state came back from a snapshot: "kernel" says so, with
 * what was lost ({"restarted", "state_preserved", "reason", "restored":
 * {"from", "tag", "at", "lost"}}); k->restored is consumed. */
static void report_restored(json_t *r, kslot *k, const char *reason)
{
    json_t *rs = k->restored;
    k->restored = NULL;
    if ((!reason || !*reason) && json_string_value(json_object_get(rs, "reason")))
        reason = json_string_value(json_object_get(rs, "reason"));
    if (!reason || !*reason)
        reason = "the kernel was started anew";
    const char *e = json_string_value(json_object_get(rs, "error"));
    json_t *lost = json_object_get(rs, "lost");
    int kept = !e && json_array_size(lost) == 0;
    char msg[1800];
    if (e)
        snprintf(msg, sizeof msg, "%s; restoring its snapshot failed: %s", reason, e);
    else if (json_array_size(lost))
        snprintf(msg, sizeof msg,
                 "%s; its state was restored from snapshot \"%s\" of %s, "
                 "except %zu name(s) that could not be saved or loaded (restored.lost)",
                 reason, json_string_value(json_object_get(rs, "tag")),
                 json_string_value(json_object_get(rs, "at")), json_array_size(lost));
    else
        snprintf(msg, sizeof msg, "%s; its state was restored from snapshot \"%s\" of %s", reason,
                 json_string_value(json_object_get(rs, "tag")),
                 json_string_value(json_object_get(rs, "at")));
    result_set_kernel(r, 1, kept, msg);
    json_t *kj = json_object_get(r, "kernel");
    json_t *out =
        json_pack("{s:s s:O* s:O* s:O*}", "from", "snapshot", "tag", json_object_get(rs, "tag"),
                  "at", json_object_get(rs, "at"), "lost", lost);
    if (e)
        json_object_set_new(out, "error", json_string(e));
    json_object_set_new(kj, "restored", out);
    json_decref(rs);
}

json_t *km_exec(km_manager *m, const char *name, const km_session_opts *sopts,
                const km_exec_opts *opts, const char *code, km_event_fn fn, void *ud, km_err *err)
{
    if (session_check_name(name, err))
        return NULL;
    int lang = -1;
    if (opts && opts->lang && strcmp(opts->lang, "auto")) {
        lang = kmcfg_lang_index(&m->cfg, opts->lang);
        if (lang < 0) {
            char known[400];
            km_err_set(err, KM_EUSAGE, "unknown language \"%s\" (%s or auto)", opts->lang,
                       km_langs_names(&m->cfg.langs, known, sizeof known));
            return NULL;
        }
    }
    /* one check for run, exec, the daemon and MCP, before the session is
     * touched or anything is sent to a kernel */
    km_err codebad = {0};
    if (cblocks_check_code(code, code ? strlen(code) : 0, m->cfg.code_max, &codebad)) {
        km_err_set(err, KM_EUSAGE, "%s", codebad.msg);
        return NULL;
    }
    cblock_list blocks;
    if (cblocks_split(code ? code : "", &m->cfg.langs, lang, &blocks)) {
        km_err_set(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    int existed = 1;
    session *s = session_acquire(m, name, sopts, &existed, err);
    if (!s) {
        cblocks_free(&blocks);
        return NULL;
    }
    json_t *warnings = existed ? session_ignored_options(m, s, sopts) : NULL;

    json_t *waited = session_lock_exec(m, s, fn, ud);
    atomic_store(&s->busy, 1);
    atomic_store(&s->interrupt_flag, 0);
    slots_prestart(m, s, &blocks);
    json_t *results = json_array();
    int failed = 0;
    size_t ran = 0;
    for (size_t i = 0; i < blocks.n; i++) {
        cblock *b = &blocks.v[i];
        const char *lname = kmcfg_lang_name(&m->cfg, b->lang);
        json_t *r = NULL;
        /* this block's wait: the session's lock (the first block), then
         * another client's cell on its kernel */
        json_t *bwaited = i == 0 && waited ? json_deep_copy(waited) : NULL;
        if (s->gone) {
            r = result_new(name, lname);
            result_set_failure(r, RESULT_ERROR, "SessionClosed",
                               s->gone_why[0] ? s->gone_why : "the session was closed");
        } else if (!m->cfg.allow[b->lang]) {
            r = result_new(name, lname);
            char msg[256];
            snprintf(msg, sizeof msg,
                     "language \"%s\" is not allowed by the configuration (\"languages\")", lname);
            result_set_failure(r, RESULT_ERROR, "LanguageNotAllowed", msg);
        } else {
            int restarted = 0;
            char reason[512] = "";
            km_err why = {0};
            if (slot_ensure(m, s, b->lang, &restarted, reason, sizeof reason, &why)) {
                r = result_new(name, lname);
                result_set_failure(r, RESULT_ERROR, "KernelStartError", why.msg);
            } else {
                kslot *k = &s->k[b->lang];
                char tag[64];
                s->seq++;
                snprintf(tag, sizeof tag, "%lld-%04u-%s", (long long)cm_wall_s(), s->seq, lname);
                uint64_t used = outputs_used(s->outdir);
                uint64_t outputs_left =
                    used < m->cfg.session_outputs_max ? m->cfg.session_outputs_max - used : 0;
                codeexec_params p = {
                    .session = name,
                    .language = lname,
                    .block = (int)i,
                    .timeout = opts && opts->timeout > 0 ? opts->timeout : m->cfg.timeout,
                    .grace = m->cfg.interrupt_grace,
                    .output_cap = m->cfg.output_cap,
                    .spill_max = m->cfg.spill_max,
                    .display_max = m->cfg.display_max,
                    .outputs_left = &outputs_left,
                    .outdir = s->outdir,
                    .tag = tag,
                    .workspace = s->workspace,
                    .files_max = m->cfg.files_max,
                    .scan_max = m->cfg.files_scan_max,
                    .scan_bytes = m->cfg.files_scan_bytes,
                    .interrupt_flag = &s->interrupt_flag,
                    .fn = fn,
                    .ud = ud,
                };
                double fsecs = 0;
                const char *fclient = NULL;
                int frc = foreign_wait(m, s, b->lang, (int)i, p.timeout, fn, ud, &fsecs, &fclient);
                if (fclient && fsecs > 0)
                    waited_add(&bwaited, fsecs, fclient, lname);
                if (frc) {
                    r = result_new(name, lname);
                    char msg[400];
                    snprintf(msg, sizeof msg,
                             "%s for %.1f s: the kernel was running %s (timeout=%g); this block "
                             "was not run, and that cell was left running",
                             frc == -2 ? "interrupted after waiting" : "timeout after waiting",
                             fsecs, kforeign_describe(fclient), p.timeout);
                    result_set_failure(r, frc == -2 ? RESULT_ERROR : RESULT_TIMEOUT,
                                       frc == -2 ? "Interrupted" : "Timeout", msg);
                    goto block_done;
                }
                p.other = feed_other;
                p.other_ud = k->foreign;
                /* the history knows the cell before the kernel does: a
                 * manager killed while it runs leaves it "started" */
                km_err herr = {0};
                int hstarted = session_history_start(s->dir, tag, lname, NULL, b->code,
                                                     m->cfg.history_max, &herr) == 0;
                codeexec_outcome out;
                snap_check_worker(m, s, b->lang);
                double t0 = kclient_now();
                r = codeexec_run(k->client, k->proc, &p, b->code, &out);
                k->last_used = kclient_now();
                if (out.need_restart) {
                    slot_stop(m, k);
                    km_err e2 = {0};
                    if (slot_start(m, s, b->lang, &e2) == 0) {
                        char msg[1100];
                        snprintf(msg, sizeof msg, "%s; a fresh kernel was started (workspace kept)",
                                 out.reason);
                        result_set_kernel(r, 1, 0, msg);
                    } else {
                        char msg[2200];
                        snprintf(msg, sizeof msg, "%s; restarting the kernel failed: %s",
                                 out.reason, e2.msg);
                        result_set_kernel(r, 0, 0, msg);
                    }
                } else if (out.state_lost) {
                    /* the worker died in this cell: the last automatic
                     * snapshot (periodic ones) brings the state back for
                     * the next */
                    if (m->cfg.snapshot_interval > 0 && snap_has(m, s, b->lang, SNAP_AUTO)) {
                        snprintf(k->restore, sizeof k->restore, "%s", SNAP_AUTO);
                        snap_after_start(m, s, b->lang);
                    }
                    result_set_kernel(r, 1, 0, out.reason);
                } else if (restarted) {
                    result_set_kernel(r, 1, 0, reason);
                }
                if (k->restored)
                    report_restored(r, k, out.state_lost ? out.reason : reason);
                if (!out.need_restart && !out.state_lost)
                    snap_cell_time(m, s, b->lang, k->last_used - t0);
                if (out.queued_s > 0)
                    /* a cell of another client got into the kernel's queue
                     * first (between the wait above and the send) */
                    waited_add(&bwaited, out.queued_s,
                               kforeign_last_client(k->foreign) ?: "jupyter", lname);
                km_err herr2 = {0};
                if (r && session_history_append(s->dir, hstarted ? tag : NULL, lname, NULL, b->code,
                                                r, out.nb_outputs, m->cfg.history_max, &herr2))
                    json_object_set_new(r, "history_error", json_string(herr2.msg));
                else if (r && !hstarted)
                    json_object_set_new(r, "history_error", json_string(herr.msg));
                json_decref(out.nb_outputs);
            }
        }
    block_done:
        if (!r)
            r = result_new(name, lname);
        if (i == 0 && warnings)
            json_object_set(r, "warnings", warnings);
        if (bwaited)
            json_object_set(r, "waited", bwaited);
        if (i == 0 && bwaited && bwaited != waited) {
            json_decref(waited);
            waited = json_incref(bwaited); /* the execution's: its first block's */
        }
        json_decref(bwaited);
        ran++;
        if (fn) {
            json_t *ev =
                json_pack("{s:s s:i s:O}", "event", "result", "block", (int)i, "result", r);
            fn(ud, ev);
            json_decref(ev);
        }
        int bad = result_failed(r);
        json_array_append_new(results, r);
        if (bad) {
            failed = 1;
            if (!(opts && opts->continue_on_error))
                break;
        }
        if (atomic_load(&s->interrupt_flag) && !(opts && opts->continue_on_error))
            break;
    }
    s->last_used = cm_wall_s();
    atomic_store(&s->busy, 0);
    pthread_mutex_lock(&m->lock);
    s->holding = 0;
    pthread_mutex_unlock(&m->lock);
    /* the workspace too: MCP names files by it (saves it a "sessions" round
     * trip); read before session_put, which may free s */
    json_t *wsj = json_string(s->workspace);
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    size_t skipped = blocks.n - ran;
    cblocks_free(&blocks);
    json_t *ret = json_pack("{s:o s:b s:I s:o*}", "results", results, "failed", failed, "skipped",
                            (json_int_t)skipped, "workspace", wsj);
    if (ret && warnings)
        json_object_set(ret, "warnings", warnings);
    if (ret && waited)
        json_object_set(ret, "waited", waited);
    json_decref(warnings);
    json_decref(waited);
    return ret;
}
