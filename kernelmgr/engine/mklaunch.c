/*
 * mklaunch.c — kernel processes: connection files, posix_spawn, stop.
 */
#include "kernelmgr/engine/mklaunch.h"
#include "common/cm_install.h"
#include "kernelmgr/engine/kmhome.h"
#include "common/cm_array.h"
#include "common/cm_clock.h"
#include "common/cm_io.h"
#include "common/cm_path.h"

#include "kernels/server/kenvpath.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

void klaunch_cmd_clear(klaunch_cmd *cmd)
{
    for (int i = 0; i < KLAUNCH_MAX_ARGS && cmd->argv[i]; i++)
        free(cmd->argv[i]);
    memset(cmd, 0, sizeof *cmd);
}

int klaunch_cmd_add(klaunch_cmd *cmd, const char *arg)
{
    int i = 0;
    while (i < KLAUNCH_MAX_ARGS && cmd->argv[i])
        i++;
    if (i >= KLAUNCH_MAX_ARGS)
        return -1;
    cmd->argv[i] = strdup(arg);
    return cmd->argv[i] ? 0 : -1;
}

int klaunch_self_dir(char *out, size_t size)
{
    char *dir = cm_install_exe_dir();
    int rc = dir && strlen(dir) < size ? 0 : -1;
    if (rc == 0)
        memcpy(out, dir, strlen(dir) + 1);
    free(dir);
    return rc;
}

/* The kernelspec search path into dirs (which owns the strings): the first
 * 4 entries of $JUPYTER_PATH, then the user's and the system's data
 * directories. 0, or -1 when out of memory. */
static int kernelspec_dirs(cm_array *dirs)
{
    const char *jp = getenv("JUPYTER_PATH");
    if (jp) {
        char *tmp = strdup(jp), *save = NULL;
        if (!tmp)
            return -1;
        int n = 0, rc = 0;
        for (char *t = strtok_r(tmp, ":", &save); t && n < 4 && !rc;
             t = strtok_r(NULL, ":", &save), n++)
            rc = cm_array_push_str(dirs, t);
        free(tmp);
        if (rc)
            return -1;
    }
    const char *home = getenv("HOME");
    if (home) {
        char *h = cm_path_join(home, ".local/share/jupyter");
        if (!h || cm_array_push(dirs, h)) {
            free(h);
            return -1;
        }
    }
    return cm_array_push_str(dirs, "/usr/local/share/jupyter") ||
                   cm_array_push_str(dirs, "/usr/share/jupyter")
               ? -1
               : 0;
}

/* Loads DIR/kernel.json into cmd: 0, 1 when there is none, -1 with err set
 * when it is there but unusable. */
static int load_kernelspec(klaunch_cmd *cmd, const char *name, const char *dir, km_err *err)
{
    char *path = cm_path_join(dir, "kernel.json");
    if (!path) {
        km_err_set(err, KM_EKERNEL, "out of memory");
        return -1;
    }
    json_error_t jerr;
    json_t *spec = json_load_file(path, 0, &jerr);
    if (!spec) {
        free(path);
        return 1;
    }
    int rc = -1;
    json_t *argv = json_object_get(spec, "argv");
    if (!json_is_array(argv) || json_array_size(argv) == 0 ||
        json_array_size(argv) > KLAUNCH_MAX_ARGS) {
        km_err_set(err, KM_EKERNEL, "kernelspec %s (%s): \"argv\" must be a non-empty array", name,
                   path);
        goto out;
    }
    if (strlen(dir) >= sizeof cmd->resource_dir) {
        km_err_set(err, KM_EKERNEL, "kernelspec %s: its directory's path is longer than %zu bytes",
                   name, sizeof cmd->resource_dir - 1);
        goto out;
    }
    klaunch_cmd_clear(cmd);
    size_t k;
    json_t *a;
    json_array_foreach(argv, k, a)
    {
        if (!json_is_string(a) || klaunch_cmd_add(cmd, json_string_value(a))) {
            km_err_set(err, KM_EKERNEL, "kernelspec %s: argv[%zu] is not a string", name, k);
            klaunch_cmd_clear(cmd);
            goto out;
        }
    }
    snprintf(cmd->resource_dir, sizeof cmd->resource_dir, "%s", dir);
    const char *im = json_string_value(json_object_get(spec, "interrupt_mode"));
    cmd->interrupt_signal = !(im && !strcmp(im, "message"));
    const char *dn = json_string_value(json_object_get(spec, "display_name"));
    snprintf(cmd->display_name, sizeof cmd->display_name, "%s", dn ? dn : name);
    rc = 0;
out:
    json_decref(spec);
    free(path);
    return rc;
}

int klaunch_cmd_from_kernelspec(klaunch_cmd *cmd, const char *name, km_err *err)
{
    cm_array dirs = CM_ARRAY_INIT;
    int rc = kernelspec_dirs(&dirs) ? -1 : 1;
    if (rc < 0)
        km_err_set(err, KM_EKERNEL, "out of memory");
    for (size_t i = 0; rc > 0 && i < dirs.len; i++) {
        char *dir = cm_path_fmt("%s/kernels/%s", (const char *)dirs.items[i], name);
        if (!dir) {
            km_err_set(err, KM_EKERNEL, "out of memory");
            rc = -1;
            break;
        }
        rc = load_kernelspec(cmd, name, dir, err);
        free(dir);
    }
    cm_array_free(&dirs, free);
    if (rc > 0) {
        km_err_set(err, KM_EKERNEL,
                   "no kernelspec named \"%s\" (looked in $JUPYTER_PATH, "
                   "~/.local/share/jupyter, /usr/local/share/jupyter, /usr/share/jupyter)",
                   name);
        rc = -1;
    }
    return rc;
}

/* 1 when path is a directory on tmpfs (or ramfs): files and sockets made
 * there cost no disk inode allocation or journal. */
static int on_tmpfs(const char *path)
{
    struct statfs fs;
    return statfs(path, &fs) == 0 &&
           ((unsigned long)fs.f_type == TMPFS_MAGIC || (unsigned long)fs.f_type == RAMFS_MAGIC);
}

/* A directory to hold a private run directory of ours: on tmpfs, not a
 * symbolic link, and either our own (XDG_RUNTIME_DIR, /run/user/UID: the
 * home's rules, kmhome.h) or root's shared sticky one (/dev/shm), where
 * only a directory of our own below it is used. */
static int runtime_base_ok(const char *base, int shared)
{
    struct stat st;
    const char *why;
    if (!base || base[0] != '/' || lstat(base, &st) != 0 || !S_ISDIR(st.st_mode) || !on_tmpfs(base))
        return 0;
    if (shared)
        return st.st_uid == 0 && (st.st_mode & S_ISVTX);
    return kmhome_stat_ok(&st, geteuid(), &why) == 0;
}

/* base/kernelmgr-UID-DEV-INO, named after the home's device and inode (two
 * homes never share one, however they are spelled), made 0700 and checked
 * as the home's directories are. 0, or -1 when it does not fit or is not
 * fit (another user's, a link): the next candidate is tried. */
static int runtime_dir(const char *base, const struct stat *home_st, char *out, size_t size,
                       size_t room)
{
    int n = snprintf(out, size, "%s/kernelmgr-%u-%llx-%llx", base, (unsigned)geteuid(),
                     (unsigned long long)home_st->st_dev, (unsigned long long)home_st->st_ino);
    km_err why = {0};
    if (n < 0 || (size_t)n >= size || (size_t)n + room >= sizeof((struct sockaddr_un *)0)->sun_path)
        return -1;
    if (kmhome_mkdir(out, 0700, &why))
        return -1;
    struct stat st; /* ours: nobody else even lists it */
    return lstat(out, &st) == 0 && (!(st.st_mode & 077) || chmod(out, 0700) == 0) ? 0 : -1;
}

int klaunch_run_dir(const char *home, char *out, size_t size, km_err *err)
{
    /* ipc endpoints are "STEM-N" with STEM = DIR/<32 hex>-<lang>: keep room */
    const size_t room = 48;
    struct sockaddr_un sun;
    struct stat home_st;
    int fits = strlen(home) + strlen("/run/") + room < sizeof sun.sun_path;
    /* Runtime files (connection files, ipc sockets, pid files, kernel
     * histories) on tmpfs: a burst of starts then allocates no disk inodes
     * (on ext4, ~60 % of the daemon's CPU). In order: $XDG_RUNTIME_DIR
     * when it is a tmpfs of our own; the home's run/ when the home is on
     * tmpfs; /run/user/UID; /dev/shm; else the home's run/ on disk. */
    if (stat(home, &home_st) == 0) {
        const char *xdg = getenv("XDG_RUNTIME_DIR");
        char user_run[64];
        snprintf(user_run, sizeof user_run, "/run/user/%u", (unsigned)geteuid());
        if (runtime_base_ok(xdg, 0) && runtime_dir(xdg, &home_st, out, size, room) == 0)
            return 0;
        if (!(fits && on_tmpfs(home))) {
            if (runtime_base_ok(user_run, 0) &&
                runtime_dir(user_run, &home_st, out, size, room) == 0)
                return 0;
            if (runtime_base_ok("/dev/shm", 1) &&
                runtime_dir("/dev/shm", &home_st, out, size, room) == 0)
                return 0;
        }
    }
    if (fits) {
        snprintf(out, size, "%s/run", home);
    } else {
        /* a private directory named after the home, so two homes never share it */
        unsigned long h = 5381;
        for (const char *p = home; *p; p++)
            h = h * 33 + (unsigned char)*p;
        snprintf(out, size, "/tmp/kernelmgr-%u-%08lx", (unsigned)getuid(), h & 0xffffffffUL);
    }
    /* the home's one check (kmhome.h): ours, writable by nobody else */
    if (kmhome_mkdir(out, 0700, err))
        return -1;
    struct stat st;
    if (lstat(out, &st) == 0 && (st.st_mode & 077) && chmod(out, 0700)) {
        km_err_set(err, KM_EKERNEL, "cannot chmod %s: %s", out, strerror(errno));
        return -1;
    }
    return 0;
}

int klaunch_lifeline_open(int fds[2], km_err *err)
{
    if (pipe2(fds, O_CLOEXEC)) {
        km_err_set(err, KM_EKERNEL, "cannot create the kernels' lifeline pipe: %s",
                   strerror(errno));
        fds[0] = fds[1] = -1;
        return -1;
    }
    return 0;
}

unsigned long long klaunch_proc_start(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = cm_read_full(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    /* the command name may hold spaces and parentheses: fields start after the last ')' */
    char *p = strrchr(buf, ')');
    char state = 0;
    unsigned long long start = 0;
    if (!p || sscanf(p + 1,
                     " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
                     "%*d %*d %llu",
                     &state, &start) != 2)
        return 0;
    return state == 'Z' || state == 'X' ? 0 : start;
}

/* Wall-clock time of boot (seconds), from /proc/stat; 0 when unknown. */
static double boot_time(void)
{
    static double bt;
    if (bt > 0)
        return bt;
    FILE *f = fopen("/proc/stat", "re");
    char line[256];
    unsigned long long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "btime %llu", &v) == 1)
            break;
    if (f)
        fclose(f);
    bt = (double)v;
    return bt;
}

typedef struct owner_lock {
    char *dir;
    int fd;
    int refs;
    struct owner_lock *next;
} owner_lock;

static pthread_mutex_t owner_mu = PTHREAD_MUTEX_INITIALIZER;
static owner_lock *owners;

static char *owner_path(const char *run_dir, pid_t pid)
{
    char *p = NULL;
    return asprintf(&p, "%s/owner-%d.lock", run_dir, (int)pid) < 0 ? NULL : p;
}

int klaunch_owner_hold(const char *run_dir, km_err *err)
{
    pthread_mutex_lock(&owner_mu);
    for (owner_lock *o = owners; o; o = o->next)
        if (!strcmp(o->dir, run_dir)) {
            o->refs++;
            pthread_mutex_unlock(&owner_mu);
            return 0;
        }
    owner_lock *o = calloc(1, sizeof *o);
    char *path = owner_path(run_dir, getpid());
    if (!o || !path || !(o->dir = strdup(run_dir))) {
        km_err_set(err, KM_EKERNEL, "out of memory");
        goto fail;
    }
    /* A scanner that found an earlier owner-PID.lock of a dead process with
     * our pid may remove it while we open it: retry until the file we hold
     * is the one at the path. */
    for (int tries = 0;; tries++) {
        o->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        /* the last owner removed the (empty) run directory meanwhile (see
         * klaunch_owner_release): made again, with the home's check */
        if (o->fd < 0 && errno == ENOENT && tries < 20 && !kmhome_mkdir(run_dir, 0700, err))
            continue;
        if (o->fd < 0) {
            km_err_set(err, KM_EKERNEL, "owner lock %s: %s", path, strerror(errno));
            goto fail;
        }
        int rc;
        while ((rc = flock(o->fd, LOCK_SH)) && errno == EINTR)
            ;
        struct stat a, b;
        if (rc == 0 && fstat(o->fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            break;
        int e = rc ? errno : ESTALE;
        close(o->fd);
        if (tries >= 20) {
            km_err_set(err, KM_EKERNEL, "owner lock %s: %s", path, strerror(e));
            goto fail;
        }
    }
    o->refs = 1;
    o->next = owners;
    owners = o;
    pthread_mutex_unlock(&owner_mu);
    free(path);
    return 0;
fail:
    if (o)
        free(o->dir);
    free(o);
    free(path);
    pthread_mutex_unlock(&owner_mu);
    return -1;
}

void klaunch_owner_release(const char *run_dir)
{
    pthread_mutex_lock(&owner_mu);
    for (owner_lock **pp = &owners; *pp; pp = &(*pp)->next) {
        owner_lock *o = *pp;
        if (strcmp(o->dir, run_dir))
            continue;
        if (--o->refs == 0) {
            *pp = o->next;
            char *path = owner_path(o->dir, getpid());
            if (path)
                unlink(path);
            free(path);
            /* the last owner leaves no empty directory behind (one per home
             * would pile up in /dev/shm); one that still holds a file stays */
            rmdir(o->dir);
            close(o->fd);
            free(o->dir);
            free(o);
        }
        break;
    }
    pthread_mutex_unlock(&owner_mu);
}

int klaunch_owner_alive(const char *run_dir, pid_t pid, unsigned long long start,
                        double started_before)
{
    if (pid <= 0)
        return 0;
    unsigned long long cur = klaunch_proc_start(pid);
    if (!cur || (start && cur != start))
        return 0;
    long hz = sysconf(_SC_CLK_TCK);
    if (started_before > 0 && hz > 0 && boot_time() > 0 &&
        boot_time() + (double)cur / (double)hz > started_before + 2)
        return 0; /* a later process that got the pid */
    char *path = owner_path(run_dir, pid);
    if (!path)
        return 1; /* cannot tell: never take a live owner's kernels */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    free(path);
    if (fd < 0)
        return errno == ENOENT ? 1 : 1; /* no lock (an older manager) or unreadable: alive */
    int held = flock(fd, LOCK_EX | LOCK_NB) != 0;
    close(fd); /* drops our lock if we got it */
    return held;
}

/* 1 when name is "ID" + suffix; copies ID into id. */
static int split_suffix(const char *name, const char *suffix, char *id, size_t size)
{
    size_t n = strlen(name), sl = strlen(suffix);
    if (n <= sl || strcmp(name + n - sl, suffix) || n - sl >= size)
        return 0;
    memcpy(id, name, n - sl);
    id[n - sl] = 0;
    return 1;
}

static int exists_at(int dfd, const char *id, const char *suffix)
{
    char name[512];
    if ((size_t)snprintf(name, sizeof name, "%s%s", id, suffix) >= sizeof name)
        return 1;
    return faccessat(dfd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

static void unlink_id(int dfd, const char *id, const char *suffix)
{
    char name[512];
    if ((size_t)snprintf(name, sizeof name, "%s%s", id, suffix) < sizeof name)
        unlinkat(dfd, name, 0);
}

#define KLAUNCH_TREE_MAX 4096

/* Appends the children of every thread of pid (/proc/PID/task/TID/children)
 * to tree[*n..) unless already there. */
static void add_children(pid_t pid, pid_t *tree, size_t *n)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char cpath[96], buf[4096];
        snprintf(cpath, sizeof cpath, "/proc/%d/task/%.20s/children", (int)pid, de->d_name);
        int fd = open(cpath, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t len = cm_read_full(fd, buf, sizeof buf - 1);
        close(fd);
        if (len <= 0)
            continue;
        buf[len] = 0;
        for (char *p = buf, *end; *p; p = end) {
            long c = strtol(p, &end, 10);
            if (end == p)
                break;
            int seen = c <= 1;
            for (size_t i = 0; i < *n && !seen; i++)
                seen = tree[i] == (pid_t)c;
            if (!seen && *n < KLAUNCH_TREE_MAX)
                tree[(*n)++] = (pid_t)c;
        }
    }
    if (d)
        closedir(d);
}

void klaunch_kill_tree(pid_t root)
{
    if (root <= 1)
        return;
    pid_t *tree = malloc(KLAUNCH_TREE_MAX * sizeof *tree);
    if (!tree) {
        kill(-root, SIGKILL);
        kill(root, SIGKILL);
        return;
    }
    /* Freeze first, so nothing forks past the walk; walk again until no
     * new process shows up (a process may have forked before it stopped). */
    size_t n = 1, stopped = 0;
    tree[0] = root;
    for (int round = 0; round < 4; round++) {
        size_t before = n;
        for (size_t i = 0; i < n; i++)
            add_children(tree[i], tree, &n);
        for (; stopped < n; stopped++)
            kill(tree[stopped], SIGSTOP);
        if (n == before && round > 0)
            break;
    }
    kill(-root, SIGKILL);
    for (size_t i = 0; i < n; i++)
        kill(tree[i], SIGKILL);
    free(tree);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Reads ID.pid: 0 when it has the four fields. */
static int read_pid_file(int dfd, const char *name, unsigned long long v[4])
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -1;
    char buf[256];
    ssize_t n = cm_read_full(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return sscanf(buf, "%llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3]) == 4 ? 0 : -1;
}

int klaunch_reap_orphans(const char *run_dir)
{
    DIR *d = opendir(run_dir);
    if (!d)
        return 0;
    int dfd = dirfd(d), killed = 0;
    time_t now = time(NULL);
    struct dirent *de;
    char id[256];
    /* 1: kernels of dead owners */
    while ((de = readdir(d))) {
        if (!split_suffix(de->d_name, ".pid", id, sizeof id))
            continue;
        unsigned long long v[4];
        struct stat st;
        if (read_pid_file(dfd, de->d_name, v)) {
            /* torn or foreign: only an old one goes */
            if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && now - st.st_mtime > 60)
                unlinkat(dfd, de->d_name, 0);
            continue;
        }
        if (v[2] > INT_MAX || v[0] > INT_MAX || klaunch_owner_alive(run_dir, (pid_t)v[2], v[3], 0))
            continue;
        pid_t kpid = (pid_t)v[0];
        if (kpid > 1 && v[1] && klaunch_proc_start(kpid) == v[1]) {
            fprintf(stderr,
                    "kernelmgr: killing kernel %d (%s) left by process %llu, which has ended\n",
                    (int)kpid, id, v[2]);
            klaunch_kill_tree(kpid);
            killed++;
            /* its parent is gone: init reaps it; wait until it is no longer running */
            for (int i = 0; i < 200 && klaunch_proc_start(kpid) == v[1]; i++)
                sleep_ms(10);
        }
        unlink_id(dfd, id, ".json");
        unlink_id(dfd, id, ".json.history.jsonl");
        unlink_id(dfd, id, ".sbx"); /* a session sandbox holder's socket */
        unlinkat(dfd, de->d_name, 0);
    }
    /* 2: connection files without a pid file (an older manager's, or a
     * start cut short) once they are old; stale owner locks */
    rewinddir(d);
    while ((de = readdir(d))) {
        struct stat st;
        if (split_suffix(de->d_name, ".json", id, sizeof id)) {
            if (!exists_at(dfd, id, ".pid") &&
                fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && now - st.st_mtime > 60) {
                unlinkat(dfd, de->d_name, 0);
                unlink_id(dfd, id, ".json.history.jsonl");
            }
        } else if (!strncmp(de->d_name, "owner-", 6) &&
                   split_suffix(de->d_name + 6, ".lock", id, sizeof id)) {
            int fd = openat(dfd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
            if (fd < 0)
                continue;
            /* free: its process ended (ours is held by us, so never free here) */
            if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                unlinkat(dfd, de->d_name, 0);
            close(fd);
        }
    }
    /* 3: ipc sockets ID-N of kernels that have neither connection nor pid file */
    rewinddir(d);
    while ((de = readdir(d))) {
        struct stat sst;
        /* a session sandbox holder's socket ID.sbx, likewise */
        if (split_suffix(de->d_name, ".sbx", id, sizeof id)) {
            if (!exists_at(dfd, id, ".json") && !exists_at(dfd, id, ".pid") &&
                fstatat(dfd, de->d_name, &sst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(sst.st_mode))
                unlinkat(dfd, de->d_name, 0);
            continue;
        }
        char *dash = strrchr(de->d_name, '-');
        if (!dash || !dash[1] || strspn(dash + 1, "0123456789") != strlen(dash + 1) ||
            (size_t)(dash - de->d_name) >= sizeof id)
            continue;
        memcpy(id, de->d_name, (size_t)(dash - de->d_name));
        id[dash - de->d_name] = 0;
        struct stat st;
        if (!exists_at(dfd, id, ".json") && !exists_at(dfd, id, ".pid") &&
            fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISSOCK(st.st_mode))
            unlinkat(dfd, de->d_name, 0);
    }
    closedir(d);
    return killed;
}

/* Substitutes placeholders in one argument. new (free()). */
static char *subst(const char *arg, const char *cf, const char *resdir)
{
    size_t cap = strlen(arg) + strlen(cf) * 4 + strlen(resdir) * 4 + 1;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t n = 0;
    for (const char *p = arg; *p;) {
        const char *rep = NULL;
        size_t skip = 0;
        if (!strncmp(p, "{connection_file}", 17)) {
            rep = cf;
            skip = 17;
        } else if (!strncmp(p, "{resource_dir}", 14)) {
            rep = resdir;
            skip = 14;
        }
        if (rep) {
            size_t l = strlen(rep);
            if (n + l + 1 > cap)
                break;
            memcpy(out + n, rep, l);
            n += l;
            p += skip;
        } else {
            if (n + 2 > cap)
                break;
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return out;
}

static void remove_ipc(const jp_connection *c)
{
    if (strcmp(c->transport, "ipc"))
        return;
    for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++) {
        char path[sizeof c->ip + 16];
        snprintf(path, sizeof path, "%s-%d", c->ip, c->ports[ch]);
        unlink(path);
    }
}

/* Writes kp->pid_path (temp + rename): "KPID KSTART OPID OSTART". 0 or -1 with err. */
static int write_pid_file(const kproc *kp, km_err *err)
{
    static unsigned long long self_start;
    if (!self_start)
        self_start = klaunch_proc_start(getpid());
    char *tmp = NULL, line[128];
    int len = snprintf(line, sizeof line, "%d %llu %d %llu\n", (int)kp->pid,
                       klaunch_proc_start(kp->pid), (int)getpid(), self_start);
    if (asprintf(&tmp, "%s.tmp", kp->pid_path) < 0) {
        km_err_set(err, KM_EKERNEL, "out of memory");
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    ssize_t w = fd >= 0 ? write(fd, line, (size_t)len) : -1;
    int rc = fd >= 0 && w == len && close(fd) == 0 ? rename(tmp, kp->pid_path) : -1;
    if (rc) {
        int e = w >= 0 && w < len ? ENOSPC : errno;
        if (fd >= 0 && w != len)
            close(fd);
        km_err_set(err, KM_EKERNEL, "kernel pid file %s: %s", kp->pid_path, strerror(e));
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

/* The program to exec: argv0 itself when it names a path, else the first
 * executable argv0 in the PATH of envp (execvp's search; its default when
 * there is none). new (free()), or NULL (errno ENOENT or ENOMEM). */
static char *spawn_path(const char *argv0, char *const envp[])
{
    if (strchr(argv0, '/'))
        return strdup(argv0);
    const char *path = "/usr/local/bin:/usr/bin:/bin";
    for (size_t i = 0; envp[i]; i++)
        if (!strncmp(envp[i], "PATH=", 5))
            path = envp[i] + 5;
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        char *cand = NULL;
        if (n && asprintf(&cand, "%.*s/%s", (int)n, p, argv0) < 0)
            return NULL;
        if (cand && access(cand, X_OK) == 0)
            return cand;
        free(cand);
        p += n;
        if (*p == ':')
            p++;
    }
    errno = ENOENT;
    return NULL;
}

/* Starts exe with posix_spawn (glibc: clone with CLONE_VM|CLONE_VFORK, so
 * a manager with a big heap and many threads copies no page tables): its
 * own process group, every signal at its default and none blocked, stdin
 * /dev/null, stdout and stderr the log, the lifeline (when > 2) as
 * KLAUNCH_OWNER_FD, nothing else open, cwd dir. 0 with *pid, or -1 with
 * err (an exec that fails is reported here, not by the child). */
static int spawn_kernel(int lifeline_fd, int nullfd, int logfd, const char *dir, const char *exe,
                        char *const argv[], char *const envp[], pid_t *pid, km_err *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc) {
        km_err_set(err, KM_EKERNEL, "cannot start kernel %s: %s", exe, strerror(rc));
        return -1;
    }
    if ((rc = posix_spawnattr_init(&at))) {
        posix_spawn_file_actions_destroy(&fa);
        km_err_set(err, KM_EKERNEL, "cannot start kernel %s: %s", exe, strerror(rc));
        return -1;
    }
    /* 0-2 first (their sources are still intact), then the lifeline: a
     * dup2 onto its own number clears close-on-exec (glibc, POSIX 2024) */
    int lifeline = lifeline_fd > 2;
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, nullfd, 0);
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, logfd, 1);
    if (!rc)
        rc = posix_spawn_file_actions_adddup2(&fa, logfd, 2);
    if (!rc && lifeline)
        rc = posix_spawn_file_actions_adddup2(&fa, lifeline_fd, KLAUNCH_OWNER_FD);
    if (!rc)
        rc = posix_spawn_file_actions_addclosefrom_np(&fa, lifeline ? KLAUNCH_OWNER_FD + 1 : 3);
    if (!rc)
        rc = posix_spawn_file_actions_addchdir_np(&fa, dir);
    if (!rc)
        rc = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                               POSIX_SPAWN_SETSIGDEF);
    if (!rc)
        rc = posix_spawnattr_setpgroup(&at, 0);
    if (!rc)
        rc = posix_spawnattr_setsigmask(&at, &none);
    if (!rc)
        rc = posix_spawnattr_setsigdefault(&at, &all);
    if (!rc)
        rc = posix_spawn(pid, exe, &fa, &at, argv, envp);
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) {
        km_err_set(err, KM_EKERNEL, "cannot start kernel %s: %s", exe, strerror(rc));
        return -1;
    }
    return 0;
}

kproc *klaunch_start(const klaunch_cmd *cmd, const char *run_dir, const char *id,
                     const char *transport, const char *log_path, const char *kernel_name,
                     km_err *err)
{
    if (!cmd->argv[0]) {
        km_err_set(err, KM_EKERNEL, "empty kernel command");
        return NULL;
    }
    kproc *kp = calloc(1, sizeof *kp);
    if (!kp) {
        km_err_set(err, KM_EKERNEL, "out of memory");
        return NULL;
    }
    kp->pid = -1;
    kp->interrupt_signal = cmd->interrupt_signal;
    /* The kernel server is a host process: it never starts in a workspace,
     * whose content sandboxed code writes (kernelmgr's kernels are told
     * their workspace with --workspace). It starts in the run directory,
     * named absolutely so the connection file path still works. */
    char *run_abs = run_dir[0] == '/' ? strdup(run_dir) : realpath(run_dir, NULL);
    if (!run_abs) {
        km_err_set(err, KM_EKERNEL, "run directory %s: %s", run_dir, strerror(errno));
        free(kp);
        return NULL;
    }
    char *stem = cm_path_join(run_abs, id);
    if (!stem || strlen(stem) + sizeof ".json" > sizeof kp->cf_path) {
        if (stem)
            km_err_set(err, KM_EKERNEL,
                       "run directory %s: the connection file's path would be longer "
                       "than %zu bytes",
                       run_abs, sizeof kp->cf_path - 1);
        else
            km_err_set(err, KM_EKERNEL, "run directory %s: out of memory", run_abs);
        free(stem);
        free(run_abs);
        free(kp);
        return NULL;
    }
    snprintf(kp->cf_path, sizeof kp->cf_path, "%s.json", stem);
    snprintf(kp->pid_path, sizeof kp->pid_path, "%s.pid", stem);
    jp_error jerr;
    int ipc = !strcmp(transport, "ipc");
    if (jp_connection_init(&kp->conn, ipc ? "ipc" : "tcp", ipc ? stem : NULL, kernel_name, &jerr) !=
            JP_OK ||
        jp_connection_write(kp->cf_path, &kp->conn, &jerr) != JP_OK) {
        km_err_set(err, KM_EKERNEL, "connection file %s: %s", kp->cf_path, jerr.reason);
        free(stem);
        free(run_abs);
        free(kp);
        return NULL;
    }
    free(stem);

    /* The environment loses empty/relative PATH and LD_LIBRARY_PATH entries
     * (kenvpath.h): they would mean the cwd. */
    char *argv[KLAUNCH_MAX_ARGS + 1] = {0};
    char **envp = kenvpath_clean_environ(environ);
    char *exe = NULL;
    int ok = envp != NULL;
    for (int i = 0; i < KLAUNCH_MAX_ARGS && cmd->argv[i]; i++)
        if (!(argv[i] = subst(cmd->argv[i], kp->cf_path, cmd->resource_dir)))
            ok = 0;
    /* no link followed, no FIFO waited on (a writer-less FIFO would block
     * the open): the log is a file the manager makes */
    int logfd =
        open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (!ok || logfd < 0 || nullfd < 0) {
        km_err_set(err, KM_EKERNEL, "cannot prepare kernel start (log %s): %s", log_path,
                   strerror(errno));
        goto fail;
    }
    struct stat lst;
    kp->log_start = fstat(logfd, &lst) == 0 ? lst.st_size : 0;
    /* execvp semantics for kernelspecs that name a program on PATH, the
     * cleaned PATH (posix_spawnp would search the manager's own) */
    if (!(exe = spawn_path(argv[0], envp))) {
        km_err_set(err, KM_EKERNEL, "cannot start kernel %s: %s", argv[0],
                   errno == ENOMEM ? "out of memory" : "not found on PATH");
        goto fail;
    }
    pid_t pid;
    if (spawn_kernel(cmd->lifeline_fd, nullfd, logfd, run_abs, exe, argv, envp, &pid, err))
        goto fail;
    /* its process group exists already: posix_spawn returns after the
     * child's setpgid, so an early kill(-pid) cannot miss it */
    kp->pid = pid;
    close(logfd);
    close(nullfd);
    logfd = nullfd = -1;
    if (write_pid_file(kp, err)) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        remove_ipc(&kp->conn);
        goto fail;
    }
    for (int i = 0; argv[i]; i++)
        free(argv[i]);
    kenvpath_free_environ(envp);
    free(exe);
    free(run_abs);
    return kp;
fail:
    if (logfd >= 0)
        close(logfd);
    if (nullfd >= 0)
        close(nullfd);
    for (int i = 0; i < KLAUNCH_MAX_ARGS; i++)
        free(argv[i]);
    kenvpath_free_environ(envp);
    free(exe);
    free(run_abs);
    unlink(kp->cf_path);
    unlink(kp->pid_path);
    free(kp);
    return NULL;
}

int klaunch_alive(kproc *kp)
{
    if (!kp || kp->pid <= 0)
        return 0;
    if (kp->exited)
        return 0;
    int st;
    pid_t r = waitpid(kp->pid, &st, WNOHANG);
    if (r == kp->pid || (r < 0 && errno == ECHILD)) {
        kp->exited = 1;
        kp->status = r == kp->pid ? st : 0;
        return 0;
    }
    return 1;
}

int klaunch_lost_port_race(kproc *kp, const char *log_path)
{
    if (!kp || strcmp(kp->conn.transport, "tcp") || klaunch_alive(kp))
        return 0;
    int fd = open(log_path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return 0;
    /* what a kernel says when its bind fails: a few lines, read at most 16 KiB */
    char buf[16384];
    ssize_t n = pread(fd, buf, sizeof buf - 1, kp->log_start);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    for (char *p = buf; p < buf + n; p += strlen(p) + 1) /* NUL bytes in the log */
        if (strstr(p, strerror(EADDRINUSE)))
            return 1;
    return 0;
}

void klaunch_signal(kproc *kp, int sig)
{
    if (kp && kp->pid > 0 && !kp->exited) {
        if (kill(-kp->pid, sig) && errno == ESRCH)
            kill(kp->pid, sig);
    }
}

const char *klaunch_describe_exit(const kproc *kp, char *buf, size_t size)
{
    if (!kp->exited)
        snprintf(buf, size, "still running");
    else if (WIFSIGNALED(kp->status))
        snprintf(buf, size, "killed by signal %d (%s)", WTERMSIG(kp->status),
                 strsignal(WTERMSIG(kp->status)));
    else if (WIFEXITED(kp->status))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(kp->status));
    else
        snprintf(buf, size, "ended");
    return buf;
}

void klaunch_stop_begin(kproc *kp)
{
    if (kp && !kp->term_sent && klaunch_alive(kp)) {
        klaunch_signal(kp, SIGTERM);
        kp->term_sent = 1;
    }
}

int klaunch_wait_exit(kproc *kp, double timeout_s)
{
    if (!klaunch_alive(kp))
        return 1;
    double t0 = cm_mono_s();
    /* a pidfd is readable once the process has ended: no polling delay */
#ifdef SYS_pidfd_open
    int pfd = (int)syscall(SYS_pidfd_open, kp->pid, 0);
#else
    int pfd = -1;
#endif
    for (;;) {
        if (!klaunch_alive(kp))
            break;
        double left = timeout_s - (cm_mono_s() - t0);
        if (left <= 0)
            break;
        if (pfd >= 0) {
            struct pollfd it = {pfd, POLLIN, 0};
            int ms = (int)(left * 1000) + 1;
            if (poll(&it, 1, ms) < 0 && errno != EINTR) {
                close(pfd);
                pfd = -1;
            }
        } else {
            sleep_ms(left > 0.01 ? 10 : 1); /* no pidfd (Linux < 5.3): poll */
        }
    }
    if (pfd >= 0)
        close(pfd);
    return !klaunch_alive(kp);
}

void klaunch_stop(kproc **p, double grace)
{
    if (!p || !*p)
        return;
    kproc *kp = *p;
    if (klaunch_alive(kp)) {
        klaunch_stop_begin(kp);
        klaunch_wait_exit(kp, grace);
        if (klaunch_alive(kp)) {
            klaunch_signal(kp, SIGKILL);
            int st;
            if (waitpid(kp->pid, &st, 0) == kp->pid) {
                kp->exited = 1;
                kp->status = st;
            }
        }
    }
    /* helpers left in the group (e.g. a kernel's own children) go too */
    if (kp->pid > 0)
        kill(-kp->pid, SIGKILL);
    unlink(kp->cf_path);
    unlink(kp->pid_path);
    remove_ipc(&kp->conn);
    free(kp);
    *p = NULL;
}
