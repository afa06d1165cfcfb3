/*
 * fsdiff.h — what an execution changed in a workspace.
 *
 * A snapshot is a walk of the tree through directory fds (wsfile.h): the
 * root is opened once (O_DIRECTORY | O_NOFOLLOW), every directory below it
 * openat(O_DIRECTORY | O_NOFOLLOW) relative to its parent's fd, every entry
 * fstatat(AT_SYMLINK_NOFOLLOW) — symlinks are never followed and FIFOs,
 * sockets or devices never opened. A symlink's text is read during the walk
 * with readlinkat(parent fd, name) (at most WSFILE_LINK_MAX bytes) and
 * reported as plain text, never resolved. The walk is bounded to scan_max
 * entries and 64 levels. Comparing two snapshots gives created / modified /
 * deleted non-directory entries. Regular files are "modified" when size,
 * mtime (ns), inode or mode changed. The snapshot keeps the root's fd, and
 * MIME sniffing opens files only through it (wsfile_open_regular).
 */
#ifndef KERNELMGR_FSDIFF_H
#define KERNELMGR_FSDIFF_H

#include <jansson.h>
#include <stddef.h>

typedef struct fsdiff_snap fsdiff_snap;

/* new: walks root (absolute, trusted host path; not a symlink itself).
 * Never NULL unless out of memory; an unreadable root gives an empty
 * snapshot. Holds an fd of root until fsdiff_destroy. */
fsdiff_snap *fsdiff_take(const char *root, size_t scan_max);
void fsdiff_destroy(fsdiff_snap **s);

/* 1 when the walk stopped at scan_max. */
int fsdiff_incomplete(const fsdiff_snap *s);

/* new: array of {"path","change","size","mime"} (symlinks also get "target",
 * the link's text as read during the walk of after), sorted by path, at most
 * max_report entries; *omitted gets the number of further changes not
 * listed. Paths are relative to the root and sanitised UTF-8. Files are
 * sniffed through after's root fd. */
json_t *fsdiff_compare(const fsdiff_snap *before, const fsdiff_snap *after, size_t max_report,
                       size_t *omitted);

/* new: array of {"path","size","mime","type"} for every entry of the snapshot
 * (directories excluded), at most max entries; symlinks also get "target". */
json_t *fsdiff_list(const fsdiff_snap *s, size_t max);

/* Guesses a mime type from the file name and, for regular files only, the
 * first 512 bytes of relpath opened beneath the directory fd rootfd with
 * wsfile_open_regular (never a symlink, never a non-regular file). borrowed
 * static string. */
const char *fsdiff_mime(int rootfd, const char *relpath, unsigned mode);

/* The same for the regular file already open as fd (read with pread at
 * offset 0). borrowed static string. */
const char *fsdiff_mime_fd(int fd, const char *relpath);

#endif
