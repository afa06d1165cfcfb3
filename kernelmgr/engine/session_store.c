/*
 * session_store.c — a session's persistence (session_int.h): session.json
 * (options, kernels) saved and loaded, history.jsonl (session.h), the
 * session object's allocation.
 */
#include "kernelmgr/engine/export.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"
#include "kernelmgr/engine/sessopt.h"
#include "kernelmgr/engine/snapshot.h"
#include "kernelmgr/engine/wsfile.h"
#include "kernelmgr/engine/kmhome.h"
#include "common/cm_clock.h"
#include "common/cm_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int session_rmtree(const char *path)
{
    return wsfile_rmtree(path, NULL); /* fd-based, never follows; failures on stderr */
}

int session_make_workspace(session *s, km_err *err)
{
    int made = mkdir(s->workspace, 0700) == 0;
    if (kmhome_mkdir(s->workspace, 0700, err))
        return -1;
    struct stat st;
    if (lstat(s->workspace, &st)) {
        km_err_set(err, KM_EINTERNAL, "cannot create %s: %s", s->workspace, strerror(errno));
        return -1;
    }
    s->ws_dev = (unsigned long long)st.st_dev;
    s->ws_ino = (unsigned long long)st.st_ino;
    return made;
}

/* 1 when path is the directory of device dev and inode ino (opened without
 * following a final link, fstat on the fd). */
static int same_dir(const char *path, unsigned long long dev, unsigned long long ino)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    int same = fd >= 0 && fstat(fd, &st) == 0 && (unsigned long long)st.st_dev == dev &&
               (unsigned long long)st.st_ino == ino;
    if (fd >= 0)
        close(fd);
    return same;
}

void session_remove_workspace(km_manager *m, session *s, json_t *warnings)
{
    if (!s->own_workspace || !s->workspace[0])
        return;
    if (kmhome_below(m->home, s->workspace) ||
        (s->ws_ino && same_dir(s->workspace, s->ws_dev, s->ws_ino))) {
        session_rmtree(s->workspace);
        return;
    }
    char *w = NULL;
    if (asprintf(&w,
                 "session \"%s\": its workspace %s was not removed (kept): it is outside the "
                 "kernelmgr home and session.json does not show that this manager created it",
                 s->name, s->workspace) < 0)
        return;
    if (warnings)
        json_array_append_new(warnings, json_string(w));
    fprintf(stderr, "kernelmgr: %s\n", w);
    free(w);
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

static int history_write(const char *session_dir, json_t *line, uint64_t max, km_err *err);

int session_history_start(const char *session_dir, const char *id, const char *language,
                          const char *client, const char *code, uint64_t max, km_err *err)
{
    json_t *line =
        json_pack("{s:s s:s s:s s:s s:f s:s}", "event", "started", "id", id, "language", language,
                  "code", code, "time", cm_wall_s(), "manager", export_manager_id());
    if (line && client)
        json_object_set_new(line, "client", json_string(client));
    if (!line) {
        km_err_set(err, KM_EINTERNAL,
                   "cannot record the cell in the session history: out of memory");
        return -1;
    }
    return history_write(session_dir, line, max, err);
}

int session_history_append(const char *session_dir, const char *id, const char *language,
                           const char *client, const char *code, const json_t *result,
                           const json_t *nb_outputs, uint64_t max, km_err *err)
{
    json_t *line = json_pack("{s:s s:s s:O s:O s:O}", "language", language, "code", code,
                             "execution_count", json_object_get(result, "execution_count"),
                             "status", json_object_get(result, "status"), "outputs",
                             nb_outputs ? nb_outputs : json_array());
    if (line && id) {
        json_object_set_new(line, "event", json_string("finished"));
        json_object_set_new(line, "id", json_string(id));
    }
    if (line && client)
        json_object_set_new(line, "client", json_string(client));
    if (!line) {
        km_err_set(err, KM_EINTERNAL, "cannot write the session history: out of memory");
        return -1;
    }
    return history_write(session_dir, line, max, err);
}

/* Appends line (stolen) to session_dir/history.jsonl within max. */
static int history_write(const char *session_dir, json_t *line, uint64_t max, km_err *err)
{
    char *path = NULL;
    if (asprintf(&path, "%s/history.jsonl", session_dir) < 0) {
        json_decref(line);
        km_err_set(err, KM_EINTERNAL, "out of memory");
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
        km_err_set(err, KM_EINTERNAL, "out of memory");
        free(path);
        return -1;
    }
    size_t n = strlen(s);
    s[n++] = '\n'; /* replaces the NUL: written with an explicit length */
    int rc = -1;
    struct stat st;
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd >= 0 && fstat(fd, &st) == 0 &&
        (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)))) {
        /* the home's own file, like every state file (kmhome.h) */
        close(fd);
        fd = -1;
        errno = !S_ISREG(st.st_mode) ? EINVAL : EPERM;
    }
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
        km_err_set(err, KM_EINTERNAL, "cannot write the session history: %s (%s)",
                   errno == EPERM    ? "it is not this user's own file (owner or mode)"
                   : errno == EINVAL ? "it is not a regular file"
                                     : strerror(errno),
                   path);
    if (fd >= 0)
        close(fd);
    free(s);
    free(path);
    return rc;
}

/* ---------------------------------------------------------------- persistence */

/* Writes text to path through path.tmp: write, fsync, rename (so after a
 * power loss path holds the old text or the new one, whole, never an empty
 * or torn file) and, with sync_dir, fsync of the directory (so once this
 * returns 0 the new text is what a power loss leaves). 0, or -1 with errno
 * set; the temp file never stays behind. */
static int write_synced(const char *path, const char *text, int sync_dir)
{
    char tmp[PATH_MAX + 8], dir[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    int rc = fchmod(fd, 0600) || cm_write_all(fd, text, strlen(text)) || fsync(fd) ? -1 : 0;
    int e = errno;
    if (close(fd) && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc == 0 && rename(tmp, path)) {
        rc = -1;
        e = errno;
    }
    if (rc) {
        unlink(tmp);
        errno = e;
        return -1;
    }
    if (!sync_dir)
        return 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd)) {
        e = errno;
        if (dfd >= 0)
            close(dfd);
        errno = e;
        return -1;
    }
    close(dfd);
    return 0;
}

/* Writes session.json (write_synced). 0, or -1 with the reason in err. */
static int save(km_manager *m, session *s, int sync_dir, km_err *err)
{
    json_t *kernels = json_object();
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (s->k[l].proc)
            json_object_set_new(kernels, kmcfg_lang_name(&m->cfg, l),
                                json_pack("{s:i s:s}", "pid", (int)s->k[l].proc->pid,
                                          "connection_file", s->k[l].proc->cf_path));
    json_t *o = json_pack("{s:s s:s s:b s:s s:f s:i s:b s:{} s:o}", "name", s->name, "workspace",
                          s->workspace, "own_workspace", s->own_workspace, "pool_dir", s->pool_dir,
                          "created", s->created, "manager_pid", (int)getpid(), "from_pool",
                          s->from_pool, "options", "kernels", kernels);
    /* every option by the table (sessopt.c) */
    if (o && km_sessopt_save(s, json_object_get(o, "options"))) {
        json_decref(o);
        o = NULL;
    }
    json_t *restore = json_object();
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (s->k[l].restore[0])
            json_object_set_new(restore, kmcfg_lang_name(&m->cfg, l), json_string(s->k[l].restore));
    if (o && json_object_size(restore))
        json_object_set(o, "restore", restore);
    json_decref(restore);
    if (o && s->own_workspace && s->ws_ino) {
        json_object_set_new(o, "workspace_dev", json_integer((json_int_t)s->ws_dev));
        json_object_set_new(o, "workspace_ino", json_integer((json_int_t)s->ws_ino));
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.4000s/session.json", s->dir);
    char *text = o ? json_dumps(o, JSON_INDENT(1)) : NULL;
    /* temp + rename: a full disk leaves the previous session.json intact */
    int rc = -1;
    if (!o || !text) {
        km_err_set(err, KM_EINTERNAL,
                   "cannot save %s: the session's options (workspace, python, env) are not "
                   "UTF-8 text",
                   path);
    } else if (write_synced(path, text, sync_dir) == 0) {
        rc = 0;
    } else {
        km_err_set(err, KM_EINTERNAL, "cannot save %s: %s", path, strerror(errno));
    }
    free(text);
    json_decref(o);
    return rc;
}

int session_save_err(km_manager *m, session *s, km_err *err)
{
    return save(m, s, 1, err);
}

void session_save(km_manager *m, session *s)
{
    km_err why = {0};
    if (save(m, s, 0, &why))
        fprintf(stderr, "kernelmgr: %s\n", why.msg);
}

/* A kernel of an earlier manager may still run: kill it, but only when
 * /proc says it is really that kernel (its argv names the connection file). */
void kill_stale(int pid, const char *cf)
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

session *session_alloc(const char *name)
{
    session *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    snprintf(s->name, sizeof s->name, "%s", name);
    pthread_mutex_init(&s->lock, NULL);
    /* every option the configuration's (a warm-pool entry or a repaired
     * session keeps that; zygote and ipython were 0, "off", from calloc) */
    km_sessopt_unset(s);
    s->created = s->last_used = cm_wall_s();
    return s;
}

json_t *session_json_read(const char *path, km_err *why)
{
    char *data = NULL;
    size_t len = 0;
    const char *rr;
    if (cm_read_regular(path, SESSION_JSON_MAX, CM_RR_OWNED, &data, &len, &rr)) {
        int e = errno;
        km_err_set(why, KM_EINTERNAL, "%s %s", path, rr);
        errno = e;
        return NULL;
    }
    json_error_t jerr;
    json_t *o = len ? json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr) : NULL;
    free(data);
    const char *bad = NULL;
    json_t *opt = json_object_get(o, "options");
    json_t *ws = json_object_get(o, "workspace");
    json_t *mem = json_object_get(opt, "memory");
    json_t *kernels = json_object_get(o, "kernels");
    if (!len)
        bad = "is empty";
    else if (!o)
        km_err_set(why, KM_EINTERNAL, "%s is not valid JSON (%s at line %d, column %d)", path,
                   jerr.position >= (int)len ? "it ends early" : "an error", jerr.line,
                   jerr.column);
    else if (!json_is_object(o))
        bad = "is not a JSON object";
    else if (!json_is_string(ws) || json_string_value(ws)[0] != '/' ||
             strlen(json_string_value(ws)) != json_string_length(ws))
        bad = "has no \"workspace\" that is an absolute path";
    else if (!json_is_boolean(json_object_get(o, "own_workspace")))
        bad = "has no \"own_workspace\" that is true or false";
    else if (!json_is_object(opt))
        bad = "has no \"options\" object";
    else if (mem && !(json_is_integer(mem) && json_integer_value(mem) >= 0))
        bad = "has an \"options.memory\" that is not a number of bytes";
    else if (kernels && !json_is_object(kernels))
        bad = "has a \"kernels\" that is not an object";
    else
        return o;
    if (bad)
        km_err_set(why, KM_EINTERNAL, "%s %s", path, bad);
    json_decref(o);
    errno = EINVAL;
    return NULL;
}

int session_json_set_aside(const char *path, char *out, size_t outlen)
{
    time_t now = time(NULL);
    struct tm tm;
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", gmtime_r(&now, &tm));
    for (int i = 0; i < 100; i++) {
        if (i)
            snprintf(out, outlen, "%s.corrupt-%s-%d", path, stamp, i);
        else
            snprintf(out, outlen, "%s.corrupt-%s", path, stamp);
        if (renameat2(AT_FDCWD, path, AT_FDCWD, out, RENAME_NOREPLACE) == 0)
            return 0;
        if (errno == EINVAL || errno == ENOSYS) {
            /* no RENAME_NOREPLACE on this file system: link + unlink */
            if (link(path, out) == 0)
                return unlink(path);
        }
        if (errno != EEXIST)
            return -1;
    }
    errno = EEXIST;
    return -1;
}

int session_set_aside_find(const char *dir, char *out, size_t outlen)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int found = 0;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, "session.json.corrupt-", 21))
            continue;
        /* the newest: the names sort by time */
        if (!found || strcmp(de->d_name, strrchr(out, '/') + 1) > 0)
            snprintf(out, outlen, "%s/%s", dir, de->d_name);
        found = 1;
    }
    if (d)
        closedir(d);
    return found;
}

/* Loads sessions/NAME/session.json into a session (kernels not started).
 * Kernels it lists are from an earlier manager: killed and marked pending. */
session *session_load(km_manager *m, const char *name, km_err *why)
{
    why->msg[0] = 0;
    char dir[PATH_MAX - 64], path[PATH_MAX], aside[PATH_MAX + 64];
    km_err reason = {0};
    snprintf(dir, sizeof dir, "%.3000s/sessions/%.64s", m->home, name);
    snprintf(path, sizeof path, "%s/session.json", dir);
    int dc = kmhome_check_dir(dir, 0, why);
    if (dc) {
        if (dc > 0)
            why->msg[0] = 0;
        return NULL;
    }
    json_t *o = session_json_read(path, &reason);
    struct stat st;
    if (!o && errno != ENOENT && lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* not a file a manager wrote (a directory in the way): no session
         * was ever saved here; creating one says why it cannot be saved */
        return NULL;
    }
    if (!o) {
        if (errno == ENOENT) {
            if (session_set_aside_find(dir, aside, sizeof aside)) {
                /* why it was set aside: the kept file says it again */
                json_t *again = session_json_read(aside, &reason);
                size_t al = strlen(aside);
                const char *r = !again && !strncmp(reason.msg, aside, al) && reason.msg[al] == ' '
                                    ? reason.msg + al + 1
                                    : "could not be used";
                json_decref(again);
                km_err_set(why, KM_EINTERNAL,
                           "session \"%s\" is damaged: its session.json %s; the file was kept "
                           "as %s and the session is not recreated silently; `kernelmgr "
                           "sessions --repair %s` recreates it (or close it)",
                           name, r, aside, name);
            }
            return NULL;
        }
        if (session_json_set_aside(path, aside, sizeof aside))
            snprintf(aside, sizeof aside, "%s (it could not be renamed aside: %s)", path,
                     strerror(errno));
        km_err_set(why, KM_EINTERNAL,
                   "session \"%s\" is damaged: %s; the file was kept as %s and the session is "
                   "not recreated silently; `kernelmgr sessions --repair %s` recreates it (or "
                   "close it)",
                   name, reason.msg, aside, name);
        return NULL;
    }
    session *s = session_alloc(name);
    if (!s) {
        json_decref(o);
        km_err_set(why, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    snprintf(s->outdir, sizeof s->outdir, "%.3000s/outputs/%.64s", m->home, name);
    const char *ws = json_string_value(json_object_get(o, "workspace"));
    snprintf(s->workspace, sizeof s->workspace, "%s", ws);
    s->own_workspace = json_is_true(json_object_get(o, "own_workspace"));
    json_t *wdev = json_object_get(o, "workspace_dev"), *wino = json_object_get(o, "workspace_ino");
    if (json_is_integer(wdev) && json_is_integer(wino) && json_integer_value(wino) > 0) {
        s->ws_dev = (unsigned long long)json_integer_value(wdev);
        s->ws_ino = (unsigned long long)json_integer_value(wino);
    }
    s->from_pool = json_is_true(json_object_get(o, "from_pool"));
    const char *pd = json_string_value(json_object_get(o, "pool_dir"));
    snprintf(s->pool_dir, sizeof s->pool_dir, "%s", pd ? pd : "");
    json_t *created = json_object_get(o, "created");
    if (json_is_number(created))
        s->created = json_number_value(created);
    km_sessopt_load(m, s, json_object_get(o, "options"), name);
    const char *lk;
    json_t *kv;
    json_object_foreach(json_object_get(o, "kernels"), lk, kv)
    {
        /* by name (session.json records names, never aliases); a kernel
         * of a language the configuration no longer has is still ours to
         * stop */
        int l = -1;
        for (int i = 0; i < m->cfg.langs.n; i++)
            if (!strcmp(m->cfg.langs.v[i].name, lk))
                l = i;
        kill_stale((int)json_integer_value(json_object_get(kv, "pid")),
                   json_string_value(json_object_get(kv, "connection_file")));
        if (l < 0)
            continue;
        snprintf(s->k[l].pending, sizeof s->k[l].pending,
                 "the manager restarted; the %s kernel was replaced by a fresh one and its "
                 "state was lost (workspace kept)",
                 kmcfg_lang_name(&m->cfg, l));
        /* periodic snapshots keep "auto" current: a manager that died
         * without stopping its sessions left one to restore */
        if (m->cfg.snapshot_interval > 0 && snap_has(m, s, l, SNAP_AUTO))
            snprintf(s->k[l].restore, sizeof s->k[l].restore, "%s", SNAP_AUTO);
    }
    json_object_foreach(json_object_get(o, "restore"), lk, kv)
    {
        const char *tag = json_string_value(kv);
        km_err terr = {0};
        for (int i = 0; i < m->cfg.langs.n; i++)
            if (tag && !strcmp(m->cfg.langs.v[i].name, lk) && snap_tag_check(tag, &terr) == 0) {
                snprintf(s->k[i].restore, sizeof s->k[i].restore, "%s", tag);
                snprintf(s->k[i].pending, sizeof s->k[i].pending,
                         "the manager restarted; the %s kernel was replaced by a fresh one", lk);
            }
    }
    json_decref(o);
    return s;
}

void session_free(session *s)
{
    for (int l = 0; l < KM_LANG_MAX; l++)
        json_decref(s->k[l].restored);
    json_decref(s->env);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
