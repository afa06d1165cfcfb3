/*
 * test_eg_dns.c — the egress proxy's test resolver (kernels/egress/egdns.c):
 * the server setting, the query it sends, and answers read as hostile
 * input (another id or question, an error code, truncated records, a
 * compression pointer at the packet's end), on hand-built packets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <string.h>

#include "kernels/egress/egdns.h"

static void server_setting(void **state)
{
    (void)state;
    struct sockaddr_in s;
    assert_int_equal(egdns_parse_server("127.0.0.1:5353", &s), 0);
    assert_int_equal(ntohs(s.sin_port), 5353);
    assert_int_equal(ntohl(s.sin_addr.s_addr), 0x7f000001);
    const char *bad[] = {
        "",         "127.0.0.1",   "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "localhost:53",
        "[::1]:53", "1.2.3.4:53x", NULL};
    for (int i = 0; bad[i]; i++)
        assert_int_equal(egdns_parse_server(bad[i], &s), -1);
}

static void query(void **state)
{
    (void)state;
    unsigned char q[512];
    int n = egdns_query("Rebind.Test.", 0x1234, q, sizeof q);
    static const unsigned char want[] = {0x12, 0x34, 1,   0,   0,   1,   0,   0,   0,   0,
                                         0,    0,    6,   'R', 'e', 'b', 'i', 'n', 'd', 4,
                                         'T',  'e',  's', 't', 0,   0,   1,   0,   1};
    assert_int_equal(n, (int)sizeof want);
    assert_memory_equal(q, want, sizeof want);
    assert_int_equal(egdns_query("", 1, q, sizeof q), -1);
    assert_int_equal(egdns_query("a..b", 1, q, sizeof q), -1);
    assert_int_equal(egdns_query("a.b", 1, q, 10), -1);
    char label[70];
    memset(label, 'x', 64);
    label[64] = 0;
    assert_int_equal(egdns_query(label, 1, q, sizeof q), -1);
}

/* The answer to q (qlen bytes): flags, then one A record per addrs entry. */
static size_t answer(const unsigned char *q, size_t qlen, unsigned char rcode, int n,
                     const char *const *addrs, unsigned char *r)
{
    memcpy(r, q, qlen);
    r[2] = 0x81;
    r[3] = (unsigned char)(0x80 | rcode);
    r[6] = 0;
    r[7] = (unsigned char)n;
    size_t off = qlen;
    for (int i = 0; i < n; i++) {
        static const unsigned char rr[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4};
        memcpy(r + off, rr, sizeof rr);
        off += sizeof rr;
        inet_pton(AF_INET, addrs[i], r + off);
        off += 4;
    }
    return off;
}

static void answers(void **state)
{
    (void)state;
    unsigned char q[512], r[1024];
    struct in_addr a[8];
    char text[INET_ADDRSTRLEN];
    size_t qlen = (size_t)egdns_query("rebind.test", 7, q, sizeof q);
    const char *two[] = {"198.51.100.7", "127.0.0.1"};
    size_t len = answer(q, qlen, 0, 2, two, r);
    assert_int_equal(egdns_answer(q, qlen, r, len, a, 8), 2);
    assert_string_equal(inet_ntop(AF_INET, &a[0], text, sizeof text), "198.51.100.7");
    assert_string_equal(inet_ntop(AF_INET, &a[1], text, sizeof text), "127.0.0.1");
    assert_int_equal(egdns_answer(q, qlen, r, len, a, 1), 1); /* at most max */
    /* every cut of the packet: never more than it holds, never a crash */
    for (size_t cut = 0; cut < len; cut++)
        assert_true(egdns_answer(q, qlen, r, cut, a, 8) < 2);
    /* another query's id, no QR bit, an error code, another question */
    unsigned char bad[1024];
    memcpy(bad, r, len);
    bad[1] ^= 1;
    assert_int_equal(egdns_answer(q, qlen, bad, len, a, 8), -1);
    memcpy(bad, r, len);
    bad[2] &= 0x7f;
    assert_int_equal(egdns_answer(q, qlen, bad, len, a, 8), -1);
    len = answer(q, qlen, 3, 0, NULL, r); /* NXDOMAIN */
    assert_int_equal(egdns_answer(q, qlen, r, len, a, 8), -1);
    len = answer(q, qlen, 0, 1, two, r);
    r[13] = 'X';
    assert_int_equal(egdns_answer(q, qlen, r, len, a, 8), -1);
    /* a record whose length runs past the packet; a pointer cut in half */
    len = answer(q, qlen, 0, 1, two, r);
    r[qlen + 11] = 200;
    assert_int_equal(egdns_answer(q, qlen, r, len, a, 8), -1);
    len = answer(q, qlen, 0, 1, two, r);
    assert_int_equal(egdns_answer(q, qlen, r, qlen + 1, a, 8), -1);
    /* records of other types are skipped, not taken */
    len = answer(q, qlen, 0, 1, two, r);
    r[qlen + 3] = 28; /* AAAA with 4 bytes: not an A record */
    assert_int_equal(egdns_answer(q, qlen, r, len, a, 8), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(server_setting),
        cmocka_unit_test(query),
        cmocka_unit_test(answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
