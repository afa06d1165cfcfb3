/*
 * libFuzzer target: jp_connection_parse on untrusted connection-file text.
 * Accepted files must satisfy the documented invariants, and write + read
 * (through a file) must give the same connection back.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jp.h"

static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jp_connection c;
    jp_error err;
    jp_status st = jp_connection_parse((const char *)data, size, &c, &err);
    if (st != JP_OK) {
        if (err.code != st || err.reason[0] == '\0' || st >= JP_ERR__COUNT)
            abort();
        return 0;
    }
    int tcp = strcmp(c.transport, "tcp") == 0;
    if (!tcp && strcmp(c.transport, "ipc") != 0)
        abort();
    if (strcmp(c.signature_scheme, "hmac-sha256") != 0 || c.ip[0] == '\0')
        abort();
    for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++) {
        if (c.ports[ch] < (tcp ? 1 : 0) || (tcp && c.ports[ch] > 65535))
            abort();
        char ep[300];
        if (jp_connection_endpoint(&c, (jp_channel)ch, ep, sizeof ep) != 0)
            abort();
    }
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/fuzz-conn-%d.json", (int)getpid());
    if (jp_connection_write(path, &c, &err) != JP_OK)
        abort();
    jp_connection r;
    if (jp_connection_read(path, &r, &err) != JP_OK || memcmp(&r, &c, sizeof r) != 0)
        abort();
    unlink(path);
    return 0;
}
