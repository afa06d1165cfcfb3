/*
 * wsfile.h — file access confined to a session's workspace.
 *
 * The MCP file tools (read_file, write_file, list_files) take paths from a
 * model, and the workspace is writable by sandboxed code that may have
 * planted symlinks. So every path is resolved beneath the workspace root by
 * the kernel itself: openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS), falling back on kernels without openat2 to a walk
 * of one component at a time with O_NOFOLLOW. A symlink anywhere on the path
 * (even one pointing inside the workspace), "..", an absolute path or a
 * special file is refused with a reason the model can read.
 */
#ifndef KERNELMGR_WSFILE_H
#define KERNELMGR_WSFILE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WSFILE_READ_MAX ((size_t)1 << 20) /* bytes returned by one read */
#define WSFILE_PATH_MAX 1024

/* Lexical check of a workspace-relative path: not empty, not absolute, no
 * "..", no NUL, no empty component after normalising "./" and "//", at most
 * WSFILE_PATH_MAX bytes. Writes the normalised path to out (size >=
 * WSFILE_PATH_MAX + 1). "." or "" give "." only when allow_root. 0 or -1. */
int wsfile_normalize(const char *rel, int allow_root, char *out, char *err, size_t errlen);

/* An fd for rel beneath the directory fd rootfd, opened with flags (O_CREAT
 * allowed, with mode). Returns the fd or -1 with a reason. */
int wsfile_openat(int rootfd, const char *rel, int flags, mode_t mode, char *err, size_t errlen);

/* new: reads up to length bytes (0: WSFILE_READ_MAX; capped there) from
 * offset of the regular file rel under root. encoding: "auto" (text when the
 * bytes are UTF-8 without NUL, else base64), "text" (invalid bytes become
 * U+FFFD) or "base64". Returns {"path","size","offset","length","encoding",
 * "content","eof","mime"} or NULL with a reason. */
json_t *wsfile_read(const char *root, const char *rel, uint64_t offset, uint64_t length,
                    const char *encoding, char *err, size_t errlen);

/* new: writes data[0..len) to rel under root (created 0644, or truncated;
 * appended when append), creating missing parent directories (0755) when
 * mkdirs. Never follows a symlink and never writes to a non-regular file.
 * Returns {"path","size","created"} or NULL with a reason. */
json_t *wsfile_write(const char *root, const char *rel, const void *data, size_t len, int append,
                     int mkdirs, char *err, size_t errlen);

#endif
