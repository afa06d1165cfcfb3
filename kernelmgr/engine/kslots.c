/*
 * kslots.c — a session's kernel slots (session_int.h): start (launch, wait
 * until ready), stop, admission under max_kernels and eviction.
 */
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"
#include "common/cm_clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- admission
 *
 * The cap on live kernels is a reservation: m->live counts kernels that run
 * and kernels being started, and a start takes its unit with a
 * compare-and-swap below max_kernels before it launches anything, so
 * concurrent starts can never exceed the cap. A start that finds the cap
 * reached evicts an idle kernel (evict_one); when none is idle it waits
 * (polling every KM_ADMIT_POLL_S) for a slot, up to admission_timeout
 * seconds, instead of failing; the daemon log says how long it waited. The
 * waiting starts are bounded by the daemon's worker threads. A warm-pool
 * start never waits. */

#define KM_ADMIT_POLL_S 0.05

static int evict_one(km_manager *m, session *self, int self_lang);

/* Wakes a start waiting for a slot: a kernel stopped, or a session stopped
 * running code (its kernels became evictable). One waiter per change (they
 * are alike; waking all would have every one of them scan for a victim):
 * the one that frees or takes a slot wakes the next through here, and a
 * wake-up that finds nothing to do is covered by the KM_ADMIT_POLL_S poll. */
void slot_changed(km_manager *m)
{
    pthread_mutex_lock(&m->slot_mu);
    m->slot_gen++;
    pthread_cond_signal(&m->slot_cv);
    pthread_mutex_unlock(&m->slot_mu);
}

static void cap_release(km_manager *m)
{
    atomic_fetch_sub(&m->live, 1);
    slot_changed(m);
}

/* Takes one unit of max_kernels for a start of slot l of s (caller holds
 * s->lock). 0, or -1 with a reason in err. */
static int cap_reserve(km_manager *m, session *s, int l, char *err, size_t errlen)
{
    double t0 = kclient_now();
    double deadline = t0 + (s->pool_entry ? 0 : m->cfg.admission_timeout);
    int evicted = 0;
    for (;;) {
        pthread_mutex_lock(&m->slot_mu);
        unsigned long gen = m->slot_gen;
        pthread_mutex_unlock(&m->slot_mu);
        int cur = atomic_load(&m->live);
        if ((unsigned)cur < m->cfg.max_kernels) {
            if (atomic_compare_exchange_weak(&m->live, &cur, cur + 1))
                break;
            continue;
        }
        if (!s->pool_entry && evict_one(m, s, l) == 0) {
            evicted++;
            continue;
        }
        if (kclient_now() >= deadline) {
            snprintf(err, errlen,
                     "too many live kernels (max_kernels=%u) and none idle to stop: every other "
                     "kernel belongs to a session that is running code (waited %.1f s, "
                     "admission_timeout=%g); retry later or raise max_kernels",
                     m->cfg.max_kernels, kclient_now() - t0, m->cfg.admission_timeout);
            return -1;
        }
        /* until a slot may have freed (slot_changed), at most one poll */
        struct timespec ts = cm_mono_deadline(KM_ADMIT_POLL_S);
        pthread_mutex_lock(&m->slot_mu);
        while (m->slot_gen == gen && pthread_cond_timedwait(&m->slot_cv, &m->slot_mu, &ts) == 0)
            ;
        pthread_mutex_unlock(&m->slot_mu);
    }
    double waited = kclient_now() - t0;
    if (waited >= 0.5)
        fprintf(stderr,
                "kernelmgr: %s/%s waited %.1f s for a kernel slot (max_kernels=%u, %d evicted)\n",
                s->name, kmcfg_lang_name(&m->cfg, l), waited, m->cfg.max_kernels, evicted);
    return 0;
}

static int proc_alive_cb(void *ud)
{
    return klaunch_alive((kproc *)ud);
}

void slot_stop(km_manager *m, kslot *k)
{
    /* what the kernel sent last (the idle of another client's cell) first */
    if (k->client && k->foreign)
        slot_follow(k, 10000);
    kforeign_destroy(&k->foreign, "the kernel was stopped while this cell ran");
    kclient_destroy(&k->client);
    if (k->proc) {
        /* the kernel's history file (beside its connection file, named by
         * this kernel's random id) is never read again: it goes with it */
        char *hist = NULL;
        if (asprintf(&hist, "%s.history.jsonl", k->proc->cf_path) >= 0) {
            unlink(hist);
            free(hist);
        }
        klaunch_stop(&k->proc, 2.0);
        atomic_fetch_sub(&m->live, 1);
        slot_changed(m);
    }
}

void slot_follow(kslot *k, unsigned long max)
{
    if (!k->client)
        return;
    unsigned long n = 0;
    jp_channel ch;
    jmsg *msg = NULL;
    while (n < max && kclient_recv(k->client, 0, &ch, &msg) == 1) {
        /* another client's cell is use of the kernel (culling, eviction) */
        if (kforeign_feed(k->foreign, ch, msg))
            k->last_used = kclient_now();
        jmsg_destroy(&msg);
        n++;
    }
    if (n == max) {
        /* a flood: the kernel must not take this subscriber for a stuck
         * one; the cell running now says what it lost */
        unsigned long lost = kclient_discard_iopub(k->client, 100000);
        kforeign_lost(k->foreign, lost);
    }
}

/* Stops every kernel of s at once: all get SIGTERM first, then each is
 * waited for, so a session's teardown costs one kernel shutdown, not one
 * per language. Caller holds s->lock. */
void slots_stop_all(km_manager *m, session *s)
{
    for (int l = 0; l < m->cfg.langs.n; l++)
        klaunch_stop_begin(s->k[l].proc);
    for (int l = 0; l < m->cfg.langs.n; l++)
        slot_stop(m, &s->k[l]);
}

/* Stops the kernels of one warm-pool entry (the pool refills later). Pool
 * kernels go first when the cap is reached: they hold no one's state. 0 when
 * one was stopped. Caller holds no lock of m. */
static int evict_pool_entry(km_manager *m)
{
    pthread_mutex_lock(&m->lock);
    session *p = m->pool;
    if (p)
        m->pool = p->next;
    pthread_mutex_unlock(&m->lock);
    if (!p)
        return -1;
    pthread_mutex_lock(&p->lock);
    slots_stop_all(m, p);
    session_rmtree(p->pool_dir);
    pthread_mutex_unlock(&p->lock);
    session_free(p);
    fprintf(stderr, "kernelmgr: max_kernels=%u reached: stopped a warm-pool entry\n",
            m->cfg.max_kernels);
    return 0;
}

/* Stops one kernel to stay under max_kernels: a warm-pool entry first, then
 * the session's own idle kernel of the other language, then the least
 * recently used kernel of an idle session. The victim's next result says
 * why its state was lost. Caller holds self->lock. 0 when one was stopped. */
static int evict_one(km_manager *m, session *self, int self_lang)
{
    if (evict_pool_entry(m) == 0)
        return 0;
    for (int l = 0; l < m->cfg.langs.n; l++) {
        if (l == self_lang || !self->k[l].proc)
            continue;
        slot_stop(m, &self->k[l]);
        snprintf(self->k[l].pending, sizeof self->k[l].pending,
                 "evicted: the %s kernel was stopped to stay under max_kernels=%u (the "
                 "%s kernel of this session needed the slot); state was lost (workspace kept)",
                 kmcfg_lang_name(&m->cfg, l), m->cfg.max_kernels,
                 kmcfg_lang_name(&m->cfg, self_lang));
        session_save(m, self);
        fprintf(stderr, "kernelmgr: max_kernels=%u reached: stopped %s/%s\n", m->cfg.max_kernels,
                self->name, kmcfg_lang_name(&m->cfg, l));
        return 0;
    }
    pthread_mutex_lock(&m->lock);
    session *best = NULL;
    int best_l = -1;
    double oldest = 0;
    for (session *s = m->list; s; s = s->next) {
        if (s == self || s->gone || atomic_load(&s->busy))
            continue;
        for (int l = 0; l < m->cfg.langs.n; l++)
            if (s->k[l].proc && (!best || s->k[l].last_used < oldest)) {
                best = s;
                best_l = l;
                oldest = s->k[l].last_used;
            }
    }
    int rc = -1;
    if (best && pthread_mutex_trylock(&best->lock) == 0) {
        best->refs++;
        pthread_mutex_unlock(&m->lock);
        /* a kernel running another client's cell (a person's, on a gateway
         * WebSocket) is not idle: it is not stopped under that cell */
        if (best->k[best_l].proc && !kforeign_busy(best->k[best_l].foreign, NULL, NULL)) {
            slot_stop(m, &best->k[best_l]);
            snprintf(best->k[best_l].pending, sizeof best->k[best_l].pending,
                     "evicted: the %s kernel was stopped to stay under max_kernels=%u (session "
                     "\"%s\" needed one; this session was the least recently used); state was "
                     "lost (workspace kept)",
                     kmcfg_lang_name(&m->cfg, best_l), m->cfg.max_kernels, self->name);
            session_save(m, best);
            fprintf(stderr, "kernelmgr: max_kernels=%u reached: stopped %s/%s for %s\n",
                    m->cfg.max_kernels, best->name, kmcfg_lang_name(&m->cfg, best_l), self->name);
            rc = 0;
        }
        pthread_mutex_unlock(&best->lock);
        session_put(m, best);
        return rc;
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

/* Takes a unit of max_kernels only when one is free now (no eviction, no
 * wait). 0 when taken. */
static int cap_try_reserve(km_manager *m)
{
    int cur = atomic_load(&m->live);
    while ((unsigned)cur < m->cfg.max_kernels)
        if (atomic_compare_exchange_weak(&m->live, &cur, cur + 1))
            return 0;
    return -1;
}

static void slot_log_path(const km_manager *m, const session *s, int l, char *log, size_t size)
{
    snprintf(log, size, "%.4000s/%s.log", s->dir, kmcfg_lang_name(&m->cfg, l));
}

/* First half of a kernel start: takes the slot's unit of max_kernels
 * (try_only: only a free one, else returns -2 with nothing done), launches
 * the kernel and connects a client; slot_finish waits for it. Caller holds
 * s->lock. 0, or -1 with err (nothing left behind). */
static int slot_launch(km_manager *m, session *s, int l, int try_only, char *err, size_t errlen)
{
    kslot *k = &s->k[l];
    /* the kernel's unit of max_kernels, released by slot_stop */
    if (try_only ? cap_try_reserve(m) : cap_reserve(m, s, l, err, errlen))
        return try_only ? -2 : -1;
    klaunch_cmd cmd;
    if (kernel_cmd(m, s, l, &cmd, err, errlen)) {
        cap_release(m);
        return -1;
    }
    char id[48], log[PATH_MAX], label[128];
    char u[37];
    jp_uuid4(u);
    const km_lang *lg = &m->cfg.langs.v[l];
    snprintf(id, sizeof id, "%.8s%.4s-%s", u, u + 9, lg->id);
    slot_log_path(m, s, l, log, sizeof log);
    /* every kernel of the slot appends to one log; each stops writing at
     * kernel_log_max, and a log near it (within one line, at most 1200
     * bytes) is rotated once (to .1) here, so a slot's logs stay under
     * about twice the cap */
    struct stat lst;
    if (lstat(log, &lst) == 0 && (uint64_t)lst.st_size + 1200 > m->cfg.kernel_log_max) {
        char *old = NULL;
        if (asprintf(&old, "%s.1", log) >= 0) {
            rename(log, old);
            free(old);
        }
    }
    snprintf(label, sizeof label, "%s/%s", s->name, kmcfg_lang_name(&m->cfg, l));
    char kname[KM_LANG_NAME_MAX + 16];
    snprintf(kname, sizeof kname, "kernelmgr-%s", lg->name);
    k->proc = klaunch_start(&cmd, m->run_dir, id, m->cfg.transport, log,
                            lg->kernelspec[0] ? lg->kernelspec : kname, err, errlen);
    klaunch_cmd_clear(&cmd);
    if (!k->proc) {
        cap_release(m);
        return -1;
    }
    k->client = kclient_new(&k->proc->conn, label, err, errlen);
    if (k->client)
        k->foreign = kforeign_new(kclient_session_id(k->client), s->dir, lg->name,
                                  m->cfg.history_max, m->cfg.output_cap, m->cfg.display_max);
    if (!k->client || !k->foreign) {
        if (k->client)
            snprintf(err, errlen, "out of memory");
        slot_stop(m, k);
        return -1;
    }
    return 0;
}

/* Second half: waits until the launched kernel of slot l answers. Caller
 * holds s->lock. 0, or -1 with err (the kernel stopped). */
static int slot_finish(km_manager *m, session *s, int l, char *err, size_t errlen)
{
    kslot *k = &s->k[l];
    char log[PATH_MAX];
    slot_log_path(m, s, l, log, sizeof log);
    json_t *info = NULL;
    if (k->client) {
        char why[256];
        info = kclient_wait_ready(k->client, m->cfg.start_timeout, proc_alive_cb, k->proc, why,
                                  sizeof why);
        if (!info) {
            char how[128] = "";
            if (!klaunch_alive(k->proc))
                klaunch_describe_exit(k->proc, how, sizeof how);
            snprintf(err, errlen, "%s kernel did not start: %s%s%s (log: %s)",
                     kmcfg_lang_name(&m->cfg, l), why, how[0] ? "; " : "", how, log);
        }
    }
    if (!info) {
        slot_stop(m, k);
        return -1;
    }
    json_decref(info);
    k->last_used = kclient_now();
    session_save(m, s);
    return 0;
}

/* Starts the kernel of slot l. Caller holds s->lock. */
int slot_start(km_manager *m, session *s, int l, char *err, size_t errlen)
{
    if (slot_launch(m, s, l, 0, err, errlen))
        return -1;
    return slot_finish(m, s, l, err, errlen);
}

/* When the blocks need kernels of several languages that are not running,
 * starts them at the same time (launch all, then wait for each) instead of
 * one when its first block comes: a run of python and bash blocks pays one
 * kernel start, not two. Only with units of max_kernels free now (never an
 * eviction for a kernel that may not be needed yet); the rest start as
 * before, in slot_ensure. A failed start is kept in start_err for the
 * block that needs the kernel (one attempt, one error). Caller holds
 * s->lock. */
void slots_prestart(km_manager *m, session *s, const cblock_list *blocks)
{
    int need[KM_LANG_MAX] = {0}, n = 0;
    for (int l = 0; l < m->cfg.langs.n; l++)
        s->k[l].start_err[0] = 0; /* only ever about this execution */
    for (size_t i = 0; i < blocks->n; i++) {
        int l = blocks->v[i].lang;
        /* A Python kernel picks its interpreter from the workspace when it
         * starts (a .venv an earlier block creates applies): one first
         * needed after a block of another language starts then, as
         * before, not ahead of it. */
        if (l >= 0 && m->cfg.langs.v[l].takes_python && i > 0)
            continue;
        if (l >= 0 && l < m->cfg.langs.n && m->cfg.allow[l] && !need[l] && !s->k[l].proc) {
            need[l] = 1;
            n++;
        }
    }
    if (n < 2 || s->gone)
        return;
    int launched[KM_LANG_MAX] = {0};
    for (int l = 0; l < m->cfg.langs.n; l++) {
        if (!need[l])
            continue;
        int rc = slot_launch(m, s, l, 1, s->k[l].start_err, sizeof s->k[l].start_err);
        launched[l] = rc == 0;
        if (rc == -2)
            s->k[l].start_err[0] = 0; /* no free unit: started when needed */
    }
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (launched[l])
            slot_finish(m, s, l, s->k[l].start_err, sizeof s->k[l].start_err);
}

/* Makes sure slot l has a live kernel. *restarted / reason say whether the
 * result must report a fresh kernel that replaced a lost one. */
int slot_ensure(km_manager *m, session *s, int l, int *restarted, char *reason, size_t rsize,
                char *err, size_t errlen)
{
    kslot *k = &s->k[l];
    *restarted = 0;
    if (!k->proc && k->start_err[0]) {
        /* slots_prestart tried for this execution and failed */
        snprintf(err, errlen, "%s", k->start_err);
        k->start_err[0] = 0;
        return -1;
    }
    if (k->proc && !klaunch_alive(k->proc)) {
        char how[128];
        snprintf(k->pending, sizeof k->pending,
                 "the %s kernel died since the last execution (%s); a fresh kernel was started "
                 "and its state was lost (workspace kept)",
                 kmcfg_lang_name(&m->cfg, l), klaunch_describe_exit(k->proc, how, sizeof how));
        slot_stop(m, k);
    }
    if (!k->proc && slot_start(m, s, l, err, errlen))
        return -1;
    if (k->pending[0]) {
        *restarted = 1;
        snprintf(reason, rsize, "%s", k->pending);
        k->pending[0] = 0;
    }
    return 0;
}
