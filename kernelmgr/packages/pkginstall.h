/*
 * pkginstall.h — install allowlisted packages for one session.
 *
 * Where packages go (pkgdirs.h: per session, outside the workspace, so sandboxed code
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

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>

#include "kernelmgr/packages/allowlist.h"

/* new: installs `packages` (array of request strings, borrowed) with
 * manager m for the session. Every request is checked against the allowlist
 * first; one refusal refuses the whole request before anything runs.
 * Returns {"manager","installed":[{"name","version"}],"target","policy",
 * "log"} or NULL with a reason in err. */
json_t *pkginst_install(const allowlist *al, allowlist_mgr m, const char *home, const char *session,
                        const json_t *packages, km_err *err);

#endif
