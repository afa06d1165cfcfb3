/*
 * test_km_slot_start.c — starting a session's kernel on tcp when another
 * process takes one of its ports between the manager's pick and the
 * kernel's bind (jp_connection_init picks free ports and releases them):
 * the manager starts it again on fresh ports, at most three starts, and no
 * other failure is started again. Real kernel servers in front of the fake
 * worker (fake_kernel.h); a start told to squat (FAKE_KERNEL_SQUAT) really
 * listens on its own shell port first, so its bind really fails.
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

#include <errno.h>
#include <signal.h>
#include <sys/stat.h>

#include "kernelmgr/engine/km.h"
#include "tests/unit/fake_kernel.h"
#include "tests/unit/fake_manager.h"

#define WATCHDOG_S 120

static int setup(void **state)
{
    alarm(WATCHDOG_S);
    fake_home *h = calloc(1, sizeof *h);
    assert_non_null(h);
    static const char *const langs[] = {"fake", NULL};
    json_t *tcp = json_pack("{s:s, s:b}", "transport", "tcp", "transport_tcp_exposed", 1);
    fake_home_open_conf(h, "test_kmslot", langs, tcp);
    json_decref(tcp);
    *state = h;
    return 0;
}

static int teardown(void **state)
{
    fake_home *h = *state;
    fake_home_close(h);
    free(h);
    alarm(0);
    return 0;
}

/* Asks the next n starts of the fake kernel to lose their shell port. */
static void squat_next(fake_home *h, int n)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", h->home, FAKE_KERNEL_SQUAT);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "%d\n", n);
    assert_int_equal(fclose(f), 0);
}

/* The squat starts not taken yet (0: all were). */
static int squats_left(fake_home *h)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", h->home, FAKE_KERNEL_SQUAT);
    FILE *f = fopen(p, "r");
    if (!f) {
        assert_int_equal(errno, ENOENT);
        return 0;
    }
    int n = -1;
    assert_int_equal(fscanf(f, "%d", &n), 1);
    fclose(f);
    return n;
}

/* Lines of the session's kernel log that contain needle. */
static int log_count(fake_home *h, const char *session, const char *needle)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/sessions/%s/fake.log", h->home, session);
    return fake_log_count(p, needle);
}

static json_t *exec_code(fake_home *h, const char *session, const char *code, km_err *err)
{
    km_session_opts so;
    km_session_opts_init(&so);
    so.sandbox = "none";
    km_exec_opts eo = {.lang = "fake", .timeout = 60};
    return km_exec(h->m, session, &so, &eo, code, NULL, NULL, err);
}

static const char *block_stdout(json_t *result)
{
    json_t *b = json_array_get(json_object_get(result, "results"), 0);
    return json_string_value(json_object_get(b, "stdout"));
}

/* Two starts lose their port: the third, on fresh ports, runs the cell. */
static void test_lost_ports_start_again(void **state)
{
    fake_home *h = *state;
    squat_next(h, 2);
    km_err err = {0};
    json_t *r = exec_code(h, "s1", "out hello", &err);
    if (!r)
        print_message("km_exec: %s\n", err.msg);
    assert_non_null(r);
    const char *out = block_stdout(r);
    assert_non_null(out);
    assert_string_equal(out, "hello\n");
    json_decref(r);
    assert_int_equal(squats_left(h), 0);
    /* the two lost starts really failed to bind */
    assert_int_equal(log_count(h, "s1", "Address already in use"), 2);
}

/* Every start loses its port: three starts, then an error that says why. */
static void test_lost_ports_three_starts_at_most(void **state)
{
    fake_home *h = *state;
    squat_next(h, 5);
    km_err err = {0};
    json_t *r = exec_code(h, "s2", "out never", &err);
    char *text = r ? json_dumps(r, JSON_COMPACT) : strdup(err.msg);
    assert_non_null(text);
    if (!strstr(text, "did not start"))
        print_message("got: %s\n", text);
    assert_non_null(strstr(text, "did not start"));
    free(text);
    json_decref(r);
    assert_int_equal(squats_left(h), 2);
    assert_int_equal(log_count(h, "s2", "Address already in use"), 3);
}

/* A kernel that ended for another reason is not started again: a backend
 * that says why it cannot start and exits is started once. */
static void test_other_failures_are_not_retried(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_kmslot_failXXXXXX";
    assert_non_null(mkdtemp(dir));
    char script[PATH_MAX], starts[PATH_MAX];
    snprintf(script, sizeof script, "%s/failing-kernel", dir);
    snprintf(starts, sizeof starts, "%s/starts", dir);
    FILE *f = fopen(script, "w");
    assert_non_null(f);
    fprintf(f,
            "#!/bin/sh\necho started >> '%s'\necho 'failing-kernel: no such thing' >&2\nexit 3\n",
            starts);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(script, 0700), 0);

    fake_home h;
    static const char *const langs[] = {"fake", NULL};
    json_t *conf = json_pack("{s:s, s:b, s:{s:{s:s}}}", "transport", "tcp", "transport_tcp_exposed",
                             1, "kernels", "fake", "backend", script);
    fake_home_open_conf(&h, "test_kmslot", langs, conf);
    json_decref(conf);
    km_err err = {0};
    json_t *r = exec_code(&h, "s3", "out never", &err);
    char *text = r ? json_dumps(r, JSON_COMPACT) : strdup(err.msg);
    assert_non_null(text);
    if (!strstr(text, "exited with status 3"))
        print_message("got: %s\n", text);
    assert_non_null(strstr(text, "exited with status 3"));
    free(text);
    json_decref(r);
    fake_home_close(&h);

    f = fopen(starts, "r");
    assert_non_null(f);
    char line[64];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n++;
    fclose(f);
    assert_int_equal(n, 1);
    unlink(starts);
    unlink(script);
    assert_int_equal(rmdir(dir), 0);
}

int main(int argc, char **argv)
{
    int part = fake_kernel_main(argc, argv);
    if (part >= 0)
        return part;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lost_ports_start_again, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_ports_three_starts_at_most, setup, teardown),
        cmocka_unit_test(test_other_failures_are_not_retried),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
