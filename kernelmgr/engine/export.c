/*
 * export.c — history.jsonl to nbformat 4.5.
 */
#include "kernelmgr/engine/export.h"
#include "common/cm_io.h"
#include "common/cm_mime.h"
#include "jp.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
            /* text is kept as lines, as Jupyter writes it; base64 images whole */
            if (json_is_string(v) && (strncmp(mime, "image/", 6) != 0 || cm_mime_is_text(mime)))
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

static pthread_once_t manager_id_once = PTHREAD_ONCE_INIT;
static char manager_id[37];

static void manager_id_init(void)
{
    jp_uuid4(manager_id);
}

const char *export_manager_id(void)
{
    pthread_once(&manager_id_once, manager_id_init);
    return manager_id;
}

/* A history entry as export uses it: a complete record (old format or
 * "finished"), a "started" record that never finished, or a line that could
 * not be read ({"unreadable": LINE}). */
static int record_ok(const json_t *h)
{
    return json_is_object(h) && json_is_string(json_object_get(h, "language")) &&
           json_is_string(json_object_get(h, "code"));
}

/* Reads history.jsonl: new array of entries (above), NULL with err. Lines
 * that cannot be read are kept as {"unreadable": LINE} and listed in
 * *unreadable (new array of line numbers). The file is the manager's own
 * (the session directory, not the sandbox's workspace) and trusted state:
 * read with cm_read_regular (no link, regular, owned by this user, at most
 * EXPORT_HISTORY_MAX bytes). */
static json_t *export_read_history(const char *session_dir, json_t **unreadable, km_err *err)
{
    *unreadable = NULL;
    char *path = NULL;
    if (asprintf(&path, "%s/history.jsonl", session_dir) < 0) {
        km_err_set(err, KM_EINTERNAL, "out of memory");
        return NULL;
    }
    FILE *f = NULL;
    char *data = NULL;
    size_t dlen = 0;
    const char *why;
    if (cm_read_regular(path, EXPORT_HISTORY_MAX, CM_RR_OWNED, &data, &dlen, &why) == 0 && dlen &&
        !(f = fmemopen(data, dlen, "r")))
        why = strerror(errno);
    if (!f && (data ? dlen != 0 : errno != ENOENT)) {
        km_err_set(err, KM_EINTERNAL, "%s %s", path, why);
        free(data);
        free(path);
        return NULL;
    }
    free(path);
    json_t *hist = json_array();
    json_t *bad = json_array();
    json_t *started = json_object(); /* id -> index in hist of its "started" entry */
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t n;
    while (f && (n = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (n == 1 && line[0] == '\n')
            continue;
        json_t *h = json_loadb(line, (size_t)n, 0, NULL);
        const char *ev = json_string_value(json_object_get(h, "event"));
        const char *id = json_string_value(json_object_get(h, "id"));
        if (!record_ok(h)) {
            /* torn (a crash, a full disk) or corrupt: said, never skipped silently */
            json_array_append_new(bad, json_integer((json_int_t)lineno));
            json_array_append_new(hist, json_pack("{s:I}", "unreadable", (json_int_t)lineno));
        } else if (ev && !strcmp(ev, "started") && id) {
            json_object_set_new(started, id, json_integer((json_int_t)json_array_size(hist)));
            json_array_append(hist, h);
        } else {
            json_t *si = id && ev && !strcmp(ev, "finished") ? json_object_get(started, id) : NULL;
            if (si) {
                /* the cell finished: its started entry gives way to it */
                json_array_set_new(hist, (size_t)json_integer_value(si), json_null());
                json_object_del(started, id);
            }
            json_array_append(hist, h);
        }
        json_decref(h);
    }
    free(line);
    if (f)
        fclose(f);
    free(data);
    json_decref(started);
    if (json_array_size(bad))
        *unreadable = bad;
    else
        json_decref(bad);
    return hist;
}

/* The nbformat outputs of a cell whose result never came. */
static json_t *unfinished_outputs(const json_t *h)
{
    const char *mgr = json_string_value(json_object_get(h, "manager"));
    int ours = mgr && !strcmp(mgr, export_manager_id());
    const char *why = ours ? "this cell was still running when the notebook was exported"
                           : "the daemon stopped while this cell ran; its output is unknown";
    return json_pack("[{s:s s:s s:s s:[s]}]", "output_type", "error", "ename",
                     ours ? "StillRunning" : "DaemonStopped", "evalue", why, "traceback", why);
}

/* The language (index in t) of a history record: its name; a language no
 * longer in the table counts as -1 (a cell of an unknown language). */
static int record_lang(const km_langs *t, const json_t *h)
{
    const char *ln = json_string_value(json_object_get(h, "language"));
    for (int i = 0; ln && i < t->n; i++)
        if (!strcmp(t->v[i].name, ln))
            return i;
    return -1;
}

/* "Python" for the built-in python (today's messages), else the name. */
static const char *cell_label(const km_lang *l)
{
    return !strcmp(l->name, "python") ? "Python" : l->name;
}

/* The language of the kernel kn asked for: kernelmgr-NAME; python3 and the
 * python-like language's kernelspec are that language; else a language's
 * own kernelspec; else the python-like one (any other kernel). */
static int kernel_lang(const km_langs *t, const char *kn)
{
    int py = km_langs_role(t, KM_LANG_ROLE_PYTHON);
    if (py < 0)
        py = 0;
    for (int i = 0; i < t->n; i++)
        if (!strncmp(kn, "kernelmgr-", 10) && !strcmp(kn + 10, t->v[i].name))
            return i;
    if (!strcmp(kn, "python3") || !strcmp(kn, t->v[py].kernelspec))
        return py;
    for (int i = 0; i < t->n; i++)
        if (t->v[i].kernelspec[0] && !strcmp(kn, t->v[i].kernelspec))
            return i;
    return py;
}

/* Refuses (0 or -1 with err) a notebook for kernel kn (language main_l)
 * that cannot hold the cells of another language: an IPython notebook runs
 * them by their cell magic (%%bash), any other kernel only its own. */
static int check_cells(const km_langs *langs, const size_t *count, size_t nunknown, int main_l,
                       const char *kn, km_err *err)
{
    const km_lang *ml = &langs->v[main_l];
    int ipython = ml->role == KM_LANG_ROLE_PYTHON;
    for (int l = 0; l < langs->n; l++) {
        if (l == main_l || !count[l] || (ipython && langs->v[l].cell_magic[0]))
            continue;
        char hint[200];
        if (ipython)
            snprintf(hint, sizeof hint,
                     "%s has no cell magic (\"cell_magic\" in its configuration) to run in a "
                     "%s notebook",
                     langs->v[l].name, ml->name);
        else
            snprintf(hint, sizeof hint, "use --kernel python3 or --kernel " EXPORT_PYTHON_KERNEL);
        km_err_set(err, KM_EINTERNAL,
                   "the session has %zu %s cell(s): a notebook for kernel %s can only hold %s "
                   "cells (%s)",
                   count[l], cell_label(&langs->v[l]), kn, ml->name, hint);
        return -1;
    }
    if (nunknown) {
        km_err_set(err, KM_EINTERNAL,
                   "the session has %zu cell(s) of a language this manager does not know (not in "
                   "\"kernels\"): they cannot go into a notebook",
                   nunknown);
        return -1;
    }
    return 0;
}

json_t *export_notebook(const char *session_dir, const char *session_name, const km_langs *langs,
                        const char *kernel_name, int *bad_request, km_err *err)
{
    *bad_request = 0;
    km_langs *own = NULL;
    if (!langs) {
        own = malloc(sizeof *own);
        if (!own) {
            km_err_set(err, KM_EINTERNAL, "out of memory");
            return NULL;
        }
        km_langs_builtin(own);
        langs = own;
    }
    json_t *unreadable = NULL;
    json_t *hist = export_read_history(session_dir, &unreadable, err);
    if (!hist) {
        free(own);
        return NULL;
    }
    size_t i, count[KM_LANG_MAX] = {0}, nunknown = 0;
    int only = -2; /* the one language of every cell, -1 when several */
    json_t *h;
    json_array_foreach(hist, i, h)
    {
        if (!record_ok(h))
            continue;
        int l = record_lang(langs, h);
        if (l < 0) {
            nunknown++;
            continue;
        }
        count[l]++;
        only = only == -2 || only == l ? l : -1;
    }
    /* A session of one language re-runs faithfully on that language's
     * kernel (one shell: its variables and cwd carry over between cells,
     * as they did); a notebook of several needs an IPython kernel, the
     * other languages' cells as their cell magic (%%bash). */
    char own_kn[KM_LANG_NAME_MAX + 16];
    const char *kn = kernel_name && *kernel_name ? kernel_name : "python3";
    int main_l = kernel_lang(langs, kn);
    if (!(kernel_name && *kernel_name) && only >= 0 && !nunknown &&
        langs->v[only].role != KM_LANG_ROLE_PYTHON) {
        const km_lang *o = &langs->v[only];
        if (o->kernelspec[0]) {
            kn = o->kernelspec;
        } else {
            snprintf(own_kn, sizeof own_kn, "kernelmgr-%s", o->name);
            kn = own_kn;
        }
        main_l = only;
    }
    const km_lang *ml = &langs->v[main_l];
    if (check_cells(langs, count, nunknown, main_l, kn, err)) {
        *bad_request = 1;
        json_decref(hist);
        json_decref(unreadable);
        free(own);
        return NULL;
    }
    json_t *warnings = json_array();
    if (unreadable) {
        /* "export: skipped 2 unreadable history records (lines 7, 9)" */
        char lines[200] = "";
        size_t k;
        json_t *ln;
        json_array_foreach(unreadable, k, ln)
        {
            size_t l = strlen(lines);
            if (k == 8) {
                snprintf(lines + l, sizeof lines - l, ", ...");
                break;
            }
            snprintf(lines + l, sizeof lines - l, "%s%lld", k ? ", " : "",
                     (long long)json_integer_value(ln));
        }
        size_t nu = json_array_size(unreadable);
        json_array_append_new(warnings,
                              json_sprintf("export: skipped %zu unreadable history record%s "
                                           "(line%s %s); the notebook marks where",
                                           nu, nu == 1 ? "" : "s", nu == 1 ? "" : "s", lines));
    }
    /* ipykernel and our Python kernel both run %%bash cells in a new bash
     * process each: say what does not carry over. */
    for (int l = 0; l < langs->n; l++)
        if (l != main_l && count[l])
            json_array_append_new(
                warnings,
                json_sprintf("%zu %s cell(s) are written as %s cells: re-run with %s, each runs "
                             "in its own %s process (workspace files carry over, shell variables "
                             "and cwd do not)",
                             count[l], langs->v[l].name, langs->v[l].cell_magic, kn,
                             langs->v[l].name));

    json_t *cells = json_array();
    unsigned idx = 0;
    json_array_foreach(hist, i, h)
    {
        if (json_is_null(h))
            continue; /* a started record whose finished record follows */
        if (!record_ok(h)) {
            char id[37], cid[64], msg[300];
            jp_uuid4(id);
            id[8] = 0;
            snprintf(cid, sizeof cid, "%s-%u", id, idx++);
            snprintf(msg, sizeof msg,
                     "**kernelmgr:** the session history record at line %lld could not be read "
                     "(torn or corrupt, e.g. written on a full disk or by a manager that was "
                     "killed); a cell may be missing here.",
                     (long long)json_integer_value(json_object_get(h, "unreadable")));
            json_array_append_new(cells,
                                  json_pack("{s:s s:s s:{s:{s:b}} s:o}", "cell_type", "markdown",
                                            "id", cid, "metadata", "kernelmgr", "unreadable_record",
                                            1, "source", export_lines(msg)));
            continue;
        }
        const char *ev = json_string_value(json_object_get(h, "event"));
        int unfinished = ev && !strcmp(ev, "started");
        const char *lang = json_string_value(json_object_get(h, "language"));
        const char *code = json_string_value(json_object_get(h, "code"));
        int cl = record_lang(langs, h);
        const km_lang *clang = &langs->v[cl >= 0 ? cl : main_l];
        char *src = NULL;
        if (cl != main_l && clang->cell_magic[0]) {
            if (asprintf(&src, "%s\n%s", clang->cell_magic, code) < 0)
                src = NULL;
        } else {
            src = strdup(code);
        }
        json_t *outs = unfinished ? unfinished_outputs(h) : json_array();
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
                               unfinished ? "unknown"
                                          : json_string_value(json_object_get(h, "status")) ?: "ok",
                               "execution_count", ec ? ec : json_null());
        /* a cell another client ran on the kernel (a gateway WebSocket) */
        const char *client = json_string_value(json_object_get(h, "client"));
        if (client)
            json_object_set_new(json_object_get(md, "kernelmgr"), "client", json_string(client));
        if (clang->vscode_id[0])
            json_object_set_new(md, "vscode", json_pack("{s:s}", "languageId", clang->vscode_id));
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
    const char *display = !strcmp(kn, "python3") ? "Python 3"
                          : !strncmp(kn, "kernelmgr-", 10) && !strcmp(kn + 10, ml->name)
                              ? ml->display_name
                              : kn;
    json_t *li = json_pack("{s:s}", "name", ml->name);
    if (ml->file_extension[0])
        json_object_set_new(li, "file_extension", json_string(ml->file_extension));
    if (ml->mimetype[0])
        json_object_set_new(li, "mimetype", json_string(ml->mimetype));
    json_t *km = json_pack("{s:s}", "session", session_name);
    if (unreadable)
        json_object_set(km, "unreadable_records", unreadable);
    json_decref(unreadable);
    if (json_array_size(warnings))
        json_object_set(km, "warnings", warnings);
    json_decref(warnings);
    json_t *nb =
        json_pack("{s:i s:i s:{s:{s:s s:s s:s} s:o s:o} s:o}", "nbformat", 4, "nbformat_minor", 5,
                  "metadata", "kernelspec", "name", kn, "display_name", display, "language",
                  ml->name, "language_info", li, "kernelmgr", km, "cells", cells);
    free(own);
    return nb;
}
