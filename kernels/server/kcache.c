/*
 * kcache.c — see kcache.h.
 */
#include "kernels/server/kcache.h"
#include "common/cm_io.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A directory fd of our own cache directory, created 0700 when missing; -1
 * when there is no safe one: a symlink, not a directory, not owned by us, or
 * open to others (the cache is then simply not used). */
static int cache_dir_fd(void)
{
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    char *base = NULL;
    if (xdg && xdg[0] == '/')
        base = strdup(xdg);
    else if (home && home[0] == '/' && asprintf(&base, "%s/.cache", home) < 0)
        base = NULL;
    if (!base)
        return -1;
    if (mkdir(base, 0700) < 0 && errno != EEXIST) {
        free(base);
        return -1;
    }
    int bfd = open(base, O_PATH | O_DIRECTORY | O_CLOEXEC);
    free(base);
    if (bfd < 0)
        return -1;
    if (mkdirat(bfd, "kernelmgr", 0700) < 0 && errno != EEXIST) {
        close(bfd);
        return -1;
    }
    int fd = openat(bfd, "kernelmgr", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(bfd);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 077)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The entry's file name in the cache directory: KIND-HASH(key). */
static int entry_name(const char *kind, const char *key, char *out, size_t size)
{
    if (!kind || !*kind || strlen(kind) > 32 ||
        strspn(kind, "abcdefghijklmnopqrstuvwxyz") != strlen(kind))
        return -1;
    unsigned char h[16];
    char hex[33];
    crypto_generichash(h, sizeof h, (const unsigned char *)key, strlen(key), NULL, 0);
    sodium_bin2hex(hex, sizeof hex, h, sizeof h);
    return (size_t)snprintf(out, size, "%s-%s", kind, hex) < size ? 0 : -1;
}

int kcache_file_key(const char *path, char *key, size_t size)
{
    size_t used = strlen(key);
    char *real = realpath(path, NULL);
    struct stat st;
    int n;
    if (real && stat(real, &st) == 0)
        n = snprintf(key + used, size - used, "%s=%s %llu:%llu:%llu:%lld.%09ld;", path, real,
                     (unsigned long long)st.st_dev, (unsigned long long)st.st_ino,
                     (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec,
                     st.st_mtim.tv_nsec);
    else
        n = snprintf(key + used, size - used, "%s=-;", path);
    free(real);
    if (n < 0 || (size_t)n >= size - used) {
        key[used] = '\0';
        return -1;
    }
    return 0;
}

char *kcache_get(const char *kind, const char *key)
{
    char name[80];
    if (entry_name(kind, key, name, sizeof name) < 0)
        return NULL;
    int dfd = cache_dir_fd();
    if (dfd < 0)
        return NULL;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    close(dfd);
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
    size_t got = (size_t)st.st_size;
    if (cm_read_full(fd, buf, got) != (ssize_t)got)
        goto miss;
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
    char name[80], tmp[128];
    size_t klen = strlen(key), vlen = strlen(value);
    if (vlen > KCACHE_MAX_VALUE || strchr(key, '\n') ||
        entry_name(kind, key, name, sizeof name) < 0)
        return;
    int dfd = cache_dir_fd();
    if (dfd < 0)
        return;
    unsigned char rnd[8];
    char hex[17];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(hex, sizeof hex, rnd, sizeof rnd);
    snprintf(tmp, sizeof tmp, ".%s.%s", name, hex);
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        close(dfd);
        return;
    }
    int ok = 1;
    const char *parts[3] = {key, "\n", value};
    size_t lens[3] = {klen, 1, vlen};
    for (int i = 0; i < 3 && ok; i++) {
        size_t done = 0;
        while (done < lens[i]) {
            ssize_t w = write(fd, parts[i] + done, lens[i] - done);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0) {
                ok = 0;
                break;
            }
            done += (size_t)w;
        }
    }
    if (close(fd) != 0)
        ok = 0;
    if (!ok || renameat(dfd, tmp, dfd, name) < 0)
        unlinkat(dfd, tmp, 0);
    close(dfd);
}
