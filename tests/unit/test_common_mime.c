/* Unit tests of common/cm_mime.c: the one extension/MIME table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "common/cm_mime.h"

static void by_name(void **state)
{
    (void)state;
    assert_string_equal(cm_mime_by_name("out/plot.png"), "image/png");
    assert_string_equal(cm_mime_by_name("PLOT.PNG"), "image/png");
    assert_string_equal(cm_mime_by_name("a.jpeg"), "image/jpeg");
    assert_string_equal(cm_mime_by_name("a.jpg"), "image/jpeg");
    assert_string_equal(cm_mime_by_name("data.csv"), "text/csv");
    assert_string_equal(cm_mime_by_name("nb.ipynb"), "application/x-ipynb+json");
    assert_string_equal(cm_mime_by_name("x.tar.gz"), "application/gzip");
    assert_string_equal(cm_mime_by_name(".png"), "image/png"); /* a dot file named for it */
    assert_null(cm_mime_by_name("dir.png/file"));              /* the dot is the directory's */
    assert_null(cm_mime_by_name("Makefile"));
    assert_null(cm_mime_by_name("a.unknownext"));
    assert_null(cm_mime_by_name("a."));
    assert_null(cm_mime_by_name(NULL));
}

static void ext_of_a_type(void **state)
{
    (void)state;
    assert_string_equal(cm_mime_ext("image/png"), "png");
    assert_string_equal(cm_mime_ext("image/jpeg"), "jpg");
    assert_string_equal(cm_mime_ext("image/gif"), "gif");
    assert_string_equal(cm_mime_ext("image/svg+xml"), "svg");
    assert_string_equal(cm_mime_ext("image/webp"), "webp");
    assert_string_equal(cm_mime_ext("text/plain"), "txt");
    assert_null(cm_mime_ext("application/octet-stream"));
    assert_null(cm_mime_ext("image/x-unknown"));
    assert_null(cm_mime_ext(NULL));
    /* every extension maps back to a type whose extension maps to it again */
    const char *names[] = {"a.png", "a.jpeg", "a.yml", "a.htm", "a.log", "a.h"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        const char *m = cm_mime_by_name(names[i]);
        char again[32] = "x.";
        strncat(again, cm_mime_ext(m), sizeof again - 3);
        assert_string_equal(cm_mime_by_name(again), m);
    }
}

static void text_and_images(void **state)
{
    (void)state;
    assert_true(cm_mime_is_text("text/plain"));
    assert_true(cm_mime_is_text("text/x-anything"));
    assert_true(cm_mime_is_text("application/json"));
    assert_true(cm_mime_is_text("application/vnd.plotly.v1+json"));
    assert_true(cm_mime_is_text("application/yaml"));
    assert_true(cm_mime_is_text("image/svg+xml"));
    assert_false(cm_mime_is_text("image/png"));
    assert_false(cm_mime_is_text("application/pdf"));
    assert_false(cm_mime_is_text("application/octet-stream"));
    assert_false(cm_mime_is_text(NULL));
    const char *images[] = {"image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"};
    for (size_t i = 0; i < sizeof images / sizeof *images; i++)
        assert_true(cm_mime_is_image(images[i]));
    assert_false(cm_mime_is_image("image/tiff"));
    assert_false(cm_mime_is_image("text/plain"));
    assert_false(cm_mime_is_image(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(by_name),
        cmocka_unit_test(ext_of_a_type),
        cmocka_unit_test(text_and_images),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
