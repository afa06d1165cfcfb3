/*
 * kmfs.h — small file-system helpers the manager's files share.
 */
#ifndef KERNELMGR_KMFS_H
#define KERNELMGR_KMFS_H

#include <sys/types.h>

/* mkdir -p: creates path (absolute or relative; a trusted host path, whose
 * symlinks are followed — never a path inside a workspace: see wsfile.h)
 * and every missing parent with mode; existing directories are fine.
 * Returns 0, or -1 with errno set. */
int kmfs_mkdirs(const char *path, mode_t mode);

#endif
