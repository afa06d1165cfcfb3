/*
 * klib_cases.c — libkernelmgr against a real daemon, one case per
 * argument (tests/e2e/test_libkernelmgr.py builds it against the build
 * tree's shared and static library and runs it, under valgrind too).
 * Each case prints "ok CASE" when all its checks pass; a failed check
 * prints "FAIL CASE: what" and the program exits 1. The home is
 * $KERNELMGR_HOME; the daemon is started by the library ($KERNELMGR_BIN).
 */
#define _GNU_SOURCE
#include <kernelmgr.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failed;
static const char *cur;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL %s: line %d: %s: ", cur, __LINE__, #cond);                                \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failed = 1;                                                                            \
        }                                                                                          \
    } while (0)

static kernelmgr_client *connect_or_die(void)
{
    kernelmgr_error *e = NULL;
    kernelmgr_client *c = kernelmgr_connect(NULL, NULL, KERNELMGR_AUTOSTART, &e);
    if (!c) {
        printf("FAIL %s: connect: %s\n", cur, kernelmgr_error_message(e));
        kernelmgr_error_free(e);
        exit(1);
    }
    CHECK(e == NULL, "err set on success");
    return c;
}

static kernelmgr_session *open_or_die(kernelmgr_client *c, const char *name)
{
    kernelmgr_error *e = NULL;
    kernelmgr_session *s = kernelmgr_session_open(c, name, NULL, &e);
    if (!s) {
        printf("FAIL %s: session %s: %s\n", cur, name, kernelmgr_error_message(e));
        kernelmgr_error_free(e);
        exit(1);
    }
    return s;
}

static void done(kernelmgr_session *s, kernelmgr_client *c)
{
    kernelmgr_error *e = NULL;
    if (s && kernelmgr_session_close(s, 0, &e)) {
        printf("FAIL %s: close: %s\n", cur, kernelmgr_error_message(e));
        kernelmgr_error_free(e);
        failed = 1;
    }
    kernelmgr_session_free(s);
    kernelmgr_client_free(c);
}

/* ------------------------------------------------------------------ cases */

/* A bad option is the daemon's refusal, naming the field. */
static void case_badopt(void)
{
    kernelmgr_client *c = connect_or_die();
    kernelmgr_error *e = NULL;
    kernelmgr_options *o = kernelmgr_options_new();
    CHECK(!kernelmgr_options_set(o, "memory", "lots", &e), "set");
    kernelmgr_session *s = kernelmgr_session_open(c, "badopt", o, &e);
    CHECK(!s, "a session with memory \"lots\" was created");
    CHECK(kernelmgr_error_code(e) == KERNELMGR_EUSAGE, "code %d", kernelmgr_error_code(e));
    CHECK(kernelmgr_error_rpc_code(e) == -32602, "rpc %d", kernelmgr_error_rpc_code(e));
    CHECK(strstr(kernelmgr_error_message(e), "\"memory\""), "%s", kernelmgr_error_message(e));
    printf("badopt memory: %s\n", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    kernelmgr_options_free(o);

    o = kernelmgr_options_new();
    CHECK(!kernelmgr_options_set_number(o, "frobnicate", 1, NULL), "set");
    s = kernelmgr_session_open(c, "badopt", o, &e);
    CHECK(!s && strstr(kernelmgr_error_message(e), "frobnicate"), "%s", kernelmgr_error_message(e));
    printf("badopt unknown: %s\n", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    kernelmgr_options_free(o);

    /* the library's own refusals */
    CHECK(kernelmgr_options_set(NULL, "memory", "1G", &e) == -1 &&
              kernelmgr_error_code(e) == KERNELMGR_EUSAGE,
          "NULL options");
    kernelmgr_error_free(e);
    o = kernelmgr_options_new();
    CHECK(kernelmgr_options_set(o, "", "x", &e) == -1, "empty key");
    kernelmgr_error_free(e);
    CHECK(kernelmgr_options_set(o, "memory", "\xff", &e) == -1, "not UTF-8");
    kernelmgr_error_free(e);
    CHECK(kernelmgr_options_set_number(o, "cpus", 0.0 / 0.0, &e) == -1, "NaN");
    kernelmgr_error_free(e);
    /* good options are applied */
    CHECK(!kernelmgr_options_set(o, "memory", "256M", NULL) &&
              !kernelmgr_options_set_number(o, "cpus", 0.5, NULL) &&
              !kernelmgr_options_set_env(o, "KLIB_GREETING", "hi there", NULL),
          "set");
    s = kernelmgr_session_open(c, "goodopt", o, &e);
    CHECK(s, "%s", kernelmgr_error_message(e));
    kernelmgr_options_free(o);
    if (s) {
        kernelmgr_result *r =
            kernelmgr_exec(s, "echo \"$KLIB_GREETING\"", "bash", 30, 0, NULL, NULL, &e);
        CHECK(r && !strcmp(kernelmgr_result_stdout(r, 0, NULL), "hi there\n"), "%s",
              r ? kernelmgr_result_json(r) : kernelmgr_error_message(e));
        kernelmgr_result_free(r);
    }
    done(s, c);
}

/* A closed or never created session is KERNELMGR_ENOSESSION. */
static void case_missing(void)
{
    kernelmgr_client *c = connect_or_die();
    kernelmgr_session *s = open_or_die(c, "gone");
    kernelmgr_error *e = NULL;
    CHECK(!kernelmgr_session_close(s, 0, &e), "close");
    CHECK(kernelmgr_session_restart(s, &e) == -1, "restart of a closed session succeeded");
    CHECK(kernelmgr_error_code(e) == KERNELMGR_ENOSESSION, "code %d: %s", kernelmgr_error_code(e),
          kernelmgr_error_message(e));
    printf("missing restart: %s\n", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    char *nb = kernelmgr_session_export(s, &e);
    CHECK(!nb && kernelmgr_error_code(e) == KERNELMGR_ENOSESSION, "export: %d %s",
          kernelmgr_error_code(e), kernelmgr_error_message(e));
    kernelmgr_free(nb);
    kernelmgr_error_free(e);
    CHECK(!kernelmgr_file_read(s, "x", 0, NULL, &e) &&
              kernelmgr_error_code(e) == KERNELMGR_ENOSESSION,
          "files.read: %d %s", kernelmgr_error_code(e), kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    /* a bad session name is refused by the daemon */
    CHECK(!kernelmgr_session_open(c, "../x", NULL, &e) &&
              kernelmgr_error_code(e) == KERNELMGR_EUSAGE,
          "bad name: %s", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    kernelmgr_session_free(s);
    kernelmgr_client_free(c);
}

typedef struct intr_ctx {
    kernelmgr_session *s;
    int from_callback; /* interrupt by returning non-zero, else from a thread */
    int started;
    pthread_t th;
    int have_thread;
} intr_ctx;

static void *intr_thread(void *arg)
{
    intr_ctx *x = arg;
    kernelmgr_error *e = NULL;
    if (kernelmgr_session_interrupt(x->s, &e)) {
        printf("FAIL %s: interrupt: %s\n", cur, kernelmgr_error_message(e));
        kernelmgr_error_free(e);
        failed = 1;
    }
    return NULL;
}

static int intr_event(const kernelmgr_event *ev, void *ud)
{
    intr_ctx *x = ud;
    if (ev->kind != KERNELMGR_EVENT_STDOUT || x->started ||
        !memmem(ev->text, ev->len, "started", 7))
        return 0;
    x->started = 1;
    if (x->from_callback)
        return 1;
    x->have_thread = !pthread_create(&x->th, NULL, intr_thread, x);
    return 0;
}

/* A running cell is interrupted, from another thread or by the callback;
 * the session keeps its state. */
static void interrupt_case(int from_callback)
{
    kernelmgr_client *c = connect_or_die();
    kernelmgr_session *s = open_or_die(c, from_callback ? "intr-cb" : "intr-thread");
    kernelmgr_error *e = NULL;
    intr_ctx x = {s, from_callback, 0, 0, 0};
    kernelmgr_result *r = kernelmgr_exec(
        s, "import time\nkept = 7\nprint('started', flush=True)\ntime.sleep(300)\nprint('late')",
        "python", 600, 0, intr_event, &x, &e);
    if (x.have_thread)
        pthread_join(x.th, NULL);
    CHECK(r, "%s", kernelmgr_error_message(e));
    CHECK(x.started, "no 'started' event");
    if (r) {
        const char *name = kernelmgr_result_error_name(r, 0);
        CHECK(name && !strcmp(name, "KeyboardInterrupt"), "%s", kernelmgr_result_json(r));
        CHECK(!strcmp(kernelmgr_result_status(r, 0), "error"), "%s", kernelmgr_result_status(r, 0));
        CHECK(!strstr(kernelmgr_result_stdout(r, 0, NULL), "late"), "ran on");
        printf("interrupted: %s\n", name ? name : "(none)");
    }
    kernelmgr_result_free(r);
    r = kernelmgr_exec(s, "print(kept)", "python", 30, 0, NULL, NULL, &e);
    CHECK(r && !strcmp(kernelmgr_result_stdout(r, 0, NULL), "7\n"), "state lost: %s",
          r ? kernelmgr_result_json(r) : kernelmgr_error_message(e));
    kernelmgr_result_free(r);
    done(s, c);
}

static void case_interrupt_thread(void)
{
    interrupt_case(0);
}

static void case_interrupt_callback(void)
{
    interrupt_case(1);
}

typedef struct reentry_ctx {
    kernelmgr_session *s;
    int refused;
} reentry_ctx;

static int reentry_event(const kernelmgr_event *ev, void *ud)
{
    reentry_ctx *x = ud;
    kernelmgr_error *e = NULL;
    if (ev->kind == KERNELMGR_EVENT_STDOUT && !x->refused &&
        kernelmgr_session_restart(x->s, &e) == -1 && kernelmgr_error_code(e) == KERNELMGR_EUSAGE)
        x->refused = 1;
    kernelmgr_error_free(e);
    return 0;
}

/* A call on the exec's own client from its callback is refused, not a
 * deadlock; restart clears the state. */
static void case_reentry(void)
{
    kernelmgr_client *c = connect_or_die();
    kernelmgr_session *s = open_or_die(c, "reentry");
    kernelmgr_error *e = NULL;
    reentry_ctx x = {s, 0};
    kernelmgr_result *r =
        kernelmgr_exec(s, "y = 1\nprint('hi')", "python", 30, 0, reentry_event, &x, &e);
    CHECK(r && x.refused, "refused=%d %s", x.refused, r ? "" : kernelmgr_error_message(e));
    kernelmgr_result_free(r);
    CHECK(!kernelmgr_session_restart(s, &e), "restart: %s", kernelmgr_error_message(e));
    r = kernelmgr_exec(s, "print(y)", "python", 30, 0, NULL, NULL, &e);
    CHECK(r && kernelmgr_result_error_name(r, 0) &&
              !strcmp(kernelmgr_result_error_name(r, 0), "NameError"),
          "state survived the restart: %s", r ? kernelmgr_result_json(r) : "");
    CHECK(r && kernelmgr_result_failed(r) && kernelmgr_result_traceback_lines(r, 0) > 0 &&
              kernelmgr_result_traceback_line(r, 0, 0),
          "traceback");
    kernelmgr_result_free(r);
    done(s, c);
}

/* Files both ways: binary, more than one request's worth, append, list,
 * the read limit; files a cell changed. */
static void case_files(void)
{
    kernelmgr_client *c = connect_or_die();
    kernelmgr_session *s = open_or_die(c, "files");
    kernelmgr_error *e = NULL;
    size_t n = (5u << 20) + 3;
    unsigned char *data = malloc(n);
    for (size_t i = 0; i < n; i++)
        data[i] = (unsigned char)(i * 7 + i / 251);
    CHECK(!kernelmgr_file_write(s, "dir/blob.bin", data, n, 0, &e), "write: %s",
          kernelmgr_error_message(e));
    size_t got = 0;
    unsigned char *back = kernelmgr_file_read(s, "dir/blob.bin", 0, &got, &e);
    CHECK(back && got == n && !memcmp(back, data, n), "read back %zu of %zu bytes: %s", got, n,
          back ? "" : kernelmgr_error_message(e));
    kernelmgr_free(back);
    CHECK(!kernelmgr_file_read(s, "dir/blob.bin", 1000, &got, &e) &&
              kernelmgr_error_code(e) == KERNELMGR_EUSAGE &&
              strstr(kernelmgr_error_message(e), "1000"),
          "limit: %s", kernelmgr_error_message(e));
    printf("read limit: %s\n", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    free(data);

    CHECK(!kernelmgr_file_write(s, "t.txt", "ab", 2, 0, NULL), "write");
    CHECK(!kernelmgr_file_write(s, "t.txt", "cd", 2, KERNELMGR_FILE_APPEND, NULL), "append");
    CHECK(!kernelmgr_file_write(s, "empty", NULL, 0, 0, &e), "empty: %s",
          kernelmgr_error_message(e));
    char *t = kernelmgr_file_read(s, "t.txt", 0, &got, NULL);
    CHECK(t && got == 4 && !strcmp(t, "abcd"), "append read %s", t ? t : "(null)");
    kernelmgr_free(t);
    t = kernelmgr_file_read(s, "empty", 0, &got, NULL);
    CHECK(t && got == 0, "empty read");
    kernelmgr_free(t);
    CHECK(kernelmgr_file_write(s, "../escape", "x", 1, 0, &e) == -1 &&
              kernelmgr_error_code(e) == KERNELMGR_EUSAGE,
          "escape: %s", kernelmgr_error_message(e));
    kernelmgr_error_free(e);

    kernelmgr_filelist *l = kernelmgr_file_list(s, NULL, &e);
    CHECK(l, "list: %s", kernelmgr_error_message(e));
    int seen = 0;
    for (size_t i = 0; l && i < kernelmgr_filelist_count(l); i++)
        if (!strcmp(kernelmgr_filelist_path(l, i), "dir/blob.bin"))
            seen = kernelmgr_filelist_size(l, i) == (int64_t)n &&
                   !strcmp(kernelmgr_filelist_type(l, i), "file") && kernelmgr_filelist_mime(l, i);
    CHECK(seen, "dir/blob.bin not listed right: %s", l ? kernelmgr_filelist_json(l) : "");
    CHECK(l && !kernelmgr_filelist_incomplete(l), "incomplete");
    CHECK(l && !kernelmgr_filelist_path(l, 999999) && kernelmgr_filelist_size(l, 999999) == -1,
          "out of range");
    kernelmgr_filelist_free(l);

    kernelmgr_result *r =
        kernelmgr_exec(s, "rm t.txt; echo new > made.txt", "bash", 30, 0, NULL, NULL, &e);
    int created = 0, deleted = 0;
    for (size_t i = 0; r && i < kernelmgr_result_files(r, 0); i++) {
        const char *p = kernelmgr_result_file_path(r, 0, i);
        const char *ch = kernelmgr_result_file_change(r, 0, i);
        created |= !strcmp(p, "made.txt") && !strcmp(ch, "created");
        deleted |= !strcmp(p, "t.txt") && !strcmp(ch, "deleted");
    }
    CHECK(created && deleted, "files: %s", r ? kernelmgr_result_json(r) : "");
    kernelmgr_result_free(r);
    done(s, c);
}

/* Markdown with two fences, rich outputs, export, the raw call. */
static void case_rich(void)
{
    kernelmgr_client *c = connect_or_die();
    kernelmgr_session *s = open_or_die(c, "rich");
    kernelmgr_error *e = NULL;
    const char *md = "Some text\n```python\nclass H:\n    def _repr_html_(self):\n"
                     "        return '<b>hi</b>'\ndisplay(H())\n"
                     "class J:\n    def _repr_json_(self):\n        return {'a': [1, 2]}\nJ()\n"
                     "```\n```bash\necho from-bash\n```\n";
    kernelmgr_result *r = kernelmgr_exec(s, md, NULL, 30, 0, NULL, NULL, &e);
    CHECK(r && kernelmgr_result_blocks(r) == 2, "blocks: %s",
          r ? kernelmgr_result_json(r) : kernelmgr_error_message(e));
    if (r && kernelmgr_result_blocks(r) == 2) {
        size_t n;
        CHECK(kernelmgr_result_outputs(r, 0) == 2, "outputs %zu: %s",
              kernelmgr_result_outputs(r, 0), kernelmgr_result_json(r));
        const char *html = kernelmgr_result_output_data(r, 0, 0, "text/html", &n);
        CHECK(html && !strcmp(html, "<b>hi</b>") && !kernelmgr_result_output_is_result(r, 0, 0),
              "display %s", html ? html : "(null)");
        const char *js = kernelmgr_result_output_data(r, 0, 1, "application/json", &n);
        CHECK(js && !strcmp(js, "{\"a\":[1,2]}") && kernelmgr_result_output_is_result(r, 0, 1),
              "json %s", js ? js : "(null)");
        CHECK(kernelmgr_result_output_mimes(r, 0, 1) >= 1 &&
                  kernelmgr_result_output_mime(r, 0, 1, 0),
              "mimes");
        CHECK(!strcmp(kernelmgr_result_language(r, 1), "bash") &&
                  !strcmp(kernelmgr_result_stdout(r, 1, NULL), "from-bash\n"),
              "bash block");
        CHECK(!kernelmgr_result_status(r, 7) && kernelmgr_result_exit_code(r, 7) == -1 &&
                  !kernelmgr_result_output_data(r, 0, 9, "text/plain", NULL),
              "out of range");
    }
    kernelmgr_result_free(r);
    /* a NUL byte in the output arrives as the daemon sends it (U+FFFD),
     * with its length; the parser takes \u0000 too (test_klib.c) */
    r = kernelmgr_exec(s, "printf 'n\\0ul'", "bash", 30, 0, NULL, NULL, &e);
    size_t nl = 0;
    const char *nul = r ? kernelmgr_result_stdout(r, 0, &nl) : NULL;
    CHECK(nul && nl == 6 && !memcmp(nul, "n\xef\xbf\xbdul", 6), "NUL output: %s",
          r ? kernelmgr_result_json(r) : kernelmgr_error_message(e));
    kernelmgr_result_free(r);
    char *nb = kernelmgr_session_export(s, &e);
    CHECK(nb && strstr(nb, "\"cells\"") && strstr(nb, "from-bash"), "export: %.200s",
          nb ? nb : kernelmgr_error_message(e));
    kernelmgr_free(nb);
    char *ping = kernelmgr_call(c, "ping", NULL, &e);
    CHECK(ping && strstr(ping, "\"api_version\":1"), "ping %s", ping ? ping : "");
    kernelmgr_free(ping);
    CHECK(!kernelmgr_call(c, "ping", "[1]", &e) && kernelmgr_error_code(e) == KERNELMGR_EUSAGE,
          "array params");
    kernelmgr_error_free(e);
    CHECK(!kernelmgr_call(c, "no.such.method", "{}", &e) && kernelmgr_error_rpc_code(e) == -32601,
          "unknown method: %d", kernelmgr_error_rpc_code(e));
    kernelmgr_error_free(e);
    done(s, c);
}

typedef struct par_ctx {
    kernelmgr_client *c; /* shared, or NULL: a client of its own */
    int id;
    int ok;
} par_ctx;

static void *par_thread(void *arg)
{
    par_ctx *x = arg;
    kernelmgr_client *c = x->c ? x->c : connect_or_die();
    char name[32], code[64], want[32];
    snprintf(name, sizeof name, "par%d", x->id);
    snprintf(code, sizeof code, "print(%d * 1000 + %d)", x->id, x->id);
    snprintf(want, sizeof want, "%d\n", x->id * 1000 + x->id);
    kernelmgr_session *s = kernelmgr_session_open(c, name, NULL, NULL);
    x->ok = s != NULL;
    for (int i = 0; s && i < 3; i++) {
        kernelmgr_result *r = kernelmgr_exec(s, code, "python", 60, 0, NULL, NULL, NULL);
        x->ok &= r && !strcmp(kernelmgr_result_stdout(r, 0, NULL), want);
        kernelmgr_result_free(r);
    }
    x->ok &= s && !kernelmgr_session_close(s, 0, NULL);
    kernelmgr_session_free(s);
    if (!x->c)
        kernelmgr_client_free(c);
    return NULL;
}

/* Threads with clients of their own, and threads sharing one client. */
static void case_threads(void)
{
    kernelmgr_client *shared = connect_or_die();
    par_ctx xs[4] = {{NULL, 1, 0}, {NULL, 2, 0}, {shared, 3, 0}, {shared, 4, 0}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, par_thread, &xs[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(xs[i].ok, "thread %d", xs[i].id);
    }
    kernelmgr_client_free(shared);
}

/* Connecting: no daemon without autostart; a home others can write. */
static void case_connect(void)
{
    char tmpl[] = "/tmp/kmlibXXXXXX";
    char *d = mkdtemp(tmpl);
    kernelmgr_error *e = NULL;
    CHECK(!kernelmgr_connect(d, NULL, 0, &e) && kernelmgr_error_code(e) == KERNELMGR_EDAEMON,
          "no daemon: %s", kernelmgr_error_message(e));
    printf("no daemon: %s\n", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    chmod(d, 0777);
    CHECK(!kernelmgr_connect(d, NULL, KERNELMGR_AUTOSTART, &e) &&
              kernelmgr_error_code(e) == KERNELMGR_EUSAGE &&
              strstr(kernelmgr_error_message(e), "writable"),
          "open home: %s", kernelmgr_error_message(e));
    printf("open home: %s\n", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    chmod(d, 0700);
    CHECK(!kernelmgr_connect(d, "/nonexistent/kernelmgr", KERNELMGR_AUTOSTART, &e) &&
              kernelmgr_error_code(e) == KERNELMGR_EDAEMON &&
              strstr(kernelmgr_error_message(e), "/nonexistent/kernelmgr"),
          "bad binary: %s", kernelmgr_error_message(e));
    kernelmgr_error_free(e);
    CHECK(!kernelmgr_connect(d, NULL, 8, &e) && kernelmgr_error_code(e) == KERNELMGR_EUSAGE,
          "bad flags");
    kernelmgr_error_free(e);
    CHECK(kernelmgr_connect(d, NULL, 0, NULL) == NULL, "NULL err");
    rmdir(d);
    kernelmgr_client *c = connect_or_die();
    CHECK(kernelmgr_client_home(c)[0] == '/', "home %s", kernelmgr_client_home(c));
    kernelmgr_client_free(c);
}

/* A snapshot, a change, a restore; a fork that is independent. */
static void case_snapshot(void)
{
    kernelmgr_client *c = connect_or_die();
    kernelmgr_session *s = open_or_die(c, "snap"), *f = NULL;
    kernelmgr_error *e = NULL;
    kernelmgr_result *r = kernelmgr_exec(s, "x = 1", "python", 60, 0, NULL, NULL, &e);
    CHECK(r, "%s", kernelmgr_error_message(e));
    kernelmgr_result_free(r);
    char *man = kernelmgr_session_snapshot(s, "t1", &e);
    CHECK(man && strstr(man, "\"t1\""), "%s", man ? man : kernelmgr_error_message(e));
    free(man);
    char *list = kernelmgr_session_snapshots(s, &e);
    CHECK(list && strstr(list, "t1"), "%s", list ? list : kernelmgr_error_message(e));
    free(list);
    r = kernelmgr_exec(s, "x = 2", "python", 60, 0, NULL, NULL, &e);
    kernelmgr_result_free(r);
    CHECK(!kernelmgr_session_restore(s, "t1", &e), "%s", kernelmgr_error_message(e));
    r = kernelmgr_exec(s, "print(x)", "python", 60, 0, NULL, NULL, &e);
    CHECK(r && !strcmp(kernelmgr_result_stdout(r, 0, NULL), "1\n"), "%s",
          r ? kernelmgr_result_json(r) : kernelmgr_error_message(e));
    kernelmgr_result_free(r);
    char *fk = kernelmgr_session_fork(s, "snap-fork", NULL, &e);
    CHECK(fk, "%s", kernelmgr_error_message(e));
    free(fk);
    f = kernelmgr_session_open(c, "snap-fork", NULL, &e);
    CHECK(f, "%s", kernelmgr_error_message(e));
    if (f) {
        r = kernelmgr_exec(f, "x += 10\nprint(x)", "python", 60, 0, NULL, NULL, &e);
        CHECK(r && !strcmp(kernelmgr_result_stdout(r, 0, NULL), "11\n"), "%s",
              r ? kernelmgr_result_json(r) : kernelmgr_error_message(e));
        kernelmgr_result_free(r);
        kernelmgr_error *e2 = NULL;
        CHECK(!kernelmgr_session_close(f, 0, &e2), "close fork");
        kernelmgr_error_free(e2);
        kernelmgr_session_free(f);
    }
    r = kernelmgr_exec(s, "print(x)", "python", 60, 0, NULL, NULL, &e);
    CHECK(r && !strcmp(kernelmgr_result_stdout(r, 0, NULL), "1\n"), "the source changed: %s",
          r ? kernelmgr_result_json(r) : kernelmgr_error_message(e));
    kernelmgr_result_free(r);
    CHECK(kernelmgr_session_restore(s, "no-such-tag", &e) == -1, "restore of a missing tag");
    kernelmgr_error_free(e);
    done(s, c);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"badopt", case_badopt},
    {"missing", case_missing},
    {"interrupt-thread", case_interrupt_thread},
    {"interrupt-callback", case_interrupt_callback},
    {"reentry", case_reentry},
    {"files", case_files},
    {"rich", case_rich},
    {"threads", case_threads},
    {"connect", case_connect},
    {"snapshot", case_snapshot},
};

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        size_t k = 0;
        while (k < sizeof cases / sizeof cases[0] && strcmp(cases[k].name, argv[i]))
            k++;
        if (k == sizeof cases / sizeof cases[0]) {
            printf("FAIL unknown case %s\n", argv[i]);
            return 2;
        }
        cur = cases[k].name;
        int before = failed;
        failed = 0;
        cases[k].run();
        if (!failed)
            printf("ok %s\n", cur);
        failed |= before;
    }
    return failed;
}
