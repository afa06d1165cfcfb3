/*
 * config.c — defaults, JSON configuration and its validation: the table
 * of options (kmcfg_opts) and the loops over it.
 */
#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/kmlimits.h"
#include "common/cm_io.h"
#include "common/cm_size.h"
#include "kernels/server/kenv.h"
#include "protocol/jp.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

unsigned kmcfg_auto_max_kernels(void)
{
    /* the memory rule (memory_budget) decides how many kernels fit; this
     * cap only keeps the daemon within its file descriptors, half of them
     * (the daemon raises its soft limit to the hard one; the rest serve
     * connections and the gateway) */
    struct rlimit rl;
    uint64_t fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY
                       ? (uint64_t)rl.rlim_max
                       : UINT64_MAX;
    uint64_t n = fds / 2 / KMCFG_FDS_PER_KERNEL;
    return n < 2 ? 2 : n > KMCFG_MAX_KERNELS_CAP ? KMCFG_MAX_KERNELS_CAP : (unsigned)n;
}

void kmcfg_clear(kmcfg *cfg)
{
    if (!cfg)
        return;
    json_decref(cfg->env);
    cfg->env = NULL;
}

int kmcfg_lang_index(const kmcfg *cfg, const char *name)
{
    return km_langs_find(&cfg->langs, name);
}

const char *kmcfg_lang_name(const kmcfg *cfg, int idx)
{
    return idx >= 0 && idx < cfg->langs.n ? cfg->langs.v[idx].name : "?";
}

int kmcfg_parse_size(const char *s, uint64_t *out)
{
    return cm_size_parse(s, out, NULL, 0);
}

static int fail(km_err *err, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(km_err *err, const char *key, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    km_err_set(err, KM_EUSAGE, "%s: %s", key, why);
    return -1;
}

static int get_number(const json_t *v, const char *key, double lo, double hi, double *out,
                      km_err *err)
{
    if (!json_is_number(v))
        return fail(err, key, "must be a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return fail(err, key, "must be between %g and %g (got %g)", lo, hi, d);
    *out = d;
    return 0;
}

static int get_string(const json_t *v, const char *key, char *out, size_t size, km_err *err)
{
    if (!json_is_string(v))
        return fail(err, key, "must be a string");
    if (json_string_length(v) >= size)
        return fail(err, key, "too long (max %zu bytes)", size - 1);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(err, key, "contains a NUL byte");
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

/* get_number() for a whole number. */
static int get_count(const json_t *v, const char *key, double lo, double hi, unsigned *out,
                     km_err *err)
{
    double d = 0;
    if (get_number(v, key, lo, hi, &d, err))
        return -1;
    if (d != floor(d))
        return fail(err, key, "must be an integer");
    *out = (unsigned)d;
    return 0;
}

/* get_string() for one of two words; out (size bytes, at most 16) is left
 * alone unless the value is a or b. */
static int get_choice(const json_t *v, const char *key, const char *a, const char *b, char *out,
                      size_t size, km_err *err)
{
    char s[16];
    if (get_string(v, key, s, size < sizeof s ? size : sizeof s, err))
        return -1;
    if (strcmp(s, a) && strcmp(s, b))
        return fail(err, key, "must be \"%s\" or \"%s\"", a, b);
    snprintf(out, size, "%s", s);
    return 0;
}

/* A size limit: an integer (bytes) or a string like "64M", between lo and hi. */
static int get_size(const json_t *v, const char *key, uint64_t lo, uint64_t hi, uint64_t *out,
                    km_err *err)
{
    uint64_t b = 0;
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        b = (uint64_t)json_integer_value(v);
    else if (!json_is_string(v) || kmcfg_parse_size(json_string_value(v), &b))
        return fail(err, key, "must be a size like \"64M\" or a number of bytes");
    if (b < lo || b > hi)
        return fail(err, key, "must be between %llu and %llu bytes (got %llu)",
                    (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)b);
    *out = b;
    return 0;
}

/* "env": an object of string values, checked by the rules of kenv.h. */
static int get_env(const json_t *v, json_t **out, km_err *err)
{
    char why[300];
    if (kenv_check_object(NULL, "env", v, why, sizeof why))
        return fail(err, "env", "%s", why + (strncmp(why, "env: ", 5) ? 4 : 5));
    json_t *copy = json_deep_copy(v);
    if (!copy)
        return fail(err, "env", "out of memory");
    json_decref(*out);
    *out = copy;
    return 0;
}

/* "kernels" (lang.h), applied before "languages" so that the allow list may
 * name a language the same file defines. A language keeps whether it is
 * allowed; a new one is allowed unless "languages" was given. */
static int apply_kernels(kmcfg *cfg, const json_t *v, km_err *err)
{
    if (!json_is_object(v))
        return fail(err, "kernels",
                    "must be an object like {\"python\": \"KERNELSPEC\"} or {\"NAME\": "
                    "{\"backend\": \"kernel-bash\"}}");
    km_langs old = cfg->langs;
    int old_allow[KM_LANG_MAX];
    memcpy(old_allow, cfg->allow, sizeof old_allow);
    const char *lk;
    json_t *lv;
    json_object_foreach((json_t *)v, lk, lv)
    {
        if (km_langs_configure(&cfg->langs, lk, lv, err) < 0) {
            cfg->langs = old;
            return -1;
        }
    }
    for (int i = 0; i < cfg->langs.n; i++) {
        int was = -1;
        for (int j = 0; j < old.n; j++)
            if (!strcmp(old.v[j].name, cfg->langs.v[i].name))
                was = j;
        cfg->allow[i] = was >= 0 ? old_allow[was] : !cfg->languages_set;
    }
    for (int i = cfg->langs.n; i < KM_LANG_MAX; i++)
        cfg->allow[i] = 0;
    return 0;
}

/* The special keys' hooks. */

static void kernels_defaults(kmcfg *cfg)
{
    km_langs_builtin(&cfg->langs);
    for (int i = 0; i < cfg->langs.n; i++)
        cfg->allow[i] = 1;
}

static json_t *kernels_json(const kmcfg *cfg)
{
    return km_langs_to_json(&cfg->langs);
}

static int languages_apply(kmcfg *cfg, const json_t *v, km_err *err)
{
    const char *key = "languages";
    char known[400];
    km_langs_names(&cfg->langs, known, sizeof known);
    if (!json_is_array(v))
        return fail(err, key, "must be an array of language names (%s)", known);
    int allow[KM_LANG_MAX] = {0};
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        int li = json_is_string(e) ? kmcfg_lang_index(cfg, json_string_value(e)) : -1;
        if (li < 0)
            return fail(err, key, "unknown language at index %zu (allowed: %s)", i, known);
        allow[li] = 1;
    }
    memcpy(cfg->allow, allow, sizeof allow);
    cfg->languages_set = 1;
    return 0;
}

static json_t *languages_json(const kmcfg *cfg)
{
    json_t *langs = json_array();
    for (int i = 0; langs && i < cfg->langs.n; i++)
        if (cfg->allow[i])
            json_array_append_new(langs, json_string(cfg->langs.v[i].name));
    return langs;
}

/* "memory": bytes, 0 = the kernels' default; else at least KM_MEMORY_MIN */
static int memory_apply(kmcfg *cfg, const json_t *v, km_err *err)
{
    uint64_t b;
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        cfg->memory = (uint64_t)json_integer_value(v);
    else if (json_is_string(v) && !kmcfg_parse_size(json_string_value(v), &b))
        cfg->memory = b;
    else
        return fail(err, "memory", "must be a size like \"512M\" or \"2G\"");
    if (cfg->memory && cfg->memory < KM_MEMORY_MIN)
        return fail(err, "memory", "must be at least %lluM",
                    (unsigned long long)(KM_MEMORY_MIN >> 20));
    return 0;
}

static json_t *memory_json(const kmcfg *cfg)
{
    return json_integer((json_int_t)cfg->memory);
}

static int network_apply(kmcfg *cfg, const json_t *v, km_err *err)
{
    km_err why = {0};
    int rc = json_is_string(v) && egpolicy_is_text(json_string_value(v))
                 ? km_net_from_text(json_string_value(v), "network", &cfg->network,
                                    cfg->network_allow, sizeof cfg->network_allow, &why)
                 : km_net_from_json(v, "network", &cfg->network, cfg->network_allow,
                                    sizeof cfg->network_allow, &why);
    if (rc) {
        km_err_set(err, KM_EUSAGE, "%s", why.msg);
        return -1;
    }
    return 0;
}

static json_t *network_json(const kmcfg *cfg)
{
    return km_net_json(cfg->network, cfg->network_allow);
}

static int python_apply(kmcfg *cfg, const json_t *v, km_err *err)
{
    if (json_is_null(v)) {
        cfg->python[0] = 0;
        return 0;
    }
    if (get_string(v, "python", cfg->python, sizeof cfg->python, err))
        return -1;
    if (cfg->python[0] && cfg->python[0] != '/')
        return fail(err, "python", "must be an absolute path");
    return 0;
}

/* detected: not in the object */
static json_t *python_json(const kmcfg *cfg)
{
    return cfg->python[0] ? json_string(cfg->python) : NULL;
}

#define OUTPUT_CAP_MIN 256u
#define OUTPUT_CAP_MAX (256u << 20)

static void output_cap_defaults(kmcfg *cfg)
{
    cfg->output_cap = 64 * 1024;
}

static int output_cap_apply(kmcfg *cfg, const json_t *v, km_err *err)
{
    uint64_t b;
    if (json_is_integer(v) && json_integer_value(v) > 0)
        b = (uint64_t)json_integer_value(v);
    else if (!json_is_string(v) || kmcfg_parse_size(json_string_value(v), &b))
        return fail(err, "output_cap", "must be a size like \"64K\"");
    if (b < OUTPUT_CAP_MIN || b > OUTPUT_CAP_MAX)
        return fail(err, "output_cap", "must be between 256 bytes and 256M");
    cfg->output_cap = (size_t)b;
    return 0;
}

static json_t *output_cap_json(const kmcfg *cfg)
{
    return json_integer((json_int_t)cfg->output_cap);
}

static int env_apply(kmcfg *cfg, const json_t *v, km_err *err)
{
    return get_env(v, &cfg->env, err);
}

static const kmcfg_special sp_kernels = {kernels_defaults, apply_kernels, kernels_json};
static const kmcfg_special sp_languages = {NULL, languages_apply, languages_json};
static const kmcfg_special sp_memory = {NULL, memory_apply, memory_json};
static const kmcfg_special sp_network = {NULL, network_apply, network_json};
static const kmcfg_special sp_python = {NULL, python_apply, python_json};
static const kmcfg_special sp_output_cap = {output_cap_defaults, output_cap_apply, output_cap_json};
static const kmcfg_special sp_env = {NULL, env_apply, NULL};

/* The strings' validators (a non-empty value). */

static const char *check_token(const char *s)
{
    return strlen(s) < 16 ? "must be at least 16 characters" : NULL;
}

static const char *check_node_id(const char *s)
{
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != strlen(s)
               ? "must be letters, digits and '_' (at most 32: it is the first field of a kernel "
                 "id)"
               : NULL;
}

static const char *check_abspath(const char *s)
{
    return s[0] != '/' ? "must be an absolute path" : NULL;
}

static const char *check_host(const char *s)
{
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") !=
                   strlen(s)
               ? "must be a host name (letters, digits, '-', '.'), without a port"
               : NULL;
}

#define FIELD(f) offsetof(kmcfg, f), sizeof(((kmcfg *)0)->f)
#define MIB (1024.0 * 1024)
#define DAY 86400.0

/* Rows: name, type, field, min, max, default, string default, the enum's
 * words, flags, what 0 means, unit, check, special, help. The order is the
 * docs' and kmcfg_to_json's. */
#define OPT_BOOL(n, f, d, h)                                                                       \
    {                                                                                              \
        n, KMCFG_BOOL, FIELD(f), 0, 1, d, NULL, {NULL, NULL}, 0, NULL, NULL, NULL, NULL, h         \
    }
#define OPT_UINT(n, f, lo, hi, d, fl, z, h)                                                        \
    {                                                                                              \
        n, KMCFG_UINT, FIELD(f), lo, hi, d, NULL, {NULL, NULL}, fl, z, NULL, NULL, NULL, h         \
    }
#define OPT_AUTO(n, f, lo, hi, d, sd, h)                                                           \
    {                                                                                              \
        n, KMCFG_UINT, FIELD(f), lo, hi, d, sd, {NULL, NULL}, KMCFG_F_AUTO, NULL, NULL, NULL,      \
            NULL, h                                                                                \
    }
#define OPT_SECS(n, f, lo, hi, d, fl, z, u, h)                                                     \
    {                                                                                              \
        n, KMCFG_SECONDS, FIELD(f), lo, hi, d, NULL, {NULL, NULL}, fl, z, u, NULL, NULL, h         \
    }
#define OPT_SIZE(n, f, lo, hi, d, h)                                                               \
    {                                                                                              \
        n, KMCFG_SIZE, FIELD(f), lo, hi, d, NULL, {NULL, NULL}, 0, NULL, NULL, NULL, NULL, h       \
    }
#define OPT_STR(n, f, fl, ck, h)                                                                   \
    {                                                                                              \
        n, KMCFG_STRING, FIELD(f), 0, 0, 0, "", {NULL, NULL}, fl, NULL, NULL, ck, NULL, h          \
    }
#define OPT_ENUM(n, f, a, b, h)                                                                    \
    {                                                                                              \
        n, KMCFG_ENUM, FIELD(f), 0, 0, 0, a, {a, b}, 0, NULL, NULL, NULL, NULL, h                  \
    }
#define OPT_SPECIAL(n, sp, fl, d, h)                                                               \
    {                                                                                              \
        n, KMCFG_SPECIAL, 0, 0, 0, 0, 0, d, {NULL, NULL}, fl, NULL, NULL, NULL, sp, h              \
    }

const kmcfg_opt kmcfg_opts[] = {
    OPT_SPECIAL(
        "languages", &sp_languages, 0, "every defined language",
        "languages code may use: names of built-ins (`python`, `bash`) or of languages "
        "`kernels` adds; once given, a language configured later is not allowed unless listed"),
    OPT_SECS("timeout", timeout, 0.001, DAY * 7, 60, 0, NULL, "seconds", "seconds per block"),
    OPT_SECS("interrupt_grace", interrupt_grace, 0, 3600, 5, 0, NULL, "seconds",
             "seconds between interrupt and kill"),
    OPT_SECS("start_timeout", start_timeout, 1, 3600, 60, 0, NULL, "seconds",
             "seconds for a kernel to answer"),
    OPT_SPECIAL("memory", &sp_memory, 0, "`0` (the kernels' 2G)",
                "memory limit per sandbox (a session's, which its kernels share; with "
                "`session_sandbox` false, per kernel) in bytes or \"512M\"/\"2G\"; at "
                "least " KM_MEMORY_MIN_TEXT ", 0 "
                "= the kernels' "
                "default"),
    OPT_SPECIAL("network", &sp_network, 0, "`\"off\"`",
                "network in the sandbox: \"on\", \"off\" (or true/false), or an egress allow-list "
                "`{\"allow\": [\"pypi.org\", \"*.example.com:443\"]}` (also "
                "`\"allow:pypi.org,...\"`): only those hosts, through the filtering proxy; for "
                "API, MCP and HTTP clients it is the widest list a session may ask for"),
    OPT_SPECIAL("python", &sp_python, 0, "detected",
                "absolute path of the Python kernel's interpreter (null: detected)"),
    OPT_ENUM("sandbox", sandbox, "strict", "none", "sandbox level"),
    OPT_BOOL("session_sandbox", session_sandbox, 1,
             "`true`: every kernel of a strict session runs in the session's one sandbox (one "
             "network namespace, `/tmp`, process list and cgroup, whose limits are the "
             "session's); `false`: a sandbox per kernel"),
/* the plain session options' keys (sessopt.def) */
#define KM_SO_DEF_BOOL(n, fl, sf, t, d, ch, ah, lh) OPT_BOOL(#n, n, d, ch),
#define KM_SO_DEF_NUMBER(n, fl, sf, t, lo, hi, z, u, wu, wn, mv, ch, ah, lh)                       \
    OPT_SECS(#n, n, lo, hi, 0, KMCFG_F_NONE, z, u, ch),
#define KM_SO_DEF_SIZE(n, fl, sf, t, lo, hi, d, wu, wn, mv, ch, ah, lh)                            \
    OPT_SIZE(#n, n, lo, hi, d, ch),
#include "kernelmgr/engine/sessopt.def"
#undef KM_SO_DEF_BOOL
#undef KM_SO_DEF_NUMBER
#undef KM_SO_DEF_SIZE
    OPT_UINT("zygote_forks", zygote_forks, 1, 100000, 64, 0, NULL,
             "kernels one zygote forks before a fresh one replaces it (a count; the forks share "
             "its memory layout)"),
    OPT_ENUM(
        "transport", transport, "ipc", "tcp",
        "the kernels' ZeroMQ transport; `tcp` is refused unless `transport_tcp_exposed` is set"),
    OPT_BOOL(
        "transport_tcp_exposed", transport_tcp_exposed, 0,
        "`true`: accept that with `tcp` any local user can read every kernel's output on IOPub "
        "(ZeroMQ PUB has no authentication); said at every start"),
    OPT_UINT("pool", pool, 0, 128, 0, 0, NULL, "warm sessions the daemon keeps ready (a count)"),
    OPT_SECS("idle_timeout", idle_timeout, 0, DAY * 365, 3600, 0, "never", "seconds",
             "seconds before an idle kernel is stopped"),
    OPT_AUTO("max_kernels", max_kernels, 1, 4096, KMCFG_MAX_KERNELS_CAP, "from the fd limit",
             "a safety cap on live kernels (a count) beside `memory_budget`; unset: `min(1024, "
             "RLIMIT_NOFILE / 24)` (a kernel holds about 12 of the daemon's file descriptors, "
             "half of them are left for connections), at least 2"),
    OPT_SIZE("memory_budget", memory_budget, 0, 1ull << 50, 0,
             "bytes the live kernels may use together, measured (their sandboxes' memory "
             "cgroups, else their processes' resident anonymous memory): a kernel starts while "
             "that plus 64M for it fits, else the least recently used session not running code "
             "is stopped; 0: MemTotal less max(MemTotal / 8, min(1G, MemTotal / 2)) for the "
             "rest of the host"),
    OPT_SPECIAL("output_cap", &sp_output_cap, 0, "`\"64K\"`",
                "bytes kept per stream per block, 256 bytes to 256M"),
    OPT_UINT("files_max", files_max, 0, 100000, 100, KMCFG_F_TRUNC, NULL,
             "file changes listed per block (a count)"),
    OPT_UINT("files_scan_max", files_scan_max, 1, 10000000, 50000, KMCFG_F_TRUNC, NULL,
             "workspace entries a file report walks (a count)"),
    /* at most 32M: a listing of that much must fit in one API reply; 16M:
     * 50000 entries of 200-byte paths, so a workspace normal by count is
     * never cut by bytes */
    OPT_SIZE("files_scan_bytes", files_scan_bytes, 64 * 1024, 32 * MIB, 16 * MIB,
             "bytes a walk of a workspace (a block's file report, `files.list`) may hold: every "
             "entry's path + link text + 128; past it the walk stops and the result says so "
             "(`truncated.files`)"),
    OPT_UINT("outputs_keep_runs", outputs_keep_runs, 0, 100000, 20, 0, NULL,
             "outputs of finished `run`s kept (a count)"),
    OPT_SECS("outputs_max_age", outputs_max_age, 0, DAY * 3650, DAY * 7, 0, "no age limit",
             "seconds", "seconds a finished `run`'s outputs are kept (7 days)"),
    OPT_SIZE("spill_max", spill_max, 0, 1ull << 40, 64 * MIB,
             "bytes of a spill file per stream per block"),
    OPT_SIZE("display_max", display_max, 0, 1ull << 30, 16 * MIB,
             "bytes of rich outputs kept per block (`clear_output` does not reset it)"),
    OPT_SIZE("session_outputs_max", session_outputs_max, 0, 1ull << 44, 512 * MIB,
             "bytes of spill files + saved images per session"),
    OPT_SIZE("kernel_log_max", kernel_log_max, 4096, 1ull << 40, MIB,
             "bytes of each kernel log file"),
    OPT_SIZE("history_max", history_max, 4096, 1ull << 40, 8 * MIB, "bytes of each history file"),
    OPT_SIZE("import_max_bytes", import_max_bytes, 64 * 1024, 1ull << 44, 1024 * MIB,
             "bytes of a session archive `session.import` accepts (its entries' data, and the "
             "archive itself); a larger one is refused before anything is written"),
    OPT_UINT("import_max_entries", import_max_entries, 16, 10000000, 100000, 0, NULL,
             "entries (files and directories) of a session archive `session.import` accepts "
             "(a count)"),
    OPT_SECS("snapshot_interval", snapshot_interval, 0, DAY * 365, 0, 0, "off", "seconds",
             "seconds of cell time after which a session's state is snapshotted again, so a "
             "kernel crash restores it"),
    OPT_SPECIAL("env", &sp_env, KMCFG_F_SECRET, "`{}`",
                "`{\"NAME\": \"value\"}` for the code of every session (64 variables, 32 KiB per "
                "value, 256 KiB in all)"),
    OPT_SIZE("code_max", code_max, 1024, 32 * MIB, 16 * MIB, "bytes of code per request"),
    OPT_UINT("daemon_workers", daemon_workers, 0, 1024, 0, 0, "2 × cores + 32",
             "the daemon's worker threads (a count)"),
    OPT_UINT("daemon_queue", daemon_queue, 1, 1000000, 4096, 0, NULL,
             "requests waiting for a worker before \"the daemon is busy\" (a count)"),
    OPT_SIZE("client_buffer", client_buffer, 65536, 1ull << 32, 8 * MIB,
             "bytes of unsent output per connection"),
    OPT_SECS("client_timeout", client_timeout, 0.1, DAY, 10, 0, NULL, "seconds",
             "seconds a client may take no output before it is dropped"),
    OPT_SECS("admission_timeout", admission_timeout, 0, DAY, 300, 0, NULL, "seconds",
             "seconds a kernel start waits for room under `max_kernels` and `memory_budget`"),
    OPT_SPECIAL(
        "kernels", &sp_kernels, KMCFG_F_FIRST, "`{}`",
        "per language: a Jupyter kernelspec (`\"python\": \"python3\"`; null: back to ours) "
        "or a new language (`\"sh\": {\"backend\": \"kernel-bash\"}`); see \"Adding a "
        "language\""),
    OPT_STR("http", http, 0, NULL,
            "`\"[ADDR:]PORT\"`: the daemon also serves the Jupyter gateway (ADDR 127.0.0.1 by "
            "default; port 0 = any free one)"),
    OPT_STR("http_token", http_token, KMCFG_F_SECRET, check_token,
            "the gateway's token, at least 16 characters (unset: generated into "
            "`$KERNELMGR_HOME/http-token`; `$KERNELMGR_HTTP_TOKEN` wins over it, docs/GATEWAY.md)"),
    OPT_STR("http_token_file", http_token_file, 0, check_abspath,
            "a file holding the gateway's token (an absolute path: a regular file of this user's, "
            "mode 0600 or stricter, at most 4 KiB, its first line); used when neither "
            "`$KERNELMGR_HTTP_TOKEN` nor `http_token` is set"),
    OPT_STR("http_tls_cert", http_tls_cert, 0, check_abspath,
            "PEM certificate file (an absolute path), with `http_tls_key`: serve HTTPS"),
    OPT_STR("http_tls_key", http_tls_key, 0, check_abspath, "PEM key file (an absolute path)"),
    OPT_BOOL("http_insecure", http_insecure, 0, "allow a non-loopback address without TLS"),
    OPT_BOOL("http_allow_unsafe_session_options", http_allow_unsafe, 0,
             "let the API over HTTP create sessions with `sandbox: \"none\"`, `network: \"on\"`, "
             "`python` or `workspace` (not above the `memory`, `cpus`, `cpu_time` ceilings)"),
    OPT_STR("http_origin", http_origin, 0, NULL,
            "an Origin allowed for WebSocket upgrades besides the Host's own"),
    OPT_SIZE("http_max_body", http_max_body, 1024, 1ull << 30, MIB, "bytes of a request body"),
    OPT_SIZE("http_max_message", http_max_message, 4096, 1ull << 31, 64 * MIB,
             "bytes of a WebSocket message from a client"),
    OPT_SIZE("http_max_pending", http_max_pending, 65536, 1ull << 34, 64 * MIB,
             "bytes a client may leave unread before it is cut"),
    OPT_UINT("http_max_connections", http_max_connections, 1, 65536, 64, 0, NULL,
             "WebSockets at once (a count)"),
    OPT_SECS("http_rate", http_rate, 1, 1e6, 500, 0, NULL, "per second",
             "messages + requests per second per connection (bursts of twice that)"),
    OPT_UINT("http_max_unauth_per_peer", http_max_unauth_per_peer, 1, 65536, 16, 0, NULL,
             "connections without the token from one IP address (a count); more are closed at "
             "accept (503 naming the bound on plain HTTP); behind a reverse proxy every client is "
             "the proxy's address"),
    OPT_UINT("http_max_unauth", http_max_unauth, 1, 65536, 256, 0, NULL,
             "connections without the token from all peers at once (a count); the gateway's "
             "connections of every kind are also bounded by half of `RLIMIT_NOFILE`"),
    OPT_UINT("http_header_timeout", http_header_timeout, 1, 600, 10, 0, NULL,
             "seconds for a request's line and headers to arrive (also the TLS handshake and each "
             "chunk of a body)"),
    OPT_STR("http_host", http_host, 0, check_host,
            "a DNS name the gateway answers to besides its listen address (and `localhost` on "
            "loopback); other names get 403 (DNS rebinding)"),
    OPT_STR("node_id", node_id, 0, check_node_id,
            "this daemon's name behind a balancer (letters, digits, `_`; at most 32): the first "
            "field of its kernel ids, named in its errors; over HTTP `exec` then defaults to "
            "`create: false` (docs/MANY_MACHINES.md)"),
    {NULL, 0, 0, 0, 0, 0, 0, NULL, {NULL, NULL}, 0, NULL, NULL, NULL, NULL, NULL},
};
#undef OPT_BOOL
#undef OPT_UINT
#undef OPT_SECS
#undef OPT_SIZE
#undef OPT_STR
#undef OPT_ENUM
#undef OPT_SPECIAL

const kmcfg_opt *kmcfg_opt_find(const char *name)
{
    for (const kmcfg_opt *o = kmcfg_opts; name && o->name; o++)
        if (!strcmp(o->name, name))
            return o;
    return NULL;
}

#define AT(cfg, o, T) ((T *)(void *)((char *)(cfg) + (o)->off))
#define AT_C(cfg, o, T) ((const T *)(const void *)((const char *)(cfg) + (o)->off))

void kmcfg_defaults(kmcfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++) {
        switch (o->type) {
        case KMCFG_BOOL:
            *AT(cfg, o, int) = o->def != 0;
            break;
        case KMCFG_UINT:
            *AT(cfg, o, unsigned) = (unsigned)o->def;
            break;
        case KMCFG_SECONDS:
            *AT(cfg, o, double) = o->def;
            break;
        case KMCFG_SIZE:
            *AT(cfg, o, uint64_t) = (uint64_t)o->def;
            break;
        case KMCFG_STRING:
        case KMCFG_ENUM:
            snprintf(AT(cfg, o, char), o->size, "%s", o->sdef);
            break;
        case KMCFG_SPECIAL:
            if (o->special->defaults)
                o->special->defaults(cfg);
            break;
        }
    }
    /* the one derived default: max_kernels follows the fd limit until given */
    cfg->max_kernels = kmcfg_auto_max_kernels();
    cfg->max_kernels_auto = 1;
}

/* One key's value v (borrowed) into cfg by its row. */
static int apply_one(kmcfg *cfg, const kmcfg_opt *o, const json_t *v, km_err *err)
{
    const char *key = o->name;
    double d = 0;
    switch (o->type) {
    case KMCFG_BOOL:
        if (!json_is_boolean(v))
            return fail(err, key, "must be true or false");
        *AT(cfg, o, int) = json_is_true(v);
        return 0;
    case KMCFG_UINT:
        if (o->flags & KMCFG_F_TRUNC) {
            if (get_number(v, key, o->min, o->max, &d, err))
                return -1;
            *AT(cfg, o, unsigned) = (unsigned)d;
        } else if (get_count(v, key, o->min, o->max, AT(cfg, o, unsigned), err)) {
            return -1;
        }
        if (o->flags & KMCFG_F_AUTO)
            cfg->max_kernels_auto = 0;
        return 0;
    case KMCFG_SECONDS:
        if (!(o->flags & KMCFG_F_NONE))
            return get_number(v, key, o->min, o->max, AT(cfg, o, double), err);
        /* 0 or null: none; else in [min, max] */
        if (json_is_null(v)) {
            *AT(cfg, o, double) = 0;
            return 0;
        }
        if (get_number(v, key, 0, o->max, &d, err))
            return -1;
        *AT(cfg, o, double) = d;
        if (d > 0 && d < o->min)
            return fail(err, key, "must be 0 (%s) or at least %g %s (got %g)", o->zero, o->min,
                        o->unit, d);
        return 0;
    case KMCFG_SIZE:
        return get_size(v, key, (uint64_t)o->min, (uint64_t)o->max, AT(cfg, o, uint64_t), err);
    case KMCFG_STRING: {
        char *dst = AT(cfg, o, char);
        if (json_is_null(v))
            dst[0] = 0;
        else if (!json_is_string(v) || json_string_length(v) >= o->size ||
                 strlen(json_string_value(v)) != json_string_length(v))
            return fail(err, key, "must be a string of at most %zu bytes", o->size - 1);
        else
            snprintf(dst, o->size, "%s", json_string_value(v));
        const char *why = dst[0] && o->check ? o->check(dst) : NULL;
        return why ? fail(err, key, "%s", why) : 0;
    }
    case KMCFG_ENUM:
        return get_choice(v, key, o->values[0], o->values[1], AT(cfg, o, char), o->size, err);
    case KMCFG_SPECIAL:
        return o->special->apply(cfg, v, err);
    }
    return fail(err, key, "unknown key");
}

int kmcfg_apply_json(kmcfg *cfg, const json_t *obj, km_err *err)
{
    if (!json_is_object(obj))
        return fail(err, "(top level)", "must be a JSON object");
    /* "kernels" first, so that "languages" may name what it defines */
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++) {
        const json_t *v = (o->flags & KMCFG_F_FIRST) ? json_object_get(obj, o->name) : NULL;
        if (v && apply_one(cfg, o, v, err))
            return -1;
    }
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        const kmcfg_opt *o = kmcfg_opt_find(key);
        if (!o)
            return fail(err, key, "unknown key");
        if (!(o->flags & KMCFG_F_FIRST) && apply_one(cfg, o, v, err))
            return -1;
    }
    /* ZeroMQ tcp cannot be made private to the kernels' owner (no CURVE in
     * Jupyter clients or connection files): the operator must say so */
    if (!strcmp(cfg->transport, "tcp") && !cfg->transport_tcp_exposed)
        return fail(err, "transport",
                    "\"tcp\": %s; set \"transport_tcp_exposed\": true to accept that, or use "
                    "\"ipc\"",
                    JP_TCP_EXPOSURE);
    return 0;
}

int kmcfg_load_file(kmcfg *cfg, const char *path, unsigned flags, km_err *err)
{
    /* the home's config.json names the interpreter the manager runs: it is
     * read only when it is this user's own (cm_read_regular, CM_RR_OWNED) */
    char *data = NULL;
    size_t len = 0;
    const char *why_rr;
    if (cm_read_regular(path, KMCFG_FILE_MAX, (flags & KMCFG_HOME_FILE) ? CM_RR_OWNED : 0, &data,
                        &len, &why_rr)) {
        if (errno == ENOENT && !(flags & KMCFG_MUST_EXIST))
            return 0;
        km_err_set(err, KM_EUSAGE, "%s %s%s", path, why_rr,
                   errno == EPERM ? " (the home's config.json must be the user's own, like the "
                                    "home: fix it or remove it)"
                                  : "");
        return -1;
    }
    json_error_t jerr;
    json_t *obj = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
    free(data);
    if (!obj) {
        km_err_set(err, KM_EUSAGE, "%s: invalid JSON at line %d, column %d", path, jerr.line,
                   jerr.column);
        return -1;
    }
    km_err why = {0};
    int rc = kmcfg_apply_json(cfg, obj, &why);
    json_decref(obj);
    if (rc)
        km_err_set(err, KM_EUSAGE, "%s: %s", path, why.msg);
    return rc;
}

const char *kmcfg_home(char *buf, size_t len)
{
    const char *h = getenv("KERNELMGR_HOME");
    const char *x = getenv("XDG_STATE_HOME");
    int n;
    if (h && *h)
        n = snprintf(buf, len, "%s", h);
    else if (x && *x)
        n = snprintf(buf, len, "%s/kernelmgr", x);
    else
        n = snprintf(buf, len, "%s/.local/state/kernelmgr",
                     getenv("HOME") ? getenv("HOME") : "/tmp");
    if (n < 0 || (size_t)n >= len) {
        if (len)
            buf[0] = 0;
        return NULL;
    }
    return buf;
}

json_t *kmcfg_to_json(const kmcfg *cfg)
{
    json_t *obj = json_object();
    for (const kmcfg_opt *o = kmcfg_opts; obj && o->name; o++) {
        json_t *v = NULL;
        if (o->flags & KMCFG_F_SECRET)
            continue;
        switch (o->type) {
        case KMCFG_BOOL:
            v = json_boolean(*AT_C(cfg, o, int));
            break;
        case KMCFG_UINT:
            v = json_integer(*AT_C(cfg, o, unsigned));
            break;
        case KMCFG_SECONDS: {
            double d = *AT_C(cfg, o, double);
            v = (o->flags & KMCFG_F_NONE) && !(d > 0) ? json_null() : json_real(d);
            break;
        }
        case KMCFG_SIZE:
            v = json_integer((json_int_t)*AT_C(cfg, o, uint64_t));
            break;
        case KMCFG_STRING: {
            const char *s = AT_C(cfg, o, char);
            v = s[0] ? json_string(s) : json_null();
            break;
        }
        case KMCFG_ENUM:
            v = json_string(AT_C(cfg, o, char));
            break;
        case KMCFG_SPECIAL:
            v = o->special->to_json ? o->special->to_json(cfg) : NULL;
            break;
        }
        if (v && json_object_set_new(obj, o->name, v)) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

/* "64M", "1K", or bytes: the shortest exact form, for the docs. */
static const char *doc_size(uint64_t b, char *buf, size_t n)
{
    static const char units[] = "TGMK";
    for (int i = 0; i < 4; i++) {
        uint64_t u = 1ull << (10 * (4 - i));
        if (b >= u && b % u == 0) {
            snprintf(buf, n, "%llu%c", (unsigned long long)(b / u), units[i]);
            return buf;
        }
    }
    snprintf(buf, n, "%llu", (unsigned long long)b);
    return buf;
}

const char *kmcfg_doc_default(const kmcfg_opt *o, char *buf, size_t n)
{
    char a[32];
    switch (o->type) {
    case KMCFG_BOOL:
        snprintf(buf, n, "`%s`", o->def ? "true" : "false");
        break;
    case KMCFG_UINT:
    case KMCFG_SECONDS:
        if (o->flags & KMCFG_F_AUTO)
            snprintf(buf, n, "%s", o->sdef);
        else if ((o->flags & KMCFG_F_NONE) && o->def == 0)
            snprintf(buf, n, "`null` (%s)", o->zero);
        else if (o->def == 0 && o->zero)
            snprintf(buf, n, "0 (%s)", o->zero);
        else
            snprintf(buf, n, "%.10g", o->def);
        break;
    case KMCFG_SIZE:
        snprintf(buf, n, "`\"%s\"`", doc_size((uint64_t)o->def, a, sizeof a));
        break;
    case KMCFG_STRING:
        snprintf(buf, n, "`null`");
        break;
    case KMCFG_ENUM:
        snprintf(buf, n, "`\"%s\"`", o->sdef);
        break;
    case KMCFG_SPECIAL:
        snprintf(buf, n, "%s", o->sdef);
        break;
    }
    return buf;
}

/* "`KEY` | default | help (range)" of one row into buf. */
static void doc_row(const kmcfg_opt *o, char *buf, size_t n)
{
    char def[96], range[128] = "", a[32], b[32];
    kmcfg_doc_default(o, def, sizeof def);
    switch (o->type) {
    case KMCFG_UINT:
    case KMCFG_SECONDS:
        snprintf(range, sizeof range, " (%s%.10g–%.10g%s%s%s%s)",
                 (o->flags & KMCFG_F_NONE) ? "0 or " : "", o->min, o->max,
                 o->type == KMCFG_SECONDS && o->unit ? " " : "",
                 o->type == KMCFG_SECONDS && o->unit ? o->unit : "",
                 o->zero && !(o->flags & KMCFG_F_NONE) && o->def != 0 ? "; 0: " : "",
                 o->zero && !(o->flags & KMCFG_F_NONE) && o->def != 0 ? o->zero : "");
        break;
    case KMCFG_SIZE:
        snprintf(range, sizeof range, " (%s–%s)", doc_size((uint64_t)o->min, a, sizeof a),
                 doc_size((uint64_t)o->max, b, sizeof b));
        break;
    case KMCFG_STRING:
        snprintf(range, sizeof range, " (at most %zu bytes)", o->size - 1);
        break;
    case KMCFG_ENUM:
        snprintf(range, sizeof range, " (`%s` or `%s`)", o->values[0], o->values[1]);
        break;
    case KMCFG_BOOL:
    case KMCFG_SPECIAL:
        break;
    }
    snprintf(buf, n, "| `%s` | %s | %s%s |", o->name, def, o->help, range);
}

int kmcfg_doc(FILE *f)
{
    char line[2048];
    int bad = fprintf(f, "| key | default | meaning |\n| --- | --- | --- |\n") < 0;
    for (const kmcfg_opt *o = kmcfg_opts; o->name; o++) {
        doc_row(o, line, sizeof line);
        bad |= fprintf(f, "%s\n", line) < 0;
    }
    return bad || ferror(f) ? -1 : 0;
}
