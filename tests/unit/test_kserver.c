/*
 * test_kserver.c — the pure parts of the kernel server: output coalescing
 * (kstream), command-line parsing (kopts), history queries (khistory) and the
 * worker spec helpers (kspec).
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

#include <fcntl.h>
#include <sys/stat.h>

#include "kernels/server/backend.h"
#include "kernels/server/khistory.h"
#include "kernels/server/kopts.h"
#include "kernels/server/kstream.h"

/* ---------------------------------------------------------------- kstream */

/* Feeds bytes through a pipe into s at time now. */
static void feed(kstream *s, const char *bytes, size_t n, uint64_t now)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    assert_int_equal(write(p[1], bytes, n), (ssize_t)n);
    close(p[1]);
    assert_int_equal(kstream_read(s, p[0], now), (long)n);
    assert_int_equal(kstream_read(s, p[0], now), 0); /* end of file */
    close(p[0]);
}

static void test_kstream_timing(void **state)
{
    (void)state;
    kstream s;
    assert_int_equal(kstream_init(&s, "stdout"), 0);
    assert_int_equal(kstream_deadline(&s), 0);
    feed(&s, "hello", 5, 1000);
    assert_false(kstream_due(&s, 1000));
    assert_int_equal(kstream_deadline(&s), 1000 + KSTREAM_DELAY_NS);
    assert_true(kstream_due(&s, 1000 + KSTREAM_DELAY_NS));
    char *t = kstream_take(&s, 0, 2000);
    assert_string_equal(t, "hello");
    free(t);
    assert_null(kstream_take(&s, 1, 3000));
    kstream_clear(&s);
}

static void test_kstream_keeps_split_character(void **state)
{
    (void)state;
    kstream s;
    assert_int_equal(kstream_init(&s, "stdout"), 0);
    feed(&s, "caf\xc3", 4, 0);
    char *t = kstream_take(&s, 0, 0);
    assert_string_equal(t, "caf");
    free(t);
    /* only the cut character is left: nothing to publish, and the clock is
     * restarted so a timer does not spin */
    assert_null(kstream_take(&s, 0, 5 * KSTREAM_DELAY_NS));
    assert_false(kstream_due(&s, 5 * KSTREAM_DELAY_NS));
    feed(&s, "\xa9!", 2, 6 * KSTREAM_DELAY_NS);
    t = kstream_take(&s, 0, 6 * KSTREAM_DELAY_NS);
    assert_string_equal(t, "\xc3\xa9!");
    free(t);
    /* a final take publishes a broken tail as U+FFFD */
    feed(&s, "x\xe2\x82", 3, 0);
    t = kstream_take(&s, 1, 0);
    assert_string_equal(t, "x\xef\xbf\xbd");
    free(t);
    kstream_clear(&s);
}

static void test_kstream_full_and_invalid(void **state)
{
    (void)state;
    kstream s;
    assert_int_equal(kstream_init(&s, "stderr"), 0);
    int p[2];
    assert_int_equal(pipe(p), 0);
    /* room for more than one chunk, so the writer need not block */
    assert_true(fcntl(p[1], F_SETPIPE_SZ, 1 << 20) >= (int)(KSTREAM_CHUNK + 100));
    char *big = malloc(KSTREAM_CHUNK + 100);
    memset(big, 'a', KSTREAM_CHUNK + 100);
    big[10] = '\xff';
    assert_int_equal(write(p[1], big, KSTREAM_CHUNK + 100), (ssize_t)(KSTREAM_CHUNK + 100));
    close(p[1]);
    size_t got = 0;
    while (got < KSTREAM_CHUNK) {
        long r = kstream_read(&s, p[0], 0);
        assert_true(r > 0);
        got += (size_t)r;
    }
    /* full: no more reads, and due at once */
    assert_int_equal(kstream_read(&s, p[0], 0), -1);
    assert_true(kstream_due(&s, 0));
    char *t = kstream_take(&s, 0, 0);
    assert_int_equal(strlen(t), KSTREAM_CHUNK + 2); /* 0xff became 3 bytes */
    assert_memory_equal(t + 10, "\xef\xbf\xbd", 3);
    free(t);
    assert_int_equal(kstream_read(&s, p[0], 0), 100);
    close(p[0]);
    free(big);
    kstream_clear(&s);
}

/* ---------------------------------------------------------------- kopts */

static int fake_option(int argc, char **argv, char *err, size_t errlen)
{
    if (!strcmp(argv[0], "--flag"))
        return 1;
    if (!strcmp(argv[0], "--thing")) {
        if (argc < 2) {
            snprintf(err, errlen, "--thing needs a value");
            return -1;
        }
        return 2;
    }
    return 0;
}

static const kbackend fake = {.name = "fake", .option = fake_option};

static int parse(kopts *o, char *err, size_t errlen, int argc, ...)
{
    char *argv[32] = {"kernel-fake"};
    va_list ap;
    va_start(ap, argc);
    for (int i = 1; i < argc; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    return kopts_parse(o, argc, argv, &fake, err, errlen);
}

static void test_kopts_sizes(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(kopts_parse_size("512M", &v), 0);
    assert_int_equal(v, 512ull << 20);
    assert_int_equal(kopts_parse_size("2GiB", &v), 0);
    assert_int_equal(v, 2ull << 30);
    assert_int_equal(kopts_parse_size("1.5k", &v), 0);
    assert_int_equal(v, 1536);
    assert_int_equal(kopts_parse_size("100", &v), 0);
    assert_int_equal(v, 100);
    assert_int_equal(kopts_parse_size("-1G", &v), -1);
    assert_int_equal(kopts_parse_size("lots", &v), -1);
    assert_int_equal(kopts_parse_size("1Q", &v), -1);
    assert_int_equal(kopts_parse_size("", &v), -1);
    assert_int_equal(kopts_parse_size("1e30G", &v), -1);
}

static void test_kopts_parse(void **state)
{
    (void)state;
    kopts o;
    char err[256];
    assert_int_equal(parse(&o, err, sizeof err, 1), 0);
    assert_int_equal(o.sandbox.level, SANDBOX_STRICT);
    assert_true(o.interrupt_grace == 5.0);
    assert_null(o.connection_file);
    assert_int_equal(parse(&o, err, sizeof err, 12, "-f", "k.json", "--workspace=/w", "--sandbox",
                           "none", "--memory=1G", "--network", "on", "--flag", "--thing", "x"),
                     0);
    assert_string_equal(o.connection_file, "k.json");
    assert_string_equal(o.workspace_arg, "/w");
    assert_int_equal(o.sandbox.level, SANDBOX_NONE);
    assert_int_equal(o.sandbox.memory_bytes, 1ull << 30);
    assert_int_equal(o.sandbox.network, 1);
    assert_int_equal(parse(&o, err, sizeof err, 2, "--thing=y"), 0);
    assert_int_equal(parse(&o, err, sizeof err, 2, "--flag=y"), -1);
    assert_non_null(strstr(err, "takes no value"));
    assert_int_equal(parse(&o, err, sizeof err, 2, "--bogus"), -1);
    assert_string_equal(err, "unknown option '--bogus'");
    assert_int_equal(parse(&o, err, sizeof err, 2, "stray"), -1);
    assert_int_equal(parse(&o, err, sizeof err, 2, "-f"), -1);
    assert_string_equal(err, "option -f needs a value");
    assert_int_equal(parse(&o, err, sizeof err, 3, "--sandbox", "loose"), -1);
    assert_int_equal(parse(&o, err, sizeof err, 3, "--interrupt-grace", "-1"), -1);
    assert_int_equal(parse(&o, err, sizeof err, 3, "--procs", "0"), -1);
    assert_int_equal(parse(&o, err, sizeof err, 2, "--thing"), -1);
    assert_string_equal(err, "--thing needs a value");
    assert_int_equal(parse(&o, err, sizeof err, 3, "--help", "--version"), 0);
    assert_true(o.help && o.version);
}

/* Writes data[0..len) to dir/name with mode (chmod'ed: the umask does not
 * apply); returns the path (free it). */
static char *env_file(const char *dir, const char *name, const void *data, size_t len, mode_t mode)
{
    char *p = NULL;
    assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
    assert_int_equal(chmod(p, mode), 0);
    return p;
}

/* parse() of "--env-file path" that must fail with every one of the words
 * (NULL-terminated) in the message, and never with secret in it. */
static void env_file_refused(const char *path, const char *secret, ...)
{
    kopts o;
    char err[512] = "";
    assert_int_equal(parse(&o, err, sizeof err, 3, "--env-file", path), -1);
    assert_null(o.env[0]);
    assert_null(o.env_file_data);
    assert_non_null(strstr(err, path));
    va_list ap;
    va_start(ap, secret);
    for (const char *w; (w = va_arg(ap, const char *));)
        if (!strstr(err, w)) {
            print_message("'%s' lacks '%s'\n", err, w);
            fail();
        }
    va_end(ap);
    if (secret)
        assert_null(strstr(err, secret));
}

static void test_kopts_env_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_kopts_envXXXXXX";
    assert_non_null(mkdtemp(dir));
    kopts o;
    char err[512];

    /* entries in order with --env; a final NUL is optional */
    static const char good[] = "A=1\0B=two words\0EMPTY=\0EQ=x=y";
    char *p = env_file(dir, "env", good, sizeof good - 1, 0600);
    assert_int_equal(parse(&o, err, sizeof err, 5, "--env", "X=0", "--env-file", p), 0);
    assert_string_equal(o.env[0], "X=0");
    assert_string_equal(o.env[1], "A=1");
    assert_string_equal(o.env[2], "B=two words");
    assert_string_equal(o.env[3], "EMPTY=");
    assert_string_equal(o.env[4], "EQ=x=y");
    assert_null(o.env[5]);
    kworker_spec spec;
    memset(&spec, 0, sizeof spec);
    assert_int_equal(kspec_add_env(&spec, "A", "from the backend"), 0);
    assert_int_equal(kopts_apply_spec(&o, &spec, err, sizeof err), 0);
    assert_string_equal(spec.env[0], "A=1"); /* the user's wins */
    assert_string_equal(spec.env[1], "X=0");
    kspec_clear(&spec);
    kopts_clear(&o);
    assert_null(o.env[0]);
    assert_null(o.env_file_data);
    kopts_clear(&o); /* twice: nothing left */
    free(p);
    /* --env-file=FILE; read-only for its owner is fine too */
    p = env_file(dir, "env2", "A=1\0", 4, 0400);
    char *opt = NULL;
    assert_true(asprintf(&opt, "--env-file=%s", p) > 0);
    assert_int_equal(parse(&o, err, sizeof err, 2, opt), 0);
    assert_string_equal(o.env[0], "A=1");
    assert_null(o.env[1]);
    kopts_clear(&o);
    free(opt);
    /* an empty file: no variables */
    free(p);
    p = env_file(dir, "empty", "", 0, 0600);
    assert_int_equal(parse(&o, err, sizeof err, 3, "--env-file", p), 0);
    assert_null(o.env[0]);
    kopts_clear(&o);
    /* a usage error after a file was read frees it (valgrind checks) */
    assert_int_equal(parse(&o, err, sizeof err, 4, "--env-file", p, "--bogus"), -1);
    assert_int_equal(parse(&o, err, sizeof err, 5, "--env-file", p, "--env-file", p), -1);
    assert_non_null(strstr(err, "only one --env-file"));
    free(p);

    /* refusals: each names the file and why */
    p = env_file(dir, "target", good, sizeof good, 0600);
    char *l = NULL;
    assert_true(asprintf(&l, "%s/link", dir) > 0);
    assert_int_equal(symlink(p, l), 0);
    env_file_refused(l, NULL, "symbolic link", (char *)NULL);
    assert_int_equal(chmod(p, 0644), 0);
    env_file_refused(p, NULL, "mode 0644", "0600", (char *)NULL);
    assert_int_equal(chmod(p, 0660), 0);
    env_file_refused(p, NULL, "mode 0660", (char *)NULL);
    assert_int_equal(chmod(p, 0600), 0);
    if (geteuid() == 0) {
        assert_int_equal(chown(p, 65534, 65534), 0);
        env_file_refused(p, NULL, "owned by uid 65534", "uid 0", (char *)NULL);
        assert_int_equal(chown(p, 0, 0), 0);
    }
    char *missing = NULL;
    assert_true(asprintf(&missing, "%s/missing", dir) > 0);
    env_file_refused(missing, NULL, "No such file", (char *)NULL);
    env_file_refused(dir, NULL, "not a regular file", (char *)NULL);
    char *fifo = NULL;
    assert_true(asprintf(&fifo, "%s/fifo", dir) > 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    env_file_refused(fifo, NULL, "not a regular file", (char *)NULL); /* and no hang */
    free(p);

    /* too big: refused before it is read */
    size_t big_len = KOPTS_MAX_ENV_FILE + 1;
    char *big = malloc(big_len);
    assert_non_null(big);
    memset(big, 'v', big_len);
    memcpy(big, "BIG=", 4);
    p = env_file(dir, "big", big, big_len, 0600);
    env_file_refused(p, NULL, "bytes (limit", (char *)NULL);
    free(p);
    /* one value over KENV_MAX_VALUE: named, the limit given, the value not */
    p = env_file(dir, "bigvalue", big, KENV_MAX_VALUE + 10, 0600);
    env_file_refused(p, "vvvvvvvvvvvvvvvv", "entry 1 (BIG)", "limit 32768 bytes per value",
                     (char *)NULL);
    free(p);
    free(big);

    /* bad entries: named by number, never quoted */
    static const char noeq[] = "A=1\0SECRETVALUE\0";
    p = env_file(dir, "noeq", noeq, sizeof noeq - 1, 0600);
    env_file_refused(p, "SECRETVALUE", "entry 2", "expected NAME=VALUE", (char *)NULL);
    free(p);
    static const char hole[] = "A=1\0\0B=2";
    p = env_file(dir, "hole", hole, sizeof hole - 1, 0600);
    env_file_refused(p, NULL, "entry 2", "empty", (char *)NULL);
    free(p);
    static const char badname[] = "1BAD=secret";
    p = env_file(dir, "badname", badname, sizeof badname - 1, 0600);
    env_file_refused(p, "secret", "entry 1", "invalid variable name", (char *)NULL);
    free(p);
    static const char reserved[] = "KERNELMGR_REQ_FD=3";
    p = env_file(dir, "reserved", reserved, sizeof reserved - 1, 0600);
    env_file_refused(p, NULL, "entry 1", "set by the kernel itself", (char *)NULL);
    free(p);

    /* --env and --env-file count toward one limit */
    char *many = calloc(KOPTS_MAX_ENV, 16);
    size_t mlen = 0;
    for (int i = 0; i < KOPTS_MAX_ENV; i++)
        mlen += (size_t)sprintf(many + mlen, "V%d=x", i) + 1;
    p = env_file(dir, "many", many, mlen, 0600);
    assert_int_equal(parse(&o, err, sizeof err, 3, "--env-file", p), 0);
    kopts_clear(&o);
    assert_int_equal(parse(&o, err, sizeof err, 5, "--env", "X=0", "--env-file", p), -1);
    assert_non_null(strstr(err, p));
    char want[64];
    snprintf(want, sizeof want, "entry %d (V%d)", KOPTS_MAX_ENV, KOPTS_MAX_ENV - 1);
    assert_non_null(strstr(err, want));
    snprintf(want, sizeof want, "too many variables (limit %d) with --env and --env-file",
             KOPTS_MAX_ENV);
    assert_non_null(strstr(err, want));
    assert_null(o.env[0]);
    free(p);
    free(many);

    unlink(fifo);
    free(fifo);
    free(missing);
    unlink(l);
    free(l);
    const char *names[] = {"env",  "env2", "empty",   "target",   "big",  "bigvalue",
                           "noeq", "hole", "badname", "reserved", "many", NULL};
    for (int i = 0; names[i]; i++) {
        char *q = NULL;
        assert_true(asprintf(&q, "%s/%s", dir, names[i]) > 0);
        unlink(q);
        free(q);
    }
    assert_int_equal(rmdir(dir), 0);
}

/* ---------------------------------------------------------------- khistory */

static json_t *query(khistory *h, const char *json)
{
    json_t *req = json_loads(json, 0, NULL);
    assert_non_null(req);
    json_t *r = khistory_query(h, req);
    json_decref(req);
    return r;
}

static void assert_json(json_t *got, const char *want)
{
    json_t *w = json_loads(want, 0, NULL);
    assert_non_null(w);
    if (!json_equal(got, w)) {
        char *g = json_dumps(got, JSON_COMPACT);
        print_message("got %s\nwant %s\n", g, want);
        free(g);
        fail();
    }
    json_decref(w);
    json_decref(got);
}

/* A history file whose connection file is gone is swept at a kernel's end;
 * its own, a live kernel's, one that is not a history of ours and a
 * symlink's target stay. */
static void put(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int present(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return lstat(p, &st) == 0;
}

static void test_khistory_sweep(void **state)
{
    (void)state;
    char dir[] = "/tmp/test_kserver_sweepXXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *rec = "{\"session\":1,\"line\":1,\"input\":\"1\"}\n";
    put(dir, "own.json", "{}");
    put(dir, "own.json.history.jsonl", rec);
    put(dir, "live.json", "{}");
    put(dir, "live.json.history.jsonl", rec);
    put(dir, "gone.json.history.jsonl", rec);
    put(dir, "empty.json.history.jsonl", "");
    put(dir, "notes.history.jsonl", "my notes\n");
    put(dir, "target", rec);
    char link[512], target[512];
    snprintf(link, sizeof link, "%s/link.json.history.jsonl", dir);
    snprintf(target, sizeof target, "%s/target", dir);
    assert_int_equal(symlink(target, link), 0);
    char own[512];
    snprintf(own, sizeof own, "%s/own.json.history.jsonl", dir);
    /* this kernel's own file stays even when its connection file went first */
    char cf[512];
    snprintf(cf, sizeof cf, "%s/own.json", dir);
    unlink(cf);
    khistory_sweep(own);
    assert_true(present(dir, "own.json.history.jsonl"));
    assert_true(present(dir, "live.json.history.jsonl"));
    assert_false(present(dir, "gone.json.history.jsonl"));
    assert_false(present(dir, "empty.json.history.jsonl"));
    assert_true(present(dir, "notes.history.jsonl"));
    assert_true(present(dir, "link.json.history.jsonl"));
    assert_true(present(dir, "target"));
    khistory_sweep(NULL); /* nothing to do */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_khistory(void **state)
{
    (void)state;
    char path[] = "/tmp/test_kserver_histXXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    khistory *h = khistory_open(path, 1u << 20);
    assert_non_null(h);
    assert_int_equal(khistory_session(h), 1);
    khistory_add(h, 1, "echo a");
    khistory_add(h, 2, "x=1");
    khistory_add(h, 3, "echo a");
    assert_json(query(h, "{\"hist_access_type\": \"tail\", \"n\": 2}"),
                "[[1, 2, \"x=1\"], [1, 3, \"echo a\"]]");
    assert_json(query(h, "{\"hist_access_type\": \"range\", \"session\": 0, \"start\": 2,"
                         " \"stop\": 3, \"output\": true}"),
                "[[1, 2, [\"x=1\", null]]]");
    assert_json(query(h, "{\"hist_access_type\": \"search\", \"pattern\": \"echo*\"}"),
                "[[1, 1, \"echo a\"], [1, 3, \"echo a\"]]");
    assert_json(query(h, "{\"hist_access_type\": \"search\", \"pattern\": \"echo*\","
                         " \"unique\": true}"),
                "[[1, 3, \"echo a\"]]");
    assert_json(query(h, "{\"hist_access_type\": \"bogus\"}"), "[]");
    khistory_destroy(&h);
    assert_null(h);

    /* the next kernel run reads the file back as an older session */
    FILE *f = fopen(path, "a");
    fputs("not json\n{\"session\": \"x\"}\n", f);
    fclose(f);
    h = khistory_open(path, 1u << 20);
    assert_int_equal(khistory_session(h), 2);
    khistory_add(h, 1, "new");
    assert_json(query(h, "{\"hist_access_type\": \"range\", \"session\": -1, \"start\": 1,"
                         " \"stop\": 0}"),
                "[[1, 1, \"echo a\"], [1, 2, \"x=1\"], [1, 3, \"echo a\"]]");
    assert_json(query(h, "{\"hist_access_type\": \"tail\", \"n\": 1}"), "[[2, 1, \"new\"]]");
    khistory_destroy(&h);
    unlink(path);

    h = khistory_open(NULL, 1u << 20); /* memory only */
    khistory_add(h, 1, "only");
    assert_json(query(h, "{}"), "[[1, 1, \"only\"]]");
    khistory_destroy(&h);
}

/* ---------------------------------------------------------------- kspec */

static void test_kspec(void **state)
{
    (void)state;
    kworker_spec spec;
    memset(&spec, 0, sizeof spec);
    assert_int_equal(kspec_add_arg(&spec, "/bin/bash"), 0);
    assert_int_equal(kspec_add_env(&spec, "A", "1"), 0);
    assert_int_equal(kspec_add_env(&spec, "A", "2"), 0); /* replaces */
    assert_int_equal(kspec_add_env(&spec, "B=C", "x"), -1);
    assert_string_equal(spec.env[0], "A=2");
    assert_null(spec.env[1]);
    for (int i = 1; i < KSPEC_MAX_ARGS; i++)
        assert_int_equal(kspec_add_arg(&spec, "x"), 0);
    assert_int_equal(kspec_add_arg(&spec, "one too many"), -1);
    assert_null(spec.argv[KSPEC_MAX_ARGS]);
    assert_int_equal(kspec_add_ro_path(&spec, "/usr"), 0);
    spec.kernel_info = json_object();
    kspec_clear(&spec);
    assert_null(spec.argv[0]);
    assert_null(spec.kernel_info);
    kspec_clear(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kstream_timing),
        cmocka_unit_test(test_kstream_keeps_split_character),
        cmocka_unit_test(test_kstream_full_and_invalid),
        cmocka_unit_test(test_kopts_sizes),
        cmocka_unit_test(test_kopts_parse),
        cmocka_unit_test(test_kopts_env_file),
        cmocka_unit_test(test_khistory),
        cmocka_unit_test(test_khistory_sweep),
        cmocka_unit_test(test_kspec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
