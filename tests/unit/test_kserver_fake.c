/*
 * test_kserver_fake.c — the real kernel server (kserver/kshell/kexec/kworker)
 * driven over ZeroMQ with kclient, in front of a fake worker instead of
 * Python or Bash.
 *
 * This binary plays three parts (fake_kernel.h): the cmocka tests (the
 * client), the kernel (kserver_main() with the fake backend) and its
 * worker, scripted by the cell's code.
 * The kernel runs as a separate exec'ed process (no ZeroMQ context crosses a
 * fork), with --sandbox none: nothing here needs privileges.
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
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include <zmq.h>

#include "kernelmgr/engine/mkclient.h"
#include "kernels/server/backend.h"

#include "tests/unit/fake_kernel.h"

/* ---------------------------------------------------------------- the client */

typedef struct fixture {
    char dir[64];
    char conn_path[128];
    char log_path[128];
    pid_t pid;
    int lifeline; /* write end: the kernel (--owner-fd) ends when this process does */
    kclient *kc;
} fixture;

/* The kernel of the running test, for teardown after a failed assertion. */
static fixture *current;

static int kernel_alive(void *ud)
{
    fixture *fx = ud;
    return waitpid(fx->pid, NULL, WNOHANG) == 0;
}

/* Starts the kernel (no client yet); its connection in *conn. */
static fixture *spawn_kernel(const char *grace, jp_connection *conn)
{
    fixture *fx = calloc(1, sizeof *fx);
    assert_non_null(fx);
    snprintf(fx->dir, sizeof fx->dir, "/tmp/test_kfakeXXXXXX");
    assert_non_null(mkdtemp(fx->dir));
    snprintf(fx->conn_path, sizeof fx->conn_path, "%s/kernel.json", fx->dir);
    snprintf(fx->log_path, sizeof fx->log_path, "%s/kernel.log", fx->dir);
    char stem[128];
    snprintf(stem, sizeof stem, "%s/k", fx->dir);
    jp_error jerr;
    assert_int_equal(jp_connection_init(conn, "ipc", stem, "fake", &jerr), JP_OK);
    assert_int_equal(jp_connection_write(fx->conn_path, conn, &jerr), JP_OK);

    int life[2];
    assert_int_equal(pipe2(life, O_CLOEXEC), 0);
    fx->lifeline = life[1];
    fx->pid = fork();
    assert_true(fx->pid >= 0);
    if (fx->pid == 0) {
        int log = open(fx->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (log >= 0)
            dup2(log, 2);
        if (life[0] == 3)
            fcntl(3, F_SETFD, 0);
        else
            dup2(life[0], 3); /* without O_CLOEXEC */
        char *argv[] = {fake_self_exe, "--fake-kernel", "-f",
                        fx->conn_path, "--sandbox",     "none",
                        "--workspace", fx->dir,         "--interrupt-grace",
                        (char *)grace, "--owner-fd",    "3",
                        NULL};
        execv(fake_self_exe, argv);
        _exit(127);
    }
    close(life[0]);
    current = fx;
    return fx;
}

/* Connects fx->kc (IOPub subscribed first) and waits for kernel_info. */
static void connect_client(fixture *fx, const jp_connection *conn)
{
    km_err err = {0};
    fx->kc = kclient_new(conn, "fake", &err);
    assert_non_null(fx->kc);
    json_t *info = kclient_wait_ready(fx->kc, 20.0, kernel_alive, fx, &err);
    if (!info) {
        print_message("kernel not ready: %s\n", err.msg);
        fail();
    }
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(info, "language_info"), "name")), "fake");
    json_decref(info);
}

static fixture *start_kernel(const char *grace)
{
    jp_connection conn;
    fixture *fx = spawn_kernel(grace, &conn);
    connect_client(fx, &conn);
    return fx;
}

/* Waits for pid's end until the deadline (ms); 1 when it ended. */
static int wait_gone(pid_t pid, int ms, int *status)
{
    double until = kclient_now() + ms / 1000.0;
    while (kclient_now() < until) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid)
            return 1;
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL); /* polls a condition, with a deadline */
    }
    return 0;
}

static void stop_kernel(fixture **pfx)
{
    fixture *fx = *pfx;
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "shutdown_request",
                                  json_pack("{s:b}", "restart", 0), NULL, NULL),
                     0);
    int status = 0;
    int gone = wait_gone(fx->pid, 10000, &status);
    if (!gone) {
        kill(fx->pid, SIGKILL);
        waitpid(fx->pid, &status, 0);
    }
    kclient_destroy(&fx->kc);
    close(fx->lifeline);
    current = NULL;
    assert_true(gone);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    const char *files[] = {"kernel.json", "kernel.json.history.jsonl", "kernel.log", NULL};
    for (int i = 0; files[i]; i++) {
        char p[192];
        snprintf(p, sizeof p, "%s/%s", fx->dir, files[i]);
        unlink(p);
    }
    /* the kernel removes its ipc files; anything left makes rmdir fail */
    assert_int_equal(rmdir(fx->dir), 0);
    free(fx);
    *pfx = NULL;
}

/* After a failed test: the kernel is killed and its directory left for a
 * look at kernel.log. */
static int teardown(void **state)
{
    (void)state;
    fixture *fx = current;
    if (!fx)
        return 0;
    print_message("kernel log left in %s\n", fx->log_path);
    kill(fx->pid, SIGKILL);
    waitpid(fx->pid, NULL, 0);
    kclient_destroy(&fx->kc);
    close(fx->lifeline);
    free(fx);
    current = NULL;
    return 0;
}

/* What one request produced: its reply and, in order, the IOPub messages
 * whose parent it is, as [msg_type, content] pairs (status included). */
typedef struct outcome {
    jmsg *reply;
    json_t *iopub; /* array */
} outcome;

static void outcome_clear(outcome *o)
{
    jmsg_destroy(&o->reply);
    json_decref(o->iopub);
    o->iopub = NULL;
}

static const char *parent_id(const jmsg *m)
{
    return json_string_value(json_object_get(m->parent_header, "msg_id"));
}

static char *iopub_types(const outcome *o);

/* Collects messages until every request of ids[0..n) has its reply and its
 * idle status, or the deadline passes (fails). out[i] is for ids[i]. */
static void collect(fixture *fx, char ids[][37], outcome *out, int n)
{
    for (int i = 0; i < n; i++) {
        out[i].reply = NULL;
        out[i].iopub = json_array();
    }
    int done = 0;
    double until = kclient_now() + 20.0;
    while (done < n) {
        if (kclient_now() > until) {
            print_message("no reply within 20 s (%d of %d done)\n", done, n);
            for (int k = 0; k < n; k++) {
                char *got = iopub_types(&out[k]);
                print_message("  request %d: %s, iopub '%s'\n", k,
                              out[k].reply ? jmsg_type(out[k].reply) : "no reply", got);
                free(got);
            }
            fail();
        }
        jp_channel ch;
        jmsg *m = NULL;
        int r = kclient_recv(fx->kc, 100, &ch, &m);
        assert_true(r >= 0);
        if (!r)
            continue;
        const char *pid = parent_id(m);
        int i = 0;
        while (i < n && (!pid || strcmp(pid, ids[i])))
            i++;
        if (i == n) {
            jmsg_destroy(&m);
            continue;
        }
        if (ch == JP_SHELL) {
            assert_null(out[i].reply);
            out[i].reply = m;
            m = NULL;
        } else if (ch == JP_IOPUB) {
            json_array_append_new(out[i].iopub, json_pack("[s, O]", jmsg_type(m), m->content));
        }
        jmsg_destroy(&m);
        /* done once the reply and the idle status both arrived, in either
         * order: kclient_recv takes IOPub first, so the idle status, and
         * output published after it with the same parent (the restart
         * notice of a worker that died between cells goes to the last
         * request), can all come before the reply on shell */
        done = 0;
        for (int k = 0; k < n; k++) {
            int idle = 0;
            size_t j;
            json_t *pair;
            json_array_foreach(out[k].iopub, j, pair)
            {
                idle |= !strcmp(json_string_value(json_array_get(pair, 0)), "status") &&
                        !strcmp(json_string_value(
                                    json_object_get(json_array_get(pair, 1), "execution_state")),
                                "idle");
            }
            done += out[k].reply && idle;
        }
    }
}

static void send_execute(fixture *fx, const char *code, int stop_on_error, char id[37])
{
    assert_int_equal(kclient_send(fx->kc, JP_SHELL, "execute_request",
                                  json_pack("{s:s, s:b, s:b, s:{}, s:b, s:b}", "code", code,
                                            "silent", 0, "store_history", 1, "user_expressions",
                                            "allow_stdin", 0, "stop_on_error", stop_on_error),
                                  NULL, id),
                     0);
}

static void execute(fixture *fx, const char *code, outcome *o)
{
    char id[1][37];
    send_execute(fx, code, 1, id[0]);
    collect(fx, id, o, 1);
}

static const char *reply_str(const outcome *o, const char *key)
{
    return json_string_value(json_object_get(o->reply->content, key));
}

static json_t *reply_md(const outcome *o, const char *key)
{
    return json_object_get(o->reply->metadata, key);
}

/* The IOPub message types of o joined by spaces, streams as "stream:TEXT". */
static char *iopub_types(const outcome *o)
{
    size_t cap = 1024, len = 0;
    char *s = calloc(1, cap);
    size_t i;
    json_t *pair;
    json_array_foreach(o->iopub, i, pair)
    {
        const char *t = json_string_value(json_array_get(pair, 0));
        json_t *c = json_array_get(pair, 1);
        char item[256];
        if (!strcmp(t, "status"))
            snprintf(item, sizeof item, "%s",
                     json_string_value(json_object_get(c, "execution_state")));
        else if (!strcmp(t, "stream"))
            snprintf(item, sizeof item, "%s:%s", json_string_value(json_object_get(c, "name")),
                     json_string_value(json_object_get(c, "text")));
        else
            snprintf(item, sizeof item, "%s", t);
        len += (size_t)snprintf(s + len, cap - len, "%s%s", len ? " " : "", item);
        assert_true(len < cap);
    }
    return s;
}

static void assert_iopub(const outcome *o, const char *want)
{
    char *got = iopub_types(o);
    int same = !strcmp(got, want);
    if (!same)
        print_message("iopub: got  '%s'\n       want '%s'\n", got, want);
    free(got);
    assert_true(same);
}

/* Waits (and drops messages) until IOPub brings a msg_type message; fails
 * after 20 s. For a test that acts while a cell runs. */
static void wait_iopub(fixture *fx, const char *msg_type)
{
    double until = kclient_now() + 20.0;
    while (kclient_now() < until) {
        jp_channel ch;
        jmsg *m = NULL;
        if (kclient_recv(fx->kc, 100, &ch, &m) == 1) {
            int hit = ch == JP_IOPUB && !strcmp(jmsg_type(m), msg_type);
            jmsg_destroy(&m);
            if (hit)
                return;
        }
    }
    print_message("no %s on iopub within 20 s\n", msg_type);
    fail();
}

/* Waits (and drops other messages) for a shell reply of reply_type and an
 * IOPub message of iopub_type, in either order. */
static void wait_both(fixture *fx, const char *reply_type, const char *iopub_type)
{
    double until = kclient_now() + 20.0;
    int got_reply = 0, got_iopub = 0;
    while (!(got_reply && got_iopub) && kclient_now() < until) {
        jp_channel ch;
        jmsg *m = NULL;
        if (kclient_recv(fx->kc, 100, &ch, &m) == 1) {
            got_reply |= ch == JP_SHELL && !strcmp(jmsg_type(m), reply_type);
            got_iopub |= ch == JP_IOPUB && !strcmp(jmsg_type(m), iopub_type);
            jmsg_destroy(&m);
        }
    }
    if (!(got_reply && got_iopub)) {
        print_message("no %s and %s within 20 s\n", reply_type, iopub_type);
        fail();
    }
}

/* ---------------------------------------------------------------- tests */

/* busy, the input, output in the order the worker wrote it, idle; the
 * counter grows by one per cell. */
static void test_execute_order_and_count(void **state)
{
    (void)state;
    fixture *fx = start_kernel("2");
    outcome o;
    execute(fx, "out one\nresult 42\nerr two", &o);
    assert_string_equal(reply_str(&o, "status"), "ok");
    assert_int_equal(json_integer_value(json_object_get(o.reply->content, "execution_count")), 1);
    assert_int_equal(json_integer_value(reply_md(&o, "exit_code")), 0);
    assert_iopub(&o, "busy execute_input stdout:one\n execute_result stderr:two\n idle");
    json_t *res = json_array_get(json_array_get(o.iopub, 3), 1);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(res, "data"), "text/plain")), "42");
    assert_int_equal(json_integer_value(json_object_get(res, "execution_count")), 1);
    outcome_clear(&o);

    execute(fx, "stream via-event", &o);
    assert_int_equal(json_integer_value(json_object_get(o.reply->content, "execution_count")), 2);
    assert_iopub(&o, "busy execute_input stdout:via-event idle");
    outcome_clear(&o);
    stop_kernel(&fx);
}

/* An error: status "error" with the worker's ename; with stop_on_error the
 * cells queued behind it are aborted without running, without it they run. */
static void test_error_and_stop_on_error(void **state)
{
    (void)state;
    fixture *fx = start_kernel("2");
    char ids[2][37];
    outcome o[2];
    /* the second cell must be queued when the first fails: the kernel
     * reads shell in order, so once the kernel_info sent after it is
     * answered it is; then an interrupt makes the first cell fail */
    send_execute(fx, "wait", 1, ids[0]);
    send_execute(fx, "out never", 1, ids[1]);
    assert_int_equal(kclient_send(fx->kc, JP_SHELL, "kernel_info_request", NULL, NULL, NULL), 0);
    wait_both(fx, "kernel_info_reply", "execute_input"); /* and the first cell runs */
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "interrupt_request", NULL, NULL, NULL), 0);
    collect(fx, ids, o, 2);
    assert_string_equal(reply_str(&o[0], "status"), "error");
    assert_string_equal(reply_str(&o[0], "ename"), "KeyboardInterrupt");
    assert_string_equal(reply_str(&o[1], "status"), "aborted");
    for (size_t i = 0; i < json_array_size(o[1].iopub); i++)
        assert_string_not_equal(json_string_value(json_array_get(json_array_get(o[1].iopub, i), 0)),
                                "stream");
    outcome_clear(&o[0]);
    outcome_clear(&o[1]);

    send_execute(fx, "fail", 0, ids[0]);
    send_execute(fx, "out ran", 1, ids[1]);
    collect(fx, ids, o, 2);
    assert_string_equal(reply_str(&o[0], "status"), "error");
    assert_string_equal(reply_str(&o[0], "ename"), "FakeError");
    assert_int_equal(json_integer_value(reply_md(&o[0], "exit_code")), 1);
    assert_iopub(&o[0], "busy execute_input error idle");
    assert_string_equal(reply_str(&o[1], "status"), "ok");
    assert_iopub(&o[1], "busy execute_input stdout:ran\n idle");
    outcome_clear(&o[0]);
    outcome_clear(&o[1]);
    stop_kernel(&fx);
}

/* A worker that exits between cells: the next cell runs in a fresh worker
 * and its reply says the state was lost, and why. A death mid-cell answers
 * that cell with KernelRestarted. */
static void test_worker_death(void **state)
{
    (void)state;
    fixture *fx = start_kernel("2");
    outcome o;
    execute(fx, "pid", &o);
    assert_string_equal(reply_str(&o, "status"), "ok");
    assert_null(reply_md(&o, "kernel_restarted"));
    json_t *res = json_array_get(json_array_get(o.iopub, 2), 1);
    pid_t worker =
        (pid_t)atoi(json_string_value(json_object_get(json_object_get(res, "data"), "text/plain")));
    assert_true(worker > 1);
    outcome_clear(&o);
    /* killed between cells: the death is announced on IOPub, and the next
     * cell (sent after it, so it cannot reach the dead worker) says so */
    assert_int_equal(kill(worker, SIGKILL), 0);
    wait_iopub(fx, "stream");

    execute(fx, "out hello again", &o);
    assert_string_equal(reply_str(&o, "status"), "ok");
    assert_true(json_is_true(reply_md(&o, "kernel_restarted")));
    assert_true(json_is_false(reply_md(&o, "state_preserved")));
    const char *why = json_string_value(reply_md(&o, "reason"));
    assert_non_null(why);
    assert_non_null(strstr(why, "the fake worker was killed by signal 9"));
    assert_non_null(strstr(why, "while idle, after cell 1"));
    outcome_clear(&o);

    /* said once: the next cell has nothing to report */
    execute(fx, "out quiet", &o);
    assert_null(reply_md(&o, "kernel_restarted"));
    outcome_clear(&o);

    execute(fx, "out last words\ndie 3", &o);
    assert_string_equal(reply_str(&o, "status"), "error");
    assert_string_equal(reply_str(&o, "ename"), "KernelRestarted");
    assert_true(json_is_true(reply_md(&o, "kernel_restarted")));
    assert_int_equal(json_integer_value(reply_md(&o, "exit_code")), 3);
    assert_iopub(&o, "busy execute_input stdout:last words\n error idle");
    outcome_clear(&o);

    execute(fx, "out alive", &o); /* and a new worker took over */
    assert_string_equal(reply_str(&o, "status"), "ok");
    assert_int_equal(json_integer_value(json_object_get(o.reply->content, "execution_count")), 5);
    outcome_clear(&o);
    stop_kernel(&fx);
}

/* 1 when the IOPub messages of o hold the notice of a restart between cells. */
static int has_restart_notice(const outcome *o)
{
    size_t i;
    json_t *pair;
    json_array_foreach(o->iopub, i, pair)
    {
        json_t *c = json_array_get(pair, 1);
        const char *text = json_string_value(json_object_get(c, "text"));
        if (!strcmp(json_string_value(json_array_get(pair, 0)), "stream") && text &&
            strstr(text, "Kernel restarted: the fake worker"))
            return 1;
    }
    return 0;
}

/* A worker that exits right after its "done", before the server read
 * anything more: the cell's reply is "ok", the restart is announced on
 * IOPub (with that cell as parent, possibly before its reply comes), and
 * the next cell, sent after the notice, runs in the new worker and says
 * the state was lost. Repeated: the exit races with the server's reading
 * of the event, and the notice with the reply. */
static void test_worker_exits_right_after_done(void **state)
{
    (void)state;
    fixture *fx = start_kernel("2");
    outcome o;
    for (int i = 0; i < 30; i++) {
        execute(fx, "done-exit", &o);
        assert_string_equal(reply_str(&o, "status"), "ok");
        assert_null(reply_md(&o, "kernel_restarted"));
        int notice = has_restart_notice(&o);
        outcome_clear(&o);
        if (!notice)
            wait_iopub(fx, "stream");

        execute(fx, "out next", &o);
        assert_string_equal(reply_str(&o, "status"), "ok");
        char want[400];
        snprintf(want, sizeof want,
                 "busy execute_input stderr:[fake] Kernel restarted before this cell: the fake "
                 "worker exited with status 0 while idle, after cell %d. Its state (variables, "
                 "functions, working directory, environment) was lost.\n stdout:next\n idle",
                 2 * i + 1);
        assert_iopub(&o, want);
        assert_true(json_is_true(reply_md(&o, "kernel_restarted")));
        assert_true(json_is_false(reply_md(&o, "state_preserved")));
        const char *why = json_string_value(reply_md(&o, "reason"));
        assert_non_null(why);
        assert_non_null(strstr(why, "the fake worker exited with status 0 while idle"));
        outcome_clear(&o);
    }
    stop_kernel(&fx);
}

/* interrupt_request on control reaches a waiting cell (the announcement on
 * the request pipe); a worker that ignores it is killed after the grace
 * period and the reply says so. */
static void test_interrupt(void **state)
{
    (void)state;
    fixture *fx = start_kernel("0.4");
    char id[1][37];
    outcome o;
    send_execute(fx, "wait", 1, id[0]);
    wait_iopub(fx, "execute_input"); /* the cell runs */
    char iid[1][37];
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "interrupt_request", NULL, NULL, iid[0]), 0);
    collect(fx, id, &o, 1);
    assert_string_equal(reply_str(&o, "status"), "error");
    assert_string_equal(reply_str(&o, "ename"), "KeyboardInterrupt");
    assert_int_equal(json_integer_value(reply_md(&o, "exit_code")), 130);
    assert_null(reply_md(&o, "kernel_restarted"));
    outcome_clear(&o);

    send_execute(fx, "hang", 1, id[0]);
    wait_iopub(fx, "execute_input"); /* else the interrupt can come first */
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "interrupt_request", NULL, NULL, iid[0]), 0);
    collect(fx, id, &o, 1);
    assert_string_equal(reply_str(&o, "ename"), "KernelRestarted");
    assert_non_null(
        strstr(reply_str(&o, "evalue"), "did not stop within 0.4 s after an interrupt"));
    outcome_clear(&o);

    execute(fx, "out fine", &o);
    assert_string_equal(reply_str(&o, "status"), "ok");
    outcome_clear(&o);
    stop_kernel(&fx);
}

/* kernel_info is answered while a cell runs (the loop never blocks on the
 * worker), and a shell request other than execute reaches the worker. */
static void test_kernel_info_while_busy(void **state)
{
    (void)state;
    fixture *fx = start_kernel("2");
    char id[1][37], kid[1][37];
    outcome o, k;
    send_execute(fx, "wait", 1, id[0]);
    wait_iopub(fx, "execute_input");
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "kernel_info_request", NULL, NULL, kid[0]),
                     0);
    double until = kclient_now() + 20.0;
    jmsg *info = NULL;
    while (!info && kclient_now() < until) {
        jp_channel ch;
        jmsg *m = NULL;
        if (kclient_recv(fx->kc, 100, &ch, &m) == 1 && ch == JP_CONTROL &&
            !strcmp(jmsg_type(m), "kernel_info_reply"))
            info = m;
        else
            jmsg_destroy(&m);
    }
    assert_non_null(info);
    assert_string_equal(json_string_value(json_object_get(info->content, "status")), "ok");
    assert_non_null(json_object_get(info->content, "protocol_version"));
    jmsg_destroy(&info);
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "interrupt_request", NULL, NULL, kid[0]), 0);
    collect(fx, id, &o, 1);
    assert_string_equal(reply_str(&o, "ename"), "KeyboardInterrupt");
    outcome_clear(&o);

    assert_int_equal(kclient_send(fx->kc, JP_SHELL, "is_complete_request",
                                  json_pack("{s:s}", "code", "x"), NULL, kid[0]),
                     0);
    collect(fx, kid, &k, 1);
    assert_string_equal(jmsg_type(k.reply), "is_complete_reply");
    assert_string_equal(reply_str(&k, "status"), "complete");
    assert_iopub(&k, "busy idle");
    outcome_clear(&k);
    stop_kernel(&fx);
}

/* Sends a debug_request; the debug_reply's content (new), or NULL. Events
 * seen meanwhile are counted in *events. */
static json_t *debug_request(fixture *fx, const char *command, int seq, int *events)
{
    char id[37];
    json_t *req = json_pack("{s:s, s:i, s:s, s:{}}", "type", "request", "seq", seq, "command",
                            command, "arguments");
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "debug_request", req, NULL, id), 0);
    double until = kclient_now() + 20.0;
    json_t *reply = NULL;
    while (!reply && kclient_now() < until) {
        jp_channel ch;
        jmsg *m = NULL;
        if (kclient_recv(fx->kc, 100, &ch, &m) != 1)
            continue;
        if (ch == JP_CONTROL && !strcmp(jmsg_type(m), "debug_reply") &&
            !strcmp(json_string_value(json_object_get(m->parent_header, "msg_id")), id))
            reply = json_incref(m->content);
        else if (ch == JP_IOPUB && !strcmp(jmsg_type(m), "debug_event"))
            (*events)++;
        jmsg_destroy(&m);
    }
    return reply;
}

/* debug_request goes over the debug pipes, answered while a cell is busy;
 * what the worker writes there that is no reply to a request in flight is
 * dropped; a worker that dies with a request in flight answers it with a
 * failure, and the next worker debugs again. */
static void test_debug_requests(void **state)
{
    (void)state;
    fixture *fx = start_kernel("2");
    int events = 0;
    json_t *r = debug_request(fx, "initialize", 1, &events);
    assert_non_null(r);
    assert_true(json_is_true(json_object_get(r, "success")));
    assert_int_equal(json_integer_value(json_object_get(r, "request_seq")), 1);
    json_decref(r);
    char id[1][37], kid[37];
    outcome o;
    send_execute(fx, "wait", 1, id[0]);
    wait_iopub(fx, "execute_input");
    r = debug_request(fx, "stackTrace", 2, &events);
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "command")), "stackTrace");
    json_decref(r);
    assert_true(events >= 1);
    assert_int_equal(kclient_send(fx->kc, JP_CONTROL, "interrupt_request", NULL, NULL, kid), 0);
    collect(fx, id, &o, 1);
    outcome_clear(&o);
    r = debug_request(fx, "crash", 3, &events);
    assert_non_null(r);
    assert_false(json_is_true(json_object_get(r, "success")));
    assert_non_null(strstr(json_string_value(json_object_get(r, "message")), "worker"));
    json_decref(r);
    /* the next worker (held until it is ready) */
    r = debug_request(fx, "initialize", 4, &events);
    assert_non_null(r);
    assert_true(json_is_true(json_object_get(r, "success")));
    json_decref(r);
    stop_kernel(&fx);
}

/* ---------------------------------------------------------------- IOPub join wait */

/* Lines of the kernel's log that contain needle. */
static int log_count(const fixture *fx, const char *needle)
{
    return fake_log_count(fx->log_path, needle);
}

/* Waits until the kernel's log has said it listens (its sockets are bound). */
static void wait_listening(const fixture *fx)
{
    double until = kclient_now() + 20.0;
    while (!log_count(fx, "listening (")) {
        assert_true(waitpid(fx->pid, NULL, WNOHANG) == 0);
        if (kclient_now() > until) {
            print_message("the kernel did not say it listens within 20 s\n");
            fail();
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL); /* polls a condition, with a deadline */
    }
}

/* One raw socket of a client of our own: shell without IOPub, or IOPub late. */
static void *raw_connect(const jp_connection *conn, jp_channel ch)
{
    void *s = zmq_socket(kclient_zctx(), ch == JP_IOPUB ? ZMQ_SUB : ZMQ_DEALER);
    assert_non_null(s);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (ch == JP_IOPUB)
        zmq_setsockopt(s, ZMQ_SUBSCRIBE, "", 0);
    char ep[512];
    assert_int_equal(jp_connection_endpoint(conn, ch, ep, sizeof ep), 0);
    assert_int_equal(zmq_connect(s, ep), 0);
    return s;
}

static void raw_kernel_info(jp_session *sess, void *shell, char id[37])
{
    jmsg *m = jmsg_new("kernel_info_request", "raw-client", "test", NULL);
    assert_non_null(m);
    jmsg_set_content(m, json_object());
    snprintf(id, 37, "%s", jmsg_id(m));
    jp_error err;
    assert_int_equal(jp_session_send(sess, shell, m, 0, &err), JP_OK);
    jmsg_destroy(&m);
}

/* The next message on sock within ms, or NULL. */
static jmsg *raw_recv(jp_session *sess, void *sock, long ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0)
        return NULL;
    jmsg *m = NULL;
    jp_error err;
    assert_int_equal(jp_session_recv(sess, sock, ZMQ_DONTWAIT, &m, &err), JP_OK);
    return m;
}

static jp_session *raw_session(const jp_connection *conn)
{
    jp_error err;
    jp_session *sess = jp_session_new(conn->key, strlen(conn->key), conn->signature_scheme, &err);
    assert_non_null(sess);
    return sess;
}

/* A client whose IOPub subscription reaches the kernel after its first shell
 * request (ZeroMQ's reconnect, a loaded machine) still sees that request's
 * busy and idle: the kernel holds shell requests while nobody subscribes. */
static void test_late_subscriber_sees_the_first_request(void **state)
{
    (void)state;
    jp_connection conn;
    fixture *fx = spawn_kernel("2", &conn);
    wait_listening(fx);
    jp_session *sess = raw_session(&conn);
    void *shell = raw_connect(&conn, JP_SHELL);
    char id[37];
    raw_kernel_info(sess, shell, id);
    /* nobody subscribes yet: no reply either (without the wait, the reply
     * and the request's status would all be out by now) */
    jmsg *early = raw_recv(sess, shell, 100);
    if (early)
        print_message("answered before any subscriber: %s\n", jmsg_type(early));
    assert_null(early);
    void *sub = raw_connect(&conn, JP_IOPUB);
    int reply = 0, busy = 0, idle = 0;
    double until = kclient_now() + 20.0;
    while (!(reply && busy && idle) && kclient_now() < until) {
        jmsg *m = raw_recv(sess, shell, 0);
        if (m) {
            reply |= !strcmp(jmsg_type(m), "kernel_info_reply") && parent_id(m) &&
                     !strcmp(parent_id(m), id);
            jmsg_destroy(&m);
        }
        m = raw_recv(sess, sub, 20);
        if (m && !strcmp(jmsg_type(m), "status") && parent_id(m) && !strcmp(parent_id(m), id)) {
            const char *st = json_string_value(json_object_get(m->content, "execution_state"));
            busy |= !strcmp(st, "busy");
            idle |= busy && !strcmp(st, "idle");
        }
        jmsg_destroy(&m);
    }
    if (!(reply && busy && idle))
        print_message("reply %d, busy %d, idle %d\n", reply, busy, idle);
    assert_true(reply && busy && idle);
    assert_int_equal(log_count(fx, "no IOPub subscriber"), 0);
    zmq_close(shell);
    zmq_close(sub);
    jp_session_destroy(&sess);
    connect_client(fx, &conn);
    stop_kernel(&fx);
}

/* A client that never subscribes is answered all the same, after one wait:
 * said once in the log, not again at its next request. */
static void test_client_without_iopub_waits_once(void **state)
{
    (void)state;
    jp_connection conn;
    fixture *fx = spawn_kernel("2", &conn);
    wait_listening(fx);
    jp_session *sess = raw_session(&conn);
    void *shell = raw_connect(&conn, JP_SHELL);
    for (int round = 0; round < 2; round++) {
        char id[37];
        raw_kernel_info(sess, shell, id);
        jmsg *m = raw_recv(sess, shell, 20000);
        if (!m)
            print_message("request %d: no reply within 20 s\n", round + 1);
        assert_non_null(m);
        assert_string_equal(jmsg_type(m), "kernel_info_reply");
        assert_string_equal(parent_id(m), id);
        jmsg_destroy(&m);
        assert_int_equal(log_count(fx, "no IOPub subscriber within 3 s"), 1);
    }
    zmq_close(shell);
    jp_session_destroy(&sess);
    connect_client(fx, &conn);
    stop_kernel(&fx);
}

int main(int argc, char **argv)
{
    int part = fake_kernel_main(argc, argv);
    if (part >= 0)
        return part;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_execute_order_and_count, teardown),
        cmocka_unit_test_teardown(test_error_and_stop_on_error, teardown),
        cmocka_unit_test_teardown(test_worker_death, teardown),
        cmocka_unit_test_teardown(test_worker_exits_right_after_done, teardown),
        cmocka_unit_test_teardown(test_interrupt, teardown),
        cmocka_unit_test_teardown(test_kernel_info_while_busy, teardown),
        cmocka_unit_test_teardown(test_debug_requests, teardown),
        cmocka_unit_test_teardown(test_late_subscriber_sees_the_first_request, teardown),
        cmocka_unit_test_teardown(test_client_without_iopub_waits_once, teardown),
    };
    /* KFAKE_TEST=glob runs only the matching tests (while debugging) */
    if (getenv("KFAKE_TEST"))
        cmocka_set_test_filter(getenv("KFAKE_TEST"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
