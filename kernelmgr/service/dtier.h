/*
 * dtier.h — every party gets exactly its trust: the tiers of a daemon
 * connection, what each tier may send, the operator's configuration as a
 * ceiling, and what a reply to a remote party must not carry.
 *
 * Tiers (docs/API.md "Tiers", docs/SECURITY.md "Tiers and ceilings"):
 *   owner  the socket's owner (the CLI, the operator's own agents): all
 *   mcp    the model behind `kernelmgr mcp`
 *   http   a remote client of the gateway
 * A connection starts as owner and may only lower its tier (initialize's
 * "tier"). What a tier may send is an allowlist: each method's fields
 * (the daemon's dmethods table) and each session option (dtier_sessopts
 * below, the one table of the session options) name the tiers that may set
 * them; anything else is refused naming the field and the tier before the
 * method runs. For a tier below owner, the configuration's memory, cpus,
 * cpu_time, network and sandbox are ceilings a request may only lower.
 *
 * Pure functions over jansson values and kmcfg: no I/O, no globals but the
 * constant tables (tests/unit/test_km_dtier.c).
 */
#ifndef KERNELMGR_DTIER_H
#define KERNELMGR_DTIER_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/km.h"
#include "kernelmgr/engine/kmlimits.h"

typedef enum dtier { DT_OWNER = 0, DT_MCP = 1, DT_HTTP = 2 } dtier;
#define DT_NTIERS 3
#define DT_BIT(t) (1u << (t))
#define DT_O DT_BIT(DT_OWNER)
#define DT_M DT_BIT(DT_MCP)
#define DT_H DT_BIT(DT_HTTP)
#define DT_ALL (DT_O | DT_M | DT_H)

/* borrowed, static: "owner", "mcp", "http". */
const char *dtier_name(dtier t);
/* borrowed, static: "the socket's owner", "MCP clients", "HTTP clients". */
const char *dtier_clients(dtier t);
/* 0 with *t set, or -1 for a name that is no tier. */
int dtier_parse(const char *name, dtier *t);

/* What one connection may do: its tier and whether the operator opted it
 * into the relaxing values (`kernelmgr mcp --allow-unsafe-session-options`
 * for mcp, config http_allow_unsafe_session_options for http). */
typedef struct dtier_grant {
    dtier tier;
    int unsafe;
} dtier_grant;

/* One field a method takes and the tiers that may send it. */
typedef struct dtier_field {
    const char *name;
    unsigned tiers;  /* DT_* bits: may send it */
    unsigned unsafe; /* DT_* bits: may send it (for a session option with a relaxing
                        value: may send that value) when the operator opted in */
    const char *why; /* why it is withheld from the others; NULL: no reason given */
} dtier_field;

typedef enum dtier_sotype {
    DT_SO_CHOICE,  /* one of values[] */
    DT_SO_SIZE,    /* "512M" or bytes, at least min */
    DT_SO_NUMBER,  /* a number in [min, max] */
    DT_SO_PATH,    /* an absolute host path */
    DT_SO_ENV,     /* {NAME: "value"} (kenv.h rules) */
    DT_SO_BOOL,    /* true or false */
    DT_SO_NETWORK, /* one of values[], or an egress allow-list {"allow": [...]} (netopt.h) */
} dtier_sotype;

/* Where a session option's ceiling comes from in the configuration. */
typedef enum dtier_ceil {
    DT_CEIL_NONE,
    DT_CEIL_MEMORY,  /* cfg->memory, or the kernels' default (DTIER_DEFAULT_MEMORY) */
    DT_CEIL_CFG,     /* a number or size: the configuration's value of the same
                        key (its kmcfg_opts row), when set */
    DT_CEIL_NETWORK, /* "on" only when cfg->network is on; an allow-list only within
                        cfg's (or with cfg on) */
    DT_CEIL_SANDBOX, /* "none" only when cfg->sandbox is none */
} dtier_ceil;

/* The kernels' memory limit when the configuration sets none
 * (sandbox.c's default, kernels' --memory). */
#define DTIER_DEFAULT_MEMORY KM_MEMORY_DEFAULT

/* One session option: the one place its name, type, range, ceiling and
 * tiers are declared (docs/API.md "Session options"). */
typedef struct dtier_sessopt {
    dtier_field f;
    dtier_sotype type;
    double min, max;       /* DT_SO_NUMBER: the range; DT_SO_SIZE: min bytes */
    const char *values[3]; /* DT_SO_CHOICE: the values, NULL-terminated */
    const char *relaxing;  /* DT_SO_CHOICE: the value that relaxes the sandbox */
    dtier_ceil ceiling;
    const char *help; /* one line, for schemas and docs */
    const char *def;  /* the default as the docs say it, for an option the configuration
                         has no key of; NULL: that key's (its kmcfg_opts row) */
} dtier_sessopt;

/* The session options, terminated by a row with f.name NULL. */
extern const dtier_sessopt dtier_sessopts[];

/* borrowed: the row of a session option, or NULL. */
const dtier_sessopt *dtier_sessopt_find(const char *name);

/* Writes the markdown table of the session options (field, type with the
 * tiers that may send it and the ceiling, default, meaning), one row per
 * row of dtier_sessopts, to f: docs/API.md's "Session options" table
 * (`kernelmgr config --doc session-options`). 0, or -1 on a write error. */
int dtier_sessopt_doc(FILE *f);

/* 1 when grant g may send field f (its name; not its value). */
int dtier_field_allowed(const dtier_grant *g, const dtier_field *f);

/* Checks every key of params (borrowed; an object or NULL) of method
 * against fields (terminated by a NULL name) and, with sopts, the session
 * options: a key not permitted for g's tier is refused, "field "allowlist"
 * is not available to HTTP clients (...)"; a key no table knows,
 * "unknown field "x" (expected: the fields g may send)". 0, or -1 with the
 * reason in why. */
int dtier_check_fields(const dtier_grant *g, const dtier_field *fields, int sopts,
                       const json_t *params, km_err *why);

/* Validates the session options of params (borrowed) by the table — type,
 * value, range — and fills so (km_session_opts_init first), borrowing its
 * strings and env from params. 0, or -1 with the reason naming the field. */
int dtier_sopts_fill(const json_t *params, km_session_opts *so, km_err *why);

/* The operator's ceilings on the filled options so of params (both
 * borrowed) for grant g: nothing for owner; else memory, cpus and cpu_time
 * at most the configuration's, network "on" / sandbox "none" only when the
 * configuration has them or the operator opted g in. "field "memory": 64G
 * exceeds the operator's limit 256M (config "memory")". 0, or -1 with why. */
int dtier_sopts_ceiling(const dtier_grant *g, const kmcfg *cfg, const json_t *params,
                        const km_session_opts *so, km_err *why);

/* A reply (result, event params or error object; modified in place) for a
 * party of tier t carries no host path: for http, "home", "workspace" and
 * "connection_file" are removed everywhere, a packages.install "target" at
 * the top, "spill" and images' "path" become the file's name, and the
 * daemon's home in every other string (the code's output too: the
 * daemon's truncation notes there name spill files; not a file's "content"
 * nor the "files" reports, which are exact or workspace-relative) is
 * replaced by "$KERNELMGR_HOME". Other tiers: unchanged. home may be NULL. */
void dtier_scrub(dtier t, json_t *reply, const char *home);

/* The same for a message in buf (n bytes): the home replaced. */
void dtier_scrub_text(dtier t, char *buf, size_t n, const char *home);

#endif
