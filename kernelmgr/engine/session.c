/*
 * session.c — the manager (km.h): its life, the session registry, session
 * creation and options, and the per-session operations (interrupt, restart,
 * close, files, export, packages, snapshots); code_exec is sessionexec.c. The shared state, its
 * ownership and its locking rules: session_int.h; the other jobs are in the files it lists.
 */
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/export.h"
#include "kernelmgr/engine/fsdiff.h"
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/engine/pkgdirs.h"
#include "kernelmgr/engine/session_int.h"
#include "kernelmgr/engine/sessopt.h"
#include "kernelmgr/engine/snapshot.h"
#include "kernelmgr/engine/wsfile.h"
#include "common/cm_clock.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

int km_name_valid(const char *name)
{
    if (!name || !*name || name[0] == '.' || strlen(name) > KM_NAME_MAX)
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '.'))
            return 0;
    return 1;
}

void km_session_opts_init(km_session_opts *o)
{
    memset(o, 0, sizeof *o);
    o->network_allow = NULL;
    km_sessopt_init(o);
}

/* ---------------------------------------------------------------- manager */

/* Releases what km_manager_new set up once no kernel of m runs: the owner
 * lock, the lifeline (its kernels see end-of-file), locks, m itself. */
static void manager_free(km_manager *m)
{
    if (m->owner_held)
        klaunch_owner_release(m->run_dir);
    for (int i = 0; i < 2; i++)
        if (m->lifeline[i] >= 0)
            close(m->lifeline[i]);
    json_decref(m->cfg.env);
    pthread_cond_destroy(&m->slot_cv);
    pthread_mutex_destroy(&m->slot_mu);
    slots_fini(m);
    pthread_mutex_destroy(&m->pkg_mu);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

km_manager *km_manager_new(const char *home, const kmcfg *cfg, int resume, km_err *err)
{
    if (strlen(home) > KM_HOME_MAX) {
        km_err_set(err, KM_EUSAGE,
                   "the kernelmgr home (KERNELMGR_HOME) is %zu bytes long: at most %d",
                   strlen(home), KM_HOME_MAX);
        return NULL;
    }
    km_manager *m = calloc(1, sizeof *m);
    if (!m) {
        km_err_set(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    m->cfg.env = cfg->env ? json_deep_copy(cfg->env) : NULL;
    /* allowed only with transport_tcp_exposed (config.c); said at every start */
    if (!strcmp(m->cfg.transport, "tcp"))
        fprintf(stderr, "kernelmgr: warning: tcp transport: %s\n", JP_TCP_EXPOSURE);
    m->lifeline[0] = m->lifeline[1] = -1;
    m->snap_on_stop = resume;
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->slot_mu, NULL);
    pthread_mutex_init(&m->pkg_mu, NULL);
    cm_cond_init_mono(&m->slot_cv);
    slots_init(m);
    snprintf(m->home, sizeof m->home, "%s", home);
    char p[PATH_MAX];
    km_err why = {0};
    /* the home is trusted state (kmhome.h): refused unless it is ours alone */
    if (kmhome_prepare(home, 1, &why)) {
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
        goto fail;
    }
    if (klaunch_run_dir(m->home, m->run_dir, sizeof m->run_dir, &why) ||
        klaunch_lifeline_open(m->lifeline, &why) || klaunch_owner_hold(m->run_dir, &why)) {
        km_err_set(err, KM_EINTERNAL, "%s", why.msg);
        goto fail;
    }
    m->owner_held = 1;
    /* lock-and-scan: kernels and runs of owners that have ended (the pool
     * kernels of a killed daemon among them: before pool/ goes below) */
    klaunch_reap_orphans(m->run_dir);
    reap_dead_runs(m);
    if (resume) {
        snprintf(p, sizeof p, "%s/sessions", m->home);
        DIR *d = opendir(p);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (!km_name_valid(de->d_name) || owned_by_live_manager(m, de->d_name))
                continue;
            session *s = session_load(m, de->d_name, &why);
            if (!s) {
                /* a damaged session stays on disk, set aside, for its
                 * repair; the others resume */
                if (why.msg[0])
                    fprintf(stderr, "kernelmgr: %s\n", why.msg);
                continue;
            }
            session_save(m, s); /* the stale pids are gone */
            s->next = m->list;
            m->list = s;
        }
        if (d)
            closedir(d);
        /* pool entries of an earlier manager that were never handed out
         * (their kernels were reaped above); an entry handed out to a
         * session holds that session's workspace and stays */
        snprintf(p, sizeof p, "%s/pool", m->home);
        d = opendir(p);
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            char *entry = NULL;
            if (asprintf(&entry, "%s/%s", p, de->d_name) < 0)
                break;
            int used = 0;
            for (session *s = m->list; s && !used; s = s->next)
                used = !strcmp(s->pool_dir, entry);
            if (!used)
                session_rmtree(entry);
            free(entry);
        }
        if (d)
            closedir(d);
        rmdir(p); /* when empty */
    }
    outputs_prune(m, resume);
    if (resume)
        prune_orphans(m);
    return m;
fail:
    manager_free(m);
    return NULL;
}

void km_manager_destroy(km_manager **pm)
{
    if (!pm || !*pm)
        return;
    km_manager *m = *pm;
    for (int pass = 0; pass < 2; pass++) {
        session *s = pass ? m->pool : m->list;
        while (s) {
            session *next = s->next;
            atomic_store(&s->interrupt_flag, 1);
            pthread_mutex_lock(&s->lock);
            /* a daemon that stops keeps its sessions' state for the next */
            int snap = !pass && m->snap_on_stop && !s->gone;
            /* saved with its kernels still listed: the next manager says
             * their state was lost, or restores the snapshot it names */
            if (snap) {
                snap_before_stop(m, s, "daemon stop");
                session_save(m, s);
            }
            slots_stop_all(m, s);
            if (pass)
                session_rmtree(s->pool_dir);
            pthread_mutex_unlock(&s->lock);
            session_free(s);
            s = next;
        }
    }
    /* every kernel is stopped: the lifeline and the owner lock go */
    manager_free(m);
    *pm = NULL;
}

const kmcfg *km_manager_config(const km_manager *m)
{
    return &m->cfg;
}

const char *km_manager_home(const km_manager *m)
{
    return m->home;
}

/* Finds a session and takes a reference. Caller holds m->lock. */
static session *find_locked(km_manager *m, const char *name)
{
    for (session *s = m->list; s; s = s->next)
        if (!strcmp(s->name, name) && !s->gone)
            return s;
    return NULL;
}

static session *session_get(km_manager *m, const char *name)
{
    pthread_mutex_lock(&m->lock);
    session *s = find_locked(m, name);
    if (s)
        s->refs++;
    pthread_mutex_unlock(&m->lock);
    return s;
}

session *session_ref(km_manager *m, const char *name)
{
    return session_get(m, name);
}

void session_put(km_manager *m, session *s)
{
    pthread_mutex_lock(&m->lock);
    s->refs--;
    int free_it = s->gone && s->refs == 0;
    pthread_mutex_unlock(&m->lock);
    /* an execution ends with this: its kernels may be evictable now */
    slot_changed(m);
    if (free_it)
        session_free(s);
}

/* What creating a session made, to take back when its first save fails. */
typedef struct create_undo {
    int made_dir, made_ws, made_link, pooled;
} create_undo;

static void create_undo_run(km_manager *m, session *s, const create_undo *u)
{
    if (u->made_link) {
        char link[PATH_MAX];
        snprintf(link, sizeof link, "%.4000s/workspace", s->dir);
        unlink(link);
    }
    if (u->made_ws)
        rmdir(s->workspace);
    if (u->made_dir)
        session_rmtree(s->dir);
    if (u->pooled) {
        slots_stop_all(m, s); /* its kernels and its sandbox's holder */
        session_rmtree(s->pool_dir);
    }
}

/* The first save of a new session: 0, or -1 with err. A session that
 * cannot be saved would vanish with its manager: it is refused. */
static int create_save(km_manager *m, session *s, km_err *err)
{
    km_err why = {0};
    if (session_save_err(m, s, &why) == 0)
        return 0;
    km_err_set(err, KM_EINTERNAL, "cannot create session \"%s\": %s", s->name, why.msg);
    return -1;
}

/* Creates (or reopens a kept) session. Caller holds m->lock. A new session
 * is listed with its lock held and *undo filled (*pending 1): the caller
 * saves it after releasing m->lock (create_finish), so that the fsyncs of
 * its session.json (~15 ms on ext4) do not hold every other session's
 * creation; when its lock cannot be taken at once (never for a fresh one),
 * it is saved here (*pending 0). */
static session *create_locked(km_manager *m, const char *name, const km_session_opts *o,
                              int *existed, create_undo *undo, int *pending, km_err *err)
{
    km_err why = {0};
    session *s = session_load(m, name, &why);
    *existed = s != NULL;
    if (s) {
        s->next = m->list;
        m->list = s;
        return s;
    }
    if (why.msg[0]) {
        /* damaged (or its directory refused): said, never recreated silently */
        km_err_set(err, KM_EINTERNAL, "%s", why.msg);
        return NULL;
    }
    if (o && o->no_create) {
        km_err_set(err, KM_ENOSESSION,
                   "no session named \"%s\"%s%s%s (create: false: a missing session is never made; "
                   "create it with session.create)",
                   name, m->cfg.node_id[0] ? " on node \"" : "", m->cfg.node_id,
                   m->cfg.node_id[0] ? "\"" : "");
        return NULL;
    }
    if (atomic_load(&m->draining)) {
        km_err_set(err, KM_EDAEMON,
                   "%s%s%s is draining: it makes no new sessions (session \"%s\" does not exist "
                   "here); its existing sessions keep working",
                   m->cfg.node_id[0] ? "node \"" : "this daemon", m->cfg.node_id,
                   m->cfg.node_id[0] ? "\"" : "", name);
        return NULL;
    }
    if (o && o->env && session_env_check(m, o->env, &why)) {
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
        return NULL;
    }
    if (o && o->workspace) {
        struct stat st;
        if (o->workspace[0] != '/' || stat(o->workspace, &st) || !S_ISDIR(st.st_mode)) {
            km_err_set(err, KM_EUSAGE,
                       "--workspace %s: must be an existing directory (absolute path)",
                       o->workspace);
            return NULL;
        }
    }
    if (o && o->python) {
        /* refused before anything is created (the kernel would fail later
         * and the session would keep the bad interpreter) */
        struct stat st;
        if (o->python[0] != '/' || stat(o->python, &st) || !S_ISREG(st.st_mode) ||
            access(o->python, X_OK)) {
            km_err_set(err, KM_EUSAGE, "--python %s: %s", o->python,
                       o->python[0] != '/' ? "must be an absolute path"
                       : errno == ENOENT   ? "no such file"
                                           : "not an executable file");
            return NULL;
        }
    }
    /* a warm-pool entry when the options are the defaults */
    session *pooled = NULL;
    if (km_sessopt_default(m, o) && m->pool) {
        /* Its kernels see its package directory, which becomes the
         * session's; packages installed for the name before the session
         * existed win, and the pool entry is then not used. */
        char from[PATH_MAX];
        snprintf(from, sizeof from, "%.4000s/packages", m->pool->pool_dir);
        if (pkgdirs_adopt(from, m->home, name) == 0 || errno == ENOENT) {
            pooled = m->pool;
            m->pool = pooled->next;
        }
    }
    s = pooled ? pooled : session_alloc(name);
    if (!s) {
        km_err_set(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->dir, sizeof s->dir, "%.3000s/sessions/%.64s", m->home, name);
    snprintf(s->outdir, sizeof s->outdir, "%.3000s/outputs/%.64s", m->home, name);
    /* what this call creates, to take back on failure */
    struct stat dst;
    int made_dir = lstat(s->dir, &dst) != 0, made_ws = 0, made_link = 0;
    if (kmhome_mkdir(s->dir, 0700, &why)) {
        km_err_set(err, KM_EINTERNAL, "%s", why.msg);
        goto fail;
    }
    if (pooled) {
        pooled->from_pool = 1;
        pooled->pool_entry = 0;
        pooled->created = pooled->last_used = cm_wall_s();
        /* idle time is counted from the handout, not from the pre-start */
        for (int l = 0; l < m->cfg.langs.n; l++)
            pooled->k[l].last_used = kclient_now();
        char link[PATH_MAX];
        snprintf(link, sizeof link, "%.4000s/workspace", s->dir);
        if (symlink(s->workspace, link)) {
            /* not fatal: the real path is in session.json */
        } else {
            made_link = 1;
        }
        /* the pool's kernel logs stay where they are; point at them */
    } else {
        /* every option by the table (sessopt.c) */
        if (km_sessopt_create(m, s, o)) {
            km_err_set(err, KM_EINTERNAL, "out of memory");
            goto fail;
        }
        if (s->network == KM_NET_ALLOW && !strcmp(s->sandbox, "none")) {
            /* nothing but the sandbox keeps the code to the proxy */
            km_err_set(
                err, KM_EUSAGE,
                "network allow-list (%.200s) needs the strict sandbox: with sandbox \"none\" "
                "the code has the host's network",
                s->net_allow);
            goto fail;
        }
        if (o && o->workspace) {
            char *real = realpath(o->workspace, NULL);
            snprintf(s->workspace, sizeof s->workspace, "%s", real ? real : o->workspace);
            free(real);
            s->own_workspace = 0;
        } else {
            snprintf(s->workspace, sizeof s->workspace, "%.3000s/workspace", s->dir);
            s->own_workspace = 1;
            made_ws = session_make_workspace(s, &why);
            if (made_ws < 0) {
                made_ws = 0;
                km_err_set(err, KM_EINTERNAL, "%s", why.msg);
                goto fail;
            }
        }
    }
    *undo = (create_undo){made_dir, made_ws, made_link, pooled != NULL};
    if (pthread_mutex_trylock(&s->lock) == 0)
        *pending = 1;
    else if (create_save(m, s, err))
        goto fail;
    s->next = m->list;
    m->list = s;
    return s;
fail:
    *undo = (create_undo){made_dir, made_ws, made_link, pooled != NULL};
    create_undo_run(m, s, undo);
    session_free(s);
    return NULL;
}

/* The save create_locked left to the caller (s listed, its lock and a
 * reference held, m->lock not): 0 and s unlocked; or -1 with err, s taken
 * back as a close would (gone, unlisted, what its creation made removed;
 * whoever found it meanwhile gets that error) and the
 * reference dropped. */
static int create_finish(km_manager *m, session *s, const create_undo *undo, km_err *err)
{
    if (create_save(m, s, err) == 0) {
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
    snprintf(s->gone_why, sizeof s->gone_why, "%s", err->msg);
    pthread_mutex_lock(&m->lock); /* lock order: the session's, then m->lock */
    s->gone = 1;
    for (session **pp = &m->list; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&m->lock);
    create_undo_run(m, s, undo);
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    return -1;
}

/* ---------------------------------------------------------------- acquiring */

/* new: warnings for session options given to an existing session whose value
 * differs from the session's, or NULL when there are none. They are reported
 * rather than applied: applying them means a restart, and silently losing an
 * agent's state because of an option is worse than a warning. */
json_t *session_ignored_options(km_manager *m, session *s, const km_session_opts *o)
{
    if (!o)
        return NULL;
    json_t *arr = json_array();
    km_sessopt_warn(m, s, o, arr);
    if (!json_array_size(arr)) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

void km_set_draining(km_manager *m, int on)
{
    atomic_store(&m->draining, on ? 1 : 0);
}

int km_draining(const km_manager *m)
{
    return atomic_load(&((km_manager *)m)->draining);
}

/* 0 when name is a valid session name, else KM_EUSAGE in err naming the rule */
int session_check_name(const char *name, km_err *err)
{
    if (km_name_valid(name))
        return 0;
    return km_err_set(err, KM_EUSAGE,
                      "invalid session name \"%s\" (allowed: letters, digits, _ - ., "
                      "at most %d, not starting with '.')",
                      name ? name : "", KM_NAME_MAX);
}

/* The session named name with a reference taken (session_put), created with
 * o when there is none (*existed then 0); NULL with err. */
session *session_acquire(km_manager *m, const char *name, const km_session_opts *o, int *existed,
                         km_err *err)
{
    pthread_mutex_lock(&m->lock);
    *existed = 1;
    create_undo undo = {0};
    int pending = 0;
    session *s = find_locked(m, name);
    if (!s)
        s = create_locked(m, name, o, existed, &undo, &pending, err);
    if (s)
        s->refs++;
    pthread_mutex_unlock(&m->lock);
    if (s && pending && create_finish(m, s, &undo, err))
        return NULL;
    return s;
}

/* ---------------------------------------------------------------- lifecycle */

json_t *km_sessions(km_manager *m)
{
    json_t *arr = json_array();
    pthread_mutex_lock(&m->lock);
    for (session *s = m->list; s; s = s->next) {
        if (s->gone)
            continue;
        json_t *ks = json_object();
        for (int l = 0; l < m->cfg.langs.n; l++) {
            kproc *kp = s->k[l].proc;
            /* reading another session's slot without its lock: a snapshot only */
            if (kp)
                json_object_set_new(ks, kmcfg_lang_name(&m->cfg, l),
                                    json_pack("{s:s s:i s:s}", "state",
                                              atomic_load(&s->busy) ? "busy" : "idle", "pid",
                                              (int)kp->pid, "connection_file", kp->cf_path));
            else
                json_object_set_new(ks, kmcfg_lang_name(&m->cfg, l), json_null());
        }
        /* the limits its kernels run under (the session's own, else the
         * configuration's; null: none / the kernel's default) */
        unsigned long long mem = s->memory ? s->memory : m->cfg.memory;
        double cpus = s->cpus > 0 ? s->cpus : m->cfg.cpus;
        double cpu_time = s->cpu_time > 0 ? s->cpu_time : m->cfg.cpu_time;
        json_t *lim = json_pack("{s:o s:s s:o s:o s:o}", "network",
                                s->network >= 0 ? km_net_json(s->network, s->net_allow)
                                                : km_net_json(m->cfg.network, m->cfg.network_allow),
                                "sandbox", s->sandbox[0] ? s->sandbox : m->cfg.sandbox, "memory",
                                mem ? json_integer((json_int_t)mem) : json_null(), "cpus",
                                cpus > 0 ? json_real(cpus) : json_null(), "cpu_time",
                                cpu_time > 0 ? json_real(cpu_time) : json_null());
        json_array_append_new(arr,
                              json_pack("{s:s s:s s:f s:f s:b s:b s:o s:o}", "name", s->name,
                                        "workspace", s->workspace, "created", s->created,
                                        "last_used", s->last_used, "busy", atomic_load(&s->busy),
                                        "from_pool", s->from_pool, "kernels", ks, "limits", lim));
    }
    pthread_mutex_unlock(&m->lock);
    return arr;
}

#define KM_INTERRUPT_LOCK_WAIT_S 5

int km_interrupt(km_manager *m, const char *name, km_err *err)
{
    session *s = session_get(m, name);
    if (!s)
        return km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
    /* Not running an exec of ours: a cell of another client (a frontend)
     * may run, so the kernels are told directly, under the session's lock.
     * A short operation holding the lock (a status, a snapshot) is waited
     * for, up to KM_INTERRUPT_LOCK_WAIT_S: a flag alone would be seen by no
     * one and the interrupt lost. */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += KM_INTERRUPT_LOCK_WAIT_S;
    if (atomic_load(&s->busy)) {
        atomic_store(&s->interrupt_flag, 1);
    } else if (pthread_mutex_timedlock(&s->lock, &until) == 0) {
        if (atomic_load(&s->busy)) {
            atomic_store(&s->interrupt_flag, 1);
        } else {
            for (int l = 0; l < m->cfg.langs.n; l++)
                if (s->k[l].client && klaunch_alive(s->k[l].proc))
                    kclient_send(s->k[l].client, JP_CONTROL, "interrupt_request", NULL, NULL, NULL);
        }
        pthread_mutex_unlock(&s->lock);
    } else {
        atomic_store(&s->interrupt_flag, 1);
    }
    session_put(m, s);
    return 0;
}

int km_restart(km_manager *m, const char *name, km_err *err)
{
    session *s = session_get(m, name);
    if (!s)
        return km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
    atomic_store(&s->interrupt_flag, 1);
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    for (int l = 0; l < m->cfg.langs.n; l++) {
        if (!s->k[l].proc)
            continue;
        slot_stop(m, &s->k[l]);
        s->k[l].pending[0] = 0;
        km_err why = {0};
        if (slot_start(m, s, l, &why))
            rc = km_err_set(err, KM_EKERNEL, "%s", why.msg);
    }
    session_save(m, s);
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    return rc;
}

int km_close(km_manager *m, const char *name, int flags, km_err *err)
{
    return km_close_warn(m, name, flags, NULL, err);
}

int km_close_warn(km_manager *m, const char *name, int flags, json_t *warnings, km_err *err)
{
    int keep = flags & KM_KEEP;
    session *s = session_get(m, name);
    if (!s) {
        /* a kept session from earlier is still on disk: allow removing it
         * (a damaged one too: its directory goes, a workspace it may have
         * named elsewhere is not known and stays) */
        char dir[PATH_MAX];
        km_err why = {0};
        snprintf(dir, sizeof dir, "%.3000s/sessions/%.64s", m->home, name);
        if (km_name_valid(name) && !keep && access(dir, F_OK) == 0) {
            session *t = session_load(m, name, &why);
            if (t) {
                session_remove_workspace(m, t, warnings);
                session_free(t);
            }
            session_rmtree(dir);
            return 0;
        }
        return km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
    }
    atomic_store(&s->interrupt_flag, 1);
    pthread_mutex_lock(&s->lock);
    slots_stop_all(m, s);
    pthread_mutex_lock(&m->pkg_mu);
    pthread_mutex_lock(&m->lock);
    s->gone = 1;
    for (session **pp = &m->list; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    pthread_mutex_unlock(&m->lock);
    if (keep) {
        session_save(m, s);
    } else {
        session_remove_workspace(m, s, warnings);
        if (s->pool_dir[0])
            session_rmtree(s->pool_dir);
        session_rmtree(s->dir);
        km_err why = {0};
        if (pkgdirs_remove_session(m->home, s->name, &why))
            fprintf(stderr, "kernelmgr: cannot remove the packages of session %s: %s\n", s->name,
                    why.msg);
        if (!(flags & KM_KEEP_OUTPUTS))
            session_rmtree(s->outdir);
    }
    pthread_mutex_unlock(&m->pkg_mu);
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    if (flags & KM_KEEP_OUTPUTS)
        outputs_prune(m, 0);
    return 0;
}

/* The result of a repair: what it did, said in message. */
static json_t *repair_result(const char *name, const char *action, const char *message,
                             const char *workspace, int ws_kept, const char *aside)
{
    json_t *o = json_pack("{s:s s:s s:s}", "session", name, "action", action, "message", message);
    if (o && workspace) {
        json_object_set_new(o, "workspace", json_string(workspace));
        json_object_set_new(o, "workspace_kept", json_boolean(ws_kept));
    }
    if (o && aside)
        json_object_set_new(o, "set_aside", json_string(aside));
    return o;
}

json_t *km_session_repair(km_manager *m, const char *name, km_err *err)
{
    if (!km_name_valid(name)) {
        km_err_set(err, KM_EUSAGE, "invalid session name");
        return NULL;
    }
    char dir[PATH_MAX - 64], path[PATH_MAX], aside[PATH_MAX + 64] = "";
    km_err why = {0};
    char msg[2 * PATH_MAX + 600];
    snprintf(dir, sizeof dir, "%.3000s/sessions/%.64s", m->home, name);
    snprintf(path, sizeof path, "%s/session.json", dir);
    session *s = session_get(m, name);
    if (s) {
        /* live: its options are in memory, the file is written from them */
        pthread_mutex_lock(&s->lock);
        json_t *o = session_json_read(path, &why);
        json_t *res = NULL;
        if (o) {
            json_decref(o);
            res = repair_result(name, "none", "session.json is sound: nothing to repair", NULL, 0,
                                NULL);
        } else {
            char saved[PATH_MAX + 64] = "";
            if (errno != ENOENT && session_json_set_aside(path, saved, sizeof saved)) {
                km_err_set(err, KM_EINTERNAL, "cannot set %s aside: %s", path, strerror(errno));
            } else if (session_save_err(m, s, &why)) {
                km_err_set(err, KM_EINTERNAL, "%s", why.msg);
            } else {
                snprintf(msg, sizeof msg,
                         "session.json rewritten from the running session's options (its "
                         "kernels, workspace and options are kept)%s%s",
                         saved[0] ? "; the damaged file was kept as " : "", saved);
                res =
                    repair_result(name, "rewritten", msg, s->workspace, 1, saved[0] ? saved : NULL);
            }
        }
        pthread_mutex_unlock(&s->lock);
        session_put(m, s);
        return res;
    }
    pthread_mutex_lock(&m->lock);
    json_t *res = NULL;
    session *t = NULL;
    if (find_locked(m, name)) {
        km_err_set(err, KM_EINTERNAL, "session \"%s\" was created meanwhile: try again", name);
        goto out;
    }
    int dc = kmhome_check_dir(dir, 0, &why);
    if (dc > 0) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        goto out;
    }
    if (dc < 0) {
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
        goto out;
    }
    json_t *o = session_json_read(path, &why);
    if (o) {
        json_decref(o);
        res =
            repair_result(name, "none", "session.json is sound: nothing to repair", NULL, 0, NULL);
        goto out;
    }
    if (errno != ENOENT) {
        if (session_json_set_aside(path, aside, sizeof aside)) {
            km_err_set(err, KM_EINTERNAL, "cannot set %s aside: %s", path, strerror(errno));
            goto out;
        }
    } else if (!session_set_aside_find(dir, aside, sizeof aside)) {
        km_err_set(err, KM_EUSAGE,
                   "session \"%s\" has no session.json and none was set aside: nothing to repair "
                   "(close it to remove %s)",
                   name, dir);
        goto out;
    }
    /* the options were in the damaged file: the configuration's defaults;
     * the session's own workspace directory, when there is one, is kept */
    if (!(t = session_alloc(name))) {
        km_err_set(err, KM_EINTERNAL, "out of memory");
        goto out;
    }
    snprintf(t->dir, sizeof t->dir, "%s", dir);
    snprintf(t->outdir, sizeof t->outdir, "%.3000s/outputs/%.64s", m->home, name);
    snprintf(t->workspace, sizeof t->workspace, "%.3000s/workspace", dir);
    snprintf(t->sandbox, sizeof t->sandbox, "%s", m->cfg.sandbox);
    t->network = m->cfg.network;
    snprintf(t->net_allow, sizeof t->net_allow, "%s", m->cfg.network_allow);
    t->own_workspace = 1;
    int made = session_make_workspace(t, &why);
    if (made < 0 || session_save_err(m, t, &why)) {
        km_err_set(err, KM_EINTERNAL, "cannot repair session \"%s\": %s", name, why.msg);
        goto out;
    }
    snprintf(msg, sizeof msg,
             "session \"%s\" recreated with the configuration's defaults (its own options: "
             "memory, cpus, network, python, env, a --workspace elsewhere, were in the "
             "damaged file and are not restored; close it and create it again to set them); "
             "workspace %s %s; the damaged file is kept as %s",
             name, t->workspace, made ? "created empty" : "kept with its files", aside);
    res = repair_result(name, "recreated", msg, t->workspace, !made, aside);
out:
    pthread_mutex_unlock(&m->lock);
    if (t)
        session_free(t);
    return res;
}

json_t *km_files(km_manager *m, const char *name, km_err *err)
{
    session *s = session_get(m, name);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    fsdiff_snap *snap =
        fsdiff_take(s->workspace, m->cfg.files_scan_max, (size_t)m->cfg.files_scan_bytes);
    size_t omitted = 0;
    json_t *files = snap ? fsdiff_list(snap, KM_FILES_LIST_MAX, &omitted) : json_array();
    json_t *why = snap ? fsdiff_incomplete_json(snap, NULL) : fsdiff_untaken_json();
    json_t *o = json_pack("{s:s s:s s:o s:b}", "session", s->name, "workspace", s->workspace,
                          "files", files, "incomplete", why != NULL);
    /* the same shape as an exec result's: truncated.files says what was not
     * walked, files_omitted what was walked but not listed */
    if (o && why)
        json_object_set_new(o, "truncated", json_pack("{s:o}", "files", why));
    else
        json_decref(why);
    if (o && omitted)
        json_object_set_new(o, "files_omitted", json_integer((json_int_t)omitted));
    fsdiff_destroy(&snap);
    session_put(m, s);
    return o;
}

json_t *km_export(km_manager *m, const char *name, const char *kernel_name, km_err *err)
{
    char dir[PATH_MAX];
    session *s = session_get(m, name);
    if (s) {
        snprintf(dir, sizeof dir, "%s", s->dir);
        session_put(m, s);
    } else {
        snprintf(dir, sizeof dir, "%.3000s/sessions/%.64s", m->home, name);
        if (!km_name_valid(name) || access(dir, F_OK)) {
            km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
            return NULL;
        }
    }
    km_err why = {0};
    int bad = 0;
    json_t *nb = export_notebook(dir, name, &m->cfg.langs, kernel_name, &bad, &why);
    if (!nb)
        km_err_set(err, bad ? KM_EUSAGE : KM_EINTERNAL, "%s", why.msg);
    return nb;
}

int km_connection_file(km_manager *m, const char *name, const char *lang, char *out, size_t size,
                       km_err *err)
{
    /* default: the first language of the table (python) */
    int l = lang ? kmcfg_lang_index(&m->cfg, lang) : 0;
    if (l < 0) {
        char known[400];
        return km_err_set(err, KM_EUSAGE, "unknown language \"%s\" (%s)", lang,
                          km_langs_names(&m->cfg.langs, known, sizeof known));
    }
    if (!m->cfg.allow[l])
        return km_err_set(err, KM_EUSAGE, "language \"%s\" is not allowed by the configuration",
                          kmcfg_lang_name(&m->cfg, l));
    session *s = session_get(m, name);
    if (!s)
        return km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
    pthread_mutex_lock(&s->lock);
    int restarted;
    char reason[512];
    km_err why = {0};
    int rc = 0;
    if (slot_ensure(m, s, l, &restarted, reason, sizeof reason, &why))
        rc = km_err_set(err, KM_EKERNEL, "%s", why.msg);
    else {
        /* the next result of the agent still has to say so */
        if (restarted)
            snprintf(s->k[l].pending, sizeof s->k[l].pending, "%s", reason);
        snprintf(out, size, "%s", s->k[l].proc->cf_path);
    }
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    return rc;
}

/* ------------------------------------------------ the daemon API's own calls
 *
 * Session creation without code, workspace files and package installs: the
 * daemon is their only caller (docs/API.md), so one process owns a
 * session's state. Writes and installs hold the session's lock, so a close
 * waits for them (and they see a closed session as gone) instead of
 * deleting directories under them. */

json_t *km_session_create(km_manager *m, const char *name, const km_session_opts *sopts,
                          km_err *err)
{
    if (session_check_name(name, err))
        return NULL;
    int existed = 1;
    session *s = session_acquire(m, name, sopts, &existed, err);
    if (!s)
        return NULL;
    json_t *warnings = existed ? session_ignored_options(m, s, sopts) : NULL;
    json_t *o = json_pack("{s:s s:s s:b s:b}", "session", s->name, "workspace", s->workspace,
                          "created", !existed, "from_pool", s->from_pool);
    if (o && warnings)
        json_object_set(o, "warnings", warnings);
    json_decref(warnings);
    session_put(m, s);
    if (!o)
        km_err_set(err, KM_EINTERNAL, "out of memory");
    return o;
}

json_t *km_file_read(km_manager *m, const char *name, const char *rel, uint64_t offset,
                     uint64_t length, const char *encoding, km_err *err)
{
    session *s = session_get(m, name);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    /* reading needs no lock: like km_files, a snapshot of what is there */
    json_t *r = wsfile_read(s->workspace, rel, offset, length, encoding ? encoding : "auto", err);
    if (r)
        json_object_set_new(r, "session", json_string(s->name));
    session_put(m, s);
    return r;
}

/* Takes the session's lock for an operation that must not overlap close;
 * NULL (err filled) when there is no such session or it was closed while
 * we waited. Release with session_unlock_op. */
static session *session_lock_op(km_manager *m, const char *name, km_err *err)
{
    session *s = session_get(m, name);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    if (s->gone) {
        pthread_mutex_unlock(&s->lock);
        session_put(m, s);
        km_err_set(err, KM_ENOSESSION, "session \"%s\" was closed", name);
        return NULL;
    }
    return s;
}

static void session_unlock_op(km_manager *m, session *s)
{
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
}

json_t *km_file_write(km_manager *m, const char *name, const char *rel, const void *data,
                      size_t len, int append, km_err *err)
{
    session *s = session_lock_op(m, name, err);
    if (!s)
        return NULL;
    km_err why = {0};
    json_t *r = wsfile_write(s->workspace, rel, data, len, append, 1, &why);
    if (r)
        json_object_set_new(r, "session", json_string(s->name));
    else
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
    session_unlock_op(m, s);
    return r;
}

json_t *km_file_remove(km_manager *m, const char *name, const char *rel, km_err *err)
{
    session *s = session_lock_op(m, name, err);
    if (!s)
        return NULL;
    km_err why = {0};
    json_t *r = wsfile_remove(s->workspace, rel, &why);
    if (r)
        json_object_set_new(r, "session", json_string(s->name));
    else
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
    session_unlock_op(m, s);
    return r;
}

json_t *km_with_session_or_name(km_manager *m, const char *name, km_locked_fn fn, void *arg,
                                km_err *err)
{
    if (!km_name_valid(name)) {
        km_err_set(err, KM_EUSAGE, "invalid session name \"%s\"", name ? name : "");
        return NULL;
    }
    /* A live session: under its lock, so close (which removes the package
     * directory) waits for fn. A name without a session: under pkg_mu, so
     * not during a close of the name (wholly before or after it). */
    session *s = session_get(m, name);
    if (s) {
        session_put(m, s);
        if (!(s = session_lock_op(m, name, err)))
            return NULL;
    }
    if (!s)
        pthread_mutex_lock(&m->pkg_mu);
    json_t *r = fn(m, name, s != NULL, arg, err);
    if (s)
        session_unlock_op(m, s);
    else
        pthread_mutex_unlock(&m->pkg_mu);
    return r;
}

/* ------------------------------------------------------------ snapshots */

json_t *km_snapshot(km_manager *m, const char *name, const char *tag, km_err *err)
{
    km_err why = {0};
    if (tag && snap_tag_check(tag, &why)) {
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
        return NULL;
    }
    session *s = session_get(m, name);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    json_t *man = s->gone ? NULL : snap_take(m, s, tag, 1, "requested", &why);
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    if (!man)
        km_err_set(err, strstr(why.msg, "snapshot_max") ? KM_EUSAGE : KM_EINTERNAL, "%s",
                   why.msg[0] ? why.msg : "the session was closed");
    return man;
}

json_t *km_snapshots(km_manager *m, const char *name, km_err *err)
{
    session *s = session_get(m, name);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    json_t *l = snap_list(m, s);
    pthread_mutex_unlock(&s->lock);
    json_t *o = json_pack("{s:s s:o}", "session", s->name, "snapshots", l);
    session_put(m, s);
    return o;
}

json_t *km_restore(km_manager *m, const char *name, const char *tag, km_err *err)
{
    char tagbuf[SNAP_TAG_MAX + 1];
    km_err why = {0};
    if (tag && snap_tag_check(tag, &why)) {
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
        return NULL;
    }
    session *s = session_get(m, name);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    json_t *o = NULL;
    if (!tag) {
        if (snap_newest(m, s, tagbuf, sizeof tagbuf)) {
            km_err_set(err, KM_EUSAGE, "session \"%s\" has no snapshot", name);
            goto out;
        }
        tag = tagbuf;
    }
    int any = 0;
    for (int l = 0; l < m->cfg.langs.n; l++)
        any |= snap_has(m, s, l, tag);
    json_t *list = snap_list(m, s);
    size_t i;
    json_t *v;
    int found = 0;
    json_array_foreach(list, i, v)
    {
        const char *t = json_string_value(json_object_get(v, "tag"));
        if (t && !strcmp(t, tag)) {
            found = 1;
            const char *e = json_string_value(json_object_get(v, "error"));
            if (e) {
                km_err_set(err, KM_EUSAGE, "%s (nothing was changed)", e);
                json_decref(list);
                goto out;
            }
        }
    }
    json_decref(list);
    if (!found) {
        km_err_set(err, KM_EUSAGE, "session \"%s\" has no snapshot \"%s\"", name, tag);
        goto out;
    }
    if (snap_restore_workspace(m, s, tag, &why)) {
        km_err_set(err, KM_EINTERNAL, "%s", why.msg);
        goto out;
    }
    json_t *kernels = json_object();
    for (int l = 0; any && l < m->cfg.langs.n; l++) {
        if (!snap_has(m, s, l, tag))
            continue;
        kslot *k = &s->k[l];
        const char *ln = kmcfg_lang_name(&m->cfg, l);
        if (k->proc && klaunch_alive(k->proc)) {
            json_t *r = snap_load(m, s, l, tag, &why);
            json_object_set_new(kernels, ln,
                                r ? json_pack("{s:o}", "restored", r)
                                  : json_pack("{s:s}", "error", why.msg));
        } else {
            snprintf(k->restore, sizeof k->restore, "%s", tag);
            json_object_set_new(kernels, ln, json_pack("{s:b}", "pending", 1));
        }
    }
    session_save(m, s);
    o = json_pack("{s:s s:s s:o}", "session", s->name, "tag", tag, "kernels", kernels);
out:
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    return o;
}

json_t *km_fork(km_manager *m, const char *src, const char *dst, const char *tag, km_err *err)
{
    char tagbuf[SNAP_TAG_MAX + 1];
    km_err why = {0};
    if (session_check_name(dst, err))
        return NULL;
    if (tag && snap_tag_check(tag, &why)) {
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
        return NULL;
    }
    session *d = session_get(m, dst);
    if (d) {
        session_put(m, d);
        km_err_set(err, KM_EUSAGE, "session \"%s\" exists: a fork makes a new session", dst);
        return NULL;
    }
    session *s = session_get(m, src);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", src);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    if (!tag) {
        json_t *man = snap_take(m, s, NULL, 1, "fork", &why);
        if (!man) {
            pthread_mutex_unlock(&s->lock);
            session_put(m, s);
            km_err_set(err, strstr(why.msg, "snapshot_max") ? KM_EUSAGE : KM_EINTERNAL, "%s",
                       why.msg);
            return NULL;
        }
        snprintf(tagbuf, sizeof tagbuf, "%s", json_string_value(json_object_get(man, "tag")));
        json_decref(man);
        tag = tagbuf;
    }
    /* the new session has the source's options, and a workspace of its own */
    km_session_opts o;
    km_session_opts_init(&o);
    json_t *env = NULL;
    km_sessopt_fork(s, &o, &env);
    pthread_mutex_unlock(&s->lock);
    json_t *created = km_session_create(m, dst, &o, err);
    json_decref(env);
    if (!created) {
        session_put(m, s);
        return NULL;
    }
    json_decref(created);
    d = session_get(m, dst);
    json_t *ret = NULL;
    if (!d) {
        km_err_set(err, KM_EINTERNAL, "the new session \"%s\" went away", dst);
        session_put(m, s);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    int rc = snap_copy_to(m, s, tag, d, tag, &why);
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_lock(&d->lock);
    if (rc == 0)
        rc = snap_restore_workspace(m, d, tag, &why);
    if (rc == 0) {
        for (int l = 0; l < m->cfg.langs.n; l++)
            if (snap_has(m, d, l, tag)) {
                snprintf(d->k[l].restore, sizeof d->k[l].restore, "%s", tag);
                snprintf(d->k[l].pending, sizeof d->k[l].pending,
                         "forked from session \"%s\": the %s kernel is a fresh one", src,
                         kmcfg_lang_name(&m->cfg, l));
            }
        session_save(m, d);
        ret = json_pack("{s:s s:s s:s s:s}", "session", d->name, "from", src, "tag", tag,
                        "workspace", d->workspace);
    } else {
        km_err_set(err, KM_EINTERNAL, "fork of \"%s\" into \"%s\": %s", src, dst, why.msg);
    }
    pthread_mutex_unlock(&d->lock);
    session_put(m, d);
    session_put(m, s);
    if (!ret) {
        km_err e2;
        km_close(m, dst, 0, &e2);
    }
    return ret;
}
