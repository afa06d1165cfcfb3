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

#endif
