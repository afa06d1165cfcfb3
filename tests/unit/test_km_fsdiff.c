/* Unit tests of kernelmgr/engine/fsdiff.c's bounds: what a walk holds is
 * charged in bytes (paths, link text, per-entry overhead) as well as
 * counted, and a walk that did not see everything says what and why
 * (a limit, an unreadable or too deep directory). Real files in a fresh
 * directory under /tmp; no mocks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernelmgr/engine/fsdiff.h"

typedef struct fx {
    char *ws; /* /tmp/km-fsdiff-XXXXXX: the workspace */
} fx;

static char *join(const char *a, const char *b)
{
    char *p = NULL;
    assert_true(asprintf(&p, "%s/%s", a, b) > 0);
    return p;
}

static void put(const char *dir, const char *name)
{
    char *p = join(dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("x", f);
    fclose(f);
    free(p);
}

static char *mkdir_in(const char *dir, const char *name, mode_t mode)
{
    char *p = join(dir, name);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(chmod(p, mode), 0);
    return p;
}

static void rm_rf(const char *path)
{
    /* the test's own cleanup: a plain chmod + rm (the code under test is
     * not trusted to clean up after itself) */
    pid_t pid = fork();
    if (pid == 0) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "chmod -R u+rwx '%s'; rm -rf --one-file-system '%s'", path, path);
        execlp("sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
}

static int setup(void **state)
{
    fx *f = calloc(1, sizeof *f);
    f->ws = strdup("/tmp/km-fsdiff-XXXXXX");
    assert_non_null(mkdtemp(f->ws));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    rm_rf(f->ws);
    free(f->ws);
    free(f);
    return 0;
}

/* a name of exactly len bytes: prefix then 'n's */
static char *name_of(int i, size_t len)
{
    char *n = malloc(len + 1);
    assert_non_null(n);
    memset(n, 'n', len);
    n[len] = '\0';
    char head[16];
    int k = snprintf(head, sizeof head, "%04d", i);
    memcpy(n, head, (size_t)k);
    return n;
}

static const char *limit_of(json_t *why)
{
    return json_string_value(json_object_get(why, "scan_limit"));
}

/* 10 files of 100-byte names: a budget for exactly 4 holds 4 and says
 * files_scan_bytes stopped the walk; one for all 10 is complete. */
static void byte_budget_counts_paths(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 10; i++) {
        char *n = name_of(i, 100);
        put(f->ws, n);
        free(n);
    }
    size_t one = FSDIFF_ENTRY_COST(100, 0);
    fsdiff_snap *s = fsdiff_take(f->ws, 1000, 4 * one);
    assert_true(fsdiff_incomplete(s));
    assert_int_equal(fsdiff_bytes(s), 4 * one);
    json_t *why = fsdiff_incomplete_json(s, NULL);
    assert_non_null(why);
    assert_non_null(strstr(limit_of(why), "files_scan_bytes"));
    assert_non_null(strstr(limit_of(why), "of paths and link text per walk"));
    assert_null(json_object_get(why, "not_walked"));
    assert_true(!strncmp(json_string_value(json_object_get(why, "reason")),
                         "not every file was walked: the walk stopped at files_scan_bytes: ", 65));
    json_decref(why);
    /* the listing charges each entry its JSON object as well */
    size_t omitted = 99;
    json_t *list = fsdiff_list(s, 100, &omitted);
    size_t listed = json_array_size(list);
    assert_int_equal(listed, 4 * one / FSDIFF_REPORT_COST(100, 0));
    assert_int_equal(listed + omitted, 4);
    json_decref(list);
    fsdiff_destroy(&s);

    s = fsdiff_take(f->ws, 1000, 10 * one);
    assert_false(fsdiff_incomplete(s));
    assert_null(fsdiff_incomplete_json(s, NULL));
    assert_int_equal(fsdiff_bytes(s), 10 * one);
    fsdiff_destroy(&s);
}

/* a symlink is charged its text as well (as long as the walk reads it) */
static void byte_budget_counts_link_text(void **state)
{
    fx *f = *state;
    char target[2001];
    memset(target, 't', 2000);
    target[2000] = '\0';
    char *l = join(f->ws, "link");
    assert_int_equal(symlink(target, l), 0);
    free(l);
    size_t cost = FSDIFF_ENTRY_COST(4, 2000);
    fsdiff_snap *s = fsdiff_take(f->ws, 1000, cost - 1);
    assert_true(fsdiff_incomplete(s));
    assert_int_equal(fsdiff_bytes(s), 0);
    fsdiff_destroy(&s);
    s = fsdiff_take(f->ws, 1000, cost);
    assert_false(fsdiff_incomplete(s));
    assert_int_equal(fsdiff_bytes(s), cost);
    fsdiff_destroy(&s);
}

/* the count limit is named with its value */
static void count_limit_is_named(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 5; i++) {
        char *n = name_of(i, 8);
        put(f->ws, n);
        free(n);
    }
    fsdiff_snap *s = fsdiff_take(f->ws, 3, 1u << 20);
    json_t *why = fsdiff_incomplete_json(s, NULL);
    assert_non_null(why);
    assert_string_equal(limit_of(why), "files_scan_max: 3 entries per walk");
    json_decref(why);
    fsdiff_destroy(&s);
}

/* Invalid UTF-8 names grow threefold when sanitised: the listing and the
 * change report are held to the walk's budget too, and count what they
 * left out. */
static void listing_and_report_held_to_budget(void **state)
{
    fx *f = *state;
    for (int i = 0; i < 6; i++) {
        char n[101];
        memset(n, 0xff, 100);
        n[100] = '\0';
        n[0] = (char)('a' + i);
        put(f->ws, n);
    }
    /* room for 6 in the walk and in a plain listing, not once tripled */
    size_t budget = 6 * FSDIFF_REPORT_COST(100, 0);
    fsdiff_snap *empty = fsdiff_take("/nonexistent-km-fsdiff", 10, budget);
    assert_false(fsdiff_incomplete(empty)); /* a workspace not made yet */
    fsdiff_snap *s = fsdiff_take(f->ws, 1000, budget);
    assert_false(fsdiff_incomplete(s));
    size_t omitted = 0;
    json_t *list = fsdiff_list(s, 100, &omitted);
    size_t listed = json_array_size(list);
    assert_true(listed >= 1 && listed < 6);
    assert_int_equal(listed + omitted, 6);
    json_decref(list);
    omitted = 0;
    json_t *changes = fsdiff_compare(empty, s, 100, &omitted);
    assert_int_equal(json_array_size(changes), listed);
    assert_int_equal(json_array_size(changes) + omitted, 6);
    json_decref(changes);
    fsdiff_destroy(&s);
    fsdiff_destroy(&empty);
}

/* Runs fn in a child without the capabilities that bypass file modes (a
 * root test run sees a mode-000 directory as the daemon run by a user
 * does); the child's exit status is fn's result. */
static int without_dac(int (*fn)(const char *), const char *ws)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0) {
            struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
            struct __user_cap_data_struct d[2];
            if (syscall(SYS_capget, &h, d))
                _exit(90);
            d[0].effective &= ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
            if (syscall(SYS_capset, &h, d))
                _exit(91);
        }
        _exit(fn(ws));
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static int has_note(json_t *why, const char *text)
{
    size_t i;
    json_t *n;
    json_array_foreach(json_object_get(why, "not_walked"), i, n)
    {
        if (!strcmp(json_string_value(n), text))
            return 1;
    }
    return 0;
}

static int check_unreadable(const char *ws)
{
    fsdiff_snap *s = fsdiff_take(ws, 1000, 1u << 20);
    json_t *why = fsdiff_incomplete_json(s, NULL);
    int rc = !fsdiff_incomplete(s)                                      ? 1
             : !why                                                     ? 2
             : !has_note(why, "unreadable directory: a/locked")         ? 3
             : json_object_get(why, "scan_limit") != NULL               ? 4
             : json_array_size(json_object_get(why, "not_walked")) != 1 ? 5
                                                                        : 0;
    const char *line = json_string_value(json_object_get(why, "reason"));
    if (!rc && (!line || strcmp(line, "not every file was walked: unreadable directory: a/locked")))
        rc = 7;
    /* the same reason in both walks of an exec is named once */
    json_t *both = fsdiff_incomplete_json(s, s);
    if (!rc && json_array_size(json_object_get(both, "not_walked")) != 1)
        rc = 6;
    json_decref(both);
    json_decref(why);
    fsdiff_destroy(&s);
    return rc;
}

/* a mode-000 directory with files in it: not a silent hole */
static void unreadable_directory_is_named(void **state)
{
    fx *f = *state;
    char *a = mkdir_in(f->ws, "a", 0700);
    char *locked = mkdir_in(a, "locked", 0700);
    put(locked, "hidden.txt");
    put(a, "seen.txt");
    assert_int_equal(chmod(locked, 0), 0);
    assert_int_equal(without_dac(check_unreadable, f->ws), 0);
    free(locked);
    free(a);
}

static int check_many_unreadable(const char *ws)
{
    fsdiff_snap *s = fsdiff_take(ws, 1000, 1u << 20);
    json_t *why = fsdiff_incomplete_json(s, NULL);
    int rc = !why                                                                      ? 1
             : json_array_size(json_object_get(why, "not_walked")) != FSDIFF_NOTES_MAX ? 2
             : json_integer_value(json_object_get(why, "not_walked_omitted")) != 4     ? 3
                                                                                       : 0;
    json_decref(why);
    fsdiff_destroy(&s);
    return rc;
}

/* the reasons are bounded: FSDIFF_NOTES_MAX named, the rest counted */
static void reasons_are_bounded(void **state)
{
    fx *f = *state;
    for (int i = 0; i < FSDIFF_NOTES_MAX + 4; i++) {
        char *n = name_of(i, 8);
        free(mkdir_in(f->ws, n, 0));
        free(n);
    }
    assert_int_equal(without_dac(check_many_unreadable, f->ws), 0);
}

/* FSDIFF_DEPTH_MAX + 1 nested directories, a file in the last: "too deep"
 * names the directory not walked (its path cut to FSDIFF_NOTE_PATH_MAX
 * bytes); emptied, it hides nothing and the walk is complete. */
static void too_deep_is_named(void **state)
{
    fx *f = *state;
    char *dir = strdup(f->ws);
    for (int i = 0; i <= FSDIFF_DEPTH_MAX; i++) {
        char *next = mkdir_in(dir, "dddddddd", 0700);
        free(dir);
        dir = next;
    }
    put(dir, "bottom.txt");
    fsdiff_snap *s = fsdiff_take(f->ws, 1000, 1u << 20);
    json_t *why = fsdiff_incomplete_json(s, NULL);
    assert_non_null(why);
    json_t *notes = json_object_get(why, "not_walked");
    assert_int_equal(json_array_size(notes), 1);
    const char *n = json_string_value(json_array_get(notes, 0));
    assert_true(!strncmp(n, "too deep: dddddddd/dddddddd/", 28));
    assert_non_null(strstr(n, "... (more than 64 levels)"));
    assert_true(strlen(n) <= FSDIFF_NOTE_PATH_MAX + 64);
    json_decref(why);
    fsdiff_destroy(&s);

    char *file = join(dir, "bottom.txt");
    assert_int_equal(unlink(file), 0);
    free(file);
    free(dir);
    s = fsdiff_take(f->ws, 1000, 1u << 20);
    assert_false(fsdiff_incomplete(s));
    fsdiff_destroy(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(byte_budget_counts_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(byte_budget_counts_link_text, setup, teardown),
        cmocka_unit_test_setup_teardown(count_limit_is_named, setup, teardown),
        cmocka_unit_test_setup_teardown(listing_and_report_held_to_budget, setup, teardown),
        cmocka_unit_test_setup_teardown(unreadable_directory_is_named, setup, teardown),
        cmocka_unit_test_setup_teardown(reasons_are_bounded, setup, teardown),
        cmocka_unit_test_setup_teardown(too_deep_is_named, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
