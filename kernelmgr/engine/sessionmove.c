/*
 * sessionmove.c — km_session_export and km_session_import (km.h): a
 * session's archive (sessionarch.h) built under the session's lock and read
 * back in chunks, and an upload in chunks into the home's imports/
 * directory, checked and extracted into a new session whose next exec
 * restores the archive's kernel states.
 */
#include "kernelmgr/engine/km.h"

#include "common/cm_io.h"
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"
#include "kernelmgr/engine/sessionarch.h"
#include "kernelmgr/engine/snapshot.h"
#include "kernelmgr/engine/wsfile.h"

#include <sodium.h>

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

#define EXPORT_TAG "export"   /* the snapshot an export takes (removed once archived) */
#define IMPORT_TAG "imported" /* the snapshot an import makes */
#define ARCHIVE_ID_LEN 16
#define UPLOADS_MAX 8       /* session imports in progress at once */
#define UPLOAD_IDLE_MAX 600 /* seconds an upload may wait for its next chunk */

/* uploads in progress: one writer at a time */
static pthread_mutex_t upload_mu = PTHREAD_MUTEX_INITIALIZER;

static int archive_id_ok(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n != ARCHIVE_ID_LEN)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
            return 0;
    return 1;
}

/* Removes s's archives (export-*.tar) but keep (NULL: all). */
static void remove_archives(const session *s, const char *keep)
{
    DIR *d = opendir(s->dir);
    if (!d)
        return;
    struct dirent *e;
    int dfd = dirfd(d);
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "export-", 7) || (keep && !strcmp(e->d_name, keep)))
            continue;
        unlinkat(dfd, e->d_name, 0);
    }
    closedir(d);
}

/* Builds a new archive of s (locked) as s->dir/export-ID.tar; id out. */
static json_t *build_archive(km_manager *m, session *s, char id[ARCHIVE_ID_LEN + 1], km_err *err)
{
    km_err why = {0};
    json_t *man = snap_take(m, s, EXPORT_TAG, 1, "export", &why);
    if (!man) {
        km_err_set(err, strstr(why.msg, "snapshot_max") ? KM_EUSAGE : KM_EINTERNAL,
                   "export of \"%s\": %s", s->name, why.msg);
        return NULL;
    }
    json_decref(man);
    char snapdir[PATH_MAX];
    snap_path(s, EXPORT_TAG, snapdir, sizeof snapdir);
    json_t *info = NULL;
    if (snap_adopt_pending(m, s, EXPORT_TAG, &why)) {
        km_err_set(err, KM_EINTERNAL, "export of \"%s\": %s (nothing was exported)", s->name,
                   why.msg);
        goto out;
    }
    man = snap_manifest(s, EXPORT_TAG, &why);
    json_t *failed = json_incref(json_object_get(man, "failed"));
    json_t *langs = json_array();
    const char *ln;
    json_t *v;
    json_object_foreach(json_object_get(man, "kernels"), ln, v)
    {
        json_array_append_new(langs, json_string(ln));
    }
    json_decref(man);
    unsigned char rnd[ARCHIVE_ID_LEN / 2];
    randombytes_buf(rnd, sizeof rnd);
    sodium_bin2hex(id, ARCHIVE_ID_LEN + 1, rnd, sizeof rnd);
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    char at[32];
    strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &tm);
    const char *node = m->cfg.node_id;
    json_t *hdr =
        json_pack("{s:s s:i s:s s:s? s:s s:O}", "format", SARCH_FORMAT, "version", 1, "session",
                  s->name, "node_id", node[0] ? node : NULL, "exported_at", at, "kernels", langs);
    char tmp[PATH_MAX], fin[PATH_MAX];
    snprintf(fin, sizeof fin, "%.3900s/export-%s.tar", s->dir, id);
    snprintf(tmp, sizeof tmp, "%.3900s/.export-%s.tmp", s->dir, id);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    info = json_object();
    if (fd < 0) {
        km_err_set(err, KM_EINTERNAL, "cannot make %s: %s", tmp, strerror(errno));
        json_decref(info);
        info = NULL;
    } else if (sarch_write(m, s, EXPORT_TAG, hdr, fd, info, &why)) {
        km_err_set(err, KM_EINTERNAL, "export of \"%s\": %s", s->name, why.msg);
        json_decref(info);
        info = NULL;
    }
    if (fd >= 0 && close(fd) && info) {
        km_err_set(err, KM_EINTERNAL, "cannot write %s: %s", tmp, strerror(errno));
        json_decref(info);
        info = NULL;
    }
    if (info) {
        remove_archives(s, NULL);
        if (rename(tmp, fin)) {
            km_err_set(err, KM_EINTERNAL, "cannot store %s: %s", fin, strerror(errno));
            json_decref(info);
            info = NULL;
        } else {
            json_object_set(info, "kernels", langs);
            if (json_object_size(failed)) /* a kernel whose state could not be saved */
                json_object_set(info, "failed", failed);
        }
    }
    if (!info)
        unlink(tmp);
    json_decref(hdr);
    json_decref(langs);
    json_decref(failed);
out:
    session_rmtree(snapdir); /* the archive holds it; the store keeps no second copy */
    return info;
}

json_t *km_session_export(km_manager *m, const char *name, const char *archive, uint64_t offset,
                          uint64_t length, km_err *err)
{
    if (!km_name_valid(name)) {
        km_err_set(err, KM_EUSAGE, "invalid session name \"%s\"", name ? name : "");
        return NULL;
    }
    if (archive && !archive_id_ok(archive)) {
        km_err_set(err, KM_EUSAGE, "field \"archive\": not an archive id (%d hex digits)",
                   ARCHIVE_ID_LEN);
        return NULL;
    }
    if (!archive && offset) {
        km_err_set(err, KM_EUSAGE,
                   "field \"archive\": a read at an offset names the archive the first call made");
        return NULL;
    }
    if (length == 0 || length > KM_ARCHIVE_CHUNK_MAX)
        length = KM_ARCHIVE_CHUNK_MAX;
    session *s = session_ref(m, name);
    if (!s) {
        km_err_set(err, KM_ENOSESSION, "no session named \"%s\"", name);
        return NULL;
    }
    char id[ARCHIVE_ID_LEN + 1];
    json_t *info = NULL;
    if (!archive) {
        pthread_mutex_lock(&s->lock);
        if (s->gone)
            km_err_set(err, KM_ENOSESSION, "session \"%s\" was closed", name);
        else
            info = build_archive(m, s, id, err);
        pthread_mutex_unlock(&s->lock);
        if (!info) {
            session_put(m, s);
            return NULL;
        }
    } else {
        snprintf(id, sizeof id, "%s", archive);
    }
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%.3900s/export-%s.tar", s->dir, id);
    session_put(m, s);
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        json_decref(info);
        km_err_set(
            err, KM_EUSAGE,
            "session \"%s\" has no archive \"%s\" (a newer export replaced it, or the session "
            "was closed): export again from offset 0",
            name, id);
        return NULL;
    }
    uint64_t size = (uint64_t)st.st_size;
    uint64_t n = offset >= size ? 0 : size - offset < length ? size - offset : length;
    unsigned char *buf = malloc(n ? n : 1);
    size_t b64len = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(b64len);
    ssize_t got = buf && b64 ? pread(fd, buf, n, (off_t)offset) : -1;
    close(fd);
    json_t *o = NULL;
    if (got != (ssize_t)n) {
        km_err_set(err, KM_EINTERNAL, "cannot read %s: %s", p, got < 0 ? strerror(errno) : "short");
    } else {
        sodium_bin2base64(b64, b64len, buf, n, sodium_base64_VARIANT_ORIGINAL);
        o = json_pack("{s:s s:s s:I s:I s:I s:s s:b}", "session", name, "archive", id, "size",
                      (json_int_t)size, "offset", (json_int_t)offset, "length", (json_int_t)n,
                      "data", b64, "eof", offset + n >= size);
        if (o && info)
            json_object_update(o, info);
    }
    free(buf);
    free(b64);
    json_decref(info);
    return o;
}

/* The upload file of session name: home/imports/NAME.part. 0 or -1. */
static int upload_path(km_manager *m, const char *name, char *out, size_t size, km_err *err)
{
    char dir[PATH_MAX];
    km_err why = {0};
    snprintf(dir, sizeof dir, "%.3900s/imports", m->home);
    if (kmhome_mkdir(dir, 0700, &why)) {
        km_err_set(err, KM_EINTERNAL, "%s", why.msg);
        return -1;
    }
    int n = snprintf(out, size, "%s/%s.part", dir, name);
    if (n < 0 || (size_t)n >= size) {
        km_err_set(err, KM_EINTERNAL, "the home's path is too long");
        return -1;
    }
    return 0;
}

/* Before a new upload: uploads idle for UPLOAD_IDLE_MAX seconds are
 * dropped; then at most UPLOADS_MAX may be in progress. 0, or -1 with err. */
static int uploads_room(km_manager *m, km_err *err)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%.3900s/imports", m->home);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0, dfd = dirfd(d);
    time_t now = time(NULL);
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (e->d_name[0] == '.' || fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW))
            continue;
        if (now - st.st_mtime > UPLOAD_IDLE_MAX)
            unlinkat(dfd, e->d_name, 0);
        else
            n++;
    }
    closedir(d);
    if (n < UPLOADS_MAX)
        return 0;
    km_err_set(err, KM_EUSAGE,
               "%d session imports are in progress, the most this daemon takes at once: finish "
               "one (an upload idle for %d s is dropped)",
               n, UPLOAD_IDLE_MAX);
    return -1;
}

/* Makes session name from the checked archive open as fd. */
static json_t *import_archive(km_manager *m, const char *name, const km_session_opts *sopts, int fd,
                              km_err *err)
{
    km_err why = {0};
    json_t *checked = sarch_read(m, NULL, fd, NULL, &why);
    if (!checked) {
        km_err_set(err, KM_EUSAGE, "import of session \"%s\" refused: %s", name, why.msg);
        return NULL;
    }
    json_decref(checked);
    json_t *created = km_session_create(m, name, sopts, err);
    if (!created)
        return NULL;
    int made = json_is_true(json_object_get(created, "created"));
    json_decref(created);
    if (!made) { /* made meanwhile by another request: never written into */
        km_err_set(
            err, KM_EUSAGE,
            "session \"%s\" exists: an import makes a new session (import under another name, "
            "or close it first)",
            name);
        return NULL;
    }
    session *d = session_ref(m, name);
    if (!d) {
        km_err_set(err, KM_EINTERNAL, "the new session \"%s\" went away", name);
        return NULL;
    }
    json_t *ret = NULL;
    pthread_mutex_lock(&d->lock);
    json_t *got = sarch_read(m, d, fd, IMPORT_TAG, &why);
    if (!got) {
        km_err_set(err, KM_EUSAGE, "import of session \"%s\" refused: %s", name, why.msg);
    } else if (snap_restore_workspace(m, d, IMPORT_TAG, &why)) {
        km_err_set(err, KM_EINTERNAL, "import of session \"%s\": %s", name, why.msg);
    } else {
        json_t *kernels = json_object();
        for (int l = 0; l < m->cfg.langs.n; l++) {
            if (!snap_has(m, d, l, IMPORT_TAG))
                continue;
            kslot *k = &d->k[l];
            const char *ln = kmcfg_lang_name(&m->cfg, l);
            if (k->proc && klaunch_alive(k->proc)) { /* a warm-pool entry's kernel */
                json_t *r = snap_load(m, d, l, IMPORT_TAG, &why);
                json_object_set_new(kernels, ln,
                                    r ? json_pack("{s:o}", "restored", r)
                                      : json_pack("{s:s}", "error", why.msg));
            } else {
                snprintf(k->restore, sizeof k->restore, "%s", IMPORT_TAG);
                snprintf(k->pending, sizeof k->pending,
                         "imported from a session archive: the %s kernel is a fresh one", ln);
                json_object_set_new(kernels, ln, json_pack("{s:b}", "pending", 1));
            }
        }
        session_save(m, d);
        ret = json_pack("{s:s s:s s:O s:o s:O s:O s:s}", "session", d->name, "tag", IMPORT_TAG,
                        "from", json_object_get(got, "from"), "kernels", kernels, "entries",
                        json_object_get(got, "entries"), "bytes", json_object_get(got, "bytes"),
                        "workspace", d->workspace);
    }
    json_decref(got);
    pthread_mutex_unlock(&d->lock);
    session_put(m, d);
    if (!ret) {
        km_err e2;
        km_close(m, name, 0, &e2);
    }
    return ret;
}

json_t *km_session_import(km_manager *m, const char *name, const km_session_opts *sopts,
                          uint64_t offset, const void *data, size_t len, int final, km_err *err)
{
    if (!km_name_valid(name)) {
        km_err_set(err, KM_EUSAGE, "invalid session name \"%s\"", name ? name : "");
        return NULL;
    }
    session *s = session_ref(m, name);
    if (s) {
        session_put(m, s);
        km_err_set(
            err, KM_EUSAGE,
            "session \"%s\" exists: an import makes a new session (import under another name, "
            "or close it first)",
            name);
        return NULL;
    }
    if (km_draining(m)) {
        const char *node = m->cfg.node_id;
        km_err_set(
            err, KM_EDAEMON,
            "node \"%s\" is draining: it makes no new sessions (session \"%s\" does not exist "
            "here); its existing sessions keep working",
            node[0] ? node : "this daemon", name);
        return NULL;
    }
    char p[PATH_MAX];
    if (upload_path(m, name, p, sizeof p, err))
        return NULL;
    pthread_mutex_lock(&upload_mu);
    json_t *ret = NULL;
    if (offset == 0 && uploads_room(m, err)) {
        pthread_mutex_unlock(&upload_mu);
        return NULL;
    }
    int flags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC | (offset == 0 ? O_CREAT | O_TRUNC : 0);
    int fd = open(p, flags, 0600);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        if (errno == ENOENT)
            km_err_set(err, KM_EUSAGE,
                       "no upload of session \"%s\" is in progress: send the archive from offset 0",
                       name);
        else
            km_err_set(err, KM_EINTERNAL, "cannot write %s: %s", p, strerror(errno));
        goto out;
    }
    if ((uint64_t)st.st_size != offset) {
        km_err_set(err, KM_EUSAGE,
                   "field \"offset\": the upload of session \"%s\" holds %llu bytes, so the next "
                   "chunk is at offset %llu (got %llu)",
                   name, (unsigned long long)st.st_size, (unsigned long long)st.st_size,
                   (unsigned long long)offset);
        goto out;
    }
    if (offset + len > m->cfg.import_max_bytes) {
        km_err_set(
            err, KM_EUSAGE,
            "the archive of session \"%s\" is larger than import_max_bytes=%llu; nothing was "
            "imported",
            name, (unsigned long long)m->cfg.import_max_bytes);
        unlink(p);
        goto out;
    }
    if (len && (lseek(fd, (off_t)offset, SEEK_SET) < 0 || cm_write_all(fd, data, len))) {
        km_err_set(err, KM_EINTERNAL, "cannot write %s: %s", p, strerror(errno));
        unlink(p);
        goto out;
    }
    if (!final) {
        ret = json_pack("{s:s s:I}", "session", name, "received", (json_int_t)(offset + len));
        goto out;
    }
    close(fd);
    fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        km_err_set(err, KM_EINTERNAL, "cannot read %s: %s", p, strerror(errno));
        goto out;
    }
    ret = import_archive(m, name, sopts, fd, err);
    unlink(p);
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&upload_mu);
    return ret;
}
