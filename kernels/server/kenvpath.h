/*
 * kenvpath.h — search-path variables without relative entries.
 *
 * An empty entry of PATH or LD_LIBRARY_PATH means "the current directory" to
 * execvp(3) and to the dynamic loader, and so does "." or any relative entry.
 * A host process must never search a directory it does not name absolutely
 * (its cwd may be, or may once have been, a workspace that sandboxed code can
 * write): these helpers drop every entry that does not start with '/'.
 */
#ifndef KERNELS_SERVER_KENVPATH_H
#define KERNELS_SERVER_KENVPATH_H

/* new (free()): list ('sep'-separated, e.g. PATH) with every empty, "." or
 * relative entry removed, order kept; "" when none is left. NULL on OOM or
 * when list is NULL. */
char *kenvpath_clean(const char *list, char sep);

/* new (kenvpath_free_environ()): a copy of env (a NULL-terminated
 * "NAME=VALUE" array, e.g. environ) in which PATH and LD_LIBRARY_PATH are
 * cleaned by kenvpath_clean(), and dropped when nothing is left, and
 * LD_PRELOAD/LD_AUDIT lose relative entries the same way. NULL on OOM. */
char **kenvpath_clean_environ(char *const *env);

/* Frees what kenvpath_clean_environ() returned. NULL-safe. */
void kenvpath_free_environ(char **env);

#endif
