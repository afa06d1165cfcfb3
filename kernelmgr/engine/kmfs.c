/*
 * kmfs.c — small file-system helpers the manager's files share.
 */
#include "kernelmgr/engine/kmfs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kmfs_mkdirs(const char *path, mode_t mode)
{
    if (!path || !*path) {
        errno = ENOENT;
        return -1;
    }
    char *buf = strdup(path);
    if (!buf)
        return -1;
    int rc = 0;
    for (char *p = buf + 1; *p && rc == 0; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, mode) < 0 && errno != EEXIST)
            rc = -1;
        *p = '/';
    }
    if (rc == 0 && mkdir(buf, mode) < 0 && errno != EEXIST)
        rc = -1;
    int e = errno;
    free(buf);
    errno = e;
    return rc;
}
