/*
 * pkginstall.h — install allowlisted packages for one session.
 *
 * Where packages go (per session, outside the workspace, so sandboxed code
 * cannot change them; the kernels get them bound read-only):
 *   pip: $KERNELMGR_HOME/packages/SESSION/python   — on the Python kernel's
 *        PYTHONPATH (wheels only: `--only-binary :all:`, no setup.py runs);
 *   npm: $KERNELMGR_HOME/packages/SESSION/npm      — `--ignore-scripts`;
 *        node_modules/.bin on the Bash kernel's PATH, node_modules on
 *        NODE_PATH.
 *
 * Dependency policy (explicit, and the same for both managers): the
 * dependencies of a requested package are resolved first, without installing
 * anything; the install goes ahead only when every package of the resolved
 * set is on the allowlist (within its specifier). Otherwise the request is
 * refused and names the packages that are not listed, so the operator can
 * decide. Nothing outside the list is ever installed.
 *
 * Isolation: the installer (pip / npm) runs in its own strict sandbox with
 * the network off; the only way out is a loopback listener of that sandbox
 * (sandbox_config.loopback_listen_port) served by an HTTP CONNECT/forward
 * proxy (egproxy.c) outside it, which connects only to the configured
 * index's host:port and the allowlist's allowed_hosts.
 */
#ifndef KERNELMGR_PKGINSTALL_H
#define KERNELMGR_PKGINSTALL_H

#include <jansson.h>
#include <stddef.h>

#include "kernelmgr/packages/allowlist.h"

/* Writes the session's package root, home/packages/SESSION (PATH_MAX), which
 * holds python/ and npm/. 0, or -1 for a bad session name. */
int pkginst_session_root(const char *home, const char *session, char *root);

/* Removes the session's package root home/packages/SESSION (when the
 * session is closed) with wsfile_rmtree(): fd-based, never follows a
 * symlink. 0 (also when it does not exist), or -1 with a reason in err. */
int pkginst_remove_session(const char *home, const char *session, char *err, size_t errlen);

/* new: the extra environment ("NAME=value" strings, NULL-terminated array,
 * free with pkginst_env_free) a kernel whose language has package kind
 * `kind` ("pip" / "npm" / NULL: none; lang.h) needs to see the packages
 * under root (a package root as pkginst_session_root() gives), and in ro
 * (PATH_MAX) the directory to bind read-only into its sandbox ("" for none).
 * The manager passes them as the kernel's --env / --ro-path.
 *   pip (python): PYTHONPATH=root/python;                ro = root/python
 *   npm (bash):   NODE_PATH=root/npm/node_modules,
 *                 PATH=root/npm/node_modules/.bin:$PATH; ro = root/npm
 *   NULL:         no variable;                           ro = ""
 * The directories are created (empty) here, so a kernel started before an
 * install sees the packages as soon as they land. NULL on a bad root or no
 * memory. */
char **pkginst_kernel_env(const char *root, const char *lang, char *ro);
void pkginst_env_free(char ***env);

/* A warm-pool entry's kernels were started before its session had a name,
 * with their packages under from_root: moves that directory to the
 * session's package root, so the running kernels (whose sandboxes bound the
 * directory itself) see what is installed for the session from now on, and
 * leaves a symlink at from_root for unsandboxed kernels, whose variables
 * name the old path. 0, or -1 with errno (ENOTEMPTY / EEXIST: the session
 * already has packages; the caller then must not use the pool entry). */
int pkginst_adopt(const char *from_root, const char *home, const char *session);

/* new: installs `packages` (array of request strings, borrowed) with
 * manager m for the session. Every request is checked against the allowlist
 * first; one refusal refuses the whole request before anything runs.
 * Returns {"manager","installed":[{"name","version"}],"target","policy",
 * "log"} or NULL with a reason in err. */
json_t *pkginst_install(const allowlist *al, allowlist_mgr m, const char *home, const char *session,
                        const json_t *packages, char *err, size_t errlen);

#endif
