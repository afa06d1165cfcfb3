/* Unit tests of the home's trust checks: kmhome.c (directories), the
 * reading of session.json (session_store.c) and of config.json (config.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/engine/session.h"
#include "kernelmgr/engine/session_int.h"

static void stat_ok_rules(void **state)
{
    (void)state;
    const char *why = NULL;
    struct stat st = {.st_mode = S_IFDIR | 0700, .st_uid = 1000};
    assert_int_equal(kmhome_stat_ok(&st, 1000, &why), 0);
    st.st_mode = S_IFDIR | 0755; /* readable by others: fine */
    assert_int_equal(kmhome_stat_ok(&st, 1000, &why), 0);
    assert_int_equal(kmhome_stat_ok(&st, 0, &why), -1);
    assert_string_equal(why, "is owned by another user");
    st.st_mode = S_IFDIR | 0770;
    assert_int_equal(kmhome_stat_ok(&st, 1000, &why), -1);
    assert_string_equal(why, "is writable by group or others");
    st.st_mode = S_IFDIR | 01777;
    assert_int_equal(kmhome_stat_ok(&st, 1000, &why), -1);
    st.st_mode = S_IFLNK | 0777;
    assert_int_equal(kmhome_stat_ok(&st, 1000, &why), -1);
    assert_string_equal(why, "is a symbolic link");
    st.st_mode = S_IFREG | 0600;
    assert_int_equal(kmhome_stat_ok(&st, 1000, &why), -1);
    assert_string_equal(why, "is not a directory");
}

static void below_rules(void **state)
{
    (void)state;
    assert_true(kmhome_below("/tmp/km", "/tmp/km/sessions/a/workspace"));
    assert_true(kmhome_below("/tmp/km/", "/tmp/km/sessions/a/workspace"));
    assert_true(kmhome_below("/tmp/km", "/tmp/km//pool/x/workspace"));
    assert_false(kmhome_below("/tmp/km", "/tmp/km"));
    assert_false(kmhome_below("/tmp/km", "/tmp/km/"));
    assert_false(kmhome_below("/tmp/km", "/tmp/kmx/sessions"));
    assert_false(kmhome_below("/tmp/km", "/tmp/km/../etc"));
    assert_false(kmhome_below("/tmp/km", "/tmp/km/sessions/../../root"));
    assert_false(kmhome_below("/tmp/km", "/tmp/km/sessions/.."));
    assert_false(kmhome_below("/tmp/km", "/root"));
    assert_false(kmhome_below("km", "km/sessions"));
}

static char *tmpdir(void)
{
    char tmpl[] = "/tmp/kmhome-unit-XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void rmrf(const char *d)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    assert_int_equal(system(cmd), 0);
}

static void dirs_checked_and_made(void **state)
{
    (void)state;
    char *d = tmpdir();
    char p[512];
    km_err err = {0};
    assert_int_equal(kmhome_prepare(d, 1, &err), 0);
    snprintf(p, sizeof p, "%s/sessions", d);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    /* absent and not made: fine */
    snprintf(p, sizeof p, "%s/nothing", d);
    assert_int_equal(kmhome_check_dir(p, 0, &err), 1);
    /* a writable-by-others directory, as the home and below it */
    snprintf(p, sizeof p, "%s/pool", d);
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(chmod(p, 0777), 0);
    assert_int_equal(kmhome_prepare(d, 0, &err), -1);
    assert_non_null(strstr(err.msg, p));
    assert_non_null(strstr(err.msg, "writable by group or others"));
    assert_non_null(strstr(err.msg, "mode 0777"));
    /* kmhome_mkdir of an existing bad directory refuses it (not adopted) */
    assert_int_equal(kmhome_mkdir(p, 0700, &err), -1);
    assert_int_equal(chmod(p, 0700), 0);
    assert_int_equal(kmhome_mkdir(p, 0700, &err), 0);
    assert_int_equal(chmod(d, 0775), 0);
    assert_int_equal(kmhome_prepare(d, 0, &err), -1);
    assert_non_null(strstr(err.msg, "KERNELMGR_HOME"));
    assert_int_equal(chmod(d, 0700), 0);
    /* a symbolic link where a directory of the home should be */
    snprintf(p, sizeof p, "%s/run", d);
    assert_int_equal(symlink("/", p), 0);
    assert_int_equal(kmhome_prepare(d, 0, &err), -1);
    assert_non_null(strstr(err.msg, "symbolic link"));
    rmrf(d);
    free(d);
}

static void put(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

/* session_json_read: the reason names the file and what is wrong, never
 * the file's text. */
static void expect_refused(const char *path, const char *text, mode_t mode, const char *reason)
{
    km_err why = {0};
    put(path, text, mode);
    json_t *o = session_json_read(path, &why);
    assert_null(o);
    assert_non_null(strstr(why.msg, path));
    if (!strstr(why.msg, reason))
        fail_msg("\"%s\" does not say \"%s\"", why.msg, reason);
    if (strlen(text) > 4)
        assert_null(strstr(why.msg, text));
}

static void session_json_checked(void **state)
{
    (void)state;
    char *d = tmpdir();
    char path[512];
    km_err why = {0};
    snprintf(path, sizeof path, "%s/session.json", d);
    assert_null(session_json_read(path, &why));
    assert_int_equal(errno, ENOENT);
    expect_refused(path, "", 0600, "is empty");
    expect_refused(path, "SECRETgarbage{", 0600, "is not valid JSON");
    expect_refused(path, "{\"workspace\": \"/tmp/x\", \"own_wor", 0600, "ends early");
    expect_refused(path, "[1, 2]", 0600, "not a JSON object");
    expect_refused(path, "{\"own_workspace\": true, \"options\": {}}", 0600, "\"workspace\"");
    expect_refused(path, "{\"workspace\": \"rel\", \"own_workspace\": true, \"options\": {}}", 0600,
                   "absolute path");
    /* a NUL in a string: jansson refuses it */
    expect_refused(path,
                   "{\"workspace\": \"/w\\u0000/x\", \"own_workspace\": true, \"options\": {}}",
                   0600, "is not valid JSON");
    expect_refused(path, "{\"workspace\": \"/w\", \"own_workspace\": 1, \"options\": {}}", 0600,
                   "own_workspace");
    expect_refused(path,
                   "{\"workspace\": \"/w\", \"own_workspace\": true, \"options\": "
                   "{\"memory\": \"lots\"}}",
                   0600, "options.memory");
    const char *good = "{\"workspace\": \"/w\", \"own_workspace\": true, \"options\": "
                       "{\"memory\": 314572800}}";
    expect_refused(path, good, 0620, "writable by group or others");
    put(path, good, 0600);
    json_t *o = session_json_read(path, &why);
    assert_non_null(o);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(o, "options"), "memory")),
                     314572800);
    json_decref(o);
    /* set aside, never over another file */
    char aside[600], aside2[600], found[600];
    assert_int_equal(session_json_set_aside(path, aside, sizeof aside), 0);
    assert_int_equal(access(path, F_OK), -1);
    assert_int_equal(access(aside, F_OK), 0);
    put(path, "x", 0600);
    assert_int_equal(session_json_set_aside(path, aside2, sizeof aside2), 0);
    assert_string_not_equal(aside, aside2);
    assert_int_equal(session_set_aside_find(d, found, sizeof found), 1);
    /* a symbolic link is never followed */
    assert_int_equal(symlink(aside, path), 0);
    assert_null(session_json_read(path, &why));
    assert_non_null(strstr(why.msg, "symbolic link"));
    rmrf(d);
    free(d);
}

static void home_config_owner_checked(void **state)
{
    (void)state;
    char *d = tmpdir();
    char path[512];
    km_err err = {0};
    snprintf(path, sizeof path, "%s/config.json", d);
    put(path, "{\"python\": \"/tmp/evil\"}", 0666);
    kmcfg c;
    kmcfg_defaults(&c);
    assert_int_equal(kmcfg_load_file(&c, path, KMCFG_HOME_FILE, &err), -1);
    assert_non_null(strstr(err.msg, "writable by group or others"));
    assert_string_equal(c.python, "");
    /* a file the user named (--config) is the user's choice */
    assert_int_equal(kmcfg_load_file(&c, path, KMCFG_MUST_EXIST, &err), 0);
    assert_string_equal(c.python, "/tmp/evil");
    kmcfg_clear(&c);
    /* the text of a bad file is not quoted */
    put(path, "{\"python\": SECRET}", 0600);
    kmcfg_defaults(&c);
    assert_int_equal(kmcfg_load_file(&c, path, KMCFG_HOME_FILE, &err), -1);
    assert_null(strstr(err.msg, "SECRET"));
    kmcfg_clear(&c);
    rmrf(d);
    free(d);
}

/* The session's history is appended to only when it is the user's own file. */
static void history_owner_checked(void **state)
{
    (void)state;
    char *d = tmpdir();
    char path[512];
    km_err err = {0};
    snprintf(path, sizeof path, "%s/history.jsonl", d);
    assert_int_equal(session_history_start(d, "id1", "bash", NULL, "echo 1", 1 << 20, &err), 0);
    assert_int_equal(chmod(path, 0666), 0);
    assert_int_equal(session_history_start(d, "id2", "bash", NULL, "echo 2", 1 << 20, &err), -1);
    assert_non_null(strstr(err.msg, "not this user's own file"));
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0); /* never blocks */
    assert_int_equal(session_history_start(d, "id3", "bash", NULL, "echo 3", 1 << 20, &err), -1);
    assert_non_null(strstr(err.msg, "not a regular file"));
    rmrf(d);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stat_ok_rules),
        cmocka_unit_test(below_rules),
        cmocka_unit_test(dirs_checked_and_made),
        cmocka_unit_test(session_json_checked),
        cmocka_unit_test(home_config_owner_checked),
        cmocka_unit_test(history_owner_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
