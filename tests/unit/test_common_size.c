/* Unit tests of common/cm_size.c: the one size grammar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/cm_size.h"

static uint64_t ok(const char *s)
{
    uint64_t v = 12345;
    char err[128] = "";
    if (cm_size_parse(s, &v, err, sizeof err))
        fail_msg("'%s' refused: %s", s, err);
    return v;
}

static void bad(const char *s, const char *why, int e)
{
    uint64_t v = 777;
    char err[160] = "";
    errno = 0;
    assert_int_equal(cm_size_parse(s, &v, err, sizeof err), -1);
    assert_int_equal(v, 777); /* untouched */
    assert_int_equal(errno, e);
    if (!strstr(err, why))
        fail_msg("'%s': reason \"%s\" lacks \"%s\"", s ? s : "(null)", err, why);
}

static void accepts_the_grammar(void **state)
{
    (void)state;
    assert_int_equal(ok("0"), 0);
    assert_int_equal(ok("512"), 512);
    assert_int_equal(ok("512B"), 512);
    assert_int_equal(ok("512 b"), 512);
    assert_int_equal(ok("512K"), 512ull << 10);
    assert_int_equal(ok("512k"), 512ull << 10);
    assert_int_equal(ok("2M"), 2ull << 20);
    assert_int_equal(ok("2G"), 2ull << 30);
    assert_int_equal(ok("2T"), 2ull << 40);
    assert_int_equal(ok("1.5G"), 3ull << 29);
    assert_int_equal(ok("1.5k"), 1536);
    assert_int_equal(ok("2 GB"), 2ull << 30);
    assert_int_equal(ok("2  GiB"), 2ull << 30);
    assert_int_equal(ok("2gib"), 2ull << 30);
    assert_int_equal(ok("2KB"), 2048);
    assert_int_equal(ok("2Ki"), 2048);
    assert_int_equal(ok("0.5K"), 512);
    assert_int_equal(ok("0.0001K"), 0); /* rounded down to whole bytes */
    assert_int_equal(ok("1.00000000000000000000000001K"), 1024);
    assert_int_equal(ok("18446744073709551615"), UINT64_MAX);
    assert_int_equal(ok("16777215.999999999999999999T"), UINT64_MAX);
    assert_int_equal(ok("16777215.5T"), (16777215ull << 40) + (1ull << 39));
}

static void rejects_garbage_with_a_reason(void **state)
{
    (void)state;
    bad(NULL, "not a size", EINVAL);
    bad("", "not a size", EINVAL);
    bad(" 1M", "not a size", EINVAL);
    bad("-1M", "not a size", EINVAL);
    bad("+1M", "not a size", EINVAL);
    bad("lots", "'lots'", EINVAL);
    bad(".5G", "not a size", EINVAL);
    bad("1.G", "not a size", EINVAL);
    bad("1e3", "unknown unit", EINVAL);
    bad("0x10", "unknown unit", EINVAL);
    bad("inf", "not a size", EINVAL);
    bad("1Q", "unknown unit", EINVAL);
    bad("1MM", "text after the unit", EINVAL);
    bad("1Bi", "text after the unit", EINVAL);
    bad("1M ", "text after the unit", EINVAL);
    bad("1 ", "a space with no unit", EINVAL);
    bad("1.5", "a fraction of a byte", EINVAL);
    bad("1.5B", "a fraction of a byte", EINVAL);
}

static void rejects_overflow(void **state)
{
    (void)state;
    bad("18446744073709551616", "too large", ERANGE);
    bad("99999999999999999999999", "too large", ERANGE);
    bad("16777216T", "too large", ERANGE);
    bad("17179869184G", "too large", ERANGE);
    bad("16777216.5T", "too large", ERANGE);
}

static void long_text_is_cut_in_the_reason(void **state)
{
    (void)state;
    char s[200];
    memset(s, 'x', sizeof s - 1);
    s[sizeof s - 1] = '\0';
    char err[256] = "";
    assert_int_equal(cm_size_parse(s, &(uint64_t){0}, err, sizeof err), -1);
    assert_non_null(strstr(err, "...':"));
    assert_true(strlen(err) < 160);
    /* no buffer for the reason: still refused */
    assert_int_equal(cm_size_parse("x", &(uint64_t){0}, NULL, 0), -1);
}

static void format_round_trips(void **state)
{
    (void)state;
    char buf[32];
    assert_string_equal(cm_size_format(0, buf, sizeof buf), "0 bytes");
    assert_string_equal(cm_size_format(1023, buf, sizeof buf), "1023 bytes");
    assert_string_equal(cm_size_format(1024, buf, sizeof buf), "1 KiB");
    assert_string_equal(cm_size_format(64 << 10, buf, sizeof buf), "64 KiB");
    assert_string_equal(cm_size_format(3ull << 29, buf, sizeof buf), "1.5 GiB");
    assert_string_equal(cm_size_format(2ull << 40, buf, sizeof buf), "2 TiB");
    assert_string_equal(cm_size_format(1ull << 60, buf, sizeof buf), "1 EiB");
    const uint64_t whole[] = {1024, 5ull << 10, 3ull << 20, 7ull << 30, 9ull << 40};
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++) {
        uint64_t back = 1;
        cm_size_format(whole[i], buf, sizeof buf);
        assert_int_equal(cm_size_parse(buf, &back, NULL, 0), 0);
        assert_int_equal(back, whole[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepts_the_grammar), cmocka_unit_test(rejects_garbage_with_a_reason),
        cmocka_unit_test(rejects_overflow),    cmocka_unit_test(long_text_is_cut_in_the_reason),
        cmocka_unit_test(format_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
