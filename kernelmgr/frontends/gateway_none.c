/*
 * gateway_none.c — the gateway of the `kernelmgr` binary, which has none:
 * libwebsockets (and the OpenSSL it loads) would cost every `kernelmgr exec`
 * ~1.5 ms of dynamic loading. `serve` runs kernelmgr-gateway, the same
 * program with gateway.c linked (gateway.h, "Two binaries"), when it is
 * beside kernelmgr; a daemon of this binary refuses http.start.
 */
#include "kernelmgr/frontends/gateway.h"

#include <stdio.h>

int gateway_built_in(void)
{
    return 0;
}

gateway *gateway_start(km_manager *m, const gateway_opts *o, km_err *err)
{
    (void)m;
    (void)o;
    km_err_set(err, KM_EUSAGE, "this kernelmgr binary has no gateway: run kernelmgr-gateway");
    return NULL;
}

void gateway_stop(gateway **g)
{
    (void)g;
}

const char *gateway_url(const gateway *g)
{
    (void)g;
    return "";
}

int gateway_port(const gateway *g)
{
    (void)g;
    return 0;
}

const char *gateway_token_source(const gateway *g)
{
    (void)g;
    return "";
}
