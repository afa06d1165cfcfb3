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
 * Isolation: the installer (pip / npm) runs in its own sandbox (the sandbox
 * module) with the network off; the only way out is an HTTP CONNECT proxy
 * (pkgproxy.c) run by the manager outside the sandbox, which connects only
 * to the configured index's host:port. See pkginst_install() for what the
 * sandbox must provide.
 */
#ifndef KERNELMGR_PKGINSTALL_H
#define KERNELMGR_PKGINSTALL_H

#include <jansson.h>
#include <stddef.h>

#include "kernelmgr/allowlist.h"

/* Writes the per-session package directories (PATH_MAX each). 0 or -1. */
int pkginst_session_dirs(const char *home, const char *session, char *pydir, char *npmdir);

/* Removes the session's package directories (when the session is closed).
 * Never follows symlinks. 0, or -1 with errno. */
int pkginst_remove_session(const char *home, const char *session);

/* new: the extra environment ("NAME=value" strings, NULL-terminated array,
 * free with pkginst_env_free) and read-only paths a kernel of `lang`
 * ("python" / "bash") of the session needs to see its packages. The manager
 * passes them to the kernel it launches (kworker_spec env / ro_paths). */
char **pkginst_kernel_env(const char *home, const char *session, const char *lang);
void pkginst_env_free(char ***env);

/* new: installs `packages` (array of request strings, borrowed) with
 * manager m for the session. Every request is checked against the allowlist
 * first; one refusal refuses the whole request before anything runs.
 * Returns {"manager","installed":[{"name","version"}],"target","policy",
 * "log"} or NULL with a reason in err. */
json_t *pkginst_install(const allowlist *al, allowlist_mgr m, const char *home, const char *session,
                        const json_t *packages, char *err, size_t errlen);

#endif
