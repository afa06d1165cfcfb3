/*
 * result.c — result JSON and its terminal rendering.
 */
#include "kernelmgr/engine/result.h"
#include "common/cm_mime.h"
#include "common/cm_termsafe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

json_t *result_new(const char *session, const char *language)
{
    return json_pack("{s:s s:s s:s s:n s:i s:s s:s s:n s:[] s:n s:[] s:{} s:f "
                     "s:{s:b s:b s:n}}",
                     "session", session, "language", language, "status", "ok", "execution_count",
                     "exit_code", 0, "stdout", "", "stderr", "", "result", "displays", "error",
                     "files", "truncated", "duration_ms", 0.0, "kernel", "restarted", 0,
                     "state_preserved", 1, "reason");
}

void result_set_kernel(json_t *r, int restarted, int state_preserved, const char *reason)
{
    json_object_set_new(r, "kernel",
                        json_pack("{s:b s:b s:o}", "restarted", restarted, "state_preserved",
                                  state_preserved, "reason",
                                  reason && *reason ? json_string(reason) : json_null()));
}

const char *result_status_name(result_status s)
{
    switch (s) {
    case RESULT_OK:
        return "ok";
    case RESULT_ERROR:
        return "error";
    case RESULT_TIMEOUT:
        return "timeout";
    case RESULT_KILLED:
        return "killed";
    }
    return "error";
}

int result_status_exit_code(result_status s)
{
    switch (s) {
    case RESULT_OK:
        return 0;
    case RESULT_TIMEOUT:
        return 124;
    case RESULT_KILLED:
        return 137;
    case RESULT_ERROR:
        break;
    }
    return 1;
}

void result_set_status(json_t *r, result_status s)
{
    json_object_set_new(r, "status", json_string(result_status_name(s)));
    json_t *ec = json_object_get(r, "exit_code");
    if (s == RESULT_TIMEOUT || s == RESULT_KILLED ||
        (s == RESULT_ERROR && json_integer_value(ec) == 0))
        json_object_set_new(r, "exit_code", json_integer(result_status_exit_code(s)));
}

void result_set_failure(json_t *r, result_status status, const char *name, const char *value)
{
    json_object_set_new(r, "status", json_string(result_status_name(status)));
    json_object_set_new(r, "exit_code", json_integer(result_status_exit_code(status)));
    json_t *tb = json_array();
    json_array_append_new(tb, json_string(value ? value : ""));
    json_object_set_new(r, "error", result_error(name, value, tb));
}

json_t *result_error(const char *name, const char *value, json_t *traceback)
{
    json_t *e = json_object();
    json_object_set_new(e, "name", json_string(name ? name : "Error"));
    json_object_set_new(e, "value", json_string(value ? value : ""));
    json_object_set_new(e, "traceback", json_is_array(traceback) ? traceback : json_array());
    if (traceback && !json_is_array(traceback))
        json_decref(traceback);
    /* a name or value that is not UTF-8 text must not drop the member */
    if (!json_is_string(json_object_get(e, "name")))
        json_object_set_new(e, "name", json_string("Error"));
    if (!json_is_string(json_object_get(e, "value")))
        json_object_set_new(e, "value", json_string("(not UTF-8 text)"));
    return e;
}

/* The members a result's error may have, a row each with the JSON types it
 * may be (JT bits). */
#define JT(t) (1u << (t))
static const struct {
    const char *key;
    unsigned types;
} error_members[] = {
    {"name", JT(JSON_STRING)},
    {"value", JT(JSON_STRING)},
    {"traceback", JT(JSON_ARRAY)},
    {"timeout", JT(JSON_TRUE) | JT(JSON_FALSE)},
    {"value_omitted_bytes", JT(JSON_INTEGER)},
};

int result_error_valid(const json_t *e, km_err *why)
{
    if (!json_is_object(e)) {
        km_err_set(why, KM_EUSAGE, "error is not an object");
        return 0;
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)e, k, v)
    {
        int ok = 0;
        for (size_t i = 0; !ok && i < sizeof error_members / sizeof *error_members; i++)
            ok = !strcmp(k, error_members[i].key) && (error_members[i].types & JT(json_typeof(v)));
        if (!ok) {
            km_err_set(why, KM_EUSAGE, "error member \"%.64s\" is unexpected or of the wrong type",
                       k);
            return 0;
        }
    }
    static const char *const need[] = {"name", "value", "traceback"};
    for (int i = 0; i < 3; i++)
        if (!json_object_get(e, need[i])) {
            km_err_set(why, KM_EUSAGE, "error has no \"%s\"", need[i]);
            return 0;
        }
    size_t i;
    json_array_foreach(json_object_get(e, "traceback"), i, v)
    {
        if (!json_is_string(v)) {
            km_err_set(why, KM_EUSAGE, "error.traceback[%zu] is not a string", i);
            return 0;
        }
    }
    return 1;
}

int result_failed(const json_t *r)
{
    const char *st = json_string_value(json_object_get(r, "status"));
    return !st || strcmp(st, "ok") != 0;
}

/* Sandbox-produced text: escaped for a terminal (termsafe.h, colours kept),
 * as it is otherwise. */
static void print_text(FILE *out, const char *label, const char *text)
{
    if (!text || !*text)
        return;
    if (label)
        fprintf(out, "%s\n", label);
    if (isatty(fileno(out))) {
        if (termsafe_fputs(out, text, TERMSAFE_KEEP_SGR))
            fputs("\033[0m", out);
    } else {
        fputs(text, out);
    }
    if (text[strlen(text) - 1] != '\n')
        fputc('\n', out);
}

/* new (free()): a one-line field (file name, path, link target) that the
 * sandbox may have chosen, escaped on every output (termsafe.h); "" for NULL. */
static char *field(const char *s)
{
    char *e = termsafe_escape(s ? s : "", s ? strlen(s) : 0, TERMSAFE_NAME, NULL, NULL);
    return e ? e : strdup("?");
}

/* 1 when a display bundle has an image the manager saves (and lists under
 * "images"), which stands for its text/plain. */
static int has_image(const json_t *bundle)
{
    const char *mime;
    const json_t *v;
    json_object_foreach((json_t *)bundle, mime, v)
    {
        if (cm_mime_is_image(mime))
            return 1;
    }
    return 0;
}

/* The text printer's lines for the result's "truncated" members: a row per
 * member that is not a stream (docs/CLI.md "The result"); any other key is
 * a stream's (trunc_stream). */
static void trunc_images(FILE *out, const char *key, const json_t *t)
{
    fprintf(out, "[%lld images %s]\n", (long long)json_integer_value(json_object_get(t, "omitted")),
            json_string_value(json_object_get(t, "reason")) ?: "not saved");
}

static void trunc_files(FILE *out, const char *key, const json_t *t)
{
    /* names the sandbox's directories: escaped */
    char *why = field(json_string_value(json_object_get(t, "reason")));
    fprintf(out, "[file report incomplete: %s]\n", why);
    free(why);
}

static void trunc_displays(FILE *out, const char *key, const json_t *t)
{
    fprintf(out, "[%lld rich outputs omitted: %lld bytes received, %lld kept (%s)]\n",
            (long long)json_integer_value(json_object_get(t, "omitted")),
            (long long)json_integer_value(json_object_get(t, "total_bytes")),
            (long long)json_integer_value(json_object_get(t, "kept_bytes")),
            json_string_value(json_object_get(t, "limit")) ?: "display_max");
}

/* A stream's (stdout, stderr, ...) truncation and where its spill went. */
static void trunc_stream(FILE *out, const char *key, const json_t *t)
{
    const char *sp = json_string_value(json_object_get(t, "spill"));
    const char *note = json_string_value(json_object_get(t, "spill_truncated"));
    const char *serr = json_string_value(json_object_get(t, "spill_error"));
    fprintf(out, "[%s truncated: %lld bytes total, %lld kept; %s %s%s%s%s]\n", key,
            (long long)json_integer_value(json_object_get(t, "total_bytes")),
            (long long)json_integer_value(json_object_get(t, "kept_bytes")),
            sp ? (note ? "the start of the output in" : "complete output in") : "no spill file:",
            sp ? sp : (serr ? serr : "(unavailable)"), note ? " (" : "", note ? note : "",
            note ? ")" : "");
}

static const struct {
    const char *key;
    void (*fn)(FILE *out, const char *key, const json_t *t);
} trunc_notes[] = {
    {"images", trunc_images},
    {"files", trunc_files},
    {"displays", trunc_displays},
};

void result_render(FILE *out, const json_t *r, int streamed)
{
    const char *lang = json_string_value(json_object_get(r, "language"));
    const char *status = json_string_value(json_object_get(r, "status"));
    if (!streamed) {
        print_text(out, NULL, json_string_value(json_object_get(r, "stdout")));
        print_text(out, "--- stderr ---", json_string_value(json_object_get(r, "stderr")));
    }
    json_t *res = json_object_get(r, "result");
    if (json_is_object(res)) {
        const char *plain = json_string_value(json_object_get(res, "text/plain"));
        if (plain)
            print_text(out, NULL, plain);
    }
    size_t i;
    json_t *d;
    json_array_foreach(json_object_get(r, "displays"), i, d)
    {
        const char *plain = json_string_value(json_object_get(d, "text/plain"));
        if (plain && !has_image(d))
            print_text(out, NULL, plain);
    }
    json_t *img;
    json_array_foreach(json_object_get(r, "images"), i, img)
    {
        char *mime = field(json_string_value(json_object_get(img, "mime")));
        char *path = field(json_string_value(json_object_get(img, "path")));
        fprintf(out, "[image %s saved to %s]\n", mime ? mime : "?", path ? path : "?");
        free(mime);
        free(path);
    }
    json_t *err = json_object_get(r, "error");
    if (json_is_object(err)) {
        json_t *tb = json_object_get(err, "traceback");
        if (json_array_size(tb)) {
            json_t *line;
            json_array_foreach(tb, i, line)
            {
                print_text(out, NULL, json_string_value(line));
            }
        } else {
            char *ename = field(json_string_value(json_object_get(err, "name")));
            fprintf(out, "%s: ", ename ? ename : "?");
            free(ename);
            const char *ev = json_string_value(json_object_get(err, "value"));
            print_text(out, NULL, ev && *ev ? ev : "\n");
        }
    }
    const char *key;
    json_t *t;
    json_object_foreach(json_object_get(r, "truncated"), key, t)
    {
        size_t row = 0;
        while (row < sizeof trunc_notes / sizeof *trunc_notes && strcmp(key, trunc_notes[row].key))
            row++;
        if (row < sizeof trunc_notes / sizeof *trunc_notes)
            trunc_notes[row].fn(out, key, t);
        else
            trunc_stream(out, key, t);
    }
    const char *herr = json_string_value(json_object_get(r, "history_error"));
    if (herr)
        fprintf(out, "[%s]\n", herr);
    json_t *f;
    json_array_foreach(json_object_get(r, "files"), i, f)
    {
        const char *tg = json_string_value(json_object_get(f, "target"));
        char *change = field(json_string_value(json_object_get(f, "change")));
        char *path = field(json_string_value(json_object_get(f, "path")));
        char *mime = field(json_string_value(json_object_get(f, "mime")));
        char *target = tg ? field(tg) : NULL;
        fprintf(out, "[file %s: %s (%lld bytes, %s)%s%s]\n", change ? change : "?",
                path ? path : "?", (long long)json_integer_value(json_object_get(f, "size")),
                mime ? mime : "?", target ? " -> " : "", target ? target : "");
        free(change);
        free(path);
        free(mime);
        free(target);
    }
    json_int_t omitted = json_integer_value(json_object_get(r, "files_omitted"));
    if (omitted)
        fprintf(out, "[... %lld more file changes not listed]\n", (long long)omitted);
    json_t *k = json_object_get(r, "kernel");
    if (json_is_true(json_object_get(k, "restarted")))
        fprintf(out, "[%s kernel restarted, state %s: %s]\n", lang,
                json_is_true(json_object_get(k, "state_preserved")) ? "preserved" : "lost",
                json_string_value(json_object_get(k, "reason")) ?: "");
    else if (json_is_false(json_object_get(k, "state_preserved")))
        fprintf(out, "[%s kernel state lost: %s]\n", lang,
                json_string_value(json_object_get(k, "reason")) ?: "");
    if (status && strcmp(status, "ok")) {
        json_t *ec = json_object_get(r, "exit_code");
        fprintf(out, "[%s block %s, exit code %lld, %.0f ms]\n", lang, status,
                (long long)json_integer_value(ec),
                json_number_value(json_object_get(r, "duration_ms")));
    }
    fflush(out);
}
