/* Unit tests of kernelmgr/config.c: defaults, validation, sizes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "kernelmgr/engine/config.h"

static int apply(kmcfg *c, const char *text, char *err, size_t n)
{
    json_t *o = json_loads(text, 0, NULL);
    int rc = kmcfg_apply_json(c, o, err, n);
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
    char err[256] = "";
    assert_int_equal(apply(&c,
                           "{\"languages\": [\"bash\"], \"timeout\": 5, \"memory\": \"1G\","
                           "\"network\": \"on\", \"pool\": 2, \"kernels\": {\"python\": "
                           "\"python3\"}, \"output_cap\": \"8K\", \"sandbox\": \"none\"}",
                           err, sizeof err),
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
    assert_int_equal(kmcfg_apply_json(&d, j, err, sizeof err), 0); /* round trip */
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
    char err[256] = "";
    assert_int_equal(
        apply(&c, "{\"transport_tcp_exposed\": true, \"transport\": \"tcp\"}", err, sizeof err), 0);
    assert_string_equal(c.transport, "tcp");
    assert_true(c.transport_tcp_exposed);
    json_t *j = kmcfg_to_json(&c);
    assert_true(json_is_true(json_object_get(j, "transport_tcp_exposed")));
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, err, sizeof err), 0);
    json_decref(j);
    assert_string_equal(d.transport, "tcp");
    /* the opt-in alone changes nothing; ipc never needs it */
    kmcfg_defaults(&c);
    assert_int_equal(apply(&c, "{\"transport_tcp_exposed\": true}", err, sizeof err), 0);
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
        char err[256] = "";
        assert_int_equal(apply(&c, cases[i].json, err, sizeof err), -1);
        if (!strstr(err, cases[i].expect))
            fail_msg("%s: got \"%s\", want \"%s\"", cases[i].json, err, cases[i].expect);
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
    assert_int_equal(kmcfg_load_file(&(kmcfg){0}, "/nonexistent/x.json", 0, (char[64]){0}, 64), 0);
}

/* "cpus" and "cpu_time": off by default, numbers in range, null or 0 for
 * none, kept by the JSON round trip; anything else refused with a reason. */
static void cpu_limits(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    assert_true(c.cpus == 0 && c.cpu_time == 0);
    char err[256] = "";
    assert_int_equal(apply(&c, "{\"cpus\": 0.5, \"cpu_time\": 2}", err, sizeof err), 0);
    assert_true(c.cpus == 0.5 && c.cpu_time == 2);
    json_t *j = kmcfg_to_json(&c);
    assert_true(json_real_value(json_object_get(j, "cpus")) == 0.5);
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, err, sizeof err), 0);
    json_decref(j);
    assert_true(d.cpus == 0.5 && d.cpu_time == 2);
    assert_int_equal(apply(&d, "{\"cpus\": null, \"cpu_time\": 0}", err, sizeof err), 0);
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
        err[0] = 0;
        assert_int_equal(apply(&c, bad[i].json, err, sizeof err), -1);
        if (!strstr(err, bad[i].expect))
            fail_msg("%s: got \"%s\", want \"%s\"", bad[i].json, err, bad[i].expect);
    }
}

/* The gateway's bounds before the token: defaults, range, the JSON round
 * trip, and http_host only a host name. */
static void gateway_unauth_bounds(void **state)
{
    (void)state;
    kmcfg c;
    kmcfg_defaults(&c);
    assert_int_equal(c.http_max_unauth_per_peer, 16);
    assert_int_equal(c.http_max_unauth, 256);
    assert_int_equal(c.http_header_timeout, 10);
    assert_string_equal(c.http_host, "");
    char err[256] = "";
    assert_int_equal(apply(&c,
                           "{\"http_max_unauth_per_peer\": 4, \"http_max_unauth\": 40, "
                           "\"http_header_timeout\": 1, \"http_host\": \"lab.example.org\"}",
                           err, sizeof err),
                     0);
    json_t *j = kmcfg_to_json(&c);
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, err, sizeof err), 0);
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
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kmcfg_defaults(&c);
        err[0] = 0;
        assert_int_equal(apply(&c, bad[i].json, err, sizeof err), -1);
        if (!strstr(err, bad[i].expect))
            fail_msg("%s: got \"%s\", want \"%s\"", bad[i].json, err, bad[i].expect);
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
    char err[256] = "";
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": \"256K\"}", err, sizeof err), 0);
    assert_int_equal(c.files_scan_bytes, 256u << 10);
    json_t *j = kmcfg_to_json(&c);
    kmcfg d;
    kmcfg_defaults(&d);
    assert_int_equal(kmcfg_apply_json(&d, j, err, sizeof err), 0);
    json_decref(j);
    assert_int_equal(d.files_scan_bytes, 256u << 10);
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": \"1K\"}", err, sizeof err), -1);
    assert_non_null(strstr(err, "files_scan_bytes: must be between 65536 and"));
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": \"33M\"}", err, sizeof err), -1);
    assert_int_equal(apply(&c, "{\"files_scan_bytes\": true}", err, sizeof err), -1);
    assert_non_null(strstr(err, "files_scan_bytes: must be a size"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_and_valid),   cmocka_unit_test(invalid_names_key_and_reason),
        cmocka_unit_test(tcp_needs_the_opt_in), cmocka_unit_test(sizes),
        cmocka_unit_test(cpu_limits),           cmocka_unit_test(gateway_unauth_bounds),
        cmocka_unit_test(files_scan_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
