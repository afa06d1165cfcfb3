/*
 * klib_files.c — workspace files: files.write in bounded pieces,
 * files.read to the end of the file, files.list (docs/API.md). Bytes go
 * as base64 both ways, so any file (binary, not UTF-8) arrives unchanged.
 */
#include "libkernelmgr/klib_int.h"

#include <stdlib.h>
#include <string.h>

/* Bytes per files.write request (its base64 is a third more) and per
 * files.read request (the daemon's maximum length). */
#define WRITE_CHUNK (4u << 20)
#define READ_CHUNK (1u << 20)

KERNELMGR_API int kernelmgr_file_write(kernelmgr_session *s, const char *path, const void *data,
                                       size_t len, unsigned flags, kernelmgr_error **err)
{
    klib_ok(err);
    if (!s || !path || (!data && len))
        return klib_fail(err, KERNELMGR_EUSAGE, 0, "files.write: %s is NULL",
                         !s      ? "the session"
                         : !path ? "the path"
                                 : "the data");
    if (flags & ~KERNELMGR_FILE_APPEND)
        return klib_fail(err, KERNELMGR_EUSAGE, 0, "files.write: unknown flags 0x%x",
                         flags & ~KERNELMGR_FILE_APPEND);
    const unsigned char *p = data;
    size_t off = 0;
    do {
        size_t n = len - off < WRITE_CHUNK ? len - off : WRITE_CHUNK;
        char *b64 = klib_b64_encode(p ? p + off : (const unsigned char *)"", n);
        json_t *jpath = json_string(path);
        json_t *prm = klib_session_params(s);
        if (!b64 || !jpath || !prm) {
            int bad_path = b64 && !jpath;
            free(b64);
            json_decref(jpath);
            json_decref(prm);
            return klib_fail(err, bad_path ? KERNELMGR_EUSAGE : KERNELMGR_EINTERNAL, 0,
                             "files.write: %s",
                             bad_path ? "the path is not UTF-8" : "out of memory");
        }
        json_object_set_new(prm, "path", jpath);
        json_object_set_new(prm, "content", json_string(b64));
        free(b64);
        json_object_set_new(prm, "encoding", json_string("base64"));
        if (off > 0 || (flags & KERNELMGR_FILE_APPEND))
            json_object_set_new(prm, "append", json_true());
        json_t *res = NULL;
        if (klib_call(s->c, "files.write", prm, NULL, &res, err))
            return -1;
        json_decref(res);
        off += n;
    } while (off < len);
    return 0;
}

KERNELMGR_API void *kernelmgr_file_read(kernelmgr_session *s, const char *path, size_t max,
                                        size_t *len, kernelmgr_error **err)
{
    klib_ok(err);
    if (len)
        *len = 0;
    if (!s || !path) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "files.read: the %s is NULL", !s ? "session" : "path");
        return NULL;
    }
    unsigned char *buf = NULL;
    size_t have = 0, cap = 0;
    for (;;) {
        json_t *prm = klib_session_params(s);
        json_t *jpath = json_string(path);
        if (!prm || !jpath || json_object_set_new(prm, "path", jpath)) {
            json_decref(prm);
            free(buf);
            klib_fail(err, KERNELMGR_EUSAGE, 0, "files.read: the path is not UTF-8");
            return NULL;
        }
        json_object_set_new(prm, "offset", json_integer((json_int_t)have));
        json_object_set_new(prm, "length", json_integer(READ_CHUNK));
        json_object_set_new(prm, "encoding", json_string("base64"));
        json_t *res = NULL;
        if (klib_call(s->c, "files.read", prm, NULL, &res, err)) {
            free(buf);
            return NULL;
        }
        json_t *size = json_object_get(res, "size");
        json_t *content = json_object_get(res, "content");
        const char *enc = json_string_value(json_object_get(res, "encoding"));
        if (!json_is_integer(size) || !json_is_string(content) || !enc || strcmp(enc, "base64")) {
            json_decref(res);
            free(buf);
            klib_fail(err, KERNELMGR_EDAEMON, 0,
                      "files.read: the daemon's result lacks size, content or base64 encoding");
            return NULL;
        }
        if (max && (json_int_t)max < json_integer_value(size)) {
            klib_fail(err, KERNELMGR_EUSAGE, 0,
                      "files.read: %s is %lld bytes, more than the limit of %zu bytes given", path,
                      (long long)json_integer_value(size), max);
            json_decref(res);
            free(buf);
            return NULL;
        }
        size_t clen = json_string_length(content);
        if (cap - have < clen / 4 * 3 + 1) {
            size_t ncap = have + clen / 4 * 3 + 1;
            unsigned char *nb = realloc(buf, ncap);
            if (!nb) {
                json_decref(res);
                free(buf);
                klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
                return NULL;
            }
            buf = nb;
            cap = ncap;
        }
        long long got = klib_b64_decode(json_string_value(content), clen, buf + have);
        int eof = json_is_true(json_object_get(res, "eof"));
        json_decref(res);
        if (got < 0) {
            free(buf);
            klib_fail(err, KERNELMGR_EDAEMON, 0, "files.read: the daemon sent invalid base64");
            return NULL;
        }
        have += (size_t)got;
        if (max && have > max) {
            free(buf);
            klib_fail(err, KERNELMGR_EUSAGE, 0,
                      "files.read: %s grew past the limit of %zu bytes given while it was read",
                      path, max);
            return NULL;
        }
        if (eof || got == 0)
            break;
    }
    if (!buf && !(buf = malloc(1))) {
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return NULL;
    }
    buf[have] = 0;
    if (len)
        *len = have;
    return buf;
}

KERNELMGR_API kernelmgr_filelist *kernelmgr_file_list(kernelmgr_session *s, const char *subdir,
                                                      kernelmgr_error **err)
{
    klib_ok(err);
    if (!s) {
        klib_fail(err, KERNELMGR_EUSAGE, 0, "files.list: the session is NULL");
        return NULL;
    }
    json_t *prm = klib_session_params(s);
    if (prm && subdir && json_object_set_new(prm, "path", json_string(subdir))) {
        json_decref(prm);
        klib_fail(err, KERNELMGR_EUSAGE, 0, "files.list: the path is not UTF-8");
        return NULL;
    }
    json_t *res = NULL;
    if (klib_call(s->c, "files.list", prm, NULL, &res, err))
        return NULL;
    kernelmgr_filelist *l = calloc(1, sizeof *l);
    if (!l || !json_is_array(json_object_get(res, "files")) ||
        !(l->json = json_dumps(res, JSON_COMPACT))) {
        klib_fail(err, l ? KERNELMGR_EDAEMON : KERNELMGR_EINTERNAL, 0, "files.list: %s",
                  l ? "the daemon's result has no files array" : "out of memory");
        free(l);
        json_decref(res);
        return NULL;
    }
    l->root = res;
    l->files = json_object_get(res, "files");
    return l;
}
