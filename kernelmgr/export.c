/*
 * export.c — history.jsonl to nbformat 4.5.
 */
#include "kernelmgr/export.h"
#include "jp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

json_t *export_notebook(const char *session_dir, const char *session_name, const char *kernel_name,
                        char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/history.jsonl", session_dir);
    FILE *f = fopen(path, "r");
    json_t *cells = json_array();
    if (!f && errno != ENOENT) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        json_decref(cells);
        return NULL;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned idx = 0;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        json_t *h = json_loadb(line, (size_t)n, 0, NULL);
        if (!json_is_object(h)) {
            json_decref(h);
            continue; /* a torn last line after a crash */
        }
        const char *lang = json_string_value(json_object_get(h, "language"));
        const char *code = json_string_value(json_object_get(h, "code"));
        if (!lang || !code) {
            json_decref(h);
            continue;
        }
        int bash = !strcmp(lang, "bash");
        char *src = NULL;
        if (bash) {
            size_t l = strlen(code);
            src = malloc(l + 16);
            if (src)
                snprintf(src, l + 16, "%%%%bash\n%s", code);
        } else {
            src = strdup(code);
        }
        json_t *outs = json_array();
        size_t i;
        json_t *o;
        json_array_foreach(json_object_get(h, "outputs"), i, o)
            json_array_append_new(outs, fix_output(o));
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
        json_decref(h);
    }
    free(line);
    if (f)
        fclose(f);
    const char *kn = kernel_name && *kernel_name ? kernel_name : "python3";
    return json_pack("{s:i s:i s:{s:{s:s s:s s:s} s:{s:s s:s} s:{s:s}} s:o}", "nbformat", 4,
                     "nbformat_minor", 5, "metadata", "kernelspec", "name", kn, "display_name",
                     !strcmp(kn, "python3") ? "Python 3" : kn, "language", "python",
                     "language_info", "name", "python", "file_extension", ".py", "kernelmgr",
                     "session", session_name, "cells", cells);
}
