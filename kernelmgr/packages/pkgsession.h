/*
 * pkgsession.h — a package install for one session, as the daemon's
 * packages.install method asks for it: the request checked, the allowlist
 * read, every package checked against it, then pkginst_install() under the
 * session's lock (km_with_session_or_name, km.h).
 */
#ifndef KERNELMGR_PKGSESSION_H
#define KERNELMGR_PKGSESSION_H

#include <jansson.h>

#include "kernelmgr/engine/km.h"

/* Installs allowlisted packages (pkginstall.h) for session `name`: manager
 * "pip" | "npm", packages an array of 1..50 strings (borrowed).
 * allowlist_path NULL: $KERNELMGR_ALLOWLIST, else home/allowlist.json (read
 * on every call: the operator may edit it while agents run). A live
 * session's install holds its lock (close waits for it); a name without a
 * session gets the packages for when it is created. The pkginst_install
 * result plus "session", or NULL with err. */
json_t *pkgsession_install(km_manager *m, const char *name, const char *allowlist_path,
                           const char *manager, const json_t *packages, km_err *err);

#endif
