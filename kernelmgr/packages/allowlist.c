/*
 * allowlist.c — the package allowlist and the validation of install requests.
 *
 * Validation is deliberately a whitelist grammar, not a blacklist of known
 * tricks: a request is accepted only when it is a plain name followed by a
 * plain version specifier. The specific refusals below exist to give the
 * model a useful reason, not to be the only line of defence.
 */
#include "kernelmgr/packages/allowlist.h"
#include "common/cm_io.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct alw_entry {
    char name[ALLOWLIST_NAME_MAX + 1]; /* normalised */
    char spec[ALLOWLIST_SPEC_MAX / 2]; /* "" = any; half the room: joined later */
} alw_entry;

struct allowlist {
    alw_entry *v[ALLOWLIST_NMGR];
    size_t n[ALLOWLIST_NMGR];
    char *index[ALLOWLIST_NMGR];
    char *hosts[ALLOWLIST_NMGR][ALLOWLIST_HOSTS_MAX + 1]; /* NULL-terminated */
};

#define ERR(...) km_err_set(err, KM_EUSAGE, __VA_ARGS__)

allowlist *allowlist_new(void)
{
    return calloc(1, sizeof(allowlist));
}

void allowlist_destroy(allowlist **al)
{
    if (!al || !*al)
        return;
    for (int m = 0; m < ALLOWLIST_NMGR; m++) {
        free((*al)->v[m]);
        free((*al)->index[m]);
        for (size_t i = 0; (*al)->hosts[m][i]; i++)
            free((*al)->hosts[m][i]);
    }
    free(*al);
    *al = NULL;
}

int allowlist_mgr_from_name(const char *name)
{
    if (name && strcmp(name, "pip") == 0)
        return ALLOWLIST_PIP;
    if (name && strcmp(name, "npm") == 0)
        return ALLOWLIST_NPM;
    return -1;
}

const char *allowlist_mgr_name(allowlist_mgr m)
{
    return m == ALLOWLIST_NPM ? "npm" : "pip";
}

const char *allowlist_index(const allowlist *al, allowlist_mgr m)
{
    return al ? al->index[m] : NULL;
}

const char *allowlist_allowed_host(const allowlist *al, allowlist_mgr m, size_t i)
{
    if (!al || (int)m < 0 || m >= ALLOWLIST_NMGR || i >= ALLOWLIST_HOSTS_MAX)
        return NULL;
    return al->hosts[m][i];
}

size_t allowlist_count(const allowlist *al, allowlist_mgr m)
{
    return al ? al->n[m] : 0;
}

/* ---------------------------------------------------------------- names */

static int pip_name_char(int c)
{
    return isalnum(c) || c == '-' || c == '_' || c == '.';
}

/* npm's rules (validate-npm-package-name, "new" packages): lower case,
 * URL-safe characters, no leading "." or "_", at most 214 characters, an
 * optional "@scope/" prefix. */
static int npm_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || isdigit(c) || c == '-' || c == '.' || c == '_' || c == '~';
}

int allowlist_normalize_name(allowlist_mgr m, const char *name, char *out)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > ALLOWLIST_NAME_MAX)
        return -1;
    if (m == ALLOWLIST_PIP) {
        /* PEP 508: starts and ends with a letter or digit. */
        if (!isalnum((unsigned char)name[0]) || !isalnum((unsigned char)name[n - 1]))
            return -1;
        size_t o = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)name[i];
            if (!pip_name_char(c))
                return -1;
            if (c == '-' || c == '_' || c == '.') {
                if (o > 0 && out[o - 1] == '-')
                    continue;
                out[o++] = '-';
            } else {
                out[o++] = (char)tolower(c);
            }
        }
        out[o] = '\0';
        return 0;
    }
    const char *p = name;
    if (p[0] == '@') {
        const char *slash = strchr(p, '/');
        if (!slash || slash == p + 1)
            return -1;
        for (const char *q = p + 1; q < slash; q++)
            if (!npm_name_char((unsigned char)*q))
                return -1;
        p = slash + 1;
    }
    if (!*p || *p == '.' || *p == '_')
        return -1;
    for (const char *q = p; *q; q++)
        if (!npm_name_char((unsigned char)*q))
            return -1;
    memcpy(out, name, n + 1);
    return 0;
}

/* ---------------------------------------------------------------- specifiers */

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    size_t i = 0;
    while (s[i] && isspace((unsigned char)s[i]))
        i++;
    memmove(s, s + i, n - i + 1);
}

/* PEP 440 specifier set: clauses "OP VERSION" joined by ",". The version
 * alphabet is PEP 440's (plus "*" for "==1.*"); no URLs, no markers. */
static int pip_spec_valid(const char *spec)
{
    static const char *const ops[] = {"===", "~=", "==", "!=", "<=", ">=", "<", ">", NULL};
    const char *p = spec;
    if (!*p)
        return 1;
    for (;;) {
        while (*p == ' ')
            p++;
        size_t oplen = 0;
        for (int i = 0; ops[i]; i++)
            if (strncmp(p, ops[i], strlen(ops[i])) == 0) {
                oplen = strlen(ops[i]);
                break;
            }
        if (!oplen)
            return 0;
        p += oplen;
        while (*p == ' ')
            p++;
        size_t vlen = 0;
        while (isalnum((unsigned char)p[vlen]) || strchr(".*+!_-", p[vlen]) != NULL) {
            if (!p[vlen])
                break;
            vlen++;
        }
        if (vlen == 0)
            return 0;
        p += vlen;
        while (*p == ' ')
            p++;
        if (*p == '\0')
            return 1;
        if (*p != ',')
            return 0;
        p++;
    }
}

/* An npm semver range: versions, comparators, ^ ~ x * and "||", hyphen
 * ranges. No tags, no URLs, no "npm:" aliases, no "file:"/"git" specs. */
static int npm_spec_valid(const char *spec)
{
    if (!*spec)
        return 1;
    /* A range starts like a version or a comparator; a tag ("latest",
     * "beta") starts with a letter and names no fixed version. */
    if (!isdigit((unsigned char)spec[0]) && !strchr("v^~<>=*xX", spec[0]))
        return 0;
    for (const char *p = spec; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (!isalnum(c) && !strchr(".^~<>=*| -+", c))
            return 0;
    }
    return 1;
}

static int spec_valid(allowlist_mgr m, const char *spec)
{
    if (strlen(spec) > ALLOWLIST_SPEC_MAX / 2)
        return 0;
    return m == ALLOWLIST_PIP ? pip_spec_valid(spec) : npm_spec_valid(spec);
}

/* ---------------------------------------------------------------- config */

/* The grammar of an index URL: 0, or -1 with *why a static reason that
 * quotes nothing (the callers decide whether the URL may be quoted). */
static int parse_url(const char *url, char *host, size_t hostlen, unsigned *port, int *tls,
                     const char **why)
{
    const char *p;
    if (!url || !*url) {
        *why = "empty URL";
        return -1;
    }
    if (strncmp(url, "http://", 7) == 0) {
        *tls = 0;
        *port = 80;
        p = url + 7;
    } else if (strncmp(url, "https://", 8) == 0) {
        *tls = 1;
        *port = 443;
        p = url + 8;
    } else {
        *why = "only http:// and https:// indexes are supported";
        return -1;
    }
    size_t auth = strcspn(p, "/?#");
    if (memchr(p, '@', auth)) {
        *why = "credentials in the URL are not supported";
        return -1;
    }
    const char *colon = NULL;
    if (p[0] == '[') {
        const char *close = memchr(p, ']', auth);
        if (!close) {
            *why = "bad IPv6 host";
            return -1;
        }
        if ((size_t)(close - p - 1) + 1 > hostlen || close == p + 1) {
            *why = "bad host";
            return -1;
        }
        memcpy(host, p + 1, (size_t)(close - p - 1));
        host[close - p - 1] = '\0';
        if (close + 1 < p + auth) {
            if (close[1] != ':') {
                *why = "bad host";
                return -1;
            }
            colon = close + 1;
        }
    } else {
        colon = memchr(p, ':', auth);
        size_t hl = colon ? (size_t)(colon - p) : auth;
        if (hl == 0 || hl + 1 > hostlen) {
            *why = "missing or too long host";
            return -1;
        }
        for (size_t i = 0; i < hl; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '-' && p[i] != '.') {
                *why = "bad host";
                return -1;
            }
        memcpy(host, p, hl);
        host[hl] = '\0';
    }
    if (colon) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(colon + 1, &end, 10);
        if (end == colon + 1 || end != p + auth || errno || v == 0 || v > 65535) {
            *why = "bad port";
            return -1;
        }
        *port = (unsigned)v;
    }
    return 0;
}

int allowlist_parse_url(const char *url, char *host, size_t hostlen, unsigned *port, int *tls,
                        km_err *err)
{
    const char *why;
    if (parse_url(url, host, hostlen, port, tls, &why) < 0) {
        if (url && *url)
            ERR("'%s': %s", url, why);
        else
            ERR("%s", why);
        return -1;
    }
    return 0;
}

/* The grammar of an allowed_hosts entry: 0, or -1 with *why a static reason
 * that quotes nothing. */
static int parse_hostport(const char *s, char *out, size_t outlen, const char **why)
{
    /* The same grammar as an index URL's authority, so one parser decides
     * what a host is; but no scheme, no path and an explicit port. */
    if (!s || !*s || strlen(s) > 262) {
        *why = "expected host:port";
        return -1;
    }
    if (strpbrk(s, "/?#@ ") || strstr(s, "://")) {
        *why = "expected host:port (no scheme, path or credentials)";
        return -1;
    }
    const char *colon = s[0] == '[' ? strstr(s, "]:") : strrchr(s, ':');
    if (!colon || (s[0] != '[' && strchr(s, ':') != colon)) {
        *why = "expected host:port (the port is required)";
        return -1;
    }
    char url[300], host[256];
    const char *uwhy;
    unsigned port;
    int tls;
    snprintf(url, sizeof url, "http://%s/", s);
    if (parse_url(url, host, sizeof host, &port, &tls, &uwhy) < 0) {
        *why = "expected host:port (bad host or port)";
        return -1;
    }
    if (strcmp(host, ".") == 0 || host[0] == '.' || host[0] == '-') {
        *why = "bad host";
        return -1;
    }
    int n = snprintf(out, outlen, strchr(host, ':') ? "[%s]:%u" : "%s:%u", host, port);
    if (n < 0 || (size_t)n >= outlen) {
        *why = "too long";
        return -1;
    }
    for (char *p = out; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return 0;
}

int allowlist_parse_hostport(const char *s, char *out, size_t outlen, km_err *err)
{
    const char *why;
    if (parse_hostport(s, out, outlen, &why) < 0) {
        ERR("'%s': %s", s ? s : "", why);
        return -1;
    }
    return 0;
}

/* How configuration errors name what they are about. From a caller's JSON
 * (allowlist_from_json) they quote the offending key or value, which is what
 * an operator editing the list wants. From a file (allowlist_load) they
 * never do: the file may be one the requester could not read itself (a path
 * a client named), so a member is named by its place ("pip.packages[2]",
 * "pip.allowed_hosts[0]", key 1 of the top level) and a reason from a fixed
 * set, never by bytes of the file. */
typedef struct cfg_ctx {
    int quote;
    km_err *err;
} cfg_ctx;

static int parse_hosts(allowlist *al, allowlist_mgr m, const json_t *val, const cfg_ctx *c)
{
    km_err *err = c->err;
    const char *mname = allowlist_mgr_name(m);
    if (!json_is_array(val)) {
        ERR("%s.allowed_hosts: must be an array of \"host:port\" strings", mname);
        return -1;
    }
    if (json_array_size(val) > ALLOWLIST_HOSTS_MAX) {
        ERR("%s.allowed_hosts: at most %d hosts", mname, ALLOWLIST_HOSTS_MAX);
        return -1;
    }
    for (size_t i = 0; al->hosts[m][i]; i++) {
        free(al->hosts[m][i]);
        al->hosts[m][i] = NULL;
    }
    size_t i;
    const json_t *h;
    json_array_foreach(val, i, h)
    {
        char norm[300];
        const char *why;
        if (!json_is_string(h)) {
            ERR("%s.allowed_hosts[%zu]: must be a string", mname, i);
            return -1;
        }
        if (parse_hostport(json_string_value(h), norm, sizeof norm, &why) < 0) {
            if (c->quote)
                ERR("%s.allowed_hosts[%zu]: '%s': %s", mname, i, json_string_value(h), why);
            else
                ERR("%s.allowed_hosts[%zu]: %s", mname, i, why);
            return -1;
        }
        if (!(al->hosts[m][i] = strdup(norm))) {
            ERR("out of memory");
            return -1;
        }
    }
    return 0;
}

/* Adds the pos-th member (0-based) of m's "packages". */
static int add_entry(allowlist *al, allowlist_mgr m, const char *name, const char *spec, size_t pos,
                     const cfg_ctx *c)
{
    km_err *err = c->err;
    const char *mname = allowlist_mgr_name(m);
    alw_entry e;
    memset(&e, 0, sizeof e);
    if (allowlist_normalize_name(m, name, e.name) < 0) {
        if (c->quote)
            ERR("%s.packages: '%s' is not a valid %s package name", mname, name, mname);
        else
            ERR("%s.packages[%zu]: not a valid %s package name", mname, pos, mname);
        return -1;
    }
    char s[ALLOWLIST_SPEC_MAX / 2];
    if (strlen(spec ? spec : "") >= sizeof s) {
        if (c->quote)
            ERR("%s.packages.%s: the version specifier is too long", mname, name);
        else
            ERR("%s.packages[%zu]: the version specifier is too long", mname, pos);
        return -1;
    }
    snprintf(s, sizeof s, "%s", spec ? spec : "");
    trim(s);
    if (strcmp(s, "*") == 0 && m == ALLOWLIST_PIP)
        s[0] = '\0';
    if (strlen(spec ? spec : "") > ALLOWLIST_SPEC_MAX / 2 || !spec_valid(m, s)) {
        if (c->quote)
            ERR("%s.packages.%s: '%s' is not a valid version specifier", mname, name, spec);
        else
            ERR("%s.packages[%zu]: not a valid version specifier", mname, pos);
        return -1;
    }
    memcpy(e.spec, s, sizeof e.spec);
    for (size_t i = 0; i < al->n[m]; i++)
        if (strcmp(al->v[m][i].name, e.name) == 0) {
            if (c->quote)
                ERR("%s.packages: '%s' is listed twice", mname, name);
            else
                ERR("%s.packages[%zu]: the package is listed twice", mname, pos);
            return -1;
        }
    alw_entry *nv = realloc(al->v[m], (al->n[m] + 1) * sizeof *nv);
    if (!nv) {
        ERR("out of memory");
        return -1;
    }
    nv[al->n[m]++] = e;
    al->v[m] = nv;
    return 0;
}

static int parse_packages(allowlist *al, allowlist_mgr m, const json_t *val, const cfg_ctx *c)
{
    km_err *err = c->err;
    const char *mname = allowlist_mgr_name(m);
    size_t pos = 0;
    if (json_is_object(val)) {
        const char *pk;
        const json_t *pv;
        json_object_foreach((json_t *)val, pk, pv)
        {
            if (!json_is_string(pv)) {
                if (c->quote)
                    ERR("%s.packages.%s: the version specifier must be a string", mname, pk);
                else
                    ERR("%s.packages[%zu]: the version specifier must be a string", mname, pos);
                return -1;
            }
            if (add_entry(al, m, pk, json_string_value(pv), pos, c) < 0)
                return -1;
            pos++;
        }
        return 0;
    }
    if (json_is_array(val)) {
        const json_t *pv;
        json_array_foreach(val, pos, pv)
        {
            if (!json_is_string(pv)) {
                ERR("%s.packages[%zu]: must be a string", mname, pos);
                return -1;
            }
            if (add_entry(al, m, json_string_value(pv), "", pos, c) < 0)
                return -1;
        }
        return 0;
    }
    ERR("%s.packages: must be an object {name: specifier} or an array of names", mname);
    return -1;
}

/* The key naming a manager's index in its configuration. */
static const char *mgr_index_key(allowlist_mgr m)
{
    return m == ALLOWLIST_PIP ? "index_url" : "registry";
}

/* The manager's index (pip: "index_url", npm: "registry"). */
static int parse_index(allowlist *al, allowlist_mgr m, const json_t *val, const cfg_ctx *c)
{
    km_err *err = c->err;
    const char *mname = allowlist_mgr_name(m);
    const char *index_key = mgr_index_key(m);
    char host[256];
    unsigned port;
    int tls;
    const char *why;
    if (!json_is_string(val)) {
        ERR("%s.%s: must be a string", mname, index_key);
        return -1;
    }
    if (parse_url(json_string_value(val), host, sizeof host, &port, &tls, &why) < 0) {
        if (c->quote && *json_string_value(val))
            ERR("%s.%s: '%s': %s", mname, index_key, json_string_value(val), why);
        else
            ERR("%s.%s: %s", mname, index_key, why);
        return -1;
    }
    free(al->index[m]);
    if (!(al->index[m] = strdup(json_string_value(val)))) {
        ERR("out of memory");
        return -1;
    }
    return 0;
}

/* A manager's keys, a row each; key NULL: the manager's index key. */
static const struct {
    const char *key;
    int (*parse)(allowlist *al, allowlist_mgr m, const json_t *val, const cfg_ctx *c);
} mgr_keys[] = {
    {NULL, parse_index},
    {"allowed_hosts", parse_hosts},
    {"packages", parse_packages},
};

static int parse_manager(allowlist *al, allowlist_mgr m, const json_t *obj, const cfg_ctx *c)
{
    km_err *err = c->err;
    const char *mname = allowlist_mgr_name(m);
    const char *index_key = mgr_index_key(m);
    if (!json_is_object(obj)) {
        ERR("%s: must be an object", mname);
        return -1;
    }
    const char *key;
    const json_t *val;
    size_t pos = 0;
    json_object_foreach((json_t *)obj, key, val)
    {
        pos++;
        size_t row = 0;
        while (row < sizeof mgr_keys / sizeof *mgr_keys &&
               strcmp(key, mgr_keys[row].key ? mgr_keys[row].key : index_key))
            row++;
        if (row == sizeof mgr_keys / sizeof *mgr_keys) {
            if (c->quote)
                ERR("%s.%s: unknown key (expected %s, allowed_hosts, packages)", mname, key,
                    index_key);
            else
                ERR("%s: key %zu is unknown (expected %s, allowed_hosts, packages)", mname, pos,
                    index_key);
            return -1;
        }
        if (mgr_keys[row].parse(al, m, val, c) < 0)
            return -1;
    }
    if (al->n[m] > 0 && !al->index[m]) {
        ERR("%s.%s: required when packages are listed", mname, index_key);
        return -1;
    }
    return 0;
}

static allowlist *from_json(const json_t *cfg, const cfg_ctx *c)
{
    km_err *err = c->err;
    if (!json_is_object(cfg)) {
        ERR("the allowlist must be a JSON object");
        return NULL;
    }
    allowlist *al = allowlist_new();
    if (!al) {
        ERR("out of memory");
        return NULL;
    }
    const char *key;
    const json_t *val;
    size_t pos = 0;
    json_object_foreach((json_t *)cfg, key, val)
    {
        pos++;
        int m = allowlist_mgr_from_name(key);
        if (m < 0) {
            if (c->quote)
                ERR("%s: unknown key (expected pip, npm)", key);
            else
                ERR("key %zu of the top-level object is unknown (expected pip, npm)", pos);
            allowlist_destroy(&al);
            return NULL;
        }
        if (parse_manager(al, (allowlist_mgr)m, val, c) < 0) {
            allowlist_destroy(&al);
            return NULL;
        }
    }
    return al;
}

allowlist *allowlist_from_json(const json_t *cfg, km_err *err)
{
    cfg_ctx c = {.quote = 1, .err = err};
    return from_json(cfg, &c);
}

const char *allowlist_json_reason(const json_error_t *jerr)
{
    switch (json_error_code(jerr)) {
    case json_error_out_of_memory:
        return "out of memory while parsing";
    case json_error_stack_overflow:
        return "not valid JSON (nested too deeply)";
    case json_error_invalid_utf8:
        return "not valid JSON (not UTF-8)";
    case json_error_premature_end_of_input:
        return "not valid JSON (it ends early)";
    case json_error_end_of_input_expected:
        return "not valid JSON (more after the value)";
    case json_error_null_character:
        return "not valid JSON (a NUL byte)";
    case json_error_duplicate_key:
        return "not valid JSON (a key occurs twice)";
    case json_error_numeric_overflow:
        return "not valid JSON (a number out of range)";
    default:
        return "not valid JSON";
    }
}

allowlist *allowlist_load(const char *path, int must_exist, km_err *err)
{
    /* no symbolic link, no FIFO or device (never blocks), a regular file of
     * at most ALLOWLIST_FILE_MAX bytes; the reasons never hold its bytes */
    char *text;
    size_t len;
    const char *why;
    if (cm_read_regular(path, ALLOWLIST_FILE_MAX, 0, &text, &len, &why) < 0) {
        if (errno == ENOENT && !must_exist)
            return allowlist_new();
        /* cm_read_regular's own phrases read after the path ("P is a
         * symbolic link"), strerror's after a colon */
        const char *sep = strncmp(why, "is ", 3) == 0 ? " " : ": ";
        if (errno == EFBIG)
            ERR("%s%s%s of %d KiB for an allowlist", path, sep, why, ALLOWLIST_FILE_MAX >> 10);
        else
            ERR("%s%s%s", path, sep, why);
        return NULL;
    }
    json_error_t jerr;
    json_t *cfg = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    /* it may be a file the requester could not read: no copy outlives this */
    explicit_bzero(text, len);
    free(text);
    if (!cfg) {
        ERR("%s: %s at line %d, column %d", path, allowlist_json_reason(&jerr), jerr.line,
            jerr.column);
        return NULL;
    }
    km_err reason = {0};
    cfg_ctx c = {.quote = 0, .err = &reason};
    allowlist *al = from_json(cfg, &c);
    json_decref(cfg);
    if (!al)
        ERR("%s: %.511s", path, reason.msg); /* the reason's old bound */
    return al;
}

json_t *allowlist_to_json(const allowlist *al, allowlist_mgr m)
{
    json_t *o = json_object();
    for (size_t i = 0; al && i < al->n[m]; i++)
        json_object_set_new(o, al->v[m][i].name, json_string(al->v[m][i].spec));
    return o;
}

int allowlist_has(const allowlist *al, allowlist_mgr m, const char *name, char *spec)
{
    char norm[ALLOWLIST_NAME_MAX + 1];
    if (!al || allowlist_normalize_name(m, name, norm) < 0)
        return 0;
    for (size_t i = 0; i < al->n[m]; i++)
        if (strcmp(al->v[m][i].name, norm) == 0) {
            if (spec)
                strcpy(spec, al->v[m][i].spec);
            return 1;
        }
    return 0;
}

/* ---------------------------------------------------------------- requests */

/* The reasons a request is not a plain "name[spec]", most specific first. */
static const char *shape_refusal(allowlist_mgr m, const char *r)
{
    if (r[0] == '-')
        return "options and flags are not allowed (only package names, optionally with a version)";
    if (m == ALLOWLIST_PIP && strchr(r, '@'))
        return "direct references (name @ url) are not allowed; packages come only from the "
               "configured index";
    if (strstr(r, "://") || strncmp(r, "git+", 4) == 0 || strncmp(r, "git@", 4) == 0)
        return strncmp(r, "git", 3) == 0 || strstr(r, "git+") || strstr(r, ".git")
                   ? "VCS links are not allowed; packages come only from the configured index"
                   : "URLs are not allowed; packages come only from the configured index";
    if (r[0] == '.' || r[0] == '/' || r[0] == '~' || strchr(r, '\\') ||
        strncmp(r, "file:", 5) == 0 || strstr(r, ".whl") || strstr(r, ".tar") ||
        strstr(r, ".tgz") || strstr(r, ".zip"))
        return "local paths and archives are not allowed; packages come only from the "
               "configured index";
    if (m == ALLOWLIST_NPM) {
        static const char *const prefixes[] = {
            "npm:", "github:", "gitlab:", "bitbucket:", "gist:", "link:", "workspace:", NULL};
        for (int i = 0; prefixes[i]; i++)
            if (strstr(r, prefixes[i]))
                return "aliases and host shortcuts are not allowed; give a registry package name";
        const char *name_end = r[0] == '@' ? strchr(r + 1, '@') : strchr(r, '@');
        const char *slash = strchr(r, '/');
        if (r[0] != '@' && slash && (!name_end || slash < name_end))
            return "paths and GitHub shortcuts (user/repo) are not allowed; give a registry "
                   "package name";
        if (strchr(r, '#'))
            return "git references are not allowed";
        return NULL;
    }
    if (strchr(r, ';'))
        return "environment markers are not allowed";
    if (strchr(r, '['))
        return "extras (name[extra]) are not allowed; request the extra packages by name";
    if (strchr(r, '/'))
        return "paths are not allowed; packages come only from the configured index";
    return NULL;
}

int allowlist_check(const allowlist *al, allowlist_mgr m, const char *request, char *name,
                    char *spec, km_err *err)
{
    const char *mname = allowlist_mgr_name(m);
    if (!request || !*request) {
        ERR("an empty package name");
        return -1;
    }
    size_t rlen = strlen(request);
    if (rlen > ALLOWLIST_NAME_MAX + ALLOWLIST_SPEC_MAX / 2) {
        ERR("'%.60s...': too long", request);
        return -1;
    }
    for (size_t i = 0; i < rlen; i++)
        if ((unsigned char)request[i] < 0x20 || (unsigned char)request[i] >= 0x7f) {
            ERR("'%.80s': control or non-ASCII characters are not allowed", request);
            return -1;
        }
    char r[ALLOWLIST_NAME_MAX + ALLOWLIST_SPEC_MAX + 2];
    snprintf(r, sizeof r, "%s", request);
    trim(r);
    const char *why = shape_refusal(m, r);
    if (why) {
        ERR("'%s': %s", request, why);
        return -1;
    }
    /* Split name and specifier. */
    char rname[ALLOWLIST_NAME_MAX + 1], rspec[ALLOWLIST_SPEC_MAX / 2];
    size_t nlen;
    const char *sp;
    if (m == ALLOWLIST_PIP) {
        nlen = 0;
        while (r[nlen] && pip_name_char((unsigned char)r[nlen]))
            nlen++;
        sp = r + nlen;
    } else {
        const char *at = r[0] == '@' ? strchr(r + 1, '@') : strchr(r, '@');
        nlen = at ? (size_t)(at - r) : strlen(r);
        sp = at ? at + 1 : r + nlen;
    }
    if (nlen == 0 || nlen > ALLOWLIST_NAME_MAX) {
        ERR("'%s': not a %s package name", request, mname);
        return -1;
    }
    memcpy(rname, r, nlen);
    rname[nlen] = '\0';
    if (strlen(sp) >= sizeof rspec) {
        ERR("'%.60s...': the version specifier is too long", request);
        return -1;
    }
    snprintf(rspec, sizeof rspec, "%s", sp);
    trim(rspec);
    if (allowlist_normalize_name(m, rname, name) < 0) {
        ERR("'%s': '%s' is not a valid %s package name", request, rname, mname);
        return -1;
    }
    if (!spec_valid(m, rspec)) {
        ERR("'%s': '%s' is not a plain version specifier (%s)", request, rspec,
            m == ALLOWLIST_PIP ? "e.g. ==1.2.3 or >=1,<2" : "e.g. 1.2.3 or ^1.2.0");
        return -1;
    }
    char aspec[ALLOWLIST_SPEC_MAX / 2];
    if (!allowlist_has(al, m, name, aspec)) {
        if (allowlist_count(al, m) == 0)
            ERR("'%s': no %s packages are installable (the allowlist for %s is empty; the "
                "operator configures it)",
                request, mname, mname);
        else
            ERR("'%s': %s is not on the %s allowlist", request, name, mname);
        return -1;
    }
    if (!aspec[0] || strcmp(aspec, "*") == 0) {
        snprintf(spec, ALLOWLIST_SPEC_MAX + 1, "%s", rspec);
    } else if (!rspec[0] || strcmp(rspec, aspec) == 0) {
        snprintf(spec, ALLOWLIST_SPEC_MAX + 1, "%s", aspec);
    } else if (m == ALLOWLIST_PIP) {
        snprintf(spec, ALLOWLIST_SPEC_MAX + 1, "%s,%s", aspec, rspec);
    } else {
        /* npm: " " is AND only inside one "||" alternative. */
        if (strstr(aspec, "||") || strstr(rspec, "||")) {
            ERR("'%s': cannot combine '%s' with the allowed range '%s'; ask without a version",
                request, rspec, aspec);
            return -1;
        }
        snprintf(spec, ALLOWLIST_SPEC_MAX + 1, "%s %s", aspec, rspec);
    }
    return 0;
}
