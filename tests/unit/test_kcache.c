/*
 * test_kcache.c — the per-user probe cache: round trip, exact key match,
 * and refusal of entries or directories others could have tampered with.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/server/kcache.h"

static char tmpdir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kcache-test-XXXXXX");
    if (!mkdtemp(tmpdir))
        return -1;
    setenv("XDG_CACHE_HOME", tmpdir, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The path of the only entry file of kind in the cache directory. */
static int entry_file(const char *kind, char *out, size_t size)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/kernelmgr", tmpdir);
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *de;
    int found = -1;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, kind, strlen(kind))) {
            snprintf(out, size, "%s/%s", dir, de->d_name);
            found = 0;
        }
    closedir(d);
    return found;
}

static void test_round_trip_and_exact_key(void **state)
{
    (void)state;
    assert_null(kcache_get("probe", "k1"));
    kcache_put("probe", "k1", "{\"v\": 1}");
    char *v = kcache_get("probe", "k1");
    assert_non_null(v);
    assert_string_equal(v, "{\"v\": 1}");
    free(v);
    assert_null(kcache_get("probe", "k2"));
    assert_null(kcache_get("other", "k1"));
    kcache_put("probe", "k1", "new");
    v = kcache_get("probe", "k1");
    assert_string_equal(v, "new");
    free(v);
    struct stat st;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/kernelmgr", tmpdir);
    assert_int_equal(stat(dir, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
}

static void test_bad_kind_and_key(void **state)
{
    (void)state;
    kcache_put("../x", "k", "v");
    assert_null(kcache_get("../x", "k"));
    kcache_put("probe", "two\nlines", "v");
    assert_null(kcache_get("probe", "two\nlines"));
}

static void test_refuses_writable_entry(void **state)
{
    (void)state;
    kcache_put("wr", "k", "v");
    char path[600];
    assert_int_equal(entry_file("wr", path, sizeof path), 0);
    assert_int_equal(chmod(path, 0666), 0);
    assert_null(kcache_get("wr", "k"));
}

static void test_refuses_symlink_and_open_dir(void **state)
{
    (void)state;
    kcache_put("ln", "k", "v");
    char path[600], target[700];
    assert_int_equal(entry_file("ln", path, sizeof path), 0);
    snprintf(target, sizeof target, "%s.real", path);
    assert_int_equal(rename(path, target), 0);
    assert_int_equal(symlink(target, path), 0);
    assert_null(kcache_get("ln", "k"));
    unlink(path);
    assert_int_equal(rename(target, path), 0);
    char *v = kcache_get("ln", "k");
    assert_non_null(v);
    free(v);
    char dir[300];
    snprintf(dir, sizeof dir, "%s/kernelmgr", tmpdir);
    assert_int_equal(chmod(dir, 0777), 0);
    assert_null(kcache_get("ln", "k"));
    assert_int_equal(chmod(dir, 0700), 0);
}

static void test_file_key_changes_with_file(void **state)
{
    (void)state;
    char f[300], k1[1024] = "", k2[1024] = "", k3[1024] = "";
    snprintf(f, sizeof f, "%s/exe", tmpdir);
    FILE *fp = fopen(f, "w");
    fputs("one", fp);
    fclose(fp);
    assert_int_equal(kcache_file_key(f, k1, sizeof k1), 0);
    assert_int_equal(kcache_file_key(f, k2, sizeof k2), 0);
    assert_string_equal(k1, k2);
    fp = fopen(f, "w");
    fputs("longer", fp);
    fclose(fp);
    assert_int_equal(kcache_file_key(f, k3, sizeof k3), 0);
    assert_string_not_equal(k1, k3);
    char missing[1024] = "";
    assert_int_equal(kcache_file_key("/nonexistent/x", missing, sizeof missing), 0);
    assert_string_equal(missing, "/nonexistent/x=-;");
    char small[8] = "";
    assert_int_equal(kcache_file_key(f, small, sizeof small), -1);
    assert_string_equal(small, "");
}

static void test_refuses_symlinked_or_foreign_dir(void **state)
{
    (void)state;
    char base[300], cmd[1400];
    snprintf(base, sizeof base, "%s/x2", tmpdir);
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/evil' && chmod 700 '%s/evil' && ln -s '%s/evil' '%s/kernelmgr'", base,
             base, base, base);
    assert_int_equal(system(cmd), 0);
    setenv("XDG_CACHE_HOME", base, 1);
    kcache_put("sym", "k", "v");
    assert_null(kcache_get("sym", "k"));
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/evil')\"", base);
    assert_int_equal(system(cmd), 0); /* nothing written through the link */
    /* a planted entry in the link target is not read either */
    snprintf(cmd, sizeof cmd, "rm '%s/kernelmgr' && mv '%s/evil' '%s/kernelmgr'", base, base, base);
    assert_int_equal(system(cmd), 0);
    kcache_put("sym", "k", "v");
    char *v = kcache_get("sym", "k");
    assert_non_null(v);
    free(v);
    if (geteuid() == 0) {
        /* owned by someone else: not used */
        char dir[400];
        snprintf(dir, sizeof dir, "%s/kernelmgr", base);
        assert_int_equal(chown(dir, 65534, 65534), 0);
        assert_null(kcache_get("sym", "k"));
        assert_int_equal(chown(dir, 0, 0), 0);
    }
    setenv("XDG_CACHE_HOME", tmpdir, 1);
}

static void test_entry_fifo_big_and_atomic(void **state)
{
    (void)state;
    kcache_put("fifo", "k", "v");
    char path[600];
    assert_int_equal(entry_file("fifo", path, sizeof path), 0);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_null(kcache_get("fifo", "k")); /* does not hang */
    unlink(path);
    /* values above the cap are not stored; a grown entry is not read */
    char *big = malloc(KCACHE_MAX_VALUE + 2);
    memset(big, 'a', KCACHE_MAX_VALUE + 1);
    big[KCACHE_MAX_VALUE + 1] = '\0';
    kcache_put("big", "k", big);
    assert_null(kcache_get("big", "k"));
    kcache_put("big", "k", "small");
    assert_int_equal(entry_file("big", path, sizeof path), 0);
    FILE *f = fopen(path, "a");
    fputs(big, f);
    fclose(f);
    assert_null(kcache_get("big", "k"));
    free(big);
    /* no temporary files are left behind */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s/kernelmgr' | grep '^\\.')\"", tmpdir);
    assert_int_equal(system(cmd), 0);
    struct stat st;
    assert_int_equal(entry_file("big", path, sizeof path), 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_exact_key),
        cmocka_unit_test(test_bad_kind_and_key),
        cmocka_unit_test(test_refuses_writable_entry),
        cmocka_unit_test(test_refuses_symlink_and_open_dir),
        cmocka_unit_test(test_file_key_changes_with_file),
        cmocka_unit_test(test_refuses_symlinked_or_foreign_dir),
        cmocka_unit_test(test_entry_fifo_big_and_atomic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
