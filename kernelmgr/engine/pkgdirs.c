/*
 * pkgdirs.c — where a session's packages live in the home (pkgdirs.h).
 */
#include "kernelmgr/engine/pkgdirs.h"
#include "common/cm_path.h"
#include "kernelmgr/engine/kmfs.h"
#include "kernelmgr/engine/wsfile.h"
#include "kernels/server/kenv.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *pkgdirs_path(const char *home, const char *session, const char *sub)
{
    /* Session names never start with "." (the manager's rule), so "." and
     * ".." and the manager's own hidden names are refused here too. */
    if (!home || !session || !*session || strchr(session, '/') || session[0] == '.') {
        errno = EINVAL;
        return NULL;
    }
    return sub ? cm_path_fmt("%s/packages/%s/%s", home, session, sub)
               : cm_path_fmt("%s/packages/%s", home, session);
}

int pkgdirs_session_root(const char *home, const char *session, char *root)
{
    char *p = pkgdirs_path(home, session, NULL);
    int rc = p && strlen(p) < PATH_MAX ? 0 : -1;
    if (rc == 0)
        memcpy(root, p, strlen(p) + 1);
    free(p);
    return rc;
}

int pkgdirs_remove_session(const char *home, const char *session, km_err *err)
{
    char *root = pkgdirs_path(home, session, NULL);
    if (!root) {
        km_err_set(err, KM_EINTERNAL, "invalid session name '%.64s'", session ? session : "");
        return -1;
    }
    /* fd-based and never following a symlink, like every removal of a tree
     * sandboxed code could have written into (the installers write here) */
    int rc = wsfile_rmtree(root, err);
    free(root);
    return rc;
}

char **pkgdirs_kernel_env(const char *root, const char *kind, char *ro)
{
    if (!root || root[0] != '/')
        return NULL;
    if (!kind) {
        /* a language without packages: nothing to see */
        ro[0] = 0;
        return calloc(1, sizeof(char *));
    }
    int python = strcmp(kind, "pip") == 0;
    char *dir = cm_path_join(root, python ? "python" : "npm");
    /* Empty from the start: Python's path finder re-reads a directory whose
     * mtime changed, node resolves NODE_PATH on every require, and the
     * sandbox can only bind what exists. */
    if (!dir || strlen(dir) >= PATH_MAX || kmfs_mkdirs(dir, 0755) < 0) {
        free(dir);
        return NULL;
    }
    char **env = calloc(3, sizeof *env);
    if (!env) {
        free(dir);
        return NULL;
    }
    memcpy(ro, dir, strlen(dir) + 1);
    if (python) {
        if (asprintf(&env[0], "PYTHONPATH=%s", dir) < 0)
            env[0] = NULL;
    } else {
        const char *npm = dir;
        if (asprintf(&env[0], "NODE_PATH=%s/node_modules", npm) < 0)
            env[0] = NULL;
        /* the sandbox's fixed PATH (kenv.h), never the manager's */
        if (asprintf(&env[1], "PATH=%s/node_modules/.bin:%s", npm, KENV_SANDBOX_PATH) < 0)
            env[1] = NULL;
        if (!env[1]) {
            free(env[0]);
            env[0] = NULL;
        }
    }
    free(dir);
    if (!env[0])
        pkgdirs_env_free(&env);
    return env;
}

int pkgdirs_adopt(const char *from_root, const char *home, const char *session)
{
    char *root = from_root ? pkgdirs_path(home, session, NULL) : NULL;
    char *parent = root ? cm_path_join(home, "packages") : NULL;
    int rc = -1;
    if (!from_root)
        errno = EINVAL;
    /* An empty directory left by an earlier session of that name gives way;
     * one with packages in it does not (rename fails with ENOTEMPTY). */
    if (parent && kmfs_mkdirs(parent, 0755) == 0 && rename(from_root, root) == 0) {
        if (symlink(root, from_root) < 0) {
            /* Only unsandboxed kernels need it; sandboxed ones bound the inode. */
        }
        rc = 0;
    }
    int e = errno;
    free(parent);
    free(root);
    errno = e;
    return rc;
}

void pkgdirs_env_free(char ***env)
{
    if (!env || !*env)
        return;
    for (char **e = *env; *e; e++)
        free(*e);
    free(*env);
    *env = NULL;
}
