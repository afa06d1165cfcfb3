/* Unit tests of kernelmgr/export.c: started/finished records are joined, a
 * cell whose manager stopped says so, unreadable lines are never silent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernelmgr/engine/export.h"
#include "kernelmgr/engine/session.h"

static char *make_dir(const char *history)
{
    char *dir = strdup("/tmp/km-export-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char *path = NULL;
    assert_true(asprintf(&path, "%s/history.jsonl", dir) > 0);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(history, f);
    fclose(f);
    free(path);
    return dir;
}

static void drop_dir(char *dir)
{
    assert_int_equal(session_rmtree(dir), 0);
    free(dir);
}

static const char *cell_text(const json_t *cell)
{
    return json_string_value(json_array_get(json_object_get(cell, "source"), 0));
}

static void started_finished_unreadable(void **state)
{
    (void)state;
    char *dir = make_dir(
        "{\"language\":\"python\",\"code\":\"old = 1\",\"execution_count\":1,\"status\":\"ok\","
        "\"outputs\":[]}\n"
        "{\"event\":\"started\",\"id\":\"a\",\"language\":\"python\",\"code\":\"a = 1\","
        "\"time\":1,\"manager\":\"gone\"}\n"
        "{\"language\":\"python\",\"code\":\"a = 1\",\"execution_count\":2,\"status\":\"ok\","
        "\"outputs\":[],\"event\":\"finished\",\"id\":\"a\"}\n"
        "{\"language\": \"python\", \"co{\"language\":\"bash\",\"code\":\"glued\"}\n"
        "{\"event\":\"started\",\"id\":\"b\",\"language\":\"bash\",\"code\":\"sleep 99\","
        "\"time\":2,\"manager\":\"gone\"}\n");
    int bad = 0;
    km_err err = {0};
    json_t *nb = export_notebook(dir, "s", NULL, "python3", &bad, &err);
    assert_non_null(nb);
    json_t *cells = json_object_get(nb, "cells");
    assert_int_equal(json_array_size(cells), 4);
    assert_string_equal(cell_text(json_array_get(cells, 0)), "old = 1");
    assert_string_equal(cell_text(json_array_get(cells, 1)), "a = 1"); /* once, not twice */
    json_t *md = json_array_get(cells, 2);
    assert_string_equal(json_string_value(json_object_get(md, "cell_type")), "markdown");
    assert_non_null(strstr(cell_text(md), "line 4 could not be read"));
    json_t *last = json_array_get(cells, 3);
    json_t *out = json_array_get(json_object_get(last, "outputs"), 0);
    assert_string_equal(json_string_value(json_object_get(out, "ename")), "DaemonStopped");
    assert_string_equal(json_string_value(json_object_get(out, "evalue")),
                        "the daemon stopped while this cell ran; its output is unknown");
    json_t *km = json_object_get(json_object_get(nb, "metadata"), "kernelmgr");
    assert_int_equal(
        json_integer_value(json_array_get(json_object_get(km, "unreadable_records"), 0)), 4);
    int found = 0;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(km, "warnings"), i, w)
    {
        if (strstr(json_string_value(w), "export: skipped 1 unreadable history record (line 4)"))
            found = 1;
    }
    assert_true(found);
    json_decref(nb);
    drop_dir(dir);
}

static void running_cell_of_this_manager(void **state)
{
    (void)state;
    char *dir = make_dir("");
    km_err err = {0};
    assert_int_equal(session_history_start(dir, "x1", "python", NULL, "while True: pass", 0, &err),
                     0);
    int bad = 0;
    json_t *nb = export_notebook(dir, "s", NULL, NULL, &bad, &err);
    assert_non_null(nb);
    json_t *cells = json_object_get(nb, "cells");
    assert_int_equal(json_array_size(cells), 1);
    json_t *out = json_array_get(json_object_get(json_array_get(cells, 0), "outputs"), 0);
    assert_string_equal(json_string_value(json_object_get(out, "ename")), "StillRunning");
    json_decref(nb);
    /* its result arrives: one cell, with the outputs */
    json_t *r = json_pack("{s:i s:s}", "execution_count", 1, "status", "ok");
    json_t *outs =
        json_pack("[{s:s s:s s:s}]", "output_type", "stream", "name", "stdout", "text", "done\n");
    assert_int_equal(
        session_history_append(dir, "x1", "python", NULL, "while True: pass", r, outs, 0, &err), 0);
    nb = export_notebook(dir, "s", NULL, NULL, &bad, &err);
    cells = json_object_get(nb, "cells");
    assert_int_equal(json_array_size(cells), 1);
    out = json_array_get(json_object_get(json_array_get(cells, 0), "outputs"), 0);
    assert_string_equal(json_string_value(json_object_get(out, "output_type")), "stream");
    assert_null(json_object_get(json_object_get(nb, "metadata"), "unreadable_records"));
    json_decref(nb);
    json_decref(r);
    json_decref(outs);
    drop_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(started_finished_unreadable),
        cmocka_unit_test(running_cell_of_this_manager),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
