/*
 * fsdiff.h — what an execution changed in a workspace.
 *
 * A snapshot is a walk of the tree through directory fds (wsfile.h): the
 * root is opened once (O_DIRECTORY | O_NOFOLLOW), every directory below it
 * openat(O_DIRECTORY | O_NOFOLLOW) relative to its parent's fd, every entry
 * fstatat(AT_SYMLINK_NOFOLLOW) — symlinks are never followed and FIFOs,
 * sockets or devices never opened. A symlink's text is read during the walk
 * with readlinkat(parent fd, name) (at most WSFILE_LINK_MAX bytes) and
 * reported as plain text, never resolved. Comparing two snapshots gives
 * created / modified / deleted non-directory entries. Regular files are
 * "modified" when size, mtime (ns), inode or mode changed. The snapshot keeps
 * the root's fd, and MIME sniffing opens files only through it
 * (wsfile_open_regular).
 *
 * What a snapshot holds is bounded by what the host pays for it, not only by
 * counts: at most scan_max entries ("files_scan_max") and scan_bytes bytes
 * ("files_scan_bytes") counted as FSDIFF_ENTRY_COST — every entry's path,
 * its link text and FSDIFF_ENTRY_OVERHEAD; directories below
 * FSDIFF_DEPTH_MAX levels are not walked. A snapshot that did not walk
 * everything says so and why (fsdiff_incomplete_json): a limit stopped the
 * walk, or a directory was unreadable, too deep, or vanished during the walk.
 * The reasons kept are bounded too (FSDIFF_NOTES_MAX, each naming at most
 * FSDIFF_NOTE_PATH_MAX bytes of a path).
 */
#ifndef KERNELMGR_FSDIFF_H
#define KERNELMGR_FSDIFF_H

#include <jansson.h>
#include <stddef.h>

#define FSDIFF_DEPTH_MAX 64 /* directory levels walked below the root */
#define FSDIFF_ENTRY_OVERHEAD                                                                      \
    128 /* bytes an entry costs besides its text: its                                              \
           slot (doubling array) and allocator headers */
/* what an entry of path length path_len and link text length link_len
 * (0: not a link) is charged against scan_bytes */
#define FSDIFF_ENTRY_COST(path_len, link_len)                                                      \
    ((size_t)(path_len) + 1 + ((link_len) ? (size_t)(link_len) + 1 : 0) + FSDIFF_ENTRY_OVERHEAD)
/* what an entry of a report (fsdiff_compare, fsdiff_list) is charged: its
 * text as sent (sanitised, JSON-escaped) and its JSON object — measured at
 * ~900 bytes of jansson allocations, whatever the path's length */
#define FSDIFF_REPORT_OVERHEAD 1024
#define FSDIFF_REPORT_COST(text_len, link_len)                                                     \
    ((size_t)(text_len) + 1 + ((link_len) ? (size_t)(link_len) + 1 : 0) + FSDIFF_REPORT_OVERHEAD)
#define FSDIFF_NOTES_MAX 8       /* reasons kept for what was not walked */
#define FSDIFF_NOTE_PATH_MAX 256 /* bytes of a path a reason names */

typedef struct fsdiff_snap fsdiff_snap;

/* new: walks root (absolute, trusted host path; not a symlink itself)
 * holding at most scan_max entries and scan_bytes bytes (both >= 1; 0 is
 * taken as 1). Never NULL unless out of memory; an unreadable root gives an
 * empty, incomplete snapshot. Holds an fd of root until fsdiff_destroy. */
fsdiff_snap *fsdiff_take(const char *root, size_t scan_max, size_t scan_bytes);
void fsdiff_destroy(fsdiff_snap **s);

/* 1 when something below the root was not walked (a limit, an unreadable,
 * too deep or vanished directory). */
int fsdiff_incomplete(const fsdiff_snap *s);

/* The bytes the snapshot's entries are charged (FSDIFF_ENTRY_COST summed);
 * never more than its scan_bytes. */
size_t fsdiff_bytes(const fsdiff_snap *s);

/* new: NULL when a and b (b may be NULL) walked everything; else why not:
 * {"scan_limit"?: "files_scan_bytes: 16 MiB of paths and link text per
 * walk" | "files_scan_max: 50000 entries per walk", "not_walked"?:
 * ["unreadable directory: a/b", "too deep: ... (more than 64 levels)",
 * "vanished directory: ... (changed during the walk)", ...],
 * "not_walked_omitted"?: further reasons not listed, "reason": all of it in
 * one line}. a's reasons come first; one also in b is named once. */
json_t *fsdiff_incomplete_json(const fsdiff_snap *a, const fsdiff_snap *b);

/* new: the same for a walk that could not be taken at all (fsdiff_take
 * returned NULL: out of memory). */
json_t *fsdiff_untaken_json(void);

/* new: array of {"path","change","size","mime"} (symlinks also get "target",
 * the link's text as read during the walk of after), sorted by path, at most
 * max_report entries costing at most after's scan_bytes (FSDIFF_REPORT_COST
 * each); *omitted gets the number of further changes not listed. An
 * incomplete after reports no deletion. Paths are relative to the root and
 * sanitised UTF-8. Files are sniffed through after's root fd. */
json_t *fsdiff_compare(const fsdiff_snap *before, const fsdiff_snap *after, size_t max_report,
                       size_t *omitted);

/* new: array of {"path","size","mime","type"} for every entry of the snapshot
 * (directories excluded), at most max entries costing at most the
 * snapshot's scan_bytes (FSDIFF_REPORT_COST each); symlinks also get
 * "target". *omitted (may be NULL) gets the number of entries left out. */
json_t *fsdiff_list(const fsdiff_snap *s, size_t max, size_t *omitted);

/* Guesses a mime type from the file name and, for regular files only, the
 * first 512 bytes of relpath opened beneath the directory fd rootfd with
 * wsfile_open_regular (never a symlink, never a non-regular file). borrowed
 * static string. */
const char *fsdiff_mime(int rootfd, const char *relpath, unsigned mode);

/* The same for the regular file already open as fd (read with pread at
 * offset 0). borrowed static string. */
const char *fsdiff_mime_fd(int fd, const char *relpath);

#endif
