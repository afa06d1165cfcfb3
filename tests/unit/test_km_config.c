/* Unit tests of kernelmgr/config.c: defaults, validation, sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/kmlimits.h"

static int apply(kmcfg *c, const char *text, km_err *err)
{
    json_t *o = json_loads(text, 0, NULL);
    int rc = kmcfg_apply_json(c, o, err);
    json_decref(o);
    return rc;
}

static void defaults_and_valid(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    assert_true(c.timeout == 60);
    assert_int_equal(c.output_cap, 65536);
    assert_string_equal(c.sandbox, "strict");
    assert_string_equal(c.transport, "ipc");
    km_err err = {0};
    assert_int_equal(apply(&c,
                           "{\"languages\": [\"bash\"], \"timeout\": 5, \"memory\": \"1G\","
                           "\"network\": \"on\", \"pool\": 2, \"kernels\": {\"python\": "
                           "\"python3\"}, \"output_cap\": \"8K\", \"sandbox\": \"none\"}",
                           &err),
                     0);
    assert_false(c.allow[kmcfg_lang_index(&c, "python")]);
    assert_true(c.allow[kmcfg_lang_index(&c, "bash")]);
    assert_true(c.timeout == 5);
    assert_int_equal(c.memory, 1ull << 30);
    assert_int_equal(c.network, 1);
    assert_int_equal(c.pool, 2);
    assert_int_equal(c.output_cap, 8192);
    assert_string_equal(c.langs.v[kmcfg_lang_index(&c, "python")].kernelspec, "python3");
    json_t *j = kmcfg_to_json(&c);
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, &err), 0); /* round trip */
    json_decref(j);
    assert_int_equal(d.memory, c.memory);
}

/* tcp only with the exposure accepted, in either order, and it round-trips */
static void tcp_needs_the_opt_in(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    assert_false(c.transport_tcp_exposed);
    km_err err = {0};
    assert_int_equal(apply(&c, "{\"transport_tcp_exposed\": true, \"transport\": \"tcp\"}", &err),
                     0);
    assert_string_equal(c.transport, "tcp");
    assert_true(c.transport_tcp_exposed);
    json_t *j = kmcfg_to_json(&c);
    assert_true(json_is_true(json_object_get(j, "transport_tcp_exposed")));
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, &err), 0);
    json_decref(j);
    assert_string_equal(d.transport, "tcp");
    /* the opt-in alone changes nothing; ipc never needs it */
    kmcfg_defaults(&c);
    assert_int_equal(apply(&c, "{\"transport_tcp_exposed\": true}", &err), 0);
    assert_string_equal(c.transport, "ipc");
}

static void invalid_names_key_and_reason(void **state)
{
    (void)state;
    static const struct {
        const char *json, *expect;
    } cases[] = {
        {"{\"timeout\": \"x\"}", "timeout: must be a number"},
        {"{\"timeout\": -1}", "timeout: must be between"},
        {"{\"memroy\": 1}", "memroy: unknown key"},
        {"{\"memory\": \"lots\"}", "memory: must be a size"},
        {"{\"memory\": \"1K\"}", "memory: must be at least 16M"},
        {"{\"languages\": [\"cobol\"]}", "languages: unknown language"},
        {"{\"network\": 1}", "network: must be"},
        {"{\"python\": \"python3\"}", "python: must be an absolute path"},
        {"{\"pool\": 1.5}", "pool: must be an integer"},
        {"{\"kernels\": {\"Ruby\": \"x\"}}", "kernels.Ruby: not a language name"},
        {"{\"kernels\": {\"python\": \"../x\"}}", "kernels.python: not a kernelspec name"},
        {"{\"transport\": \"tcp\"}", "transport: \"tcp\": any local user can read"},
        {"{\"transport\": \"tcp\", \"transport_tcp_exposed\": false}",
         "set \"transport_tcp_exposed\": true to accept that"},
        {"{\"transport_tcp_exposed\": 1}", "transport_tcp_exposed: must be true or false"},
        {"[]", "(top level): must be a JSON object"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kmcfg c;
        kmcfg_defaults(&c);
        km_err err = {0};
        assert_int_equal(apply(&c, cases[i].json, &err), -1);
        if (!strstr(err.msg, cases[i].expect))
            fail_msg("%s: got \"%s\", want \"%s\"", cases[i].json, err.msg, cases[i].expect);
    }
}

static void sizes(void **state)
{
    (void)state;
    uint64_t b;
    assert_int_equal(kmcfg_parse_size("512M", &b), 0);
    assert_int_equal(b, 512ull << 20);
    assert_int_equal(kmcfg_parse_size("1.5GiB", &b), 0);
    assert_int_equal(b, 3ull << 29);
    assert_int_equal(kmcfg_parse_size("100", &b), 0);
    assert_int_equal(b, 100);
    assert_int_equal(kmcfg_parse_size("2 GB", &b), 0);
    assert_int_equal(kmcfg_parse_size("", &b), -1);
    assert_int_equal(kmcfg_parse_size("-1M", &b), -1);
    assert_int_equal(kmcfg_parse_size("1X", &b), -1);
    assert_int_equal(kmcfg_parse_size("1e30", &b), -1);
    /* the help texts' minimum memory is the minimum */
    assert_int_equal(kmcfg_parse_size(KM_MEMORY_MIN_TEXT, &b), 0);
    assert_int_equal(b, KM_MEMORY_MIN);
    assert_int_equal(kmcfg_load_file(&(kmcfg){0}, "/nonexistent/x.json", 0, &(km_err){0}), 0);
}

/* "cpus" and "cpu_time": off by default, numbers in range, null or 0 for
 * none, kept by the JSON round trip; anything else refused with a reason. */
static void cpu_limits(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    assert_true(c.cpus == 0 && c.cpu_time == 0);
    km_err err = {0};
    assert_int_equal(apply(&c, "{\"cpus\": 0.5, \"cpu_time\": 2}", &err), 0);
    assert_true(c.cpus == 0.5 && c.cpu_time == 2);
    json_t *j = kmcfg_to_json(&c);
    assert_true(json_real_value(json_object_get(j, "cpus")) == 0.5);
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, &err), 0);
    json_decref(j);
    assert_true(d.cpus == 0.5 && d.cpu_time == 2);
    assert_int_equal(apply(&d, "{\"cpus\": null, \"cpu_time\": 0}", &err), 0);
    assert_true(d.cpus == 0 && d.cpu_time == 0);
    j = kmcfg_to_json(&d);
    assert_true(json_is_null(json_object_get(j, "cpus")));
    assert_true(json_is_null(json_object_get(j, "cpu_time")));
    json_decref(j);
    static const struct {
        const char *json, *expect;
    } bad[] = {
        {"{\"cpus\": -1}", "cpus: must be between 0 and 4096"},
        {"{\"cpus\": 0.001}", "cpus: must be 0 (no cap) or at least 0.01 CPUs"},
        {"{\"cpus\": \"2\"}", "cpus: must be a number"},
        {"{\"cpu_time\": -3}", "cpu_time: must be between"},
        {"{\"cpu_time\": 0.0001}", "cpu_time: must be 0 (no budget) or at least 0.001 seconds"},
        {"{\"cpu_time\": true}", "cpu_time: must be a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kmcfg_defaults(&c);
        err.msg[0] = 0;
        assert_int_equal(apply(&c, bad[i].json, &err), -1);
        if (!strstr(err.msg, bad[i].expect))
            fail_msg("%s: got \"%s\", want \"%s\"", bad[i].json, err.msg, bad[i].expect);
    }
}

/* The gateway's bounds before the token: defaults, range, the JSON round
 * trip, http_host only a host name, node_id only [A-Za-z0-9_]{1,32} (the
 * first field of a kernel id), http_token_file an absolute path. */
static void gateway_unauth_bounds(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    assert_int_equal(c.http_max_unauth_per_peer, 16);
    assert_int_equal(c.http_max_unauth, 256);
    assert_int_equal(c.http_header_timeout, 10);
    assert_string_equal(c.http_host, "");
    assert_string_equal(c.node_id, "");
    km_err err = {0};
    assert_int_equal(apply(&c,
                           "{\"http_max_unauth_per_peer\": 4, \"http_max_unauth\": 40, "
                           "\"http_header_timeout\": 1, \"http_host\": \"lab.example.org\", "
                           "\"node_id\": \"kernelmgr_0\"}",
                           &err),
                     0);
    assert_string_equal(c.node_id, "kernelmgr_0");
    json_t *j = kmcfg_to_json(&c);
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, &err), 0);
    json_decref(j);
    assert_int_equal(d.http_max_unauth_per_peer, 4);
    assert_int_equal(d.http_max_unauth, 40);
    assert_int_equal(d.http_header_timeout, 1);
    assert_string_equal(d.http_host, "lab.example.org");
    static const struct {
        const char *json, *expect;
    } bad[] = {
        {"{\"http_max_unauth_per_peer\": 0}", "http_max_unauth_per_peer: must be between 1"},
        {"{\"http_max_unauth\": 1.5}", "http_max_unauth: must be an integer"},
        {"{\"http_header_timeout\": 601}", "http_header_timeout: must be between 1 and 600"},
        {"{\"http_host\": \"evil.example:80\"}", "http_host: must be a host name"},
        {"{\"http_host\": 3}", "http_host: must be a string"},
        {"{\"node_id\": \"kernelmgr-0\"}", "node_id: must be letters, digits and '_'"},
        {"{\"node_id\": \"n.1\"}", "node_id: must be letters, digits and '_'"},
        {"{\"node_id\": \"abcdefghijklmnopqrstuvwxyz0123456\"}", "node_id: "},
        {"{\"http_token_file\": \"token.txt\"}", "http_token_file: must be an absolute path"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kmcfg_defaults(&c);
        err.msg[0] = 0;
        assert_int_equal(apply(&c, bad[i].json, &err), -1);
        if (!strstr(err.msg, bad[i].expect))
            fail_msg("%s: got \"%s\", want \"%s\"", bad[i].json, err.msg, bad[i].expect);
    }
}

/* "files_scan_bytes": 16 MiB by default, a size in [64K, 1G], kept by the
 * JSON round trip. */
static void files_scan_bytes(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    assert_int_equal(c.files_scan_bytes, 16ull << 20);
    km_err err = {0};
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": \"256K\"}", &err), 0);
    assert_int_equal(c.files_scan_bytes, 256u << 10);
    json_t *j = kmcfg_to_json(&c);
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, &err), 0);
    json_decref(j);
    assert_int_equal(d.files_scan_bytes, 256u << 10);
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": \"1K\"}", &err), -1);
    assert_non_null(strstr(err.msg, "files_scan_bytes: must be between 65536 and"));
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": \"33M\"}", &err), -1);
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": true}", &err), -1);
    assert_non_null(strstr(err.msg, "files_scan_bytes: must be a size"));
}

/* The table of options: every row named once, with help, a sane range and
 * a default inside it; a SECONDS row names its unit. */
static void table_rows_are_sound(void **state)
{
    (void)state;
    int n = 0;
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++, n++) {
        if (!o->help || !o->help[0] || strchr(o->help, '|') || strchr(o->help, '\n') ||
            strlen(o->help) > 1000) /* kmcfg_doc's row fits */
            fail_msg("%s: no one-line help (or a '|' in it)", o->name);
        assert_ptr_equal(kmcfg_opt_find(o->name), o); /* unique: the first is itself */
        for (const kmcfg_opt *p = o + 1; p->name; p++)
            if (!strcmp(o->name, p->name))
                fail_msg("%s: two rows", o->name);
        switch (o->type) {
        case KMCFG_UINT:
        case KMCFG_SECONDS:
        case KMCFG_SIZE:
            if (!(o->min <= o->max))
                fail_msg("%s: min %g > max %g", o->name, o->min, o->max);
            if (!(o->def >= o->min && o->def <= o->max) &&
                !((o->flags & KMCFG_F_NONE) && o->def == 0))
                fail_msg("%s: default %g outside [%g, %g]", o->name, o->def, o->min, o->max);
            if (o->type == KMCFG_SECONDS && !o->unit)
                fail_msg("%s: no unit", o->name);
            break;
        case KMCFG_STRING:
        case KMCFG_ENUM:
            assert_non_null(o->sdef);
            if (strlen(o->sdef) >= o->size)
                fail_msg("%s: default longer than the field", o->name);
            if (o->type == KMCFG_ENUM && strcmp(o->sdef, o->values[0]) &&
                strcmp(o->sdef, o->values[1]))
                fail_msg("%s: default not one of its words", o->name);
            break;
        case KMCFG_SPECIAL:
            assert_non_null(o->special);
            assert_non_null(o->special->apply);
            assert_non_null(o->sdef); /* the docs' default */
            break;
        case KMCFG_BOOL:
            break;
        }
    }
    assert_true(n > 40);
    assert_null(kmcfg_opt_find("memroy"));
}

/* Every default passes its own validation: each key of the defaults'
 * to_json, applied alone on the defaults, is accepted and changes nothing. */
static void defaults_validate(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    json_t *j = kmcfg_to_json(&c);
    assert_non_null(j);
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++) {
        json_t *v = json_object_get(j, o->name);
        if (!v && o->type == KMCFG_SPECIAL && !strcmp(o->name, "env"))
            v = json_object(); /* secret: not in to_json; its default is {} */
        else if (!v && o->type == KMCFG_STRING)
            v = json_null(); /* secret token: unset */
        else if (!v && !strcmp(o->name, "python"))
            v = json_null(); /* detected: not in to_json */
        else
            json_incref(v);
        if (!v)
            fail_msg("%s: the defaults' to_json has no value", o->name);
        json_t *one = json_pack("{s:o}", o->name, v);
        kmcfg d;
        kmcfg_defaults(&d);
        km_err err = {0};
        if (kmcfg_apply_json(&d, one, &err))
            fail_msg("%s: its default is refused: %s", o->name, err.msg);
        json_t *k = kmcfg_to_json(&d);
        if (!json_equal(k, j))
            fail_msg("%s: applying its default changed the configuration", o->name);
        json_decref(k);
        json_decref(one);
        kmcfg_clear(&d);
    }
    json_decref(j);
}

/* A value other than the default for every key that is not special. */
static json_t *other_value(const kmcfg_opt *o)
{
    switch (o->type) {
    case KMCFG_BOOL:
        return json_boolean(!o->def);
    case KMCFG_UINT:
    case KMCFG_SIZE:
        return json_integer((json_int_t)(o->def == o->max ? o->min : o->max));
    case KMCFG_SECONDS:
        return json_real(o->def == o->max ? o->min : o->max);
    case KMCFG_ENUM:
        return json_string(o->values[!strcmp(o->sdef, o->values[0])]);
    case KMCFG_STRING:
        return json_string(!strcmp(o->name, "http_host")    ? "lab.example.org"
                           : !strcmp(o->name, "http_token") ? "0123456789abcdef0123"
                           : !strcmp(o->name, "http")       ? "127.0.0.1:8888"
                           : !strcmp(o->name, "node_id")    ? "kernelmgr_7"
                                                            : "/etc/kernelmgr/example.pem");
    case KMCFG_SPECIAL:
        break;
    }
    return NULL;
}

/* to_json then apply_json is the identity for every key but the secret
 * ones (the token and env, never written out), each set to a value other
 * than its default. */
static void round_trip_every_key(void **state)
{
    (void)state;
    json_t *set = json_loads("{\"languages\": [\"bash\"], \"memory\": \"1G\", \"network\": \"on\","
                             "\"python\": \"/usr/bin/python3\", \"output_cap\": 8192,"
                             "\"env\": {\"A\": \"b\"}, \"kernels\": {\"python\": \"python3\"}}",
                             0, NULL);
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++)
        if (o->type != KMCFG_SPECIAL)
            json_object_set_new(set, o->name, other_value(o));
    kmcfg c, d, e;
    kmcfg_defaults(&c);
    kmcfg_defaults(&d);
    kmcfg_defaults(&e);
    km_err err = {0};
    if (kmcfg_apply_json(&c, set, &err))
        fail_msg("the other values are refused: %s", err.msg);
    json_t *jc = kmcfg_to_json(&c), *jd0 = kmcfg_to_json(&d);
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++) {
        if (o->flags & KMCFG_F_SECRET) {
            assert_null(json_object_get(jc, o->name));
            continue;
        }
        if (json_equal(json_object_get(jc, o->name), json_object_get(jd0, o->name)))
            fail_msg("%s: the test's value is its default", o->name);
    }
    assert_int_equal(kmcfg_apply_json(&e, jc, &err), 0);
    json_t *je = kmcfg_to_json(&e);
    const char *key;
    json_t *v;
    json_object_foreach(jc, key, v)
    {
        if (!json_equal(v, json_object_get(je, key)))
            fail_msg("%s: not kept by the round trip", key);
    }
    assert_int_equal(json_object_size(jc), json_object_size(je));
    json_decref(je);
    json_decref(jd0);
    json_decref(jc);
    json_decref(set);
    kmcfg_clear(&c);
    kmcfg_clear(&d);
    kmcfg_clear(&e);
}

/* kmcfg_doc: a markdown table with one row per key. */
static void doc_lists_every_key(void **state)
{
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(kmcfg_doc(f), 0);
    fclose(f);
    assert_non_null(strstr(buf, "| key | default | meaning |\n| --- | --- | --- |\n"));
    int rows = 0;
    for (const char *p = buf; (p = strstr(p, "\n| `")); p++)
        rows++;
    int n = 0;
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++, n++) {
        char cell[128];
        snprintf(cell, sizeof cell, "\n| `%s` | ", o->name);
        if (!strstr(buf, cell))
            fail_msg("%s: not in the docs table", o->name);
    }
    assert_int_equal(rows, n);
    assert_non_null(strstr(buf, "| `cpus` | `null` (no cap) |"));
    assert_non_null(strstr(buf, "(0 or 0.01–4096 CPUs)"));
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_and_valid),   cmocka_unit_test(invalid_names_key_and_reason),
        cmocka_unit_test(tcp_needs_the_opt_in), cmocka_unit_test(sizes),
        cmocka_unit_test(cpu_limits),           cmocka_unit_test(gateway_unauth_bounds),
        cmocka_unit_test(files_scan_bytes),     cmocka_unit_test(table_rows_are_sound),
        cmocka_unit_test(defaults_validate),    cmocka_unit_test(round_trip_every_key),
        cmocka_unit_test(doc_lists_every_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
