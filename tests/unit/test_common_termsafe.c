/* Unit tests of kernelmgr/termsafe.c: terminal escaping of sandbox text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "common/cm_termsafe.h"

static void check(const char *in, size_t len, int flags, const char *want, int want_sgr)
{
    size_t n = 0;
    int sgr = -1;
    char *out = termsafe_escape(in, len, flags, &n, &sgr);
    assert_non_null(out);
    if (strcmp(out, want))
        fail_msg("flags %d: got \"%s\", want \"%s\"", flags, out, want);
    assert_int_equal(n, strlen(want));
    assert_int_equal(sgr, want_sgr);
    /* nothing a terminal acts on survives but \n, \t (text) and kept SGR */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)out[i];
        if (c == 0x1b)
            assert_true(flags & TERMSAFE_KEEP_SGR);
        else if (c < 0x20)
            assert_true(!(flags & TERMSAFE_NAME) && (c == '\n' || c == '\t'));
        assert_true(c != 0x7f);
    }
    free(out);
}

#define S(lit) lit, sizeof(lit) - 1

static void plain_text_unchanged(void **state)
{
    (void)state;
    check(S("hello, world\n\tindented\n"), 0, "hello, world\n\tindented\n", 0);
    check(S("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), 0,
          "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 0);
    check(S("C:\\path"), 0, "C:\\path", 0);
    check(S(""), 0, "", 0);
}

static void escapes_controls(void **state)
{
    (void)state;
    /* OSC 52 clipboard write, terminated by BEL */
    check(S("\033]52;c;ZXZpbA==\007"), 0, "\\e]52;c;ZXZpbA==\\x07", 0);
    /* window title, terminated by ST */
    check(S("\033]0;pwned\033\\"), TERMSAFE_KEEP_SGR, "\\e]0;pwned\\e\\", 0);
    /* clear screen and cursor home */
    check(S("\033[2J\033[H"), TERMSAFE_KEEP_SGR, "\\e[2J\\e[H", 0);
    check(S("a\rb\bc\x7f\x01"), 0, "a\\rb\\bc\\x7f\\x01", 0);
    /* C1 controls as UTF-8 (CSI U+009B) and as raw bytes, bidi override */
    check(S("x\xc2\x9b"
            "2J"),
          0, "x\\u009b2J", 0);
    check(S("\x9b\xff"), 0, "\\x9b\\xff", 0);
    check(S("\xe2\x80\xae"
            "txt.exe"),
          0, "\\u202etxt.exe", 0);
    /* overlong and truncated sequences, a surrogate */
    check(S("\xc0\x80\xe2\x82\xed\xa0\x80"), 0, "\\xc0\\x80\\xe2\\x82\\xed\\xa0\\x80", 0);
    /* NUL inside a counted buffer */
    check("a\0b", 3, 0, "a\\x00b", 0);
}

static void sgr_kept_only_when_asked(void **state)
{
    (void)state;
    check(S("\033[31mred\033[0m \033[1;38;5;196mx\033[m"), TERMSAFE_KEEP_SGR,
          "\033[31mred\033[0m \033[1;38;5;196mx\033[m", 1);
    check(S("\033[31mred"), 0, "\\e[31mred", 0);
    /* not SGR: other final bytes, private markers, unterminated, too long */
    check(S("\033[?1049h\033[31"), TERMSAFE_KEEP_SGR, "\\e[?1049h\\e[31", 0);
    char longsgr[80] = "\033[";
    memset(longsgr + 2, '1', 70);
    strcpy(longsgr + 72, "m");
    size_t n;
    int sgr;
    char *out = termsafe_escape(longsgr, strlen(longsgr), TERMSAFE_KEEP_SGR, &n, &sgr);
    assert_non_null(out);
    assert_int_equal(sgr, 0);
    assert_memory_equal(out, "\\e[", 3);
    free(out);
}

static void names_stay_on_one_line(void **state)
{
    (void)state;
    check(S("a\n[kernelmgr] status: ok"), TERMSAFE_NAME, "a\\n[kernelmgr] status: ok", 0);
    check(S("tab\there\\n"), TERMSAFE_NAME, "tab\\there\\\\n", 0);
    check(S("\033[31mx"), TERMSAFE_NAME, "\\e[31mx", 0);
}

static void fputs_writes_escaped(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(termsafe_fputs(f, "\033]2;t\007\033[32mok\033[0m\n", TERMSAFE_KEEP_SGR), 1);
    assert_int_equal(termsafe_fputs(f, NULL, 0), 0);
    assert_int_equal(termsafe_fputs(f, "x\ny", TERMSAFE_NAME), 0);
    fclose(f);
    assert_string_equal(buf, "\\e]2;t\\x07\033[32mok\033[0m\nx\\ny");
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_text_unchanged),     cmocka_unit_test(escapes_controls),
        cmocka_unit_test(sgr_kept_only_when_asked), cmocka_unit_test(names_stay_on_one_line),
        cmocka_unit_test(fputs_writes_escaped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
