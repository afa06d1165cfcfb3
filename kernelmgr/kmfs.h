/*
 * kmfs.h — small file-system helpers the manager's files share.
 */
#ifndef KERNELMGR_KMFS_H
#define KERNELMGR_KMFS_H

#include <sys/types.h>

/* mkdir -p: creates path (absolute or relative, at most PATH_MAX - 1 bytes)
 * and every missing parent with mode; existing directories are fine.
 * Returns 0, or -1 with errno set (ENAMETOOLONG for a path too long). */
int kmfs_mkdirs(const char *path, mode_t mode);

#endif
