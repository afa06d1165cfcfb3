/*
 * klib_result.c — the accessors of an exec result (docs/CLI.md "The
 * result") and of a files.list listing. Everything is read from the
 * daemon's JSON as it came; an index out of range or a key of the wrong
 * type reads as absent (NULL, 0, -1), never as a crash.
 */
#include "libkernelmgr/klib_int.h"

#include <stdlib.h>
#include <string.h>

/* A MIME bundle's values that are not strings (application/json) become
 * their JSON text, so kernelmgr_result_output_data returns text for each. */
static void flatten(json_t *bundle)
{
    const char *k;
    json_t *v;
    json_object_foreach(bundle, k, v)
    {
        if (json_is_string(v))
            continue;
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (s)
            json_object_set_new(bundle, k, json_string(s));
        free(s);
    }
}

kernelmgr_result *klib_result_new(json_t *root, int one_block, kernelmgr_error **err)
{
    json_t *blocks =
        one_block ? json_pack("[O]", root) : json_incref(json_object_get(root, "results"));
    if (!json_is_object(root) || !json_is_array(blocks)) {
        json_decref(blocks);
        json_decref(root);
        klib_fail(err, KERNELMGR_EDAEMON, 0, "exec: the daemon's result has no \"results\" array");
        return NULL;
    }
    kernelmgr_result *r = calloc(1, sizeof *r);
    if (!r) {
        json_decref(blocks);
        json_decref(root);
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return NULL;
    }
    if (one_block) {
        /* the block's own result as the root: {"results": [block]} keeps
         * kernelmgr_result_json the same shape as an exec's */
        json_t *wrap = json_pack("{s:o}", "results", blocks);
        json_decref(root);
        if (!wrap) {
            free(r);
            klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
            return NULL;
        }
        root = wrap;
    } else {
        json_decref(blocks);
    }
    r->root = root;
    r->blocks = json_object_get(root, "results");
    /* the text as the daemon sent it, before flatten: nothing changes
     * after this, so any number of threads may read a result */
    if (!(r->json = json_dumps(root, JSON_COMPACT))) {
        kernelmgr_result_free(r);
        klib_fail(err, KERNELMGR_EINTERNAL, 0, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(r->blocks); i++) {
        json_t *blk = json_array_get(r->blocks, i);
        json_t *d = json_object_get(blk, "displays");
        for (size_t j = 0; j < json_array_size(d); j++)
            flatten(json_array_get(d, j));
        flatten(json_object_get(blk, "result"));
    }
    return r;
}

KERNELMGR_API void kernelmgr_result_free(kernelmgr_result *r)
{
    if (!r)
        return;
    json_decref(r->root);
    free(r->json);
    free(r);
}

static json_t *block(const kernelmgr_result *r, size_t b)
{
    json_t *o = r ? json_array_get(r->blocks, b) : NULL;
    return json_is_object(o) ? o : NULL;
}

static const char *str(json_t *v, size_t *len)
{
    const char *s = json_string_value(v);
    if (len)
        *len = s ? json_string_length(v) : 0;
    return s;
}

KERNELMGR_API size_t kernelmgr_result_blocks(const kernelmgr_result *r)
{
    return r ? json_array_size(r->blocks) : 0;
}

KERNELMGR_API int kernelmgr_result_failed(const kernelmgr_result *r)
{
    return r && json_is_true(json_object_get(r->root, "failed"));
}

KERNELMGR_API const char *kernelmgr_result_status(const kernelmgr_result *r, size_t b)
{
    return str(json_object_get(block(r, b), "status"), NULL);
}

KERNELMGR_API const char *kernelmgr_result_language(const kernelmgr_result *r, size_t b)
{
    return str(json_object_get(block(r, b), "language"), NULL);
}

KERNELMGR_API int kernelmgr_result_exit_code(const kernelmgr_result *r, size_t b)
{
    json_t *v = json_object_get(block(r, b), "exit_code");
    return json_is_integer(v) ? (int)json_integer_value(v) : -1;
}

KERNELMGR_API const char *kernelmgr_result_stdout(const kernelmgr_result *r, size_t b, size_t *len)
{
    return str(json_object_get(block(r, b), "stdout"), len);
}

KERNELMGR_API const char *kernelmgr_result_stderr(const kernelmgr_result *r, size_t b, size_t *len)
{
    return str(json_object_get(block(r, b), "stderr"), len);
}

static json_t *error_of(const kernelmgr_result *r, size_t b)
{
    json_t *e = json_object_get(block(r, b), "error");
    return json_is_object(e) ? e : NULL;
}

KERNELMGR_API const char *kernelmgr_result_error_name(const kernelmgr_result *r, size_t b)
{
    return str(json_object_get(error_of(r, b), "name"), NULL);
}

KERNELMGR_API const char *kernelmgr_result_error_value(const kernelmgr_result *r, size_t b)
{
    return str(json_object_get(error_of(r, b), "value"), NULL);
}

KERNELMGR_API size_t kernelmgr_result_traceback_lines(const kernelmgr_result *r, size_t b)
{
    return json_array_size(json_object_get(error_of(r, b), "traceback"));
}

KERNELMGR_API const char *kernelmgr_result_traceback_line(const kernelmgr_result *r, size_t b,
                                                          size_t i)
{
    return str(json_array_get(json_object_get(error_of(r, b), "traceback"), i), NULL);
}

/* Output i of block b: its displays, then its result; NULL past the end.
 * *is_result says which. */
static json_t *output(const kernelmgr_result *r, size_t b, size_t i, int *is_result)
{
    json_t *blk = block(r, b);
    json_t *d = json_object_get(blk, "displays");
    size_t nd = json_array_size(d);
    *is_result = 0;
    if (i < nd) {
        json_t *o = json_array_get(d, i);
        return json_is_object(o) ? o : NULL;
    }
    json_t *res = json_object_get(blk, "result");
    if (i == nd && json_is_object(res)) {
        *is_result = 1;
        return res;
    }
    return NULL;
}

KERNELMGR_API size_t kernelmgr_result_outputs(const kernelmgr_result *r, size_t b)
{
    json_t *blk = block(r, b);
    return json_array_size(json_object_get(blk, "displays")) +
           (json_is_object(json_object_get(blk, "result")) ? 1 : 0);
}

KERNELMGR_API int kernelmgr_result_output_is_result(const kernelmgr_result *r, size_t b, size_t i)
{
    int is_result;
    return output(r, b, i, &is_result) ? is_result : 0;
}

KERNELMGR_API size_t kernelmgr_result_output_mimes(const kernelmgr_result *r, size_t b, size_t i)
{
    int is_result;
    return json_object_size(output(r, b, i, &is_result));
}

KERNELMGR_API const char *kernelmgr_result_output_mime(const kernelmgr_result *r, size_t b,
                                                       size_t i, size_t j)
{
    int is_result;
    json_t *o = output(r, b, i, &is_result);
    const char *k;
    json_t *v;
    size_t n = 0;
    json_object_foreach(o, k, v)
    {
        if (n++ == j)
            return k;
    }
    return NULL;
}

KERNELMGR_API const char *kernelmgr_result_output_data(const kernelmgr_result *r, size_t b,
                                                       size_t i, const char *mime, size_t *len)
{
    int is_result;
    if (len)
        *len = 0;
    json_t *v = mime ? json_object_get(output(r, b, i, &is_result), mime) : NULL;
    if (!v)
        return NULL;
    return str(v, len);
}

static json_t *file_of(const kernelmgr_result *r, size_t b, size_t i)
{
    json_t *f = json_array_get(json_object_get(block(r, b), "files"), i);
    return json_is_object(f) ? f : NULL;
}

KERNELMGR_API size_t kernelmgr_result_files(const kernelmgr_result *r, size_t b)
{
    return json_array_size(json_object_get(block(r, b), "files"));
}

KERNELMGR_API const char *kernelmgr_result_file_path(const kernelmgr_result *r, size_t b, size_t i)
{
    return str(json_object_get(file_of(r, b, i), "path"), NULL);
}

KERNELMGR_API const char *kernelmgr_result_file_change(const kernelmgr_result *r, size_t b,
                                                       size_t i)
{
    return str(json_object_get(file_of(r, b, i), "change"), NULL);
}

KERNELMGR_API const char *kernelmgr_result_json(const kernelmgr_result *r)
{
    return r ? r->json : NULL;
}

/* -------------------------------------------------------------- file lists */

static json_t *entry(const kernelmgr_filelist *l, size_t i)
{
    json_t *e = l ? json_array_get(l->files, i) : NULL;
    return json_is_object(e) ? e : NULL;
}

KERNELMGR_API size_t kernelmgr_filelist_count(const kernelmgr_filelist *l)
{
    return l ? json_array_size(l->files) : 0;
}

KERNELMGR_API const char *kernelmgr_filelist_path(const kernelmgr_filelist *l, size_t i)
{
    return str(json_object_get(entry(l, i), "path"), NULL);
}

KERNELMGR_API const char *kernelmgr_filelist_type(const kernelmgr_filelist *l, size_t i)
{
    return str(json_object_get(entry(l, i), "type"), NULL);
}

KERNELMGR_API const char *kernelmgr_filelist_mime(const kernelmgr_filelist *l, size_t i)
{
    return str(json_object_get(entry(l, i), "mime"), NULL);
}

KERNELMGR_API int64_t kernelmgr_filelist_size(const kernelmgr_filelist *l, size_t i)
{
    json_t *v = json_object_get(entry(l, i), "size");
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

KERNELMGR_API int kernelmgr_filelist_incomplete(const kernelmgr_filelist *l)
{
    return l && json_is_true(json_object_get(l->root, "incomplete"));
}

KERNELMGR_API const char *kernelmgr_filelist_json(const kernelmgr_filelist *l)
{
    return l ? l->json : NULL;
}

KERNELMGR_API void kernelmgr_filelist_free(kernelmgr_filelist *l)
{
    if (!l)
        return;
    json_decref(l->root);
    free(l->json);
    free(l);
}
