/*
 * gwlisten.c — the gateway's listen address, parsed and checked without
 * libwebsockets: the CLI validates `serve --http` with it in the binary
 * that has no gateway (gateway.h, "Two binaries").
 */
#include "kernelmgr/frontends/gateway.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gw_err(km_err *err, const char *fmt, ...)
{
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    km_err_set(err, KM_EUSAGE, "%s", msg);
    return -1;
}

int gw_parse_listen(const char *listen, char *addr, size_t alen, int *port, km_err *err)
{
    const char *colon = strrchr(listen, ':');
    const char *ps = colon ? colon + 1 : listen;
    char *end;
    errno = 0;
    long p = strtol(ps, &end, 10);
    if (!*ps || *end || errno || p < 0 || p > 65535)
        return gw_err(err, "invalid HTTP listen address \"%s\": expected [ADDR:]PORT", listen);
    *port = (int)p;
    if (colon) {
        size_t n = (size_t)(colon - listen);
        if (n >= alen || n == 0)
            return gw_err(err, "invalid address in \"%s\"", listen);
        memcpy(addr, listen, n);
        addr[n] = 0;
    } else {
        snprintf(addr, alen, "127.0.0.1");
    }
    struct in_addr a4;
    if (inet_pton(AF_INET, addr, &a4) != 1)
        return gw_err(err, "HTTP address \"%s\" is not an IPv4 address", addr);
    return 0;
}

int gateway_listen_valid(const char *listen, int tls, int insecure, km_err *err)
{
    char addr[64];
    int port;
    if (gw_parse_listen(listen, addr, sizeof addr, &port, err))
        return -1;
    struct in_addr a4;
    inet_pton(AF_INET, addr, &a4);
    int loopback = (ntohl(a4.s_addr) >> 24) == 127;
    if (!loopback && !tls && !insecure)
        return gw_err(err,
                      "refusing to serve HTTP on %s without TLS: it is not a loopback address "
                      "(give --tls-cert and --tls-key, or --insecure to accept that the token "
                      "and the code travel in clear)",
                      addr);
    return 0;
}
