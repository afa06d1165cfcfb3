/*
 * code_exec.c — libkernelmgr's example (docs/EMBEDDING.md): connect to the
 * kernelmgr daemon (starting it when none runs), create a session, run
 * Python and Bash with their output streamed as it arrives, print each
 * result, read a file the code wrote, and close the session.
 *
 *   cc code_exec.c $(pkg-config --cflags --libs kernelmgr) -o code_exec
 *   ./code_exec [-s SESSION] [-o KEY=VALUE]... [-d PATH-OF-kernelmgr] [-k]
 *
 * -o sets a session option (memory=512M, cpus=0.5, network=off, ...: a
 * value that reads as a number is sent as one); -k keeps the session.
 * Exit status: 0, or the error's code (kernelmgr.h, the CLI's numbers).
 */
#include <kernelmgr.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The streaming callback: prints each event as it arrives. */
static int on_event(const kernelmgr_event *ev, void *ud)
{
    (void)ud;
    switch (ev->kind) {
    case KERNELMGR_EVENT_STDOUT:
        printf("[stream stdout] %.*s", (int)ev->len, ev->text);
        break;
    case KERNELMGR_EVENT_STDERR:
        printf("[stream stderr] %.*s", (int)ev->len, ev->text);
        break;
    case KERNELMGR_EVENT_NOTICE:
        printf("[notice] %.*s\n", (int)ev->len, ev->text);
        break;
    case KERNELMGR_EVENT_RESULT:
        printf("[block %d done] %s\n", ev->block, kernelmgr_result_status(ev->result, 0));
        break;
    }
    fflush(stdout);
    return 0; /* non-zero would interrupt the running code */
}

/* Prints every block of r. */
static void print_result(const kernelmgr_result *r)
{
    for (size_t b = 0; b < kernelmgr_result_blocks(r); b++) {
        printf("block %zu: language=%s status=%s exit_code=%d\n", b,
               kernelmgr_result_language(r, b), kernelmgr_result_status(r, b),
               kernelmgr_result_exit_code(r, b));
        size_t n;
        const char *out = kernelmgr_result_stdout(r, b, &n);
        if (out && n)
            printf("  stdout: %.*s", (int)n, out);
        const char *err = kernelmgr_result_stderr(r, b, &n);
        if (err && n)
            printf("  stderr: %.*s", (int)n, err);
        for (size_t i = 0; i < kernelmgr_result_outputs(r, b); i++) {
            const char *text = kernelmgr_result_output_data(r, b, i, "text/plain", &n);
            printf("  %s:", kernelmgr_result_output_is_result(r, b, i) ? "result" : "display");
            for (size_t j = 0; j < kernelmgr_result_output_mimes(r, b, i); j++)
                printf(" %s", kernelmgr_result_output_mime(r, b, i, j));
            if (text)
                printf(" = %.*s", (int)n, text);
            printf("\n");
        }
        if (kernelmgr_result_error_name(r, b))
            printf("  error: %s: %s (%zu traceback lines)\n", kernelmgr_result_error_name(r, b),
                   kernelmgr_result_error_value(r, b), kernelmgr_result_traceback_lines(r, b));
        for (size_t i = 0; i < kernelmgr_result_files(r, b); i++)
            printf("  file %s: %s\n", kernelmgr_result_file_change(r, b, i),
                   kernelmgr_result_file_path(r, b, i));
    }
}

/* Prints e, frees it, returns its code as the exit status. */
static int fail(const char *what, kernelmgr_error *e)
{
    int code = kernelmgr_error_code(e);
    fprintf(stderr, "code_exec: %s: %s (code %d)\n", what, kernelmgr_error_message(e), code);
    kernelmgr_error_free(e);
    return code ? code : 1;
}

/* Sets -o KEY=VALUE on o: a value that reads as a whole number or a
 * decimal is a number. */
static int set_option(kernelmgr_options *o, const char *kv, kernelmgr_error **err)
{
    const char *eq = strchr(kv, '=');
    if (!eq) {
        fprintf(stderr, "code_exec: -o %s: expected KEY=VALUE\n", kv);
        exit(2);
    }
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
    char *end;
    double d = strtod(eq + 1, &end);
    if (eq[1] && !*end)
        return kernelmgr_options_set_number(o, key, d, err);
    return kernelmgr_options_set(o, key, eq + 1, err);
}

int main(int argc, char **argv)
{
    const char *name = "c-example", *daemon = NULL;
    int keep = 0, opt, rc = 0;
    kernelmgr_error *err = NULL;
    kernelmgr_options *opts = kernelmgr_options_new();
    if (!opts)
        return 6;
    while ((opt = getopt(argc, argv, "s:o:d:k")) != -1) {
        if (opt == 's')
            name = optarg;
        else if (opt == 'o' && set_option(opts, optarg, &err))
            return fail("option", err);
        else if (opt == 'd')
            daemon = optarg;
        else if (opt == 'k')
            keep = 1;
        else if (opt != 'o') {
            fprintf(stderr, "usage: %s [-s SESSION] [-o KEY=VALUE]... [-d KERNELMGR] [-k]\n",
                    argv[0]);
            return 2;
        }
    }
    printf("libkernelmgr %s\n", kernelmgr_version());

    kernelmgr_client *c = kernelmgr_connect(NULL, daemon, KERNELMGR_AUTOSTART, &err);
    if (!c) {
        kernelmgr_options_free(opts);
        return fail("connect", err);
    }
    kernelmgr_session *s = kernelmgr_session_open(c, name, opts, &err);
    kernelmgr_options_free(opts);
    if (!s) {
        rc = fail("session", err);
        kernelmgr_client_free(c);
        return rc;
    }
    printf("session %s (%s)\n", kernelmgr_session_name(s),
           kernelmgr_session_created(s) ? "created" : "existing");

    static const struct {
        const char *lang, *code;
    } cells[] = {
        {"python", "import sys\nfor i in range(3):\n    print('python line', i, flush=True)\n"
                   "print('a warning', file=sys.stderr)\nx = 6 * 7\nx\n"},
        {"bash", "echo \"hello from bash, x is not here: ${x:-unset}\"\n"
                 "echo 'written by bash' > note.txt\nfalse\n"},
        {"python", "print(x)\n1 / 0\n"},
    };
    for (size_t i = 0; i < sizeof cells / sizeof cells[0]; i++) {
        printf("--- %s\n", cells[i].lang);
        kernelmgr_result *r =
            kernelmgr_exec(s, cells[i].code, cells[i].lang, 30, 0, on_event, NULL, &err);
        if (!r) {
            rc = fail("exec", err);
            break;
        }
        print_result(r);
        kernelmgr_result_free(r);
    }

    size_t n = 0;
    char *note = rc ? NULL : kernelmgr_file_read(s, "note.txt", 1 << 20, &n, &err);
    if (note)
        printf("note.txt (%zu bytes): %s", n, note);
    else if (!rc)
        rc = fail("files.read", err);
    kernelmgr_free(note);

    if (!keep && kernelmgr_session_close(s, 0, &err))
        rc = fail("close", err);
    else
        printf("session %s %s\n", name, keep ? "kept" : "closed");
    kernelmgr_session_free(s);
    kernelmgr_client_free(c);
    return rc;
}
