/*
 * khistory.c — execution history, see khistory.h.
 */
#include "kernels/server/khistory.h"

#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    int fd; /* append-only file, -1 when none */
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

static void load(khistory *h, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)len, 0, NULL);
        json_t *s = json_object_get(j, "session"), *l = json_object_get(j, "line"),
               *in = json_object_get(j, "input");
        if (json_is_integer(s) && json_is_integer(l) && json_is_string(in)) {
            if (h->n >= KHISTORY_MAX_LOAD) {
                /* Keep the newest: drop the oldest half. */
                size_t drop = h->n / 2;
                for (size_t i = 0; i < drop; i++)
                    free(h->v[i].input);
                memmove(h->v, h->v + drop, (h->n - drop) * sizeof *h->v);
                h->n -= drop;
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

khistory *khistory_open(const char *path)
{
    khistory *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->fd = -1;
    if (path) {
        load(h, path);
        h->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
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
    free(h);
    *ph = NULL;
}

int khistory_session(const khistory *h)
{
    return h->session;
}

int khistory_add(khistory *h, int line, const char *input)
{
    if (push(h, h->session, line, input) < 0)
        return -1;
    if (h->fd < 0)
        return 0;
    json_t *j = json_pack("{s:i, s:i, s:s}", "session", h->session, "line", line, "input", input);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text)
        return 0;
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the NUL: written with an explicit length */
    ssize_t w = write(h->fd, text, len + 1);
    if (w != (ssize_t)(len + 1) && !h->warned) {
        fprintf(stderr, "history: cannot append: %s\n", w < 0 ? strerror(errno) : "short write");
        h->warned = 1;
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

json_t *khistory_query(const khistory *h, const json_t *content)
{
    json_t *out = json_array();
    if (!out)
        return NULL;
    const char *type = json_string_value(json_object_get(content, "hist_access_type"));
    int output = json_is_true(json_object_get(content, "output"));
    if (!type)
        type = "tail";
    if (!strcmp(type, "tail")) {
        int n = get_int(content, "n", 10);
        size_t start = (n > 0 && (size_t)n < h->n) ? h->n - (size_t)n : 0;
        for (size_t i = start; i < h->n; i++)
            json_array_append_new(out, entry_json(&h->v[i], output));
    } else if (!strcmp(type, "range")) {
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
    } else if (!strcmp(type, "search")) {
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
    return out;
}
