/*
 * kmhome.h — the manager's home is trusted state. Whatever is in it
 * (config.json names the interpreter to probe, session.json names the
 * workspace close removes) is believed, so every directory of it the
 * manager uses must be the effective user's own and writable by nobody
 * else: the one check for all of them is here. A directory that fails it is
 * refused with a reason naming the path, its owner and mode and what to do;
 * a directory that is created is checked after the mkdir, so a directory
 * someone else made first (a squatted /tmp/km) is refused, never adopted.
 * Files in a checked directory are read with cm_read_regular(CM_RR_OWNED).
 */
#ifndef KERNELMGR_KMHOME_H
#define KERNELMGR_KMHOME_H

#include "kernelmgr/engine/kmerr.h"

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* The directories directly under the home that the manager uses, NULL-ended;
 * the first KMHOME_MADE_AT_START of them are made when the manager starts
 * (the others when first needed, each with kmhome_mkdir). */
extern const char *const kmhome_subdirs[];
#define KMHOME_MADE_AT_START 2

/* Pure: 0 when st (of a directory) is fit to hold trusted state for euid —
 * a directory, owned by euid, not writable by group or others — else -1
 * with *why a static phrase ("is not a directory", "is owned by another
 * user", "is writable by group or others"). */
int kmhome_stat_ok(const struct stat *st, uid_t euid, const char **why);

/* The reason for path failing kmhome_stat_ok (why from it), written to err:
 * names the path, its owner and mode, and what to do. */
void kmhome_refusal(const char *path, const struct stat *st, const char *why, km_err *err);

/* Checks the existing directory path (lstat: a symbolic link is refused;
 * follow: stat, for the home itself, which may be reached through a link).
 * 1 when path does not exist, 0 when it passes, -1 with the reason in err. */
int kmhome_check_dir(const char *path, int follow, km_err *err);

/* mkdir(path, mode) unless it exists, then kmhome_check_dir (lstat). 0, or
 * -1 with the reason in err. */
int kmhome_mkdir(const char *path, mode_t mode, km_err *err);

/* The check at a process's start: the home (when create, made with its
 * missing parents first, mode 0700) and those of kmhome_subdirs that exist
 * (when create, the first KMHOME_MADE_AT_START are made). One stat per directory. 0 (also when
 * the home does not exist and create is 0), or -1 with the reason in err. */
int kmhome_prepare(const char *home, int create, km_err *err);

/* Pure: 1 when the text of path places it strictly below home: home (its
 * trailing slashes aside) followed by "/", at least one component other
 * than "." and no ".." component. */
int kmhome_below(const char *home, const char *path);

#endif
