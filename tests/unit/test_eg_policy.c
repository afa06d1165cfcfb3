/*
 * test_eg_policy.c — the egress allow-list (kernels/egress/egpolicy.c): entries
 * parsed and refused by name, the canonical text, matching (names,
 * wildcards, literals, ports), the ceiling check; the ClientHello SNI
 * parser (egtls.c) on hand-built records, truncated and malformed ones; the
 * manager's network option forms (netopt.c); the proxy's restricted
 * literals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/egress/egpolicy.h"
#include "kernels/egress/egproxy.h"
#include "kernels/egress/egtls.h"
#include "kernelmgr/engine/netopt.h"

static egpolicy *parse(const char *text, char *why)
{
    egpolicy *p = malloc(sizeof *p);
    assert_non_null(p);
    if (egpolicy_parse_text(p, text, why, 600)) {
        free(p);
        return NULL;
    }
    return p;
}

static void entries(void **state)
{
    (void)state;
    char why[600], buf[EGPOLICY_TEXT_MAX];
    egpolicy *p = parse("allow:PyPI.org.,*.GitHubUserContent.com:443,192.0.2.7:8080,"
                        "[2001:DB8::7],files_host.example.org",
                        why);
    assert_non_null(p);
    assert_int_equal(p->n, 5);
    egpolicy_format(p, buf, sizeof buf);
    assert_string_equal(buf, "allow:pypi.org,*.githubusercontent.com:443,192.0.2.7:8080,"
                             "[2001:db8::7],files_host.example.org");
    json_t *j = egpolicy_to_json(p);
    egpolicy *q = malloc(sizeof *q);
    assert_int_equal(egpolicy_from_json(q, j, "network", why, sizeof why), 0);
    char buf2[EGPOLICY_TEXT_MAX];
    egpolicy_format(q, buf2, sizeof buf2);
    assert_string_equal(buf, buf2);
    json_decref(j);
    free(q);
    free(p);
    static const char *const bad[][2] = {
        {"allow:", "no entry"},
        {"allow:a.com,,b.com", "empty entry"},
        {"allow:a.com:0", "port must be a number from 1 to 65535"},
        {"allow:a.com:65536", "port must be a number from 1 to 65535"},
        {"allow:a.com:", "port must be a number"},
        {"allow:a.com:-1", "port must be a number"},
        {"allow:a.*.com", "wildcard must be the whole first label"},
        {"allow:*a.com", "wildcard must be the whole first label"},
        {"allow:**.a.com", "wildcard must be the whole first label"},
        {"allow:*.com", "at least two labels"},
        {"allow:-a.com", "starts or ends with '-'"},
        {"allow:a b.com", "a character other than"},
        {"allow:a/b.com", "a character other than"},
        {"allow:a@b.com", "a character other than"},
        {"allow:1.2.3", "not a valid IPv4 address"},
        {"allow:::1", "must be in brackets"},
        {"allow:[::1", "closing ']'"},
        {"allow:[::1]x", "only \":PORT\" may follow"},
        {"allow:[nope]", "not an IPv6 address"},
        {"pypi.org", "starts with \"allow:\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        p = parse(bad[i][0], why);
        if (p || !strstr(why, bad[i][1]))
            fail_msg("%s: got \"%s\", expected \"%s\"", bad[i][0], p ? "accepted" : why, bad[i][1]);
    }
    /* the bounds, named */
    char big[40 * 33 + 16] = "allow:";
    for (int i = 0; i < 33; i++)
        snprintf(big + strlen(big), sizeof big - strlen(big), "%sh%d.example.com", i ? "," : "", i);
    assert_null(parse(big, why));
    assert_non_null(strstr(why, "more than 32 entries"));
    char label[400] = "allow:";
    memset(label + 6, 'a', 64);
    strcpy(label + 70, ".com");
    assert_null(parse(label, why));
    assert_non_null(strstr(why, "longer than 63 bytes"));
    memset(label + 6, 'a', 300);
    label[306] = 0;
    assert_null(parse(label, why));
    assert_non_null(strstr(why, "longer than 270 bytes"));
}

static void matching(void **state)
{
    (void)state;
    char why[600];
    egpolicy *p = parse("allow:pypi.org,*.example.com:443,192.0.2.7,[2001:db8::7]:8443", why);
    assert_non_null(p);
    assert_int_equal(egpolicy_match(p, "pypi.org", 443), 0);
    assert_int_equal(egpolicy_match(p, "PYPI.ORG.", 80), 0);
    assert_int_equal(egpolicy_match(p, "pypi.org", 8080), -1);
    assert_int_equal(egpolicy_match(p, "x.pypi.org", 443), -1);
    assert_int_equal(egpolicy_match(p, "a.example.com", 443), 1);
    assert_int_equal(egpolicy_match(p, "a.b.example.com", 443), 1);
    assert_int_equal(egpolicy_match(p, "example.com", 443), -1);
    assert_int_equal(egpolicy_match(p, "a.example.com", 80), -1);
    assert_int_equal(egpolicy_match(p, "badexample.com", 443), -1);
    assert_int_equal(egpolicy_match(p, "192.0.2.7", 80), 2);
    assert_true(egpolicy_is_literal(p, 2));
    assert_false(egpolicy_is_literal(p, 0));
    assert_int_equal(egpolicy_match(p, "2001:db8:0::7", 8443), 3);
    assert_int_equal(egpolicy_match(p, "2001:db8::7", 443), -1);
    /* a name never matches a literal nor the reverse */
    assert_int_equal(egpolicy_match(p, "3221225991", 80), -1);
    assert_int_equal(egpolicy_match(p, "", 80), -1);
    free(p);
    /* the ceiling */
    egpolicy *ceil = parse("allow:pypi.org,*.example.com:443,*.b.org:80,*.b.org:443", why);
    static const char *const inside[] = {"allow:pypi.org",          "allow:pypi.org:443",
                                         "allow:x.example.com:443", "allow:*.y.example.com:443",
                                         "allow:*.example.com:443", "allow:*.b.org"};
    static const char *const outside[] = {"allow:pypi.org:8080", "allow:x.example.com",
                                          "allow:example.com:443", "allow:evil.com",
                                          "allow:192.0.2.1:443"};
    for (size_t i = 0; i < sizeof inside / sizeof *inside; i++) {
        p = parse(inside[i], why);
        if (egpolicy_within(p, ceil, why, sizeof why))
            fail_msg("%s: %s", inside[i], why);
        free(p);
    }
    for (size_t i = 0; i < sizeof outside / sizeof *outside; i++) {
        p = parse(outside[i], why);
        if (!egpolicy_within(p, ceil, why, sizeof why) ||
            !strstr(why, "is not within the operator's allow list"))
            fail_msg("%s: accepted", outside[i]);
        free(p);
    }
    free(ceil);
}

/* A ClientHello record: version, random, session id, one cipher, null
 * compression, extensions (SNI of name when given). */
static size_t hello(unsigned char *b, const char *name, int two_names)
{
    unsigned char ext[512];
    size_t e = 0;
    ext[e++] = 0x00; /* a supported_versions-like extension first */
    ext[e++] = 0x2b;
    ext[e++] = 0;
    ext[e++] = 3;
    ext[e++] = 2;
    ext[e++] = 3;
    ext[e++] = 4;
    for (int k = 0; name && k < (two_names ? 2 : 1); k++) {
        size_t nl = strlen(name);
        ext[e++] = 0;
        ext[e++] = 0; /* server_name */
        ext[e++] = (unsigned char)((nl + 5) >> 8);
        ext[e++] = (unsigned char)(nl + 5);
        ext[e++] = (unsigned char)((nl + 3) >> 8);
        ext[e++] = (unsigned char)(nl + 3);
        ext[e++] = 0; /* host_name */
        ext[e++] = (unsigned char)(nl >> 8);
        ext[e++] = (unsigned char)nl;
        memcpy(ext + e, name, nl);
        e += nl;
    }
    unsigned char body[1024];
    size_t n = 0;
    body[n++] = 3;
    body[n++] = 3;
    memset(body + n, 7, 32);
    n += 32;
    body[n++] = 0; /* session id */
    body[n++] = 0; /* ciphers: 2 bytes */
    body[n++] = 2;
    body[n++] = 0x13;
    body[n++] = 0x01;
    body[n++] = 1; /* compression */
    body[n++] = 0;
    body[n++] = (unsigned char)(e >> 8);
    body[n++] = (unsigned char)e;
    memcpy(body + n, ext, e);
    n += e;
    size_t r = 0;
    b[r++] = 0x16;
    b[r++] = 3;
    b[r++] = 1;
    b[r++] = (unsigned char)((n + 4) >> 8);
    b[r++] = (unsigned char)(n + 4);
    b[r++] = 1;
    b[r++] = 0;
    b[r++] = (unsigned char)(n >> 8);
    b[r++] = (unsigned char)n;
    memcpy(b + r, body, n);
    return r + n;
}

static void sni(void **state)
{
    (void)state;
    unsigned char b[2048];
    char name[300];
    size_t n = hello(b, "pypi.org", 0);
    assert_int_equal(egtls_client_hello_sni(b, n, name, sizeof name), EGTLS_SNI);
    assert_string_equal(name, "pypi.org");
    for (size_t cut = 0; cut < n; cut++)
        assert_int_equal(egtls_client_hello_sni(b, cut, name, sizeof name), EGTLS_MORE);
    n = hello(b, NULL, 0);
    assert_int_equal(egtls_client_hello_sni(b, n, name, sizeof name), EGTLS_NO_SNI);
    n = hello(b, "a.org", 1);
    assert_int_equal(egtls_client_hello_sni(b, n, name, sizeof name), EGTLS_BAD);
    n = hello(b, "pypi.org", 0);
    assert_int_equal(egtls_client_hello_sni(b, n, name, 4), EGTLS_BAD); /* too long for us */
    b[9 + 2 + 32] = 200; /* a session id longer than the message */
    assert_int_equal(egtls_client_hello_sni(b, n, name, sizeof name), EGTLS_BAD);
    const unsigned char get[] = "GET / HTTP/1.1\r\n\r\n";
    assert_int_equal(egtls_client_hello_sni(get, sizeof get - 1, name, sizeof name), EGTLS_NOT_TLS);
    const unsigned char app[] = {0x17, 3, 3, 0, 5, 1, 2, 3, 4, 5};
    assert_int_equal(egtls_client_hello_sni(app, sizeof app, name, sizeof name), EGTLS_NOT_TLS);
    n = hello(b, "pypi.org", 0);
    b[5] = 2; /* a ServerHello */
    assert_int_equal(egtls_client_hello_sni(b, n, name, sizeof name), EGTLS_NOT_TLS);
}

static void netopt(void **state)
{
    (void)state;
    int net;
    char allow[KM_NET_ALLOW_MAX];
    km_err why = {0};
    assert_int_equal(km_net_from_text("on", "--network", &net, allow, sizeof allow, &why), 0);
    assert_int_equal(net, KM_NET_ON);
    assert_int_equal(
        km_net_from_text("allow:A.org,b.org:8080", "--network", &net, allow, sizeof allow, &why),
        0);
    assert_int_equal(net, KM_NET_ALLOW);
    assert_string_equal(allow, "allow:a.org,b.org:8080");
    json_t *j = km_net_json(net, allow);
    char *s = json_dumps(j, JSON_COMPACT);
    assert_string_equal(s, "{\"allow\":[\"a.org\",\"b.org:8080\"]}");
    free(s);
    int net2;
    char allow2[KM_NET_ALLOW_MAX];
    assert_int_equal(km_net_from_json(j, "network", &net2, allow2, sizeof allow2, &why), 0);
    assert_true(km_net_equal(net, allow, net2, allow2));
    assert_false(km_net_equal(net, allow, KM_NET_ALLOW, "allow:a.org"));
    json_decref(j);
    assert_int_equal(km_net_from_text("maybe", "--network", &net, allow, sizeof allow, &why), -1);
    assert_non_null(strstr(why.msg, "--network must be on, off or allow:HOST[,HOST...]"));
    json_t *bad = json_integer(3);
    assert_int_equal(km_net_from_json(bad, "network", &net, allow, sizeof allow, &why), -1);
    assert_non_null(strstr(why.msg, "network: must be \"on\", \"off\" or {\"allow\""));
    json_decref(bad);
    assert_string_equal(km_net_text(KM_NET_OFF, ""), "off");
}

static void restricted(void **state)
{
    (void)state;
    static const char *const yes[] = {
        "127.0.0.1",     "127.9.9.9",  "0.0.0.0",          "169.254.169.254",
        "10.0.0.1",      "172.16.0.1", "172.31.255.1",     "192.168.1.1",
        "100.64.0.1",    "198.18.0.1", "224.0.0.1",        "255.255.255.255",
        "::1",           "::",         "fe80::1",          "fc00::1",
        "fd12::1",       "ff02::1",    "::ffff:127.0.0.1", "::ffff:10.0.0.1",
        "64:ff9b::a00:1"};
    static const char *const no[] = {"93.184.215.14", "172.32.0.1",      "100.128.0.1",
                                     "8.8.8.8",       "2606:4700::1111", "::ffff:8.8.8.8"};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
        if (egproxy_restricted_literal(yes[i]) != 1)
            fail_msg("%s: not restricted", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof *no; i++)
        if (egproxy_restricted_literal(no[i]) != 0)
            fail_msg("%s: restricted", no[i]);
    assert_int_equal(egproxy_restricted_literal("pypi.org"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(entries), cmocka_unit_test(matching),   cmocka_unit_test(sni),
        cmocka_unit_test(netopt),  cmocka_unit_test(restricted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
