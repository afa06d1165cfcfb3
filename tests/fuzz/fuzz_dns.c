/*
 * libFuzzer target: a DNS answer as the egress proxy's test resolver reads
 * it (egdns.c: hostile input) — against a fixed query for "rebind.test";
 * the first two input bytes replace the answer's id half the time, so the
 * fuzzer reaches past the id check. Never more addresses than asked for,
 * never a read outside the packet (ASan).
 *
 * egdns.c is compiled in (the fuzz build links common/ and protocol/ only).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/egress/egdns.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static unsigned char q[512];
    static int qlen;
    if (!qlen)
        qlen = egdns_query("rebind.test", 0x4b4d, q, sizeof q);
    if (qlen <= 0 || size > 4096)
        return 0;
    unsigned char *r = malloc(size ? size : 1);
    if (!r)
        return 0;
    memcpy(r, data, size);
    /* odd first byte: the query's header and question in front, so the
     * records behind them are what varies */
    if (size > (size_t)qlen && (data[0] & 1))
        memcpy(r, q, (size_t)qlen), r[2] |= 0x80;
    struct in_addr a[3];
    int n = egdns_answer(q, (size_t)qlen, r, size, a, 3);
    free(r);
    if (n > 3 || n < -1)
        abort();
    return 0;
}
