/*
 * mcp_render.c — a code_exec result as an MCP CallToolResult (see header).
 */
#include "kernelmgr/frontends/mcp_render.h"
#include "common/cm_utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "protocol/jp.h"

static const char *const image_mimes[] = {"image/png", "image/jpeg", "image/gif", "image/webp",
                                          NULL};

json_t *mcpr_text_result(const char *text, int is_error)
{
    return json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text", text ? text : "",
                     "isError", is_error);
}

json_t *mcpr_json_result(json_t *obj, const char *text, int is_error)
{
    char *dump = text ? NULL : json_dumps(obj, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_t *r =
        json_pack("{s:[{s:s,s:s}],s:o,s:b}", "content", "type", "text", "text",
                  text ? text : (dump ? dump : ""), "structuredContent", obj, "isError", is_error);
    free(dump);
    return r;
}

/* Writes s, capped at MCPR_TEXT_MAX (head and tail kept), indented by
 * nothing: the model reads it as the program printed it. */
static void put_stream(FILE *f, const char *label, const char *s)
{
    if (!s || !*s)
        return;
    size_t n = strlen(s);
    fprintf(f, "%s:\n", label);
    if (n <= MCPR_TEXT_MAX) {
        fputs(s, f);
    } else {
        size_t half = MCPR_TEXT_MAX / 2;
        /* Cut on character boundaries: skip continuation bytes. */
        size_t h = half;
        while (h > 0 && ((unsigned char)s[h] & 0xC0) == 0x80)
            h--;
        size_t t = n - half;
        while (t < n && ((unsigned char)s[t] & 0xC0) == 0x80)
            t++;
        fwrite(s, 1, h, f);
        fprintf(f, "\n[... %zu bytes omitted here ...]\n", t - h);
        fputs(s + t, f);
    }
    if (s[n - 1] != '\n')
        fputc('\n', f);
}

static void put_error(FILE *f, const json_t *error)
{
    const char *name = json_string_value(json_object_get(error, "name"));
    const char *value = json_string_value(json_object_get(error, "value"));
    fprintf(f, "error: %s%s%s\n", name ? name : "Error", value && *value ? ": " : "",
            value ? value : "");
    /* The last frames of a traceback say where; the whole of it is in
     * structuredContent. */
    const json_t *tb = json_object_get(error, "traceback");
    size_t n = json_array_size(tb);
    if (n > 1) {
        size_t from = n > 6 ? n - 6 : 0;
        fputs("traceback:\n", f);
        if (from > 0)
            fprintf(f, "  [... %zu earlier lines ...]\n", from);
        for (size_t i = from; i < n; i++) {
            const char *line = json_string_value(json_array_get(tb, i));
            if (line) {
                fputs(line, f);
                if (*line && line[strlen(line) - 1] != '\n')
                    fputc('\n', f);
            }
        }
    }
}

static void put_files(FILE *f, const json_t *files, const json_t *omitted)
{
    size_t n = json_array_size(files);
    if (n == 0)
        return;
    fputs("files:", f);
    for (size_t i = 0; i < n; i++) {
        const json_t *fe = json_array_get(files, i);
        fprintf(f, "%s %s %s", i ? "," : "",
                json_string_value(json_object_get(fe, "change")) ?: "?",
                json_string_value(json_object_get(fe, "path")) ?: "?");
        json_t *size = json_object_get(fe, "size");
        if (json_is_integer(size) &&
            strcmp(json_string_value(json_object_get(fe, "change")) ?: "", "deleted") != 0)
            fprintf(f, " (%lld bytes)", (long long)json_integer_value(size));
    }
    if (json_integer_value(omitted) > 0)
        fprintf(f, ", and %lld more", (long long)json_integer_value(omitted));
    fputc('\n', f);
}

static void put_truncated(FILE *f, const json_t *truncated)
{
    const char *stream;
    const json_t *t;
    json_object_foreach((json_t *)truncated, stream, t)
    {
        /* the file report and unsaved images carry a reason, not byte counts
         * (docs/CLI.md "The result") */
        if (!strcmp(stream, "files") || !strcmp(stream, "images")) {
            const char *reason = json_string_value(json_object_get(t, "reason"));
            if (!strcmp(stream, "files"))
                fprintf(f, "note: the file report is incomplete: %s\n",
                        reason ? reason : "not every directory was walked");
            else
                fprintf(f, "note: %lld images were not saved: %s\n",
                        (long long)json_integer_value(json_object_get(t, "omitted")),
                        reason ? reason : "not saved");
            continue;
        }
        fprintf(f, "note: %s was truncated: %lld bytes in total, %lld kept", stream,
                (long long)json_integer_value(json_object_get(t, "total_bytes")),
                (long long)json_integer_value(json_object_get(t, "kept_bytes")));
        const char *spill = json_string_value(json_object_get(t, "spill"));
        const char *note = json_string_value(json_object_get(t, "spill_truncated"));
        const char *why = json_string_value(json_object_get(t, "spill_error"));
        if (!why)
            why = json_string_value(json_object_get(t, "limit"));
        if (!why)
            why = json_string_value(json_object_get(t, "reason"));
        if (spill && note)
            fprintf(f, "; the start of the output is in %s (%s)", spill, note);
        else if (spill)
            fprintf(f, "; the full output is in %s", spill);
        if (why)
            fprintf(f, "; %s", why);
        fputc('\n', f);
    }
}

/* The file the manager saved for the k-th image of a block, when it says. */
static const json_t *saved_image(const json_t *block, size_t k)
{
    return json_array_get(json_object_get(block, "images"), k);
}

static json_t *resource_link(const json_t *img, const char *workspace, const char *mime)
{
    const char *path = json_string_value(json_object_get(img, "path"));
    if (!path)
        return NULL;
    char uri[4200];
    if (path[0] == '/')
        snprintf(uri, sizeof uri, "file://%s", path);
    else if (workspace)
        snprintf(uri, sizeof uri, "file://%s/%s", workspace, path);
    else
        return NULL;
    const char *base = strrchr(path, '/');
    json_t *link = json_pack("{s:s,s:s,s:s,s:s}", "type", "resource_link", "uri", uri, "name",
                             base ? base + 1 : path, "mimeType",
                             json_string_value(json_object_get(img, "mime")) ?: mime);
    json_t *size = json_object_get(img, "size");
    if (json_is_integer(size))
        json_object_set(link, "size", size);
    return link;
}

json_t *mcpr_exec_result(const json_t *exec_reply, const char *session, const char *workspace)
{
    const json_t *results = json_object_get(exec_reply, "results");
    size_t nblocks = json_array_size(results);
    json_t *content = json_array();
    json_t *blocks = json_array();
    int failed = json_is_true(json_object_get(exec_reply, "failed")) ||
                 json_integer_value(json_object_get(exec_reply, "failed")) != 0;
    char *text = NULL;
    size_t textlen = 0;
    FILE *f = open_memstream(&text, &textlen);
    if (!f || !content || !blocks) {
        if (f)
            fclose(f);
        free(text);
        json_decref(content);
        json_decref(blocks);
        return NULL;
    }
    json_array_append_new(content, json_pack("{s:s,s:s}", "type", "text", "text", ""));
    if (nblocks == 0)
        fputs("(no code to run: the input had no Python or Bash block)\n", f);
    /* the session was busy with a cell another client started */
    const char *waited =
        json_string_value(json_object_get(json_object_get(exec_reply, "waited"), "message"));
    if (waited)
        fprintf(f, "note: %s\n", waited);
    /* session options given to an existing session are not applied */
    size_t wi;
    json_t *w;
    json_array_foreach(json_object_get(exec_reply, "warnings"), wi, w)
    {
        if (json_is_string(w))
            fprintf(f, "warning: %s\n", json_string_value(w));
    }

    for (size_t b = 0; b < nblocks; b++) {
        const json_t *r = json_array_get(results, b);
        json_t *copy = json_deep_copy(r);
        const char *status = json_string_value(json_object_get(r, "status")) ?: "?";
        if (strcmp(status, "ok") != 0)
            failed = 1;
        if (nblocks > 1 || strcmp(status, "ok") != 0) {
            fprintf(f, "%s[block %zu/%zu: %s, %s", b ? "\n" : "", b + 1, nblocks,
                    json_string_value(json_object_get(r, "language")) ?: "?", status);
            json_t *ec = json_object_get(r, "exit_code");
            if (json_is_integer(ec) && json_integer_value(ec) != 0)
                fprintf(f, ", exit code %lld", (long long)json_integer_value(ec));
            fputs("]\n", f);
        }
        put_stream(f, "stdout", json_string_value(json_object_get(r, "stdout")));
        put_stream(f, "stderr", json_string_value(json_object_get(r, "stderr")));
        const char *res =
            json_string_value(json_object_get(json_object_get(r, "result"), "text/plain"));
        if (res) {
            fputs("result: ", f);
            fputs(res, f);
            fputc('\n', f);
        }
        json_t *err = json_object_get(r, "error");
        if (json_is_object(err))
            put_error(f, err);

        /* Images: inline when small, linked when large. */
        json_t *displays = json_object_get(copy, "displays");
        size_t nimg = 0, d;
        json_t *disp;
        json_array_foreach(displays, d, disp)
        {
            for (int m = 0; image_mimes[m]; m++) {
                json_t *data = json_object_get(disp, image_mimes[m]);
                if (!json_is_string(data))
                    continue;
                size_t len = json_string_length(data);
                char marker[160];
                if (len <= MCPR_IMAGE_MAX) {
                    json_array_append_new(content,
                                          json_pack("{s:s,s:O,s:s}", "type", "image", "data", data,
                                                    "mimeType", image_mimes[m]));
                    snprintf(marker, sizeof marker,
                             "<%s, %zu bytes of base64: sent as image content #%zu>",
                             image_mimes[m], len, json_array_size(content) - 1);
                } else {
                    json_t *link = resource_link(saved_image(r, nimg), workspace, image_mimes[m]);
                    if (link) {
                        json_array_append_new(content, link);
                        snprintf(marker, sizeof marker,
                                 "<%s, %zu bytes of base64: too large to send inline; linked as "
                                 "content #%zu>",
                                 image_mimes[m], len, json_array_size(content) - 1);
                    } else {
                        snprintf(marker, sizeof marker,
                                 "<%s, %zu bytes of base64: too large to send inline>",
                                 image_mimes[m], len);
                    }
                    fprintf(f, "note: an image (%s, %zu KiB) was too large to show inline%s\n",
                            image_mimes[m], len * 3 / 4 / 1024,
                            link ? "; see the linked file" : "");
                }
                json_object_set_new(disp, image_mimes[m], json_string(marker));
                nimg++;
            }
            const char *plain = json_string_value(json_object_get(disp, "text/plain"));
            if (plain && nimg == 0)
                fprintf(f, "display: %s\n", plain);
        }
        if (nimg > 0)
            fprintf(f, "%zu image%s (see the image content)\n", nimg, nimg > 1 ? "s" : "");
        put_files(f, json_object_get(r, "files"), json_object_get(r, "files_omitted"));
        put_truncated(f, json_object_get(r, "truncated"));
        const json_t *kernel = json_object_get(r, "kernel");
        if (json_is_true(json_object_get(kernel, "restarted")))
            fprintf(f, "note: the kernel was restarted%s%s%s\n",
                    json_is_true(json_object_get(kernel, "state_preserved"))
                        ? ""
                        : " and its state (variables, imports) was lost",
                    json_string_value(json_object_get(kernel, "reason")) ? ": " : "",
                    json_string_value(json_object_get(kernel, "reason")) ?: "");
        if (strcmp(status, "timeout") == 0)
            fputs("note: the execution hit its time limit and was interrupted\n", f);
        /* what the limits and the network policy did to this block */
        size_t li;
        json_t *lh;
        json_array_foreach(json_object_get(r, "limits_hit"), li, lh)
        {
            if (json_is_string(lh))
                fprintf(f, "note: %s\n", json_string_value(lh));
        }
        json_array_append_new(blocks, copy);
    }
    fclose(f);
    if (textlen == 0) {
        free(text);
        text = strdup("(no output)");
    } else if (text[textlen - 1] == '\n') {
        text[textlen - 1] = '\0';
    }
    /* Streams arrive sanitised; the cuts above keep characters whole; still,
     * a string jansson refuses must not make the text vanish. */
    char *clean = cm_utf8_sanitize(text ? text : "", text ? strlen(text) : 0, NULL);
    json_object_set_new(json_array_get(content, 0), "text", json_string(clean ? clean : ""));
    free(clean);
    free(text);
    json_t *structured = json_pack("{s:s,s:b,s:o}", "session", session ? session : "", "failed",
                                   failed, "blocks", blocks);
    return json_pack("{s:o,s:o,s:b}", "content", content, "structuredContent", structured,
                     "isError", failed);
}
