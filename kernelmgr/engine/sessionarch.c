/*
 * sessionarch.c — a session as one ustar archive (sessionarch.h): the
 * writer over a snapshot directory, the hostile-input reader, the
 * fd-relative extraction and the manifest the importing host writes.
 */
#include "kernelmgr/engine/sessionarch.h"

#include "common/cm_clock.h"
#include "common/cm_io.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/snapshot.h"
#include "kernelmgr/engine/wsfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TAR_BLOCK 512
#define TAR_SIZE_MAX 077777777777ull /* the largest size 11 octal digits hold */
#define SARCH_DEPTH_MAX 64           /* directories below workspace/ */
#define SARCH_FILES_MAX 64           /* files of one kernel's state (snapshot.c's bound) */

/* ------------------------------------------------------------ writing */

typedef struct wctx {
    int fd;
    unsigned entries;
    uint64_t bytes;
    json_t *skipped;
    char err[WSFILE_PATH_MAX + 512];
} wctx;

static void w_skip(wctx *w, const char *path, const char *why)
{
    if (json_array_size(w->skipped) < 100)
        json_array_append_new(w->skipped, json_pack("{s:s s:s}", "path", path, "reason", why));
}

/* One ustar header for path. 0, 1: the path does not fit ustar's name and
 * prefix (skipped), -1: a write error (w->err). */
static int w_header(wctx *w, const char *path, char type, mode_t mode, uint64_t size)
{
    unsigned char h[TAR_BLOCK];
    memset(h, 0, sizeof h);
    size_t n = strlen(path), pl = 0;
    const char *name = path;
    if (n > 100) {
        const char *cut = NULL;
        for (size_t i = 1; i < n && i <= 155; i++)
            if (path[i] == '/' && n - i - 1 <= 100 && n - i - 1 > 0)
                cut = path + i;
        if (!cut)
            return 1;
        pl = (size_t)(cut - path);
        name = cut + 1;
    }
    if (size > TAR_SIZE_MAX)
        return 1;
    memcpy(h, name, strlen(name));
    memcpy(h + 345, path, pl);
    snprintf((char *)h + 100, 8, "%07o", (unsigned)(mode & 0777));
    snprintf((char *)h + 108, 8, "%07o", 0u);
    snprintf((char *)h + 116, 8, "%07o", 0u);
    snprintf((char *)h + 124, 12, "%011llo", (unsigned long long)size);
    snprintf((char *)h + 136, 12, "%011llo", (unsigned long long)time(NULL));
    memset(h + 148, ' ', 8);
    h[156] = (unsigned char)type;
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof h; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    h[155] = ' ';
    if (cm_write_all(w->fd, h, sizeof h)) {
        snprintf(w->err, sizeof w->err, "cannot write the archive: %s", strerror(errno));
        return -1;
    }
    w->entries++;
    return 0;
}

static int w_pad(wctx *w, uint64_t size)
{
    static const unsigned char zero[TAR_BLOCK];
    size_t pad = (size_t)((TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK);
    if (pad && cm_write_all(w->fd, zero, pad)) {
        snprintf(w->err, sizeof w->err, "cannot write the archive: %s", strerror(errno));
        return -1;
    }
    return 0;
}

static int w_bytes(wctx *w, const char *path, const void *data, size_t len)
{
    int r = w_header(w, path, '0', 0600, len);
    if (r)
        return r < 0 ? -1 : 0;
    if (cm_write_all(w->fd, data, len)) {
        snprintf(w->err, sizeof w->err, "cannot write the archive: %s", strerror(errno));
        return -1;
    }
    w->bytes += len;
    return w_pad(w, len);
}

/* The regular file in open as in, st_size bytes, as entry path: exactly the
 * size its header says (a file that changed meanwhile fails the export). */
static int w_file(wctx *w, const char *path, int in, const struct stat *st)
{
    int r = w_header(w, path, '0', st->st_mode, (uint64_t)st->st_size);
    if (r) {
        if (r > 0)
            w_skip(w, path, "a path ustar cannot hold (over 255 bytes)");
        return r < 0 ? -1 : 0;
    }
    char buf[65536];
    uint64_t left = (uint64_t)st->st_size;
    while (left) {
        ssize_t n = read(in, buf, left < sizeof buf ? (size_t)left : sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(w->err, sizeof w->err, "%s changed while it was archived", path);
            return -1;
        }
        if (cm_write_all(w->fd, buf, (size_t)n)) {
            snprintf(w->err, sizeof w->err, "cannot write the archive: %s", strerror(errno));
            return -1;
        }
        left -= (uint64_t)n;
    }
    w->bytes += (uint64_t)st->st_size;
    return w_pad(w, (uint64_t)st->st_size);
}

/* The tree below dirfd as entries under prefix, fd-based, never following
 * a link: directories and regular files; anything else is listed as
 * skipped. */
static int w_tree(wctx *w, int dirfd, const char *prefix, int depth)
{
    int dup_fd = fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        snprintf(w->err, sizeof w->err, "cannot read %s: %s", prefix, strerror(errno));
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, ".."))
            continue;
        char path[WSFILE_PATH_MAX + 64];
        int pl = snprintf(path, sizeof path, "%s/%s", prefix, n);
        if (pl < 0 || (size_t)pl >= sizeof path) {
            w_skip(w, prefix, "a path longer than 1024 bytes");
            continue;
        }
        struct stat st;
        if (fstatat(dirfd, n, &st, AT_SYMLINK_NOFOLLOW)) {
            w_skip(w, path, strerror(errno));
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            if (depth >= SARCH_DEPTH_MAX) {
                w_skip(w, path, "deeper than 64 directories");
                continue;
            }
            int sub = openat(dirfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) {
                w_skip(w, path, strerror(errno));
                continue;
            }
            char dpath[sizeof path + 1];
            snprintf(dpath, sizeof dpath, "%s/", path);
            int r = w_header(w, dpath, '5', st.st_mode, 0);
            if (r > 0)
                w_skip(w, path, "a path ustar cannot hold (over 255 bytes)");
            else if (r == 0)
                rc = w_tree(w, sub, path, depth + 1);
            else
                rc = -1;
            close(sub);
        } else if (S_ISREG(st.st_mode)) {
            int in = openat(dirfd, n, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
            struct stat st2;
            if (in < 0 || fstat(in, &st2) || !S_ISREG(st2.st_mode) || st2.st_ino != st.st_ino) {
                w_skip(w, path, in < 0 ? strerror(errno) : "changed while it was archived");
            } else {
                rc = w_file(w, path, in, &st2);
            }
            if (in >= 0)
                close(in);
        } else {
            w_skip(w, path,
                   S_ISLNK(st.st_mode)    ? "a symbolic link (an archive holds none)"
                   : S_ISFIFO(st.st_mode) ? "a FIFO"
                                          : "a special file");
        }
    }
    closedir(d);
    return rc;
}

int sarch_write(km_manager *m, const session *s, const char *tag, const json_t *header, int fd,
                json_t *info, km_err *err)
{
    char dir[PATH_MAX];
    if (snap_path(s, tag, dir, sizeof dir)) {
        km_err_set(err, KM_EINTERNAL, "the session's directory path is too long");
        return -1;
    }
    km_err why = {0};
    json_t *man = snap_manifest(s, tag, &why);
    if (!man) {
        km_err_set(err, KM_EINTERNAL, "%s", why.msg);
        return -1;
    }
    /* the host's own paths stay on the host */
    json_object_del(man, "workspace");
    wctx w = {.fd = fd, .skipped = json_array()};
    char *htext = json_dumps(header, JSON_INDENT(1) | JSON_SORT_KEYS);
    char *mtext = json_dumps(man, JSON_INDENT(1) | JSON_SORT_KEYS);
    int rc = -1;
    int sfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (!htext || !mtext || sfd < 0) {
        snprintf(w.err, sizeof w.err, "cannot read snapshot \"%s\": %s", tag,
                 sfd < 0 ? strerror(errno) : "out of memory");
        goto out;
    }
    if (w_bytes(&w, SARCH_HEADER, htext, strlen(htext)) ||
        w_header(&w, "snapshot/", '5', 0700, 0) ||
        w_bytes(&w, "snapshot/manifest.json", mtext, strlen(mtext)))
        goto out;
    json_t *kernels = json_object_get(man, "kernels");
    const char *lang;
    json_t *v;
    json_object_foreach(kernels, lang, v)
    {
        if (kmcfg_lang_index(&m->cfg, lang) < 0)
            continue;
        int lfd = openat(sfd, lang, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (lfd < 0) {
            snprintf(w.err, sizeof w.err, "snapshot \"%s\" lacks its %s state: %s", tag, lang,
                     strerror(errno));
            goto out;
        }
        char p[128];
        snprintf(p, sizeof p, "snapshot/%s", lang);
        char dp[130];
        snprintf(dp, sizeof dp, "%s/", p);
        int r = w_header(&w, dp, '5', 0700, 0) ? -1 : w_tree(&w, lfd, p, SARCH_DEPTH_MAX - 1);
        close(lfd);
        if (r)
            goto out;
    }
    if (w_header(&w, "workspace/", '5', 0700, 0))
        goto out;
    int wfd = openat(sfd, "workspace", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (wfd >= 0) {
        int r = w_tree(&w, wfd, "workspace", 0);
        close(wfd);
        if (r)
            goto out;
    }
    static const unsigned char end[2 * TAR_BLOCK];
    if (cm_write_all(fd, end, sizeof end) || fsync(fd)) {
        snprintf(w.err, sizeof w.err, "cannot write the archive: %s", strerror(errno));
        goto out;
    }
    json_object_set_new(info, "entries", json_integer(w.entries));
    json_object_set_new(info, "bytes", json_integer((json_int_t)w.bytes));
    json_object_set(info, "skipped", w.skipped);
    rc = 0;
out:
    if (rc)
        km_err_set(err, KM_EINTERNAL, "%s", w.err);
    if (sfd >= 0)
        close(sfd);
    free(htext);
    free(mtext);
    json_decref(man);
    json_decref(w.skipped);
    return rc;
}

/* ------------------------------------------------------------ reading */

typedef struct rctx {
    km_manager *m;
    int fd;
    uint64_t archive; /* bytes of the archive file */
    uint64_t pos;
    unsigned entries;
    uint64_t bytes;  /* declared bytes of all entries */
    int outfd;       /* the extraction's directory, -1: check only */
    json_t *present; /* {"LANG/FILE": size} of the kernels' states */
    unsigned lang_files[KM_LANG_MAX];
    char *header; /* kernelmgr-session.json */
    size_t header_len;
    char *manifest; /* snapshot/manifest.json */
    size_t manifest_len;
    char err[WSFILE_PATH_MAX + 512];
} rctx;

static int r_fail(rctx *r, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int r_fail(rctx *r, const char *path, const char *fmt, ...)
{
    char why[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (path)
        snprintf(r->err, sizeof r->err, "archive entry %u \"%.400s\": %.600s", r->entries, path,
                 why);
    else
        snprintf(r->err, sizeof r->err, "%s", why);
    return -1;
}

/* An octal field of ustar (leading spaces, digits, then NUL or spaces).
 * 0, or -1: not octal (a base-256 size included: larger than any bound). */
static int octal(const unsigned char *f, size_t n, uint64_t *out)
{
    size_t i = 0;
    uint64_t v = 0;
    if (f[0] & 0x80)
        return -1;
    while (i < n && f[i] == ' ')
        i++;
    int digits = 0;
    for (; i < n && f[i] >= '0' && f[i] <= '7'; i++, digits++) {
        if (v > (UINT64_MAX >> 3))
            return -1;
        v = (v << 3) | (uint64_t)(f[i] - '0');
    }
    for (; i < n; i++)
        if (f[i] != 0 && f[i] != ' ')
            return -1;
    *out = v;
    return digits ? 0 : -1;
}

/* What kind of entry path is, by the layout of sessionarch.h. */
enum { E_HEADER, E_SNAPDIR, E_MANIFEST, E_LANGDIR, E_LANGFILE, E_WSDIR, E_WS };

/* The entries of an archive at fixed paths: a row each (path, a directory
 * or a file, its kind); the rest are below snapshot/LANG/ and workspace/. */
static const struct {
    const char *path;
    int dir;
    int kind;
} sarch_fixed[] = {
    {SARCH_HEADER, 0, E_HEADER},
    {"snapshot", 1, E_SNAPDIR},
    {"snapshot/manifest.json", 0, E_MANIFEST},
    {"workspace", 1, E_WSDIR},
};

/* Checks path (a file, or a directory when dir) by the layout and the path
 * rules; *kind, *lang. 0 or -1 (r->err). */
static int r_path(rctx *r, char *path, int dir, int *kind, int *lang)
{
    size_t n = strlen(path);
    if (n == 0)
        return r_fail(r, path, "an empty path");
    if (path[0] == '/')
        return r_fail(r, path, "an absolute path (only relative paths are extracted)");
    if (dir && n > 1 && path[n - 1] == '/')
        path[--n] = 0;
    else if (path[n - 1] == '/')
        return r_fail(r, path, "a file whose path ends with \"/\"");
    if (n > WSFILE_PATH_MAX + 32)
        return r_fail(r, path, "a path longer than 1024 bytes");
    int depth = 0;
    for (const char *c = path; *c;) {
        const char *e = strchr(c, '/');
        size_t cl = e ? (size_t)(e - c) : strlen(c);
        if (cl == 0)
            return r_fail(r, path, "an empty path component (\"//\")");
        if ((cl == 1 && c[0] == '.') || (cl == 2 && c[0] == '.' && c[1] == '.'))
            return r_fail(r, path, "a \"%.*s\" component (no entry may leave its directory)",
                          (int)cl, c);
        if (cl > 255)
            return r_fail(r, path, "a path component longer than 255 bytes");
        depth++;
        c = e ? e + 1 : c + cl;
    }
    *lang = -1;
    for (size_t i = 0; i < sizeof sarch_fixed / sizeof *sarch_fixed; i++)
        if (!strcmp(path, sarch_fixed[i].path) && dir == sarch_fixed[i].dir) {
            *kind = sarch_fixed[i].kind;
            return 0;
        }
    if (!strncmp(path, "workspace/", 10)) {
        if (depth > SARCH_DEPTH_MAX + 1)
            return r_fail(r, path, "deeper than %d directories", SARCH_DEPTH_MAX);
        *kind = E_WS;
        return 0;
    }
    if (!strncmp(path, "snapshot/", 9)) {
        char ln[KM_NAME_MAX + 1];
        const char *rest = path + 9, *sl = strchr(rest, '/');
        size_t ll = sl ? (size_t)(sl - rest) : strlen(rest);
        snprintf(ln, sizeof ln, "%.*s", (int)(ll < sizeof ln ? ll : sizeof ln - 1), rest);
        int l = ll < sizeof ln ? kmcfg_lang_index(&r->m->cfg, ln) : -1;
        if (l < 0)
            return r_fail(r, path, "not a language of this daemon's configuration");
        *lang = l;
        if (!sl && dir) {
            *kind = E_LANGDIR;
            return 0;
        }
        km_err terr = {0};
        if (sl && !dir && !strchr(sl + 1, '/') && snap_tag_check(sl + 1, &terr) == 0) {
            if (++r->lang_files[l] > SARCH_FILES_MAX)
                return r_fail(r, path, "more than %d files in a kernel's state", SARCH_FILES_MAX);
            *kind = E_LANGFILE;
            return 0;
        }
        return r_fail(r, path,
                      "not a kernel state file (snapshot/LANG/NAME, NAME of letters, digits, "
                      "\".\", \"_\" and \"-\")");
    }
    return r_fail(
        r, path, "not part of a session archive (only " SARCH_HEADER ", snapshot/ and workspace/)");
}

/* Opens (making it when mk) the directory rel below r->outfd, one
 * component at a time, never following a link. The fd, or -1. */
static int r_opendir(rctx *r, const char *rel, int mk)
{
    int cur = fcntl(r->outfd, F_DUPFD_CLOEXEC, 0);
    char part[256];
    for (const char *c = rel; cur >= 0 && *c;) {
        const char *e = strchr(c, '/');
        size_t cl = e ? (size_t)(e - c) : strlen(c);
        snprintf(part, sizeof part, "%.*s", (int)cl, c);
        int next = openat(cur, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0 && errno == ENOENT && mk && mkdirat(cur, part, 0700) == 0)
            next = openat(cur, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(cur);
        cur = next;
        c = e ? e + 1 : c + cl;
    }
    return cur;
}

/* Reads exactly len bytes of the archive (the entry's data) into buf, or
 * copies them to out (fd >= 0). 0 or -1 (r->err). */
static int r_data(rctx *r, const char *path, uint64_t len, char *buf, int out)
{
    char tmp[65536];
    uint64_t done = 0;
    while (done < len) {
        size_t want = len - done < sizeof tmp ? (size_t)(len - done) : sizeof tmp;
        ssize_t n = read(r->fd, buf ? buf + done : tmp, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return r_fail(r, path, "the archive ends inside it");
        if (out >= 0 && cm_write_all(out, tmp, (size_t)n))
            return r_fail(r, path, "cannot write it: %s", strerror(errno));
        done += (uint64_t)n;
    }
    return 0;
}

/* One entry: its header in h (checksum verified), its data after. 0, 1: the
 * end of the archive, -1 (r->err). */
static int r_entry(rctx *r, const unsigned char *h)
{
    int zero = 1;
    for (int i = 0; i < TAR_BLOCK && zero; i++)
        zero = h[i] == 0;
    if (zero)
        return 1;
    r->entries++;
    if (r->entries > r->m->cfg.import_max_entries)
        return r_fail(r, NULL,
                      "the archive has more than import_max_entries=%u entries; nothing was "
                      "imported",
                      r->m->cfg.import_max_entries);
    uint64_t sum = 0, want = 0;
    for (int i = 0; i < TAR_BLOCK; i++)
        sum += (i >= 148 && i < 156) ? ' ' : h[i];
    if (octal(h + 148, 8, &want) || want != sum)
        return r_fail(r, NULL, "archive entry %u: a damaged header (checksum)", r->entries);
    if (memcmp(h + 257, "ustar", 5))
        return r_fail(r, NULL, "archive entry %u: not a ustar header (only POSIX ustar is read)",
                      r->entries);
    char path[400];
    size_t nl = strnlen((const char *)h, 100), pl = strnlen((const char *)h + 345, 155);
    if (pl)
        snprintf(path, sizeof path, "%.*s/%.*s", (int)pl, h + 345, (int)nl, h);
    else
        snprintf(path, sizeof path, "%.*s", (int)nl, h);
    char type = (char)h[156];
    uint64_t size = 0, mode = 0;
    if (octal(h + 124, 12, &size))
        return r_fail(r, path,
                      "a size field that is not octal (a base-256 size is larger than any bound)");
    if (octal(h + 100, 8, &mode))
        mode = 0600;
    switch (type) {
    case '0':
    case 0:
    case '5':
        break;
    case '1':
        return r_fail(r, path, "a hard link (only regular files and directories are extracted)");
    case '2':
        return r_fail(r, path,
                      "a symbolic link (only regular files and directories are extracted)");
    case '3':
    case '4':
        return r_fail(r, path, "a device (only regular files and directories are extracted)");
    case '6':
        return r_fail(r, path, "a FIFO (only regular files and directories are extracted)");
    case 'x':
    case 'g':
    case 'L':
    case 'K':
        return r_fail(r, path, "an extended (pax or GNU) header: only POSIX ustar is read");
    default:
        return r_fail(r, path, "an entry of type '%c' (only regular files and directories)",
                      type >= 0x20 && type < 0x7f ? type : '?');
    }
    int dir = type == '5';
    if (dir && size)
        return r_fail(r, path, "a directory with data");
    uint64_t max = r->m->cfg.import_max_bytes;
    if (size > max || r->bytes + size > max)
        return r_fail(r, path,
                      "it declares %llu bytes: the archive's entries would pass "
                      "import_max_bytes=%llu; nothing was imported",
                      (unsigned long long)size, (unsigned long long)max);
    uint64_t padded = (size + TAR_BLOCK - 1) / TAR_BLOCK * TAR_BLOCK;
    if (padded > r->archive - r->pos)
        return r_fail(r, path, "it declares %llu bytes, but the archive ends before them",
                      (unsigned long long)size);
    r->bytes += size;
    int kind = E_WS, lang = -1;
    if (r_path(r, path, dir, &kind, &lang))
        return -1;
    int rc = 0;
    if (kind == E_HEADER || kind == E_MANIFEST) {
        size_t cap = kind == E_HEADER ? SARCH_HEADER_MAX : SNAP_MANIFEST_MAX;
        char **dst = kind == E_HEADER ? &r->header : &r->manifest;
        if (size > cap)
            return r_fail(r, path, "larger than %zu bytes", cap);
        if (*dst)
            return r_fail(r, path, "it appears twice");
        *dst = malloc((size_t)size + 1);
        if (!*dst || r_data(r, path, size, *dst, -1))
            return *dst ? -1 : r_fail(r, path, "out of memory");
        (*dst)[size] = 0;
        if (kind == E_HEADER)
            r->header_len = (size_t)size;
        else
            r->manifest_len = (size_t)size;
    } else if (kind == E_LANGFILE) {
        const char *rel = path + 9; /* LANG/NAME */
        if (json_object_get(r->present, rel))
            return r_fail(r, path, "it appears twice");
        json_object_set_new(r->present, rel, json_integer((json_int_t)size));
    }
    if (r->outfd >= 0 && kind != E_HEADER && kind != E_MANIFEST && kind != E_SNAPDIR) {
        const char *rel = kind == E_LANGDIR || kind == E_LANGFILE ? path + 9 : path;
        if (dir) {
            int d = r_opendir(r, rel, 1);
            if (d < 0)
                return r_fail(r, path, "cannot make it: %s", strerror(errno));
            fchmod(d, 0700 | (mode_t)(mode & 0755));
            close(d);
        } else {
            const char *sl = strrchr(rel, '/');
            char parent[sizeof path];
            snprintf(parent, sizeof parent, "%.*s", sl ? (int)(sl - rel) : 0, rel);
            int d = r_opendir(r, parent, 1);
            int out = d < 0 ? -1
                            : openat(d, sl ? sl + 1 : rel,
                                     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                                     0600 | (mode_t)(mode & 0700));
            int e = errno;
            if (d >= 0)
                close(d);
            if (out < 0)
                return r_fail(r, path, "%s", e == EEXIST ? "it appears twice" : strerror(e));
            rc = r_data(r, path, size, NULL, out);
            if (rc == 0 && fsync(out))
                rc = r_fail(r, path, "cannot write it: %s", strerror(errno));
            close(out);
        }
    } else if (kind != E_HEADER && kind != E_MANIFEST && size &&
               lseek(r->fd, (off_t)size, SEEK_CUR) < 0) {
        return r_fail(r, path, "cannot read the archive: %s", strerror(errno));
    }
    if (rc)
        return -1;
    if (padded > size && lseek(r->fd, (off_t)(padded - size), SEEK_CUR) < 0)
        return r_fail(r, path, "cannot read the archive: %s", strerror(errno));
    r->pos += padded;
    return 0;
}

/* A short printable string of o's key, or NULL. */
static const char *short_str(const json_t *o, const char *key, size_t max)
{
    const json_t *v = json_object_get(o, key);
    const char *s = json_string_value(v);
    if (!s || json_string_length(v) > max)
        return NULL;
    for (const char *c = s; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            return NULL;
    return s;
}

/* Checks the archive's manifest against what it holds, and builds the one
 * this host writes: kernels only as present, sizes as measured. new, or
 * NULL (r->err). */
static json_t *r_manifest(rctx *r, const session *s, const char *tag, json_t **langs)
{
    json_error_t je;
    json_t *in = json_loadb(r->manifest, r->manifest_len, JSON_REJECT_DUPLICATES, &je);
    json_t *kernels = json_object_get(in, "kernels");
    if (!json_is_object(in) || json_integer_value(json_object_get(in, "version")) != 1 ||
        !json_is_object(kernels)) {
        json_decref(in);
        r_fail(r, NULL,
               "snapshot/manifest.json is not a kernelmgr snapshot manifest (version 1 with "
               "\"kernels\")");
        return NULL;
    }
    json_t *outk = json_object();
    *langs = json_array();
    const char *lang;
    json_t *kv;
    uint64_t total = 0;
    json_object_foreach(kernels, lang, kv)
    {
        json_t *files = json_object_get(kv, "files");
        if (kmcfg_lang_index(&r->m->cfg, lang) < 0 || !json_is_object(files)) {
            r_fail(r, NULL,
                   "snapshot/manifest.json: kernel \"%.64s\" is not a language of this daemon "
                   "with a \"files\" object",
                   lang);
            goto bad;
        }
        json_t *measured = json_object();
        const char *fn;
        json_t *fv;
        uint64_t bytes = 0;
        json_object_foreach(files, fn, fv)
        {
            char rel[200];
            km_err terr = {0};
            snprintf(rel, sizeof rel, "%s/%s", lang, fn);
            json_t *have = snap_tag_check(fn, &terr) ? NULL : json_object_get(r->present, rel);
            if (!have) {
                json_decref(measured);
                r_fail(r, NULL,
                       "snapshot/manifest.json names the file \"%.200s\" of the %s state, which "
                       "is not a file of the archive's snapshot/%s/ (nothing outside it is "
                       "ever read)",
                       fn, lang, lang);
                goto bad;
            }
            json_object_set(measured, fn, have);
            bytes += (uint64_t)json_integer_value(have);
        }
        json_t *info = json_pack("{s:o s:I s:o}", "files", measured, "bytes", (json_int_t)bytes,
                                 "lost", snap_lost_sanitized(json_object_get(kv, "lost")));
        json_t *nm = json_object_get(kv, "names");
        if (json_is_integer(nm) && json_integer_value(nm) >= 0)
            json_object_set(info, "names", nm);
        const char *ser = short_str(kv, "serializer", 31);
        if (ser)
            json_object_set_new(info, "serializer", json_string(ser));
        json_object_set_new(outk, lang, info);
        json_array_append_new(*langs, json_string(lang));
        total += bytes;
    }
    char at[32];
    const char *a = short_str(in, "at", 31);
    if (a)
        snprintf(at, sizeof at, "%s", a);
    else
        snprintf(at, sizeof at, "unknown");
    json_t *out =
        json_pack("{s:i s:s s:s s:s s:f s:s s:I s:I s:o s:{} s:{s:I s:[]} s:s}", "version", 1,
                  "session", s->name, "tag", tag, "at", at, "time", cm_wall_s(), "reason",
                  "imported", "bytes", (json_int_t)r->bytes, "snapshot_max",
                  (json_int_t)r->m->cfg.snapshot_max, "kernels", outk, "failed", "workspace_copy",
                  "bytes", (json_int_t)(r->bytes - total), "skipped", "workspace", s->workspace);
    json_decref(in);
    return out;
bad:
    json_decref(outk);
    json_decref(*langs);
    *langs = NULL;
    json_decref(in);
    return NULL;
}

json_t *sarch_read(km_manager *m, session *s, int fd, const char *tag, km_err *err)
{
    struct stat st;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || lseek(fd, 0, SEEK_SET) < 0) {
        km_err_set(err, KM_EINTERNAL, "cannot read the archive: %s", strerror(errno));
        return NULL;
    }
    rctx r = {
        .m = m, .fd = fd, .archive = (uint64_t)st.st_size, .outfd = -1, .present = json_object()};
    char root[PATH_MAX], tmp[PATH_MAX] = "", fin[PATH_MAX];
    json_t *ret = NULL, *langs = NULL, *from = NULL;
    if ((uint64_t)st.st_size > m->cfg.import_max_bytes) {
        r_fail(&r, NULL, "the archive is larger than import_max_bytes=%llu",
               (unsigned long long)m->cfg.import_max_bytes);
        goto out;
    }
    if (s) {
        if (snap_path(s, "", root, sizeof root) || snap_path(s, tag, fin, sizeof fin)) {
            r_fail(&r, NULL, "the session's directory path is too long");
            goto out;
        }
        root[strlen(root) - 1] = 0; /* ".../snapshots" */
        snprintf(tmp, sizeof tmp, "%.3900s/.tmp-import-%d", root, (int)getpid());
        if (mkdir(root, 0700) && errno != EEXIST) {
            r_fail(&r, NULL, "cannot make %s: %s", root, strerror(errno));
            goto out;
        }
        session_rmtree(tmp);
        if (mkdir(tmp, 0700) == 0)
            r.outfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (r.outfd < 0) {
            r_fail(&r, NULL, "cannot make %s: %s", tmp, strerror(errno));
            goto out;
        }
        if (access(fin, F_OK) == 0) {
            r_fail(&r, NULL, "session \"%s\" already has a snapshot \"%s\"", s->name, tag);
            goto out;
        }
    }
    unsigned char h[TAR_BLOCK];
    for (;;) {
        ssize_t n = cm_read_full(fd, h, sizeof h);
        if (n == 0 && r.pos == 0) {
            r_fail(&r, NULL, "the archive is empty");
            goto out;
        }
        if (n != (ssize_t)sizeof h) {
            r_fail(&r, NULL, "the archive ends inside a header (no end-of-archive blocks)");
            goto out;
        }
        r.pos += TAR_BLOCK;
        int e = r_entry(&r, h);
        if (e < 0)
            goto out;
        if (e > 0)
            break;
    }
    if (!r.header || !r.manifest) {
        r_fail(&r, NULL, "not a kernelmgr session archive: it has no %s",
               r.header ? "snapshot/manifest.json" : SARCH_HEADER);
        goto out;
    }
    json_error_t je;
    json_t *hdr = json_loadb(r.header, r.header_len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(hdr) || !short_str(hdr, "format", 64) ||
        strcmp(short_str(hdr, "format", 64), SARCH_FORMAT) ||
        json_integer_value(json_object_get(hdr, "version")) != 1) {
        json_decref(hdr);
        r_fail(&r, NULL, "%s is not a kernelmgr session archive's (format \"%s\", version 1)",
               SARCH_HEADER, SARCH_FORMAT);
        goto out;
    }
    const char *hs = short_str(hdr, "session", KM_NAME_MAX);
    const char *hn = short_str(hdr, "node_id", 32);
    const char *ha = short_str(hdr, "exported_at", 31);
    from = json_pack("{s:s? s:s? s:s?}", "session", hs && km_name_valid(hs) ? hs : NULL, "node_id",
                     hn, "exported_at", ha);
    json_decref(hdr);
    session fake;
    const session *ms = s;
    if (!s) {
        memset(&fake, 0, sizeof fake);
        snprintf(fake.name, sizeof fake.name, "check");
        ms = &fake;
    }
    json_t *man = r_manifest(&r, ms, tag ? tag : "check", &langs);
    if (!man)
        goto out;
    if (s) {
        /* what snapshot.c reads back is there even when the archive had
         * no entry for it: the workspace copy and each kernel's directory */
        size_t li;
        json_t *lv;
        int d = r_opendir(&r, "workspace", 1);
        if (d >= 0)
            close(d);
        json_array_foreach(langs, li, lv)
        {
            int ld = r_opendir(&r, json_string_value(lv), 1);
            if (ld >= 0)
                close(ld);
        }
        json_object_set(man, "imported_from", from);
        if (snap_write_manifest(tmp, man) || rename(tmp, fin)) {
            r_fail(&r, NULL, "cannot store the imported snapshot: %s", strerror(errno));
            json_decref(man);
            goto out;
        }
        tmp[0] = 0;
    }
    json_decref(man);
    ret = json_pack("{s:O s:i s:I s:O}", "from", from, "entries", r.entries, "bytes",
                    (json_int_t)r.bytes, "kernels", langs);
out:
    if (!ret)
        km_err_set(err, KM_EINTERNAL, "%s", r.err);
    if (r.outfd >= 0) {
        close(r.outfd);
        if (tmp[0])
            session_rmtree(tmp);
    }
    json_decref(from);
    json_decref(langs);
    json_decref(r.present);
    free(r.header);
    free(r.manifest);
    return ret;
}
