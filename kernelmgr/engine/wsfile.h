/*
 * wsfile.h — the one way the host touches a session's workspace.
 *
 * The workspace is writable by sandboxed code, which may plant symlinks,
 * FIFOs, hard-to-delete trees, and swap a directory for a symlink at any
 * moment (renameat2(RENAME_EXCHANGE) in a loop). So nothing on the host
 * resolves a workspace path by name through the VFS: the workspace root is
 * opened once (O_DIRECTORY | O_NOFOLLOW, after the trusted host path), and
 * every other access is relative to that fd, resolved by the kernel itself
 * with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
 * — or, on kernels without openat2 (ENOSYS, or EPERM from a container's
 * seccomp filter), by a walk of one component at a time with
 * O_PATH | O_NOFOLLOW. A symlink anywhere on the path (even one pointing
 * inside the workspace), "..", an absolute path or a magic link is refused
 * with a reason a person or a model can read. Files are fstat()ed on the
 * opened fd; a non-regular file is never opened for reading (it is opened
 * O_PATH first, and only a regular file is reopened to read).
 *
 * Users: the MCP file tools (read_file, write_file, list_files), fsdiff
 * (`kernelmgr files`, the per-execution change report, MIME sniffing,
 * symlink targets), session close and pruning (wsfile_rmtree), and the npm
 * prefix files a package install reads back (wsfile_slurp/wsfile_replace).
 */
#ifndef KERNELMGR_WSFILE_H
#define KERNELMGR_WSFILE_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#define WSFILE_READ_MAX ((size_t)1 << 20) /* bytes returned by one read */
#define WSFILE_PATH_MAX 1024
#define WSFILE_LINK_MAX 4096      /* bytes of a symlink's text reported */
#define WSFILE_RMTREE_DEPTH 64    /* directory fds held at once by wsfile_rmtree */
#define WSFILE_RMTREE_PASSES 1024 /* ... and passes over deeper trees (hoisted) */

/* Lexical check of a workspace-relative path: not empty, not absolute, no
 * "..", no NUL, no empty component after normalising "./" and "//", at most
 * WSFILE_PATH_MAX bytes. Writes the normalised path to out (size >=
 * WSFILE_PATH_MAX + 1). "." or "" give "." only when allow_root. 0 or -1. */
int wsfile_normalize(const char *rel, int allow_root, char *out, km_err *err);

/* The workspace root root (absolute, trusted host path; its last component
 * must not be a symlink) as a directory fd opened O_RDONLY | O_DIRECTORY |
 * O_NOFOLLOW | O_CLOEXEC; the caller closes it. -1 with a reason. */
int wsfile_root_open(const char *root, km_err *err);

/* An fd for rel beneath the directory fd rootfd, opened with flags (O_CREAT
 * allowed, with mode), confined as described above. The caller closes it.
 * Returns the fd or -1 with errno and a reason (err may be NULL). */
int wsfile_openat(int rootfd, const char *rel, int flags, mode_t mode, km_err *err);

/* The fallback wsfile_openat uses without openat2: one component at a time,
 * O_PATH | O_NOFOLLOW | O_DIRECTORY for every directory, flags | O_NOFOLLOW
 * for the last; refuses "..", absolute paths and empty paths. Exposed so
 * both ways are tested. The fd or -1 with errno. */
int wsfile_openat_walk(int rootfd, const char *rel, int flags, mode_t mode);

/* Opens the regular file rel beneath rootfd for reading: first O_PATH (so a
 * FIFO, socket or device is never opened), fstat, then reopened read-only
 * (O_NONBLOCK | O_NOCTTY) only when regular, and checked to be the same
 * inode. *st gets its fstat. The fd (caller closes) or -1 with errno (EISDIR
 * for a directory, EINVAL for another non-regular file) and a reason. */
int wsfile_open_regular(int rootfd, const char *rel, struct stat *st, km_err *err);

/* Reads the whole regular file rel beneath rootfd (wsfile_open_regular)
 * into *data (new, NUL-terminated, *len bytes), refusing a file larger than
 * max bytes. 0, or -1 with errno (ENOENT: absent, EFBIG: too large, EINVAL:
 * not a regular file) and a reason. */
int wsfile_slurp(int rootfd, const char *rel, size_t max, char **data, size_t *len, km_err *err);

/* Replaces the content of the regular file rel beneath rootfd with
 * data[0..len) (created with mode when missing; truncated only once fstat
 * says it is a regular file). 0, or -1 with errno and a reason. */
int wsfile_replace(int rootfd, const char *rel, const void *data, size_t len, mode_t mode,
                   km_err *err);

/* The text of the symlink name in the directory fd dirfd (an entry found by
 * an fd-based walk; readlinkat never follows it), at most WSFILE_LINK_MAX
 * bytes, as stored — never resolved. new string, or NULL with errno. */
char *wsfile_readlinkat(int dirfd, const char *name);

/* Removes path (a file, or a directory and everything in it), fd-based: the
 * parent of path is the trusted host part; below it every level is opened
 * openat(O_DIRECTORY | O_NOFOLLOW) relative to its parent's fd and entries
 * go with unlinkat, so a symlink is removed, never followed, and a
 * directory swapped for a symlink mid-way cannot redirect it. It never
 * enters another filesystem (st_dev differs: a mount point is left alone
 * and reported), makes the owner's read-only directories removable, and
 * holds at most WSFILE_RMTREE_DEPTH directory fds (deeper subtrees are
 * moved up and removed in later passes, at most WSFILE_RMTREE_PASSES).
 * Returns 0 (also when path does not exist) or -1 with the number of
 * failures and the first one in err; with err NULL they go to stderr. */
int wsfile_rmtree(const char *path, km_err *err);

/* The encodings a file's content travels in (files.read, files.write and
 * the MCP tools), declared once in wsfile.c's table: "auto" (read only:
 * text when the bytes are UTF-8 without NUL, else base64), "text" and
 * "base64". The JSON lists are for the MCP schemas' "enum"; a unit test
 * checks them against the table. */
typedef enum { WSFILE_ENC_AUTO, WSFILE_ENC_TEXT, WSFILE_ENC_BASE64 } wsfile_enc;
#define WSFILE_ENC_READ 1  /* an encoding a read may ask for */
#define WSFILE_ENC_WRITE 2 /* ... a write may send */
#define WSFILE_ENC_READ_JSON "[\"auto\",\"text\",\"base64\"]"
#define WSFILE_ENC_WRITE_JSON "[\"text\",\"base64\"]"

/* The encoding named name for dir (WSFILE_ENC_READ or WSFILE_ENC_WRITE), or
 * -1 with err (KM_EUSAGE): "must be \"auto\", \"text\" or \"base64\" (got
 * \"NAME\")", naming those dir takes; the caller says which field. */
int wsfile_encoding(const char *name, int dir, km_err *err);
/* The JSON list of the encodings dir takes (new), as the table says. */
json_t *wsfile_encodings_json(int dir);

/* new: reads up to length bytes (0: WSFILE_READ_MAX; capped there) from
 * offset of the regular file rel under root. encoding (NULL: "auto"; see
 * wsfile_encoding): "auto", "text" (invalid bytes become U+FFFD) or
 * "base64". Returns {"path","size","offset","length","encoding",
 * "content","eof","mime"} or NULL with a reason. */
json_t *wsfile_read(const char *root, const char *rel, uint64_t offset, uint64_t length,
                    const char *encoding, km_err *err);

/* new: writes data[0..len) to rel under root (created 0644, or truncated;
 * appended when append), creating missing parent directories (0755) when
 * mkdirs. Never follows a symlink and never writes to a non-regular file.
 * Returns {"path","size","created"} or NULL with a reason. */
json_t *wsfile_write(const char *root, const char *rel, const void *data, size_t len, int append,
                     int mkdirs, km_err *err);

/* new: removes rel under root: a regular file, a symlink (the link, never
 * what it points to), another non-directory entry, or an empty directory
 * (a directory with entries is refused: "not empty"). The parent is
 * resolved confined as wsfile_openat; the entry is unlinked relative to
 * it. Returns {"path","type"} (type "file", "symlink", "dir", "other") or
 * NULL with a reason. */
json_t *wsfile_remove(const char *root, const char *rel, km_err *err);

#endif
