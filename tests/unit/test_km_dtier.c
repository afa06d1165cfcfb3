/* Unit tests of kernelmgr/service/dtier.c: tiers, the per-tier field
 * allowlist, the session option table, the operator's ceilings and the
 * scrubbing of host paths from replies to HTTP clients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/service/dtier.h"

static const dtier_field f_pkg[] = {{"session", DT_ALL, 0, NULL},
                                    {"manager", DT_ALL, 0, NULL},
                                    {"packages", DT_ALL, 0, NULL},
                                    {"allowlist", DT_O, 0, "it names a host path"},
                                    {NULL, 0, 0, NULL}};
static const dtier_field f_exec[] = {{"session", DT_ALL, 0, NULL},
                                     {"code", DT_ALL, 0, NULL},
                                     {"raw_text", DT_O | DT_M, 0, NULL},
                                     {NULL, 0, 0, NULL}};

static int check(dtier t, int unsafe, const dtier_field *f, int sopts, const char *json, char *why)
{
    json_t *p = json_loads(json, 0, NULL);
    assert_non_null(p);
    dtier_grant g = {t, unsafe};
    km_err e = {0};
    int rc = dtier_check_fields(&g, f, sopts, p, &e);
    snprintf(why, 600, "%.599s", e.msg);
    json_decref(p);
    return rc;
}

static void names(void **state)
{
    (void)state;
    dtier t;
    assert_int_equal(dtier_parse("mcp", &t), 0);
    assert_int_equal(t, DT_MCP);
    assert_int_equal(dtier_parse("http", &t), 0);
    assert_int_equal(t, DT_HTTP);
    assert_int_equal(dtier_parse("root", &t), -1);
    assert_int_equal(dtier_parse(NULL, &t), -1);
    assert_string_equal(dtier_name(DT_OWNER), "owner");
    assert_string_equal(dtier_clients(DT_HTTP), "HTTP clients");
    /* lower means a larger number: the daemon refuses t < current */
    assert_true(DT_OWNER < DT_MCP && DT_MCP < DT_HTTP);
}

static void fields_allowlist(void **state)
{
    (void)state;
    km_err why = {0};
    /* the owner may send every field */
    assert_int_equal(
        check(DT_OWNER, 0, f_pkg, 0, "{\"session\":\"s\",\"allowlist\":\"/x\"}", why.msg), 0);
    /* a host path is refused for the others, naming the field and the tier */
    assert_int_equal(
        check(DT_HTTP, 0, f_pkg, 0, "{\"session\":\"s\",\"allowlist\":\"/x\"}", why.msg), -1);
    assert_non_null(strstr(why.msg, "field \"allowlist\" is not available to HTTP clients"));
    assert_non_null(strstr(why.msg, "host path"));
    assert_int_equal(check(DT_MCP, 1, f_pkg, 0, "{\"allowlist\":\"/x\"}", why.msg), -1);
    assert_non_null(strstr(why.msg, "MCP clients"));
    /* raw_text: owner and mcp, not http */
    assert_int_equal(check(DT_MCP, 0, f_exec, 0, "{\"raw_text\":true}", why.msg), 0);
    assert_int_equal(check(DT_HTTP, 0, f_exec, 0, "{\"raw_text\":true}", why.msg), -1);
    assert_non_null(strstr(why.msg, "raw_text"));
    /* a field never heard of: unknown, with what the tier may send */
    assert_int_equal(check(DT_HTTP, 0, f_exec, 1, "{\"frobnicate\":1}", why.msg), -1);
    assert_non_null(strstr(why.msg, "unknown field \"frobnicate\""));
    assert_non_null(strstr(why.msg, "session, code"));
    assert_null(strstr(why.msg, "raw_text"));
    /* the field "python" (a host path) is not listed; "ipython" is */
    assert_null(strstr(why.msg, " python,"));
    assert_null(strstr(why.msg, " python)"));
    assert_non_null(strstr(why.msg, " ipython"));
    /* no params at all: nothing to refuse */
    dtier_grant g = {DT_HTTP, 0};
    assert_int_equal(dtier_check_fields(&g, f_exec, 1, NULL, &why), 0);
}

static void sessopt_tiers(void **state)
{
    (void)state;
    char why[600];
    /* host paths: owner only; over HTTP with the operator's opt-in (as
     * documented); never from MCP, opt-in or not */
    assert_int_equal(check(DT_OWNER, 0, f_exec, 1, "{\"python\":\"/usr/bin/python3\"}", why), 0);
    assert_int_equal(check(DT_MCP, 1, f_exec, 1, "{\"python\":\"/usr/bin/python3\"}", why), -1);
    assert_non_null(strstr(why, "field \"python\" is not available to MCP clients"));
    assert_int_equal(check(DT_MCP, 0, f_exec, 1, "{\"workspace\":\"/etc\"}", why), -1);
    assert_int_equal(check(DT_HTTP, 0, f_exec, 1, "{\"workspace\":\"/etc\"}", why), -1);
    assert_non_null(strstr(why, "http_allow_unsafe_session_options"));
    assert_int_equal(check(DT_HTTP, 1, f_exec, 1, "{\"workspace\":\"/etc\"}", why), 0);
    /* session options only where the method takes them */
    assert_int_equal(check(DT_OWNER, 0, f_pkg, 0, "{\"memory\":\"1G\"}", why), -1);
    assert_non_null(strstr(why, "unknown field \"memory\""));
    /* every row is found by its name and is well-formed */
    for (const dtier_sessopt *o = dtier_sessopts; o->f.name; o++) {
        assert_ptr_equal(dtier_sessopt_find(o->f.name), o);
        assert_true(o->f.tiers & DT_O);
        assert_non_null(o->help);
        if (o->type == DT_SO_CHOICE)
            assert_non_null(o->relaxing);
    }
    assert_null(dtier_sessopt_find("allowlist"));
}

static int fill(const char *json, km_session_opts *so, json_t **keep, char *why)
{
    *keep = json_loads(json, 0, NULL);
    assert_non_null(*keep);
    km_err e = {0};
    int rc = dtier_sopts_fill(*keep, so, &e);
    snprintf(why, 600, "%.599s", e.msg);
    return rc;
}

static void sopts_values(void **state)
{
    (void)state;
    char why[600];
    km_session_opts so;
    json_t *p;
    assert_int_equal(fill("{\"network\":\"on\",\"memory\":\"512M\",\"cpus\":1.5,\"cpu_time\":2,"
                          "\"sandbox\":\"strict\",\"python\":\"/usr/bin/python3\","
                          "\"env\":{\"A\":\"b\"}}",
                          &so, &p, why),
                     0);
    assert_int_equal(so.network, 1);
    assert_int_equal(so.memory, 512u << 20);
    assert_true(so.cpus == 1.5 && so.cpu_time == 2);
    assert_string_equal(so.sandbox, "strict");
    assert_string_equal(so.python, "/usr/bin/python3");
    assert_non_null(so.env);
    json_decref(p);
    assert_int_equal(fill("{}", &so, &p, why), 0);
    assert_int_equal(so.network, -1);
    json_decref(p);
    assert_int_equal(
        fill("{\"network\":{\"allow\":[\"PyPI.org.\",\"*.Example.com:443\",\"[::1]:80\"]}}", &so,
             &p, why),
        0);
    assert_int_equal(so.network, KM_NET_ALLOW);
    assert_string_equal(so.network_allow, "allow:pypi.org,*.example.com:443,[::1]:80");
    json_decref(p);
    static const char *const bad[][2] = {
        {"{\"memory\":\"1K\"}", "field \"memory\": must be a size of at least 16M"},
        {"{\"memory\":true}", "field \"memory\""},
        {"{\"network\":\"maybe\"}",
         "field \"network\": must be \"on\", \"off\" or {\"allow\": [\"host[:port]\", ...]} (got "
         "\"maybe\")"},
        {"{\"network\":1}", "field \"network\": must be \"on\", \"off\" or"},
        {"{\"network\":true}", "(got a boolean)"},
        {"{\"network\":{\"allow\":[]}}", "\"allow\" must be a non-empty array"},
        {"{\"network\":{\"allow\":[\"a.com\"],\"deny\":[]}}", "field \"network\": must be"},
        {"{\"network\":{\"allow\":[\"*.com\"]}}", "allow entry \"*.com\": a wildcard must cover"},
        {"{\"network\":{\"allow\":[\"a.com:0\"]}}", "the port must be a number from 1 to 65535"},
        {"{\"network\":{\"allow\":[7]}}", "field \"network\": allow[0] must be a string"},
        {"{\"cpus\":5000}", "field \"cpus\": must be a number of CPUs from 0.01 to 4096"},
        {"{\"cpus\":0}", "field \"cpus\": must be a number of CPUs from 0.01 to 4096"},
        {"{\"cpu_time\":0}", "field \"cpu_time\": must be a number of seconds from 0.001"},
        {"{\"cpus\":\"2\"}", "field \"cpus\": expected a number"},
        {"{\"cpu_time\":1e9}", "field \"cpu_time\": must be a number of seconds from 0.001"},
        {"{\"python\":\"python3\"}", "field \"python\": must be an absolute path"},
        {"{\"workspace\":\"rel\"}", "field \"workspace\": must be an absolute path"},
        {"{\"sandbox\":\"loose\"}", "field \"sandbox\": must be \"strict\" or \"none\""},
        {"{\"env\":[]}", "field \"env\" must be an object"},
        {"{\"env\":{\"A\":1}}", "field \"env\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(fill(bad[i][0], &so, &p, why), -1);
        if (!strstr(why, bad[i][1]))
            fail_msg("%s: got \"%s\", expected \"%s\"", bad[i][0], why, bad[i][1]);
        json_decref(p);
    }
}

static int ceiling(dtier t, int unsafe, const kmcfg *cfg, const char *json, char *why)
{
    km_session_opts so;
    json_t *p;
    assert_int_equal(fill(json, &so, &p, why), 0);
    dtier_grant g = {t, unsafe};
    km_err e = {0};
    int rc = dtier_sopts_ceiling(&g, cfg, p, &so, &e);
    snprintf(why, 600, "%.599s", e.msg);
    json_decref(p);
    return rc;
}

static void ceilings(void **state)
{
    (void)state;
    char why[600];
    kmcfg cfg;
    kmcfg_defaults(&cfg);
    cfg.memory = 256u << 20;
    /* the owner is not capped */
    assert_int_equal(ceiling(DT_OWNER, 0, &cfg, "{\"memory\":\"64G\"}", why), 0);
    /* below it, memory at most the operator's, refused by name and value */
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"memory\":\"64G\"}", why), -1);
    assert_non_null(strstr(why, "field \"memory\": 64G exceeds the operator's limit 256M"));
    assert_int_equal(ceiling(DT_HTTP, 0, &cfg, "{\"memory\":268435457}", why), -1);
    assert_int_equal(ceiling(DT_HTTP, 0, &cfg, "{\"memory\":\"256M\"}", why), 0);
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"memory\":\"128M\"}", why), 0);
    /* the opt-in relaxes the sandbox, not the resources */
    assert_int_equal(ceiling(DT_HTTP, 1, &cfg, "{\"memory\":\"1G\"}", why), -1);
    /* config memory unset: the kernels' default, 2G */
    cfg.memory = 0;
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"memory\":\"2G\"}", why), 0);
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"memory\":\"3G\"}", why), -1);
    assert_non_null(strstr(why, "limit 2G (the kernels' default"));
    /* cpus and cpu_time: capped when configured, free (a lowering) when not */
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"cpus\":64,\"cpu_time\":1000}", why), 0);
    cfg.cpus = 1;
    cfg.cpu_time = 10;
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"cpus\":2}", why), -1);
    assert_non_null(strstr(why, "field \"cpus\": 2 exceeds the operator's limit 1"));
    assert_int_equal(ceiling(DT_HTTP, 0, &cfg, "{\"cpu_time\":10.5}", why), -1);
    assert_non_null(strstr(why, "field \"cpu_time\": 10.5 exceeds the operator's limit 10"));
    assert_int_equal(ceiling(DT_HTTP, 0, &cfg, "{\"cpus\":0.5,\"cpu_time\":10}", why), 0);
    /* network on / sandbox none: only when configured or opted in */
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"network\":\"off\",\"sandbox\":\"strict\"}", why),
                     0);
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"network\":\"on\"}", why), -1);
    assert_non_null(strstr(why, "field \"network\": \"on\" is not available to MCP clients"));
    assert_non_null(strstr(why, "--allow-unsafe-session-options"));
    assert_int_equal(ceiling(DT_HTTP, 0, &cfg, "{\"sandbox\":\"none\"}", why), -1);
    assert_non_null(strstr(why, "http_allow_unsafe_session_options"));
    assert_int_equal(ceiling(DT_MCP, 1, &cfg, "{\"network\":\"on\",\"sandbox\":\"none\"}", why), 0);
    /* an allow-list: wider than off, narrower than on */
    const char *list = "{\"network\":{\"allow\":[\"pypi.org\"]}}";
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, list, why), -1);
    assert_non_null(strstr(why, "field \"network\": an allow list is not available to MCP"));
    assert_int_equal(ceiling(DT_MCP, 1, &cfg, list, why), 0);
    assert_int_equal(ceiling(DT_OWNER, 0, &cfg, list, why), 0);
    /* the operator's list is a ceiling: a tier may only narrow it */
    cfg.network = KM_NET_ALLOW;
    snprintf(cfg.network_allow, sizeof cfg.network_allow, "allow:pypi.org,*.example.com:443");
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, list, why), 0);
    assert_int_equal(
        ceiling(DT_HTTP, 0, &cfg, "{\"network\":{\"allow\":[\"a.b.example.com:443\"]}}", why), 0);
    assert_int_equal(
        ceiling(DT_HTTP, 0, &cfg, "{\"network\":{\"allow\":[\"*.x.example.com:443\"]}}", why), 0);
    static const char *const wider[] = {
        "{\"network\":{\"allow\":[\"evil.org\"]}}",
        "{\"network\":{\"allow\":[\"pypi.org:22\"]}}",
        "{\"network\":{\"allow\":[\"a.example.com\"]}}",   /* 80 too: the list has 443 only */
        "{\"network\":{\"allow\":[\"example.com:443\"]}}", /* the apex is not under it */
        "{\"network\":{\"allow\":[\"*.example.com\"]}}",   /* 80 too */
        "{\"network\":{\"allow\":[\"127.0.0.1:443\"]}}",
    };
    for (size_t i = 0; i < sizeof wider / sizeof *wider; i++) {
        if (ceiling(DT_MCP, 0, &cfg, wider[i], why) == 0)
            fail_msg("%s: accepted", wider[i]);
        if (!strstr(why, "not within the operator's allow list"))
            fail_msg("%s: %s", wider[i], why);
    }
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"network\":\"on\"}", why), -1);
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"network\":\"off\"}", why), 0);
    /* network on: any list, but none naming this host or a private network */
    cfg.network = KM_NET_ON;
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, list, why), 0);
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"network\":{\"allow\":[\"127.0.0.1:22\"]}}", why),
                     -1);
    assert_non_null(strstr(why, "an address of this host or of a private network"));
    assert_int_equal(ceiling(DT_MCP, 0, &cfg, "{\"network\":{\"allow\":[\"10.1.2.3\"]}}", why), -1);
    cfg.network = 1;
    snprintf(cfg.sandbox, sizeof cfg.sandbox, "none");
    assert_int_equal(ceiling(DT_HTTP, 0, &cfg, "{\"network\":\"on\",\"sandbox\":\"none\"}", why),
                     0);
    kmcfg_clear(&cfg);
}

static void scrub(void **state)
{
    (void)state;
    const char *home = "/srv/km";
    json_t *r = json_loads(
        "{\"api_version\":1,\"home\":\"/srv/km\",\"workspace\":\"/srv/km/sessions/s/workspace\","
        "\"target\":\"/srv/km/packages/s/python\",\"log\":\"wrote /srv/km/packages/s/x\","
        "\"sessions\":[{\"name\":\"s\",\"workspace\":\"/data\",\"kernels\":{\"python\":"
        "{\"pid\":3,\"connection_file\":\"/srv/km/k.json\"}}}],"
        "\"results\":[{\"stdout\":\"/srv/km is mine\",\"truncated\":{\"stdout\":{\"spill\":"
        "\"/srv/km/sessions/s/outputs/b0.stdout\"}},\"images\":[{\"path\":\"/srv/km/o/i.png\"}],"
        "\"files\":[{\"path\":\"l\",\"target\":\"/srv/km/x\"}],"
        "\"kernel\":{\"reason\":\"see /srv/km/k.log\"}}]}",
        0, NULL);
    assert_non_null(r);
    json_t *same = json_deep_copy(r);
    dtier_scrub(DT_MCP, same, home);
    assert_true(json_equal(same, r)); /* not http: unchanged */
    json_decref(same);
    dtier_scrub(DT_HTTP, r, home);
    char *s = json_dumps(r, JSON_COMPACT);
    assert_null(strstr(s, "\"home\""));
    assert_null(strstr(s, "\"workspace\""));
    assert_null(strstr(s, "connection_file"));
    assert_null(strstr(s, "/data"));
    assert_null(json_object_get(r, "target"));
    json_t *b0 = json_array_get(json_object_get(r, "results"), 0);
    /* the daemon's notes in the code's output name host paths too */
    assert_string_equal(json_string_value(json_object_get(b0, "stdout")),
                        "$KERNELMGR_HOME is mine");
    /* a symlink's target in the workspace is the code's, not a host path of ours */
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(b0, "files"), 0), "target")),
                        "/srv/km/x");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(json_object_get(b0, "truncated"), "stdout"), "spill")),
                        "b0.stdout");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(json_object_get(b0, "images"), 0), "path")),
                        "i.png");
    assert_string_equal(json_string_value(json_object_get(json_object_get(b0, "kernel"), "reason")),
                        "see $KERNELMGR_HOME/k.log");
    assert_string_equal(json_string_value(json_object_get(r, "log")),
                        "wrote $KERNELMGR_HOME/packages/s/x");
    free(s);
    json_decref(r);
    char msg[200] = "cannot read /srv/km/allowlist.json: gone (/srv/km)";
    dtier_scrub_text(DT_OWNER, msg, sizeof msg, home);
    assert_string_equal(msg, "cannot read /srv/km/allowlist.json: gone (/srv/km)");
    dtier_scrub_text(DT_HTTP, msg, sizeof msg, home);
    assert_string_equal(msg, "cannot read $KERNELMGR_HOME/allowlist.json: gone ($KERNELMGR_HOME)");
}

/* The session options the configuration also sets have the configuration's
 * ranges and words (both tables read kmlimits.h): a ceiling is in the
 * range a request may ask for. */
static void sessopts_agree_with_config(void **state)
{
    (void)state;
    for (const dtier_sessopt *o = dtier_sessopts; o->f.name; o++) {
        if (!strcmp(o->f.name, "workspace"))
            continue; /* a session's own, no configuration key */
        const kmcfg_opt *c = kmcfg_opt_find(o->f.name);
        if (!c)
            fail_msg("session option %s is no configuration key", o->f.name);
        if (o->type == DT_SO_NUMBER) {
            assert_int_equal(c->type, KMCFG_SECONDS);
            if (c->min != o->min || c->max != o->max)
                fail_msg("%s: config [%g, %g], session option [%g, %g]", o->f.name, c->min, c->max,
                         o->min, o->max);
        }
        if (o->type == DT_SO_CHOICE && c->type == KMCFG_ENUM)
            for (int i = 0; i < 2; i++)
                assert_true(!strcmp(c->values[i], o->values[0]) ||
                            !strcmp(c->values[i], o->values[1]));
    }
    assert_true(dtier_sessopt_find("memory")->min == (double)KM_MEMORY_MIN);
}

/* The docs' table (docs/API.md "Session options") has one row per row of
 * dtier_sessopts, in order, each with four cells: the tiers, the ceiling
 * and the default come from the row. */
static void sessopt_doc(void **state)
{
    (void)state;
    char *doc = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&doc, &len);
    assert_non_null(f);
    assert_int_equal(dtier_sessopt_doc(f), 0);
    assert_int_equal(fclose(f), 0);
    const char *line = doc;
    static const char header[] = "| field | type | default | meaning |\n|---|---|---|---|\n";
    assert_memory_equal(line, header, sizeof header - 1);
    line += sizeof header - 1;
    int rows = 0;
    for (const dtier_sessopt *o = dtier_sessopts; o->f.name; o++, rows++) {
        const char *end = strchr(line, '\n');
        assert_non_null(end);
        char head[64], text[2048];
        snprintf(head, sizeof head, "| `%s` | ", o->f.name);
        snprintf(text, sizeof text, "%.*s", (int)(end - line), line);
        if (strncmp(text, head, strlen(head)))
            fail_msg("row %d is not %s: %s", rows, o->f.name, text);
        int cells = 0; /* unescaped '|' */
        for (const char *p = text; *p; p++)
            cells += *p == '|' && (p == text || p[-1] != '\\');
        if (cells != 5)
            fail_msg("%s: %d separators, not 5: %s", o->f.name, cells, text);
        /* a default of its own, or its config key's, never both nor none */
        const kmcfg_opt *c = kmcfg_opt_find(o->f.name);
        assert_true(!o->def != !c);
        char def[128];
        if (c) {
            char want[160];
            snprintf(want, sizeof want, "| config `%s`: %s |", c->name,
                     kmcfg_doc_default(c, def, sizeof def));
            if (!strstr(text, want))
                fail_msg("%s lacks its default %s: %s", o->f.name, want, text);
        }
        if (!strstr(text, o->help))
            fail_msg("%s lacks its help: %s", o->f.name, text);
        if (o->f.tiers == DT_O && !strstr(text, "owner only"))
            fail_msg("%s does not say owner only: %s", o->f.name, text);
        if (o->ceiling != DT_CEIL_NONE && !strstr(text, "below owner: "))
            fail_msg("%s does not say its ceiling: %s", o->f.name, text);
        line = end + 1;
    }
    assert_string_equal(line, "");
    assert_true(rows > 0);
    free(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sessopts_agree_with_config),
        cmocka_unit_test(names),
        cmocka_unit_test(fields_allowlist),
        cmocka_unit_test(sessopt_tiers),
        cmocka_unit_test(sopts_values),
        cmocka_unit_test(ceilings),
        cmocka_unit_test(scrub),
        cmocka_unit_test(sessopt_doc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
