/*
 * kmhome.c — the home is trusted state (kmhome.h).
 */
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/engine/kmfs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const kmhome_subdirs[] = {"sessions", "outputs", "run", "packages", "pool", NULL};

int kmhome_stat_ok(const struct stat *st, uid_t euid, const char **why)
{
    if (!S_ISDIR(st->st_mode))
        *why = S_ISLNK(st->st_mode) ? "is a symbolic link" : "is not a directory";
    else if (st->st_uid != euid)
        *why = "is owned by another user";
    else if (st->st_mode & (S_IWGRP | S_IWOTH))
        *why = "is writable by group or others";
    else
        return 0;
    return -1;
}

void kmhome_refusal(const char *path, const struct stat *st, const char *why, km_err *err)
{
    unsigned euid = (unsigned)geteuid();
    /* a shared directory (sticky and writable by others, like /tmp) is never
     * to be chowned or chmodded: only a directory of one's own below it */
    int shared = S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX) && (st->st_mode & S_IWOTH);
    char fix[160];
    if (shared)
        snprintf(fix, sizeof fix,
                 "it is a shared directory: use a directory of your own in it "
                 "(KERNELMGR_HOME)");
    else
        snprintf(fix, sizeof fix,
                 "use a home of your own (KERNELMGR_HOME) or fix it (chown %u, chmod go-w) if "
                 "it and everything in it are yours",
                 euid);
    km_err_set(err, KM_EUSAGE,
               "the kernelmgr home is trusted state, and %s %s (owner uid %u, mode %04o): it must "
               "be a directory owned by uid %u and not writable by group or others; %s",
               path, why, (unsigned)st->st_uid, (unsigned)(st->st_mode & 07777), euid, fix);
}

int kmhome_check_dir(const char *path, int follow, km_err *err)
{
    struct stat st;
    if ((follow ? stat(path, &st) : lstat(path, &st)) != 0) {
        if (errno == ENOENT)
            return 1;
        km_err_set(err, KM_EUSAGE, "the kernelmgr home: %s: %s", path, strerror(errno));
        return -1;
    }
    const char *why;
    if (kmhome_stat_ok(&st, geteuid(), &why)) {
        kmhome_refusal(path, &st, why, err);
        return -1;
    }
    return 0;
}

int kmhome_mkdir(const char *path, mode_t mode, km_err *err)
{
    if (mkdir(path, mode) != 0 && errno != EEXIST) {
        km_err_set(err, KM_EUSAGE, "cannot create %s: %s", path, strerror(errno));
        return -1;
    }
    int rc = kmhome_check_dir(path, 0, err);
    if (rc > 0) /* removed between the mkdir and the check */
        km_err_set(err, KM_EUSAGE, "cannot create %s: it vanished after it was made", path);
    return rc ? -1 : 0;
}

int kmhome_prepare(const char *home, int create, km_err *err)
{
    if (create && kmfs_mkdirs(home, 0700)) {
        km_err_set(err, KM_EUSAGE, "cannot create the kernelmgr home %s: %s", home,
                   strerror(errno));
        return -1;
    }
    int rc = kmhome_check_dir(home, 1, err);
    if (rc)
        return rc < 0 ? -1 : 0; /* absent: made, and checked, by whoever uses it */
    for (int i = 0; kmhome_subdirs[i]; i++) {
        char p[4096];
        if (snprintf(p, sizeof p, "%s/%s", home, kmhome_subdirs[i]) >= (int)sizeof p) {
            km_err_set(err, KM_EUSAGE, "the kernelmgr home %.200s...: path too long", home);
            return -1;
        }
        rc = create && i < KMHOME_MADE_AT_START ? kmhome_mkdir(p, 0700, err)
                                                : kmhome_check_dir(p, 0, err);
        if (rc < 0)
            return -1;
    }
    return 0;
}

int kmhome_below(const char *home, const char *path)
{
    size_t hl = strlen(home);
    while (hl > 1 && home[hl - 1] == '/')
        hl--;
    if (home[0] != '/' || strncmp(path, home, hl) || path[hl] != '/')
        return 0;
    int named = 0; /* a component other than "." below the home */
    for (const char *c = path + hl; *c;) {
        c += strspn(c, "/");
        size_t n = strcspn(c, "/");
        if (n == 2 && c[0] == '.' && c[1] == '.')
            return 0;
        if (n && !(n == 1 && c[0] == '.'))
            named = 1;
        c += n;
    }
    return named;
}
