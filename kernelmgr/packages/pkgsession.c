/*
 * pkgsession.c — one session's package install (pkgsession.h).
 */
#include "kernelmgr/packages/pkgsession.h"
#include "kernelmgr/engine/pkgdirs.h"
#include "kernelmgr/packages/allowlist.h"
#include "kernelmgr/packages/pkginstall.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static json_t *fail(km_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static json_t *fail(km_err *err, int code, const char *fmt, ...)
{
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    km_err_set(err, code, "%s", msg);
    return NULL;
}

typedef struct {
    const allowlist *al;
    allowlist_mgr mgr;
    const json_t *packages;
} install_req;

/* km_locked_fn: the install itself, under the session's (or the name's) lock */
static json_t *install_locked(km_manager *m, const char *name, int live, void *arg, km_err *err)
{
    const install_req *q = arg;
    km_err why = {0};
    const char *home = km_manager_home(m);
    json_t *r = pkginst_install(q->al, q->mgr, home, name, q->packages, &why);
    char root[PATH_MAX];
    if (!r && !live && pkgdirs_session_root(home, name, root) == 0 && access(root, F_OK) != 0)
        /* a close of the name was finishing (it removes the package
         * directory after the session left the list): the install lost */
        return fail(err, KM_ENOSESSION,
                    "session \"%s\" was closed while the install ran; nothing was installed", name);
    if (!r)
        return fail(err, KM_EINTERNAL, "install failed, nothing was installed: %s", why.msg);
    return r;
}

json_t *pkgsession_install(km_manager *m, const char *name, const char *allowlist_path,
                           const char *manager, const json_t *packages, km_err *err)
{
    if (!km_name_valid(name))
        return fail(err, KM_EUSAGE, "invalid session name \"%s\"", name ? name : "");
    int mgr = allowlist_mgr_from_name(manager);
    if (mgr < 0)
        return fail(err, KM_EUSAGE, "manager must be \"pip\" or \"npm\" (got \"%s\")",
                    manager ? manager : "");
    size_t n = json_array_size(packages), i;
    if (!json_is_array(packages) || n == 0 || n > 50)
        return fail(err, KM_EUSAGE, "packages must be a list of 1 to 50 package names");
    json_t *p;
    json_array_foreach(packages, i, p)
    {
        if (!json_is_string(p))
            return fail(err, KM_EUSAGE, "packages must contain strings only");
    }
    char *path = NULL;
    const char *env = getenv("KERNELMGR_ALLOWLIST");
    if (allowlist_path && *allowlist_path)
        path = strdup(allowlist_path);
    else if (env && *env)
        path = strdup(env);
    else if (asprintf(&path, "%s/allowlist.json", km_manager_home(m)) < 0)
        path = NULL;
    if (!path)
        return fail(err, KM_EINTERNAL, "out of memory");
    km_err why = {0};
    /* read on every call: the operator may edit the list while agents run */
    allowlist *al = allowlist_load(path, 0, &why);
    free(path);
    if (!al)
        return fail(err, KM_EUSAGE,
                    "the package allowlist cannot be read, so nothing is installable: %s", why.msg);
    /* every request is checked before anything runs */
    char pname[ALLOWLIST_NAME_MAX + 1], spec[ALLOWLIST_SPEC_MAX + 1];
    json_array_foreach(packages, i, p)
    {
        if (allowlist_check(al, (allowlist_mgr)mgr, json_string_value(p), pname, spec, &why) < 0) {
            allowlist_destroy(&al);
            return fail(err, KM_EUSAGE, "install refused, nothing was installed: %s", why.msg);
        }
    }
    install_req q = {al, (allowlist_mgr)mgr, packages};
    json_t *r = km_with_session_or_name(m, name, install_locked, &q, err);
    allowlist_destroy(&al);
    if (r)
        json_object_set_new(r, "session", json_string(name));
    return r;
}
