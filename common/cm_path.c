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
