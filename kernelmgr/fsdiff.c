/*
 * fsdiff.c — bounded lstat() walks and their comparison.
 */
#include "kernelmgr/fsdiff.h"
#include "jp.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct fsent {
    char *path; /* relative */
    unsigned mode;
    uint64_t size, ino;
    int64_t mtime_ns;
} fsent;

struct fsdiff_snap {
    fsent *v;
    size_t n, cap, scan_max;
    int incomplete;
};

static int snap_push(fsdiff_snap *s, const char *path, const struct stat *st)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        fsent *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    fsent *e = &s->v[s->n];
    e->path = strdup(path);
    if (!e->path)
        return -1;
    e->mode = st->st_mode;
    e->size = (uint64_t)st->st_size;
    e->ino = st->st_ino;
    e->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    s->n++;
    return 0;
}

/* dirfd is owned and closed here; rel is the path of the directory ("" = root). */
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
        char path[PATH_MAX];
        int n = snprintf(path, sizeof path, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
        if (n < 0 || (size_t)n >= sizeof path)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW))
            continue;
        if (snap_push(s, path, &st))
            break;
        if (S_ISDIR(st.st_mode) && depth < 64) {
            int fd = openat(dirfd(d), de->d_name,
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
            if (fd >= 0)
                walk(s, fd, path, depth + 1);
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
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0)
        walk(s, fd, "", 0);
    qsort(s->v, s->n, sizeof *s->v, ent_cmp);
    return s;
}

void fsdiff_destroy(fsdiff_snap **p)
{
    if (!p || !*p)
        return;
    for (size_t i = 0; i < (*p)->n; i++)
        free((*p)->v[i].path);
    free((*p)->v);
    free(*p);
    *p = NULL;
}

int fsdiff_incomplete(const fsdiff_snap *s)
{
    return s->incomplete;
}

static const struct {
    const char *ext, *mime;
} mime_by_ext[] = {
    {".png", "image/png"},
    {".jpg", "image/jpeg"},
    {".jpeg", "image/jpeg"},
    {".gif", "image/gif"},
    {".svg", "image/svg+xml"},
    {".webp", "image/webp"},
    {".pdf", "application/pdf"},
    {".csv", "text/csv"},
    {".tsv", "text/tab-separated-values"},
    {".txt", "text/plain"},
    {".md", "text/markdown"},
    {".log", "text/plain"},
    {".json", "application/json"},
    {".jsonl", "application/jsonl"},
    {".html", "text/html"},
    {".htm", "text/html"},
    {".xml", "application/xml"},
    {".py", "text/x-python"},
    {".sh", "text/x-shellscript"},
    {".ipynb", "application/x-ipynb+json"},
    {".zip", "application/zip"},
    {".gz", "application/gzip"},
    {".tar", "application/x-tar"},
    {".parquet", "application/vnd.apache.parquet"},
    {".yaml", "application/yaml"},
    {".yml", "application/yaml"},
    {".toml", "application/toml"},
    {".c", "text/x-c"},
    {".h", "text/x-c"},
    {".js", "text/javascript"},
    {".css", "text/css"},
    {".npy", "application/octet-stream"},
    {".pkl", "application/octet-stream"},
};

const char *fsdiff_mime(const char *root, const char *relpath, unsigned mode)
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
    const char *dot = strrchr(relpath, '.');
    const char *slash = strrchr(relpath, '/');
    if (dot && (!slash || dot > slash))
        for (size_t i = 0; i < sizeof mime_by_ext / sizeof *mime_by_ext; i++)
            if (!strcasecmp(dot, mime_by_ext[i].ext))
                return mime_by_ext[i].mime;
    if (!S_ISREG(mode))
        return "application/octet-stream";
    /* sniff: only regular files, never following a link swapped in meanwhile */
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", root, relpath) >= sizeof path)
        return "application/octet-stream";
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return "application/octet-stream";
    struct stat st;
    unsigned char buf[512];
    ssize_t n = -1;
    if (!fstat(fd, &st) && S_ISREG(st.st_mode))
        n = read(fd, buf, sizeof buf);
    close(fd);
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

static json_t *entry_json(const char *root, const fsent *e, const char *change)
{
    char *p = jp_utf8_sanitize(e->path, strlen(e->path), NULL);
    json_t *o = json_pack("{s:s s:s s:I s:s}", "path", p ? p : "?", "change", change, "size",
                          (json_int_t)e->size, "mime", fsdiff_mime(root, e->path, e->mode));
    if (o && S_ISLNK(e->mode) && strcmp(change, "deleted")) {
        char path[PATH_MAX], target[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", root, e->path) < sizeof path) {
            ssize_t n = readlink(path, target, sizeof target - 1);
            if (n >= 0) {
                char *t = jp_utf8_sanitize(target, (size_t)n, NULL);
                if (t)
                    json_object_set_new(o, "target", json_string(t));
                free(t);
            }
        }
    }
    free(p);
    return o;
}

static int changed(const fsent *a, const fsent *b)
{
    return a->size != b->size || a->mtime_ns != b->mtime_ns || a->ino != b->ino ||
           a->mode != b->mode;
}

json_t *fsdiff_compare(const fsdiff_snap *before, const fsdiff_snap *after, const char *root,
                       size_t max_report, size_t *omitted)
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
        json_array_append_new(out, entry_json(root, e, change));
    }
    if (omitted)
        *omitted = extra;
    return out;
}

json_t *fsdiff_list(const fsdiff_snap *s, const char *root, size_t max)
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
        json_array_append_new(out, json_pack("{s:s s:I s:s s:s}", "path", p ? p : "?", "size",
                                             (json_int_t)e->size, "mime",
                                             fsdiff_mime(root, e->path, e->mode), "type", type));
        free(p);
    }
    return out;
}
