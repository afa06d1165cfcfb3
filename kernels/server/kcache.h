/*
 * kcache.h — a small per-user cache of facts about executables that cost a
 * process spawn to learn (the Python probe, bash's version), so that a
 * kernel's cold start does not pay for them every time.
 *
 * Entries live in $XDG_CACHE_HOME/kernelmgr (else ~/.cache/kernelmgr), a
 * directory of mode 0700 owned by the user, opened with O_NOFOLLOW (a
 * symlink, another owner or group/other permissions: no cache at all); one
 * file per entry, reached through that directory fd, written atomically
 * (O_EXCL temporary file + renameat). An entry holds its full key, and is
 * only used when the key matches exactly and the file is a regular file of
 * ours (O_NOFOLLOW, size-capped) that nobody else can write: anything else
 * is a miss. Keys name the executable by path, real path, device, inode,
 * size and mtime (kcache_file_key), so replacing or upgrading it invalidates
 * the entry. Callers validate a cached value like a fresh one.
 */
#ifndef KERNELS_SERVER_KCACHE_H
#define KERNELS_SERVER_KCACHE_H

#include <stddef.h>

#define KCACHE_MAX_VALUE (64u << 10)

/* Appends "path=REALPATH dev:ino:size:mtime_sec.nsec;" for path to key (a
 * NUL-terminated string in a buffer of size bytes); a missing file appends
 * "path=-;". Returns 0, or -1 when key is too small. */
int kcache_file_key(const char *path, char *key, size_t size);

/* new (free()): the value stored under (kind, key), or NULL on a miss.
 * kind is a short [a-z]+ name of the kind of entry. */
char *kcache_get(const char *kind, const char *key);

/* Stores value under (kind, key); failures are silent (it is a cache). */
void kcache_put(const char *kind, const char *key, const char *value);

#endif
