/*
 * wsfile.c — workspace-confined file access for the MCP file tools.
 */
#include "kernelmgr/wsfile.h"

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

#include "kernelmgr/fsdiff.h"
#include "protocol/jp.h"

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int wsfile_normalize(const char *rel, int allow_root, char *out, char *err, size_t errlen)
{
    if (!rel)
        rel = "";
    size_t n = strlen(rel);
    if (n > WSFILE_PATH_MAX) {
        seterr(err, errlen, "path is too long (max %d bytes)", WSFILE_PATH_MAX);
        return -1;
    }
    if (rel[0] == '/') {
        seterr(err, errlen,
               "'%s': absolute paths are not allowed; give a path relative to the workspace", rel);
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
            seterr(err, errlen, "'%s': '..' is not allowed; paths stay inside the workspace", rel);
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
            seterr(err, errlen, "'%s': a file path is required", rel);
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

/* The fallback for kernels without openat2 (< 5.6): one component at a time,
 * never following a symlink. */
static int walk_open(int rootfd, const char *rel, int flags, mode_t mode)
{
    char buf[WSFILE_PATH_MAX + 1];
    snprintf(buf, sizeof buf, "%s", rel);
    int cur = dup(rootfd);
    if (cur < 0)
        return -1;
    char *save = NULL;
    char *comp = strtok_r(buf, "/", &save);
    while (comp) {
        char *next = strtok_r(NULL, "/", &save);
        int fd;
        if (next)
            fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        else
            fd = openat(cur, comp, flags | O_NOFOLLOW | O_CLOEXEC, mode);
        int e = errno;
        close(cur);
        if (fd < 0) {
            errno = e;
            return -1;
        }
        cur = fd;
        comp = next;
    }
    return cur;
}

int wsfile_openat(int rootfd, const char *rel, int flags, mode_t mode, char *err, size_t errlen)
{
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = (uint64_t)(flags | O_CLOEXEC);
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    int fd = (int)syscall(SYS_openat2, rootfd, rel, &how, sizeof how);
    if (fd < 0 && (errno == ENOSYS || errno == EPERM)) {
        /* EPERM: a seccomp filter of a container may deny openat2. */
        fd = walk_open(rootfd, rel, flags, mode);
    }
    if (fd < 0) {
        seterr(err, errlen, "'%s': %s", rel, escape_reason(errno));
        return -1;
    }
    return fd;
}

static int open_root(const char *root, char *err, size_t errlen)
{
    int fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        seterr(err, errlen, "workspace %s: %s", root, strerror(errno));
    return fd;
}

json_t *wsfile_read(const char *root, const char *rel, uint64_t offset, uint64_t length,
                    const char *encoding, char *err, size_t errlen)
{
    char norm[WSFILE_PATH_MAX + 1];
    if (!encoding)
        encoding = "auto";
    if (strcmp(encoding, "auto") && strcmp(encoding, "text") && strcmp(encoding, "base64")) {
        seterr(err, errlen, "encoding '%s' is not one of auto, text, base64", encoding);
        return NULL;
    }
    if (wsfile_normalize(rel, 0, norm, err, errlen) < 0)
        return NULL;
    int rootfd = open_root(root, err, errlen);
    if (rootfd < 0)
        return NULL;
    int fd = wsfile_openat(rootfd, norm, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, err, errlen);
    close(rootfd);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        seterr(err, errlen, "'%s': %s", norm,
               S_ISDIR(st.st_mode) ? "it is a directory (use list_files)" : "not a regular file");
        close(fd);
        return NULL;
    }
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
        seterr(err, errlen, "out of memory");
        return NULL;
    }
    size_t got = 0;
    while (got < length) {
        ssize_t r = pread(fd, buf + got, length - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            seterr(err, errlen, "'%s': %s", norm, strerror(errno));
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
    if (strcmp(encoding, "text") == 0) {
        as_text = 1;
    } else if (strcmp(encoding, "auto") == 0) {
        /* A chunk may end inside a character: judge the complete prefix,
         * and return only that much so the next offset starts cleanly. */
        size_t clean = (offset + got < size) ? jp_utf8_complete_prefix(buf, got) : got;
        if (memchr(buf, 0, clean) == NULL && jp_utf8_valid(buf, clean) && (clean > 0 || got == 0)) {
            as_text = 1;
            text_len = clean;
        }
    }
    json_t *content;
    size_t returned;
    if (as_text) {
        char *s = jp_utf8_sanitize(buf, text_len, NULL);
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
        seterr(err, errlen, "out of memory");
        return NULL;
    }
    return json_pack("{s:s,s:I,s:I,s:I,s:s,s:o,s:b,s:s}", "path", norm, "size", (json_int_t)size,
                     "offset", (json_int_t)offset, "length", (json_int_t)returned, "encoding",
                     as_text ? "utf-8" : "base64", "content", content, "eof",
                     offset + returned >= size, "mime", fsdiff_mime(root, norm, S_IFREG));
}

/* Creates the parent directories of rel beneath rootfd, never following a
 * symlink. 0 or -1 with errno. */
static int make_parents(int rootfd, const char *rel)
{
    char buf[WSFILE_PATH_MAX + 1];
    snprintf(buf, sizeof buf, "%s", rel);
    char *slash = strrchr(buf, '/');
    if (!slash)
        return 0;
    *slash = '\0';
    int cur = dup(rootfd);
    if (cur < 0)
        return -1;
    char *save = NULL;
    for (char *comp = strtok_r(buf, "/", &save); comp; comp = strtok_r(NULL, "/", &save)) {
        if (mkdirat(cur, comp, 0755) < 0 && errno != EEXIST) {
            int e = errno;
            close(cur);
            errno = e;
            return -1;
        }
        int fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(cur);
        if (fd < 0) {
            errno = e == ENOTDIR ? ELOOP : e;
            return -1;
        }
        cur = fd;
    }
    close(cur);
    return 0;
}

json_t *wsfile_write(const char *root, const char *rel, const void *data, size_t len, int append,
                     int mkdirs, char *err, size_t errlen)
{
    char norm[WSFILE_PATH_MAX + 1];
    if (wsfile_normalize(rel, 0, norm, err, errlen) < 0)
        return NULL;
    int rootfd = open_root(root, err, errlen);
    if (rootfd < 0)
        return NULL;
    if (mkdirs && make_parents(rootfd, norm) < 0) {
        seterr(err, errlen, "'%s': cannot create its directory: %s", norm, escape_reason(errno));
        close(rootfd);
        return NULL;
    }
    /* Does it exist? Asked through the same confined resolution, so the
     * answer cannot be about a file outside. */
    int created = 1;
    int probe = wsfile_openat(rootfd, norm, O_PATH, 0, NULL, 0);
    if (probe >= 0) {
        struct stat st;
        if (fstat(probe, &st) == 0 && !S_ISREG(st.st_mode)) {
            seterr(err, errlen, "'%s': %s", norm,
                   S_ISDIR(st.st_mode) ? "it is a directory" : "not a regular file");
            close(probe);
            close(rootfd);
            return NULL;
        }
        close(probe);
        created = 0;
    }
    int flags = O_WRONLY | O_CREAT | O_NOCTTY | O_NONBLOCK | (append ? O_APPEND : O_TRUNC);
    int fd = wsfile_openat(rootfd, norm, flags, 0644, err, errlen);
    close(rootfd);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        seterr(err, errlen, "'%s': %s", norm, "not a regular file");
        close(fd);
        return NULL;
    }
    const unsigned char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            seterr(err, errlen, "'%s': %s", norm, strerror(errno));
            close(fd);
            return NULL;
        }
        p += w;
        left -= (size_t)w;
    }
    if (fstat(fd, &st) < 0)
        st.st_size = (off_t)len;
    close(fd);
    return json_pack("{s:s,s:I,s:b}", "path", norm, "size", (json_int_t)st.st_size, "created",
                     created);
}
