/*
 * cm_path.h — paths built to their length (no PATH_MAX buffers): every
 * function returns a malloc'd string the caller frees, or NULL with errno
 * set (ENOMEM; EINVAL for a NULL argument).
 */
#ifndef CM_PATH_H
#define CM_PATH_H

/* "dir/name": one slash between them whatever dir ends with ("/" + "x" is
 * "/x"); an empty dir gives name alone. */
char *cm_path_join(const char *dir, const char *name);

/* A path (or any string) formatted like printf, e.g.
 * cm_path_fmt("%s/packages/%s", home, session). */
char *cm_path_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* 1 when path is base or below it, lexically ("/a/b" is under "/a" and
 * "/a/", not under "/ab"; everything is under "/"); 0 when either is NULL
 * or base is empty. Neither is resolved: pass real paths to compare
 * where they are. */
int cm_path_under(const char *path, const char *base);

/* path made absolute with its directory resolved (realpath) and its last
 * component kept as given, so that a symbolic link there stays one (what
 * it names is looked up when it is used, as it would have been). ENOENT
 * for a missing directory, EINVAL for a path ending in "/", "." or "..". */
char *cm_path_absolute(const char *path);

#endif
