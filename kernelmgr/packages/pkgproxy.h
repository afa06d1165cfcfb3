/*
 * pkgproxy.h — the only way out of a package installer's sandbox: an HTTP
 * proxy that connects to nothing but the configured index.
 *
 * The installer (pip / npm) runs with its network namespace empty; its proxy
 * setting points at a socket listening on 127.0.0.1 inside that namespace,
 * and the manager serves that socket from outside (the listening fd works
 * from any namespace). Each client request is either
 *   CONNECT host:port HTTP/1.1            (https: a blind tunnel), or
 *   GET http://host[:port]/path HTTP/1.1  (plain http: forwarded once,
 *                                          with Connection: close)
 * and is honoured only when host:port is on the proxy's list; anything else
 * gets 403 and is logged. Nothing else is reachable: no DNS, no other port,
 * no other host, even if the installer were subverted.
 *
 * A listed name is resolved once per connection and the proxy connects to
 * the very address it checked. Addresses only this host answers on —
 * loopback 127.0.0.0/8 and ::1, 0.0.0.0/8 and ::, link-local 169.254.0.0/16
 * and fe80::/10 (also IPv4-mapped), any address of the host's own
 * interfaces — are dialled only when the list names them itself: as an
 * address literal ("127.0.0.1:8080", "[::1]:80") or as "localhost". A name
 * that resolves to one (a rebinding DNS answer, the host's own name) is
 * refused with 403 and PKGPROXY_HOST_ONLY. The installer follows redirects
 * itself, through the proxy, so a redirect is one more request checked the
 * same way. Unix sockets and other schemes are never reachable: the proxy
 * speaks TCP to host:port only.
 */
#ifndef KERNELMGR_PKGPROXY_H
#define KERNELMGR_PKGPROXY_H

#include <jansson.h>
#include <stddef.h>

typedef struct pkgproxy pkgproxy;

/* The reason (403 body and pkgproxy_report) for a listed name whose every
 * address is one only this host answers on. */
#define PKGPROXY_HOST_ONLY                                                                         \
    "refused by policy: the host resolves only to addresses of this host (loopback, "              \
    "link-local, unspecified or the host's own), which the allowlist does not name as such"

/* new: serves listen_fd (stolen; a listening stream socket) on its own
 * thread. allowed: "host:port" strings (NULL-terminated, copied; hosts
 * compared case-insensitively, "[v6]:port" for IPv6). NULL with err. */
pkgproxy *pkgproxy_start(int listen_fd, const char *const *allowed, char *err, size_t errlen);

/* Stops serving, closes every connection, joins the threads. NULL-safe. */
void pkgproxy_stop(pkgproxy **p);

/* new: {"allowed": n, "refused": [{"target": "...", "reason": "..."}]}. */
json_t *pkgproxy_report(pkgproxy *p);

#endif
