/*
 * khistory.c — execution history, see khistory.h.
 */
#include "kernels/server/khistory.h"
#include "common/cm_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <dirent.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KHISTORY_MAX_LOAD 100000 /* entries read back from the file */

typedef struct khentry {
    int session;
    int line;
    char *input;
} khentry;

struct khistory {
    khentry *v;
    size_t n, cap;
    int session;
    int fd;        /* append-only file, -1 when none */
    char *path;    /* the file, NULL when none */
    uint64_t max;  /* the file's size cap */
    uint64_t size; /* the file's size as we wrote it */
    uint64_t mem;  /* the records' size of the entries in memory */
    int warned;
};

static int push(khistory *h, int session, int line, const char *input)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        khentry *v = realloc(h->v, cap * sizeof *v);
        if (!v)
            return -1;
        h->v = v;
        h->cap = cap;
    }
    char *copy = strdup(input);
    if (!copy)
        return -1;
    khentry *e = &h->v[h->n++];
    e->session = session;
    e->line = line;
    e->input = copy;
    return 0;
}

/* A record cut short (a crash or a full disk in the middle of an append)
 * would glue the next record to it: the file is cut back to its last
 * complete line before anything is appended. */
static void drop_torn_tail(const char *path)
{
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        off_t end = st.st_size;
        char buf[4096];
        off_t keep = 0;
        while (end > 0) {
            off_t start = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
            ssize_t r = pread(fd, buf, (size_t)(end - start), start);
            if (r <= 0)
                break;
            ssize_t i = r;
            while (i > 0 && buf[i - 1] != '\n')
                i--;
            if (i > 0) {
                keep = start + i;
                break;
            }
            end = start;
        }
        if (keep < st.st_size && ftruncate(fd, keep) == 0)
            fprintf(stderr, "history: %s: dropped an incomplete last record (%lld bytes)\n", path,
                    (long long)(st.st_size - keep));
    }
    close(fd);
}

static void load(khistory *h, const char *path)
{
    drop_torn_tail(path);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    uint64_t bytes = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)len, 0, NULL);
        json_t *s = json_object_get(j, "session"), *l = json_object_get(j, "line"),
               *in = json_object_get(j, "input");
        if (json_is_integer(s) && json_is_integer(l) && json_is_string(in)) {
            bytes += (uint64_t)len;
            if (h->n >= KHISTORY_MAX_LOAD || (bytes > h->max && h->n > 1)) {
                /* Keep the newest: drop the oldest half. */
                size_t drop = h->n / 2;
                for (size_t i = 0; i < drop; i++)
                    free(h->v[i].input);
                memmove(h->v, h->v + drop, (h->n - drop) * sizeof *h->v);
                h->n -= drop;
                bytes /= 2; /* roughly: compact() recounts */
            }
            push(h, (int)json_integer_value(s), (int)json_integer_value(l), json_string_value(in));
            if (json_integer_value(s) > h->session)
                h->session = (int)json_integer_value(s);
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
}

khistory *khistory_open(const char *path, uint64_t max)
{
    khistory *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->fd = -1;
    h->max = max < 4096 ? 4096 : max;
    if (path) {
        h->path = strdup(path);
        if (!h->path) {
            free(h);
            return NULL;
        }
        load(h, path);
        h->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        struct stat st;
        if (h->fd >= 0 && fstat(h->fd, &st) == 0)
            h->size = h->mem = (uint64_t)st.st_size;
        if (h->fd < 0)
            fprintf(stderr, "history: cannot open %s: %s (history kept in memory only)\n", path,
                    strerror(errno));
    }
    h->session += 1;
    return h;
}

void khistory_destroy(khistory **ph)
{
    if (!ph || !*ph)
        return;
    khistory *h = *ph;
    for (size_t i = 0; i < h->n; i++)
        free(h->v[i].input);
    free(h->v);
    if (h->fd >= 0)
        close(h->fd);
    free(h->path);
    free(h);
    *ph = NULL;
}

int khistory_session(const khistory *h)
{
    return h->session;
}

/* new (free()): the file's line for e, '\n'-terminated; *len its length. */
static char *record(const khentry *e, size_t *len)
{
    json_t *j =
        json_pack("{s:i, s:i, s:s}", "session", e->session, "line", e->line, "input", e->input);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text)
        return NULL;
    *len = strlen(text);
    text[(*len)++] = '\n'; /* replaces the NUL: written with an explicit length */
    return text;
}

static void warn(khistory *h, const char *what, int err)
{
    if (!h->warned)
        fprintf(stderr, "history: %s %s: %s\n", what, h->path, strerror(err));
    h->warned = 1;
}

/* Keeps the newest entries whose records fit in half the cap (memory and
 * file alike) and rewrites the file with them: a temporary file renamed
 * over the old one, so a crash or a full disk leaves the old file or the
 * new one, never a mix. */
static void compact(khistory *h, size_t pending)
{
    /* the last `pending` entries are in memory but not in the file yet */
    size_t written = h->n - pending;
    size_t keep_from = written, total = 0;
    while (keep_from > 0) {
        size_t len = 0;
        char *rec = record(&h->v[keep_from - 1], &len);
        free(rec);
        if (!rec || total + len > h->max / 2)
            break;
        total += len;
        keep_from--;
    }
    for (size_t i = 0; i < keep_from; i++)
        free(h->v[i].input);
    memmove(h->v, h->v + keep_from, (h->n - keep_from) * sizeof *h->v);
    h->n -= keep_from;
    written -= keep_from;
    h->mem = total;
    char *tmp = NULL;
    if (!h->path || asprintf(&tmp, "%s.tmp", h->path) < 0)
        return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    int rc = fd < 0 ? -1 : 0;
    uint64_t size = 0;
    for (size_t i = 0; rc == 0 && i < written; i++) {
        size_t len = 0;
        char *rec = record(&h->v[i], &len);
        rc = rec ? cm_write_all(fd, rec, len) : -1;
        size += len;
        free(rec);
    }
    int err = errno;
    if (fd >= 0 && close(fd) < 0 && rc == 0) {
        rc = -1;
        err = errno;
    }
    if (rc == 0 && rename(tmp, h->path) < 0) {
        rc = -1;
        err = errno;
    }
    if (rc) {
        unlink(tmp);
        warn(h, "cannot compact", err);
    } else {
        if (h->fd >= 0)
            close(h->fd);
        h->fd = open(h->path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
        h->size = size;
    }
    free(tmp);
}

int khistory_add(khistory *h, int line, const char *input)
{
    if (push(h, h->session, line, input) < 0)
        return -1;
    size_t len = 0;
    char *text = record(&h->v[h->n - 1], &len);
    if (!text)
        return 0;
    if (len > h->max / 2) {
        /* one input larger than the cap allows: not kept */
        free(h->v[--h->n].input);
        free(text);
        return 0;
    }
    if (h->size + len > h->max || h->mem + len > h->max)
        compact(h, 1); /* the new entry is appended below */
    h->mem += len;
    if (h->fd >= 0) {
        if (cm_write_all(h->fd, text, len) < 0) {
            int err = errno;
            /* a full disk: take back the part that was written */
            if (ftruncate(h->fd, (off_t)h->size) < 0) {
            }
            warn(h, "cannot append to", err);
        } else {
            h->size += len;
        }
    }
    free(text);
    return 0;
}

static json_t *entry_json(const khentry *e, int output)
{
    json_t *in = json_string(e->input);
    if (!in)
        in = json_string("");
    if (output)
        return json_pack("[i, i, [o, n]]", e->session, e->line, in);
    return json_pack("[i, i, o]", e->session, e->line, in);
}

static int get_int(const json_t *content, const char *key, int dflt)
{
    json_t *v = json_object_get(content, key);
    return json_is_integer(v) ? (int)json_integer_value(v) : dflt;
}

/* The history requests, a row per hist_access_type: each appends to out
 * the entries it selects (output: with their outputs, as null). */
static void hist_tail(const khistory *h, const json_t *content, int output, json_t *out)
{
    int n = get_int(content, "n", 10);
    size_t start = (n > 0 && (size_t)n < h->n) ? h->n - (size_t)n : 0;
    for (size_t i = start; i < h->n; i++)
        json_array_append_new(out, entry_json(&h->v[i], output));
}

static void hist_range(const khistory *h, const json_t *content, int output, json_t *out)
{
    int session = get_int(content, "session", 0);
    if (session <= 0)
        session = h->session + session; /* 0: this one, -1: the previous ... */
    int start = get_int(content, "start", 0);
    int stop = get_int(content, "stop", 0); /* exclusive; 0 or less: to the end */
    for (size_t i = 0; i < h->n; i++) {
        const khentry *e = &h->v[i];
        if (e->session == session && e->line >= start && (stop <= 0 || e->line < stop))
            json_array_append_new(out, entry_json(e, output));
    }
}

static void hist_search(const khistory *h, const json_t *content, int output, json_t *out)
{
    const char *pattern = json_string_value(json_object_get(content, "pattern"));
    int n = get_int(content, "n", 0);
    int unique = json_is_true(json_object_get(content, "unique"));
    if (!pattern)
        pattern = "*";
    /* Newest first, so "n" and "unique" keep the most recent matches. */
    json_t *rev = json_array();
    for (size_t i = h->n; i-- > 0;) {
        const khentry *e = &h->v[i];
        if (fnmatch(pattern, e->input, 0) != 0)
            continue;
        if (unique) {
            int seen = 0;
            for (size_t k = i + 1; k < h->n && !seen; k++)
                seen = !strcmp(h->v[k].input, e->input) && !fnmatch(pattern, h->v[k].input, 0);
            if (seen)
                continue;
        }
        json_array_append_new(rev, entry_json(e, output));
        if (n > 0 && json_array_size(rev) >= (size_t)n)
            break;
    }
    for (size_t i = json_array_size(rev); i-- > 0;)
        json_array_append(out, json_array_get(rev, i));
    json_decref(rev);
}

static const struct {
    const char *type;
    void (*fn)(const khistory *h, const json_t *content, int output, json_t *out);
} hist_types[] = {
    {"tail", hist_tail},
    {"range", hist_range},
    {"search", hist_search},
};

json_t *khistory_query(const khistory *h, const json_t *content)
{
    json_t *out = json_array();
    if (!out)
        return NULL;
    const char *type = json_string_value(json_object_get(content, "hist_access_type"));
    int output = json_is_true(json_object_get(content, "output"));
    if (!type)
        type = "tail";
    for (size_t i = 0; i < sizeof hist_types / sizeof *hist_types; i++)
        if (!strcmp(type, hist_types[i].type)) {
            hist_types[i].fn(h, content, output, out);
            break;
        }
    return out;
}

void khistory_sweep(const char *path)
{
    static const char suffix[] = ".history.jsonl";
    static const char record[] = "{\"session\":";
    const size_t sl = sizeof suffix - 1;
    const char *slash = path ? strrchr(path, '/') : NULL;
    char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    const char *own = slash ? slash + 1 : path;
    DIR *d = dir && path ? opendir(dir) : NULL;
    free(dir);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= sl || strcmp(de->d_name + len - sl, suffix) || !strcmp(de->d_name, own))
            continue;
        char base[NAME_MAX + 1];
        snprintf(base, sizeof base, "%.*s", (int)(len - sl), de->d_name);
        struct stat st;
        if (faccessat(dirfd(d), base, F_OK, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
            continue; /* its connection file is there: a live or restartable kernel's */
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            continue;
        char head[sizeof record - 1];
        int ours = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                   (st.st_size == 0 || (pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head &&
                                        !memcmp(head, record, sizeof head)));
        close(fd);
        if (ours)
            unlinkat(dirfd(d), de->d_name, 0);
    }
    if (d)
        closedir(d);
}
