/*
 * outprune.c — what sessions leave behind (session_int.h): outputs/ bounded
 * (runs kept, their age), and the start-up scan that removes sessions,
 * packages and kernel history files of runs that have ended.
 */
#include "kernelmgr/engine/pkgdirs.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"
#include "common/cm_clock.h"
#include "common/cm_path.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
uint64_t outputs_used(const char *dir)
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
void prune_orphans(km_manager *m)
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
            km_err why = {0};
            if (gone && pkgdirs_remove_session(m->home, de->d_name, &why))
                fprintf(stderr, "kernelmgr: %s\n", why.msg);
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
void outputs_prune(km_manager *m, int orphans)
{
    char *dir = cm_path_join(m->home, "outputs");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) {
        free(dir);
        return;
    }
    outrun *runs = NULL;
    size_t n = 0, cap = 0;
    double now = cm_wall_s();
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!km_name_valid(de->d_name))
            continue;
        char *p = cm_path_fmt("%s/sessions/%s", m->home, de->d_name);
        int live = !p || access(p, F_OK) == 0;
        free(p);
        if (live)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode))
            continue;
        if (strncmp(de->d_name, "run-", 4) != 0) {
            if (orphans && (p = cm_path_join(dir, de->d_name))) {
                session_rmtree(p);
                free(p);
            }
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
        snprintf(runs[n].name, sizeof runs[n].name, "%.*s", KM_NAME_MAX, de->d_name);
        runs[n].mtime = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
        n++;
    }
    closedir(d);
    if (n)
        qsort(runs, n, sizeof *runs, outrun_newest_first);
    for (size_t i = 0; i < n; i++) {
        int too_many = i >= m->cfg.outputs_keep_runs;
        int too_old = m->cfg.outputs_max_age > 0 && now - runs[i].mtime > m->cfg.outputs_max_age;
        char *p = too_many || too_old ? cm_path_join(dir, runs[i].name) : NULL;
        if (p)
            session_rmtree(p);
        free(p);
    }
    free(runs);
    free(dir);
}

/* 1 when session.json names a manager process other than this one that is
 * still alive: a one-shot `run` in progress, not a session to take over. */
int owned_by_live_manager(const km_manager *m, const char *name)
{
    /* a one-shot run-PID-TIME belongs to process PID, started before TIME,
     * holding its owner lock (mklaunch.h): a reused pid is not its owner */
    unsigned long rpid = 0;
    long long rtime = 0;
    if (sscanf(name, "run-%lu-%lld", &rpid, &rtime) == 2 && rpid > 1 && rpid <= INT_MAX &&
        rtime > 0)
        return klaunch_owner_alive(m->run_dir, (pid_t)rpid, 0, (double)rtime);
    char *path = cm_path_fmt("%s/sessions/%s/session.json", m->home, name);
    km_err why = {0};
    json_t *o = path ? session_json_read(path, &why) : NULL;
    free(path);
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
void reap_dead_runs(km_manager *m)
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
            km_err why = {0};
            json_t *o = session_json_read(sj, &why); /* NULL: no kernels to stop */
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
        km_err why = {0};
        if (pkgdirs_remove_session(m->home, de->d_name, &why))
            fprintf(stderr, "kernelmgr: %s\n", why.msg);
        session_rmtree(sdir);
        free(sdir);
    }
    if (d)
        closedir(d);
    free(dir);
}
