/*
 * cli_files.c — `kernelmgr files get|put|ls|rm` and `session export|import`:
 * files and archives of any size, in chunks, through the daemon.
 */
#include "kernelmgr/frontends/cli.h"
#include "kernelmgr/frontends/cli_int.h"
#include "kernelmgr/service/daemon.h"
#include "common/cm_io.h"

#include <sodium.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* `kernelmgr files get|put|ls|rm`: files of any size through the API's
 * files.* methods, in chunks on one connection. files.read returns at most
 * 1 MiB per call; a files.write is one request line of at most 64 MiB, so
 * a put sends 4 MiB (5.4 MiB of base64) per call. */
#define FILES_READ_CHUNK ((json_int_t)1 << 20)
#define FILES_WRITE_CHUNK ((size_t)4 << 20)

/* One files.* call (params stolen) on fd; the exit status, *rep (new) on
 * success; a failure said as cli_call() says it (with --json also on stdout),
 * prefixed with what was being done. */
static int files_rpc(cli *c, int fd, const char *method, json_t *params, const char *doing,
                     json_t **rep)
{
    km_err err = {0, ""};
    int rc = daemon_call(fd, method, params, NULL, rep, &err);
    if (!rc)
        return 0;
    char msg[sizeof err.msg + 512];
    snprintf(msg, sizeof msg, "%s: %s", doing, err.msg);
    if (c->json) {
        json_t *e = json_pack("{s:{s:i s:s}}", "error", "code", rc, "message", msg);
        cli_print_json(e);
        json_decref(e);
    }
    return cli_fail(rc, msg);
}

static int files_local_error(cli *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int files_local_error(cli *c, int code, const char *fmt, ...)
{
    char msg[4096 + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->json) {
        json_t *e = json_pack("{s:{s:i s:s}}", "error", "code", code, "message", msg);
        cli_print_json(e);
        json_decref(e);
    }
    return cli_fail(code, msg);
}

/* Opens local ("-": stdin) to be read whole: a regular file, or stdin;
 * *in the descriptor (close_local() it). 0, or the exit status said. */
static int open_local(cli *c, const char *local, int *in)
{
    int from_stdin = !strcmp(local, "-");
    *in = from_stdin ? 0 : open(local, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat lst;
    if (*in < 0)
        return files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local, strerror(errno));
    if (!from_stdin && (fstat(*in, &lst) || !S_ISREG(lst.st_mode))) {
        close(*in);
        return files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local,
                                 S_ISDIR(lst.st_mode) ? "it is a directory" : "not a regular file");
    }
    if (!from_stdin)
        fcntl(*in, F_SETFL, fcntl(*in, F_GETFL) & ~O_NONBLOCK);
    return 0;
}

static void close_local(int in)
{
    if (in != 0)
        close(in);
}

/* One chunk's request (new; NULL: nothing to send, the upload is done):
 * b64 the chunk of n bytes at offset, final when it is the last. */
typedef json_t *(*upload_req_fn)(void *ud, const char *b64, size_t n, json_int_t offset, int final);

/* Sends in (read from local) to the daemon chunk by chunk on one
 * connection, each chunk one method call of req's; the exit status (said,
 * prefixed with doing), *sent the bytes the daemon took, *rep the last
 * reply (new, NULL on failure). in stays open. */
static int upload(cli *c, int in, const char *local, const char *method, upload_req_fn req,
                  void *ud, const char *doing, json_int_t *sent, json_t **rep)
{
    *sent = 0;
    *rep = NULL;
    km_err err = {0, ""};
    int fd = cli_connect_daemon(c, 1, &err);
    if (fd < 0)
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    unsigned char *buf = malloc(FILES_WRITE_CHUNK);
    size_t b64cap = sodium_base64_ENCODED_LEN(FILES_WRITE_CHUNK, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(b64cap);
    int st = buf && b64 ? 0 : files_local_error(c, KM_EINTERNAL, "out of memory");
    while (!st) {
        ssize_t n = cm_read_full(in, buf, FILES_WRITE_CHUNK);
        if (n < 0) {
            st = files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local, strerror(errno));
            break;
        }
        int final = (size_t)n < FILES_WRITE_CHUNK;
        sodium_bin2base64(b64, b64cap, buf, (size_t)n, sodium_base64_VARIANT_ORIGINAL);
        json_t *params = req(ud, b64, (size_t)n, *sent, final);
        if (!params)
            break;
        json_t *r = NULL;
        st = files_rpc(c, fd, method, params, doing, &r);
        if (st)
            break;
        json_decref(*rep);
        *rep = r;
        *sent += n;
        if (final)
            break;
    }
    if (st) {
        json_decref(*rep);
        *rep = NULL;
    }
    free(buf);
    free(b64);
    close(fd);
    return st;
}

static const char *last_component(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* The session NAME and the path argument of files get|put|rm, checked. */
static int files_args(cli *c, int min, int max, const char *usage)
{
    if (c->npos < min || c->npos > max)
        return cli_usage_error("usage: kernelmgr %s", usage);
    if (!km_name_valid(c->pos[0]))
        return cli_usage_error("invalid session name \"%s\"", c->pos[0]);
    return 0;
}

/* One chunk's request (new) at offset; first: the first chunk's reply
 * (NULL for the first request). */
typedef json_t *(*download_req_fn)(void *ud, json_int_t offset, const json_t *first);

/* Receives a file from the daemon chunk by chunk on one connection (each a
 * method call of req's whose reply carries base64 in field, "eof" and, in
 * the first, "size": the file as it was when the read began, so one a cell
 * keeps appending to does not keep the read going) into local ("-":
 * stdout). A file is written to a temporary beside it with mode and
 * renamed into place only when complete: nothing half-written is left
 * behind; the temporary is made once the first reply has come, so that a
 * refusal by the daemon (no such file, no session) is said whatever the
 * local directory is. The exit status (said; shown names local in messages), *total
 * the bytes written, *first the first reply (new, NULL when none came). */
static int download(cli *c, const char *method, const char *field, download_req_fn req, void *ud,
                    const char *local, const char *shown, mode_t mode, const char *doing,
                    json_int_t *total, json_t **first)
{
    *total = 0;
    *first = NULL;
    int to_stdout = !strcmp(local, "-");
    km_err err = {0, ""};
    int fd = cli_connect_daemon(c, 1, &err);
    if (fd < 0)
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    char tmp[4200];
    const char *base = last_component(local);
    snprintf(tmp, sizeof tmp, "%.*s.%s.kmpart.XXXXXX", (int)(base - local), local, base);
    int out = to_stdout ? 1 : -1, st = 0;
    json_int_t size = -1;
    for (;;) {
        json_t *rep;
        st = files_rpc(c, fd, method, req(ud, *total, *first), doing, &rep);
        if (st)
            break;
        const char *b64 = json_string_value(json_object_get(rep, field));
        size_t b64len = json_string_length(json_object_get(rep, field));
        int eof = json_is_true(json_object_get(rep, "eof"));
        if (!*first) {
            size = json_integer_value(json_object_get(rep, "size"));
            *first = json_incref(rep);
        }
        unsigned char *bin = malloc(b64len / 4 * 3 + 3);
        size_t n = 0;
        int bad = !b64 || !bin ||
                  sodium_base642bin(bin, b64len / 4 * 3 + 3, b64, b64len, NULL, &n, NULL,
                                    sodium_base64_VARIANT_ORIGINAL) != 0;
        json_decref(rep);
        if (bad) {
            free(bin);
            st = files_local_error(c, KM_EDAEMON, "%s: the daemon sent %s that is not base64",
                                   doing, field);
            break;
        }
        if (out < 0 && (out = mkstemp(tmp)) < 0) {
            free(bin);
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", shown, strerror(errno));
            break;
        }
        int werr = n && cm_write_all(out, bin, n) ? errno : 0;
        free(bin);
        if (werr) {
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", shown, strerror(werr));
            break;
        }
        *total += (json_int_t)n;
        if (eof || n == 0 || *total >= size)
            break;
    }
    close(fd);
    if (!to_stdout && out >= 0) {
        if (!st && (fchmod(out, mode) || fsync(out)))
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", shown, strerror(errno));
        if (close(out) && !st)
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", shown, strerror(errno));
        if (!st && rename(tmp, local))
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", shown, strerror(errno));
        if (st)
            unlink(tmp);
    }
    return st;
}

/* files get NAME PATH [-o LOCAL]: LOCAL (default: PATH's last component
 * here; a directory: that name in it; "-": stdout) is written to a
 * temporary file beside it and renamed into place only when complete. */
/* files.read's request for the chunk at offset. */
typedef struct get_source {
    const char *name, *path;
} get_source;

static json_t *get_chunk(void *ud, json_int_t offset, const json_t *first)
{
    (void)first;
    const get_source *g = ud;
    return json_pack("{s:s s:s s:I s:I s:s}", "session", g->name, "path", g->path, "offset", offset,
                     "length", FILES_READ_CHUNK, "encoding", "base64");
}

int cli_cmd_files_get(cli *c)
{
    int st = files_args(c, 2, 2, "files get NAME PATH [-o LOCAL]");
    if (st)
        return st;
    const char *name = c->pos[0], *path = c->pos[1];
    const char *o = c->output ? c->output : last_component(path);
    if (!*o)
        return cli_usage_error("files get: PATH \"%s\" names no file (give -o LOCAL)", path);
    int to_stdout = !strcmp(o, "-");
    char local[4096];
    struct stat lst;
    if (!to_stdout && !stat(o, &lst) && S_ISDIR(lst.st_mode))
        snprintf(local, sizeof local, "%s/%s", o, last_component(path));
    else
        snprintf(local, sizeof local, "%s", o);
    char doing[4200];
    snprintf(doing, sizeof doing, "cannot read %s from session \"%s\"", path, name);
    mode_t um = umask(0);
    umask(um);
    get_source g = {name, path};
    json_int_t total;
    json_t *first;
    st = download(c, "files.read", "content", get_chunk, &g, local,
                  to_stdout ? "the output" : local, 0666 & ~um, doing, &total, &first);
    json_decref(first);
    if (st || to_stdout)
        return st;
    if (c->json) {
        json_t *r = json_pack("{s:s s:s s:s s:I}", "session", name, "path", path, "local", local,
                              "size", total);
        cli_print_json(r);
        json_decref(r);
    } else {
        printf("wrote %s (%lld bytes from %s:%s)\n", local, (long long)total, name, path);
    }
    return 0;
}

/* files put NAME LOCAL [PATH]: LOCAL ("-": stdin) to PATH (default LOCAL's
 * last component) in the session's workspace, replacing it. */
/* files.write's request for a chunk: the first replaces PATH, the others
 * append; an empty chunk after the first is nothing to send. */
typedef struct put_target {
    const char *name, *path;
} put_target;

static json_t *put_chunk(void *ud, const char *b64, size_t n, json_int_t offset, int final)
{
    (void) final;
    const put_target *t = ud;
    if (n == 0 && offset > 0)
        return NULL;
    return json_pack("{s:s s:s s:s s:s s:b}", "session", t->name, "path", t->path, "content", b64,
                     "encoding", "base64", "append", offset > 0);
}

int cli_cmd_files_put(cli *c)
{
    int st = files_args(c, 2, 3, "files put NAME LOCAL [PATH]");
    if (st)
        return st;
    const char *name = c->pos[0], *local = c->pos[1];
    int from_stdin = !strcmp(local, "-");
    const char *path = c->npos > 2 ? c->pos[2] : from_stdin ? NULL : last_component(local);
    if (!path || !*path)
        return cli_usage_error("files put: give the workspace PATH (files put NAME %s PATH)",
                               local);
    int in;
    if ((st = open_local(c, local, &in)))
        return st;
    char doing[4200];
    snprintf(doing, sizeof doing, "cannot write %s in session \"%s\"", path, name);
    put_target t = {name, path};
    json_int_t total;
    json_t *rep;
    st = upload(c, in, local, "files.write", put_chunk, &t, doing, &total, &rep);
    close_local(in);
    json_decref(rep);
    if (st) {
        if (total)
            fprintf(stderr, "kernelmgr: %s in session \"%s\" holds the first %lld bytes of %s\n",
                    path, name, (long long)total, local);
        return st;
    }
    if (c->json) {
        json_t *r = json_pack("{s:s s:s s:s s:I}", "session", name, "path", path, "local", local,
                              "size", total);
        cli_print_json(r);
        json_decref(r);
    } else {
        printf("wrote %s:%s (%lld bytes from %s)\n", name, path, (long long)total,
               from_stdin ? "stdin" : local);
    }
    return 0;
}

/* session export NAME FILE: the session's archive (session.export, chunk by
 * chunk on one connection) into FILE ("-": stdout), written beside it and
 * renamed into place only when complete. */
/* session.export's request for the chunk at offset: after the first, of
 * the archive the first reply named. */
static json_t *export_chunk(void *ud, json_int_t offset, const json_t *first)
{
    json_t *req = json_pack("{s:s s:I}", "session", (const char *)ud, "offset", offset);
    const char *archive = json_string_value(json_object_get(first, "archive"));
    if (archive && *archive)
        json_object_set_new(req, "archive", json_string(archive));
    return req;
}

int cli_cmd_session_export(cli *c)
{
    int st = files_args(c, 2, 2, "session export NAME FILE");
    if (st)
        return st;
    const char *name = c->pos[0], *local = c->pos[1];
    int to_stdout = !strcmp(local, "-");
    char doing[200];
    snprintf(doing, sizeof doing, "cannot export session \"%s\"", name);
    json_int_t off;
    json_t *first;
    st = download(c, "session.export", "data", export_chunk, (void *)name, local, local, 0600,
                  doing, &off, &first);
    if (!st && !to_stdout) {
        json_t *skipped = json_object_get(first, "skipped");
        if (c->json) {
            json_t *r =
                json_pack("{s:s s:s s:I s:O* s:O*}", "session", name, "file", local, "size", off,
                          "kernels", json_object_get(first, "kernels"), "skipped", skipped);
            cli_print_json(r);
            json_decref(r);
        } else {
            printf("exported session %s to %s (%lld bytes", name, local, (long long)off);
            size_t i;
            json_t *v;
            json_array_foreach(json_object_get(first, "kernels"), i, v)
            {
                printf("%s%s", i ? ", " : "; the state of its kernels: ", json_string_value(v));
            }
            puts(")");
            json_array_foreach(skipped, i, v)
            {
                printf("  not in the archive: %s (%s)\n",
                       json_string_value(json_object_get(v, "path")),
                       json_string_value(json_object_get(v, "reason")));
            }
        }
    }
    json_decref(first);
    return st;
}

/* The session name an archive was exported with: its first entry,
 * kernelmgr-session.json (the daemon checks the whole archive again). */
static int archive_session_name(int in, char *out, size_t size)
{
    unsigned char h[512];
    if (pread(in, h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h, "kernelmgr-session.json", 23))
        return -1;
    char sz[13];
    memcpy(sz, h + 124, 12);
    sz[12] = 0;
    unsigned long long n = strtoull(sz, NULL, 8);
    if (n == 0 || n > 65536)
        return -1;
    char *buf = malloc(n);
    int rc = -1;
    if (buf && pread(in, buf, n, 512) == (ssize_t)n) {
        json_error_t je;
        json_t *o = json_loadb(buf, n, 0, &je);
        const char *nm = json_string_value(json_object_get(o, "session"));
        if (nm && km_name_valid(nm)) {
            snprintf(out, size, "%s", nm);
            rc = 0;
        }
        json_decref(o);
    }
    free(buf);
    return rc;
}

/* session import FILE [NAME]: FILE ("-": stdin) to session.import in
 * chunks on one connection; NAME defaults to the name it was exported
 * with. */
/* session.import's request for a chunk of the archive. */
static json_t *import_chunk(void *ud, const char *b64, size_t n, json_int_t offset, int final)
{
    (void)n;
    return json_pack("{s:s s:s s:I s:b}", "session", (const char *)ud, "data", b64, "offset",
                     offset, "final", final);
}

int cli_cmd_session_import(cli *c)
{
    if (c->npos < 1 || c->npos > 2)
        return cli_usage_error("usage: kernelmgr session import FILE [NAME]");
    const char *local = c->pos[0];
    int from_stdin = !strcmp(local, "-");
    int in, st;
    if ((st = open_local(c, local, &in)))
        return st;
    char name[KM_NAME_MAX + 1];
    if (c->npos > 1) {
        snprintf(name, sizeof name, "%s", c->pos[1]);
    } else if (from_stdin || archive_session_name(in, name, sizeof name)) {
        close_local(in);
        return cli_usage_error("session import: give the NAME of the new session (%s names none)",
                               local);
    }
    if (!km_name_valid(name)) {
        close_local(in);
        return cli_usage_error("invalid session name \"%s\"", name);
    }
    char doing[200];
    snprintf(doing, sizeof doing, "cannot import session \"%s\" from %.100s", name, local);
    json_int_t total;
    json_t *rep;
    st = upload(c, in, local, "session.import", import_chunk, name, doing, &total, &rep);
    close_local(in);
    if (!st) {
        if (c->json) {
            cli_print_json(rep);
        } else {
            printf("imported session %s from %s (%lld bytes); its next exec restores", name,
                   from_stdin ? "stdin" : local, (long long)total);
            const char *ln;
            json_t *v;
            int any = 0;
            json_object_foreach(json_object_get(rep, "kernels"), ln, v)
            {
                printf("%s%s", any++ ? ", " : " the ", ln);
            }
            puts(any ? " state and its files" : " its files");
        }
    }
    json_decref(rep);
    return st;
}

/* files ls NAME [PATH]: as `files NAME`, below PATH when given. */
int cli_cmd_files_ls(cli *c)
{
    int st = files_args(c, 1, 2, "files ls NAME [PATH]");
    if (st)
        return st;
    json_t *req = json_pack("{s:s}", "session", c->pos[0]);
    if (c->npos > 1)
        json_object_set_new(req, "path", json_string(c->pos[1]));
    json_t *rep;
    st = cli_call(c, "files.list", req, 1, NULL, NULL, &rep);
    if (st)
        return st;
    st = cli_print_files(c, c->pos[0], rep);
    json_decref(rep);
    return st;
}

/* files rm NAME PATH: a file, a symbolic link or an empty directory. */
int cli_cmd_files_rm(cli *c)
{
    int st = files_args(c, 2, 2, "files rm NAME PATH");
    if (st)
        return st;
    km_err err = {0, ""};
    int fd = cli_connect_daemon(c, 1, &err);
    if (fd < 0)
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    char doing[4200];
    snprintf(doing, sizeof doing, "cannot remove %s from session \"%s\"", c->pos[1], c->pos[0]);
    json_t *rep;
    st = files_rpc(c, fd, "files.remove",
                   json_pack("{s:s s:s}", "session", c->pos[0], "path", c->pos[1]), doing, &rep);
    close(fd);
    if (st)
        return st;
    if (c->json)
        cli_print_json(rep);
    else
        printf("removed %s:%s\n", c->pos[0], json_string_value(json_object_get(rep, "path")));
    json_decref(rep);
    return 0;
}
