/*
 * mkslots.c — a session's kernel slots (session_int.h): start (launch, wait
 * until ready), stop, admission under max_kernels and memory_budget, and
 * eviction.
 */
#include "kernelmgr/engine/mkevict.h"
#include "kernelmgr/engine/mkmem.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"
#include "kernelmgr/engine/snapshot.h"
#include "common/cm_clock.h"
#include "common/cm_size.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- admission
 *
 * A kernel starts when two things hold at once:
 *   - fewer than max_kernels run (a safety cap: m->live counts kernels that
 *     run and kernels being started, and a start takes its unit with a
 *     compare-and-swap below max_kernels before it launches anything, so
 *     concurrent starts can never exceed it);
 *   - the memory the live kernels use, measured (mkmem.h; each kernel read
 *     again when its figure is older than KM_MEM_MAX_AGE, a kernel that has
 *     not answered yet counted as KM_ADMIT_HEADROOM), plus KM_ADMIT_HEADROOM
 *     for the new one, fits in the memory budget, and the host's
 *     MemAvailable is at least KM_ADMIT_HEADROOM. The check and the new
 *     kernel's charge are one step under m->mem_mu, so concurrent starts
 *     see each other.
 * A start that finds either reached stops the kernels of the session chosen
 * by mkevict.h (a warm-pool entry first, then the least recently used
 * session not running code; never the session that asked); when none may
 * go it waits (polling every KM_ADMIT_POLL_S) up to admission_timeout
 * seconds instead of failing, unless every live kernel is its own session's
 * (nothing could ever free one: it fails at once). The daemon log says how
 * long it waited. The waiting starts are bounded by the daemon's worker
 * threads. A warm-pool start never waits nor stops anything. */

#define KM_ADMIT_POLL_S 0.05
/* Starts of one kernel when, on tcp, another process takes a port it was
 * given before it binds it (klaunch_lost_port_race): each start picks fresh
 * ports. */
#define KM_PORT_RACE_STARTS 3

typedef enum admit_limit { ADMIT_OK, ADMIT_CAP, ADMIT_MEMORY, ADMIT_HOST } admit_limit;

static int evict_for(km_manager *m, session *self, const char *why);

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

void slots_init(km_manager *m)
{
    pthread_mutex_init(&m->mem_mu, NULL);
    uint64_t total = 0, avail = 0;
    kmem_host(&total, &avail);
    /* a host whose memory cannot be read has no memory rule: the cap holds */
    m->mem_budget = m->cfg.memory_budget ? m->cfg.memory_budget
                    : total              ? kmem_auto_budget(total)
                                         : UINT64_MAX;
}

void slots_fini(km_manager *m)
{
    pthread_mutex_destroy(&m->mem_mu);
}

/* The charged kernels' memory now: each answered kernel's figure read again
 * when older than KM_MEM_MAX_AGE, one still starting counted as
 * KM_ADMIT_HEADROOM; the host's MemAvailable likewise. Caller holds
 * m->mem_mu. */
static uint64_t mem_count_locked(km_manager *m)
{
    double now = kclient_now();
    uint64_t used = 0;
    for (kslot *k = m->charged; k; k = k->mem_next) {
        if (!k->mem_pid) {
            used += KM_ADMIT_HEADROOM;
            continue;
        }
        if (!(k->mem_at > 0) || now - k->mem_at > KM_MEM_MAX_AGE) {
            k->mem_bytes = kmem_kernel_bytes(k->mem_pid) +
                           (k->mem_sbx_pid > 0 ? kmem_kernel_bytes(k->mem_sbx_pid) : 0);
            k->mem_at = now;
        }
        used += k->mem_bytes;
    }
    if (!(m->host_at > 0) || now - m->host_at > KM_MEM_MAX_AGE) {
        uint64_t total;
        kmem_host(&total, &m->host_avail);
        m->host_at = now;
    }
    m->mem_used = used;
    return used;
}

/* The limit that refuses one more kernel now, in words for messages
 * ("max_kernels=4", "memory_budget=1 GiB (...)"), or ADMIT_OK. */
static admit_limit admit_check_locked(km_manager *m, unsigned live, unsigned n, km_err *why)
{
    char a[32], b[32], c[32];
    if (live + n > m->cfg.max_kernels) {
        km_err_set(why, KM_EKERNEL, "max_kernels=%u", m->cfg.max_kernels);
        return ADMIT_CAP;
    }
    uint64_t used = mem_count_locked(m);
    if (m->mem_budget != UINT64_MAX && used + n * KM_ADMIT_HEADROOM > m->mem_budget) {
        km_err_set(why, KM_EKERNEL,
                   "memory_budget=%s (the live kernels use %s, and a new one is given %s)",
                   cm_size_format(m->mem_budget, a, sizeof a), cm_size_format(used, b, sizeof b),
                   cm_size_format(KM_ADMIT_HEADROOM, c, sizeof c));
        return ADMIT_MEMORY;
    }
    if (m->host_avail && m->host_avail < n * KM_ADMIT_HEADROOM) {
        km_err_set(why, KM_EKERNEL,
                   "the host's free memory (MemAvailable %s, below the %s a new kernel is given)",
                   cm_size_format(m->host_avail, a, sizeof a),
                   cm_size_format(KM_ADMIT_HEADROOM, b, sizeof b));
        return ADMIT_HOST;
    }
    return ADMIT_OK;
}

int slots_room(km_manager *m, unsigned n)
{
    km_err why = {0};
    pthread_mutex_lock(&m->mem_mu);
    admit_limit lim = admit_check_locked(m, (unsigned)atomic_load(&m->live), n, &why);
    pthread_mutex_unlock(&m->mem_mu);
    return lim == ADMIT_OK;
}

void slots_memory(km_manager *m, uint64_t *used, uint64_t *budget)
{
    pthread_mutex_lock(&m->mem_mu);
    *used = mem_count_locked(m);
    *budget = m->mem_budget;
    pthread_mutex_unlock(&m->mem_mu);
}

/* Takes a unit of max_kernels for slot k and charges it, when both limits
 * allow one more kernel now; else the limit's words in why. */
static admit_limit admit_try(km_manager *m, kslot *k, km_err *why)
{
    int cur = atomic_load(&m->live);
    for (;;) {
        if ((unsigned)cur >= m->cfg.max_kernels) {
            km_err_set(why, KM_EKERNEL, "max_kernels=%u", m->cfg.max_kernels);
            return ADMIT_CAP;
        }
        if (atomic_compare_exchange_weak(&m->live, &cur, cur + 1))
            break;
    }
    pthread_mutex_lock(&m->mem_mu);
    /* the unit just taken is this start's: count the others */
    admit_limit lim = admit_check_locked(m, 0, 1, why);
    if (lim == ADMIT_OK) {
        k->mem_next = m->charged;
        m->charged = k;
        k->mem_on = 1;
        k->mem_pid = 0;
        k->mem_sbx_pid = 0;
        k->mem_bytes = 0;
        k->mem_at = 0;
        m->mem_used += KM_ADMIT_HEADROOM;
    }
    pthread_mutex_unlock(&m->mem_mu);
    if (lim != ADMIT_OK) {
        atomic_fetch_sub(&m->live, 1);
        slot_changed(m);
    }
    return lim;
}

/* Releases slot k's unit of max_kernels and its charge. */
static void admit_release(km_manager *m, kslot *k)
{
    pthread_mutex_lock(&m->mem_mu);
    if (k->mem_on) {
        for (kslot **pp = &m->charged; *pp; pp = &(*pp)->mem_next)
            if (*pp == k) {
                *pp = k->mem_next;
                break;
            }
        k->mem_on = 0;
        k->mem_next = NULL;
        k->mem_sbx_pid = 0;
    }
    pthread_mutex_unlock(&m->mem_mu);
    atomic_fetch_sub(&m->live, 1);
    slot_changed(m);
}

/* Slot k's kernel answered: from now on it is charged what it uses. */
static void admit_ready(km_manager *m, session *s, kslot *k)
{
    pthread_mutex_lock(&m->mem_mu);
    k->mem_pid = k->proc ? k->proc->pid : 0;
    /* a session sandbox's workers are not below their kernels: its holder
     * (and so its cgroup) is charged to one kernel of the session */
    pid_t sbx = s->sbx ? s->sbx->pid : 0;
    for (int l = 0; sbx && l < m->cfg.langs.n; l++)
        if (&s->k[l] != k && s->k[l].mem_sbx_pid == sbx && s->k[l].proc)
            sbx = 0;
    k->mem_sbx_pid = sbx;
    k->mem_at = 0;
    pthread_mutex_unlock(&m->mem_mu);
    slot_changed(m); /* its charge fell from the headroom to its use */
}

/* The live kernels of s (caller holds s->lock). */
static unsigned slots_live(const km_manager *m, const session *s)
{
    unsigned n = 0;
    for (int l = 0; l < m->cfg.langs.n; l++)
        n += s->k[l].proc != NULL;
    return n;
}

/* Takes one unit of max_kernels (and the memory charge) for a start of
 * slot l of s (caller holds s->lock). 0, or -1 with a reason in err. */
static int admit(km_manager *m, session *s, int l, km_err *err)
{
    double t0 = kclient_now();
    double deadline = t0 + (s->pool_entry ? 0 : m->cfg.admission_timeout);
    int evicted = 0;
    km_err why = {0};
    for (;;) {
        pthread_mutex_lock(&m->slot_mu);
        unsigned long gen = m->slot_gen;
        pthread_mutex_unlock(&m->slot_mu);
        admit_limit lim = admit_try(m, &s->k[l], &why);
        if (lim == ADMIT_OK)
            break;
        if (!s->pool_entry && evict_for(m, s, why.msg) == 0) {
            evicted++;
            continue;
        }
        const char *what =
            lim == ADMIT_CAP ? "too many live kernels" : "not enough memory for another kernel";
        const char *raise = lim == ADMIT_CAP      ? "raise max_kernels"
                            : lim == ADMIT_MEMORY ? "raise memory_budget"
                                                  : "free memory on the host";
        pthread_mutex_lock(&m->lock);
        int pool_empty = m->pool == NULL;
        pthread_mutex_unlock(&m->lock);
        if (!s->pool_entry && pool_empty && (unsigned)atomic_load(&m->live) <= slots_live(m, s)) {
            /* only this session's own kernels run: none will ever give way */
            km_err_set(err, KM_EKERNEL,
                       "%s (%s): every live kernel is this session's own, and a session's kernels "
                       "are never stopped for its other languages; %s",
                       what, why.msg, raise);
            return -1;
        }
        if (kclient_now() >= deadline) {
            km_err_set(err, KM_EKERNEL,
                       "%s (%s) and none idle to stop: every other kernel belongs to a session "
                       "that is running code (waited %.1f s, admission_timeout=%g); retry later "
                       "or %s",
                       what, why.msg, kclient_now() - t0, m->cfg.admission_timeout, raise);
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
        fprintf(stderr, "kernelmgr: %s/%s waited %.1f s for a kernel slot (%s, %d evicted)\n",
                s->name, kmcfg_lang_name(&m->cfg, l), waited, why.msg, evicted);
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
        admit_release(m, k);
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
    ksbx_stop(s);
}

/* Stops the kernels of one warm-pool entry (the pool refills later). Pool
 * kernels go first when a limit is reached: they hold no one's state. 0
 * when one was stopped. Caller holds no lock of m. */
static int evict_pool_entry(km_manager *m, const char *why)
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
    fprintf(stderr, "kernelmgr: %s reached: stopped a warm-pool entry\n", why);
    return 0;
}

/* When s last started a kernel or ran code (kclient_now's clock). */
static double session_last_used(const km_manager *m, const session *s)
{
    double t = 0;
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (s->k[l].proc && s->k[l].last_used > t)
            t = s->k[l].last_used;
    return t;
}

/* 1 when a kernel of s runs another client's cell (caller holds s->lock). */
static int foreign_busy(const km_manager *m, const session *s)
{
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (s->k[l].proc && kforeign_busy(s->k[l].foreign, NULL, NULL))
            return 1;
    return 0;
}

/* Stops every kernel of victim for self (caller holds both locks). Each
 * stopped kernel's next result says why its state was lost. */
static void evict_session(km_manager *m, session *victim, const session *self, const char *why)
{
    int had[KM_LANG_MAX] = {0};
    char langs[256] = "";
    size_t used = 0;
    for (int l = 0; l < m->cfg.langs.n; l++)
        if ((had[l] = victim->k[l].proc != NULL) && used < sizeof langs) {
            int w = snprintf(langs + used, sizeof langs - used, "%s%s", used ? ", " : "",
                             kmcfg_lang_name(&m->cfg, l));
            used += w > 0 ? (size_t)w : 0;
        }
    snap_before_stop(m, victim, "eviction");
    slots_stop_all(m, victim);
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (had[l])
            snprintf(
                victim->k[l].pending, sizeof victim->k[l].pending,
                "evicted: the %s kernel was stopped to stay under %.255s (session \"%s\" needed "
                "one; this session was the least recently used of those not running code); "
                "state %s (workspace kept)",
                kmcfg_lang_name(&m->cfg, l), why, self->name,
                victim->k[l].restore[0] ? "was restored from a snapshot" : "was lost");
    session_save(m, victim);
    fprintf(stderr, "kernelmgr: %s reached: stopped session %s (%s) for %s\n", why, victim->name,
            langs, self->name);
}

/* Makes room for one kernel of self by the rule of mkevict.h: a warm-pool
 * entry, else every kernel of the least recently used session that is not
 * running code (never self). why names the limit reached. A session whose
 * lock is held (a close, a file write) is passed over for the next. Caller
 * holds self->lock. 0 when kernels were stopped. */
static int evict_for(km_manager *m, session *self, const char *why)
{
    enum { TRIES = 16 };
    session *tried[TRIES] = {NULL};
    size_t ntried = 0;
    while (ntried < TRIES) {
        pthread_mutex_lock(&m->lock);
        /* the warm pool is one candidate (any of its entries), then each session */
        size_t n = 1;
        for (session *s = m->list; s; s = s->next)
            n++;
        kevict_cand *c = calloc(n, sizeof *c);
        session **who = calloc(n, sizeof *who);
        if (!c || !who) {
            pthread_mutex_unlock(&m->lock);
            free(c);
            free(who);
            return -1;
        }
        c[0].pool = 1;
        c[0].kernels = m->pool != NULL;
        size_t i = 1;
        for (session *s = m->list; s; s = s->next, i++) {
            who[i] = s;
            c[i].self = s == self;
            c[i].running = atomic_load(&s->busy) != 0;
            c[i].kernels = slots_live(m, s);
            c[i].last_used = session_last_used(m, s);
            c[i].skip = s->gone;
            for (size_t t = 0; t < ntried; t++)
                c[i].skip |= tried[t] == s;
        }
        long pick = kevict_choose(c, n);
        session *v = pick > 0 ? who[pick] : NULL;
        if (v)
            v->refs++;
        pthread_mutex_unlock(&m->lock);
        free(c);
        free(who);
        if (pick == 0) {
            if (evict_pool_entry(m, why) == 0)
                return 0;
            continue; /* the pool emptied meanwhile: the sessions' turn */
        }
        if (!v)
            return -1;
        int done = 0;
        if (pthread_mutex_trylock(&v->lock) == 0) {
            /* still idle, open and holding kernels now that it is ours */
            /* a kernel running another client's cell (a person's, on a
             * gateway WebSocket) is not idle: its session is not stopped
             * under that cell */
            if (!v->gone && !atomic_load(&v->busy) && slots_live(m, v) && !foreign_busy(m, v)) {
                evict_session(m, v, self, why);
                done = 1;
            }
            pthread_mutex_unlock(&v->lock);
        }
        if (!done)
            tried[ntried++] = v; /* if freed and its memory reused, one more is passed over */
        session_put(m, v);
        if (done)
            return 0;
    }
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
static int slot_launch(km_manager *m, session *s, int l, int try_only, km_err *err)
{
    kslot *k = &s->k[l];
    /* the kernel's unit of max_kernels and its memory charge, released by
     * slot_stop */
    km_err why = {0};
    if (try_only ? admit_try(m, k, &why) != ADMIT_OK : admit(m, s, l, err))
        return try_only ? -2 : -1;
    klaunch_cmd cmd;
    if (ksbx_ensure(m, s, err) || kernel_cmd(m, s, l, &cmd, err)) {
        admit_release(m, k);
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
                            lg->kernelspec[0] ? lg->kernelspec : kname, err);
    klaunch_cmd_clear(&cmd);
    if (!k->proc) {
        admit_release(m, k);
        return -1;
    }
    k->client = kclient_new(&k->proc->conn, label, err);
    if (k->client)
        k->foreign = kforeign_new(kclient_session_id(k->client), s->dir, lg->name,
                                  m->cfg.history_max, m->cfg.output_cap, m->cfg.display_max);
    if (!k->client || !k->foreign) {
        if (k->client)
            km_err_set(err, KM_EKERNEL, "out of memory");
        slot_stop(m, k);
        return -1;
    }
    return 0;
}

/* Second half: waits until the launched kernel of slot l answers. Caller
 * holds s->lock. 0, or -1 with err (the kernel stopped). */
static int slot_finish(km_manager *m, session *s, int l, km_err *err)
{
    kslot *k = &s->k[l];
    char log[PATH_MAX];
    slot_log_path(m, s, l, log, sizeof log);
    json_t *info = NULL;
    for (int attempt = 1; k->client; attempt++) {
        km_err why = {0};
        info = kclient_wait_ready(k->client, m->cfg.start_timeout, proc_alive_cb, k->proc, &why);
        if (!info && attempt < KM_PORT_RACE_STARTS && klaunch_lost_port_race(k->proc, log)) {
            fprintf(stderr,
                    "kernelmgr: %s/%s: another process took a tcp port of the kernel before "
                    "it could bind it: starting it again on fresh ports (start %d of %d)\n",
                    s->name, kmcfg_lang_name(&m->cfg, l), attempt + 1, KM_PORT_RACE_STARTS);
            slot_stop(m, k);
            if (slot_launch(m, s, l, 0, err))
                return -1;
            continue;
        }
        if (!info) {
            char how[128] = "";
            if (!klaunch_alive(k->proc))
                klaunch_describe_exit(k->proc, how, sizeof how);
            km_err_set(err, KM_EKERNEL, "%s kernel did not start: %s%s%s (log: %s)",
                       kmcfg_lang_name(&m->cfg, l), why.msg, how[0] ? "; " : "", how, log);
        }
        break;
    }
    if (!info) {
        slot_stop(m, k);
        return -1;
    }
    k->snap_none = !json_is_object(json_object_get(info, "kernelmgr"));
    json_decref(info);
    k->last_used = kclient_now();
    admit_ready(m, s, k);
    session_save(m, s);
    return 0;
}

/* Starts the kernel of slot l. Caller holds s->lock. */
int slot_start(km_manager *m, session *s, int l, km_err *err)
{
    if (slot_launch(m, s, l, 0, err))
        return -1;
    return slot_finish(m, s, l, err);
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
        s->k[l].start_err.msg[0] = 0; /* only ever about this execution */
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
        int rc = slot_launch(m, s, l, 1, &s->k[l].start_err);
        launched[l] = rc == 0;
        if (rc == -2)
            s->k[l].start_err.msg[0] = 0; /* no free unit: started when needed */
    }
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (launched[l])
            slot_finish(m, s, l, &s->k[l].start_err);
}

/* Makes sure slot l has a live kernel. *restarted / reason say whether the
 * result must report a fresh kernel that replaced a lost one. */
int slot_ensure(km_manager *m, session *s, int l, int *restarted, char *reason, size_t rsize,
                km_err *err)
{
    kslot *k = &s->k[l];
    *restarted = 0;
    if (!k->proc && k->start_err.msg[0]) {
        /* slots_prestart tried for this execution and failed */
        km_err_set(err, KM_EKERNEL, "%s", k->start_err.msg);
        k->start_err.msg[0] = 0;
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
    if (!k->proc) {
        if (slot_start(m, s, l, err))
            return -1;
        snap_after_start(m, s, l);
    }
    if (k->pending[0]) {
        *restarted = 1;
        snprintf(reason, rsize, "%s", k->pending);
        k->pending[0] = 0;
    }
    return 0;
}
