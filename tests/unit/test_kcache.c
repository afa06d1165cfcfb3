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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_and_exact_key),
        cmocka_unit_test(test_bad_kind_and_key),
        cmocka_unit_test(test_refuses_writable_entry),
        cmocka_unit_test(test_refuses_symlink_and_open_dir),
        cmocka_unit_test(test_file_key_changes_with_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
