/*
 * mkpool.c — the manager's periodic work (km_tick, km.h): the warm pool of
 * pre-started kernels, culling of idle kernels, draining idle IOPub.
 */
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"
#include "kernelmgr/engine/snapshot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

json_t *km_pool_status(km_manager *m)
{
    json_t *entries = json_array();
    pthread_mutex_lock(&m->lock);
    for (session *s = m->pool; s; s = s->next) {
        json_t *e = json_object();
        for (int l = 0; l < m->cfg.langs.n; l++)
            json_object_set_new(e, kmcfg_lang_name(&m->cfg, l),
                                s->k[l].proc ? json_integer(s->k[l].proc->pid) : json_null());
        json_array_append_new(entries, e);
    }
    pthread_mutex_unlock(&m->lock);
    uint64_t used, budget;
    slots_memory(m, &used, &budget);
    return json_pack(
        "{s:i s:i s:i s:i s:I s:o s:o}", "size", (int)m->cfg.pool, "ready",
        (int)json_array_size(entries), "live_kernels", atomic_load(&m->live), "max_kernels",
        (int)m->cfg.max_kernels, "kernels_memory", (json_int_t)used, "memory_budget",
        budget == UINT64_MAX ? json_null() : json_integer((json_int_t)budget), "entries", entries);
}

/* ---------------------------------------------------------------- periodic */

/* Runs one silent cell in a pooled kernel, so that the first real cell
 * does not pay for what every first cell loads (the Python driver imports
 * ast, json and tokenize on first use). Silent: no execution count, no
 * history, nothing on IOPub but busy/idle. Best effort. */
static void pool_warm(kslot *k, const km_lang *lg)
{
    char msg_id[37] = "";
    if (!lg->warm_code[0])
        return;
    json_t *content =
        json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", lg->warm_code, "silent", 1,
                  "store_history", 0, "user_expressions", "allow_stdin", 0, "stop_on_error", 0);
    if (!k->client || !content ||
        kclient_send(k->client, JP_SHELL, "execute_request", content, NULL, msg_id) < 0)
        return;
    double deadline = kclient_now() + 5.0;
    int replied = 0, idle = 0;
    while (!(replied && idle) && kclient_now() < deadline) {
        jp_channel ch;
        jmsg *msg = NULL;
        if (kclient_recv(k->client, 100, &ch, &msg) != 1)
            continue;
        json_t *pid = json_object_get(msg->parent_header, "msg_id");
        if (json_is_string(pid) && !strcmp(json_string_value(pid), msg_id)) {
            if (ch == JP_SHELL && !strcmp(jmsg_type(msg), "execute_reply"))
                replied = 1;
            else if (ch == JP_IOPUB && !strcmp(jmsg_type(msg), "status")) {
                const char *st =
                    json_string_value(json_object_get(msg->content, "execution_state"));
                idle = st && !strcmp(st, "idle");
            }
        }
        jmsg_destroy(&msg);
    }
}

static void pool_fill(km_manager *m)
{
    unsigned per_entry = 0;
    for (int l = 0; l < m->cfg.langs.n; l++)
        per_entry += m->cfg.allow[l] ? 1u : 0u;
    for (;;) {
        pthread_mutex_lock(&m->lock);
        unsigned n = 0;
        for (session *s = m->pool; s; s = s->next)
            n++;
        pthread_mutex_unlock(&m->lock);
        if (n >= m->cfg.pool || !per_entry)
            return;
        /* the pool never pushes a session's kernel out: it only uses room
         * (under max_kernels and the memory budget) */
        if (!slots_room(m, per_entry))
            return;
        char u[37];
        jp_uuid4(u);
        session *s = session_alloc(".pool");
        if (!s)
            return;
        s->pool_entry = 1;
        s->network = m->cfg.network;
        snprintf(s->net_allow, sizeof s->net_allow, "%s", m->cfg.network_allow);
        snprintf(s->sandbox, sizeof s->sandbox, "%s", m->cfg.sandbox);
        if (snprintf(s->pool_dir, sizeof s->pool_dir, "%s/pool/%.8s", m->home, u) >=
                (int)sizeof s->pool_dir ||
            snprintf(s->dir, sizeof s->dir, "%s", s->pool_dir) >= (int)sizeof s->dir ||
            snprintf(s->workspace, sizeof s->workspace, "%s/workspace", s->pool_dir) >=
                (int)sizeof s->workspace) {
            fprintf(stderr, "kernelmgr: warm pool: %s/pool: path too long\n", m->home);
            session_free(s);
            return;
        }
        s->own_workspace = 1;
        km_err why = {0};
        char pool[PATH_MAX];
        snprintf(pool, sizeof pool, "%.4000s/pool", m->home);
        int ok = kmhome_mkdir(pool, 0700, &why) == 0 &&
                 kmhome_mkdir(s->pool_dir, 0700, &why) == 0 && session_make_workspace(s, &why) >= 0;
        if (!ok)
            fprintf(stderr, "kernelmgr: warm pool: %s\n", why.msg);
        pthread_mutex_lock(&s->lock);
        for (int l = 0; ok && l < m->cfg.langs.n; l++)
            if (m->cfg.allow[l]) {
                if (slot_start(m, s, l, &why)) {
                    fprintf(stderr, "kernelmgr: warm pool: %s\n", why.msg);
                    ok = 0;
                } else {
                    pool_warm(&s->k[l], &m->cfg.langs.v[l]);
                }
            }
        pthread_mutex_unlock(&s->lock);
        if (!ok) {
            for (int l = 0; l < m->cfg.langs.n; l++)
                slot_stop(m, &s->k[l]);
            session_rmtree(s->pool_dir);
            session_free(s);
            return;
        }
        pthread_mutex_lock(&m->lock);
        s->next = m->pool;
        m->pool = s;
        pthread_mutex_unlock(&m->lock);
    }
}

/* Stops kernels idle for longer than idle_timeout. The session stays (its
 * workspace too); its next execution starts a fresh kernel and the result
 * says the state was lost because of culling. */
static void cull_idle(km_manager *m)
{
    double now = kclient_now();
    session *victims[64];
    size_t n = 0;
    pthread_mutex_lock(&m->lock);
    for (session *s = m->list; s && n < sizeof victims / sizeof victims[0]; s = s->next) {
        if (s->gone || atomic_load(&s->busy))
            continue;
        int due = 0;
        for (int l = 0; l < m->cfg.langs.n; l++)
            if (s->k[l].proc && now - s->k[l].last_used > m->cfg.idle_timeout)
                due = 1;
        if (due) {
            s->refs++;
            victims[n++] = s;
        }
    }
    pthread_mutex_unlock(&m->lock);
    /* stopping takes a while: no manager lock held, and a session that just
     * became busy is skipped (trylock) rather than waited for */
    for (size_t i = 0; i < n; i++) {
        session *s = victims[i];
        if (pthread_mutex_trylock(&s->lock) == 0) {
            int changed = 0, snapped = 0;
            for (int l = 0; l < m->cfg.langs.n; l++) {
                kslot *k = &s->k[l];
                if (s->gone || !k->proc || now - k->last_used <= m->cfg.idle_timeout)
                    continue;
                /* another client's cell runs on it (a silent one too): in use */
                slot_follow(k, 5000);
                if (kforeign_busy(k->foreign, NULL, NULL)) {
                    k->last_used = now;
                    continue;
                }
                /* its state first (all due kernels of the session at once) */
                if (!snapped++) {
                    snap_before_stop(m, s, "idle cull");
                    for (int o = 0; o < m->cfg.langs.n; o++)
                        if (o != l && s->k[o].proc &&
                            now - s->k[o].last_used <= m->cfg.idle_timeout)
                            s->k[o].restore[0] = 0; /* stays running */
                }
                slot_stop(m, k);
                snprintf(k->pending, sizeof k->pending,
                         "culled: the %s kernel was stopped after %g s idle (idle_timeout=%g); "
                         "a fresh kernel was started and its state %s (workspace kept)",
                         kmcfg_lang_name(&m->cfg, l), now - k->last_used, m->cfg.idle_timeout,
                         k->restore[0] ? "was restored from a snapshot" : "was lost");
                fprintf(stderr, "kernelmgr: culled %s/%s after %g s idle\n", s->name,
                        kmcfg_lang_name(&m->cfg, l), now - k->last_used);
                changed = 1;
            }
            if (changed)
                session_save(m, s);
            pthread_mutex_unlock(&s->lock);
        }
        session_put(m, s);
    }
}

/* Drains the IOPub of kernels no execution is reading (a person's frontend
 * attached to the same kernel may flood it; the kernel cuts a subscriber
 * that takes nothing for its grace period, >= 2 s); the cells other
 * clients ran go to the history on the way (slot_follow). Idle sessions only, and
 * never waits for one (trylock): an execution reads its own IOPub. */
static void drain_idle_iopub(km_manager *m)
{
    session *idle[256];
    size_t n = 0;
    pthread_mutex_lock(&m->lock);
    for (session *s = m->list; s && n < sizeof idle / sizeof idle[0]; s = s->next) {
        if (s->gone || atomic_load(&s->busy))
            continue;
        s->refs++;
        idle[n++] = s;
    }
    pthread_mutex_unlock(&m->lock);
    for (size_t i = 0; i < n; i++) {
        session *s = idle[i];
        if (pthread_mutex_trylock(&s->lock) == 0) {
            for (int l = 0; l < m->cfg.langs.n; l++)
                if (!s->gone && s->k[l].client)
                    slot_follow(&s->k[l], 5000);
            pthread_mutex_unlock(&s->lock);
        }
        session_put(m, s);
    }
}

double km_tick_interval(const km_manager *m)
{
    /* at most 0.5 s: idle kernels' IOPub is drained on every tick */
    double t = 0.5;
    /* a short idle_timeout is culled within about half of it */
    if (m->cfg.idle_timeout > 0 && m->cfg.idle_timeout / 2 < t)
        t = m->cfg.idle_timeout / 2;
    return t < 0.1 ? 0.1 : t;
}

void km_tick(km_manager *m)
{
    drain_idle_iopub(m);
    if (m->cfg.idle_timeout > 0)
        cull_idle(m);
    if (m->cfg.pool)
        pool_fill(m);
}
