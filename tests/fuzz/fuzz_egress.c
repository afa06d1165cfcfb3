/*
 * libFuzzer target: what the egress proxy parses from the sandbox — a TLS
 * ClientHello's server name (egtls.c) — and from clients — an allow-list's
 * text (egpolicy.c), then matching and the ceiling check on what parsed.
 *
 * Input: one selector byte, then the bytes. Even: a TLS stream's first
 * bytes; a name found must be NUL-free and fit. Odd: "allow:" + the rest;
 * a list that parses must format to a text that parses to the same list.
 *
 * The two files are compiled in (the fuzz build links common/ and
 * protocol/ only).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/egress/egpolicy.c"
#include "kernels/egress/egtls.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    if (!(data[0] & 1)) {
        char sni[256];
        egtls_rc rc = egtls_client_hello_sni(p, n, sni, sizeof sni);
        if (rc == EGTLS_SNI && (strlen(sni) == 0 || strlen(sni) >= sizeof sni))
            abort();
        return 0;
    }
    if (n > 4 * EGPOLICY_TEXT_MAX)
        return 0;
    char *text = malloc(n + 7);
    if (!text)
        return 0;
    memcpy(text, "allow:", 6);
    memcpy(text + 6, p, n);
    text[n + 6] = 0;
    egpolicy *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    char why[600];
    if (a && b && egpolicy_parse_text(a, text, why, sizeof why) == 0) {
        char canon[EGPOLICY_TEXT_MAX], again[EGPOLICY_TEXT_MAX];
        egpolicy_format(a, canon, sizeof canon);
        if (egpolicy_parse_text(b, canon, why, sizeof why) != 0)
            abort();
        egpolicy_format(b, again, sizeof again);
        if (strcmp(canon, again) || egpolicy_within(a, b, why, sizeof why))
            abort();
        for (size_t i = 0; i < a->n; i++)
            if (a->e[i].kind != EGP_WILDCARD &&
                egpolicy_match(a, a->e[i].host, a->e[i].port ? a->e[i].port : 443) < 0)
                abort();
    }
    free(a);
    free(b);
    free(text);
    return 0;
}
