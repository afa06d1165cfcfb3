/*
 * snapshot.c — snapshots of a session (snapshot.h): the staging directory
 * in the workspace, the kernel's snapshot request, the bounded fd-based
 * copies in and out of the store, the manifest.
 */
#include "kernelmgr/engine/snapshot.h"

#include "common/cm_clock.h"
#include "common/cm_io.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/wsfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SNAP_STAGE_PREFIX ".kernelmgr-snapshot-"
#define SNAP_FILES_MAX 64    /* files of one kernel's state */
#define SNAP_LOST_MAX 1000   /* lost names kept in a manifest */
#define SNAP_DEPTH_MAX 64    /* directory depth of a workspace copy */
#define SNAP_TIMEOUT_MIN 120 /* seconds a kernel has to save or load */
/* seconds for an automatic snapshot: a cull or an eviction (another
 * session's start waits for it) is not held longer by a kernel that does
 * not answer; its state is then reported lost */
#define SNAP_AUTO_TIMEOUT 30

/* ------------------------------------------------------------ names */

/* The bound of one snapshot of s: its own snapshot_max, else the
 * configuration's. */
static uint64_t snap_max(const km_manager *m, const session *s)
{
    return s->snapshot_max ? s->snapshot_max : m->cfg.snapshot_max;
}

int snap_tag_check(const char *tag, km_err *err)
{
    size_t n = tag ? strlen(tag) : 0;
    if (n == 0 || n > SNAP_TAG_MAX || tag[0] == '.') {
        km_err_set(err, KM_EINTERNAL,
                   "invalid snapshot tag \"%.80s\": 1 to %d characters, not starting "
                   "with \".\"",
                   tag ? tag : "", SNAP_TAG_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char c = tag[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-')) {
            km_err_set(err, KM_EINTERNAL,
                       "invalid snapshot tag \"%.80s\": only letters, digits, \".\", "
                       "\"_\" and \"-\"",
                       tag);
            return -1;
        }
    }
    return 0;
}

static int snaps_dir(const session *s, char *out, size_t size)
{
    int n = snprintf(out, size, "%s/snapshots", s->dir);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static int snap_dir(const session *s, const char *tag, char *out, size_t size)
{
    int n = snprintf(out, size, "%s/snapshots/%s", s->dir, tag);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static json_t *manifest_read(const session *s, const char *tag, km_err *err);

/* ------------------------------------------------------------ copying */

/* Copies the regular file open as in (its size st_size) to a new file name
 * in dirfd (O_EXCL | O_NOFOLLOW, mode), reflinked when the filesystem can,
 * else copy_file_range or read/write; never more than *left bytes (a file
 * that grows past them fails with EFBIG). fsync before close. 0 or -1. */
static int copy_fd(int in, off_t size, int dirfd, const char *name, mode_t mode, uint64_t *left,
                   uid_t uid, gid_t gid)
{
    if ((uint64_t)size > *left) {
        errno = EFBIG;
        return -1;
    }
    int out = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (out < 0)
        return -1;
    int rc = -1;
    uint64_t done = 0;
    if (ioctl(out, FICLONE, in) == 0) {
        struct stat st;
        if (fstat(out, &st) == 0 && (uint64_t)st.st_size <= *left) {
            done = (uint64_t)st.st_size;
            rc = 0;
        } else {
            errno = EFBIG;
            goto out;
        }
    } else {
        for (;;) {
            uint64_t room = *left - done;
            size_t want = room < (1u << 30) ? (size_t)room + 1 : (1u << 30);
            ssize_t n = copy_file_range(in, NULL, out, NULL, want, 0);
            if (n < 0 &&
                (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP) &&
                done == 0) {
                /* read/write instead */
                char buf[65536];
                for (;;) {
                    ssize_t r = read(in, buf, sizeof buf);
                    if (r < 0 && errno == EINTR)
                        continue;
                    if (r < 0)
                        goto out;
                    if (r == 0)
                        break;
                    if ((uint64_t)r > *left - done) {
                        errno = EFBIG;
                        goto out;
                    }
                    if (cm_write_all(out, buf, (size_t)r))
                        goto out;
                    done += (uint64_t)r;
                }
                break;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                goto out;
            if (n == 0)
                break;
            done += (uint64_t)n;
            if (done > *left) {
                errno = EFBIG;
                goto out;
            }
        }
        rc = 0;
    }
    if (uid != (uid_t)-1 && fchown(out, uid, gid))
        rc = -1;
    if (rc == 0 && fsync(out))
        rc = -1;
out:
    if (close(out) && rc == 0)
        rc = -1;
    if (rc) {
        int e = errno;
        unlinkat(dirfd, name, 0);
        errno = e;
    } else {
        *left -= done;
    }
    return rc;
}

typedef struct copy_ctx {
    uint64_t left;   /* bytes still allowed */
    uint64_t bytes;  /* copied */
    unsigned files;  /* regular files copied */
    json_t *skipped; /* [{"path","reason"}] not copied (FIFOs, sockets, ...) */
    uid_t uid;       /* owner to give what is made, or -1 */
    gid_t gid;
    dev_t dev;     /* the source's filesystem: never left */
    int too_large; /* a bound was hit */
    char err[WSFILE_PATH_MAX + 512];
} copy_ctx;

static void skip_entry(copy_ctx *c, const char *path, const char *why)
{
    if (json_array_size(c->skipped) < 100)
        json_array_append_new(c->skipped, json_pack("{s:s s:s}", "path", path, "reason", why));
}

/* Copies the tree below sfd into dfd (both directory fds), fd-based: every
 * entry is opened relative to its parent with O_NOFOLLOW; symlinks are
 * copied as symlinks (their text, never resolved), regular files as in
 * copy_fd, anything else is skipped and listed. Entries of the top level
 * whose name starts with SNAP_STAGE_PREFIX are not part of the workspace.
 * 0 or -1 (c->err). */
static int copy_tree(copy_ctx *c, int sfd, int dfd, const char *rel, int depth)
{
    if (depth > SNAP_DEPTH_MAX) {
        skip_entry(c, rel, "deeper than 64 directories");
        return 0;
    }
    int dup_fd = fcntl(sfd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        snprintf(c->err, sizeof c->err, "cannot read the directory %s: %s", rel, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, ".."))
            continue;
        if (depth == 0 && !strncmp(n, SNAP_STAGE_PREFIX, strlen(SNAP_STAGE_PREFIX)))
            continue;
        char path[WSFILE_PATH_MAX + 1];
        int pl = snprintf(path, sizeof path, "%s%s%s", rel, *rel ? "/" : "", n);
        if (pl < 0 || (size_t)pl >= sizeof path) {
            skip_entry(c, rel, "a path longer than 1024 bytes");
            continue;
        }
        struct stat st;
        if (fstatat(sfd, n, &st, AT_SYMLINK_NOFOLLOW)) {
            skip_entry(c, path, strerror(errno));
            continue;
        }
        if (st.st_dev != c->dev) {
            skip_entry(c, path, "on another filesystem");
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(sfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                skip_entry(c, path, strerror(errno));
                continue;
            }
            if (mkdirat(dfd, n, 0700)) {
                snprintf(c->err, sizeof c->err, "cannot create %s: %s", path, strerror(errno));
                close(sub);
                rc = -1;
                break;
            }
            int dsub = openat(dfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (dsub < 0) {
                snprintf(c->err, sizeof c->err, "cannot open %s: %s", path, strerror(errno));
                close(sub);
                rc = -1;
                break;
            }
            rc = copy_tree(c, sub, dsub, path, depth + 1);
            if (rc == 0) {
                fchmod(dsub, st.st_mode & 0777);
                if (c->uid != (uid_t)-1 && fchown(dsub, c->uid, c->gid)) {
                    snprintf(c->err, sizeof c->err, "cannot chown %s: %s", path, strerror(errno));
                    rc = -1;
                }
            }
            close(dsub);
            close(sub);
        } else if (S_ISREG(st.st_mode)) {
            int in = openat(sfd, n, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
            struct stat st2;
            if (in < 0 || fstat(in, &st2) || !S_ISREG(st2.st_mode) || st2.st_ino != st.st_ino) {
                skip_entry(c, path, in < 0 ? strerror(errno) : "changed while it was copied");
                if (in >= 0)
                    close(in);
                continue;
            }
            uint64_t before = c->left;
            if (copy_fd(in, st2.st_size, dfd, n, st2.st_mode & 0777, &c->left, c->uid, c->gid)) {
                if (errno == EFBIG) {
                    c->too_large = 1;
                    snprintf(c->err, sizeof c->err, "%s passes the bound", path);
                } else {
                    snprintf(c->err, sizeof c->err, "cannot copy %s: %s", path, strerror(errno));
                }
                rc = -1;
            } else {
                c->bytes += before - c->left;
                c->files++;
            }
            close(in);
        } else if (S_ISLNK(st.st_mode)) {
            char *target = wsfile_readlinkat(sfd, n);
            if (!target || symlinkat(target, dfd, n)) {
                skip_entry(c, path, "its link text could not be copied");
            } else if (c->uid != (uid_t)-1 &&
                       fchownat(dfd, n, c->uid, c->gid, AT_SYMLINK_NOFOLLOW) < 0) {
                /* not kept with the wrong owner: removed, and said */
                unlinkat(dfd, n, 0);
                skip_entry(c, path, "its owner could not be set");
            }
            free(target);
        } else {
            skip_entry(c, path,
                       S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device or other special file");
        }
    }
    closedir(d);
    return rc;
}

static int fsync_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------ the kernel's request */

/* new: the kernel's kernelmgr_snapshot_reply content, or NULL with err. IOPub
 * meanwhile goes to the slot's follower of other clients' cells. */
static json_t *kernel_snapshot(km_manager *m, kslot *k, const char *action, const char *path,
                               uint64_t max, int automatic, km_err *err)
{
    if (!k->client || !k->proc) {
        km_err_set(err, KM_EINTERNAL, "the kernel is not running");
        return NULL;
    }
    if (k->snap_none) {
        /* it would never answer: not waited for (up to the limit below) */
        km_err_set(err, KM_EINTERNAL,
                   "the kernel is not one of kernelmgr's (a Jupyter kernelspec's, without "
                   "kernelmgr_snapshot_request): its state cannot be %s",
                   strcmp(action, "save") ? "loaded" : "saved");
        return NULL;
    }
    char id[37];
    json_t *c =
        json_pack("{s:s s:s s:I}", "action", action, "path", path, "max_bytes", (json_int_t)max);
    if (kclient_send(k->client, JP_SHELL, "kernelmgr_snapshot_request", c, NULL, id)) {
        km_err_set(err, KM_EINTERNAL, "cannot send the snapshot request to the kernel");
        return NULL;
    }
    double limit = automatic                           ? SNAP_AUTO_TIMEOUT
                   : m->cfg.timeout > SNAP_TIMEOUT_MIN ? m->cfg.timeout
                                                       : SNAP_TIMEOUT_MIN;
    double deadline = kclient_now() + limit;
    while (kclient_now() < deadline) {
        jp_channel ch;
        jmsg *msg = NULL;
        int r = kclient_recv(k->client, 200, &ch, &msg);
        if (r < 0)
            break;
        if (r == 0) {
            if (!klaunch_alive(k->proc)) {
                km_err_set(err, KM_EINTERNAL, "the kernel ended during the snapshot");
                return NULL;
            }
            continue;
        }
        if (ch == JP_SHELL) {
            const char *pid = json_string_value(json_object_get(msg->parent_header, "msg_id"));
            if (pid && !strcmp(pid, id)) {
                json_t *reply = json_incref(msg->content);
                json_t *g = json_object_get(reply, "worker_generation");
                if (json_is_integer(g))
                    k->snap_gen = json_integer_value(g);
                jmsg_destroy(&msg);
                return reply;
            }
        } else if (ch == JP_IOPUB && k->foreign) {
            kforeign_feed(k->foreign, ch, msg);
        }
        jmsg_destroy(&msg);
    }
    km_err_set(err, KM_EINTERNAL, "the kernel did not answer the snapshot request within %g s",
               limit);
    return NULL;
}

/* The owner the sandbox sees as itself in the workspace (root caller: the
 * workspace's owner, through the idmapped mount): what the host makes there
 * is given to it. -1 when the host is not root. */
static void ws_owner(int rootfd, uid_t *uid, gid_t *gid)
{
    struct stat st;
    *uid = (uid_t)-1;
    *gid = (gid_t)-1;
    if (geteuid() == 0 && fstat(rootfd, &st) == 0) {
        *uid = st.st_uid;
        *gid = st.st_gid;
    }
}

/* Makes an empty staging directory in the workspace: its name in name, its
 * fd returned (or -1 with err). */
static int stage_make(int rootfd, char *name, size_t size, km_err *err)
{
    unsigned r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &r, sizeof r) != (ssize_t)sizeof r)
            r = (unsigned)getpid() ^ (unsigned)time(NULL);
        close(fd);
    }
    snprintf(name, size, "%s%08x", SNAP_STAGE_PREFIX, r);
    if (mkdirat(rootfd, name, 0700)) {
        km_err_set(err, KM_EINTERNAL, "cannot make %s in the workspace: %s", name, strerror(errno));
        return -1;
    }
    uid_t uid;
    gid_t gid;
    ws_owner(rootfd, &uid, &gid);
    int d = openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0 || (uid != (uid_t)-1 && fchown(d, uid, gid))) {
        km_err_set(err, KM_EINTERNAL, "cannot open %s in the workspace: %s", name, strerror(errno));
        if (d >= 0)
            close(d);
        unlinkat(rootfd, name, AT_REMOVEDIR);
        return -1;
    }
    return d;
}

static void stage_remove(const session *s, const char *name)
{
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s/%s", s->workspace, name) < (int)sizeof p)
        wsfile_rmtree(p, NULL);
}

/* Copies the regular files directly in sfd (at most SNAP_FILES_MAX, names
 * of [A-Za-z0-9._-]) into dfd, bounded by *left. files gets {name: bytes}.
 * 0 or -1 with err (EFBIG: *too_large). */
static int copy_flat(int sfd, int dfd, uint64_t *left, uid_t uid, gid_t gid, json_t *files,
                     int *too_large, km_err *err)
{
    int dup_fd = fcntl(sfd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        km_err_set(err, KM_EINTERNAL, "cannot read the staging directory: %s", strerror(errno));
        return -1;
    }
    int rc = 0;
    unsigned n = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        const char *name = e->d_name;
        if (name[0] == '.')
            continue;
        km_err tagerr = {0};
        if (snap_tag_check(name, &tagerr))
            continue; /* not a name a kernel writes */
        struct stat st;
        km_err why = {0};
        int in = wsfile_open_regular(sfd, name, &st, &why);
        if (in < 0)
            continue; /* a FIFO, a symlink, a directory: not state */
        if (++n > SNAP_FILES_MAX) {
            close(in);
            km_err_set(err, KM_EINTERNAL, "more than %d files in a kernel's state", SNAP_FILES_MAX);
            rc = -1;
            break;
        }
        uint64_t before = *left;
        if (copy_fd(in, st.st_size, dfd, name, 0600, left, uid, gid)) {
            if (errno == EFBIG)
                *too_large = 1;
            km_err_set(err, KM_EINTERNAL, "%s: %s", name,
                       errno == EFBIG ? "passes the bound" : strerror(errno));
            rc = -1;
        } else {
            json_object_set_new(files, name, json_integer((json_int_t)(before - *left)));
        }
        close(in);
    }
    closedir(d);
    return rc;
}

json_t *snap_lost_sanitized(const json_t *lost)
{
    json_t *out = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(lost, i, v)
    {
        if (i >= SNAP_LOST_MAX)
            break;
        char nm[201], ty[201], re[401];
        snprintf(nm, sizeof nm, "%s", json_string_value(json_object_get(v, "name")) ?: "?");
        snprintf(ty, sizeof ty, "%s", json_string_value(json_object_get(v, "type")) ?: "");
        snprintf(re, sizeof re, "%s", json_string_value(json_object_get(v, "reason")) ?: "");
        json_t *e = json_pack("{s:s s:s s:s}", "name", nm, "type", ty, "reason", re);
        if (e)
            json_array_append_new(out, e);
    }
    return out;
}

/* Asks slot l's kernel to save into a staging directory, then copies it to
 * dirfd/LANG. Fills info {"bytes","files","lost","names"}. 0 or -1. */
static int save_kernel(km_manager *m, session *s, int l, int dirfd, uint64_t *left, json_t *info,
                       int *too_large, int automatic, km_err *err)
{
    km_err why = {0};
    int rootfd = wsfile_root_open(s->workspace, &why);
    if (rootfd < 0) {
        km_err_set(err, KM_EINTERNAL, "%s", why.msg);
        return -1;
    }
    char stage[64];
    int sfd = stage_make(rootfd, stage, sizeof stage, err);
    if (sfd < 0) {
        close(rootfd);
        return -1;
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", s->workspace, stage);
    int rc = -1;
    json_t *reply = kernel_snapshot(m, &s->k[l], "save", path, *left, automatic, err);
    if (reply) {
        const char *st = json_string_value(json_object_get(reply, "status"));
        json_object_set_new(info, "lost", snap_lost_sanitized(json_object_get(reply, "lost")));
        if (!st || strcmp(st, "ok")) {
            const char *ename = json_string_value(json_object_get(reply, "ename"));
            km_err_set(err, KM_EINTERNAL, "%.200s",
                       json_string_value(json_object_get(reply, "evalue"))
                           ?: "the kernel could not save its state");
            if (ename && !strcmp(ename, "SnapshotTooLarge"))
                *too_large = 1;
        } else {
            const char *lname = kmcfg_lang_name(&m->cfg, l);
            if (mkdirat(dirfd, lname, 0700) == 0) {
                int lfd = openat(dirfd, lname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                json_t *files = json_object();
                uint64_t before = *left;
                if (lfd >= 0 &&
                    copy_flat(sfd, lfd, left, (uid_t)-1, (gid_t)-1, files, too_large, err) == 0) {
                    rc = fsync(lfd);
                    json_object_set_new(info, "bytes", json_integer((json_int_t)(before - *left)));
                    json_t *nm = json_object_get(reply, "names");
                    if (json_is_integer(nm))
                        json_object_set(info, "names", nm);
                    json_t *ser = json_object_get(reply, "serializer");
                    if (json_is_string(ser) && json_string_length(ser) < 32)
                        json_object_set(info, "serializer", ser);
                }
                json_object_set_new(info, "files", files);
                if (lfd >= 0)
                    close(lfd);
            } else {
                km_err_set(err, KM_EINTERNAL, "cannot create the snapshot's %s directory: %s",
                           lname, strerror(errno));
            }
        }
        json_decref(reply);
    }
    close(sfd);
    close(rootfd);
    stage_remove(s, stage);
    return rc;
}

static void tag_now(char *out, size_t size)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y%m%dT%H%M%SZ", &tm);
    static unsigned seq;
    snprintf(out, size, "snap-%s-%u", ts, __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED) % 1000);
}

static void iso_now(char out[32])
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Writes manifest o as dir/manifest.json (temp, fsync, rename). 0 or -1. */
int snap_write_manifest(const char *dir, json_t *o)
{
    char tmp[PATH_MAX], fin[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%.3900s/manifest.json.tmp", dir);
    snprintf(fin, sizeof fin, "%.3900s/manifest.json", dir);
    char *text = json_dumps(o, JSON_INDENT(1) | JSON_SORT_KEYS);
    if (!text)
        return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    int rc = fd < 0 || cm_write_all(fd, text, strlen(text)) || fsync(fd) ? -1 : 0;
    if (fd >= 0 && close(fd))
        rc = -1;
    free(text);
    if (rc == 0)
        rc = rename(tmp, fin);
    return rc;
}

json_t *snap_take(km_manager *m, session *s, const char *tag, int with_ws, const char *why,
                  km_err *err)
{
    char tagbuf[SNAP_TAG_MAX + 1];
    if (!tag) {
        tag_now(tagbuf, sizeof tagbuf);
        tag = tagbuf;
    } else if (snap_tag_check(tag, err)) {
        return NULL;
    }
    char root[PATH_MAX], tmp[PATH_MAX], fin[PATH_MAX], old[PATH_MAX];
    if (snaps_dir(s, root, sizeof root) || snap_dir(s, tag, fin, sizeof fin)) {
        km_err_set(err, KM_EINTERNAL, "the session's directory path is too long");
        return NULL;
    }
    if (mkdir(root, 0700) && errno != EEXIST) {
        km_err_set(err, KM_EINTERNAL, "cannot create %s: %s", root, strerror(errno));
        return NULL;
    }
    if (access(fin, F_OK) != 0) {
        json_t *l = snap_list(m, s);
        size_t n = json_array_size(l);
        json_decref(l);
        if (n >= SNAP_COUNT_MAX) {
            km_err_set(err, KM_EINTERNAL,
                       "session \"%s\" has %zu snapshots, the most it keeps "
                       "(SNAP_COUNT_MAX=%d): replace one by its tag or take none",
                       s->name, n, SNAP_COUNT_MAX);
            return NULL;
        }
    }
    snprintf(tmp, sizeof tmp, "%.3900s/.tmp-%s-%d", root, tag, (int)getpid());
    snprintf(old, sizeof old, "%.3900s/.old-%s-%d", root, tag, (int)getpid());
    session_rmtree(tmp);
    if (mkdir(tmp, 0700)) {
        km_err_set(err, KM_EINTERNAL, "cannot create %s: %s", tmp, strerror(errno));
        return NULL;
    }
    int dirfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    uint64_t left = snap_max(m, s);
    json_t *kernels = json_object(), *failed = json_object();
    int too_large = 0, saved = 0, live = 0;
    char kerr_[1024] = "";
    for (int l = 0; dirfd >= 0 && l < m->cfg.langs.n; l++) {
        if (!s->k[l].proc || !klaunch_alive(s->k[l].proc))
            continue;
        live++;
        json_t *info = json_object();
        km_err e1 = {0};
        int tl = 0;
        if (save_kernel(m, s, l, dirfd, &left, info, &tl, !strcmp(tag, SNAP_AUTO), &e1) == 0) {
            json_object_set_new(kernels, kmcfg_lang_name(&m->cfg, l), info);
            saved++;
        } else {
            json_decref(info);
            if (tl)
                too_large = 1;
            json_object_set_new(failed, kmcfg_lang_name(&m->cfg, l), json_string(e1.msg));
            snprintf(kerr_, sizeof kerr_, "the %s kernel: %.1000s", kmcfg_lang_name(&m->cfg, l),
                     e1.msg);
            /* half a state is no snapshot of this kernel: drop its files */
            char lp[PATH_MAX];
            snprintf(lp, sizeof lp, "%.3900s/%s", tmp, kmcfg_lang_name(&m->cfg, l));
            session_rmtree(lp);
        }
    }
    /* a kernel stopped earlier whose state waits in this very snapshot
     * (one language culled before the other): its state is carried over,
     * or replacing the snapshot would lose it */
    json_t *prev = NULL;
    for (int l = 0; dirfd >= 0 && !too_large && l < m->cfg.langs.n; l++) {
        const char *ln = kmcfg_lang_name(&m->cfg, l);
        if (json_object_get(kernels, ln) || strcmp(s->k[l].restore, tag))
            continue;
        km_err perr = {0};
        if (!prev && !(prev = manifest_read(s, tag, &perr)))
            break;
        json_t *info = json_object_get(json_object_get(prev, "kernels"), ln);
        char from[PATH_MAX];
        snprintf(from, sizeof from, "%.3900s/%s", fin, ln);
        int sfd = info ? open(from, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        struct stat st;
        if (sfd < 0 || fstat(sfd, &st) || mkdirat(dirfd, ln, 0700)) {
            if (sfd >= 0)
                close(sfd);
            continue;
        }
        int dfd = openat(dirfd, ln, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        copy_ctx c = {.left = left,
                      .skipped = json_array(),
                      .uid = (uid_t)-1,
                      .gid = (gid_t)-1,
                      .dev = st.st_dev};
        if (dfd >= 0 && copy_tree(&c, sfd, dfd, "", 0) == 0) {
            left = c.left;
            json_object_set(kernels, ln, info);
            saved++;
        } else if (c.too_large) {
            too_large = 1;
            snprintf(kerr_, sizeof kerr_, "the %s state kept from before: %.800s", ln, c.err);
        }
        json_decref(c.skipped);
        if (dfd >= 0)
            close(dfd);
        close(sfd);
    }
    json_decref(prev);
    json_t *ws = json_null();
    if (dirfd >= 0 && with_ws && !too_large) {
        km_err werr = {0};
        int rootfd = wsfile_root_open(s->workspace, &werr);
        copy_ctx c = {.left = left, .skipped = json_array(), .uid = (uid_t)-1, .gid = (gid_t)-1};
        struct stat st;
        if (rootfd >= 0 && fstat(rootfd, &st) == 0 && mkdirat(dirfd, "workspace", 0700) == 0) {
            c.dev = st.st_dev;
            int wfd = openat(dirfd, "workspace", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (wfd >= 0 && copy_tree(&c, rootfd, wfd, "", 0) == 0) {
                ws = json_pack("{s:I s:I s:O}", "bytes", (json_int_t)c.bytes, "files",
                               (json_int_t)c.files, "skipped", c.skipped);
                left = c.left;
            } else {
                if (c.too_large)
                    too_large = 1;
                snprintf(kerr_, sizeof kerr_, "the workspace copy: %.900s",
                         c.err[0] ? c.err : strerror(errno));
                saved = -1000; /* a snapshot without its workspace is not the one asked for */
            }
            if (wfd >= 0)
                close(wfd);
        } else {
            snprintf(kerr_, sizeof kerr_, "the workspace copy: %.511s",
                     rootfd < 0 ? werr.msg : strerror(errno));
            saved = -1000;
        }
        if (rootfd >= 0)
            close(rootfd);
        json_decref(c.skipped);
    }
    if (dirfd >= 0)
        close(dirfd);
    if (too_large) {
        km_err_set(err, KM_EINTERNAL,
                   "the snapshot of session \"%s\" is larger than snapshot_max=%llu bytes (%s); "
                   "nothing was stored and the session goes on unchanged",
                   s->name, (unsigned long long)snap_max(m, s), kerr_);
        goto fail;
    }
    if (saved < 0 || (live > 0 && saved == 0) || (live == 0 && !with_ws)) {
        if (live == 0 && !with_ws)
            km_err_set(err, KM_EINTERNAL, "session \"%s\" has no running kernel to snapshot",
                       s->name);
        else
            km_err_set(err, KM_EINTERNAL, "snapshot of session \"%s\" failed: %s", s->name, kerr_);
        goto fail;
    }
    char at[32];
    iso_now(at);
    uint64_t total = snap_max(m, s) - left;
    json_t *man = json_pack("{s:i s:s s:s s:s s:f s:s s:I s:I s:o s:o s:o s:s}", "version", 1,
                            "session", s->name, "tag", tag, "at", at, "time", cm_wall_s(), "reason",
                            why ? why : "requested", "bytes", (json_int_t)total, "snapshot_max",
                            (json_int_t)snap_max(m, s), "kernels", kernels, "failed", failed,
                            "workspace_copy", ws, "workspace", s->workspace);
    kernels = failed = NULL;
    if (!man || snap_write_manifest(tmp, man) || fsync_dir(tmp)) {
        km_err_set(err, KM_EINTERNAL, "cannot write the snapshot's manifest: %s", strerror(errno));
        json_decref(man);
        goto fail2;
    }
    session_rmtree(old);
    int had = rename(fin, old) == 0;
    if (rename(tmp, fin)) {
        km_err_set(err, KM_EINTERNAL, "cannot store the snapshot as %s: %s", fin, strerror(errno));
        if (had)
            rename(old, fin);
        json_decref(man);
        goto fail2;
    }
    fsync_dir(root);
    if (had)
        session_rmtree(old);
    return man;
fail:
    json_decref(kernels);
    json_decref(failed);
fail2:
    json_decref(ws);
    session_rmtree(tmp);
    return NULL;
}

/* new: the manifest of snapshot tag of s, or NULL with the reason. */
static json_t *manifest_read(const session *s, const char *tag, km_err *err)
{
    char dir[PATH_MAX], p[PATH_MAX];
    if (snap_tag_check(tag, err))
        return NULL;
    snap_dir(s, tag, dir, sizeof dir);
    snprintf(p, sizeof p, "%.3900s/manifest.json", dir);
    char *data = NULL;
    size_t len = 0;
    const char *why = NULL;
    if (cm_read_regular(p, SNAP_MANIFEST_MAX, CM_RR_OWNED, &data, &len, &why)) {
        if (errno == ENOENT)
            km_err_set(err, KM_EINTERNAL, "session \"%s\" has no snapshot \"%s\"", s->name, tag);
        else
            km_err_set(err, KM_EINTERNAL, "snapshot \"%s\" of session \"%s\" is damaged: %s %s",
                       tag, s->name, p, why);
        return NULL;
    }
    json_error_t je;
    json_t *o = json_loadb(data, len, 0, &je);
    free(data);
    if (!json_is_object(o) || json_integer_value(json_object_get(o, "version")) != 1 ||
        !json_is_object(json_object_get(o, "kernels"))) {
        km_err_set(err, KM_EINTERNAL,
                   "snapshot \"%s\" of session \"%s\" is damaged: %s is not a "
                   "kernelmgr snapshot manifest",
                   tag, s->name, p);
        json_decref(o);
        return NULL;
    }
    return o;
}

int snap_has(km_manager *m, const session *s, int l, const char *tag)
{
    km_err err = {0};
    json_t *o = manifest_read(s, tag, &err);
    int has = o && json_object_get(json_object_get(o, "kernels"), kmcfg_lang_name(&m->cfg, l));
    json_decref(o);
    return has;
}

static int by_time_desc(const void *a, const void *b)
{
    double x = json_number_value(json_object_get(*(json_t *const *)a, "time"));
    double y = json_number_value(json_object_get(*(json_t *const *)b, "time"));
    return x < y ? 1 : x > y ? -1 : 0;
}

json_t *snap_list(km_manager *m, const session *s)
{
    (void)m;
    char root[PATH_MAX];
    json_t *arr = json_array();
    if (snaps_dir(s, root, sizeof root))
        return arr;
    DIR *d = opendir(root);
    if (!d)
        return arr;
    struct dirent *e;
    size_t n = 0;
    json_t *items[1024] = {NULL};
    while ((e = readdir(d)) && n < 1024) {
        km_err err = {0};
        if (e->d_name[0] == '.' || snap_tag_check(e->d_name, &err))
            continue;
        json_t *o = manifest_read(s, e->d_name, &err);
        if (!o)
            o = json_pack("{s:s s:s s:f}", "tag", e->d_name, "error", err.msg, "time", 0.0);
        else
            json_object_del(o, "workspace");
        items[n++] = o;
    }
    closedir(d);
    qsort(items, n, sizeof items[0], by_time_desc);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, items[i]);
    return arr;
}

int snap_newest(km_manager *m, const session *s, char *out, size_t outlen)
{
    json_t *l = snap_list(m, s);
    size_t i;
    json_t *v;
    int rc = -1;
    json_array_foreach(l, i, v)
    {
        if (json_object_get(v, "error"))
            continue;
        snprintf(out, outlen, "%s", json_string_value(json_object_get(v, "tag")));
        rc = 0;
        break;
    }
    json_decref(l);
    return rc;
}

json_t *snap_load(km_manager *m, session *s, int l, const char *tag, km_err *err)
{
    json_t *man = manifest_read(s, tag, err);
    if (!man)
        return NULL;
    const char *lname = kmcfg_lang_name(&m->cfg, l);
    json_t *kinfo = json_object_get(json_object_get(man, "kernels"), lname);
    if (!kinfo) {
        km_err_set(err, KM_EINTERNAL, "snapshot \"%s\" has no %s state", tag, lname);
        json_decref(man);
        return NULL;
    }
    char src[PATH_MAX];
    km_err why = {0};
    snap_dir(s, tag, src, sizeof src);
    strncat(src, "/", sizeof src - strlen(src) - 1);
    strncat(src, lname, sizeof src - strlen(src) - 1);
    json_t *ret = NULL;
    int sdir = open(src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rootfd = wsfile_root_open(s->workspace, &why);
    if (sdir < 0 || rootfd < 0) {
        km_err_set(err, KM_EINTERNAL, "snapshot \"%s\" is damaged: %s", tag,
                   sdir < 0 ? strerror(errno) : why.msg);
        goto out;
    }
    char stage[64];
    int dfd = stage_make(rootfd, stage, sizeof stage, err);
    if (dfd < 0)
        goto out;
    uid_t uid;
    gid_t gid;
    ws_owner(rootfd, &uid, &gid);
    uint64_t left = snap_max(m, s);
    int tl = 0;
    json_t *files = json_object();
    if (copy_flat(sdir, dfd, &left, uid, gid, files, &tl, err) == 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", s->workspace, stage);
        json_t *reply = kernel_snapshot(m, &s->k[l], "load", path, snap_max(m, s), 0, err);
        if (reply) {
            const char *st = json_string_value(json_object_get(reply, "status"));
            if (st && !strcmp(st, "ok")) {
                json_t *detail = snap_lost_sanitized(json_object_get(reply, "lost"));
                json_t *names = json_array();
                size_t i;
                json_t *v;
                json_array_foreach(detail, i, v)
                {
                    json_array_append(names, json_object_get(v, "name"));
                }
                ret = json_pack("{s:s s:s s:O s:o s:o}", "from", "snapshot", "tag", tag, "at",
                                json_object_get(man, "at"), "lost", names, "lost_detail", detail);
            } else {
                km_err_set(err, KM_EINTERNAL,
                           "the %s kernel could not load snapshot \"%s\": %.300s", lname, tag,
                           json_string_value(json_object_get(reply, "evalue")) ?: "no reason");
            }
            json_decref(reply);
        }
    }
    json_decref(files);
    close(dfd);
    stage_remove(s, stage);
out:
    if (sdir >= 0)
        close(sdir);
    if (rootfd >= 0)
        close(rootfd);
    json_decref(man);
    return ret;
}

int snap_restore_workspace(km_manager *m, session *s, const char *tag, km_err *err)
{
    json_t *man = manifest_read(s, tag, err);
    if (!man)
        return -1;
    int has = json_is_object(json_object_get(man, "workspace_copy"));
    json_decref(man);
    if (!has)
        return 0; /* a snapshot of the kernels only: the workspace stays */
    char src[PATH_MAX];
    km_err why = {0};
    snap_dir(s, tag, src, sizeof src);
    strncat(src, "/workspace", sizeof src - strlen(src) - 1);
    int sfd = open(src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rootfd = wsfile_root_open(s->workspace, &why);
    int rc = -1;
    if (sfd < 0 || rootfd < 0) {
        km_err_set(err, KM_EINTERNAL, "snapshot \"%s\": %s", tag,
                   sfd < 0 ? strerror(errno) : why.msg);
        goto out;
    }
    /* empty the workspace (fd-based, never following), then copy */
    int dup_fd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char p[PATH_MAX];
            if (snprintf(p, sizeof p, "%s/%s", s->workspace, e->d_name) < (int)sizeof p)
                wsfile_rmtree(p, NULL);
        }
        closedir(d);
    }
    struct stat st;
    fstat(sfd, &st);
    copy_ctx c = {.left = snap_max(m, s), .skipped = json_array(), .dev = st.st_dev};
    ws_owner(rootfd, &c.uid, &c.gid);
    rc = copy_tree(&c, sfd, rootfd, "", 0);
    if (rc)
        km_err_set(err, KM_EINTERNAL, "restoring the workspace of snapshot \"%s\": %s", tag, c.err);
    json_decref(c.skipped);
out:
    if (sfd >= 0)
        close(sfd);
    if (rootfd >= 0)
        close(rootfd);
    return rc;
}

int snap_copy_to(km_manager *m, const session *src, const char *tag, const session *dst,
                 const char *dst_tag, km_err *err)
{
    char from[PATH_MAX], root[PATH_MAX], to[PATH_MAX];
    snap_dir(src, tag, from, sizeof from);
    snaps_dir(dst, root, sizeof root);
    snap_dir(dst, dst_tag, to, sizeof to);
    if (mkdir(root, 0700) && errno != EEXIST) {
        km_err_set(err, KM_EINTERNAL, "cannot create %s: %s", root, strerror(errno));
        return -1;
    }
    session_rmtree(to);
    int sfd = open(from, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sfd < 0 || mkdir(to, 0700)) {
        km_err_set(err, KM_EINTERNAL, "cannot copy snapshot \"%s\": %s", tag, strerror(errno));
        if (sfd >= 0)
            close(sfd);
        return -1;
    }
    int dfd = open(to, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    fstat(sfd, &st);
    /* twice the bound: the kernels' states and the workspace copy */
    copy_ctx c = {.left = 2 * snap_max(m, src),
                  .skipped = json_array(),
                  .uid = (uid_t)-1,
                  .gid = (gid_t)-1,
                  .dev = st.st_dev};
    int rc = dfd >= 0 ? copy_tree(&c, sfd, dfd, "", 0) : -1;
    if (rc)
        km_err_set(err, KM_EINTERNAL, "cannot copy snapshot \"%s\": %s", tag, c.err);
    json_decref(c.skipped);
    close(sfd);
    if (dfd >= 0)
        close(dfd);
    if (rc == 0) {
        km_err e2 = {0};
        json_t *man = manifest_read(dst, dst_tag, &e2);
        if (man) {
            json_object_set_new(man, "session", json_string(dst->name));
            json_object_set_new(man, "tag", json_string(dst_tag));
            json_object_set_new(man, "forked_from",
                                json_pack("{s:s s:s}", "session", src->name, "tag", tag));
            json_object_set_new(man, "workspace", json_string(dst->workspace));
            snap_write_manifest(to, man);
            json_decref(man);
        }
    } else {
        session_rmtree(to);
    }
    return rc;
}

void snap_before_stop(km_manager *m, session *s, const char *why)
{
    int live = 0;
    for (int l = 0; l < m->cfg.langs.n; l++)
        live += s->k[l].proc && s->k[l].client && klaunch_alive(s->k[l].proc);
    if (!live)
        return;
    km_err err = {0};
    json_t *man = snap_take(m, s, SNAP_AUTO, 0, why, &err);
    if (!man) {
        fprintf(stderr,
                "kernelmgr: session %s: no automatic snapshot before it was stopped "
                "(%s): %s\n",
                s->name, why, err.msg);
        return;
    }
    json_t *kernels = json_object_get(man, "kernels");
    for (int l = 0; l < m->cfg.langs.n; l++)
        if (json_object_get(kernels, kmcfg_lang_name(&m->cfg, l)))
            snprintf(s->k[l].restore, sizeof s->k[l].restore, "%s", SNAP_AUTO);
    json_decref(man);
}

void snap_after_start(km_manager *m, session *s, int l)
{
    kslot *k = &s->k[l];
    if (!k->restore[0] || !k->proc)
        return;
    char tag[SNAP_TAG_MAX + 1];
    km_err err = {0};
    snprintf(tag, sizeof tag, "%s", k->restore);
    k->restore[0] = 0;
    json_decref(k->restored);
    k->restored = snap_load(m, s, l, tag, &err);
    if (!k->restored) {
        k->restored = json_pack("{s:s s:s s:s}", "from", "snapshot", "tag", tag, "error", err.msg);
        fprintf(stderr, "kernelmgr: session %s: %s\n", s->name, err.msg);
    }
    k->snap_secs = 0;
    session_save(m, s); /* the marker is spent: a later manager must not load it again */
}

void snap_cell_time(km_manager *m, session *s, int l, double secs)
{
    if (m->cfg.snapshot_interval <= 0)
        return;
    kslot *k = &s->k[l];
    k->snap_secs += secs;
    if (k->snap_secs < m->cfg.snapshot_interval)
        return;
    k->snap_secs = 0;
    km_err err = {0};
    json_t *man = snap_take(m, s, SNAP_AUTO, 0, "periodic", &err);
    if (!man)
        fprintf(stderr, "kernelmgr: session %s: periodic snapshot failed: %s\n", s->name, err.msg);
    json_decref(man);
}

void snap_check_worker(km_manager *m, session *s, int l)
{
    kslot *k = &s->k[l];
    if (m->cfg.snapshot_interval <= 0 || k->snap_gen <= 0 || !k->client)
        return;
    char id[37];
    if (kclient_send(k->client, JP_CONTROL, "kernel_info_request", NULL, NULL, id))
        return;
    long long gen = -1;
    double deadline = kclient_now() + 5;
    while (gen < 0 && kclient_now() < deadline) {
        jp_channel ch;
        jmsg *msg = NULL;
        int r = kclient_recv(k->client, 100, &ch, &msg);
        if (r < 0)
            break;
        if (r == 0)
            continue;
        const char *pid = json_string_value(json_object_get(msg->parent_header, "msg_id"));
        if (ch == JP_CONTROL && pid && !strcmp(pid, id)) {
            json_t *g =
                json_object_get(json_object_get(msg->content, "kernelmgr"), "worker_generation");
            gen = json_is_integer(g) ? json_integer_value(g) : 0;
        } else if (ch == JP_IOPUB && k->foreign) {
            kforeign_feed(k->foreign, ch, msg);
        }
        jmsg_destroy(&msg);
    }
    if (gen <= 0 || gen == k->snap_gen || !snap_has(m, s, l, SNAP_AUTO))
        return;
    snprintf(k->restore, sizeof k->restore, "%s", SNAP_AUTO);
    snap_after_start(m, s, l);
    if (k->restored)
        json_object_set_new(k->restored, "reason",
                            json_pack("s", "the kernel's worker died since the last execution; "
                                           "a fresh one was started"));
}

int snap_path(const session *s, const char *tag, char *out, size_t size)
{
    return snap_dir(s, tag, out, size);
}

json_t *snap_manifest(const session *s, const char *tag, km_err *err)
{
    return manifest_read(s, tag, err);
}

int snap_adopt_pending(km_manager *m, session *s, const char *tag, km_err *err)
{
    json_t *man = manifest_read(s, tag, err);
    if (!man)
        return -1;
    json_t *kernels = json_object_get(man, "kernels");
    char to[PATH_MAX];
    snap_dir(s, tag, to, sizeof to);
    int changed = 0, rc = 0;
    for (int l = 0; rc == 0 && l < m->cfg.langs.n; l++) {
        const char *ln = kmcfg_lang_name(&m->cfg, l);
        const char *from_tag = s->k[l].restore;
        if (json_object_get(kernels, ln) || !from_tag[0] || !strcmp(from_tag, tag))
            continue;
        km_err perr = {0};
        json_t *prev = manifest_read(s, from_tag, &perr);
        json_t *info = json_object_get(json_object_get(prev, "kernels"), ln);
        char from[PATH_MAX];
        snap_dir(s, from_tag, from, sizeof from);
        strncat(from, "/", sizeof from - strlen(from) - 1);
        strncat(from, ln, sizeof from - strlen(from) - 1);
        int sfd = info ? open(from, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        int tfd = sfd >= 0 ? open(to, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        struct stat st;
        if (sfd < 0 || tfd < 0 || fstat(sfd, &st) || mkdirat(tfd, ln, 0700)) {
            km_err_set(err, KM_EINTERNAL, "the %s kernel's state waiting in snapshot \"%s\": %s",
                       ln, from_tag, prev ? strerror(errno) : perr.msg);
            rc = -1;
        } else {
            int dfd = openat(tfd, ln, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            copy_ctx c = {.left = snap_max(m, s),
                          .skipped = json_array(),
                          .uid = (uid_t)-1,
                          .gid = (gid_t)-1,
                          .dev = st.st_dev};
            if (dfd < 0 || copy_tree(&c, sfd, dfd, "", 0)) {
                km_err_set(err, KM_EINTERNAL,
                           "the %s kernel's state waiting in snapshot \"%s\": %s", ln, from_tag,
                           c.err[0] ? c.err : strerror(errno));
                rc = -1;
            } else {
                json_object_set(kernels, ln, info);
                changed = 1;
            }
            json_decref(c.skipped);
            if (dfd >= 0)
                close(dfd);
        }
        if (sfd >= 0)
            close(sfd);
        if (tfd >= 0)
            close(tfd);
        json_decref(prev);
    }
    if (rc == 0 && changed && snap_write_manifest(to, man)) {
        km_err_set(err, KM_EINTERNAL, "cannot write the snapshot's manifest: %s", strerror(errno));
        rc = -1;
    }
    json_decref(man);
    return rc;
}
