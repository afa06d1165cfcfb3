/*
 * cm_path.c — paths built to their length (see cm_path.h).
 */
#include "common/cm_path.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *cm_path_join(const char *dir, const char *name)
{
    if (!dir || !name) {
        errno = EINVAL;
        return NULL;
    }
    size_t dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/')
        dl--;
    while (*name == '/' && dl)
        name++;
    size_t nl = strlen(name);
    int slash = dl && dir[dl - 1] != '/';
    char *p = malloc(dl + (size_t)slash + nl + 1);
    if (!p)
        return NULL;
    memcpy(p, dir, dl);
    if (slash)
        p[dl] = '/';
    memcpy(p + dl + slash, name, nl + 1);
    return p;
}

char *cm_path_fmt(const char *fmt, ...)
{
    if (!fmt) {
        errno = EINVAL;
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    char *p = NULL;
    int n = vasprintf(&p, fmt, ap);
    va_end(ap);
    if (n < 0) {
        errno = ENOMEM;
        return NULL;
    }
    return p;
}

int cm_path_under(const char *path, const char *base)
{
    if (!path || !base || !*base)
        return 0;
    size_t n = strlen(base);
    while (n > 1 && base[n - 1] == '/')
        n--;
    if (n == 1 && base[0] == '/')
        return 1;
    return strncmp(path, base, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

char *cm_path_absolute(const char *path)
{
    if (!path) {
        errno = EINVAL;
        return NULL;
    }
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        errno = EINVAL;
        return NULL;
    }
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    if (!dir)
        return NULL;
    char *real = realpath(*dir ? dir : "/", NULL);
    free(dir);
    if (!real)
        return NULL;
    char *abs = cm_path_join(real, base);
    free(real);
    return abs;
}
