/*
 * wsfile.c — the one way the host touches a workspace (see wsfile.h).
 */
#include "kernelmgr/engine/wsfile.h"
#include "common/cm_utf8.h"
#include "common/cm_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernelmgr/engine/fsdiff.h"
#include "protocol/jp.h"

int wsfile_normalize(const char *rel, int allow_root, char *out, km_err *err)
{
    if (!rel)
        rel = "";
    size_t n = strlen(rel);
    if (n > WSFILE_PATH_MAX) {
        km_err_set(err, KM_EUSAGE, "path is too long (max %d bytes)", WSFILE_PATH_MAX);
        return -1;
    }
    if (rel[0] == '/') {
        km_err_set(err, KM_EUSAGE,
                   "'%s': absolute paths are not allowed; give a path relative to the workspace",
                   rel);
        return -1;
    }
    size_t o = 0;
    const char *p = rel;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t clen = slash ? (size_t)(slash - p) : strlen(p);
        if (clen == 0 || (clen == 1 && p[0] == '.')) {
            /* "//" and "./" mean nothing */
        } else if (clen == 2 && p[0] == '.' && p[1] == '.') {
            km_err_set(err, KM_EUSAGE, "'%s': '..' is not allowed; paths stay inside the workspace",
                       rel);
            return -1;
        } else {
            if (o)
                out[o++] = '/';
            memcpy(out + o, p, clen);
            o += clen;
        }
        p += clen;
        if (*p == '/')
            p++;
    }
    out[o] = '\0';
    if (o == 0) {
        if (!allow_root) {
            km_err_set(err, KM_EUSAGE, "'%s': a file path is required", rel);
            return -1;
        }
        strcpy(out, ".");
    }
    return 0;
}

static const char *escape_reason(int e)
{
    switch (e) {
    case ELOOP:
        return "it goes through a symbolic link (not followed inside the workspace)";
    case EXDEV:
        return "it leads outside the workspace";
    case ENOENT:
        return "no such file or directory";
    case ENOTDIR:
        return "a component of the path is not a directory";
    case EISDIR:
        return "it is a directory";
    case EACCES:
    case EPERM:
        return "permission denied";
    default:
        return strerror(e);
    }
}

int wsfile_openat_walk(int rootfd, const char *rel, int flags, mode_t mode)
{
    if (!rel || !*rel || rel[0] == '/') {
        errno = rel && *rel ? EXDEV : ENOENT;
        return -1;
    }
    char *buf = strdup(rel);
    if (!buf)
        return -1;
    int cur = -1;
    char *save = NULL;
    char *comp = strtok_r(buf, "/", &save);
    while (comp && !strcmp(comp, "."))
        comp = strtok_r(NULL, "/", &save);
    int dfd = rootfd;
    while (comp) {
        char *next = strtok_r(NULL, "/", &save);
        while (next && !strcmp(next, "."))
            next = strtok_r(NULL, "/", &save);
        if (!strcmp(comp, "..")) {
            if (cur >= 0)
                close(cur);
            free(buf);
            errno = EXDEV;
            return -1;
        }
        int fd;
        if (next)
            fd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        else
            fd = openat(dfd, comp, flags | O_NOFOLLOW | O_CLOEXEC, mode);
        int e = errno;
        if (fd < 0 && (e == ENOTDIR || e == ELOOP)) {
            /* O_NOFOLLOW | O_DIRECTORY on a symlink says ENOTDIR (and a
             * symlink as the last component ELOOP): report a symlink as
             * openat2's RESOLVE_NO_SYMLINKS does, and a real non-directory
             * in the middle as ENOTDIR */
            struct stat lst;
            if (fstatat(dfd, comp, &lst, AT_SYMLINK_NOFOLLOW) == 0)
                e = S_ISLNK(lst.st_mode) ? ELOOP : e;
        }
        if (cur >= 0)
            close(cur);
        if (fd < 0) {
            free(buf);
            errno = e;
            return -1;
        }
        cur = dfd = fd;
        comp = next;
    }
    free(buf);
    if (cur < 0) /* only "." components: the root itself */
        cur = openat(rootfd, ".", flags | O_CLOEXEC, mode);
    struct stat st;
    if (cur >= 0 && (flags & O_PATH) && fstat(cur, &st) == 0 && S_ISLNK(st.st_mode)) {
        /* O_PATH | O_NOFOLLOW gives the link itself: refuse it as openat2 does */
        close(cur);
        errno = ELOOP;
        return -1;
    }
    return cur;
}

int wsfile_openat(int rootfd, const char *rel, int flags, mode_t mode, km_err *err)
{
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int fd = (int)syscall(SYS_openat2, rootfd, rel, &how, sizeof how);
    if (fd < 0 && (errno == ENOSYS || errno == EPERM)) {
        /* EPERM: a seccomp filter of a container may deny openat2. */
        fd = wsfile_openat_walk(rootfd, rel, flags, mode);
    }
    if (fd < 0) {
        int e = errno;
        km_err_set(err, KM_EUSAGE, "'%s': %s", rel, escape_reason(e));
        errno = e;
        return -1;
    }
    return fd;
}

int wsfile_root_open(const char *root, km_err *err)
{
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        km_err_set(err, KM_EUSAGE, "workspace %s: %s", root,
                   e == ELOOP || e == ENOTDIR ? "not a directory (a symlink is not followed)"
                                              : strerror(e));
        errno = e;
    }
    return fd;
}

int wsfile_open_regular(int rootfd, const char *rel, struct stat *st, km_err *err)
{
    int p = wsfile_openat(rootfd, rel, O_PATH, 0, err);
    if (p < 0)
        return -1;
    struct stat ps;
    if (fstat(p, &ps) < 0 || !S_ISREG(ps.st_mode)) {
        int e = S_ISDIR(ps.st_mode) ? EISDIR : EINVAL;
        km_err_set(err, KM_EUSAGE, "'%s': %s", rel,
                   e == EISDIR ? "it is a directory" : "not a regular file (not opened)");
        close(p);
        errno = e;
        return -1;
    }
    /* Reopen exactly this inode through our own fd's magic link; without
     * /proc, resolve the name again (confined) and insist on the same inode.
     * Either way O_NONBLOCK | O_NOCTTY: should a FIFO be swapped in between,
     * the open cannot hang and the fstat below refuses it. */
    char self[48];
    snprintf(self, sizeof self, "/proc/self/fd/%d", p);
    int fd = open(self, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        fd = wsfile_openat(rootfd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, err);
    close(p);
    if (fd < 0)
        return -1;
    if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) || st->st_dev != ps.st_dev ||
        st->st_ino != ps.st_ino) {
        km_err_set(err, KM_EUSAGE, "'%s': it changed while being opened (not read)", rel);
        close(fd);
        errno = EAGAIN;
        return -1;
    }
    return fd;
}

int wsfile_slurp(int rootfd, const char *rel, size_t max, char **data, size_t *len, km_err *err)
{
    *data = NULL;
    *len = 0;
    struct stat st;
    int fd = wsfile_open_regular(rootfd, rel, &st, err);
    if (fd < 0)
        return -1;
    if ((uint64_t)st.st_size > max) {
        km_err_set(err, KM_EUSAGE, "'%s': %lld bytes, more than the %zu read", rel,
                   (long long)st.st_size, max);
        close(fd);
        errno = EFBIG;
        return -1;
    }
    int rc = cm_read_all(fd, max, data, len), e = errno;
    close(fd);
    if (rc < 0) {
        if (e == EFBIG)
            km_err_set(err, KM_EUSAGE, "'%s': grew past the %zu bytes read", rel, max);
        else
            km_err_set(err, KM_EUSAGE, "'%s': %s", rel, strerror(e));
        errno = e;
        return -1;
    }
    return 0;
}

int wsfile_replace(int rootfd, const char *rel, const void *data, size_t len, mode_t mode,
                   km_err *err)
{
    int fd = wsfile_openat(rootfd, rel, O_WRONLY | O_CREAT | O_NOCTTY | O_NONBLOCK, mode, err);
    if (fd < 0)
        return -1;
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        km_err_set(err, KM_EUSAGE, "'%s': not a regular file", rel);
        errno = EINVAL;
    } else if (ftruncate(fd, 0) < 0 || cm_write_all(fd, data, len) < 0) {
        km_err_set(err, KM_EUSAGE, "'%s': %s", rel, strerror(errno));
    } else {
        rc = 0;
    }
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

char *wsfile_readlinkat(int dirfd, const char *name)
{
    char *buf = malloc(WSFILE_LINK_MAX + 1);
    if (!buf)
        return NULL;
    ssize_t n = readlinkat(dirfd, name, buf, WSFILE_LINK_MAX);
    if (n < 0) {
        int e = errno;
        free(buf);
        errno = e;
        return NULL;
    }
    buf[n] = '\0';
    char *t = realloc(buf, (size_t)n + 1); /* shrink; keep buf if that fails */
    if (t)
        buf = t;
    return buf;
}

/* ---------------------------------------------------------------- rmtree */

typedef struct rmctx {
    int treefd; /* the top directory being removed */
    dev_t dev;  /* its filesystem: never left */
    unsigned failed, hoisted;
    int again;   /* a subtree was moved up or refilled: another pass */
    char *first; /* the first failure */
} rmctx;

static void rm_fail(rmctx *c, const char *name, const char *why)
{
    c->failed++;
    if (!c->first && asprintf(&c->first, "%s: %s", name, why) < 0)
        c->first = NULL;
}

/* Opens the directory name in dfd for removal: never a symlink, never on
 * another filesystem, made readable/writable for its owner. -1 when not. */
static int rm_open_dir(rmctx *c, int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0 && errno == EACCES) {
        /* a directory the code made unreadable; glibc does this through an
         * O_PATH|O_NOFOLLOW fd, and refuses symlinks */
        if (fchmodat(dfd, name, 0700, AT_SYMLINK_NOFOLLOW) == 0)
            fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    }
    if (fd < 0) {
        if (errno == ENOTDIR || errno == ELOOP)
            c->again = 1; /* swapped for a symlink or file: not followed, next pass */
        else if (errno != ENOENT)
            rm_fail(c, name, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || st.st_dev != c->dev) {
        rm_fail(c, name, "is on another filesystem (a mount point): not entered");
        close(fd);
        return -1;
    }
    if ((st.st_mode & 0700) != 0700 && st.st_uid == geteuid())
        (void)fchmod(fd, (st.st_mode & 07777) | 0700);
    return fd;
}

/* Moves the too-deep directory name (in dfd) to the top of the tree. */
static void rm_hoist(rmctx *c, int dfd, const char *name)
{
    int moved = -1;
    for (int tries = 0; tries < 16 && moved < 0; tries++) {
        char nn[64];
        snprintf(nn, sizeof nn, ".kernelmgr-rmtree-%u", c->hoisted++);
        moved = renameat2(dfd, name, c->treefd, nn, RENAME_NOREPLACE);
        if (moved < 0 && errno != EEXIST)
            break;
    }
    if (moved == 0)
        c->again = 1;
    else if (errno != ENOENT)
        rm_fail(c, name, "too deep and cannot be moved up");
}

/* Empties the directory dfd (owned: closed here). */
static void rm_contents(rmctx *c, int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        rm_fail(c, "(directory)", strerror(errno));
        close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *name = de->d_name;
        if (!strcmp(name, ".") || !strcmp(name, ".."))
            continue;
        struct stat st;
        if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno != ENOENT)
                rm_fail(c, name, strerror(errno));
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            /* files, symlinks (the link itself), FIFOs, sockets */
            if (unlinkat(dirfd(d), name, 0) < 0 && errno != ENOENT) {
                if (errno == EISDIR) /* swapped for a directory: next pass */
                    c->again = 1;
                else
                    rm_fail(c, name, strerror(errno));
            }
            continue;
        }
        if (st.st_dev != c->dev) {
            rm_fail(c, name, "is a mount point of another filesystem: not entered");
            continue;
        }
        if (depth + 1 >= WSFILE_RMTREE_DEPTH) {
            rm_hoist(c, dirfd(d), name);
            continue;
        }
        int sub = rm_open_dir(c, dirfd(d), name);
        if (sub < 0)
            continue;
        unsigned failed = c->failed;
        rm_contents(c, sub, depth + 1);
        if (c->failed != failed)
            continue; /* not empty, and saying so once is enough */
        if (unlinkat(dirfd(d), name, AT_REMOVEDIR) < 0 && errno != ENOENT) {
            if (errno == ENOTEMPTY || errno == EEXIST)
                c->again = 1; /* refilled meanwhile, or hoisting left work */
            else
                rm_fail(c, name, strerror(errno));
        }
    }
    closedir(d);
}

static void rm_report(const char *path, const char *msg, km_err *err)
{
    if (err)
        km_err_set(err, KM_EUSAGE, "removing %s: %s", path, msg);
    else
        fprintf(stderr, "kernelmgr: removing %s: %s\n", path, msg);
}

int wsfile_rmtree(const char *path, km_err *err)
{
    if (!path || !*path) {
        rm_report("(empty path)", "refused", err);
        return -1;
    }
    char *parent = strdup(path);
    if (!parent) {
        rm_report(path, "out of memory", err);
        return -1;
    }
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/')
        parent[--n] = '\0';
    char *slash = strrchr(parent, '/');
    const char *base = slash ? slash + 1 : parent;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        rm_report(path, "refused (no last component to remove)", err);
        free(parent);
        return -1;
    }
    const char *pdir = ".";
    if (slash == parent)
        pdir = "/";
    else if (slash) {
        *slash = '\0';
        pdir = parent;
    }
    /* the parent is the trusted host part of the path */
    int pfd = open(pdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    int rc = 0;
    if (pfd < 0 || fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        if (errno != ENOENT) {
            rm_report(path, strerror(errno), err);
            rc = -1;
        }
        goto out;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (unlinkat(pfd, base, 0) < 0 && errno != ENOENT) {
            rm_report(path, strerror(errno), err);
            rc = -1;
        }
        goto out;
    }
    rmctx c = {.treefd = -1, .dev = st.st_dev};
    c.treefd = rm_open_dir(&c, pfd, base);
    if (c.treefd < 0 && !c.failed && fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0)
        rm_fail(&c, path, "it changed while being removed (not followed)");
    if (c.treefd >= 0) {
        unsigned pass = 0;
        do {
            c.again = 0;
            /* a dup shares the offset: start each pass at the beginning */
            int fd = dup(c.treefd);
            if (fd >= 0 && lseek(fd, 0, SEEK_SET) < 0) {
                close(fd);
                fd = -1;
            }
            if (fd < 0) {
                rm_fail(&c, path, strerror(errno));
                break;
            }
            rm_contents(&c, fd, 0);
        } while (c.again && ++pass < WSFILE_RMTREE_PASSES);
        if (c.again)
            rm_fail(&c, path, "still not empty after the last pass");
        close(c.treefd);
        if (!c.failed && unlinkat(pfd, base, AT_REMOVEDIR) < 0 && errno != ENOENT)
            rm_fail(&c, path, strerror(errno));
    }
    if (c.failed) {
        char *msg = NULL;
        if (asprintf(&msg, "%u failure(s), first: %s", c.failed, c.first ? c.first : "?") < 0)
            msg = NULL;
        rm_report(path, msg ? msg : "failed", err);
        free(msg);
        rc = -1;
    }
    free(c.first);
out:
    if (pfd >= 0)
        close(pfd);
    free(parent);
    return rc;
}

/* ---------------------------------------------------------------- MCP tools */

static const struct {
    const char *name;
    wsfile_enc enc;
    int dirs; /* WSFILE_ENC_READ | WSFILE_ENC_WRITE */
} encodings[] = {
    {"auto", WSFILE_ENC_AUTO, WSFILE_ENC_READ},
    {"text", WSFILE_ENC_TEXT, WSFILE_ENC_READ | WSFILE_ENC_WRITE},
    {"base64", WSFILE_ENC_BASE64, WSFILE_ENC_READ | WSFILE_ENC_WRITE},
};
#define N_ENCODINGS (sizeof encodings / sizeof encodings[0])

int wsfile_encoding(const char *name, int dir, km_err *err)
{
    for (size_t i = 0; name && i < N_ENCODINGS; i++)
        if ((encodings[i].dirs & dir) && !strcmp(name, encodings[i].name))
            return (int)encodings[i].enc;
    char list[128] = "";
    size_t n = 0, k = 0;
    for (size_t i = 0; i < N_ENCODINGS; i++)
        n += encodings[i].dirs & dir ? 1 : 0;
    for (size_t i = 0; i < N_ENCODINGS; i++) {
        if (!(encodings[i].dirs & dir))
            continue;
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s\"%s\"",
                 k == 0       ? ""
                 : k + 1 == n ? " or "
                              : ", ",
                 encodings[i].name);
        k++;
    }
    km_err_set(err, KM_EUSAGE, "must be %s (got \"%.40s\")", list, name ? name : "");
    return -1;
}

json_t *wsfile_encodings_json(int dir)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < N_ENCODINGS; i++)
        if (encodings[i].dirs & dir)
            json_array_append_new(a, json_string(encodings[i].name));
    return a;
}

json_t *wsfile_read(const char *root, const char *rel, uint64_t offset, uint64_t length,
                    const char *encoding, km_err *err)
{
    char norm[WSFILE_PATH_MAX + 1];
    km_err why = {0};
    int enc = encoding ? wsfile_encoding(encoding, WSFILE_ENC_READ, &why) : WSFILE_ENC_AUTO;
    if (enc < 0) {
        km_err_set(err, KM_EUSAGE, "encoding: %s", why.msg);
        return NULL;
    }
    if (wsfile_normalize(rel, 0, norm, err) < 0)
        return NULL;
    int rootfd = wsfile_root_open(root, err);
    if (rootfd < 0)
        return NULL;
    struct stat st;
    int fd = wsfile_open_regular(rootfd, norm, &st, err);
    int e = errno;
    close(rootfd);
    if (fd < 0) {
        if (e == EISDIR)
            km_err_set(err, KM_EUSAGE, "'%s': it is a directory (use list_files)", norm);
        return NULL;
    }
    const char *mime = fsdiff_mime_fd(fd, norm);
    uint64_t size = (uint64_t)st.st_size;
    if (length == 0 || length > WSFILE_READ_MAX)
        length = WSFILE_READ_MAX;
    if (offset > size)
        offset = size;
    if (length > size - offset)
        length = size - offset;
    unsigned char *buf = malloc(length + 1);
    if (!buf) {
        close(fd);
        km_err_set(err, KM_EUSAGE, "out of memory");
        return NULL;
    }
    size_t got = 0;
    while (got < length) {
        ssize_t r = pread(fd, buf + got, length - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            km_err_set(err, KM_EUSAGE, "'%s': %s", norm, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);

    int as_text = 0;
    size_t text_len = got;
    if (enc == WSFILE_ENC_TEXT) {
        as_text = 1;
    } else if (enc == WSFILE_ENC_AUTO) {
        /* A chunk may end inside a character: judge the complete prefix,
         * and return only that much so the next offset starts cleanly. */
        size_t clean = (offset + got < size) ? cm_utf8_complete_prefix(buf, got) : got;
        if (memchr(buf, 0, clean) == NULL && cm_utf8_valid(buf, clean) && (clean > 0 || got == 0)) {
            as_text = 1;
            text_len = clean;
        }
    }
    json_t *content;
    size_t returned;
    if (as_text) {
        char *s = cm_utf8_sanitize(buf, text_len, NULL);
        content = s ? json_string(s) : NULL;
        free(s);
        returned = text_len;
    } else {
        size_t b64len = sodium_base64_ENCODED_LEN(got, sodium_base64_VARIANT_ORIGINAL);
        char *b64 = malloc(b64len);
        content = b64 ? json_string(sodium_bin2base64(b64, b64len, buf, got,
                                                      sodium_base64_VARIANT_ORIGINAL))
                      : NULL;
        free(b64);
        returned = got;
    }
    free(buf);
    if (!content) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return NULL;
    }
    return json_pack("{s:s,s:I,s:I,s:I,s:s,s:o,s:b,s:s}", "path", norm, "size", (json_int_t)size,
                     "offset", (json_int_t)offset, "length", (json_int_t)returned, "encoding",
                     as_text ? "utf-8" : "base64", "content", content, "eof",
                     offset + returned >= size, "mime", mime);
}

/* Creates the parent directories of rel beneath rootfd, never following a
 * symlink. 0 or -1 with errno. */
static int make_parents(int rootfd, const char *rel)
{
    char *buf = strdup(rel);
    if (!buf)
        return -1;
    char *slash = strrchr(buf, '/');
    if (!slash) {
        free(buf);
        return 0;
    }
    *slash = '\0';
    int cur = dup(rootfd);
    if (cur < 0) {
        free(buf);
        return -1;
    }
    char *save = NULL;
    for (char *comp = strtok_r(buf, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
        if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST) {
            int e = errno;
            close(cur);
            free(buf);
            errno = e;
            return -1;
        }
        int fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(cur);
        if (fd < 0) {
            free(buf);
            errno = e == ENOTDIR ? ELOOP : e;
            return -1;
        }
        cur = fd;
    }
    close(cur);
    free(buf);
    return 0;
}

json_t *wsfile_write(const char *root, const char *rel, const void *data, size_t len, int append,
                     int mkdirs, km_err *err)
{
    char norm[WSFILE_PATH_MAX + 1];
    if (wsfile_normalize(rel, 0, norm, err) < 0)
        return NULL;
    int rootfd = wsfile_root_open(root, err);
    if (rootfd < 0)
        return NULL;
    if (mkdirs && make_parents(rootfd, norm) < 0) {
        km_err_set(err, KM_EUSAGE, "'%s': cannot create its directory: %s", norm,
                   escape_reason(errno));
        close(rootfd);
        return NULL;
    }
    /* Does it exist? Asked through the same confined resolution, so the
     * answer cannot be about a file outside. */
    int created = 1;
    int probe = wsfile_openat(rootfd, norm, O_PATH, 0, NULL);
    if (probe >= 0) {
        struct stat st;
        if (fstat(probe, &st) == 0 && !S_ISREG(st.st_mode)) {
            km_err_set(err, KM_EUSAGE, "'%s': %s", norm,
                       S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file");
            close(probe);
            close(rootfd);
            return NULL;
        }
        close(probe);
        created = 0;
    }
    /* truncated only once known to be a regular file */
    int flags = O_WRONLY | O_CREAT | O_NOCTTY | O_NONBLOCK | (append ? O_APPEND : 0);
    int fd = wsfile_openat(rootfd, norm, flags, 0644, err);
    close(rootfd);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        km_err_set(err, KM_EUSAGE, "'%s': %s", norm, "not a regular file");
        close(fd);
        return NULL;
    }
    if (!append && ftruncate(fd, 0) < 0) {
        km_err_set(err, KM_EUSAGE, "'%s': %s", norm, strerror(errno));
        close(fd);
        return NULL;
    }
    if (cm_write_all(fd, data, len) < 0) {
        km_err_set(err, KM_EUSAGE, "'%s': %s", norm, strerror(errno));
        close(fd);
        return NULL;
    }
    if (fstat(fd, &st) < 0)
        st.st_size = (off_t)len;
    close(fd);
    return json_pack("{s:s,s:I,s:b}", "path", norm, "size", (json_int_t)st.st_size, "created",
                     created);
}

json_t *wsfile_remove(const char *root, const char *rel, km_err *err)
{
    char norm[WSFILE_PATH_MAX + 1];
    if (wsfile_normalize(rel, 0, norm, err) < 0)
        return NULL;
    int rootfd = wsfile_root_open(root, err);
    if (rootfd < 0)
        return NULL;
    char *slash = strrchr(norm, '/');
    const char *last = slash ? slash + 1 : norm;
    int pfd;
    if (slash) {
        *slash = '\0';
        pfd = wsfile_openat(rootfd, norm, O_PATH | O_DIRECTORY, 0, NULL);
        int e = errno;
        *slash = '/';
        if (pfd < 0) {
            km_err_set(err, KM_EUSAGE, "'%s': %s", norm, escape_reason(e));
            close(rootfd);
            return NULL;
        }
        close(rootfd);
    } else {
        pfd = rootfd;
    }
    struct stat st;
    int rc = fstatat(pfd, last, &st, AT_SYMLINK_NOFOLLOW);
    const char *type = "other";
    if (rc == 0) {
        int dir = S_ISDIR(st.st_mode);
        type = dir                   ? "dir"
               : S_ISLNK(st.st_mode) ? "symlink"
               : S_ISREG(st.st_mode) ? "file"
                                     : "other";
        rc = unlinkat(pfd, last, dir ? AT_REMOVEDIR : 0);
    }
    int e = errno;
    close(pfd);
    if (rc < 0) {
        km_err_set(err, KM_EUSAGE, "'%s': %s", norm,
                   e == ENOTEMPTY || e == EEXIST ? "the directory is not empty" : escape_reason(e));
        return NULL;
    }
    return json_pack("{s:s,s:s}", "path", norm, "type", type);
}
