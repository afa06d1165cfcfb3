/*
 * cli_child.h — `kernelmgr ARGS...` (cli_main) run in a child of a unit
 * test, as a shell would run it: stdin from a file (or /dev/null), stdout
 * and stderr captured in files, KERNELMGR_HOME set. A child of its own,
 * because cli_main closes stdout at its end (and a command may exit).
 */
#ifndef TESTS_CLI_CHILD_H
#define TESTS_CLI_CHILD_H

/* How to run it (borrowed for the call). */
typedef struct cli_child {
    const char *dir;        /* the capture files' directory, and KERNELMGR_HOME */
    const char *in;         /* stdin's content; NULL: /dev/null */
    const char *out_path;   /* stdout into this file (e.g. /dev/full); NULL: captured */
    const char *const *env; /* NAME=VALUE set in the child, NULL-ended; or NULL */
} cli_child;

/* What it did: its exit status, stdout ("" when out_path) and stderr
 * (owned: cli_outcome_free). */
typedef struct cli_outcome {
    int status;
    char *out, *err;
} cli_outcome;

/* Runs `kernelmgr ARGS...` (args NULL-terminated, without "kernelmgr");
 * fails the test when the child does not exit (a signal). */
cli_outcome cli_child_run(const cli_child *how, const char *const *args);
void cli_outcome_free(cli_outcome *r);

/* A whole file (new, NUL-terminated); fails the test when unreadable. */
char *cli_child_slurp(const char *path);

#endif
