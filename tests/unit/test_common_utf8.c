/*
 * test_common_utf8.c — cm_utf8.h: validation, repair, prefixes, decoding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/cm_utf8.h"

struct utf8_case {
    const char *bytes;
    size_t len;
    int valid;
};

static void test_utf8_valid(void **state)
{
    (void)state;
    static const struct utf8_case cases[] = {
        {"", 0, 1},
        {"plain ascii", 11, 1},
        {"nul\0inside", 10, 1},
        {"\xc3\xa9", 2, 1},         /* é */
        {"\xe2\x9c\x93", 3, 1},     /* ✓ */
        {"\xf0\x9f\x98\x80", 4, 1}, /* 😀 */
        {"\xf4\x8f\xbf\xbf", 4, 1}, /* U+10FFFF */
        {"\xef\xbb\xbf", 3, 1},     /* BOM is fine */
        {"\xc0\x80", 2, 0},         /* overlong NUL */
        {"\xc1\xbf", 2, 0},         /* overlong */
        {"\xe0\x80\x80", 3, 0},     /* overlong 3-byte */
        {"\xf0\x80\x80\x80", 4, 0}, /* overlong 4-byte */
        {"\xed\xa0\x80", 3, 0},     /* surrogate D800 */
        {"\xed\xbf\xbf", 3, 0},     /* surrogate DFFF */
        {"\xf4\x90\x80\x80", 4, 0}, /* > U+10FFFF */
        {"\xf5\x80\x80\x80", 4, 0}, /* invalid lead */
        {"\xff", 1, 0},
        {"\x80", 1, 0},     /* lone continuation */
        {"\xc3", 1, 0},     /* truncated */
        {"\xe2\x9c", 2, 0}, /* truncated */
        {"a\xc3(", 3, 0},   /* bad continuation */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cm_utf8_valid(cases[i].bytes, cases[i].len) != cases[i].valid)
            fail_msg("case %zu: expected %d", i, cases[i].valid);
    }
    assert_int_equal(cm_utf8_valid(NULL, 0), 1);
    assert_int_equal(cm_utf8_valid(NULL, 3), 0);
}

static void test_utf8_sanitize(void **state)
{
    (void)state;
    size_t n = 99;
    char *s = cm_utf8_sanitize("ok \xc3\xa9", 5, &n);
    assert_string_equal(s, "ok \xc3\xa9");
    assert_int_equal(n, 5);
    free(s);

    /* NUL and each maximal invalid subpart -> one U+FFFD (like Python's
     * bytes.decode("utf-8", "replace")). */
    s = cm_utf8_sanitize("a\0b\xff\xe2\x9c"
                         "c\xed\xa0\x80"
                         "d\xf0\x9f\x98",
                         14, &n);
    assert_string_equal(s, "a\xef\xbf\xbd"
                           "b\xef\xbf\xbd\xef\xbf\xbd"
                           "c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                           "d\xef\xbf\xbd");
    assert_int_equal(n, strlen(s));
    assert_int_equal(cm_utf8_valid(s, n), 1);
    free(s);

    s = cm_utf8_sanitize(NULL, 0, NULL);
    assert_string_equal(s, "");
    free(s);
    s = cm_utf8_sanitize("\x80\x80", 2, NULL);
    assert_string_equal(s, "\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
}

static void test_utf8_complete_prefix(void **state)
{
    (void)state;
    assert_int_equal(cm_utf8_complete_prefix("abc", 3), 3);
    assert_int_equal(cm_utf8_complete_prefix(NULL, 0), 0);
    assert_int_equal(cm_utf8_complete_prefix("ab\xc3", 3), 2);
    assert_int_equal(cm_utf8_complete_prefix("ab\xc3\xa9", 4), 4);
    assert_int_equal(cm_utf8_complete_prefix("a\xe2", 2), 1);
    assert_int_equal(cm_utf8_complete_prefix("a\xe2\x9c", 3), 1);
    assert_int_equal(cm_utf8_complete_prefix("a\xe2\x9c\x93", 4), 4);
    assert_int_equal(cm_utf8_complete_prefix("a\xf0\x9f\x98", 4), 1);
    assert_int_equal(cm_utf8_complete_prefix("\xf0\x9f\x98\x80", 4), 4);
    /* Invalid tails can never complete: keep them (sanitising replaces them). */
    assert_int_equal(cm_utf8_complete_prefix("a\xff", 2), 2);
    assert_int_equal(cm_utf8_complete_prefix("a\x80\x80\x80\x80", 5), 5);
    assert_int_equal(cm_utf8_complete_prefix("a\xe0\x80", 3), 3); /* overlong start */
    assert_int_equal(cm_utf8_complete_prefix("a\xed\xa0", 3), 3); /* surrogate start */
    assert_int_equal(cm_utf8_complete_prefix("\x80", 1), 1);
}

static void test_utf8_decode(void **state)
{
    (void)state;
    uint32_t cp = 0;
    assert_int_equal(cm_utf8_decode("A", 1, &cp), 1);
    assert_int_equal(cp, 'A');
    assert_int_equal(cm_utf8_decode("\xc3\xa9x", 3, &cp), 2); /* U+00E9 */
    assert_int_equal(cp, 0xe9);
    assert_int_equal(cm_utf8_decode("\xe2\x82\xac", 3, &cp), 3); /* U+20AC */
    assert_int_equal(cp, 0x20ac);
    assert_int_equal(cm_utf8_decode("\xf0\x9f\x98\x80", 4, &cp), 4); /* U+1F600 */
    assert_int_equal(cp, 0x1f600);
    assert_int_equal(cm_utf8_decode("\xf4\x8f\xbf\xbf", 4, NULL), 4); /* U+10FFFF */
    const char *bad[] = {"\xc0\x80",                                  /* overlong */
                         "\xe0\x80\x80",                              /* overlong */
                         "\xed\xa0\x80",                              /* surrogate */
                         "\xf4\x90\x80\x80",                          /* above U+10FFFF */
                         "\x80",                                      /* stray continuation */
                         "\xe2\x82",                                  /* truncated */
                         "\xff"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(cm_utf8_decode(bad[i], strlen(bad[i]), &cp), 0);
    assert_int_equal(cm_utf8_decode("", 0, &cp), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8_valid),
        cmocka_unit_test(test_utf8_sanitize),
        cmocka_unit_test(test_utf8_complete_prefix),
        cmocka_unit_test(test_utf8_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
