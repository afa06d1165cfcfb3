/*
 * fsdiff.c — bounded fd-based walks of a workspace and their comparison.
 */
#include "kernelmgr/engine/fsdiff.h"
#include "common/cm_utf8.h"
#include "common/cm_mime.h"
#include "common/cm_size.h"
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

#define FSDIFF_STR_(x) #x
#define FSDIFF_STR(x) FSDIFF_STR_(x)

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
    size_t bytes, scan_bytes; /* charged (FSDIFF_ENTRY_COST) and the budget */
    int incomplete;
    int stop;                      /* a limit was reached: the walk ends */
    const char *scan_limit;        /* the limit that stopped it, or NULL */
    char *notes[FSDIFF_NOTES_MAX]; /* what was not walked, and why */
    size_t nnotes, notes_omitted;
    int rootfd; /* the workspace root, -1 when it could not be opened */
};

/* Records that rel (a directory, "" = the root) was not walked: "what: rel
 * (detail)"; the path is sanitised and cut to FSDIFF_NOTE_PATH_MAX bytes. */
static void snap_note(fsdiff_snap *s, const char *what, const char *rel, const char *detail)
{
    s->incomplete = 1;
    if (s->nnotes == FSDIFF_NOTES_MAX) {
        s->notes_omitted++;
        return;
    }
    size_t len = strlen(rel);
    int cut = len > FSDIFF_NOTE_PATH_MAX;
    if (cut)
        len = cm_utf8_complete_prefix(rel, FSDIFF_NOTE_PATH_MAX);
    char *p = cm_utf8_sanitize(rel, len, NULL);
    char *note = NULL;
    if (p && asprintf(&note, "%s: %s%s%s%s%s", what, *rel ? p : ".", cut ? "..." : "",
                      detail ? " (" : "", detail ? detail : "", detail ? ")" : "") < 0)
        note = NULL;
    free(p);
    if (note)
        s->notes[s->nnotes++] = note;
    else
        s->notes_omitted++;
}

/* A limit stopped the walk: why is a static string. */
static void snap_stop(fsdiff_snap *s, const char *why)
{
    s->incomplete = 1;
    s->stop = 1;
    if (!s->scan_limit)
        s->scan_limit = why;
}

/* Takes ownership of path. 0, 1 when the byte budget is spent (path freed,
 * nothing pushed), -1 when out of memory. */
static int snap_push(fsdiff_snap *s, char *path, const struct stat *st, int dfd, const char *name)
{
    /* checked before the link is read (st_size is its length; unknown:
     * the most it can be), charged for what was read: the link may have
     * been replaced by a longer one since */
    size_t plen = strlen(path);
    size_t link = S_ISLNK(st->st_mode)
                      ? (st->st_size > 0 && st->st_size < WSFILE_LINK_MAX ? (size_t)st->st_size
                                                                          : WSFILE_LINK_MAX)
                      : 0;
    if (FSDIFF_ENTRY_COST(plen, link) > s->scan_bytes - s->bytes) {
        free(path);
        return 1;
    }
    /* the text of this very entry: the walk's parent fd and its name,
     * never a path resolved again later */
    char *target = S_ISLNK(st->st_mode) ? wsfile_readlinkat(dfd, name) : NULL;
    size_t cost = FSDIFF_ENTRY_COST(plen, target ? strlen(target) : 0);
    if (cost > s->scan_bytes - s->bytes) {
        free(target);
        free(path);
        return 1;
    }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        fsent *v = realloc(s->v, cap * sizeof *v);
        if (!v) {
            free(target);
            free(path);
            return -1;
        }
        s->v = v;
        s->cap = cap;
    }
    fsent *e = &s->v[s->n];
    e->path = path;
    e->target = target;
    e->mode = st->st_mode;
    e->size = (uint64_t)st->st_size;
    e->ino = st->st_ino;
    e->mtime_ns = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
    s->bytes += cost;
    s->n++;
    return 0;
}

/* Why the directory rel could not be opened or read (errno e). */
static void note_unreadable(fsdiff_snap *s, const char *rel, int e)
{
    if (e == ENOENT || e == ENOTDIR || e == ELOOP)
        snap_note(s, "vanished directory", rel, "changed during the walk");
    else if (e == EACCES || e == EPERM)
        snap_note(s, "unreadable directory", rel, NULL);
    else
        snap_note(s, "unreadable directory", rel, strerror(e));
}

/* 1 when the directory name (below dfd) has an entry: a directory past the
 * depth limit that is empty hides nothing. */
static int has_entries(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 1;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 1;
    }
    struct dirent *de;
    int any = 0;
    while (!any && (de = readdir(d)))
        any = strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return any;
}

/* dfd is owned and closed here; rel is the path of the directory ("" = root). */
static void walk(fsdiff_snap *s, int dfd, const char *rel, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        note_unreadable(s, rel, errno);
        close(dfd);
        return;
    }
    struct dirent *de;
    for (;;) {
        errno = 0;
        if (!(de = readdir(d))) {
            if (errno)
                note_unreadable(s, rel, errno);
            break;
        }
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (s->stop)
            break;
        if (s->n >= s->scan_max) {
            snap_stop(s, "files_scan_max");
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW)) {
            /* gone since readdir: nothing to report; else it is there, unseen */
            if (errno != ENOENT) {
                char *p = NULL;
                if (asprintf(&p, "%s%s%s", rel, *rel ? "/" : "", de->d_name) >= 0)
                    snap_note(s, "unreadable entry", p, strerror(errno));
                free(p);
            }
            continue;
        }
        char *path = NULL;
        if (asprintf(&path, "%s%s%s", rel, *rel ? "/" : "", de->d_name) < 0) {
            snap_stop(s, "out of memory");
            break;
        }
        int rc = snap_push(s, path, &st, dirfd(d), de->d_name);
        if (rc) {
            snap_stop(s, rc > 0 ? "files_scan_bytes" : "out of memory");
            break;
        }
        if (!S_ISDIR(st.st_mode))
            continue;
        if (depth >= FSDIFF_DEPTH_MAX) {
            if (has_entries(dirfd(d), de->d_name))
                snap_note(s, "too deep", path, "more than " FSDIFF_STR(FSDIFF_DEPTH_MAX) " levels");
            continue;
        }
        int fd = openat(dirfd(d), de->d_name,
                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        if (fd >= 0)
            walk(s, fd, path, depth + 1); /* path: owned by s, stays */
        else
            note_unreadable(s, path, errno);
    }
    closedir(d);
}

static int ent_cmp(const void *a, const void *b)
{
    return strcmp(((const fsent *)a)->path, ((const fsent *)b)->path);
}

fsdiff_snap *fsdiff_take(const char *root, size_t scan_max, size_t scan_bytes)
{
    fsdiff_snap *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->scan_max = scan_max ? scan_max : 1;
    s->scan_bytes = scan_bytes ? scan_bytes : 1;
    s->rootfd = wsfile_root_open(root, NULL);
    if (s->rootfd < 0) {
        if (errno != ENOENT) /* a workspace not made yet holds nothing */
            note_unreadable(s, "", errno);
    } else {
        int fd = dup(s->rootfd);
        if (fd >= 0)
            walk(s, fd, "", 0);
        else
            note_unreadable(s, "", errno);
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
    for (size_t i = 0; i < (*p)->nnotes; i++)
        free((*p)->notes[i]);
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

size_t fsdiff_bytes(const fsdiff_snap *s)
{
    return s->bytes;
}

json_t *fsdiff_untaken_json(void)
{
    return json_pack("{s:s s:s}", "scan_limit", "out of memory", "reason",
                     "not every file was walked: out of memory");
}

/* "files_scan_bytes: 16 MiB of paths and link text per walk", ... */
static json_t *limit_json(const fsdiff_snap *s)
{
    char sz[32], why[128];
    if (!strcmp(s->scan_limit, "files_scan_bytes"))
        snprintf(why, sizeof why, "files_scan_bytes: %s of paths and link text per walk",
                 cm_size_format(s->scan_bytes, sz, sizeof sz));
    else if (!strcmp(s->scan_limit, "files_scan_max"))
        snprintf(why, sizeof why, "files_scan_max: %zu entries per walk", s->scan_max);
    else
        snprintf(why, sizeof why, "%s", s->scan_limit);
    return json_string(why);
}

json_t *fsdiff_incomplete_json(const fsdiff_snap *a, const fsdiff_snap *b)
{
    const fsdiff_snap *v[2] = {a, b};
    if (!(a && a->incomplete) && !(b && b->incomplete))
        return NULL;
    json_t *o = json_object();
    json_t *notes = json_array();
    size_t omitted = 0;
    for (int k = 0; k < 2 && o && notes; k++) {
        const fsdiff_snap *s = v[k];
        if (!s || !s->incomplete)
            continue;
        if (s->scan_limit && !json_object_get(o, "scan_limit"))
            json_object_set_new(o, "scan_limit", limit_json(s));
        omitted += s->notes_omitted;
        for (size_t i = 0; i < s->nnotes; i++) {
            size_t j;
            json_t *n;
            int dup = 0;
            json_array_foreach(notes, j, n)
            {
                dup |= !strcmp(json_string_value(n), s->notes[i]);
            }
            if (dup)
                continue;
            if (json_array_size(notes) < FSDIFF_NOTES_MAX)
                json_array_append_new(notes, json_string(s->notes[i]));
            else
                omitted++;
        }
    }
    if (o && json_array_size(notes))
        json_object_set(o, "not_walked", notes);
    json_decref(notes);
    if (o && omitted)
        json_object_set_new(o, "not_walked_omitted", json_integer((json_int_t)omitted));
    /* the same in one line, for renderers that show a "reason" */
    char *line = NULL;
    size_t len = 0;
    FILE *f = o ? open_memstream(&line, &len) : NULL;
    if (f) {
        const char *lim = json_string_value(json_object_get(o, "scan_limit"));
        size_t i;
        json_t *n;
        fputs("not every file was walked", f);
        if (lim)
            fprintf(f, ": the walk stopped at %s", lim);
        json_array_foreach(json_object_get(o, "not_walked"), i, n)
        {
            fprintf(f, "%s%s", i || lim ? "; " : ": ", json_string_value(n));
        }
        if (omitted)
            fprintf(f, "; %zu more", omitted);
        if (fclose(f) == 0 && line)
            json_object_set_new(o, "reason", json_string(line));
    }
    free(line);
    return o;
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
    size_t ok = cm_utf8_complete_prefix(buf, (size_t)n);
    return cm_utf8_valid(buf, ok) ? "text/plain" : "application/octet-stream";
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
    int fd = wsfile_open_regular(rootfd, relpath, &st, NULL);
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

/* The bytes s (len bytes) takes as a JSON string's contents: a control
 * character may become "\u00XX", a quote or backslash two bytes. */
static size_t json_text_len(const char *s, size_t len)
{
    size_t n = len;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        n += c < 0x20 ? 5 : (c == '"' || c == '\\') ? 1 : 0;
    }
    return n;
}

/* What an entry costs in a report: its text sanitised, then JSON-escaped,
 * and its JSON object. */
static size_t report_cost(const char *p, size_t plen, const char *t, size_t tlen)
{
    return FSDIFF_REPORT_COST(p ? json_text_len(p, plen) : 1, t ? json_text_len(t, tlen) : 0);
}

/* *cost gets what the entry's sanitised text is charged (report_cost) */
static json_t *entry_json(int rootfd, const fsent *e, const char *change, size_t *cost)
{
    size_t plen = 0, tlen = 0;
    char *p = cm_utf8_sanitize(e->path, strlen(e->path), &plen);
    char *t = e->target && strcmp(change, "deleted")
                  ? cm_utf8_sanitize(e->target, strlen(e->target), &tlen)
                  : NULL;
    *cost = report_cost(p, plen, t, tlen);
    /* a deleted file is not there to sniff */
    const char *mime = strcmp(change, "deleted") ? mime_at(rootfd, e->path, e->mode, e->ino)
                                                 : mime_at(-1, e->path, e->mode, e->ino);
    json_t *o = json_pack("{s:s s:s s:I s:s}", "path", p ? p : "?", "change", change, "size",
                          (json_int_t)e->size, "mime", mime);
    if (o && t)
        json_object_set_new(o, "target", json_string(t));
    free(t);
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
    size_t i = 0, j = 0, extra = 0, bytes = 0;
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
        if (json_array_size(out) >= max_report || extra) {
            extra++;
            continue;
        }
        /* the report is held to the walk's budget as well as to max_report */
        size_t cost = 0;
        json_t *o = entry_json(after->rootfd, e, change, &cost);
        if (cost > after->scan_bytes - bytes) {
            json_decref(o);
            extra++;
            continue;
        }
        bytes += cost;
        json_array_append_new(out, o);
    }
    if (omitted)
        *omitted = extra;
    return out;
}

json_t *fsdiff_list(const fsdiff_snap *s, size_t max, size_t *omitted)
{
    json_t *out = json_array();
    size_t bytes = 0, left = 0;
    for (size_t i = 0; out && i < s->n; i++) {
        const fsent *e = &s->v[i];
        if (S_ISDIR(e->mode))
            continue;
        if (json_array_size(out) >= max || left) {
            left++;
            continue;
        }
        size_t plen = 0, tlen = 0;
        char *p = cm_utf8_sanitize(e->path, strlen(e->path), &plen);
        char *t = e->target ? cm_utf8_sanitize(e->target, strlen(e->target), &tlen) : NULL;
        /* sanitising and escaping may grow the text (U+FFFD for a bad byte,
         * \u00XX for a control character): the listing, as sent, is held to
         * the walk's budget too */
        size_t cost = report_cost(p, plen, t, tlen);
        if (cost > s->scan_bytes - bytes) {
            free(p);
            free(t);
            left++;
            continue;
        }
        bytes += cost;
        const char *type = S_ISREG(e->mode)    ? "file"
                           : S_ISLNK(e->mode)  ? "symlink"
                           : S_ISFIFO(e->mode) ? "fifo"
                                               : "other";
        json_t *o = json_pack("{s:s s:I s:s s:s}", "path", p ? p : "?", "size", (json_int_t)e->size,
                              "mime", mime_at(s->rootfd, e->path, e->mode, e->ino), "type", type);
        if (o && t)
            json_object_set_new(o, "target", json_string(t));
        json_array_append_new(out, o);
        free(p);
        free(t);
    }
    if (omitted)
        *omitted = left;
    return out;
}
