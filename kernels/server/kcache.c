/*
 * kcache.c — see kcache.h.
 */
#include "kernels/server/kcache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Our own directory, created 0700 when missing; -1 when there is no safe
 * one (not ours, or open to others). */
static int cache_dir(char *out, size_t size)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    char base[PATH_MAX];
    if (xdg && xdg[0] == '/')
        snprintf(base, sizeof base, "%s", xdg);
    else if (home && home[0] == '/')
        snprintf(base, sizeof base, "%s/.cache", home);
    else
        return -1;
    if (mkdir(base, 0700) < 0 && errno != EEXIST)
        return -1;
    if ((size_t)snprintf(out, size, "%s/kernelmgr", base) >= size)
        return -1;
    if (mkdir(out, 0700) < 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (lstat(out, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
        return -1;
    return 0;
}

static int entry_path(const char *kind, const char *key, char *out, size_t size)
{
    char dir[PATH_MAX];
    if (!kind || !*kind || strspn(kind, "abcdefghijklmnopqrstuvwxyz") != strlen(kind) ||
        cache_dir(dir, sizeof dir) < 0)
        return -1;
    unsigned char h[16];
    char hex[33];
    crypto_generichash(h, sizeof h, (const unsigned char *)key, strlen(key), NULL, 0);
    sodium_bin2hex(hex, sizeof hex, h, sizeof h);
    return (size_t)snprintf(out, size, "%s/%s-%s", dir, kind, hex) < size ? 0 : -1;
}

int kcache_file_key(const char *path, char *key, size_t size)
{
    size_t used = strlen(key);
    char real[PATH_MAX];
    struct stat st;
    int n;
    if (realpath(path, real) && stat(real, &st) == 0)
        n = snprintf(key + used, size - used, "%s=%s %llu:%llu:%llu:%lld.%09ld;", path, real,
                     (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                     (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec,
                     st.st_mtim.tv_nsec);
    else
        n = snprintf(key + used, size - used, "%s=-;", path);
    if (n < 0 || (size_t)n >= size - used) {
        key[used] = '\0';
        return -1;
    }
    return 0;
}

char *kcache_get(const char *kind, const char *key)
{
    char path[PATH_MAX];
    if (entry_path(kind, key, path, sizeof path) < 0)
        return NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    size_t klen = strlen(key);
    char *buf = NULL;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 022) || (size_t)st.st_size <= klen ||
        (size_t)st.st_size > klen + 1 + KCACHE_MAX_VALUE)
        goto miss;
    buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        goto miss;
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r <= 0)
            goto miss;
        got += (size_t)r;
    }
    buf[got] = '\0';
    if (memcmp(buf, key, klen) != 0 || buf[klen] != '\n' || strlen(buf) != got)
        goto miss;
    close(fd);
    memmove(buf, buf + klen + 1, got - klen);
    return buf;
miss:
    free(buf);
    close(fd);
    return NULL;
}

void kcache_put(const char *kind, const char *key, const char *value)
{
    char path[PATH_MAX], tmp[PATH_MAX + 16];
    if (strlen(value) > KCACHE_MAX_VALUE || strchr(key, '\n') ||
        entry_path(kind, key, path, sizeof path) < 0)
        return;
    snprintf(tmp, sizeof tmp, "%s.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        close(fd);
        unlink(tmp);
        return;
    }
    int ok = fprintf(f, "%s\n%s", key, value) >= 0;
    if (fclose(f) != 0)
        ok = 0;
    if (!ok || rename(tmp, path) < 0)
        unlink(tmp);
}
