/* Unit tests of kernelmgr/engine/mkforeign.c: another client's cell, fed as
 * the kernel's IOPub sends it, becomes started and finished history records
 * with its outputs and client; the manager's own requests and other message
 * kinds are not foreign; a kernel that stops mid-cell leaves it "killed". */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernelmgr/engine/mkforeign.h"
#include "kernelmgr/engine/session.h"

static char *make_dir(void)
{
    char *dir = strdup("/tmp/km-kforeign-XXXXXX");
    assert_non_null(mkdtemp(dir));
    return dir;
}

/* The history's records (new array). */
static json_t *records(const char *dir)
{
    char *path = NULL;
    assert_true(asprintf(&path, "%s/history.jsonl", dir) > 0);
    json_t *a = json_array();
    FILE *f = fopen(path, "r");
    free(path);
    if (!f)
        return a;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        assert_non_null(j);
        json_array_append_new(a, j);
    }
    free(line);
    fclose(f);
    return a;
}

/* An IOPub message of type with content (stolen) whose parent is the
 * request parent_id of the client session psess. */
static jmsg *iopub(const char *type, json_t *content, const char *parent_id, const char *psess,
                   const char *ptype)
{
    jmsg *m = jmsg_new(type, "kernel", "kernel", NULL);
    assert_non_null(m);
    assert_int_equal(jmsg_set_content(m, content), 0);
    json_decref(m->parent_header);
    m->parent_header =
        json_pack("{s:s s:s s:s}", "msg_id", parent_id, "session", psess, "msg_type", ptype);
    return m;
}

static int feed(kforeign *f, const char *type, json_t *content, const char *pid, const char *psess,
                const char *ptype)
{
    jmsg *m = iopub(type, content, pid, psess, ptype);
    int rc = kforeign_feed(f, JP_IOPUB, m);
    jmsg_destroy(&m);
    return rc;
}

static void status(kforeign *f, const char *st, const char *pid, const char *psess)
{
    feed(f, "status", json_pack("{s:s}", "execution_state", st), pid, psess, "execute_request");
}

static void cell_recorded_with_outputs(void **state)
{
    (void)state;
    char *dir = make_dir();
    kforeign *f = kforeign_new("own", dir, "python", 0, 1000, 1 << 20);
    assert_non_null(f);
    kforeign_note("req-1", "websocket");
    assert_int_equal(kforeign_busy(f, NULL, NULL), 0);
    status(f, "busy", "req-1", "frontend");
    const char *client = NULL;
    assert_int_equal(kforeign_busy(f, NULL, &client), 1);
    assert_string_equal(client, "websocket");
    assert_int_equal(feed(f, "execute_input",
                          json_pack("{s:s s:i}", "code", "print(1)", "execution_count", 3), "req-1",
                          "frontend", "execute_request"),
                     1);
    json_t *r = records(dir);
    assert_int_equal(json_array_size(r), 1); /* started before it finished */
    assert_string_equal(json_string_value(json_object_get(json_array_get(r, 0), "event")),
                        "started");
    json_decref(r);
    feed(f, "stream", json_pack("{s:s s:s}", "name", "stdout", "text", "1\n"), "req-1", "frontend",
         "execute_request");
    status(f, "idle", "req-1", "frontend");
    assert_int_equal(kforeign_busy(f, NULL, NULL), 0);
    r = records(dir);
    assert_int_equal(json_array_size(r), 2);
    json_t *fin = json_array_get(r, 1);
    assert_string_equal(json_string_value(json_object_get(fin, "event")), "finished");
    assert_string_equal(json_string_value(json_object_get(fin, "client")), "websocket");
    assert_string_equal(json_string_value(json_object_get(fin, "code")), "print(1)");
    assert_string_equal(json_string_value(json_object_get(fin, "status")), "ok");
    assert_int_equal(json_integer_value(json_object_get(fin, "execution_count")), 3);
    json_t *o = json_array_get(json_object_get(fin, "outputs"), 0);
    assert_string_equal(json_string_value(json_object_get(o, "text")), "1\n");
    assert_string_equal(json_string_value(json_object_get(fin, "id")),
                        json_string_value(json_object_get(json_array_get(r, 0), "id")));
    json_decref(r);
    kforeign_destroy(&f, NULL);
    assert_null(f);
    assert_int_equal(session_rmtree(dir), 0);
    free(dir);
}

static void own_and_other_requests_are_not_foreign(void **state)
{
    (void)state;
    char *dir = make_dir();
    kforeign *f = kforeign_new("own", dir, "python", 0, 1000, 1 << 20);
    assert_non_null(f);
    assert_int_equal(feed(f, "status", json_pack("{s:s}", "execution_state", "busy"), "mine", "own",
                          "execute_request"),
                     0);
    assert_int_equal(feed(f, "status", json_pack("{s:s}", "execution_state", "busy"), "ki",
                          "frontend", "kernel_info_request"),
                     0);
    assert_int_equal(kforeign_busy(f, NULL, NULL), 0);
    jmsg *m = iopub("status", json_pack("{s:s}", "execution_state", "busy"), "x", "frontend",
                    "execute_request");
    assert_int_equal(kforeign_feed(f, JP_SHELL, m), 0); /* only IOPub is followed */
    jmsg_destroy(&m);
    json_t *r = records(dir);
    assert_int_equal(json_array_size(r), 0);
    json_decref(r);
    kforeign_destroy(&f, NULL);
    assert_int_equal(session_rmtree(dir), 0);
    free(dir);
}

static void stopped_kernel_leaves_the_cell_killed_and_errors_say_error(void **state)
{
    (void)state;
    char *dir = make_dir();
    kforeign *f = kforeign_new("own", dir, "python", 0, 1000, 1 << 20);
    assert_non_null(f);
    /* a failing cell, not noted: another Jupyter client's */
    status(f, "busy", "a", "console");
    feed(f, "execute_input", json_pack("{s:s}", "code", "1/0"), "a", "console", "execute_request");
    feed(f, "error",
         json_pack("{s:s s:s s:[s]}", "ename", "ZeroDivisionError", "evalue", "x", "traceback",
                   "tb"),
         "a", "console", "execute_request");
    status(f, "idle", "a", "console");
    /* a cell running when the kernel stops */
    status(f, "busy", "b", "console");
    feed(f, "execute_input", json_pack("{s:s}", "code", "while True: pass"), "b", "console",
         "execute_request");
    assert_int_equal(kforeign_busy(f, NULL, NULL), 1);
    kforeign_lost(f, 7);
    assert_int_equal(kforeign_busy(f, NULL, NULL), 0); /* its idle may be lost */
    kforeign_destroy(&f, "stopped for the test");
    json_t *r = records(dir);
    assert_int_equal(json_array_size(r), 4);
    json_t *a = json_array_get(r, 1);
    assert_string_equal(json_string_value(json_object_get(a, "status")), "error");
    assert_string_equal(json_string_value(json_object_get(a, "client")), "jupyter");
    json_t *b = json_array_get(r, 3);
    assert_string_equal(json_string_value(json_object_get(b, "status")), "killed");
    json_t *outs = json_object_get(b, "outputs");
    assert_int_equal(json_array_size(outs), 2);
    assert_non_null(strstr(json_string_value(json_object_get(json_array_get(outs, 0), "text")),
                           "7 output messages"));
    assert_string_equal(json_string_value(json_object_get(json_array_get(outs, 1), "evalue")),
                        "stopped for the test");
    json_decref(r);
    assert_int_equal(session_rmtree(dir), 0);
    free(dir);
}

/* jupyter_client's msg_ids ("UUID_PID_N") are longer than a UUID */
static void long_request_ids_are_one_cell(void **state)
{
    (void)state;
    char *dir = make_dir();
    kforeign *f = kforeign_new("own", dir, "python", 0, 1000, 1 << 20);
    assert_non_null(f);
    const char *id = "8f43f88e-2685893b650c14daf559931a_12616_1";
    status(f, "busy", id, "console");
    feed(f, "execute_input", json_pack("{s:s}", "code", "print(42)"), id, "console",
         "execute_request");
    feed(f, "stream", json_pack("{s:s s:s}", "name", "stdout", "text", "42\n"), id, "console",
         "execute_request");
    status(f, "idle", id, "console");
    assert_int_equal(kforeign_busy(f, NULL, NULL), 0);
    json_t *r = records(dir);
    assert_int_equal(json_array_size(r), 2);
    json_t *o = json_array_get(json_object_get(json_array_get(r, 1), "outputs"), 0);
    assert_string_equal(json_string_value(json_object_get(o, "text")), "42\n");
    json_decref(r);
    kforeign_destroy(&f, NULL);
    assert_int_equal(session_rmtree(dir), 0);
    free(dir);
}

static void stream_cap_holds_for_watched_cells(void **state)
{
    (void)state;
    char *dir = make_dir();
    kforeign *f = kforeign_new("own", dir, "python", 0, 10, 1 << 20);
    assert_non_null(f);
    status(f, "busy", "c", "console");
    feed(f, "execute_input", json_pack("{s:s}", "code", "flood"), "c", "console",
         "execute_request");
    for (int i = 0; i < 5; i++)
        feed(f, "stream", json_pack("{s:s s:s}", "name", "stdout", "text", "0123456789"), "c",
             "console", "execute_request");
    status(f, "idle", "c", "console");
    json_t *r = records(dir);
    json_t *o = json_array_get(json_object_get(json_array_get(r, 1), "outputs"), 0);
    assert_int_equal(strlen(json_string_value(json_object_get(o, "text"))), 10);
    json_decref(r);
    kforeign_destroy(&f, NULL);
    assert_int_equal(session_rmtree(dir), 0);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(cell_recorded_with_outputs),
        cmocka_unit_test(own_and_other_requests_are_not_foreign),
        cmocka_unit_test(stopped_kernel_leaves_the_cell_killed_and_errors_say_error),
        cmocka_unit_test(long_request_ids_are_one_cell),
        cmocka_unit_test(stream_cap_holds_for_watched_cells),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
