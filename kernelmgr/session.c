/*
 * session.c — the manager: sessions, their kernels and code_exec (km.h).
 *
 * Locking: m->lock guards the session list, the pool and the live-kernel
 * count; each session's lock serialises everything that touches its kernels.
 * Order: a session lock may be held while taking m->lock, never the reverse;
 * other sessions' locks are only ever try-locked (eviction), so no cycle.
 */
#include "kernelmgr/session.h"
#include "kernelmgr/codeblocks.h"
#include "kernelmgr/codeexec.h"
#include "kernelmgr/export.h"
#include "kernelmgr/fsdiff.h"
#include "kernelmgr/kmfs.h"
#include "kernelmgr/kclient.h"
#include "kernelmgr/klaunch.h"
#include "kernelmgr/pkginstall.h"
#include "kernelmgr/result.h"
#include "kernelmgr/wsfile.h"
#include "kernels/python/pydetect.h"
#include "kernels/server/kenv.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Messages and paths here are bounded by construction; a truncated error
 * message is acceptable, a truncated path is never used to create files
 * (PATH_MAX is far above what mkdir would accept anyway). */
/* Paths are built into fixed PATH_MAX buffers whose overflow is checked
 * where it matters; gcc's truncation guesses are noise here (clang has no
 * such warning). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

typedef struct kslot {
    kproc *proc;
    kclient *client;
    char pending[512];    /* why the next result must say "restarted, state lost" */
    char start_err[1024]; /* slots_prestart's failure, for the block that needs it */
    double last_used;
} kslot;

typedef struct session {
    char name[KM_NAME_MAX + 1];
    char dir[PATH_MAX - 64];
    char workspace[PATH_MAX - 64];
    char outdir[PATH_MAX - 64];
    char pool_dir[PATH_MAX - 64]; /* pooled: the pool entry to remove at close */
    int own_workspace;
    int network;
    unsigned long long memory;
    double cpus;     /* --cpus of its kernels; 0 = the configuration's */
    double cpu_time; /* --cpu-time of its kernels; 0 = the configuration's */
    char python[1024];
    char sandbox[16];
    json_t *env; /* owned: the session's own {NAME: "value"} (on top of the
                    configuration's), NULL when none; persisted in session.json */
    pthread_mutex_t lock;
    kslot k[KMCFG_NLANG];
    atomic_int busy;
    atomic_int interrupt_flag;
    int refs;
    int gone;       /* closed: no new work */
    int from_pool;  /* its kernels were pre-started by the warm pool */
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
    /* admission: signalled (with slot_gen bumped, under slot_mu, a leaf
     * lock) whenever a kernel stops or a session stops running code, so a
     * start waiting for a slot retries at once instead of at its next poll */
    pthread_mutex_t slot_mu;
    pthread_cond_t slot_cv;
    unsigned long slot_gen;
    int lifeline[2]; /* klaunch_lifeline_open: kept for the manager's life */
    int owner_held;  /* klaunch_owner_hold(run_dir) succeeded */
};

/* ---------------------------------------------------------------- helpers */

static void session_free(session *s);
static void session_put(km_manager *m, session *s);
static int session_env_check(const km_manager *m, const json_t *own, char *err, size_t errlen);

static int kerr(km_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int kerr(km_err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        e->code = code;
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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
    o->network = -1;
}

int session_rmtree(const char *path)
{
    return wsfile_rmtree(path, NULL, 0); /* fd-based, never follows; failures on stderr */
}

/* Rewrites path with its newest complete lines that fit in keep bytes
 * (temp + rename: the old file or the new one, never a mix). 0 or -1. */
static int history_compact(const char *path, uint64_t keep)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errno == ENOENT ? 0 : -1;
    char **lines = NULL;
    size_t n = 0, cap = 0;
    char *line = NULL;
    size_t lcap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &lcap, f)) > 0) {
        if (line[len - 1] != '\n')
            break; /* a torn last record is dropped */
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 256;
            char **nl = realloc(lines, nc * sizeof *nl);
            if (!nl) {
                rc = -1;
                break;
            }
            lines = nl;
            cap = nc;
        }
        if (!(lines[n] = strdup(line))) {
            rc = -1;
            break;
        }
        n++;
    }
    free(line);
    fclose(f);
    size_t from = n;
    uint64_t total = 0;
    while (rc == 0 && from > 0 && total + strlen(lines[from - 1]) <= keep)
        total += strlen(lines[--from]);
    char *tmp = NULL;
    if (rc == 0 && asprintf(&tmp, "%s.tmp", path) < 0)
        rc = -1;
    int fd = rc ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (rc == 0 && fd < 0)
        rc = -1;
    for (size_t i = from; rc == 0 && i < n; i++)
        rc = jp_write_all(fd, lines[i], strlen(lines[i]));
    int err = errno;
    if (fd >= 0 && close(fd) && rc == 0) {
        rc = -1;
        err = errno;
    }
    if (rc == 0 && rename(tmp, path)) {
        rc = -1;
        err = errno;
    }
    if (rc && tmp)
        unlink(tmp);
    free(tmp);
    for (size_t i = 0; i < n; i++)
        free(lines[i]);
    free(lines);
    errno = err;
    return rc;
}

static int history_write(const char *session_dir, json_t *line, uint64_t max, char *err,
                         size_t errlen);

int session_history_start(const char *session_dir, const char *id, const char *language,
                          const char *code, uint64_t max, char *err, size_t errlen)
{
    json_t *line =
        json_pack("{s:s s:s s:s s:s s:f s:s}", "event", "started", "id", id, "language", language,
                  "code", code, "time", wall_now(), "manager", export_manager_id());
    if (!line) {
        snprintf(err, errlen, "cannot record the cell in the session history: out of memory");
        return -1;
    }
    return history_write(session_dir, line, max, err, errlen);
}

int session_history_append(const char *session_dir, const char *id, const char *language,
                           const char *code, const json_t *result, const json_t *nb_outputs,
                           uint64_t max, char *err, size_t errlen)
{
    json_t *line = json_pack("{s:s s:s s:O s:O s:O}", "language", language, "code", code,
                             "execution_count", json_object_get(result, "execution_count"),
                             "status", json_object_get(result, "status"), "outputs",
                             nb_outputs ? nb_outputs : json_array());
    if (line && id) {
        json_object_set_new(line, "event", json_string("finished"));
        json_object_set_new(line, "id", json_string(id));
    }
    if (!line) {
        snprintf(err, errlen, "cannot write the session history: out of memory");
        return -1;
    }
    return history_write(session_dir, line, max, err, errlen);
}

/* Appends line (stolen) to session_dir/history.jsonl within max. */
static int history_write(const char *session_dir, json_t *line, uint64_t max, char *err,
                         size_t errlen)
{
    char *path = NULL;
    if (asprintf(&path, "%s/history.jsonl", session_dir) < 0) {
        json_decref(line);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    char *s = json_dumps(line, JSON_COMPACT);
    if (s && max && strlen(s) + 1 > max / 2) {
        /* this cell's outputs alone would take most of the history: they
         * stay in the result (and outputs/), the history says where they went */
        char note[300];
        snprintf(note, sizeof note,
                 "[kernelmgr: the outputs of this cell (%zu bytes) are not kept in the session "
                 "history (history_max=%llu bytes); see the result of the execution]\n",
                 strlen(s), (unsigned long long)max);
        if (json_object_get(line, "outputs"))
            json_object_set_new(line, "outputs",
                                json_pack("[{s:s s:s s:s}]", "output_type", "stream", "name",
                                          "stderr", "text", note));
        free(s);
        s = json_dumps(line, JSON_COMPACT);
        if (s && strlen(s) + 1 > max / 2) {
            /* the code alone is too long to keep */
            json_object_set_new(line, "code", json_string("# (code too long for the history)"));
            free(s);
            s = json_dumps(line, JSON_COMPACT);
        }
    }
    json_decref(line);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        free(path);
        return -1;
    }
    size_t n = strlen(s);
    s[n++] = '\n'; /* replaces the NUL: written with an explicit length */
    int rc = -1;
    struct stat st;
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0 && fstat(fd, &st) == 0) {
        off_t size = st.st_size;
        char last = '\n';
        if (size > 0 && pread(fd, &last, 1, size - 1) != 1)
            last = '\n';
        if (last != '\n' || (max && (uint64_t)size + n > max)) {
            /* a torn last record (a crash, a full disk) or the cap: keep the
             * newest complete records in half the cap */
            close(fd);
            fd = -1;
            /* a torn record alone costs no complete record */
            if (history_compact(path, max && (uint64_t)size + n > max ? max / 2 : UINT64_MAX) == 0)
                fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
            if (fd >= 0 && fstat(fd, &st) == 0)
                size = st.st_size;
        }
        if (fd >= 0) {
            if (jp_write_all(fd, s, n) == 0) {
                rc = 0;
            } else {
                int e = errno;
                if (ftruncate(fd, size)) { /* take back a partial record */
                }
                errno = e;
            }
        }
    }
    if (rc)
        snprintf(err, errlen, "cannot write the session history: %s (%s)", strerror(errno), path);
    if (fd >= 0)
        close(fd);
    free(s);
    free(path);
    return rc;
}

/* ---------------------------------------------------------------- persistence */

/* Writes session.json (temp + rename). 0, or -1 with the reason in err; the
 * temp file never stays behind. */
static int session_save_err(km_manager *m, session *s, char *err, size_t errlen)
{
    (void)m;
    json_t *kernels = json_object();
    for (int l = 0; l < KMCFG_NLANG; l++)
        if (s->k[l].proc)
            json_object_set_new(kernels, kmcfg_lang_name(l),
                                json_pack("{s:i s:s}", "pid", (int)s->k[l].proc->pid,
                                          "connection_file", s->k[l].proc->cf_path));
    json_t *o =
        json_pack("{s:s s:s s:b s:s s:f s:i s:b s:{s:b s:I s:s s:s} s:o}", "name", s->name,
                  "workspace", s->workspace, "own_workspace", s->own_workspace, "pool_dir",
                  s->pool_dir, "created", s->created, "manager_pid", (int)getpid(), "from_pool",
                  s->from_pool, "options", "network", s->network, "memory", (json_int_t)s->memory,
                  "python", s->python, "sandbox", s->sandbox, "kernels", kernels);
    /* the session's variables (the directory and the file are the user's
     * alone: 0700 and 0600), so a restarted manager gives them back */
    if (o && s->env)
        json_object_set(json_object_get(o, "options"), "env", s->env);
    if (o && s->cpus > 0)
        json_object_set_new(json_object_get(o, "options"), "cpus", json_real(s->cpus));
    if (o && s->cpu_time > 0)
        json_object_set_new(json_object_get(o, "options"), "cpu_time", json_real(s->cpu_time));
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%.4000s/session.json", s->dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    /* temp + rename: a full disk leaves the previous session.json intact */
    int rc = -1;
    if (!o) {
        snprintf(err, errlen,
                 "cannot save %s: the session's options (workspace, python, env) are not "
                 "UTF-8 text",
                 path);
    } else if (json_dump_file(o, tmp, JSON_INDENT(1)) == 0 && chmod(tmp, 0600) == 0 &&
               rename(tmp, path) == 0) {
        rc = 0;
    } else {
        snprintf(err, errlen, "cannot save %s: %s", path, strerror(errno));
        unlink(tmp);
    }
    json_decref(o);
    return rc;
}

static void session_save(km_manager *m, session *s)
{
    char why[PATH_MAX + 200];
    if (session_save_err(m, s, why, sizeof why))
        fprintf(stderr, "kernelmgr: %s\n", why);
}

/* A kernel of an earlier manager may still run: kill it, but only when
 * /proc says it is really that kernel (its argv names the connection file). */
static void kill_stale(int pid, const char *cf)
{
    if (pid <= 1 || !cf || !*cf)
        return;
    char path[64], buf[8192];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return;
    for (ssize_t i = 0; i < n; i++)
        if (!buf[i])
            buf[i] = ' ';
    buf[n] = 0;
    if (strstr(buf, cf))
        klaunch_kill_tree(pid);
    unlink(cf);
}

static session *session_alloc(const char *name)
{
    session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    snprintf(s->name, sizeof s->name, "%s", name);
    pthread_mutex_init(&s->lock, NULL);
    s->network = -1;
    s->created = s->last_used = wall_now();
    return s;
}

/* Loads sessions/NAME/session.json into a session (kernels not started).
 * Kernels it lists are from an earlier manager: killed and marked pending. */
static session *session_load(km_manager *m, const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.3000s/sessions/%.64s/session.json", m->home, name);
    json_t *o = json_load_file(path, 0, NULL);
    if (!o)
        return NULL;
    session *s = session_alloc(name);
    if (!s) {
        json_decref(o);
        return NULL;
    }
    snprintf(s->dir, sizeof s->dir, "%.3000s/sessions/%.64s", m->home, name);
    snprintf(s->outdir, sizeof s->outdir, "%.3000s/outputs/%.64s", m->home, name);
    const char *ws = json_string_value(json_object_get(o, "workspace"));
    snprintf(s->workspace, sizeof s->workspace, "%s", ws ? ws : "");
    if (!ws) {
        snprintf(s->workspace, sizeof s->workspace, "%.3000s/workspace", s->dir);
    }
    s->own_workspace = json_is_true(json_object_get(o, "own_workspace"));
    s->from_pool = json_is_true(json_object_get(o, "from_pool"));
    const char *pd = json_string_value(json_object_get(o, "pool_dir"));
    snprintf(s->pool_dir, sizeof s->pool_dir, "%s", pd ? pd : "");
    json_t *created = json_object_get(o, "created");
    if (json_is_number(created))
        s->created = json_number_value(created);
    json_t *opt = json_object_get(o, "options");
    s->network = json_is_boolean(json_object_get(opt, "network"))
                     ? json_is_true(json_object_get(opt, "network"))
                     : m->cfg.network;
    s->memory = (unsigned long long)json_integer_value(json_object_get(opt, "memory"));
    /* absent, or not a positive number: the configuration's */
    double cpus = json_number_value(json_object_get(opt, "cpus"));
    double cpu_time = json_number_value(json_object_get(opt, "cpu_time"));
    s->cpus = cpus >= 0.01 && cpus <= 4096 ? cpus : 0;
    s->cpu_time = cpu_time >= 0.001 && cpu_time <= 86400.0 * 365 ? cpu_time : 0;
    const char *py = json_string_value(json_object_get(opt, "python"));
    snprintf(s->python, sizeof s->python, "%s", py ? py : "");
    const char *sb = json_string_value(json_object_get(opt, "sandbox"));
    snprintf(s->sandbox, sizeof s->sandbox, "%s", sb && *sb ? sb : m->cfg.sandbox);
    json_t *env = json_object_get(opt, "env");
    char why[512];
    if (env && session_env_check(m, env, why, sizeof why) == 0)
        s->env = json_deep_copy(env);
    else if (env)
        fprintf(stderr, "kernelmgr: session %s: its saved env is not used: %s\n", name, why);
    const char *lk;
    json_t *kv;
    json_object_foreach(json_object_get(o, "kernels"), lk, kv)
    {
        int l = kmcfg_lang_index(lk);
        if (l < 0)
            continue;
        kill_stale((int)json_integer_value(json_object_get(kv, "pid")),
                   json_string_value(json_object_get(kv, "connection_file")));
        snprintf(s->k[l].pending, sizeof s->k[l].pending,
                 "the manager restarted; the %s kernel was replaced by a fresh one and its "
                 "state was lost (workspace kept)",
                 kmcfg_lang_name(l));
    }
    json_decref(o);
    return s;
}

/* ---------------------------------------------------------------- kernels */

/* new: the variables of a session's code: the configuration's "env" with
 * the session's own on top. NULL when out of memory. */
static json_t *session_env_merged(const km_manager *m, const json_t *own)
{
    json_t *all = m->cfg.env ? json_deep_copy(m->cfg.env) : json_object();
    if (all && own && json_object_update(all, (json_t *)own)) {
        json_decref(all);
        return NULL;
    }
    return all;
}

/* Checks own (a session's env, or NULL), together with the configuration's,
 * against kenv.h's rules and limits. 0, or -1 with the reason. */
static int session_env_check(const km_manager *m, const json_t *own, char *err, size_t errlen)
{
    if (own && !json_is_object(own)) {
        snprintf(err, errlen, "env must be an object of NAME: \"value\"");
        return -1;
    }
    json_t *all = session_env_merged(m, own);
    if (!all) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = kenv_check_object(NULL, "env", all, err, errlen);
    json_decref(all);
    return rc;
}

/* Writes a kernel's variables (data[0..len): NAME=VALUE entries, each
 * ending in a NUL) to s->dir/env for its --env-file: never on a command line,
 * where /proc/PID/cmdline shows them to every user of the host. A 0600 file
 * created under a fresh name (O_EXCL | O_NOFOLLOW) and renamed over the old
 * one, so a kernel reads either the whole old or the whole new file; it goes
 * with the session directory. The path (new) or NULL with a reason. */
static char *write_env_file(const session *s, const char *data, size_t len, char *err,
                            size_t errlen)
{
    char *path = NULL, *tmp = NULL;
    char u[37];
    jp_uuid4(u);
    if (asprintf(&path, "%s/env", s->dir) < 0) {
        path = NULL;
        goto oom;
    }
    if (asprintf(&tmp, "%s/.env-%.8s.tmp", s->dir, u) < 0) {
        tmp = NULL;
        goto oom;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "cannot write the kernel's environment file %s: %s", tmp,
                 strerror(errno));
        goto fail;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            snprintf(err, errlen, "cannot write the kernel's environment file %s: %s", tmp,
                     w < 0 ? strerror(errno) : "short write");
            close(fd);
            unlink(tmp);
            goto fail;
        }
        off += (size_t)w;
    }
    if (close(fd) < 0 || rename(tmp, path) < 0) {
        snprintf(err, errlen, "cannot write the kernel's environment file %s: %s", path,
                 strerror(errno));
        unlink(tmp);
        goto fail;
    }
    free(tmp);
    return path;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    free(tmp);
    free(path);
    return NULL;
}

/* ---------------------------------------------------------------- interpreter, shared
 *
 * A Python kernel of a session that chose no interpreter would detect one
 * itself, running the probe (pydetect.h) on the host: under a burst of
 * kernel starts that is one probe per kernel (a pyenv shim is not cacheable
 * by the kernel's own probe cache). The manager resolves it once per inputs
 * (config python, $KERNELMGR_PYTHON, $VIRTUAL_ENV, $PATH, $PYENV_VERSION,
 * $PYENV_ROOT, $HOME) with the same detection and passes `--python
 * INTERPRETER` (a venv's bin/python as is, a shim resolved to the real
 * interpreter). The answer is reused for KM_PYRESOLVE_TTL seconds (a changed
 * `pyenv global` is seen after that). Never for a workspace with a .venv
 * (the kernel finds it; nothing of the workspace is resolved on the host),
 * nor an answer that lies in the workspace. A failed resolution passes
 * nothing: the kernel detects and reports itself. */

#define KM_PYRESOLVE_TTL 60.0

static struct {
    pthread_mutex_t mu;
    char *key;
    char *interp; /* NULL: resolution failed */
    double at;
} pyres = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int path_within(const char *p, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    return !strncmp(p, dir, n) && (p[n] == '/' || p[n] == 0);
}

/* new (free()): the interpreter to pass as --python, or NULL for "let the
 * kernel detect". explicit_py: the configuration's python ("" = none). */
static char *python_resolved(const char *explicit_py, const char *workspace)
{
    char *venv = NULL;
    struct stat st;
    if (asprintf(&venv, "%s/.venv", workspace) < 0)
        return NULL;
    int has_venv = lstat(venv, &st) == 0;
    free(venv);
    if (has_venv)
        return NULL;
    const char *vars[] = {"KERNELMGR_PYTHON", "VIRTUAL_ENV", "PATH",
                          "PYENV_VERSION",    "PYENV_ROOT",  "HOME"};
    char *key = NULL;
    size_t klen = 0;
    FILE *ks = open_memstream(&key, &klen);
    if (!ks)
        return NULL;
    fprintf(ks, "python=%s", explicit_py);
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        fprintf(ks, "%c%s%c%s", 1, vars[i], v ? '=' : '!', v ? v : "");
    }
    if (fclose(ks)) {
        free(key);
        return NULL;
    }
    char *out = NULL;
    pthread_mutex_lock(&pyres.mu);
    double now = kclient_now();
    if (!pyres.key || strcmp(pyres.key, key) || now - pyres.at > KM_PYRESOLVE_TTL ||
        (pyres.interp && access(pyres.interp, X_OK))) {
        pydetect_sources src = {
            .explicit_path = explicit_py[0] ? explicit_py : NULL,
            .env_python = getenv("KERNELMGR_PYTHON"),
            .workspace = NULL,
            .virtual_env = getenv("VIRTUAL_ENV"),
            .path_env = getenv("PATH"),
        };
        pydetect_info info = {0};
        char why[512];
        free(pyres.interp);
        pyres.interp = NULL;
        if (pydetect_find(&src, &info, why, sizeof why) == 0 && info.interpreter &&
            !info.workspace_venv)
            pyres.interp = strdup(info.interpreter);
        else
            fprintf(stderr,
                    "kernelmgr: no shared Python interpreter (each kernel detects its "
                    "own): %s\n",
                    why);
        pydetect_info_clear(&info);
        free(pyres.key);
        pyres.key = key;
        key = NULL;
        pyres.at = kclient_now();
    }
    if (pyres.interp && !path_within(pyres.interp, workspace))
        out = strdup(pyres.interp);
    pthread_mutex_unlock(&pyres.mu);
    free(key);
    return out;
}

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
static void slot_changed(km_manager *m)
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
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += (long)(KM_ADMIT_POLL_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&m->slot_mu);
        while (m->slot_gen == gen && pthread_cond_timedwait(&m->slot_cv, &m->slot_mu, &ts) == 0)
            ;
        pthread_mutex_unlock(&m->slot_mu);
    }
    double waited = kclient_now() - t0;
    if (waited >= 0.5)
        fprintf(stderr,
                "kernelmgr: %s/%s waited %.1f s for a kernel slot (max_kernels=%u, %d evicted)\n",
                s->name, kmcfg_lang_name(l), waited, m->cfg.max_kernels, evicted);
    return 0;
}

static int kernel_cmd(km_manager *m, session *s, int lang, klaunch_cmd *cmd, char *err,
                      size_t errlen)
{
    memset(cmd, 0, sizeof *cmd);
    if (m->cfg.kernelspec[lang][0])
        return klaunch_cmd_from_kernelspec(cmd, m->cfg.kernelspec[lang], err, errlen);
    char dir[PATH_MAX], bin[PATH_MAX + 32];
    const char *env = getenv("KERNELMGR_KERNEL_DIR");
    if (env && *env)
        snprintf(dir, sizeof dir, "%s", env);
    else if (klaunch_self_dir(dir, sizeof dir)) {
        snprintf(err, errlen, "cannot find the directory of the kernelmgr binary");
        return -1;
    }
    snprintf(bin, sizeof bin, "%s/kernel-%s", dir, kmcfg_lang_name(lang));
    if (access(bin, X_OK)) {
        snprintf(err, errlen, "%s: %s", bin, strerror(errno));
        return -1;
    }
    char num[64];
    int rc = klaunch_cmd_add(cmd, bin);
    /* the lifeline: our kernel dies with this process however it ends
     * (kernels of a user's kernelspec have no such option: the next
     * start-up scan reaps them) */
    if (m->lifeline[0] > 2) {
        snprintf(num, sizeof num, "%d", KLAUNCH_OWNER_FD);
        rc |= klaunch_cmd_add(cmd, "--owner-fd") | klaunch_cmd_add(cmd, num);
        cmd->lifeline_fd = m->lifeline[0];
    }
    rc |= klaunch_cmd_add(cmd, "-f") | klaunch_cmd_add(cmd, "{connection_file}") |
          klaunch_cmd_add(cmd, "--workspace") | klaunch_cmd_add(cmd, s->workspace) |
          klaunch_cmd_add(cmd, "--sandbox") |
          klaunch_cmd_add(cmd, s->sandbox[0] ? s->sandbox : m->cfg.sandbox) |
          klaunch_cmd_add(cmd, "--network") |
          klaunch_cmd_add(cmd, (s->network < 0 ? m->cfg.network : s->network) ? "on" : "off");
    unsigned long long mem = s->memory ? s->memory : m->cfg.memory;
    if (mem) {
        snprintf(num, sizeof num, "%llu", mem);
        rc |= klaunch_cmd_add(cmd, "--memory") | klaunch_cmd_add(cmd, num);
    }
    double cpus = s->cpus > 0 ? s->cpus : m->cfg.cpus;
    if (cpus > 0) {
        snprintf(num, sizeof num, "%.6g", cpus);
        rc |= klaunch_cmd_add(cmd, "--cpus") | klaunch_cmd_add(cmd, num);
    }
    double cpu_time = s->cpu_time > 0 ? s->cpu_time : m->cfg.cpu_time;
    if (cpu_time > 0) {
        snprintf(num, sizeof num, "%.6g", cpu_time);
        rc |= klaunch_cmd_add(cmd, "--cpu-time") | klaunch_cmd_add(cmd, num);
    }
    const char *py = s->python[0] ? s->python : m->cfg.python;
    /* resolved once for all kernels of sessions that chose none */
    char *shared_py =
        lang == KMCFG_LANG_PYTHON && !s->python[0] ? python_resolved(py, s->workspace) : NULL;
    if (shared_py)
        py = shared_py;
    if (lang == KMCFG_LANG_PYTHON && py[0])
        rc |= klaunch_cmd_add(cmd, "--python") | klaunch_cmd_add(cmd, py);
    free(shared_py);
    snprintf(num, sizeof num, "%g", m->cfg.interrupt_grace);
    rc |= klaunch_cmd_add(cmd, "--interrupt-grace") | klaunch_cmd_add(cmd, num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)m->cfg.kernel_log_max);
    rc |= klaunch_cmd_add(cmd, "--log-max") | klaunch_cmd_add(cmd, num);
    snprintf(num, sizeof num, "%llu", (unsigned long long)m->cfg.history_max);
    rc |= klaunch_cmd_add(cmd, "--history-max") | klaunch_cmd_add(cmd, num);
    /* The session's installed packages (install_packages): read-only in the
     * sandbox, on PYTHONPATH / NODE_PATH and PATH. A warm-pool entry has no
     * name yet: its directory moves to the session's at hand-out. */
    char root[PATH_MAX], ro[PATH_MAX];
    int have_root = s->pool_entry
                        ? snprintf(root, sizeof root, "%.4000s/packages", s->pool_dir) < PATH_MAX
                        : pkginst_session_root(m->home, s->name, root) == 0;
    char **penv = have_root ? pkginst_kernel_env(root, kmcfg_lang_name(lang), ro) : NULL;
    if (!penv) {
        klaunch_cmd_clear(cmd);
        snprintf(err, errlen, "cannot prepare the package directory of session %s: %s", s->name,
                 strerror(errno));
        return -1;
    }
    /* The package variables, then the user's (configuration "env", then the
     * session's own; a later one of a name wins); the sandbox gets no other
     * variable of the manager's (kenv.h). They reach the kernel in a file
     * (--env-file), never as arguments. */
    char *ebuf = NULL;
    size_t elen = 0;
    FILE *ms = open_memstream(&ebuf, &elen);
    for (char **e = penv; ms && *e; e++)
        fwrite(*e, 1, strlen(*e) + 1, ms);
    json_t *uenv = session_env_merged(m, s->env);
    const char *ename;
    json_t *ev;
    json_object_foreach(uenv, ename, ev)
    {
        if (ms)
            fprintf(ms, "%s=%s%c", ename, json_string_value(ev) ?: "", '\0');
    }
    int mem_ok = ms && uenv && !ferror(ms);
    if (ms && fclose(ms))
        mem_ok = 0;
    json_decref(uenv);
    pkginst_env_free(&penv);
    char *env_path = mem_ok ? write_env_file(s, ebuf, elen, err, errlen) : NULL;
    if (ebuf) {
        explicit_bzero(ebuf, elen);
        free(ebuf);
    }
    if (!env_path) {
        if (!mem_ok)
            snprintf(err, errlen, "out of memory");
        klaunch_cmd_clear(cmd);
        return -1;
    }
    rc |= klaunch_cmd_add(cmd, "--env-file") | klaunch_cmd_add(cmd, env_path);
    free(env_path);
    rc |= klaunch_cmd_add(cmd, "--ro-path") | klaunch_cmd_add(cmd, ro);
    cmd->interrupt_signal = 0;
    if (rc) {
        klaunch_cmd_clear(cmd);
        snprintf(err, errlen, "kernel command too long");
        return -1;
    }
    return 0;
}

static int proc_alive_cb(void *ud)
{
    return klaunch_alive((kproc *)ud);
}

static void slot_stop(km_manager *m, kslot *k)
{
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

/* Stops every kernel of s at once: all get SIGTERM first, then each is
 * waited for, so a session's teardown costs one kernel shutdown, not one
 * per language. Caller holds s->lock. */
static void slots_stop_all(km_manager *m, session *s)
{
    for (int l = 0; l < KMCFG_NLANG; l++)
        klaunch_stop_begin(s->k[l].proc);
    for (int l = 0; l < KMCFG_NLANG; l++)
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
    for (int l = 0; l < KMCFG_NLANG; l++) {
        if (l == self_lang || !self->k[l].proc)
            continue;
        slot_stop(m, &self->k[l]);
        snprintf(self->k[l].pending, sizeof self->k[l].pending,
                 "evicted: the %s kernel was stopped to stay under max_kernels=%u (the "
                 "%s kernel of this session needed the slot); state was lost (workspace kept)",
                 kmcfg_lang_name(l), m->cfg.max_kernels, kmcfg_lang_name(self_lang));
        session_save(m, self);
        fprintf(stderr, "kernelmgr: max_kernels=%u reached: stopped %s/%s\n", m->cfg.max_kernels,
                self->name, kmcfg_lang_name(l));
        return 0;
    }
    pthread_mutex_lock(&m->lock);
    session *best = NULL;
    int best_l = -1;
    double oldest = 0;
    for (session *s = m->list; s; s = s->next) {
        if (s == self || s->gone || atomic_load(&s->busy))
            continue;
        for (int l = 0; l < KMCFG_NLANG; l++)
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
        if (best->k[best_l].proc) {
            slot_stop(m, &best->k[best_l]);
            snprintf(best->k[best_l].pending, sizeof best->k[best_l].pending,
                     "evicted: the %s kernel was stopped to stay under max_kernels=%u (session "
                     "\"%s\" needed one; this session was the least recently used); state was "
                     "lost (workspace kept)",
                     kmcfg_lang_name(best_l), m->cfg.max_kernels, self->name);
            session_save(m, best);
            fprintf(stderr, "kernelmgr: max_kernels=%u reached: stopped %s/%s for %s\n",
                    m->cfg.max_kernels, best->name, kmcfg_lang_name(best_l), self->name);
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

static void slot_log_path(const session *s, int l, char *log, size_t size)
{
    snprintf(log, size, "%.4000s/%s.log", s->dir, kmcfg_lang_name(l));
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
    snprintf(id, sizeof id, "%.8s%.4s-%s", u, u + 9, l ? "bash" : "py");
    slot_log_path(s, l, log, sizeof log);
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
    snprintf(label, sizeof label, "%s/%s", s->name, kmcfg_lang_name(l));
    k->proc = klaunch_start(&cmd, m->run_dir, id, m->cfg.transport, log,
                            m->cfg.kernelspec[l][0] ? m->cfg.kernelspec[l]
                                                    : (l ? "kernelmgr-bash" : "kernelmgr-python"),
                            err, errlen);
    klaunch_cmd_clear(&cmd);
    if (!k->proc) {
        cap_release(m);
        return -1;
    }
    k->client = kclient_new(&k->proc->conn, label, err, errlen);
    if (!k->client) {
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
    slot_log_path(s, l, log, sizeof log);
    json_t *info = NULL;
    if (k->client) {
        char why[256];
        info = kclient_wait_ready(k->client, m->cfg.start_timeout, proc_alive_cb, k->proc, why,
                                  sizeof why);
        if (!info) {
            char how[128] = "";
            if (!klaunch_alive(k->proc))
                klaunch_describe_exit(k->proc, how, sizeof how);
            snprintf(err, errlen, "%s kernel did not start: %s%s%s (log: %s)", kmcfg_lang_name(l),
                     why, how[0] ? "; " : "", how, log);
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
static int slot_start(km_manager *m, session *s, int l, char *err, size_t errlen)
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
static void slots_prestart(km_manager *m, session *s, const cblock_list *blocks)
{
    int need[KMCFG_NLANG] = {0}, n = 0;
    for (int l = 0; l < KMCFG_NLANG; l++)
        s->k[l].start_err[0] = 0; /* only ever about this execution */
    for (size_t i = 0; i < blocks->n; i++) {
        int l = blocks->v[i].lang;
        /* A Python kernel picks its interpreter from the workspace when it
         * starts (a .venv an earlier block creates applies): one first
         * needed after a block of another language starts then, as
         * before, not ahead of it. */
        if (l == KMCFG_LANG_PYTHON && i > 0)
            continue;
        if (l >= 0 && l < KMCFG_NLANG && m->cfg.allow[l] && !need[l] && !s->k[l].proc) {
            need[l] = 1;
            n++;
        }
    }
    if (n < 2 || s->gone)
        return;
    int launched[KMCFG_NLANG] = {0};
    for (int l = 0; l < KMCFG_NLANG; l++) {
        if (!need[l])
            continue;
        int rc = slot_launch(m, s, l, 1, s->k[l].start_err, sizeof s->k[l].start_err);
        launched[l] = rc == 0;
        if (rc == -2)
            s->k[l].start_err[0] = 0; /* no free unit: started when needed */
    }
    for (int l = 0; l < KMCFG_NLANG; l++)
        if (launched[l])
            slot_finish(m, s, l, s->k[l].start_err, sizeof s->k[l].start_err);
}

/* Makes sure slot l has a live kernel. *restarted / reason say whether the
 * result must report a fresh kernel that replaced a lost one. */
static int slot_ensure(km_manager *m, session *s, int l, int *restarted, char *reason, size_t rsize,
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
                 kmcfg_lang_name(l), klaunch_describe_exit(k->proc, how, sizeof how));
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

/* ---------------------------------------------------------------- outputs policy */

typedef struct outrun {
    char name[KM_NAME_MAX + 1];
    double mtime;
} outrun;

static int outrun_newest_first(const void *a, const void *b)
{
    double x = ((const outrun *)a)->mtime, y = ((const outrun *)b)->mtime;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Bytes of the regular files directly in dir (a session's outputs/NAME). */
static uint64_t outputs_used(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    uint64_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            n += (uint64_t)st.st_blocks * 512 > (uint64_t)st.st_size ? (uint64_t)st.st_blocks * 512
                                                                     : (uint64_t)st.st_size;
    }
    closedir(d);
    return n;
}

/* What sessions that no longer exist left behind elsewhere (a starting
 * daemon: no session of an earlier manager is live; a `run` in progress
 * still has its session directory and connection files): package
 * directories, and kernel history files whose connection file is gone. */
static int owned_by_live_manager(const km_manager *m, const char *name);

static void prune_orphans(km_manager *m)
{
    char *dir = NULL, *p = NULL;
    if (asprintf(&dir, "%s/packages", m->home) >= 0) {
        DIR *d = opendir(dir);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            /* Only a one-shot run's own packages: a name may get packages
             * before its session exists (installs first, then the first
             * exec), so other names are left alone; close removes them.
             * A run's are pruned once that run (run-PID-TIME) has ended:
             * the same owner-lock test as reap_dead_runs (pid reuse proof). */
            if (strncmp(de->d_name, "run-", 4) || !km_name_valid(de->d_name) ||
                owned_by_live_manager(m, de->d_name))
                continue;
            if (asprintf(&p, "%s/sessions/%s", m->home, de->d_name) < 0)
                break;
            int gone = access(p, F_OK) != 0 && errno == ENOENT;
            free(p);
            p = NULL;
            char why[512];
            if (gone && pkginst_remove_session(m->home, de->d_name, why, sizeof why))
                fprintf(stderr, "kernelmgr: %s\n", why);
        }
        if (d)
            closedir(d);
        free(dir);
    }
    DIR *d = opendir(m->run_dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        static const char suffix[] = ".history.jsonl";
        if (len <= sizeof suffix - 1 || strcmp(de->d_name + len - (sizeof suffix - 1), suffix))
            continue;
        /* NAME.json.history.jsonl belongs to the connection file NAME.json */
        if (asprintf(&p, "%.*s", (int)(len - (sizeof suffix - 1)), de->d_name) < 0)
            break;
        if (faccessat(dirfd(d), p, F_OK, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT)
            unlinkat(dirfd(d), de->d_name, 0);
        free(p);
        p = NULL;
    }
    if (d)
        closedir(d);
}

/* Bounds outputs/ (spill files, saved images). A session's outputs go when it
 * is closed; a one-shot `run` keeps its outputs after it ends (its results
 * name them), so those are pruned here: only the outputs_keep_runs newest are
 * kept, and none older than outputs_max_age. When orphans is set (a daemon
 * starting: no session of an earlier manager is live), outputs of sessions
 * that no longer exist are removed too. A directory whose session still
 * exists is never touched: a `run` may be in progress. */
static void outputs_prune(km_manager *m, int orphans)
{
    char dir[PATH_MAX], p[PATH_MAX];
    snprintf(dir, sizeof dir, "%.3000s/outputs", m->home);
    DIR *d = opendir(dir);
    if (!d)
        return;
    outrun *runs = NULL;
    size_t n = 0, cap = 0;
    double now = wall_now();
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!km_name_valid(de->d_name))
            continue;
        snprintf(p, sizeof p, "%.3000s/sessions/%.64s", m->home, de->d_name);
        if (access(p, F_OK) == 0)
            continue;
        snprintf(p, sizeof p, "%s/%.64s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) || !S_ISDIR(st.st_mode))
            continue;
        if (strncmp(de->d_name, "run-", 4) != 0) {
            if (orphans)
                session_rmtree(p);
            continue;
        }
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            outrun *r = realloc(runs, nc * sizeof *r);
            if (!r)
                break;
            runs = r;
            cap = nc;
        }
        snprintf(runs[n].name, sizeof runs[n].name, "%s", de->d_name);
        runs[n].mtime = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
        n++;
    }
    closedir(d);
    if (n)
        qsort(runs, n, sizeof *runs, outrun_newest_first);
    for (size_t i = 0; i < n; i++) {
        int too_many = i >= m->cfg.outputs_keep_runs;
        int too_old = m->cfg.outputs_max_age > 0 && now - runs[i].mtime > m->cfg.outputs_max_age;
        if (too_many || too_old) {
            snprintf(p, sizeof p, "%s/%s", dir, runs[i].name);
            session_rmtree(p);
        }
    }
    free(runs);
}

/* 1 when session.json names a manager process other than this one that is
 * still alive: a one-shot `run` in progress, not a session to take over. */
static int owned_by_live_manager(const km_manager *m, const char *name)
{
    /* a one-shot run-PID-TIME belongs to process PID, started before TIME,
     * holding its owner lock (klaunch.h): a reused pid is not its owner */
    unsigned long rpid = 0;
    long long rtime = 0;
    if (sscanf(name, "run-%lu-%lld", &rpid, &rtime) == 2 && rpid > 1 && rpid <= INT_MAX &&
        rtime > 0)
        return klaunch_owner_alive(m->run_dir, (pid_t)rpid, 0, (double)rtime);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.3000s/sessions/%.64s/session.json", m->home, name);
    json_t *o = json_load_file(path, 0, NULL);
    json_int_t pid = json_integer_value(json_object_get(o, "manager_pid"));
    json_decref(o);
    return pid > 1 && pid != getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* The start-up scan's second half (klaunch_reap_orphans did the kernels
 * with pid files): sessions of one-shot runs whose process has ended
 * (killed, SIGKILL included) are removed with anything of theirs still
 * running, their packages and their session directory; their outputs
 * stay, pruned like any run's (outputs_prune). Cheap: one readdir, and a
 * session.json read only for a dead run. */
static void reap_dead_runs(km_manager *m)
{
    char *dir = NULL;
    if (asprintf(&dir, "%s/sessions", m->home) < 0)
        return;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, "run-", 4) || !km_name_valid(de->d_name) ||
            owned_by_live_manager(m, de->d_name))
            continue;
        char *sdir = NULL, *sj = NULL;
        if (asprintf(&sdir, "%s/%s", dir, de->d_name) < 0)
            break;
        if (asprintf(&sj, "%s/session.json", sdir) >= 0) {
            json_t *o = json_load_file(sj, 0, NULL);
            const char *lk;
            json_t *kv;
            json_object_foreach(json_object_get(o, "kernels"), lk, kv)
            {
                kill_stale((int)json_integer_value(json_object_get(kv, "pid")),
                           json_string_value(json_object_get(kv, "connection_file")));
            }
            json_decref(o);
            free(sj);
        }
        fprintf(stderr, "kernelmgr: removing %s: its `kernelmgr run` has ended\n", sdir);
        char why[512];
        if (pkginst_remove_session(m->home, de->d_name, why, sizeof why))
            fprintf(stderr, "kernelmgr: %s\n", why);
        session_rmtree(sdir);
        free(sdir);
    }
    if (d)
        closedir(d);
    free(dir);
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
    pthread_mutex_destroy(&m->lock);
    free(m);
}

km_manager *km_manager_new(const char *home, const kmcfg *cfg, int resume, km_err *err)
{
    km_manager *m = calloc(1, sizeof *m);
    if (!m) {
        kerr(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    m->cfg.env = cfg->env ? json_deep_copy(cfg->env) : NULL;
    m->lifeline[0] = m->lifeline[1] = -1;
    pthread_mutex_init(&m->lock, NULL);
    pthread_mutex_init(&m->slot_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->slot_cv, &ca);
    pthread_condattr_destroy(&ca);
    snprintf(m->home, sizeof m->home, "%s", home);
    char p[PATH_MAX];
    if (kmfs_mkdirs(home, 0700)) {
        kerr(err, KM_EINTERNAL, "cannot create %s: %s", home, strerror(errno));
        goto fail;
    }
    snprintf(p, sizeof p, "%s/sessions", m->home);
    mkdir(p, 0700);
    snprintf(p, sizeof p, "%s/outputs", m->home);
    mkdir(p, 0700);
    char why[512];
    if (klaunch_run_dir(m->home, m->run_dir, sizeof m->run_dir, why, sizeof why) ||
        klaunch_lifeline_open(m->lifeline, why, sizeof why) ||
        klaunch_owner_hold(m->run_dir, why, sizeof why)) {
        kerr(err, KM_EINTERNAL, "%s", why);
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
            session *s = session_load(m, de->d_name);
            if (!s)
                continue;
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

static void session_free(session *s)
{
    json_decref(s->env);
    pthread_mutex_destroy(&s->lock);
    free(s);
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

static void session_put(km_manager *m, session *s)
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

static int opts_default(const km_manager *m, const km_session_opts *o)
{
    return !o ||
           ((o->network < 0 || o->network == m->cfg.network) && !o->memory && !(o->cpus > 0) &&
            !(o->cpu_time > 0) && !o->python && !o->workspace &&
            (!o->sandbox || !strcmp(o->sandbox, m->cfg.sandbox)) && !json_object_size(o->env));
}

/* Creates (or reopens a kept) session. Caller holds m->lock. */
static session *create_locked(km_manager *m, const char *name, const km_session_opts *o,
                              int *existed, km_err *err)
{
    session *s = session_load(m, name);
    *existed = s != NULL;
    if (s) {
        s->next = m->list;
        m->list = s;
        return s;
    }
    char why[512];
    if (o && o->env && session_env_check(m, o->env, why, sizeof why)) {
        kerr(err, KM_EUSAGE, "%s", why);
        return NULL;
    }
    if (o && o->workspace) {
        struct stat st;
        if (o->workspace[0] != '/' || stat(o->workspace, &st) || !S_ISDIR(st.st_mode)) {
            kerr(err, KM_EUSAGE, "--workspace %s: must be an existing directory (absolute path)",
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
            kerr(err, KM_EUSAGE, "--python %s: %s", o->python,
                 o->python[0] != '/' ? "must be an absolute path"
                 : errno == ENOENT   ? "no such file"
                                     : "not an executable file");
            return NULL;
        }
    }
    /* a warm-pool entry when the options are the defaults */
    session *pooled = NULL;
    if (opts_default(m, o) && m->pool) {
        /* Its kernels see its package directory, which becomes the
         * session's; packages installed for the name before the session
         * existed win, and the pool entry is then not used. */
        char from[PATH_MAX];
        snprintf(from, sizeof from, "%.4000s/packages", m->pool->pool_dir);
        if (pkginst_adopt(from, m->home, name) == 0 || errno == ENOENT) {
            pooled = m->pool;
            m->pool = pooled->next;
        }
    }
    s = pooled ? pooled : session_alloc(name);
    if (!s) {
        kerr(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->dir, sizeof s->dir, "%.3000s/sessions/%.64s", m->home, name);
    snprintf(s->outdir, sizeof s->outdir, "%.3000s/outputs/%.64s", m->home, name);
    /* what this call creates, to take back on failure */
    struct stat dst;
    int made_dir = lstat(s->dir, &dst) != 0, made_ws = 0, made_link = 0;
    char save_err[PATH_MAX + 200];
    if (kmfs_mkdirs(s->dir, 0700)) {
        kerr(err, KM_EINTERNAL, "cannot create %s: %s", s->dir, strerror(errno));
        goto fail;
    }
    if (pooled) {
        pooled->from_pool = 1;
        pooled->pool_entry = 0;
        pooled->created = pooled->last_used = wall_now();
        /* idle time is counted from the handout, not from the pre-start */
        for (int l = 0; l < KMCFG_NLANG; l++)
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
        s->network = o && o->network >= 0 ? o->network : m->cfg.network;
        s->memory = o && o->memory ? o->memory : 0;
        s->cpus = o && o->cpus > 0 ? o->cpus : 0;
        s->cpu_time = o && o->cpu_time > 0 ? o->cpu_time : 0;
        snprintf(s->python, sizeof s->python, "%s", o && o->python ? o->python : "");
        snprintf(s->sandbox, sizeof s->sandbox, "%s",
                 o && o->sandbox ? o->sandbox : m->cfg.sandbox);
        if (o && json_object_size(o->env) && !(s->env = json_deep_copy(o->env))) {
            kerr(err, KM_EINTERNAL, "out of memory");
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
            struct stat wst;
            if (mkdir(s->workspace, 0700) == 0) {
                made_ws = 1;
            } else if (errno != EEXIST || lstat(s->workspace, &wst) || !S_ISDIR(wst.st_mode)) {
                kerr(err, KM_EINTERNAL, "cannot create %s: %s", s->workspace,
                     errno == EEXIST ? "it exists and is not a directory" : strerror(errno));
                goto fail;
            }
        }
    }
    /* a session that cannot be saved would vanish with its manager: refuse it */
    if (session_save_err(m, s, save_err, sizeof save_err)) {
        kerr(err, KM_EINTERNAL, "cannot create session \"%s\": %s", name, save_err);
        goto fail;
    }
    s->next = m->list;
    m->list = s;
    return s;
fail:
    if (made_link) {
        char link[PATH_MAX];
        snprintf(link, sizeof link, "%.4000s/workspace", s->dir);
        unlink(link);
    }
    if (made_ws)
        rmdir(s->workspace);
    if (made_dir)
        session_rmtree(s->dir);
    if (pooled) {
        for (int l = 0; l < KMCFG_NLANG; l++)
            slot_stop(m, &s->k[l]);
        session_rmtree(s->pool_dir);
    }
    session_free(s);
    return NULL;
}

/* ---------------------------------------------------------------- code_exec */

static void warn_ignored(json_t *arr, const char *sname, const char *opt, const char *given,
                         const char *kept)
{
    json_array_append_new(arr, json_sprintf("session \"%s\" already exists: %s %s was ignored "
                                            "(the session keeps %s); options of a session are "
                                            "fixed when it is created: close it to change them",
                                            sname, opt, given, kept));
}

/* new: warnings for session options given to an existing session whose value
 * differs from the session's, or NULL when there are none. They are reported
 * rather than applied: applying them means a restart, and silently losing an
 * agent's state because of an option is worse than a warning. */
static json_t *ignored_options(km_manager *m, session *s, const km_session_opts *o)
{
    if (!o)
        return NULL;
    json_t *arr = json_array();
    char a[64], b[64];
    int net = s->network < 0 ? m->cfg.network : s->network;
    if (o->network >= 0 && o->network != net)
        warn_ignored(arr, s->name, "--network", o->network ? "on" : "off",
                     net ? "network on" : "network off");
    unsigned long long mem = s->memory ? s->memory : m->cfg.memory;
    if (o->memory && o->memory != mem) {
        snprintf(a, sizeof a, "%llu bytes", o->memory);
        if (mem)
            snprintf(b, sizeof b, "memory %llu bytes", mem);
        else
            snprintf(b, sizeof b, "the kernel's default memory limit");
        warn_ignored(arr, s->name, "--memory", a, b);
    }
    double cpus = s->cpus > 0 ? s->cpus : m->cfg.cpus;
    if (o->cpus > 0 && o->cpus != cpus) {
        snprintf(a, sizeof a, "%g", o->cpus);
        if (cpus > 0)
            snprintf(b, sizeof b, "cpus %g", cpus);
        else
            snprintf(b, sizeof b, "no CPU rate cap");
        warn_ignored(arr, s->name, "--cpus", a, b);
    }
    double cpu_time = s->cpu_time > 0 ? s->cpu_time : m->cfg.cpu_time;
    if (o->cpu_time > 0 && o->cpu_time != cpu_time) {
        snprintf(a, sizeof a, "%g", o->cpu_time);
        if (cpu_time > 0)
            snprintf(b, sizeof b, "cpu_time %g s per block", cpu_time);
        else
            snprintf(b, sizeof b, "no CPU-time limit per block");
        warn_ignored(arr, s->name, "--cpu-time", a, b);
    }
    const char *py = s->python[0] ? s->python : m->cfg.python;
    if (o->python && strcmp(o->python, py)) {
        char kept[1100];
        snprintf(kept, sizeof kept, "python %s", py[0] ? py : "(detected)");
        warn_ignored(arr, s->name, "--python", o->python, kept);
    }
    if (o->workspace) {
        char *real = realpath(o->workspace, NULL);
        if (strcmp(real ? real : o->workspace, s->workspace)) {
            char kept[PATH_MAX];
            snprintf(kept, sizeof kept, "workspace %s", s->workspace);
            warn_ignored(arr, s->name, "--workspace", o->workspace, kept);
        }
        free(real);
    }
    if (json_object_size(o->env) && !(s->env && json_equal((json_t *)o->env, s->env))) {
        /* names only: values may be secrets, and warnings are shown and logged */
        char given[256] = "", kept[300];
        const char *n;
        json_t *v;
        json_object_foreach((json_t *)o->env, n, v)
        {
            size_t l = strlen(given);
            snprintf(given + l, sizeof given - l, "%s%.64s", l ? "," : "", n);
        }
        if (json_object_size(s->env)) {
            snprintf(kept, sizeof kept, "its env (");
            json_object_foreach(s->env, n, v)
            {
                size_t l = strlen(kept);
                snprintf(kept + l, sizeof kept - l, "%s%.64s", kept[l - 1] == '(' ? "" : ",", n);
            }
            size_t l = strlen(kept);
            snprintf(kept + l, sizeof kept - l, ")");
        } else {
            snprintf(kept, sizeof kept, "no env of its own");
        }
        warn_ignored(arr, s->name, "--env", given, kept);
    }
    const char *sb = s->sandbox[0] ? s->sandbox : m->cfg.sandbox;
    if (o->sandbox && strcmp(o->sandbox, sb)) {
        snprintf(b, sizeof b, "sandbox %s", sb);
        warn_ignored(arr, s->name, "--sandbox", o->sandbox, b);
    }
    if (!json_array_size(arr)) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

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
        waited = json_pack("{s:f s:s}", "seconds", w, "message", msg);
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

json_t *km_exec(km_manager *m, const char *name, const km_session_opts *sopts,
                const km_exec_opts *opts, const char *code, km_event_fn fn, void *ud, km_err *err)
{
    if (!km_name_valid(name)) {
        kerr(err, KM_EUSAGE,
             "invalid session name \"%s\" (allowed: letters, digits, _ - ., "
             "at most %d, not starting with '.')",
             name ? name : "", KM_NAME_MAX);
        return NULL;
    }
    int lang = -1;
    if (opts && opts->lang && strcmp(opts->lang, "auto")) {
        lang = kmcfg_lang_index(opts->lang);
        if (lang < 0) {
            kerr(err, KM_EUSAGE, "unknown language \"%s\" (python, bash or auto)", opts->lang);
            return NULL;
        }
    }
    /* one check for run, exec, the daemon and MCP, before the session is
     * touched or anything is sent to a kernel */
    char codebad[256];
    if (cblocks_check_code(code, code ? strlen(code) : 0, m->cfg.code_max, codebad,
                           sizeof codebad)) {
        kerr(err, KM_EUSAGE, "%s", codebad);
        return NULL;
    }
    cblock_list blocks;
    if (cblocks_split(code ? code : "", lang, &blocks)) {
        kerr(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    pthread_mutex_lock(&m->lock);
    int existed = 1;
    session *s = find_locked(m, name);
    if (!s)
        s = create_locked(m, name, sopts, &existed, err);
    if (s)
        s->refs++;
    pthread_mutex_unlock(&m->lock);
    if (!s) {
        cblocks_free(&blocks);
        return NULL;
    }
    json_t *warnings = existed ? ignored_options(m, s, sopts) : NULL;

    json_t *waited = session_lock_exec(m, s, fn, ud);
    atomic_store(&s->busy, 1);
    atomic_store(&s->interrupt_flag, 0);
    slots_prestart(m, s, &blocks);
    json_t *results = json_array();
    int failed = 0;
    size_t ran = 0;
    for (size_t i = 0; i < blocks.n; i++) {
        cblock *b = &blocks.v[i];
        const char *lname = kmcfg_lang_name(b->lang);
        json_t *r = NULL;
        if (s->gone) {
            r = result_new(name, lname);
            result_set_failure(r, "error", "SessionClosed", "the session was closed");
        } else if (!m->cfg.allow[b->lang]) {
            r = result_new(name, lname);
            char msg[256];
            snprintf(msg, sizeof msg,
                     "language \"%s\" is not allowed by the configuration (\"languages\")", lname);
            result_set_failure(r, "error", "LanguageNotAllowed", msg);
        } else {
            int restarted = 0;
            char reason[512] = "", why[1024] = "";
            if (slot_ensure(m, s, b->lang, &restarted, reason, sizeof reason, why, sizeof why)) {
                r = result_new(name, lname);
                result_set_failure(r, "error", "KernelStartError", why);
            } else {
                kslot *k = &s->k[b->lang];
                char tag[64];
                s->seq++;
                snprintf(tag, sizeof tag, "%lld-%04u-%s", (long long)wall_now(), s->seq, lname);
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
                    .interrupt_flag = (volatile int *)&s->interrupt_flag,
                    .fn = fn,
                    .ud = ud,
                };
                /* the history knows the cell before the kernel does: a
                 * manager killed while it runs leaves it "started" */
                char herr[600] = "";
                int hstarted = session_history_start(s->dir, tag, lname, b->code,
                                                     m->cfg.history_max, herr, sizeof herr) == 0;
                codeexec_outcome out;
                r = codeexec_run(k->client, k->proc, &p, b->code, &out);
                k->last_used = kclient_now();
                if (out.need_restart) {
                    slot_stop(m, k);
                    char e2[1024];
                    if (slot_start(m, s, b->lang, e2, sizeof e2) == 0) {
                        char msg[1100];
                        snprintf(msg, sizeof msg, "%s; a fresh kernel was started (workspace kept)",
                                 out.reason);
                        result_set_kernel(r, 1, 0, msg);
                    } else {
                        char msg[2200];
                        snprintf(msg, sizeof msg, "%s; restarting the kernel failed: %s",
                                 out.reason, e2);
                        result_set_kernel(r, 0, 0, msg);
                    }
                } else if (out.state_lost) {
                    result_set_kernel(r, 1, 0, out.reason);
                } else if (restarted) {
                    result_set_kernel(r, 1, 0, reason);
                }
                char herr2[600];
                if (r &&
                    session_history_append(s->dir, hstarted ? tag : NULL, lname, b->code, r,
                                           out.nb_outputs, m->cfg.history_max, herr2, sizeof herr2))
                    json_object_set_new(r, "history_error", json_string(herr2));
                else if (r && !hstarted)
                    json_object_set_new(r, "history_error", json_string(herr));
                json_decref(out.nb_outputs);
            }
        }
        if (!r)
            r = result_new(name, lname);
        if (i == 0 && warnings)
            json_object_set(r, "warnings", warnings);
        if (i == 0 && waited)
            json_object_set(r, "waited", waited);
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
    s->last_used = wall_now();
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

/* ---------------------------------------------------------------- lifecycle */

json_t *km_sessions(km_manager *m)
{
    json_t *arr = json_array();
    pthread_mutex_lock(&m->lock);
    for (session *s = m->list; s; s = s->next) {
        if (s->gone)
            continue;
        json_t *ks = json_object();
        for (int l = 0; l < KMCFG_NLANG; l++) {
            kproc *kp = s->k[l].proc;
            /* reading another session's slot without its lock: a snapshot only */
            if (kp)
                json_object_set_new(ks, kmcfg_lang_name(l),
                                    json_pack("{s:s s:i s:s}", "state",
                                              atomic_load(&s->busy) ? "busy" : "idle", "pid",
                                              (int)kp->pid, "connection_file", kp->cf_path));
            else
                json_object_set_new(ks, kmcfg_lang_name(l), json_null());
        }
        json_array_append_new(
            arr, json_pack("{s:s s:s s:f s:f s:b s:b s:o}", "name", s->name, "workspace",
                           s->workspace, "created", s->created, "last_used", s->last_used, "busy",
                           atomic_load(&s->busy), "from_pool", s->from_pool, "kernels", ks));
    }
    pthread_mutex_unlock(&m->lock);
    return arr;
}

json_t *km_pool_status(km_manager *m)
{
    json_t *entries = json_array();
    pthread_mutex_lock(&m->lock);
    for (session *s = m->pool; s; s = s->next) {
        json_t *e = json_object();
        for (int l = 0; l < KMCFG_NLANG; l++)
            json_object_set_new(e, kmcfg_lang_name(l),
                                s->k[l].proc ? json_integer(s->k[l].proc->pid) : json_null());
        json_array_append_new(entries, e);
    }
    pthread_mutex_unlock(&m->lock);
    return json_pack("{s:i s:i s:i s:o}", "size", (int)m->cfg.pool, "ready",
                     (int)json_array_size(entries), "live_kernels", atomic_load(&m->live),
                     "entries", entries);
}

int km_interrupt(km_manager *m, const char *name, km_err *err)
{
    session *s = session_get(m, name);
    if (!s)
        return kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
    if (atomic_load(&s->busy)) {
        atomic_store(&s->interrupt_flag, 1);
    } else if (pthread_mutex_trylock(&s->lock) == 0) {
        for (int l = 0; l < KMCFG_NLANG; l++)
            if (s->k[l].client && klaunch_alive(s->k[l].proc))
                kclient_send(s->k[l].client, JP_CONTROL, "interrupt_request", NULL, NULL, NULL);
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
        return kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
    atomic_store(&s->interrupt_flag, 1);
    pthread_mutex_lock(&s->lock);
    int rc = 0;
    for (int l = 0; l < KMCFG_NLANG; l++) {
        if (!s->k[l].proc)
            continue;
        slot_stop(m, &s->k[l]);
        s->k[l].pending[0] = 0;
        char why[1024];
        if (slot_start(m, s, l, why, sizeof why))
            rc = kerr(err, KM_EKERNEL, "%s", why);
    }
    session_save(m, s);
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    return rc;
}

int km_close(km_manager *m, const char *name, int flags, km_err *err)
{
    int keep = flags & KM_KEEP;
    session *s = session_get(m, name);
    if (!s) {
        /* a kept session from earlier is still on disk: allow removing it */
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.3000s/sessions/%.64s", m->home, name);
        if (km_name_valid(name) && !keep && access(dir, F_OK) == 0) {
            session *t = session_load(m, name);
            if (t) {
                if (t->own_workspace)
                    session_rmtree(t->workspace);
                session_free(t);
            }
            session_rmtree(dir);
            return 0;
        }
        return kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
    }
    atomic_store(&s->interrupt_flag, 1);
    pthread_mutex_lock(&s->lock);
    slots_stop_all(m, s);
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
        if (s->own_workspace)
            session_rmtree(s->workspace);
        if (s->pool_dir[0])
            session_rmtree(s->pool_dir);
        session_rmtree(s->dir);
        char why[512];
        if (pkginst_remove_session(m->home, s->name, why, sizeof why))
            fprintf(stderr, "kernelmgr: cannot remove the packages of session %s: %s\n", s->name,
                    why);
        if (!(flags & KM_KEEP_OUTPUTS))
            session_rmtree(s->outdir);
    }
    pthread_mutex_unlock(&s->lock);
    session_put(m, s);
    if (flags & KM_KEEP_OUTPUTS)
        outputs_prune(m, 0);
    return 0;
}

json_t *km_files(km_manager *m, const char *name, km_err *err)
{
    session *s = session_get(m, name);
    if (!s) {
        kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    fsdiff_snap *snap = fsdiff_take(s->workspace, m->cfg.files_scan_max);
    json_t *files = snap ? fsdiff_list(snap, 10000) : json_array();
    json_t *o = json_pack("{s:s s:s s:o s:b}", "session", s->name, "workspace", s->workspace,
                          "files", files, "incomplete", snap && fsdiff_incomplete(snap));
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
            kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
            return NULL;
        }
    }
    char why[512];
    int bad = 0;
    json_t *nb = export_notebook(dir, name, kernel_name, &bad, why, sizeof why);
    if (!nb)
        kerr(err, bad ? KM_EUSAGE : KM_EINTERNAL, "%s", why);
    return nb;
}

int km_connection_file(km_manager *m, const char *name, const char *lang, char *out, size_t size,
                       km_err *err)
{
    int l = kmcfg_lang_index(lang ? lang : "python");
    if (l < 0)
        return kerr(err, KM_EUSAGE, "unknown language \"%s\" (python or bash)", lang);
    if (!m->cfg.allow[l])
        return kerr(err, KM_EUSAGE, "language \"%s\" is not allowed by the configuration",
                    kmcfg_lang_name(l));
    session *s = session_get(m, name);
    if (!s)
        return kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
    pthread_mutex_lock(&s->lock);
    int restarted;
    char reason[512], why[1024];
    int rc = 0;
    if (slot_ensure(m, s, l, &restarted, reason, sizeof reason, why, sizeof why))
        rc = kerr(err, KM_EKERNEL, "%s", why);
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

/* ---------------------------------------------------------------- periodic */

/* Runs one silent cell in a pooled kernel, so that the first real cell
 * does not pay for what every first cell loads (the Python driver imports
 * ast, json and tokenize on first use). Silent: no execution count, no
 * history, nothing on IOPub but busy/idle. Best effort. */
static void pool_warm(kslot *k, int l)
{
    char msg_id[37] = "";
    json_t *content =
        json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", l ? ":" : "None", "silent", 1,
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
    for (int l = 0; l < KMCFG_NLANG; l++)
        per_entry += m->cfg.allow[l] ? 1u : 0u;
    for (;;) {
        pthread_mutex_lock(&m->lock);
        unsigned n = 0;
        for (session *s = m->pool; s; s = s->next)
            n++;
        pthread_mutex_unlock(&m->lock);
        if (n >= m->cfg.pool || !per_entry)
            return;
        /* the pool never pushes a session's kernel out: it only uses room */
        if ((unsigned)atomic_load(&m->live) + per_entry > m->cfg.max_kernels)
            return;
        char u[37];
        jp_uuid4(u);
        session *s = session_alloc(".pool");
        if (!s)
            return;
        s->pool_entry = 1;
        s->network = m->cfg.network;
        snprintf(s->sandbox, sizeof s->sandbox, "%s", m->cfg.sandbox);
        snprintf(s->pool_dir, sizeof s->pool_dir, "%.3000s/pool/%.8s", m->home, u);
        snprintf(s->dir, sizeof s->dir, "%s", s->pool_dir);
        snprintf(s->workspace, sizeof s->workspace, "%s/workspace", s->pool_dir);
        s->own_workspace = 1;
        char why[1024];
        int ok = kmfs_mkdirs(s->workspace, 0700) == 0;
        pthread_mutex_lock(&s->lock);
        for (int l = 0; ok && l < KMCFG_NLANG; l++)
            if (m->cfg.allow[l]) {
                if (slot_start(m, s, l, why, sizeof why)) {
                    fprintf(stderr, "kernelmgr: warm pool: %s\n", why);
                    ok = 0;
                } else {
                    pool_warm(&s->k[l], l);
                }
            }
        pthread_mutex_unlock(&s->lock);
        if (!ok) {
            for (int l = 0; l < KMCFG_NLANG; l++)
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
        for (int l = 0; l < KMCFG_NLANG; l++)
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
            int changed = 0;
            for (int l = 0; l < KMCFG_NLANG; l++) {
                kslot *k = &s->k[l];
                if (s->gone || !k->proc || now - k->last_used <= m->cfg.idle_timeout)
                    continue;
                slot_stop(m, k);
                snprintf(k->pending, sizeof k->pending,
                         "culled: the %s kernel was stopped after %g s idle (idle_timeout=%g); "
                         "a fresh kernel was started and its state was lost (workspace kept)",
                         kmcfg_lang_name(l), now - k->last_used, m->cfg.idle_timeout);
                fprintf(stderr, "kernelmgr: culled %s/%s after %g s idle\n", s->name,
                        kmcfg_lang_name(l), now - k->last_used);
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
 * that takes nothing for its grace period, >= 2 s). Idle sessions only, and
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
            for (int l = 0; l < KMCFG_NLANG; l++)
                if (!s->gone && s->k[l].client)
                    kclient_discard_iopub(s->k[l].client, 100000);
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
    if (!km_name_valid(name)) {
        kerr(err, KM_EUSAGE,
             "invalid session name \"%s\" (allowed: letters, digits, _ - ., "
             "at most %d, not starting with '.')",
             name ? name : "", KM_NAME_MAX);
        return NULL;
    }
    pthread_mutex_lock(&m->lock);
    int existed = 1;
    session *s = find_locked(m, name);
    if (!s)
        s = create_locked(m, name, sopts, &existed, err);
    if (s)
        s->refs++;
    pthread_mutex_unlock(&m->lock);
    if (!s)
        return NULL;
    json_t *warnings = existed ? ignored_options(m, s, sopts) : NULL;
    json_t *o = json_pack("{s:s s:s s:b s:b}", "session", s->name, "workspace", s->workspace,
                          "created", !existed, "from_pool", s->from_pool);
    if (o && warnings)
        json_object_set(o, "warnings", warnings);
    json_decref(warnings);
    session_put(m, s);
    if (!o)
        kerr(err, KM_EINTERNAL, "out of memory");
    return o;
}

json_t *km_file_read(km_manager *m, const char *name, const char *rel, uint64_t offset,
                     uint64_t length, const char *encoding, km_err *err)
{
    session *s = session_get(m, name);
    if (!s) {
        kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    /* reading needs no lock: like km_files, a snapshot of what is there */
    char why[1024];
    json_t *r = wsfile_read(s->workspace, rel, offset, length, encoding ? encoding : "auto", why,
                            sizeof why);
    if (r)
        json_object_set_new(r, "session", json_string(s->name));
    else
        kerr(err, KM_EUSAGE, "%s", why);
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
        kerr(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    if (s->gone) {
        pthread_mutex_unlock(&s->lock);
        session_put(m, s);
        kerr(err, KM_ENOSESSION, "session \"%s\" was closed", name);
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
    char why[1024];
    json_t *r = wsfile_write(s->workspace, rel, data, len, append, 1, why, sizeof why);
    if (r)
        json_object_set_new(r, "session", json_string(s->name));
    else
        kerr(err, KM_EUSAGE, "%s", why);
    session_unlock_op(m, s);
    return r;
}

json_t *km_packages_install(km_manager *m, const char *name, const char *allowlist_path,
                            const char *manager, const json_t *packages, km_err *err)
{
    if (!km_name_valid(name)) {
        kerr(err, KM_EUSAGE, "invalid session name \"%s\"", name ? name : "");
        return NULL;
    }
    int mgr = allowlist_mgr_from_name(manager);
    if (mgr < 0) {
        kerr(err, KM_EUSAGE, "manager must be \"pip\" or \"npm\" (got \"%s\")",
             manager ? manager : "");
        return NULL;
    }
    size_t n = json_array_size(packages), i;
    if (!json_is_array(packages) || n == 0 || n > 50) {
        kerr(err, KM_EUSAGE, "packages must be a list of 1 to 50 package names");
        return NULL;
    }
    json_t *p;
    json_array_foreach(packages, i, p)
    {
        if (!json_is_string(p)) {
            kerr(err, KM_EUSAGE, "packages must contain strings only");
            return NULL;
        }
    }
    char *path = NULL;
    const char *env = getenv("KERNELMGR_ALLOWLIST");
    if (allowlist_path && *allowlist_path)
        path = strdup(allowlist_path);
    else if (env && *env)
        path = strdup(env);
    else if (asprintf(&path, "%s/allowlist.json", m->home) < 0)
        path = NULL;
    if (!path) {
        kerr(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    char why[1024];
    /* read on every call: the operator may edit the list while agents run */
    allowlist *al = allowlist_load(path, 0, why, sizeof why);
    free(path);
    if (!al) {
        kerr(err, KM_EUSAGE, "the package allowlist cannot be read, so nothing is installable: %s",
             why);
        return NULL;
    }
    /* every request is checked before anything runs */
    char pname[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1];
    json_array_foreach(packages, i, p)
    {
        if (allowlist_check(al, (allowlist_mgr)mgr, json_string_value(p), pname, spec, why,
                            sizeof why) < 0) {
            allowlist_destroy(&al);
            kerr(err, KM_EUSAGE, "install refused, nothing was installed: %s", why);
            return NULL;
        }
    }
    /* A live session: under its lock, so close (which removes the package
     * directory) waits for the install. A name without a session installs
     * for the name: the session created later sees the packages (and takes
     * no warm-pool entry, see create_locked). */
    session *s = session_get(m, name);
    if (s) {
        session_put(m, s);
        if (!(s = session_lock_op(m, name, err))) {
            allowlist_destroy(&al);
            return NULL;
        }
    }
    json_t *r = pkginst_install(al, (allowlist_mgr)mgr, m->home, name, packages, why, sizeof why);
    if (s)
        session_unlock_op(m, s);
    allowlist_destroy(&al);
    char root[PATH_MAX];
    if (!r && !s && pkginst_session_root(m->home, name, root) == 0 && access(root, F_OK) != 0) {
        /* a close of the name was finishing (it removes the package
         * directory after the session left the list): the install lost */
        kerr(err, KM_ENOSESSION,
             "session \"%s\" was closed while the install ran; nothing was installed", name);
        return NULL;
    }
    if (!r) {
        kerr(err, KM_EINTERNAL, "install failed, nothing was installed: %s", why);
        return NULL;
    }
    json_object_set_new(r, "session", json_string(name));
    return r;
}
