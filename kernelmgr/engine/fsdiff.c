/*
 * fsdiff.c — bounded fd-based walks of a workspace and their comparison.
 */
#include "kernelmgr/engine/fsdiff.h"
#include "common/cm_mime.h"
#include "kernelmgr/engine/wsfile.h"
#include "jp.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define FSDIFF_DEPTH_MAX 64

typedef struct fsent {
    char *path;   /* relative */
    char *target; /* symlinks: the link's text (readlinkat during the walk) */
    unsigned mode;
    uint64_t size, ino;
    int64_t mtime_ns;
} fsent;

struct fsdiff_snap {
    fsent *v;
    size_t n, cap, scan_max;
    int incomplete;
    int rootfd; /* the workspace root, -1 when it could not be opened */
};

/* Takes ownership of path. */
static int snap_push(fsdiff_snap *s, char *path, const struct stat *st, int dfd, const char *name)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        fsent *v = realloc(s->v, cap * sizeof *v);
        if (!v) {
            free(path);
            return -1;
        }
        s->v = v;
        s->cap = cap;
    }
    fsent *e = &s->v[s->n];
    e->path = path;
    /* the text of this very entry: the walk's parent fd and its name,
     * never a path resolved again later */
    e->target = S_ISLNK(st->st_mode) ? wsfile_readlinkat(dfd, name) : NULL;
    e->mode = st->st_mode;
    e->size = (uint64_t)st->st_size;
    e->ino = st->st_ino;
    e->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    s->n++;
    return 0;
}

/* dfd is owned and closed here; rel is the path of the directory ("" = root). */
static void walk(fsdiff_snap *s, int dfd, const char *rel, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (s->n >= s->scan_max) {
            s->incomplete = 1;
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
            continue;
        char *path = NULL;
        if (asprintf(&path, "%s%s%s", rel, *rel ? "/" : "", de->d_name) < 0)
            break;
        if (snap_push(s, path, &st, dirfd(d), de->d_name))
            break;
        if (S_ISDIR(st.st_mode) && depth < FSDIFF_DEPTH_MAX) {
            int fd = openat(dirfd(d), de->d_name,
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
            if (fd >= 0)
                walk(s, fd, path, depth + 1); /* path: owned by s, stays */
        }
    }
    closedir(d);
}

static int ent_cmp(const void *a, const void *b)
{
    return strcmp(((const fsent *)a)->path, ((const fsent *)b)->path);
}

fsdiff_snap *fsdiff_take(const char *root, size_t scan_max)
{
    fsdiff_snap *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->scan_max = scan_max ? scan_max : 1;
    s->rootfd = wsfile_root_open(root, NULL, 0);
    if (s->rootfd >= 0) {
        int fd = dup(s->rootfd);
        if (fd >= 0)
            walk(s, fd, "", 0);
    }
    if (s->n)
        qsort(s->v, s->n, sizeof *s->v, ent_cmp);
    return s;
}

void fsdiff_destroy(fsdiff_snap **p)
{
    if (!p || !*p)
        return;
    for (size_t i = 0; i < (*p)->n; i++) {
        free((*p)->v[i].path);
        free((*p)->v[i].target);
    }
    if ((*p)->rootfd >= 0)
        close((*p)->rootfd);
    free((*p)->v);
    free(*p);
    *p = NULL;
}

int fsdiff_incomplete(const fsdiff_snap *s)
{
    return s->incomplete;
}

static const char *mime_by_type(unsigned mode)
{
    if (S_ISLNK(mode))
        return "inode/symlink";
    if (S_ISFIFO(mode))
        return "inode/fifo";
    if (S_ISSOCK(mode))
        return "inode/socket";
    if (S_ISCHR(mode))
        return "inode/chardevice";
    if (S_ISBLK(mode))
        return "inode/blockdevice";
    if (S_ISDIR(mode))
        return "inode/directory";
    return NULL;
}

static const char *sniff(int fd)
{
    unsigned char buf[512];
    ssize_t n;
    do
        n = pread(fd, buf, sizeof buf, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return "application/octet-stream";
    if (n == 0)
        return "text/plain";
    if (n >= 8 && !memcmp(buf, "\x89PNG\r\n\x1a\n", 8))
        return "image/png";
    if (n >= 3 && !memcmp(buf, "\xff\xd8\xff", 3))
        return "image/jpeg";
    if (n >= 4 && !memcmp(buf, "%PDF", 4))
        return "application/pdf";
    if (n >= 4 && !memcmp(buf,
                          "\x7f"
                          "ELF",
                          4))
        return "application/x-executable";
    if (memchr(buf, 0, (size_t)n))
        return "application/octet-stream";
    /* a multi-byte char may be cut at the end of the sample */
    size_t ok = jp_utf8_complete_prefix(buf, (size_t)n);
    return jp_utf8_valid(buf, ok) ? "text/plain" : "application/octet-stream";
}

const char *fsdiff_mime_fd(int fd, const char *relpath)
{
    const char *m = cm_mime_by_name(relpath);
    return m ? m : sniff(fd);
}

/* ino: the inode the walk saw (0: any); a file replaced since is not sniffed */
static const char *mime_at(int rootfd, const char *relpath, unsigned mode, uint64_t ino)
{
    const char *m = mime_by_type(mode);
    if (!m)
        m = cm_mime_by_name(relpath);
    if (m)
        return m;
    if (!S_ISREG(mode) || rootfd < 0)
        return "application/octet-stream";
    struct stat st;
    int fd = wsfile_open_regular(rootfd, relpath, &st, NULL, 0);
    if (fd < 0)
        return "application/octet-stream";
    m = ino && st.st_ino != ino ? "application/octet-stream" : sniff(fd);
    close(fd);
    return m;
}

const char *fsdiff_mime(int rootfd, const char *relpath, unsigned mode)
{
    return mime_at(rootfd, relpath, mode, 0);
}

static json_t *entry_json(int rootfd, const fsent *e, const char *change)
{
    char *p = jp_utf8_sanitize(e->path, strlen(e->path), NULL);
    /* a deleted file is not there to sniff */
    const char *mime = strcmp(change, "deleted") ? mime_at(rootfd, e->path, e->mode, e->ino)
                                                 : mime_at(-1, e->path, e->mode, e->ino);
    json_t *o = json_pack("{s:s s:s s:I s:s}", "path", p ? p : "?", "change", change, "size",
                          (json_int_t)e->size, "mime", mime);
    if (o && e->target && strcmp(change, "deleted")) {
        char *t = jp_utf8_sanitize(e->target, strlen(e->target), NULL);
        if (t)
            json_object_set_new(o, "target", json_string(t));
        free(t);
    }
    free(p);
    return o;
}

static int changed(const fsent *a, const fsent *b)
{
    return a->size != b->size || a->mtime_ns != b->mtime_ns || a->ino != b->ino ||
           a->mode != b->mode;
}

json_t *fsdiff_compare(const fsdiff_snap *before, const fsdiff_snap *after, size_t max_report,
                       size_t *omitted)
{
    json_t *out = json_array();
    size_t i = 0, j = 0, extra = 0;
    while (out && (i < before->n || j < after->n)) {
        const fsent *a = i < before->n ? &before->v[i] : NULL;
        const fsent *b = j < after->n ? &after->v[j] : NULL;
        int c = !a ? 1 : !b ? -1 : strcmp(a->path, b->path);
        const fsent *e = NULL;
        const char *change = NULL;
        if (c < 0) {
            /* an incomplete "after" walk cannot prove a deletion */
            if (!after->incomplete) {
                e = a;
                change = "deleted";
            }
            i++;
        } else if (c > 0) {
            e = b;
            change = "created";
            j++;
        } else {
            if (changed(a, b)) {
                e = b;
                change = "modified";
            }
            i++;
            j++;
        }
        if (!e || S_ISDIR(e->mode))
            continue;
        if (json_array_size(out) >= max_report) {
            extra++;
            continue;
        }
        json_array_append_new(out, entry_json(after->rootfd, e, change));
    }
    if (omitted)
        *omitted = extra;
    return out;
}

json_t *fsdiff_list(const fsdiff_snap *s, size_t max)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < s->n && json_array_size(out) < max; i++) {
        const fsent *e = &s->v[i];
        if (S_ISDIR(e->mode))
            continue;
        char *p = jp_utf8_sanitize(e->path, strlen(e->path), NULL);
        const char *type = S_ISREG(e->mode)    ? "file"
                           : S_ISLNK(e->mode)  ? "symlink"
                           : S_ISFIFO(e->mode) ? "fifo"
                                               : "other";
        json_t *o = json_pack("{s:s s:I s:s s:s}", "path", p ? p : "?", "size", (json_int_t)e->size,
                              "mime", mime_at(s->rootfd, e->path, e->mode, e->ino), "type", type);
        if (o && e->target) {
            char *t = jp_utf8_sanitize(e->target, strlen(e->target), NULL);
            if (t)
                json_object_set_new(o, "target", json_string(t));
            free(t);
        }
        json_array_append_new(out, o);
        free(p);
    }
    return out;
}
