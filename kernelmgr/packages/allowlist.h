/*
 * allowlist.h — which packages `install_packages` may install.
 *
 * Configuration (JSON; nothing is installable without it):
 *
 *   {"pip": {"index_url": "https://pypi.org/simple/",
 *            "allowed_hosts": ["files.pythonhosted.org:443"],
 *            "packages": {"requests": ">=2.31,<3", "tinypkg": ""}},
 *    "npm": {"registry": "https://registry.npmjs.org/",
 *            "packages": {"is-number": "^7.0.0"}}}
 *
 * The installer's only way out is a proxy to the index's host:port. Some
 * indexes serve their files from another host (PyPI: the pages come from
 * pypi.org, the wheels from files.pythonhosted.org): "allowed_hosts" lists
 * such extra "host:port" pairs ("[v6]:port" for IPv6 literals; the port is
 * required; at most ALLOWLIST_HOSTS_MAX). Nothing else is ever reachable.
 *
 * "packages" maps a name to a version specifier ("" or "*": any version);
 * it may also be an array of names. Names are compared the way each
 * ecosystem does: pip names normalised as in PEP 503 (lower case, runs of
 * "-", "_", "." become "-"), npm names exactly (they are lower case).
 *
 * A request is one string per package, "name" or "name<specifier>" for pip
 * ("tinypkg", "tinypkg==1.0") and "name" or "name@range" for npm
 * ("is-number", "is-number@7.0.0"). Everything else is refused before anything
 * runs, with a reason: options and flags ("-e", "--index-url ..."), URLs,
 * VCS links ("git+https://..."), local paths and archives, direct references
 * ("name @ url"), extras, environment markers, npm aliases and dist-tags,
 * and names not on the list. The version installed always satisfies both the
 * request and the list: allowlist_check() returns the two specifiers joined
 * (pip: "a,b" is an intersection; npm: "a b" is one).
 *
 * Pure C (no I/O except allowlist_load, see there), unit-tested in
 * tests/unit/test_km_allowlist.c.
 */
#ifndef KERNELMGR_ALLOWLIST_H
#define KERNELMGR_ALLOWLIST_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>

typedef enum allowlist_mgr { ALLOWLIST_PIP = 0, ALLOWLIST_NPM = 1, ALLOWLIST_NMGR } allowlist_mgr;

#define ALLOWLIST_NAME_MAX 214 /* npm's limit; longer than any PyPI name */
#define ALLOWLIST_SPEC_MAX 256
#define ALLOWLIST_HOSTS_MAX 8 /* allowed_hosts entries per manager */

typedef struct allowlist allowlist;

/* new: an empty list (nothing installable). NULL only without memory. */
allowlist *allowlist_new(void);

/* new: parses the configuration object (borrowed). NULL with "KEY: reason"
 * in err on any unknown key, bad name, bad specifier or bad index URL. */
allowlist *allowlist_from_json(const json_t *cfg, km_err *err);

/* The largest allowlist file read: a list of thousands of packages is a few
 * hundred KiB. */
#define ALLOWLIST_FILE_MAX (1 << 20)

/* new: reads path, which a client may have named: through cm_read_regular
 * (a symbolic link, a FIFO, a device or a directory is refused at once, never
 * waited on; at most ALLOWLIST_FILE_MAX bytes). A missing file gives an empty
 * list when !must_exist. NULL with "PATH: reason" in err, and the reason
 * never holds bytes of the file: a parse error gives line, column and a
 * generic reason ("not valid JSON at line 1, column 5"), a configuration
 * error names the member by its place ("pip.packages[2]: not a valid
 * version specifier"), unlike allowlist_from_json, which quotes it. */
allowlist *allowlist_load(const char *path, int must_exist, km_err *err);

void allowlist_destroy(allowlist **al);

/* borrowed static: why jansson refused a text ("not valid JSON", "not valid
 * JSON (it ends early)", ...), from its error code alone — jansson's own
 * message quotes the bytes near the error, which must not reach a client
 * when the text is a file it may not read. The caller adds jerr's line and
 * column. */
const char *allowlist_json_reason(const json_error_t *jerr);

/* ALLOWLIST_PIP / ALLOWLIST_NPM for "pip" / "npm", else -1. */
int allowlist_mgr_from_name(const char *name);
/* borrowed static: "pip" / "npm". */
const char *allowlist_mgr_name(allowlist_mgr m);

/* borrowed: the index (pip index_url / npm registry), or NULL when unset. */
const char *allowlist_index(const allowlist *al, allowlist_mgr m);

/* Splits an index URL "http[s]://host[:port]/path" into host and port (80
 * or 443 by default). 0, or -1 with a reason (credentials, other schemes,
 * missing host, bad port). */
int allowlist_parse_url(const char *url, char *host, size_t hostlen, unsigned *port, int *tls,
                        km_err *err);

/* borrowed: the i-th extra "host:port" of m's allowed_hosts (lower case),
 * NULL past the end. */
const char *allowlist_allowed_host(const allowlist *al, allowlist_mgr m, size_t i);

/* Checks and normalises one allowed_hosts entry ("host:port", "[v6]:port")
 * into out (lower case; outlen >= 262). 0, or -1 with a reason. */
int allowlist_parse_hostport(const char *s, char *out, size_t outlen, km_err *err);

/* Number of allowed packages for m. */
size_t allowlist_count(const allowlist *al, allowlist_mgr m);

/* new: {"name": "specifier", ...} of the allowed packages for m. */
json_t *allowlist_to_json(const allowlist *al, allowlist_mgr m);

/* Normalises a package name for m (pip: PEP 503). -1 when it is not a valid
 * name. out has at least ALLOWLIST_NAME_MAX + 1 bytes. */
int allowlist_normalize_name(allowlist_mgr m, const char *name, char *out);

/* Checks one requested package. On success returns 0 and writes the
 * normalised name (ALLOWLIST_NAME_MAX + 1 bytes) and the specifier to
 * install with (ALLOWLIST_SPEC_MAX + 1 bytes, "" for any version): the
 * allowlist's and the request's joined. On refusal returns -1 with a reason
 * meant for the model that asked. */
int allowlist_check(const allowlist *al, allowlist_mgr m, const char *request, char *name,
                    char *spec, km_err *err);

/* 1 when name (any form; normalised here) is on the list for m, and writes
 * its allowlisted specifier to spec (may be NULL). */
int allowlist_has(const allowlist *al, allowlist_mgr m, const char *name, char *spec);

#endif
