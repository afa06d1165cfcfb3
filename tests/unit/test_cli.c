/*
 * test_cli.c — the command line (kernelmgr/frontends/cli*.c) without a
 * daemon: each case runs cli_main() in a child of its own (it closes stdout
 * at the end) with stdout and stderr in files and a fresh KERNELMGR_HOME.
 * --help lists every command and every session option's flag (sessopt.def
 * drives both); bad command lines exit 2 with a message that names what is
 * wrong and keep the home untouched; `run` drives an in-process manager in
 * front of the fake kernel (fake_kernel.h): live output, --json, a failing
 * block's exit status, code that is refused before anything starts, a
 * stdout that cannot be written (exit 7); the commands that must not start
 * a daemon say that none runs.
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

#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "common/cm_clock.h"
#include "kernelmgr/engine/config.h"
#include "kernelmgr/service/daemon.h"
#include "tests/unit/cli_child.h"
#include "tests/unit/fake_daemon.h"
#include "tests/unit/fake_kernel.h"

#define WATCHDOG_S 120

typedef struct world {
    char home[64];
    char link[PATH_MAX];
    pid_t daemon;       /* with_daemon: the daemon's process, else 0 */
    const char *env[4]; /* NAME=VALUE set in the command's child, NULL-ended */
} world;

typedef cli_outcome outcome;

/* `kernelmgr ARGS...` (NULL-terminated) in a child, its home w's, stdin
 * /dev/null; stdout to out_path when not NULL (e.g. /dev/full), else
 * captured. */
static outcome run_cli_to(world *w, const char *out_path, const char *const *args)
{
    cli_child how = {w->home, NULL, out_path, w->env};
    return cli_child_run(&how, args);
}

static outcome run_cli(world *w, const char *const *args)
{
    return run_cli_to(w, NULL, args);
}

static void outcome_free(outcome *r)
{
    cli_outcome_free(r);
}

/* r exited with status and its stderr holds want (when not NULL). */
static void expect(const outcome *r, int status, const char *want_err)
{
    if (r->status != status || (want_err && !strstr(r->err, want_err)))
        print_message("exit %d (want %d)\nstdout: %s\nstderr: %s\n(wanted on stderr: %s)\n",
                      r->status, status, r->out, r->err, want_err ? want_err : "");
    assert_int_equal(r->status, status);
    if (want_err)
        assert_non_null(strstr(r->err, want_err));
}

static int setup(void **state)
{
    alarm(WATCHDOG_S);
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    assert_int_equal(fake_tmp_dir(w->home, sizeof w->home, "test_cli"), 0);
    fake_daemon_config(w->home, w->link, sizeof w->link, NULL);
    *state = w;
    return 0;
}

static int teardown(void **state)
{
    world *w = *state;
    fake_tmp_remove(w->home);
    free(w);
    alarm(0);
    return 0;
}

/* A daemon on w's home, in a child of its own (daemon_serve, what `serve`
 * runs after its gateway check), its kernels the fake one; the commands
 * then talk to it as to any daemon. The fixture waits until it answers. */
static int setup_daemon(void **state)
{
    setup(state);
    world *w = *state;
    w->daemon = fake_daemon_start(w->home, NULL);
    return 0;
}

/* `serve --stop`, and the daemon has ended with status 0. */
static int teardown_daemon(void **state)
{
    world *w = *state;
    fake_daemon_stop(w->home, w->daemon);
    return teardown(state);
}

/* --help: every command, and every session option's flag from its row in
 * sessopt.def, with its help. */
static void help_lists_every_command_and_option(void **state)
{
    world *w = *state;
    outcome r = run_cli(w, (const char *[]){"--help", NULL});
    expect(&r, 0, NULL);
    static const char *const commands[] = {"run [opts]",
                                           "exec --session NAME",
                                           "sessions [--repair NAME]",
                                           "close NAME",
                                           "interrupt NAME",
                                           "restart NAME",
                                           "files NAME",
                                           "files get NAME PATH",
                                           "files put NAME LOCAL",
                                           "files ls NAME",
                                           "files rm NAME PATH",
                                           "export NAME",
                                           "session export NAME FILE",
                                           "session import FILE",
                                           "connection-file NAME",
                                           "snapshot NAME",
                                           "snapshots NAME",
                                           "restore NAME",
                                           "fork SRC NEW",
                                           "serve [--pool N]",
                                           "doctor",
                                           "kernelspec install",
                                           "install --session NAME",
                                           "drain",
                                           "undrain",
                                           "mcp",
                                           "config --doc"};
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
        if (!strstr(r.out, commands[i]))
            print_message("--help lacks \"%s\"\n", commands[i]);
        assert_non_null(strstr(r.out, commands[i]));
    }
#define KM_SO_DEF_BOOL(n, fl, sf, t, d, ch, ah, lh) "--" fl " on|off",
#define KM_SO_DEF_NUMBER(n, fl, sf, t, lo, hi, z, u, wu, wn, mv, ch, ah, lh) "--" fl " " mv,
#define KM_SO_DEF_SIZE(n, fl, sf, t, lo, hi, d, wu, wn, mv, ch, ah, lh) "--" fl " " mv,
    static const char *const flags[] = {
#include "kernelmgr/engine/sessopt.def"
    };
#undef KM_SO_DEF_BOOL
#undef KM_SO_DEF_NUMBER
#undef KM_SO_DEF_SIZE
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        if (!strstr(r.out, flags[i]))
            print_message("--help lacks \"%s\"\n", flags[i]);
        assert_non_null(strstr(r.out, flags[i]));
    }
    assert_non_null(strstr(r.out, "Exit status: 0 ok"));
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"--version", NULL});
    expect(&r, 0, NULL);
    assert_int_equal(strncmp(r.out, "kernelmgr ", 10), 0);
    outcome_free(&r);
}

/* Bad command lines: exit 2, the reason on stderr, nothing on stdout. */
static void usage_errors_say_what_is_wrong(void **state)
{
    world *w = *state;
    static const struct {
        const char *args[8];
        const char *want;
    } cases[] = {
        {{NULL}, "no command given"},
        {{"frobnicate", NULL}, "unknown command \"frobnicate\""},
        {{"run", "--frob", NULL}, "unknown option \"--frob\""},
        {{"run", "--timeout", NULL}, "option --timeout needs a value"},
        {{"run", "--cpus", "0", "-c", "x", NULL},
         "--cpus must be a number of CPUs from 0.01 to 4096 (got \"0\")"},
        {{"run", "--memory", "12", "-c", "x", NULL}, "--memory"},
        {{"run", "--zygote", "maybe", "-c", "x", NULL}, "--zygote"},
        {{"run", "--network", "sideways", "-c", "x", NULL}, "--network"},
        {{"run", "--env", "NOEQUALS", "-c", "x", NULL}, "--env"},
        {{"run", "-c", "x", "file.py", NULL}, "give either -c CODE or a FILE, not both"},
        {{"run", NULL}, "no code given: use -c CODE, a FILE, or - for stdin"},
        {{"run", "/nonexistent/code.py", NULL}, "/nonexistent/code.py: No such file"},
        {{"exec", "-c", "x", NULL}, "exec needs --session NAME"},
        {{"exec", "--session", "../up", "-c", "x", NULL}, "invalid session name \"../up\""},
        {{"close", NULL}, "close needs a session NAME"},
        {{"fork", "a", NULL}, "fork needs SRC and NEW"},
        {{"files", "get", "s", NULL}, "usage: kernelmgr files get"},
        {{"config", "--doc", "colours", NULL}, "config --doc takes keys"},
        {{"install", "--session", "s", NULL}, "install needs 1 to 50 package names"},
        {{"doctor", "extra", NULL}, "doctor takes no arguments"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        outcome r = run_cli(w, cases[i].args);
        expect(&r, 2, cases[i].want);
        if (r.out[0])
            print_message("%s: stdout \"%s\"\n", cases[i].want, r.out);
        assert_string_equal(r.out, "");
        outcome_free(&r);
    }
    /* none of them started a daemon or made a session */
    char p[PATH_MAX];
    struct stat sb;
    snprintf(p, sizeof p, "%s/kernelmgr.sock", w->home);
    assert_int_equal(stat(p, &sb), -1);
}

/* `run` in front of the fake kernel: the output live, then the exit
 * status of the blocks. */
static void run_shows_output_and_its_status(void **state)
{
    world *w = *state;
    outcome r = run_cli(w, (const char *[]){"run", "--lang", "fake", "-c", "out hello", NULL});
    expect(&r, 0, NULL);
    assert_string_equal(r.out, "hello\n");
    outcome_free(&r);

    r = run_cli(w, (const char *[]){"run", "--lang", "fake", "-c", "err oops\nfail", NULL});
    expect(&r, 1, "oops");
    assert_non_null(strstr(r.out, "[fake block error, exit code 1,"));
    outcome_free(&r);

    /* --json: one object per block, the live output in it */
    r = run_cli(
        w, (const char *[]){"run", "--lang", "fake", "--json", "-c", "out a\nresult 42", NULL});
    expect(&r, 0, NULL);
    json_error_t e;
    json_t *o = json_loads(r.out, 0, &e);
    if (!o)
        print_message("not one JSON object: %s (%s)\n", r.out, e.text);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "status")), "ok");
    assert_string_equal(json_string_value(json_object_get(o, "stdout")), "a\n");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(o, "result"), "text/plain")), "42");
    json_decref(o);
    outcome_free(&r);

    /* a run leaves no session behind */
    r = run_cli(w, (const char *[]){"sessions", NULL});
    expect(&r, 0, NULL);
    assert_string_equal(r.out, "no sessions (no daemon running)\n");
    outcome_free(&r);
}

/* Code that is not UTF-8 is refused before a kernel starts (exit 2). */
static void run_refuses_bad_code_first(void **state)
{
    world *w = *state;
    outcome r = run_cli(w, (const char *[]){"run", "--lang", "fake", "-c", "out \xff\xfe", NULL});
    expect(&r, 2, "UTF-8");
    assert_string_equal(r.out, "");
    outcome_free(&r);
}

/* A stdout that cannot be written: exit 7, said on stderr. */
static void unwritable_output_exits_7(void **state)
{
    world *w = *state;
    outcome r = run_cli_to(w, "/dev/full",
                           (const char *[]){"run", "--lang", "fake", "-c", "out hello", NULL});
    expect(&r, 7, "cannot write the output");
    outcome_free(&r);
    r = run_cli_to(w, "/dev/full", (const char *[]){"--help", NULL});
    expect(&r, 7, NULL);
    outcome_free(&r);
}

/* The commands that must not start a daemon say that none runs. */
static void without_a_daemon(void **state)
{
    world *w = *state;
    outcome r = run_cli(w, (const char *[]){"sessions", "--json", NULL});
    expect(&r, 0, NULL);
    assert_string_equal(r.out, "[]\n");
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"drain", NULL});
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "no daemon running: nothing to drain"));
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"serve", "--stop", NULL});
    assert_int_not_equal(r.status, 2);
    outcome_free(&r);
}

/* `config --doc`: the configuration keys' table comes from config.c's
 * table; the API's session options from dtier.c's. */
static void config_doc_prints_the_tables(void **state)
{
    world *w = *state;
    outcome r = run_cli(w, (const char *[]){"config", "--doc", NULL});
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "| `cpus` |"));
    assert_non_null(strstr(r.out, "| `max_kernels` |"));
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"config", "--doc", "session-options", NULL});
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "`cpu_time`"));
    outcome_free(&r);
}

/* `kernelspec install --prefix DIR`: a kernelspec per language, the
 * configured one included, whose argv starts the backend as the manager
 * does (the configured path: a symbolic link stays one) with the options
 * given. */
static void kernelspec_install_writes_each_language(void **state)
{
    world *w = *state;
    char prefix[PATH_MAX], kdir[PATH_MAX + 32], path[PATH_MAX + 64];
    snprintf(prefix, sizeof prefix, "%s/prefix", w->home);
    /* the kernels' directory: links to an executable stand in for them
     * (the installer checks that each can be run, and must name the link) */
    char kernels[PATH_MAX], bin_path[PATH_MAX + 32];
    snprintf(kernels, sizeof kernels, "%s/kernels", w->home);
    assert_int_equal(mkdir(kernels, 0700), 0);
    static const char *const bins[] = {"kernel-python", "kernel-bash"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(bin_path, sizeof bin_path, "%s/%s", kernels, bins[i]);
        assert_int_equal(symlink("/bin/true", bin_path), 0);
    }
    snprintf(kdir, sizeof kdir, "KERNELMGR_KERNEL_DIR=%s", kernels);
    w->env[0] = kdir;
    outcome r =
        run_cli(w, (const char *[]){"kernelspec", "install", "--prefix", prefix, "--sandbox",
                                    "none", "--memory", "1G", "--cpus", "0.5", "--json", NULL});
    expect(&r, 0, NULL);
    json_t *o = json_loads(r.out, 0, NULL);
    assert_non_null(o);
    assert_int_equal(json_array_size(json_object_get(o, "installed")), 3);
    json_decref(o);
    outcome_free(&r);
    static const char *const langs[] = {"python", "bash", "fake"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/share/jupyter/kernels/kernelmgr-%s/kernel.json", prefix,
                 langs[i]);
        json_error_t e;
        json_t *spec = json_load_file(path, 0, &e);
        if (!spec)
            print_message("%s: %s\n", path, e.text);
        assert_non_null(spec);
        json_t *argv = json_object_get(spec, "argv");
        char *a = json_dumps(argv, JSON_COMPACT);
        if (!strstr(a, "\"--sandbox\",\"none\",\"--memory\",\"1G\",\"--cpus\",\"0.5\""))
            print_message("%s\n", a);
        assert_non_null(strstr(a, "\"--sandbox\",\"none\",\"--memory\",\"1G\",\"--cpus\",\"0.5\""));
        free(a);
        /* each backend as the manager starts it: the link, not /bin/true */
        const char *bin = json_string_value(json_array_get(argv, 0));
        if (!strcmp(langs[i], "fake")) {
            assert_string_equal(bin, w->link);
        } else {
            char *real = realpath(kernels, NULL);
            assert_non_null(real);
            snprintf(bin_path, sizeof bin_path, "%s/kernel-%s", real, langs[i]);
            free(real);
            assert_string_equal(bin, bin_path);
        }
        assert_string_equal(json_string_value(json_object_get(spec, "language")), langs[i]);
        json_decref(spec);
    }
    w->env[0] = NULL;
    r = run_cli(w, (const char *[]){"kernelspec", "install", "--user", "--prefix", prefix, NULL});
    expect(&r, 2, "give --user or --prefix DIR, not both");
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"kernelspec", "remove", NULL});
    expect(&r, 2, "usage: kernelmgr kernelspec install");
    outcome_free(&r);
}

/* A session through the daemon: its state kept between exec commands,
 * listed, its files put, listed, read back and removed, interrupted,
 * restarted (state lost) and closed. */
static void a_session_through_the_daemon(void **state)
{
    world *w = *state;
    outcome r = run_cli(
        w, (const char *[]){"exec", "--session", "s", "--lang", "fake", "-c", "out one", NULL});
    expect(&r, 0, NULL);
    assert_string_equal(r.out, "one\n");
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"exec", "--session", "s", "--lang", "fake", "-c",
                                    "err two\nfail", NULL});
    expect(&r, 1, "two");
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"sessions", "--json", NULL});
    expect(&r, 0, NULL);
    json_t *list = json_loads(r.out, 0, NULL);
    assert_true(json_is_array(list));
    assert_int_equal(json_array_size(list), 1);
    assert_string_equal(json_string_value(json_object_get(json_array_get(list, 0), "name")), "s");
    json_decref(list);
    outcome_free(&r);

    char local[PATH_MAX];
    snprintf(local, sizeof local, "%s/local.txt", w->home);
    FILE *f = fopen(local, "we");
    assert_non_null(f);
    fputs("some bytes\n", f);
    fclose(f);
    r = run_cli(w, (const char *[]){"files", "put", "s", local, "in/x.txt", NULL});
    expect(&r, 0, NULL);
    assert_int_equal(strncmp(r.out, "wrote s:in/x.txt (11 bytes from ", 32), 0);
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"files", "ls", "s", "in", "--json", NULL});
    expect(&r, 0, NULL);
    assert_non_null(strstr(r.out, "\"in/x.txt\""));
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"files", "get", "s", "in/x.txt", "-o", "-", NULL});
    expect(&r, 0, NULL);
    assert_string_equal(r.out, "some bytes\n");
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"files", "rm", "s", "in/x.txt", NULL});
    expect(&r, 0, NULL);
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"files", "get", "s", "in/x.txt", "-o", "-", NULL});
    expect(&r, 2, "cannot read in/x.txt from session \"s\": 'in/x.txt': no such file");
    outcome_free(&r);

    r = run_cli(w, (const char *[]){"interrupt", "s", NULL});
    expect(&r, 0, NULL);
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"restart", "s", NULL});
    expect(&r, 0, NULL);
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"close", "s", NULL});
    expect(&r, 0, NULL);
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"sessions", NULL});
    expect(&r, 0, NULL);
    assert_null(strstr(r.out, "s "));
    outcome_free(&r);
    r = run_cli(w, (const char *[]){"close", "s", NULL});
    expect(&r, 3, NULL); /* no such session */
    outcome_free(&r);
}

/* A second daemon on the same home does nothing and says so. */
static void one_daemon_per_home(void **state)
{
    world *w = *state;
    kmcfg cfg;
    kmcfg_defaults(&cfg);
    km_err err = {0};
    assert_int_equal(daemon_serve(w->home, &cfg, &err), DAEMON_SERVE_ALREADY);
    kmcfg_clear(&cfg);
    outcome r = run_cli(
        w, (const char *[]){"exec", "--session", "t", "--lang", "fake", "-c", "out still", NULL});
    expect(&r, 0, NULL);
    assert_string_equal(r.out, "still\n");
    outcome_free(&r);
}

int main(int argc, char **argv)
{
    int part = fake_kernel_main(argc, argv);
    if (part >= 0)
        return part;
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(help_lists_every_command_and_option, setup, teardown),
        cmocka_unit_test_setup_teardown(usage_errors_say_what_is_wrong, setup, teardown),
        cmocka_unit_test_setup_teardown(run_shows_output_and_its_status, setup, teardown),
        cmocka_unit_test_setup_teardown(run_refuses_bad_code_first, setup, teardown),
        cmocka_unit_test_setup_teardown(unwritable_output_exits_7, setup, teardown),
        cmocka_unit_test_setup_teardown(without_a_daemon, setup, teardown),
        cmocka_unit_test_setup_teardown(config_doc_prints_the_tables, setup, teardown),
        cmocka_unit_test_setup_teardown(kernelspec_install_writes_each_language, setup, teardown),
        cmocka_unit_test_setup_teardown(a_session_through_the_daemon, setup_daemon,
                                        teardown_daemon),
        cmocka_unit_test_setup_teardown(one_daemon_per_home, setup_daemon, teardown_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
