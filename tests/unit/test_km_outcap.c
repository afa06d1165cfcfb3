/* Unit tests of kernelmgr/outcap.c: head+tail caps and the spill file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernelmgr/engine/outcap.h"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(1 << 20);
    *n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static void small_output_kept_whole(void **state)
{
    (void)state;
    char path[] = "/tmp/km-outcap-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    unlink(path);
    outcap *oc = outcap_new(64, path);
    assert_int_equal(outcap_add(oc, "hello ", 6), 0);
    assert_int_equal(outcap_add(oc, "world", 5), 0);
    assert_false(outcap_truncated(oc));
    assert_null(outcap_spill(oc));
    size_t kept;
    char *t = outcap_text(oc, &kept);
    assert_string_equal(t, "hello world");
    assert_int_equal(kept, 11);
    free(t);
    assert_int_equal(access(path, F_OK), -1); /* no spill file without overflow */
    outcap_destroy(&oc);
    assert_null(oc);
}

static void overflow_head_tail_and_complete_spill(void **state)
{
    (void)state;
    char path[] = "/tmp/km-outcap-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    outcap *oc = outcap_new(100, path);
    char expect[20000];
    size_t n = 0;
    for (int i = 0; i < 1000; i++) {
        char line[32];
        int l = snprintf(line, sizeof line, "%05d\n", i);
        outcap_add(oc, line, (size_t)l);
        memcpy(expect + n, line, (size_t)l);
        n += (size_t)l;
    }
    assert_true(outcap_truncated(oc));
    assert_int_equal(outcap_total(oc), 6000);
    assert_string_equal(outcap_spill(oc), path);
    size_t kept;
    char *t = outcap_text(oc, &kept);
    assert_int_equal(kept, 100);
    assert_memory_equal(t, "00000\n00001\n", 12);     /* head */
    assert_non_null(strstr(t, "5900 bytes omitted")); /* marker */
    assert_non_null(strstr(t, path));
    assert_string_equal(t + strlen(t) - 12, "00998\n00999\n"); /* tail */
    free(t);
    outcap_destroy(&oc);
    size_t sn;
    char *spill = slurp(path, &sn);
    assert_int_equal(sn, n);
    assert_memory_equal(spill, expect, n);
    free(spill);
    unlink(path);
}

static void one_huge_chunk_and_utf8(void **state)
{
    (void)state;
    char path[] = "/tmp/km-outcap-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    outcap *oc = outcap_new(16, path);
    /* "é" is 2 bytes: the cut falls inside characters */
    char big[301];
    for (int i = 0; i < 150; i++)
        memcpy(big + 2 * i, "\xc3\xa9", 2);
    outcap_add(oc, big, 300);
    outcap_add(oc, "\xff", 1); /* invalid byte */
    char *t = outcap_text(oc, NULL);
    assert_non_null(t);
    assert_non_null(strstr(t, "\xef\xbf\xbd")); /* U+FFFD for the 0xff */
    free(t);
    outcap_destroy(&oc);
    size_t sn;
    char *spill = slurp(path, &sn);
    assert_int_equal(sn, 301);
    free(spill);
    unlink(path);
}

/* The spill stops at spill_max, then at the shared budget, and says so. */
static void spill_capped_by_spill_max_and_budget(void **state)
{
    (void)state;
    char path[] = "/tmp/km-outcap-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    uint64_t budget = 1500;
    outcap *oc = outcap_new(64, path);
    outcap_set_limits(oc, 1000, &budget, "session_outputs_max");
    char buf[300];
    memset(buf, 'a', sizeof buf);
    for (int i = 0; i < 10; i++)
        assert_int_equal(outcap_add(oc, buf, sizeof buf), 0);
    assert_int_equal(outcap_total(oc), 3000);
    assert_int_equal(outcap_spill_bytes(oc), 1000);
    assert_int_equal(budget, 500);
    assert_string_equal(outcap_spill_note(oc), "spill truncated at 1000 bytes (spill_max)");
    assert_null(outcap_spill_error(oc));
    char *t = outcap_text(oc, NULL);
    assert_non_null(strstr(t, "the first 1000 bytes of the output are in"));
    free(t);
    outcap_destroy(&oc);
    size_t sn;
    char *spill = slurp(path, &sn);
    assert_int_equal(sn, 1000);
    free(spill);

    /* a second stream gets only what the budget has left */
    oc = outcap_new(64, path);
    outcap_set_limits(oc, 1000, &budget, "session_outputs_max");
    for (int i = 0; i < 10; i++)
        outcap_add(oc, buf, sizeof buf);
    assert_int_equal(outcap_spill_bytes(oc), 500);
    assert_int_equal(budget, 0);
    assert_non_null(strstr(outcap_spill_note(oc), "session_outputs_max"));
    outcap_destroy(&oc);
    unlink(path);
}

/* A spill that cannot be written says what failed where, keeps no file. */
static void spill_error_is_reported(void **state)
{
    (void)state;
    outcap *oc = outcap_new(64, "/nonexistent-dir/km-spill");
    char buf[300];
    memset(buf, 'b', sizeof buf);
    assert_int_equal(outcap_add(oc, buf, sizeof buf), -1);
    assert_null(outcap_spill(oc));
    assert_string_equal(outcap_spill_error(oc),
                        "No such file or directory (/nonexistent-dir/km-spill)");
    char *t = outcap_text(oc, NULL);
    assert_non_null(strstr(t, "no spill file: No such file or directory"));
    free(t);
    outcap_destroy(&oc);
    char sz[32];
    assert_string_equal(outcap_fmt_size(64u << 20, sz, sizeof sz), "64 MiB");
    assert_string_equal(outcap_fmt_size(1536, sz, sizeof sz), "1.5 KiB");
    assert_string_equal(outcap_fmt_size(100, sz, sizeof sz), "100 bytes");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(small_output_kept_whole),
        cmocka_unit_test(overflow_head_tail_and_complete_spill),
        cmocka_unit_test(one_huge_chunk_and_utf8),
        cmocka_unit_test(spill_capped_by_spill_max_and_budget),
        cmocka_unit_test(spill_error_is_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
