/*
 * session_int.h — the manager's shared state (struct km_manager, session,
 * kslot) and the internal calls between the files that implement km.h:
 *
 *   session.c        the km_* API: manager, session registry, creation, close...
 *   sessionexec.c    code_exec (km_exec): the execution lock, waits, blocks
 *   session_store.c  persistence: session.json, history.jsonl, load/resume
 *   mkcmd.c           a kernel's command line, environment file, interpreter
 *   mkslots.c         kernel slots: start/stop, admission under max_kernels
 *                    and memory_budget, eviction (mkevict.h, mkmem.h)
 *   outprune.c       outputs/ pruning and the start-up scan of ended runs
 *   mkpool.c          the periodic work: warm pool, culling, idle IOPub
 *
 * Not for use outside these files (other code uses km.h and session.h).
 *
 * Ownership: m->list owns its sessions, m->pool its warm-pool entries; a
 * session taken off both lists is freed (session_free) by the last
 * session_put (refs counts the holders). A session owns its kslots; a slot
 * owns its kproc and kclient (slot_stop releases both and the slot's unit of
 * max_kernels).
 *
 * Locking: m->lock guards the session list, the pool, refs, gone and the
 * holder fields; each session's lock serialises everything that touches its
 * kernels. Order: a session lock may be held while taking m->lock, never the
 * reverse; other sessions' locks are only ever try-locked (eviction,
 * culling), so no cycle. m->slot_mu (admission wake-ups) and m->mem_mu (the
 * kernels' measured memory) are leaf locks.
 * busy and interrupt_flag are atomics read without any lock.
 */
#ifndef KERNELMGR_SESSION_INT_H
#define KERNELMGR_SESSION_INT_H

#include "kernelmgr/engine/codeblocks.h"
#include "kernelmgr/engine/mkclient.h"
#include "kernelmgr/engine/mkforeign.h"
#include "kernelmgr/engine/mklaunch.h"
#include "kernelmgr/engine/netopt.h"
#include "kernelmgr/engine/km.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>

/* A session's own directories are kept in fixed arrays (below); every path
 * built from them is checked for truncation or built to its length
 * (common/cm_path.h). A truncated error message is acceptable. */

typedef struct kslot {
    kproc *proc;
    kclient *client;
    kforeign *foreign; /* other clients' cells on this kernel (with client) */
    char pending[512]; /* why the next result must say "restarted, state lost" */
    km_err start_err;  /* slots_prestart's failure, for the block that needs it */
    double last_used;
    /* admission's account of this kernel (mkslots.c), guarded by m->mem_mu:
     * on m->charged from its admission until its unit is released; charged
     * KM_ADMIT_HEADROOM until it answered (mem_pid set), then what it was
     * measured to use (mem_bytes, at mem_at; 0: not yet) */
    struct kslot *mem_next;
    int mem_on;
    pid_t mem_pid;
    /* the session sandbox's holder, when this kernel is the one of its
     * session charged the sandbox (its cgroup: every kernel's worker) */
    pid_t mem_sbx_pid;
    uint64_t mem_bytes;
    double mem_at;
    /* snapshots (snapshot.c): the tag its next start restores ("": none;
     * persisted in session.json), what the last restore said for the next
     * result (owned, NULL: nothing to say), cell seconds since the last
     * periodic snapshot, and the worker generation its last snapshot or
     * restore saw (0: none; a different one means the worker died) */
    char restore[65];
    json_t *restored;
    double snap_secs;
    long long snap_gen;
    /* its kernel is not one of kernelmgr's (its kernel_info has no
     * "kernelmgr": a Jupyter kernelspec's), so it has no snapshot request
     * to answer: a snapshot reports its state lost at once */
    int snap_none;
} kslot;

typedef struct session {
    char name[KM_NAME_MAX + 1];
    char dir[PATH_MAX - 64];
    char workspace[PATH_MAX - 64];
    char outdir[PATH_MAX - 64];
    char pool_dir[PATH_MAX - 64]; /* pooled: the pool entry to remove at close */
    int own_workspace;
    /* own_workspace made by this manager: the directory's device and inode
     * (0 when not recorded), checked before close removes it */
    unsigned long long ws_dev, ws_ino;
    int network;                      /* KM_NET_* (netopt.h), -1: the configuration's */
    char net_allow[KM_NET_ALLOW_MAX]; /* KM_NET_ALLOW: the canonical list, else "" */
    unsigned long long memory;
    char python[1024];
    char sandbox[16];
    /* its own plain options (sessopt.def): a BOOL -1 (the configuration's),
     * 0, 1; a NUMBER or SIZE 0 (the configuration's) */
#include "kernelmgr/engine/sessopt_fields.def"
    json_t *env; /* owned: the session's own {NAME: "value"} (on top of the
                    configuration's), NULL when none; persisted in session.json */
    pthread_mutex_t lock;
    kslot k[KM_LANG_MAX];
    atomic_int busy;
    atomic_int interrupt_flag;
    int refs;
    int gone; /* closed: no new work */
    /* why it is gone when not by a close (its creation failed), for the
     * requests that found it meanwhile; "" = closed */
    char gone_why[sizeof(((km_err *)0)->msg)];
    int from_pool; /* its kernels were pre-started by the warm pool */
    /* the session's one sandbox (mksbx.c): its holder, NULL while there is
     * none, and the holder's socket (stable for the session's life, so
     * that a restarted holder serves kernels that outlived the old one) */
    struct kproc *sbx;
    char sbx_sock[PATH_MAX - 64];
    int pool_entry; /* still in the warm pool: never evicts for itself */
    double created, last_used;
    unsigned seq;
    /* the execution holding lock (km_exec), for a waiting one to name it;
     * guarded by m->lock */
    int holding, holder_pid;
    double holder_since;
    struct session *next;
} session;

struct km_manager {
    kmcfg cfg;
    char home[PATH_MAX - 128];
    char run_dir[PATH_MAX - 128];
    pthread_mutex_t lock;
    session *list;
    session *pool;
    atomic_int live;
    atomic_int draining; /* km_set_draining: no new sessions */
    /* admission: signalled (with slot_gen bumped, under slot_mu, a leaf
     * lock) whenever a kernel stops or a session stops running code, so a
     * start waiting for a slot retries at once instead of at its next poll */
    pthread_mutex_t slot_mu;
    pthread_cond_t slot_cv;
    unsigned long slot_gen;
    /* admission under memory_budget (mkslots.c): the kernels holding a unit
     * of max_kernels (each kslot's mem_* fields) and the host's
     * MemAvailable, guarded by mem_mu, a leaf lock held while measuring */
    pthread_mutex_t mem_mu;
    struct kslot *charged;
    uint64_t mem_budget; /* cfg.memory_budget, or the auto budget (mkmem.h) */
    uint64_t mem_used;   /* what the charged kernels were last counted to use */
    uint64_t host_avail; /* MemAvailable at host_at (0: unknown) */
    double host_at;
    /* held by close from taking a session off the list until its package
     * directory is gone, and by an install for a name that has no session:
     * such an install runs wholly before or wholly after a close of that
     * name (lock order: session lock, pkg_mu, lock) */
    pthread_mutex_t pkg_mu;
    int snap_on_stop; /* a daemon's manager: stopping snapshots the sessions first */
    int lifeline[2];  /* klaunch_lifeline_open: kept for the manager's life */
    int owner_held;   /* klaunch_owner_hold(run_dir) succeeded */
};

/* ------------------------------------------------------------ session.c */

/* The live session named name with a reference taken (session_put), or
 * NULL: what engine files beside session.c look sessions up with. */
session *session_ref(km_manager *m, const char *name);
/* Drops a reference taken under m->lock (refs++); frees a closed session
 * whose last reference it was. Caller holds no lock of m. */
void session_put(km_manager *m, session *s);
/* 0 when name is a valid session name, else KM_EUSAGE in err naming the
 * rule. */
int session_check_name(const char *name, km_err *err);
/* The session named name with a reference taken (session_put), created
 * with o when there is none (*existed then 0); NULL with err. */
session *session_acquire(km_manager *m, const char *name, const km_session_opts *o, int *existed,
                         km_err *err);
/* New: warnings for options o given to the existing session s whose value
 * differs from the session's (reported, not applied: applying them means a
 * restart), or NULL when there are none. */
json_t *session_ignored_options(km_manager *m, session *s, const km_session_opts *o);

/* ------------------------------------------------------ session_store.c */

/* new (session_free): a session named name with no kernels, no directories;
 * NULL when out of memory. */
session *session_alloc(const char *name);
/* Frees s (its env and lock); its kernels must be stopped. */
void session_free(session *s);
/* The largest session.json read (its env is at most KENV_MAX_TOTAL, escaped). */
#define SESSION_JSON_MAX (4u << 20)
/* new (json_decref): the session.json at path, read as the home's trusted
 * state (cm_read_regular, CM_RR_OWNED, SESSION_JSON_MAX) and checked to hold
 * what session_load relies on (an object; "workspace" an absolute path;
 * "own_workspace" a boolean; "options" an object whose "memory" is a
 * non-negative integer). NULL with errno ENOENT when there is none, else
 * NULL with the reason in why ("is not valid JSON (line 3, column 1)"):
 * the file's contents are never part of it. */
json_t *session_json_read(const char *path, km_err *why);
/* new (session_free): sessions/NAME/session.json loaded; kernels of an
 * earlier manager it lists are killed and marked pending. NULL with why ""
 * when there is none. NULL with the reason in why when the session is
 * damaged: a session.json that cannot be used is renamed aside
 * (session.json.corrupt-TIME, never overwritten) and why names the file, the
 * reason and the repair; a session whose session.json was set aside earlier
 * stays damaged until it is repaired (km_session_repair). */
session *session_load(km_manager *m, const char *name, km_err *why);
/* Renames path aside as path.corrupt-TIME (never over another file). 0 with
 * the new name in out, or -1 with errno. */
int session_json_set_aside(const char *path, char *out, size_t outlen);
/* 1 with the path of the newest session.json.corrupt-* in dir in out, else 0. */
int session_set_aside_find(const char *dir, char *out, size_t outlen);
/* Writes s's session.json: temp file, fsync, rename, fsync of the
 * directory; once it returns 0 the options survive a power loss (docs/LIFECYCLE.md
 * "Durability"). For a session's creation and repair, the writes that
 * decide its options. 0, or -1 with the reason. */
int session_save_err(km_manager *m, session *s, km_err *err);
/* Makes s->workspace (mkdir, 0700, then the home's check: an existing
 * directory is used only when it is ours alone) and records its device and
 * inode. 1 when it was made, 0 when it existed, -1 with the reason. */
int session_make_workspace(session *s, km_err *err);
/* Removes s's workspace when s owns it and it is the manager's: it lies
 * below the home, or its device and inode are those recorded when it was
 * made. Otherwise it is kept and a warning naming it is appended to warnings
 * (or, NULL, written to stderr). */
void session_remove_workspace(km_manager *m, session *s, json_t *warnings);
/* The same without the directory's fsync, a failure logged on stderr: for
 * the writes that change only what a power loss ends anyway (kernel pids,
 * pending notes). The file is fsynced before the rename, so a power loss
 * leaves the previous session.json or this one, whole. */
void session_save(km_manager *m, session *s);
/* Kills the kernel pid of an earlier manager when /proc shows it is the one
 * of connection file cf, and removes cf. */
void kill_stale(int pid, const char *cf);

/* --------------------------------------------------------------- mkcmd.c */

/* Checks own (a session's env, or NULL) with the configuration's against
 * kenv.h's rules. 0, or -1 with the reason. */
int session_env_check(const km_manager *m, const json_t *own, km_err *err);
/* Fills cmd (klaunch_cmd_clear to release) with the command of s's kernel
 * of language lang, writing its environment file. 0, or -1 with err. */
int kernel_cmd(km_manager *m, session *s, int lang, klaunch_cmd *cmd, km_err *err);
/* Adds the session's effective --memory and --cpus (its own, else the
 * configuration's; none when unset) to cmd, as kernels and the session
 * sandbox's holder both take them. 0, or -1 when cmd is full. */
int kcmd_add_limits(km_manager *m, session *s, klaunch_cmd *cmd);
/* borrowed: the session's effective network option in the kernels' text
 * form ("on", "off", "allow:..."), its own else the configuration's, as
 * kernels and the session sandbox's holder both take it (km_net_text). */
const char *kcmd_net_text(const km_manager *m, const session *s);
/* Writes the package root s's kernels see (PATH_MAX): a warm-pool entry's
 * pool_dir/packages, and after the hand-out still that path (pkgdirs_adopt
 * left a symlink there to the session's root), so a kernel started later
 * names the very path the session sandbox bound when it was a pool entry;
 * else home/packages/NAME. 0, or -1. */
int kcmd_pkg_root(const km_manager *m, const session *s, char *root);
/* new (free()): the interpreter the manager resolved for sessions that
 * chose none (see mkcmd.c), or NULL. */
char *kcmd_python_resolved(const char *explicit_py, const char *workspace);

/* --------------------------------------------------------------- mksbx.c */

/* One sandbox per session: when the session's kernels share one sandbox
 * (strict, "session_sandbox") and its holder
 * (kernelmgr-sandbox) is not running, starts it. Caller holds s->lock.
 * 0 (also when the session has no such sandbox), or -1 with err. */
int ksbx_ensure(km_manager *m, session *s, km_err *err);
/* The holder's socket for the session's kernels, NULL when it has none. */
const char *ksbx_socket(const session *s);
/* Stops the holder, and with it the sandbox and every process in it.
 * Caller holds s->lock; after the session's kernels stopped. */
void ksbx_stop(session *s);

/* ------------------------------------------------------------- mkslots.c */

/* The memory a kernel that has not answered yet is counted as using, and
 * the room admission keeps for a new one: a kernel's start and first
 * imports (an idle Python kernel uses about 7 MiB, a Bash one 2.5 MiB). */
#define KM_ADMIT_HEADROOM (64ull << 20)
/* How long a kernel's measured memory is reused before it is read again. */
#define KM_MEM_MAX_AGE 2.0

/* Sets up admission's state of m (its memory budget: cfg.memory_budget, or
 * the auto budget of this host); slots_fini releases it. */
void slots_init(km_manager *m);
void slots_fini(km_manager *m);
/* 1 when n more kernels fit now without stopping one: under max_kernels
 * and, given KM_ADMIT_HEADROOM each, under the memory budget (the warm
 * pool only uses room). */
int slots_room(km_manager *m, unsigned n);
/* What admission counts now: the live kernels' measured memory (a kernel
 * still starting counted as KM_ADMIT_HEADROOM) and the budget. */
void slots_memory(km_manager *m, uint64_t *used, uint64_t *budget);
/* Wakes one start waiting for a unit of max_kernels. */
void slot_changed(km_manager *m);
/* Stops slot k's kernel (if any) and releases its unit of max_kernels.
 * Caller holds the slot's session lock. */
void slot_stop(km_manager *m, kslot *k);
/* Stops every kernel of s at once. Caller holds s->lock. */
void slots_stop_all(km_manager *m, session *s);
/* Reads what slot k's kernel sent that no execution waits for, up to max
 * messages (the rest of a flood, up to a bound, is dropped unread): other
 * clients' cells go to the history (kforeign). Caller holds the slot's
 * session lock. */
void slot_follow(kslot *k, unsigned long max);
/* Starts the kernel of slot l (admission, launch, wait until it answers).
 * Caller holds s->lock. 0, or -1 with err. */
int slot_start(km_manager *m, session *s, int l, km_err *err);
/* Starts the kernels blocks will need at once when units are free now.
 * Caller holds s->lock. */
void slots_prestart(km_manager *m, session *s, const cblock_list *blocks);
/* Makes sure slot l has a live kernel; *restarted / reason say whether the
 * result must report a fresh kernel. Caller holds s->lock. 0, or -1 with err. */
int slot_ensure(km_manager *m, session *s, int l, int *restarted, char *reason, size_t rsize,
                km_err *err);

/* ----------------------------------------------------------- outprune.c */

/* Bytes of the regular files directly in dir (a session's outputs/NAME). */
uint64_t outputs_used(const char *dir);
/* Bounds outputs/ (runs kept, their age; orphans: of gone sessions too). */
void outputs_prune(km_manager *m, int orphans);
/* Removes package directories and kernel history files of ended runs. */
void prune_orphans(km_manager *m);
/* Removes the sessions of one-shot runs whose process has ended. */
void reap_dead_runs(km_manager *m);
/* 1 when session name belongs to another live manager process. */
int owned_by_live_manager(const km_manager *m, const char *name);

#endif
