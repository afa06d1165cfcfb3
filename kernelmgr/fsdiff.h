/*
 * fsdiff.h — what an execution changed in a workspace.
 *
 * A snapshot is an lstat() walk of the tree (never following symlinks, never
 * opening FIFOs, sockets or devices), bounded to scan_max entries. Comparing
 * two snapshots gives created / modified / deleted non-directory entries.
 * Regular files are "modified" when size, mtime (ns), inode or mode changed.
 */
#ifndef KERNELMGR_FSDIFF_H
#define KERNELMGR_FSDIFF_H

#include <jansson.h>
#include <stddef.h>

typedef struct fsdiff_snap fsdiff_snap;

/* new: walks root (absolute). Never NULL unless out of memory; an unreadable
 * root gives an empty snapshot. */
fsdiff_snap *fsdiff_take(const char *root, size_t scan_max);
void fsdiff_destroy(fsdiff_snap **s);

/* 1 when the walk stopped at scan_max. */
int fsdiff_incomplete(const fsdiff_snap *s);

/* new: array of {"path","change","size","mime"} (symlinks also get "target"),
 * sorted by path, at most max_report entries; *omitted gets the number of
 * further changes not listed. Paths are relative to the root and sanitised
 * UTF-8. */
json_t *fsdiff_compare(const fsdiff_snap *before, const fsdiff_snap *after, const char *root,
                       size_t max_report, size_t *omitted);

/* new: array of {"path","size","mime","type"} for every entry of the snapshot
 * (directories excluded), at most max entries. */
json_t *fsdiff_list(const fsdiff_snap *s, const char *root, size_t max);

/* Guesses a mime type from the file name and, for regular files only, the
 * first bytes (opened O_NOFOLLOW|O_NONBLOCK). borrowed static string. */
const char *fsdiff_mime(const char *root, const char *relpath, unsigned mode);

#endif
