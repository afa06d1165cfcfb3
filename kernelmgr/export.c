/*
 * export.c — history.jsonl to nbformat 4.5.
 */
#include "kernelmgr/export.h"
#include "jp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

json_t *export_lines(const char *text)
{
    json_t *arr = json_array();
    const char *p = text ? text : "";
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
        json_array_append_new(arr, json_stringn(p, n));
        p += n;
    }
    return arr;
}

/* nbformat wants multiline strings as line lists; images stay base64 text. */
static json_t *fix_output(const json_t *o)
{
    json_t *c = json_deep_copy(o);
    const char *type = json_string_value(json_object_get(c, "output_type"));
    if (!type)
        return c;
    if (!strcmp(type, "stream")) {
        json_object_set_new(c, "text", export_lines(json_string_value(json_object_get(c, "text"))));
    } else if (!strcmp(type, "execute_result") || !strcmp(type, "display_data")) {
        json_t *data = json_object_get(c, "data");
        const char *mime;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(data, tmp, mime, v)
        {
            if (json_is_string(v) && strncmp(mime, "image/", 6) != 0)
                json_object_set_new(data, mime, export_lines(json_string_value(v)));
            else if (json_is_string(v) && !strcmp(mime, "image/svg+xml"))
                json_object_set_new(data, mime, export_lines(json_string_value(v)));
        }
        if (!json_is_object(json_object_get(c, "metadata")))
            json_object_set_new(c, "metadata", json_object());
        if (!strcmp(type, "execute_result") &&
            !json_is_integer(json_object_get(c, "execution_count")))
            json_object_set_new(c, "execution_count", json_null());
    }
    return c;
}

/* Reads history.jsonl: new array of its well-formed lines, NULL with err.
 * The file is the manager's own (the session directory, not the sandbox's
 * workspace), still opened without following a symlink and read only when
 * it is a regular file. */
static json_t *export_read_history(const char *session_dir, char *err, size_t errlen)
{
    char *path = NULL;
    if (asprintf(&path, "%s/history.jsonl", session_dir) < 0) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    FILE *f = NULL;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
        errno = EINVAL;
    }
    if (fd >= 0 && !(f = fdopen(fd, "r")))
        close(fd);
    if (!f && errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", path,
                 errno == EINVAL || errno == ELOOP ? "not a regular file" : strerror(errno));
        free(path);
        return NULL;
    }
    free(path);
    json_t *hist = json_array();
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_t *h = json_loadb(line, (size_t)n, 0, NULL);
        /* a torn last line after a crash is skipped */
        if (json_is_object(h) && json_is_string(json_object_get(h, "language")) &&
            json_is_string(json_object_get(h, "code")))
            json_array_append(hist, h);
        json_decref(h);
    }
    free(line);
    if (f)
        fclose(f);
    return hist;
}

json_t *export_notebook(const char *session_dir, const char *session_name, const char *kernel_name,
                        int *bad_request, char *err, size_t errlen)
{
    *bad_request = 0;
    json_t *hist = export_read_history(session_dir, err, errlen);
    if (!hist)
        return NULL;
    size_t i, nbash = 0, npy = 0;
    json_t *h;
    json_array_foreach(hist, i, h)
    {
        if (!strcmp(json_string_value(json_object_get(h, "language")), "bash"))
            nbash++;
        else
            npy++;
    }
    /* A bash-only session re-runs faithfully on our bash kernel (one shell,
     * its variables and cwd carry over between cells, as they did); a
     * notebook with Python cells needs a Python kernel, bash cells as %%bash. */
    const char *kn = kernel_name && *kernel_name ? kernel_name
                     : nbash && !npy             ? EXPORT_BASH_KERNEL
                                                 : "python3";
    int bash_kernel = !strcmp(kn, EXPORT_BASH_KERNEL);
    if (bash_kernel && npy) {
        snprintf(err, errlen,
                 "the session has %zu Python cell(s): a notebook for kernel %s can only hold "
                 "bash cells (use --kernel python3 or --kernel " EXPORT_PYTHON_KERNEL ")",
                 npy, kn);
        *bad_request = 1;
        json_decref(hist);
        return NULL;
    }
    json_t *warnings = json_array();
    /* ipykernel and our Python kernel both run %%bash cells in a new bash
     * process each: say what does not carry over. */
    if (nbash && !bash_kernel)
        json_array_append_new(
            warnings, json_sprintf("%zu bash cell(s) are written as %%%%bash cells: re-run with "
                                   "%s, each runs in its own bash process (workspace files carry "
                                   "over, shell variables and cwd do not)",
                                   nbash, kn));

    json_t *cells = json_array();
    unsigned idx = 0;
    json_array_foreach(hist, i, h)
    {
        const char *lang = json_string_value(json_object_get(h, "language"));
        const char *code = json_string_value(json_object_get(h, "code"));
        int bash = !strcmp(lang, "bash");
        char *src = NULL;
        if (bash && !bash_kernel) {
            size_t l = strlen(code);
            src = malloc(l + 16);
            if (src)
                snprintf(src, l + 16, "%%%%bash\n%s", code);
        } else {
            src = strdup(code);
        }
        json_t *outs = json_array();
        size_t j;
        json_t *o;
        json_array_foreach(json_object_get(h, "outputs"), j, o)
        {
            json_array_append_new(outs, fix_output(o));
        }
        char id[37];
        jp_uuid4(id);
        id[8] = 0; /* nbformat 4.5 ids: 1-64 chars of [a-zA-Z0-9-_] */
        json_t *ec = json_object_get(h, "execution_count");
        json_t *md = json_pack("{s:{s:s s:s s:O}}", "kernelmgr", "language", lang, "status",
                               json_string_value(json_object_get(h, "status")) ?: "ok",
                               "execution_count", ec ? ec : json_null());
        if (bash)
            json_object_set_new(md, "vscode", json_pack("{s:s}", "languageId", "shellscript"));
        char cid[64];
        snprintf(cid, sizeof cid, "%s-%u", id, idx++);
        json_array_append_new(cells,
                              json_pack("{s:s s:s s:o s:o s:o s:o}", "cell_type", "code", "id", cid,
                                        "metadata", md, "source", export_lines(src ? src : ""),
                                        "outputs", outs, "execution_count",
                                        json_is_integer(ec) ? json_incref(ec) : json_null()));
        free(src);
    }
    json_decref(hist);
    const char *display = !strcmp(kn, "python3")              ? "Python 3"
                          : bash_kernel                       ? "Bash (kernelmgr sandbox)"
                          : !strcmp(kn, EXPORT_PYTHON_KERNEL) ? "Python 3 (kernelmgr sandbox)"
                                                              : kn;
    json_t *li = bash_kernel ? json_pack("{s:s s:s s:s}", "name", "bash", "file_extension", ".sh",
                                         "mimetype", "text/x-sh")
                             : json_pack("{s:s s:s}", "name", "python", "file_extension", ".py");
    json_t *km = json_pack("{s:s}", "session", session_name);
    if (json_array_size(warnings))
        json_object_set(km, "warnings", warnings);
    json_decref(warnings);
    return json_pack("{s:i s:i s:{s:{s:s s:s s:s} s:o s:o} s:o}", "nbformat", 4, "nbformat_minor",
                     5, "metadata", "kernelspec", "name", kn, "display_name", display, "language",
                     bash_kernel ? "bash" : "python", "language_info", li, "kernelmgr", km, "cells",
                     cells);
}
