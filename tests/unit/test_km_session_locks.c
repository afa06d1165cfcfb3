/*
 * test_km_session_locks.c — the engine's session locking (km.h: "executions
 * in one session are serialised by the session's lock, different sessions
 * run concurrently"), driven through km_exec / km_interrupt / km_close /
 * km_file_write with real kernel servers in front of the fake worker
 * (fake_kernel.h), configured as two languages of their own ("fake",
 * "fake2"), --sandbox none: no Python, Bash or privileges needed, so a
 * locking regression fails here in seconds.
 *
 * A cell "wait" runs until it is interrupted, which makes "is still running"
 * a state the test controls instead of a race against a timer. Each test has
 * a watchdog (alarm): a deadlock ends the binary with SIGALRM, a failure.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "common/cm_clock.h"
#include "kernelmgr/engine/km.h"
#include "tests/unit/fake_kernel.h"
#include "tests/unit/fake_manager.h"

#define WATCHDOG_S 60
#define DEADLINE_S 30.0

typedef struct world {
    fake_home h;
} world;

/* One km_exec on a thread of its own; done and result once it returned. */
typedef struct runner {
    km_manager *m;
    const char *session, *lang, *code;
    pthread_t thread;
    atomic_int done;
    int order; /* completion order among runners (1, 2, ...) */
    json_t *result;
    km_err err;
} runner;

static atomic_int finished;

static void *run_main(void *arg)
{
    runner *r = arg;
    km_session_opts so;
    km_session_opts_init(&so);
    so.sandbox = "none";
    km_exec_opts eo = {.lang = r->lang, .timeout = 120};
    r->result = km_exec(r->m, r->session, &so, &eo, r->code, NULL, NULL, &r->err);
    r->order = atomic_fetch_add(&finished, 1) + 1;
    atomic_store(&r->done, 1);
    return NULL;
}

static void start(runner *r, world *w, const char *session, const char *lang, const char *code)
{
    memset(r, 0, sizeof *r);
    r->m = w->h.m;
    r->session = session;
    r->lang = lang;
    r->code = code;
    assert_int_equal(pthread_create(&r->thread, NULL, run_main, r), 0);
}

static void join(runner *r)
{
    pthread_join(r->thread, NULL);
}

/* The first block's result of r (borrowed). */
static json_t *first(const runner *r)
{
    if (!r->result)
        print_message("km_exec failed: %s\n", r->err.msg);
    assert_non_null(r->result);
    return json_array_get(json_object_get(r->result, "results"), 0);
}

static const char *field_str(const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* Until the session's `lang` kernel is busy (its cell is running). */
static void wait_busy(world *w, const char *session, const char *lang)
{
    double end = cm_mono_s() + DEADLINE_S;
    for (;;) {
        json_t *all = km_sessions(w->h.m);
        size_t i;
        json_t *s;
        int busy = 0;
        json_array_foreach(all, i, s)
        {
            if (strcmp(field_str(s, "name"), session))
                continue;
            json_t *k = json_object_get(json_object_get(s, "kernels"), lang);
            busy = !strcmp(field_str(k, "state"), "busy");
        }
        json_decref(all);
        if (busy)
            return;
        assert_true(cm_mono_s() < end);
        usleep(10 * 1000);
    }
}

/* Until r returned (fails at the deadline). */
static void wait_done(runner *r)
{
    double end = cm_mono_s() + DEADLINE_S;
    while (!atomic_load(&r->done)) {
        assert_true(cm_mono_s() < end);
        usleep(10 * 1000);
    }
    join(r);
}

static int setup(void **state)
{
    alarm(WATCHDOG_S);
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    static const char *const langs[] = {"fake", "fake2", NULL};
    fake_home_open(&w->h, "test_kmlock", langs);
    atomic_store(&finished, 0);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    fake_home_close(&w->h);
    free(w);
    alarm(0);
    return 0;
}

/* Two kernels of one session: a cell on the second waits for the running
 * cell of the first (the session's lock), and says that it waited. */
static void test_one_session_serialises_its_kernels(void **state)
{
    world *w = *state;
    runner a, b;
    start(&a, w, "s", "fake", "wait");
    wait_busy(w, "s", "fake");
    start(&b, w, "s", "fake2", "out from b");
    /* b cannot finish while a holds the session: give it every chance a
     * broken lock would need (the other kernel is idle), then end a */
    double until = cm_mono_s() + 1.0;
    while (cm_mono_s() < until && !atomic_load(&b.done))
        usleep(10 * 1000);
    assert_false(atomic_load(&b.done));
    km_err err = {0};
    assert_int_equal(km_interrupt(w->h.m, "s", &err), 0);
    wait_done(&a);
    wait_done(&b);
    assert_int_equal(a.order, 1);
    assert_int_equal(b.order, 2);
    assert_string_equal(field_str(first(&b), "stdout"), "from b\n");
    json_t *waited = json_object_get(first(&b), "waited");
    if (!waited)
        waited = json_object_get(b.result, "waited");
    assert_non_null(waited);
    assert_true(json_real_value(json_object_get(waited, "seconds")) > 0);
    json_decref(a.result);
    json_decref(b.result);
}

/* A running cell holds only its own session: another session's cell runs
 * and finishes meanwhile. A global lock would hang b until the deadline. */
static void test_sessions_run_concurrently(void **state)
{
    world *w = *state;
    runner a, b;
    start(&a, w, "s1", "fake", "wait");
    wait_busy(w, "s1", "fake");
    start(&b, w, "s2", "fake", "out other session");
    wait_done(&b);
    assert_false(atomic_load(&a.done));
    assert_string_equal(field_str(first(&b), "stdout"), "other session\n");
    km_err err = {0};
    assert_int_equal(km_interrupt(w->h.m, "s1", &err), 0);
    wait_done(&a);
    assert_int_equal(b.order, 1);
    json_decref(a.result);
    json_decref(b.result);
}

/* Interrupt never waits for the session's lock (the cell holding it is
 * what it must stop), and the interrupted cell says so; the session then
 * runs the next cell normally. */
static void test_interrupt_reaches_the_running_cell(void **state)
{
    world *w = *state;
    runner a, b;
    start(&a, w, "s", "fake", "wait");
    wait_busy(w, "s", "fake");
    km_err err = {0};
    assert_int_equal(km_interrupt(w->h.m, "s", &err), 0);
    wait_done(&a);
    json_t *r = first(&a);
    assert_string_not_equal(field_str(r, "status"), "ok");
    char *text = json_dumps(r, JSON_COMPACT);
    int said = text && strstr(text, "KeyboardInterrupt") != NULL;
    if (!said)
        print_message("interrupted result: %s\n", text ? text : "?");
    free(text);
    assert_true(said);
    start(&b, w, "s", "fake", "out again");
    wait_done(&b);
    assert_string_equal(field_str(first(&b), "stdout"), "again\n");
    json_decref(a.result);
    json_decref(b.result);
}

/* close of a session with a running cell stops the cell, waits for it and
 * then removes the session; the name is free for a new one at once. */
static void test_close_stops_the_running_cell(void **state)
{
    world *w = *state;
    runner a, b;
    start(&a, w, "s", "fake", "wait");
    wait_busy(w, "s", "fake");
    km_err err = {0};
    assert_int_equal(km_close(w->h.m, "s", 0, &err), 0);
    assert_true(atomic_load(&a.done)); /* close returned after the cell */
    join(&a);
    json_t *all = km_sessions(w->h.m);
    assert_int_equal(json_array_size(all), 0);
    json_decref(all);
    start(&b, w, "s", "fake", "out fresh");
    wait_done(&b);
    assert_string_equal(field_str(first(&b), "stdout"), "fresh\n");
    json_decref(a.result);
    json_decref(b.result);
}

/* A file write waits for the session's running cell (close cannot race
 * it, and the cell sees the workspace as it was). */
typedef struct writer {
    km_manager *m;
    pthread_t thread;
    atomic_int done;
    json_t *r;
    km_err err;
} writer;

static void *write_main(void *arg)
{
    writer *wr = arg;
    wr->r = km_file_write(wr->m, "s", "note.txt", "hello", 5, 0, &wr->err);
    atomic_store(&wr->done, 1);
    return NULL;
}

static void test_file_write_waits_for_the_cell(void **state)
{
    world *w = *state;
    runner a;
    start(&a, w, "s", "fake", "wait");
    wait_busy(w, "s", "fake");
    writer wr = {.m = w->h.m};
    assert_int_equal(pthread_create(&wr.thread, NULL, write_main, &wr), 0);
    double until = cm_mono_s() + 1.0;
    while (cm_mono_s() < until && !atomic_load(&wr.done))
        usleep(10 * 1000);
    assert_false(atomic_load(&wr.done));
    km_err err = {0};
    assert_int_equal(km_interrupt(w->h.m, "s", &err), 0);
    wait_done(&a);
    double end = cm_mono_s() + DEADLINE_S;
    while (!atomic_load(&wr.done)) {
        assert_true(cm_mono_s() < end);
        usleep(10 * 1000);
    }
    pthread_join(wr.thread, NULL);
    if (!wr.r)
        print_message("km_file_write: %s\n", wr.err.msg);
    assert_non_null(wr.r);
    assert_int_equal(json_integer_value(json_object_get(wr.r, "size")), 5);
    json_decref(wr.r);
    json_decref(a.result);
}

int main(int argc, char **argv)
{
    int part = fake_kernel_main(argc, argv);
    if (part >= 0)
        return part;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_one_session_serialises_its_kernels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sessions_run_concurrently, setup, teardown),
        cmocka_unit_test_setup_teardown(test_interrupt_reaches_the_running_cell, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_stops_the_running_cell, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_write_waits_for_the_cell, setup, teardown),
    };
    if (getenv("KMLOCK_TEST"))
        cmocka_set_test_filter(getenv("KMLOCK_TEST"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
