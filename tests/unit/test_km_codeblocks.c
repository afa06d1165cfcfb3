/* Unit tests of kernelmgr/codeblocks.c: Markdown fences and the heuristic. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "kernelmgr/engine/codeblocks.h"
#include "kernelmgr/engine/config.h"

/* the built-ins' places in the table (lang.c) */
enum { PY = 0, SH = 1 };

static void fences_route_languages(void **state)
{
    (void)state;
    const char *md = "# t\n\n```python\nx = 1\n```\ntext\n```text\nnot code\n```\n"
                     "~~~bash\necho hi\n~~~\n```sh\nls\n```\n```py\nprint(x)\n```\n";
    cblock_list l;
    assert_int_equal(cblocks_split(md, NULL, -1, &l), 0);
    assert_int_equal(l.n, 4);
    assert_int_equal(l.v[0].lang, PY);
    assert_string_equal(l.v[0].code, "x = 1\n");
    assert_int_equal(l.v[0].line, 4);
    assert_int_equal(l.v[1].lang, SH);
    assert_string_equal(l.v[1].code, "echo hi\n");
    assert_int_equal(l.v[2].lang, SH);
    assert_string_equal(l.v[3].code, "print(x)\n");
    cblocks_free(&l);
    assert_null(l.v);
}

static void console_prompts_stripped(void **state)
{
    (void)state;
    const char *md = "```console\n$ echo a\na\n$ ls \\\n> -l\noutput\n$\n```\n";
    cblock_list l;
    assert_int_equal(cblocks_split(md, NULL, -1, &l), 0);
    assert_int_equal(l.n, 1);
    assert_int_equal(l.v[0].lang, SH);
    assert_string_equal(l.v[0].code, "echo a\nls \\\n-l\n");
    cblocks_free(&l);
}

static void longer_fence_and_unterminated(void **state)
{
    (void)state;
    const char *md = "````python\n```\nprint(1)\n````\n```bash\necho open";
    cblock_list l;
    assert_int_equal(cblocks_split(md, NULL, -1, &l), 0);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.v[0].code, "```\nprint(1)\n");
    assert_string_equal(l.v[1].code, "echo open");
    cblocks_free(&l);
}

static void raw_input_and_forced_language(void **state)
{
    (void)state;
    cblock_list l;
    assert_int_equal(cblocks_split("```python\nx\n```\n", NULL, SH, &l), 0);
    assert_int_equal(l.n, 1);
    assert_int_equal(l.v[0].lang, SH);
    assert_string_equal(l.v[0].code, "```python\nx\n```\n");
    cblocks_free(&l);
    assert_int_equal(cblocks_split("#!/usr/bin/env bash\nx=1\n", NULL, -1, &l), 0);
    assert_int_equal(l.v[0].lang, SH);
    cblocks_free(&l);
    assert_int_equal(cblocks_split("#!/usr/bin/python3\nls\n", NULL, -1, &l), 0);
    assert_int_equal(l.v[0].lang, PY);
    cblocks_free(&l);
    assert_int_equal(cblocks_split("", NULL, -1, &l), 0);
    assert_int_equal(l.n, 1);
    cblocks_free(&l);
}

static void heuristic(void **state)
{
    (void)state;
    assert_int_equal(cblocks_guess_language("import os\nprint(os.getcwd())\n"),
                     KM_LANG_ROLE_PYTHON);
    assert_int_equal(cblocks_guess_language("x = [1, 2]\nfor i in x:\n    print(i)\n"),
                     KM_LANG_ROLE_PYTHON);
    assert_int_equal(cblocks_guess_language("ls -la | grep foo\n"), KM_LANG_ROLE_SHELL);
    assert_int_equal(cblocks_guess_language("X=1\necho $X > out.txt\n"), KM_LANG_ROLE_SHELL);
    assert_int_equal(cblocks_guess_language("for f in *.csv; do wc -l \"$f\"; done\n"),
                     KM_LANG_ROLE_SHELL);
    assert_int_equal(cblocks_guess_language("def f():\n    return 1\n"), KM_LANG_ROLE_PYTHON);
    assert_int_equal(cblocks_guess_language("1 + 1\n"), KM_LANG_ROLE_PYTHON); /* tie: python */
}

static void code_checks(void **state)
{
    (void)state;
    km_err err = {0};
    const char *ok = "print('h\xc3\xa9 \xf0\x9f\x98\x80')";
    assert_int_equal(cblocks_check_code(ok, strlen(ok), 0, &err), 0);
    /* a stray continuation byte at offset 3 */
    assert_int_equal(cblocks_check_code("abc\x80", 4, 0, &err), -1);
    assert_string_equal(err.msg, "code is not valid UTF-8 (byte 3)");
    /* overlong, surrogate, above U+10FFFF, truncated */
    assert_int_equal(cblocks_check_code("\xc0\xaf", 2, 0, &err), -1);
    assert_int_equal(cblocks_check_code("x\xed\xa0\x80", 4, 0, &err), -1);
    assert_string_equal(err.msg, "code is not valid UTF-8 (byte 1)");
    assert_int_equal(cblocks_check_code("\xf4\x90\x80\x80", 4, 0, &err), -1);
    assert_int_equal(cblocks_check_code("ab\xe2\x82", 4, 0, &err), -1);
    assert_string_equal(err.msg, "code is not valid UTF-8 (byte 2)");
    /* NUL inside the given length */
    assert_int_equal(cblocks_check_code("ab\0cd", 5, 0, &err), -1);
    assert_string_equal(err.msg, "code contains a NUL byte (byte 2)");
    /* the size limit comes first and names both numbers */
    assert_int_equal(cblocks_check_code("x", 52428800, 16u << 20, &err), -1);
    assert_string_equal(err.msg, "code is 52428800 bytes, more than code_max (16 MiB)");
    assert_int_equal(cblocks_check_code("abcd", 4, 4, &err), 0);
    assert_int_equal(cblocks_check_code(NULL, 0, 4, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fences_route_languages),
        cmocka_unit_test(console_prompts_stripped),
        cmocka_unit_test(longer_fence_and_unterminated),
        cmocka_unit_test(raw_input_and_forced_language),
        cmocka_unit_test(heuristic),
        cmocka_unit_test(code_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
