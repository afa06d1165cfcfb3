/*
 * kenvpath.c — see kenvpath.h.
 */
#include "kernels/server/kenvpath.h"

#include <stdlib.h>
#include <string.h>

char *kenvpath_clean(const char *list, char sep)
{
    if (!list)
        return NULL;
    size_t n = strlen(list);
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (const char *p = list;;) {
        const char *end = strchr(p, sep);
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0 && p[0] == '/') {
            if (o > 0)
                out[o++] = sep;
            memcpy(out + o, p, len);
            o += len;
        }
        if (!end)
            break;
        p = end + 1;
    }
    out[o] = '\0';
    return out;
}

/* The cleaned "NAME=VALUE" for entry, a copy when it needs no cleaning, or
 * "" (an empty string) when it is to be dropped. NULL on OOM. */
static char *clean_entry(const char *entry)
{
    static const struct {
        const char *name;
        char sep;
    } vars[] = {
        {"PATH=", ':'}, {"LD_LIBRARY_PATH=", ':'}, {"LD_PRELOAD=", ':'}, {"LD_AUDIT=", ':'}};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        size_t nl = strlen(vars[i].name);
        if (strncmp(entry, vars[i].name, nl) != 0)
            continue;
        /* LD_PRELOAD also splits on spaces: treat them as separators too. */
        char *val = strdup(entry + nl);
        if (!val)
            return NULL;
        if (strcmp(vars[i].name, "LD_PRELOAD=") == 0)
            for (char *s = val; *s; s++)
                if (*s == ' ')
                    *s = ':';
        char *c = kenvpath_clean(val, vars[i].sep);
        free(val);
        if (!c)
            return NULL;
        if (!*c)
            return c; /* "": drop */
        size_t cl = strlen(c);
        char *out = malloc(nl + cl + 1);
        if (out) {
            memcpy(out, vars[i].name, nl);
            memcpy(out + nl, c, cl + 1);
        }
        free(c);
        return out;
    }
    return strdup(entry);
}

char **kenvpath_clean_environ(char *const *env)
{
    size_t n = 0;
    while (env && env[n])
        n++;
    char **out = calloc(n + 1, sizeof *out);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char *e = clean_entry(env[i]);
        if (!e) {
            kenvpath_free_environ(out);
            return NULL;
        }
        if (!*e) {
            free(e);
            continue;
        }
        out[o++] = e;
    }
    return out;
}

void kenvpath_free_environ(char **env)
{
    if (!env)
        return;
    for (size_t i = 0; env[i]; i++)
        free(env[i]);
    free(env);
}
