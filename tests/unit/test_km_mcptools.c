/* Unit tests of the MCP tool table (kernelmgr/frontends/mcp_tools.c): every
 * tool has a name, a description, a schema that parses and a handler; names
 * are unique; tools/list shows exactly the table, in order, with the session
 * options added where the table says; tools/call refuses an unknown name
 * and an argument its schema does not name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/frontends/mcp_tools.h"
#include "kernelmgr/service/dtier.h"
/* The tools reach the daemon's client code, which links daemon.o and so
 * the gateway entry points: the binary without a gateway has these. */
#include "kernelmgr/frontends/gateway_none.c"

static void entries(void **state)
{
    (void)state;
    int n = 0;
    for (const mcpt_tool *t = mcpt_tools; t->name; t++, n++) {
        assert_true(t->name[0]);
        assert_non_null(t->title);
        assert_true(t->description && strlen(t->description) > 20);
        assert_non_null(t->handler);
        json_t *schema = json_loads(t->input_schema, 0, NULL);
        assert_non_null(schema);
        assert_string_equal(json_string_value(json_object_get(schema, "type")), "object");
        assert_true(json_is_object(json_object_get(schema, "properties")));
        assert_true(json_is_false(json_object_get(schema, "additionalProperties")));
        /* every required argument is a property */
        json_t *req = json_object_get(schema, "required");
        for (size_t i = 0; i < json_array_size(req); i++)
            assert_non_null(json_object_get(json_object_get(schema, "properties"),
                                            json_string_value(json_array_get(req, i))));
        json_decref(schema);
        json_t *ann = json_loads(t->annotations, 0, NULL);
        assert_true(json_is_object(ann));
        json_decref(ann);
        for (const mcpt_tool *u = mcpt_tools; u < t; u++)
            assert_string_not_equal(u->name, t->name);
        assert_ptr_equal(mcpt_find(t->name), t);
    }
    assert_int_equal(n, 10);
    assert_null(mcpt_find("no_such_tool"));
    assert_null(mcpt_find(NULL));
}

static void list_is_the_table(void **state)
{
    (void)state;
    json_t *list = mcpt_list();
    size_t i = 0;
    for (const mcpt_tool *t = mcpt_tools; t->name; t++, i++) {
        json_t *o = json_array_get(list, i);
        assert_string_equal(json_string_value(json_object_get(o, "name")), t->name);
        assert_string_equal(json_string_value(json_object_get(o, "description")), t->description);
        json_t *props = json_object_get(json_object_get(o, "inputSchema"), "properties");
        for (const dtier_sessopt *so = dtier_sessopts; so->f.name; so++)
            if (so->f.tiers & DT_M)
                assert_int_equal(json_object_get(props, so->f.name) != NULL, t->session_options);
    }
    assert_int_equal(json_array_size(list), i);
    json_decref(list);
}

static void unknown_tool(void **state)
{
    (void)state;
    int code = 0;
    char msg[200] = "";
    json_t *args = json_object();
    assert_null(mcpt_call(NULL, "nope", args, &code, msg, sizeof msg));
    assert_int_equal(code, -32602);
    assert_string_equal(msg, "Unknown tool: nope");
    json_decref(args);
}

/* The text of a CallToolResult that is an error. */
static const char *error_text(json_t *r)
{
    assert_true(json_is_true(json_object_get(r, "isError")));
    return json_string_value(
        json_object_get(json_array_get(json_object_get(r, "content"), 0), "text"));
}

/* The argument names a tool accepts are its schema's properties (and the
 * session options where the table says), listed in a refusal in order. */
static void unknown_argument(void **state)
{
    (void)state;
    int code = 0;
    char msg[200] = "";
    json_t *args = json_pack("{s:i}", "bogus", 1);
    json_t *r = mcpt_call(NULL, "read_file", args, &code, msg, sizeof msg);
    assert_string_equal(
        error_text(r),
        "unknown argument 'bogus' (expected: session, path, offset, length, encoding)");
    json_decref(r);
    r = mcpt_call(NULL, "list_sessions", args, &code, msg, sizeof msg);
    assert_string_equal(error_text(r), "unknown argument 'bogus' (expected: )");
    json_decref(r);
    r = mcpt_call(NULL, "code_exec", args, &code, msg, sizeof msg);
    char want[400] = "unknown argument 'bogus' (expected: code, language, session, timeout_s";
    for (const dtier_sessopt *so = dtier_sessopts; so->f.name; so++)
        if (so->f.tiers & DT_M) {
            strcat(want, ", ");
            strcat(want, so->f.name);
        }
    strcat(want, ")");
    assert_string_equal(error_text(r), want);
    json_decref(r);
    json_decref(args);
    assert_int_equal(code, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(entries),
        cmocka_unit_test(list_is_the_table),
        cmocka_unit_test(unknown_tool),
        cmocka_unit_test(unknown_argument),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
