/*
 * egproxy.h — the only way out of a sandbox whose network is a list: an
 * HTTP(S) proxy outside the sandbox that connects to nothing but what it
 * was given. Two modes:
 *   - the package installers' (egproxy_start): exact "host:port" strings,
 *     the configured index and its allowed_hosts (described first below);
 *   - a session's egress allow-list (egproxy_start_policy, egpolicy.h),
 *     described under "Policy mode" at the end.
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
 * refused with 403 and EGPROXY_HOST_ONLY. The installer follows redirects
 * itself, through the proxy, so a redirect is one more request checked the
 * same way. Unix sockets and other schemes are never reachable: the proxy
 * speaks TCP to host:port only.
 *
 * Both modes: an upstream connect gives up after 15 s, and egproxy_stop
 * wakes every connect under way (an address that never answers holds
 * nothing). Policy mode only: with the operator's test resolver
 * (egdns.h, $KERNELMGR_EGRESS_RESOLVER) names are resolved by that DNS
 * server instead of the host's resolver, checked the same way.
 */
#ifndef KERNELS_EGRESS_EGPROXY_H
#define KERNELS_EGRESS_EGPROXY_H

#include <jansson.h>
#include <stddef.h>

typedef struct egproxy egproxy;
typedef struct egpolicy egpolicy;

/* Bounds (policy mode): the decision log writes at most EGPROXY_LOG_LINES
 * lines in all, EGPROXY_LOG_RATE a second after a burst of
 * EGPROXY_LOG_BURST (a later line counts those it skipped); the report keeps
 * the first EGPROXY_REFUSED_MAX refusals; a tunnel's ClientHello must
 * arrive within EGPROXY_HELLO_MS. */
#define EGPROXY_LOG_LINES 5000
#define EGPROXY_LOG_RATE 10.0
#define EGPROXY_LOG_BURST 50.0
#define EGPROXY_REFUSED_MAX 100
#define EGPROXY_HELLO_MS 10000

/* The reason (403 body and egproxy_report) for a listed name whose every
 * address is one only this host answers on. */
#define EGPROXY_HOST_ONLY                                                                          \
    "refused by policy: the host resolves only to addresses of this host (loopback, "              \
    "link-local, unspecified or the host's own), which the allowlist does not name as such"

/* new: serves listen_fd (stolen; a listening stream socket) on its own
 * thread. allowed: "host:port" strings (NULL-terminated, copied; hosts
 * compared case-insensitively, "[v6]:port" for IPv6). NULL with err. */
egproxy *egproxy_start(int listen_fd, const char *const *allowed, char *err, size_t errlen);

/* Policy mode: a session's egress allow-list (policy copied). Every
 * request is decided by the list and logged on stderr ("kernelmgr egress:
 * allowed|refused|failed METHOD TARGET[: reason]", bounded as above):
 *   CONNECT host:port   host:port must match an entry and the name must
 *                       resolve to an admitted address (below: else 403);
 *                       the proxy answers 200, reads the client's first TLS
 *                       record and checks
 *                       its ClientHello: the server name (SNI) must be the
 *                       CONNECT host (an address literal may send none);
 *                       anything else — another name, no ClientHello, not
 *                       TLS — gets a TLS access_denied alert and the
 *                       connection ends before any upstream is dialled;
 *   METHOD http://host[:port]/path   (port 80 by default) must match; a
 *                       Host header must name the same host and port.
 * A refused request gets "403 Forbidden" whose body starts with
 * "kernelmgr: network policy allow-list: " and says why ("host X:443 is not
 * allowed (allowed: a, b)"). Refused before matching: a head over 16 KiB
 * (431), a bare CR or LF, a NUL, folded or nameless header lines, repeated
 * Host, repeated or combined Content-Length / Transfer-Encoding (nothing
 * the upstream could read as a second request for another host). The name
 * is resolved here, never in the sandbox, and the proxy connects to the
 * address it checked (pinned for the connection): an address of this host
 * (as above) or of a private or special network (RFC 1918, 100.64.0.0/10,
 * 198.18.0.0/15, 192.0.0.0/24, multicast and reserved 224.0.0.0/3,
 * fc00::/7, fec0::/10, ff00::/8, and those inside IPv4-mapped, -compatible
 * and NAT64 addresses) is dialled only when the entry that matched is that
 * address literal: a listed name that resolves to one is refused (the
 * rebinding defence). One request per connection for plain http
 * (Connection: close). NULL with err. */
egproxy *egproxy_start_policy(int listen_fd, const egpolicy *policy, char *err, size_t errlen);

/* 1 when the address literal lit (no brackets) is one the policy mode
 * dials only when an entry names it: an address of this host or of a
 * private or special network (see above). 0 for other addresses, -1 when
 * lit is no address. */
int egproxy_restricted_literal(const char *lit);

/* Policy mode: the decision log stops (one last line says so) once stderr,
 * a regular file, would grow past bytes (the kernel log's own cap).
 * 0: no such cap (the default). */
void egproxy_log_limit(egproxy *p, unsigned long long bytes);

/* How many requests the proxy refused so far (403, TLS alert, 431); the
 * last refusal's reason, without the "kernelmgr: ..." prefix, in last
 * (may be NULL). */
long long egproxy_refusals(egproxy *p, char *last, size_t lastlen);

/* Stops serving, closes every connection, joins the threads. NULL-safe. */
void egproxy_stop(egproxy **p);

/* new: {"allowed": n, "refused": [{"target": "...", "reason": "..."}]}. */
json_t *egproxy_report(egproxy *p);

#endif
