/*
 * test_km_mcprender.c — a code_exec result as the model sees it through MCP
 * (mcp_render.c): the compact text item (one block without a header, each
 * of several with its language and status, streams, the last value, the
 * end of a traceback, files, truncation and spill notes, restarts, limits,
 * waits and warnings), a stream over the text cap cut on character
 * boundaries, images inline when small and linked (or noted) when large
 * with base64 replaced by a marker in structuredContent, and isError.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <jansson.h>

#include "common/cm_utf8.h"
#include "kernelmgr/frontends/mcp_render.h"

/* The text item of r. */
static const char *text_of(const json_t *r)
{
    const json_t *c0 = json_array_get(json_object_get(r, "content"), 0);
    assert_string_equal(json_string_value(json_object_get(c0, "type")), "text");
    const char *t = json_string_value(json_object_get(c0, "text"));
    assert_non_null(t);
    return t;
}

static json_t *parse(const char *s)
{
    json_error_t e;
    json_t *o = json_loads(s, 0, &e);
    if (!o)
        print_message("bad test JSON: %s (%s)\n", s, e.text);
    assert_non_null(o);
    return o;
}

static void contains(const char *hay, const char *needle)
{
    if (!strstr(hay, needle))
        print_message("\"%s\" not in:\n%s\n", needle, hay);
    assert_non_null(strstr(hay, needle));
}

static void one_ok_block_has_no_header(void **state)
{
    (void)state;
    json_t *rep =
        parse("{\"failed\":false,\"results\":[{\"language\":\"python\",\"status\":\"ok\","
              "\"stdout\":\"hi\\n\",\"stderr\":\"careful\",\"result\":{\"text/plain\":"
              "\"42\"},\"files\":[{\"change\":\"created\",\"path\":\"a.txt\",\"size\":5},"
              "{\"change\":\"deleted\",\"path\":\"b\",\"size\":9}],\"files_omitted\":3}]}");
    json_t *r = mcpr_exec_result(rep, "s1", NULL);
    assert_non_null(r);
    assert_string_equal(text_of(r), "stdout:\nhi\nstderr:\ncareful\nresult: 42\n"
                                    "files: created a.txt (5 bytes), deleted b, and 3 more");
    assert_false(json_is_true(json_object_get(r, "isError")));
    json_t *sc = json_object_get(r, "structuredContent");
    assert_string_equal(json_string_value(json_object_get(sc, "session")), "s1");
    assert_false(json_is_true(json_object_get(sc, "failed")));
    /* the blocks as they came (no images to replace) */
    assert_true(json_equal(json_object_get(sc, "blocks"), json_object_get(rep, "results")));
    json_decref(r);
    json_decref(rep);
}

static void blocks_say_language_status_and_errors(void **state)
{
    (void)state;
    json_t *rep = parse(
        "{\"failed\":true,\"results\":["
        "{\"language\":\"python\",\"status\":\"ok\",\"stdout\":\"one\"},"
        "{\"language\":\"bash\",\"status\":\"error\",\"exit_code\":3,\"error\":{\"name\":"
        "\"ExitStatus\",\"value\":\"3\",\"traceback\":[\"t1\",\"t2\",\"t3\",\"t4\",\"t5\",\"t6\","
        "\"t7\",\"t8\\n\"]}},"
        "{\"language\":\"python\",\"status\":\"timeout\",\"kernel\":{\"restarted\":true,"
        "\"state_preserved\":false,\"reason\":\"killed after the grace\"},\"limits_hit\":["
        "\"CPU time limit of 1 s per block\"]}]}");
    json_t *r = mcpr_exec_result(rep, "s", NULL);
    const char *t = text_of(r);
    contains(t, "[block 1/3: python, ok]\nstdout:\none\n");
    contains(t, "\n[block 2/3: bash, error, exit code 3]\nerror: ExitStatus: 3\n"
                "traceback:\n  [... 2 earlier lines ...]\nt3\nt4\nt5\nt6\nt7\nt8\n");
    contains(t, "[block 3/3: python, timeout]\n");
    contains(t, "note: the kernel was restarted and its state (variables, imports) was lost: "
                "killed after the grace\n");
    contains(t, "note: the execution hit its time limit and was interrupted\n");
    contains(t, "note: CPU time limit of 1 s per block");
    assert_true(json_is_true(json_object_get(r, "isError")));
    assert_true(json_is_true(json_object_get(json_object_get(r, "structuredContent"), "failed")));
    json_decref(r);
    json_decref(rep);
    /* a block's own status counts even when the reply says nothing */
    rep = parse("{\"results\":[{\"language\":\"python\",\"status\":\"error\",\"error\":{"
                "\"name\":\"ValueError\",\"value\":\"\"}}]}");
    r = mcpr_exec_result(rep, "s", NULL);
    assert_string_equal(text_of(r), "[block 1/1: python, error]\nerror: ValueError");
    assert_true(json_is_true(json_object_get(r, "isError")));
    json_decref(r);
    json_decref(rep);
}

/* A stream over MCPR_TEXT_MAX keeps its head and tail, cut between
 * characters, and says how much was left out. */
static void long_streams_are_cut_between_characters(void **state)
{
    (void)state;
    size_t n = MCPR_TEXT_MAX * 3;
    char *big = malloc(n + 1);
    assert_non_null(big);
    for (size_t i = 0; i + 2 <= n; i += 2)
        memcpy(big + i, "\xc3\xa9", 2); /* é, two bytes each */
    big[n] = 0;
    json_t *rep = json_pack("{s:[{s:s s:s s:s}]}", "results", "language", "python", "status", "ok",
                            "stdout", big);
    json_t *r = mcpr_exec_result(rep, "s", NULL);
    const char *t = text_of(r);
    assert_true(cm_utf8_valid(t, strlen(t)));
    assert_true(strlen(t) < MCPR_TEXT_MAX + 200);
    contains(t, " bytes omitted here ...]\n");
    size_t omitted = 0;
    const char *o = strstr(t, "[... ");
    assert_non_null(o);
    assert_int_equal(sscanf(o, "[... %zu bytes omitted", &omitted), 1);
    assert_true(omitted >= n - MCPR_TEXT_MAX && omitted <= n - MCPR_TEXT_MAX + 2);
    json_decref(r);
    json_decref(rep);
    free(big);
}

static void images_inline_linked_or_noted(void **state)
{
    (void)state;
    size_t big = MCPR_IMAGE_MAX + 4;
    char *b64 = malloc(big + 1);
    assert_non_null(b64);
    memset(b64, 'A', big);
    b64[big] = 0;
    json_t *rep = json_pack(
        "{s:[{s:s s:s s:[{s:s},{s:s},{s:s s:s}] s:[{s:s},{s:s s:s s:i},{s:s}]}]}", "results",
        "language", "python", "status", "ok", "displays", "image/png", "iVBORw0KGgo=", "image/png",
        b64, "image/jpeg", b64, "text/plain", "<Figure>", "images", "path", "plots/small.png",
        "path", "plots/big.png", "mime", "image/png", "size", 123456, "path", "/abs/fig.jpg");
    json_t *r = mcpr_exec_result(rep, "s", "/ws");
    json_t *content = json_object_get(r, "content");
    assert_int_equal(json_array_size(content), 4);
    /* the small one inline */
    json_t *c1 = json_array_get(content, 1);
    assert_string_equal(json_string_value(json_object_get(c1, "type")), "image");
    assert_string_equal(json_string_value(json_object_get(c1, "data")), "iVBORw0KGgo=");
    assert_string_equal(json_string_value(json_object_get(c1, "mimeType")), "image/png");
    /* the large ones linked to the files the manager saved for them (its
     * "images", one per image of the block, in order): a relative path is
     * the workspace's */
    json_t *c2 = json_array_get(content, 2);
    assert_string_equal(json_string_value(json_object_get(c2, "type")), "resource_link");
    assert_string_equal(json_string_value(json_object_get(c2, "uri")), "file:///ws/plots/big.png");
    assert_string_equal(json_string_value(json_object_get(c2, "name")), "big.png");
    assert_int_equal(json_integer_value(json_object_get(c2, "size")), 123456);
    json_t *c3 = json_array_get(content, 3);
    assert_string_equal(json_string_value(json_object_get(c3, "uri")), "file:///abs/fig.jpg");
    assert_string_equal(json_string_value(json_object_get(c3, "mimeType")), "image/jpeg");
    const char *t = text_of(r);
    contains(t, "was too large to show inline; see the linked file");
    contains(t, "3 images (see the image content)");
    /* structuredContent carries markers, not base64 */
    json_t *disp = json_object_get(
        json_array_get(json_object_get(json_object_get(r, "structuredContent"), "blocks"), 0),
        "displays");
    char *s = json_dumps(disp, JSON_COMPACT);
    assert_null(strstr(s, "iVBORw0KGgo="));
    assert_null(strstr(s, "AAAA"));
    contains(s, "sent as image content #1");
    contains(s, "linked as content #2");
    free(s);
    json_decref(r);
    /* without a saved file (or a workspace for a relative one): a note */
    r = mcpr_exec_result(rep, "s", NULL);
    assert_int_equal(json_array_size(json_object_get(r, "content")), 3);
    contains(text_of(r), "was too large to show inline\n");
    json_decref(r);
    json_decref(rep);
    free(b64);
}

static void notes_for_truncation_waits_and_warnings(void **state)
{
    (void)state;
    json_t *rep = parse(
        "{\"waited\":{\"seconds\":2.5,\"message\":\"waited 2.5 s for a cell of another client\"},"
        "\"warnings\":[\"memory is the session's (512M), not 1G\"],"
        "\"results\":[{\"language\":\"bash\",\"status\":\"ok\",\"truncated\":{"
        "\"stdout\":{\"total_bytes\":5000000,\"kept_bytes\":1000,\"spill\":\"outputs/1.txt\","
        "\"limit\":\"stream_max\"},"
        "\"files\":{\"reason\":\"files_scan_max reached\"},"
        "\"images\":{\"omitted\":2,\"reason\":\"image_max\"}}}]}");
    json_t *r = mcpr_exec_result(rep, "s", NULL);
    const char *t = text_of(r);
    contains(t, "note: waited 2.5 s for a cell of another client\n");
    contains(t, "warning: memory is the session's (512M), not 1G\n");
    contains(t, "note: stdout was truncated: 5000000 bytes in total, 1000 kept; the full output "
                "is in outputs/1.txt; stream_max\n");
    contains(t, "note: the file report is incomplete: files_scan_max reached\n");
    contains(t, "note: 2 images were not saved: image_max");
    json_decref(r);
    json_decref(rep);
}

static void empty_inputs_and_plain_results(void **state)
{
    (void)state;
    json_t *rep = parse("{\"results\":[]}");
    json_t *r = mcpr_exec_result(rep, "s", NULL);
    assert_string_equal(text_of(r), "(no code to run: the input had no Python or Bash block)");
    json_decref(r);
    json_decref(rep);
    rep = parse("{\"results\":[{\"language\":\"python\",\"status\":\"ok\"}]}");
    r = mcpr_exec_result(rep, "s", NULL);
    assert_string_equal(text_of(r), "(no output)");
    json_decref(r);
    json_decref(rep);

    r = mcpr_text_result("refused", 1);
    assert_string_equal(text_of(r), "refused");
    assert_true(json_is_true(json_object_get(r, "isError")));
    json_decref(r);
    r = mcpr_json_result(json_pack("{s:i}", "n", 3), NULL, 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(r, "structuredContent"), "n")), 3);
    contains(text_of(r), "\"n\": 3");
    assert_false(json_is_true(json_object_get(r, "isError")));
    json_decref(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_ok_block_has_no_header),
        cmocka_unit_test(blocks_say_language_status_and_errors),
        cmocka_unit_test(long_streams_are_cut_between_characters),
        cmocka_unit_test(images_inline_linked_or_noted),
        cmocka_unit_test(notes_for_truncation_waits_and_warnings),
        cmocka_unit_test(empty_inputs_and_plain_results),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
