/* Unit tests of kernelmgr/engine/lang.c: the language table, configured
 * languages ("kernels"), alias lookup, collisions, and their use by the
 * configuration, the fence splitter and the export. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernelmgr/engine/codeblocks.h"
#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/lang.h"

static int configure(km_langs *t, const char *name, const char *json, km_err *err)
{
    json_error_t je;
    json_t *v = json_loads(json, JSON_DECODE_ANY, &je);
    assert_non_null(v);
    int rc = km_langs_configure(t, name, v, err);
    json_decref(v);
    return rc;
}

static void builtins_and_lookup(void **state)
{
    (void)state;
    km_langs t;
    km_langs_builtin(&t);
    assert_int_equal(t.n, 2);
    assert_string_equal(t.v[0].name, "python");
    assert_string_equal(t.v[0].id, "py");
    assert_string_equal(t.v[1].name, "bash");
    assert_int_equal(km_langs_find(&t, "python3"), 0);
    assert_int_equal(km_langs_find(&t, "sh"), 1);
    assert_int_equal(km_langs_find(&t, "Python"), -1); /* --lang is exact */
    assert_int_equal(km_langs_find_nocase(&t, "IPython"), 0);
    assert_int_equal(km_langs_find(&t, "cobol"), -1);
    assert_int_equal(km_langs_role(&t, KM_LANG_ROLE_SHELL), 1);
    assert_true(t.v[0].takes_python && !t.v[1].takes_python);
    assert_int_equal(t.v[0].packages, KM_LANG_PKG_PIP);
    assert_int_equal(t.v[1].packages, KM_LANG_PKG_NPM);
    assert_string_equal(t.v[1].cell_magic, "%%bash");
    char names[64];
    assert_string_equal(km_langs_names(&t, names, sizeof names), "python, bash");
}

static void configured_backend_takes_builtin_alias(void **state)
{
    (void)state;
    km_langs t;
    km_langs_builtin(&t);
    km_err err = {0};
    int i = configure(&t, "sh",
                      "{\"backend\": \"kernel-bash\", \"aliases\": [\"posix\"], "
                      "\"file_extension\": \".sh\", \"cell_magic\": \"%%bash\"}",
                      &err);
    assert_int_equal(i, 2);
    assert_string_equal(t.v[2].backend, "kernel-bash");
    assert_false(t.v[2].takes_python);
    assert_int_equal(t.v[2].packages, KM_LANG_PKG_NONE);
    /* "sh" and "posix" now mean the new language; bash keeps its others */
    assert_int_equal(km_langs_find(&t, "sh"), 2);
    assert_int_equal(km_langs_find_nocase(&t, "POSIX"), 2);
    assert_int_equal(km_langs_find(&t, "shell"), 1);
    /* a kernelspec language, string form */
    assert_int_equal(configure(&t, "ipy", "\"python3\"", &err), 3);
    assert_string_equal(t.v[3].kernelspec, "python3");
    assert_string_equal(t.v[3].backend, "");
    /* a built-in given a kernelspec, then back */
    assert_int_equal(configure(&t, "python", "\"python3\"", &err), 0);
    assert_string_equal(t.v[0].kernelspec, "python3");
    json_t *j = km_langs_to_json(&t);
    assert_string_equal(json_string_value(json_object_get(j, "ipy")), "python3");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "sh"), "backend")),
                        "kernel-bash");
    /* the JSON form round-trips through a fresh table */
    km_langs u;
    km_langs_builtin(&u);
    const char *k;
    json_t *v;
    json_object_foreach(j, k, v)
    {
        assert_true(km_langs_configure(&u, k, v, &err) >= 0);
    }
    json_decref(j);
    assert_int_equal(u.n, 4);
    assert_string_equal(u.v[2].aliases[0], "posix");
    assert_string_equal(u.v[2].cell_magic, "%%bash");
    assert_int_equal(configure(&t, "python", "null", &err), 0);
    assert_string_equal(t.v[0].kernelspec, "");
    /* null removes a configured one */
    assert_int_equal(configure(&t, "ipy", "null", &err), 0);
    assert_int_equal(t.n, 3);
}

static void bad_entries_name_key_and_reason(void **state)
{
    (void)state;
    static const struct {
        const char *name, *json, *expect;
    } cases[] = {
        {"sh", "{\"backend\": \"kernel-bash\", \"colour\": 1}", "kernels.sh.colour: unknown key"},
        {"sh", "{\"backend\": \"kernel-bash\", \"kernelspec\": \"x\"}", "exactly one of"},
        {"sh", "{}", "kernels.sh: needs exactly one of"},
        {"foo", "{\"backend\": \"kernel-bash\", \"aliases\": [\"py\"]}",
         "kernels.foo.aliases: \"py\" is already a name or alias of another language"},
        {"foo", "{\"backend\": \"kernel-bash\", \"aliases\": [\"auto\"]}", "reserved"},
        {"Foo", "\"x\"", "kernels.Foo: not a language name"},
        {"9x", "\"x\"", "kernels.9x: not a language name"},
        {"auto", "\"x\"", "kernels.auto: \"auto\" is reserved"},
        {"foo", "\"../x\"", "kernels.foo: not a kernelspec name"},
        {"foo", "42", "kernels.foo: must be a Jupyter kernelspec name or an object"},
        {"foo", "{\"backend\": \"bin/x\"}", "kernels.foo.backend: must be a binary name"},
        {"foo", "{\"backend\": \"x\", \"packages\": \"gem\"}", "kernels.foo.packages: must be"},
        {"foo", "{\"kernelspec\": \"x\", \"packages\": \"pip\"}",
         "kernels.foo.packages: only for a backend language"},
        {"foo", "{\"backend\": \"x\", \"cell_magic\": \"bash\"}", "kernels.foo.cell_magic"},
        {"foo", "{\"backend\": \"x\", \"file_extension\": \"sh\"}", "kernels.foo.file_extension"},
        {"foo", "{\"backend\": \"x\", \"aliases\": \"posix\"}", "kernels.foo.aliases: must be an"},
        {"python", "{\"backend\": \"x\"}", "kernels.python: a built-in language takes"},
        {"ghost", "null", "kernels.ghost: null removes"},
        {"foo", "{\"backend\": 7}", "kernels.foo.backend: must be a string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        km_langs t;
        km_langs_builtin(&t);
        km_err err = {0};
        assert_int_equal(configure(&t, cases[i].name, cases[i].json, &err), -1);
        if (!strstr(err.msg, cases[i].expect))
            fail_msg("%s %s: got \"%s\", want \"%s\"", cases[i].name, cases[i].json, err.msg,
                     cases[i].expect);
        assert_int_equal(t.n, 2); /* unchanged */
        assert_int_equal(km_langs_find(&t, "sh"), 1);
    }
    /* a second configured language may not reuse the first one's words */
    km_langs t;
    km_langs_builtin(&t);
    km_err err = {0};
    assert_int_equal(
        configure(&t, "sh", "{\"backend\": \"kernel-bash\", \"aliases\": [\"posix\"]}", &err), 2);
    assert_int_equal(configure(&t, "posix", "\"x\"", &err), -1);
    assert_non_null(strstr(err.msg, "kernels.posix: \"posix\" is already"));
    /* at most KM_LANG_MAX */
    for (int n = 3; n < KM_LANG_MAX; n++) {
        char nm[16];
        snprintf(nm, sizeof nm, "l%d", n);
        assert_int_equal(configure(&t, nm, "\"x\"", &err), n);
    }
    assert_int_equal(configure(&t, "one-more", "\"x\"", &err), -1);
    assert_non_null(strstr(err.msg, "too many languages"));
}

static void config_allow_list_and_fences(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    km_err err = {0};
    /* "languages" may name a language "kernels" defines, whatever the key order */
    json_t *o = json_loads("{\"languages\": [\"python\", \"sh\"], \"kernels\": {\"sh\": "
                           "{\"backend\": \"kernel-bash\", \"aliases\": [\"posix\"]}}}",
                           0, NULL);
    assert_int_equal(kmcfg_apply_json(&c, o, &err), 0);
    json_decref(o);
    int sh = kmcfg_lang_index(&c, "sh");
    assert_int_equal(sh, 2);
    assert_true(c.allow[0] && !c.allow[1] && c.allow[sh]);
    /* by default a configured language is allowed */
    kmcfg d;
    kmcfg_defaults(&d);
    o = json_loads("{\"kernels\": {\"ipy\": \"python3\"}}", 0, NULL);
    assert_int_equal(kmcfg_apply_json(&d, o, &err), 0);
    json_decref(o);
    assert_true(d.allow[kmcfg_lang_index(&d, "ipy")]);
    /* the error names the entry */
    o = json_loads("{\"kernels\": {\"sh\": {\"backend\": \"x\", \"nope\": 1}}}", 0, NULL);
    assert_int_equal(kmcfg_apply_json(&d, o, &err), -1);
    json_decref(o);
    assert_non_null(strstr(err.msg, "kernels.sh.nope: unknown key"));
    assert_int_equal(d.langs.n, 3); /* unchanged */
    /* fences route by the table, configured aliases included */
    cblock_list l;
    assert_int_equal(cblocks_split("```posix\necho a\n```\n```sh\nb\n```\n```bash\nc\n```\n"
                                   "```python\nd\n```\n```console\n$ e\n```\n",
                                   &c.langs, -1, &l),
                     0);
    assert_int_equal(l.n, 5);
    assert_int_equal(l.v[0].lang, sh);
    assert_int_equal(l.v[1].lang, sh);
    assert_int_equal(l.v[2].lang, 1);
    assert_int_equal(l.v[3].lang, 0);
    assert_int_equal(l.v[4].lang, 1); /* console: the shell-like built-in */
    cblocks_free(&l);
    json_t *j = kmcfg_to_json(&c);
    assert_string_equal(json_string_value(json_array_get(json_object_get(j, "languages"), 1)),
                        "sh");
    json_decref(j);
}

static void backend_path(void **state)
{
    (void)state;
    km_langs t;
    km_langs_builtin(&t);
    km_err err = {0};
    assert_int_equal(configure(&t, "sh", "{\"backend\": \"/bin/sh\"}", &err), 2);
    assert_int_equal(configure(&t, "gone", "{\"backend\": \"/nonexistent/kernel-x\"}", &err), 3);
    char *p = km_lang_backend_path(&t.v[2], NULL, &err);
    assert_non_null(p);
    assert_string_equal(p, "/bin/sh");
    free(p);
    /* a missing backend is found out when its kernel starts, naming the path */
    assert_null(km_lang_backend_path(&t.v[3], NULL, &err));
    assert_non_null(strstr(err.msg, "/nonexistent/kernel-x"));
    /* a name is looked up in the kernel directory */
    assert_null(km_lang_backend_path(&t.v[1], "/nonexistent-dir", &err));
    assert_non_null(strstr(err.msg, "/nonexistent-dir/kernel-bash"));
    assert_int_equal(configure(&t, "ks", "\"python3\"", &err), 4);
    assert_null(km_lang_backend_path(&t.v[4], NULL, &err));
    assert_non_null(strstr(err.msg, "no kernel-server backend"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(builtins_and_lookup),
        cmocka_unit_test(configured_backend_takes_builtin_alias),
        cmocka_unit_test(bad_entries_name_key_and_reason),
        cmocka_unit_test(config_allow_list_and_fences),
        cmocka_unit_test(backend_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
