/*
 * cm_install.c — where kernelmgr's own files are (cm_install.h).
 */
#include "common/cm_install.h"
#include "common/cm_path.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Set by the Makefile from BINDIR, LIBEXECDIR and DATADIR; these defaults are
 * its defaults' (PREFIX/bin, PREFIX/libexec, PREFIX/share). */
#ifndef CM_REL_BIN_LIBEXEC
#define CM_REL_BIN_LIBEXEC "../libexec/kernelmgr"
#endif
#ifndef CM_REL_LIBEXEC_DATA
#define CM_REL_LIBEXEC_DATA "../../share/kernelmgr"
#endif
#ifndef CM_REL_BIN_DATA
#define CM_REL_BIN_DATA "../share/kernelmgr"
#endif

char *cm_install_exe_dir(void)
{
    for (size_t size = 256; size <= ((size_t)1 << 20); size *= 2) {
        char *buf = malloc(size);
        if (!buf)
            return NULL;
        ssize_t n = readlink("/proc/self/exe", buf, size);
        if (n > 0 && (size_t)n < size) {
            buf[n] = '\0';
            char *slash = strrchr(buf, '/');
            if (slash) {
                *(slash == buf ? slash + 1 : slash) = '\0';
                return buf;
            }
        }
        int e = n <= 0 ? errno : ENOENT;
        free(buf);
        if (n <= 0 || (size_t)n < size) {
            errno = e;
            return NULL;
        }
    }
    errno = ENAMETOOLONG;
    return NULL;
}

int cm_install_is_dir(const char *dir)
{
    struct stat st;
    return dir && stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

char *cm_install_helper_dir(void)
{
    char *exe = cm_install_exe_dir();
    if (!exe)
        return NULL;
    char *lib = cm_path_join(exe, CM_REL_BIN_LIBEXEC);
    if (!lib) {
        free(exe);
        return NULL;
    }
    char *real = cm_install_is_dir(lib) ? realpath(lib, NULL) : NULL;
    free(lib);
    if (real) {
        free(exe);
        return real;
    }
    return exe;
}

char *cm_install_share_dir(void)
{
    const char *env = getenv("KERNELMGR_SHARE");
    if (env && *env)
        return strdup(env);
    char *exe = cm_install_exe_dir();
    if (!exe)
        return NULL;
    static const char *const rel[] = {"share/kernelmgr", CM_REL_LIBEXEC_DATA, CM_REL_BIN_DATA};
    char *first = NULL;
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char *p = cm_path_join(exe, rel[i]);
        if (!p)
            break;
        char *real = cm_install_is_dir(p) ? realpath(p, NULL) : NULL;
        if (real) {
            free(p);
            free(first);
            free(exe);
            return real;
        }
        if (!first)
            first = p;
        else
            free(p);
    }
    free(exe);
    if (!first)
        errno = ENOMEM;
    return first;
}
