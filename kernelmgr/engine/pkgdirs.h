/*
 * pkgdirs.h — the layout of a session's package directories in the home,
 * which the engine needs to start kernels (their environment and read-only
 * binds), to close sessions and to adopt a warm-pool entry, and which the
 * package installer (kernelmgr/packages/) fills:
 *   home/packages/SESSION/python   pip target, on the Python kernel's PYTHONPATH
 *   home/packages/SESSION/npm      npm prefix, node_modules/.bin on Bash's PATH
 */
#ifndef KERNELMGR_PKGDIRS_H
#define KERNELMGR_PKGDIRS_H

#include "kernelmgr/engine/kmerr.h"

#include <stddef.h>

/* home/packages/SESSION, followed by "/" sub when sub is not NULL (malloc'd,
 * the caller frees); NULL for a bad session name (errno EINVAL) or no
 * memory. */
char *pkgdirs_path(const char *home, const char *session, const char *sub);

/* Writes the session's package root, home/packages/SESSION (PATH_MAX), which
 * holds python/ and npm/. 0, or -1 for a bad session name. */
int pkgdirs_session_root(const char *home, const char *session, char *root);

/* Removes the session's package root home/packages/SESSION (when the
 * session is closed) with wsfile_rmtree(): fd-based, never follows a
 * symlink. 0 (also when it does not exist), or -1 with a reason in err. */
int pkgdirs_remove_session(const char *home, const char *session, km_err *err);

/* new: the extra environment ("NAME=value" strings, NULL-terminated array,
 * free with pkgdirs_env_free) a kernel whose language has package kind
 * `kind` ("pip" / "npm" / NULL: none; lang.h) needs to see the packages
 * under root (a package root as pkgdirs_session_root() gives), and in ro
 * (PATH_MAX) the directory to bind read-only into its sandbox ("" for none).
 * The manager passes them as the kernel's --env / --ro-path.
 *   pip (python): PYTHONPATH=root/python;                ro = root/python
 *   npm (bash):   NODE_PATH=root/npm/node_modules,
 *                 PATH=root/npm/node_modules/.bin:$PATH; ro = root/npm
 *   NULL:         no variable;                           ro = ""
 * The directories are created (empty) here, so a kernel started before an
 * install sees the packages as soon as they land. NULL on a bad root or no
 * memory. */
char **pkgdirs_kernel_env(const char *root, const char *lang, char *ro);
void pkgdirs_env_free(char ***env);

/* A warm-pool entry's kernels were started before its session had a name,
 * with their packages under from_root: moves that directory to the
 * session's package root, so the running kernels (whose sandboxes bound the
 * directory itself) see what is installed for the session from now on, and
 * leaves a symlink at from_root for unsandboxed kernels, whose variables
 * name the old path. 0, or -1 with errno (ENOTEMPTY / EEXIST: the session
 * already has packages; the caller then must not use the pool entry). */
int pkgdirs_adopt(const char *from_root, const char *home, const char *session);

#endif
