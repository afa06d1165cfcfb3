/*
 * config.c — defaults, JSON configuration and its validation.
 */
#include "kernelmgr/engine/config.h"
#include "common/cm_io.h"
#include "common/cm_size.h"
#include "kernels/server/kenv.h"
#include "protocol/jp.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

unsigned kmcfg_auto_max_kernels(uint64_t memory)
{
    /* each kernel may use its memory limit plus the kernel server, the
     * sandbox and the manager's share (about 256 MiB) */
    uint64_t per = (memory ? memory : 2ull << 30) + (256ull << 20);
    uint64_t total = 0;
    FILE *f = fopen("/proc/meminfo", "re");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) {
                total = (uint64_t)kb * 1024;
                break;
            }
        fclose(f);
    }
    if (!total)
        return 32;
    uint64_t n = total / per;
    return n < 2 ? 2 : n > 32 ? 32 : (unsigned)n;
}

void kmcfg_defaults(kmcfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    km_langs_builtin(&cfg->langs);
    for (int i = 0; i < cfg->langs.n; i++)
        cfg->allow[i] = 1;
    cfg->timeout = 60;
    cfg->interrupt_grace = 5;
    cfg->start_timeout = 60;
    cfg->network = 0;
    snprintf(cfg->sandbox, sizeof cfg->sandbox, "strict");
    snprintf(cfg->transport, sizeof cfg->transport, "ipc");
    cfg->pool = 0;
    cfg->idle_timeout = 3600;
    cfg->max_kernels = kmcfg_auto_max_kernels(0);
    cfg->max_kernels_auto = 1;
    cfg->daemon_workers = 0;
    cfg->daemon_queue = 4096;
    cfg->client_buffer = 8ull << 20;
    cfg->client_timeout = 10;
    cfg->http_max_body = 1u << 20;
    cfg->http_max_message = 64u << 20;
    cfg->http_max_pending = 64u << 20;
    cfg->http_max_connections = 64;
    cfg->http_rate = 500;
    cfg->http_max_unauth_per_peer = 16;
    cfg->http_max_unauth = 256;
    cfg->http_header_timeout = 10;
    cfg->admission_timeout = 300;
    cfg->output_cap = 64 * 1024;
    cfg->files_max = 100;
    cfg->files_scan_max = 50000;
    /* 50000 entries of 200-byte paths: a workspace that is normal by count
     * is never cut by bytes; deep long-named trees are */
    cfg->files_scan_bytes = 16ull << 20;
    cfg->outputs_keep_runs = 20;
    cfg->outputs_max_age = 7 * 86400;
    cfg->spill_max = 64ull << 20;
    cfg->display_max = 16ull << 20;
    cfg->session_outputs_max = 512ull << 20;
    cfg->kernel_log_max = 1ull << 20;
    cfg->history_max = 8ull << 20;
    cfg->code_max = 16ull << 20;
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

static int fail(char *err, size_t errlen, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *err, size_t errlen, const char *key, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(err, errlen, "%s: %s", key, why);
    return -1;
}

static int get_number(const json_t *v, const char *key, double lo, double hi, double *out,
                      char *err, size_t errlen)
{
    if (!json_is_number(v))
        return fail(err, errlen, key, "must be a number");
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return fail(err, errlen, key, "must be between %g and %g (got %g)", lo, hi, d);
    *out = d;
    return 0;
}

static int get_string(const json_t *v, const char *key, char *out, size_t size, char *err,
                      size_t errlen)
{
    if (!json_is_string(v))
        return fail(err, errlen, key, "must be a string");
    if (json_string_length(v) >= size)
        return fail(err, errlen, key, "too long (max %zu bytes)", size - 1);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return fail(err, errlen, key, "contains a NUL byte");
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

/* get_number() for a whole number. */
static int get_count(const json_t *v, const char *key, double lo, double hi, unsigned *out,
                     char *err, size_t errlen)
{
    double d = 0;
    if (get_number(v, key, lo, hi, &d, err, errlen))
        return -1;
    if (d != floor(d))
        return fail(err, errlen, key, "must be an integer");
    *out = (unsigned)d;
    return 0;
}

/* get_string() for one of two words; out (size bytes, at most 16) is left
 * alone unless the value is a or b. */
static int get_choice(const json_t *v, const char *key, const char *a, const char *b, char *out,
                      size_t size, char *err, size_t errlen)
{
    char s[16];
    if (get_string(v, key, s, size < sizeof s ? size : sizeof s, err, errlen))
        return -1;
    if (strcmp(s, a) && strcmp(s, b))
        return fail(err, errlen, key, "must be \"%s\" or \"%s\"", a, b);
    snprintf(out, size, "%s", s);
    return 0;
}

/* A size limit: an integer (bytes) or a string like "64M", between lo and hi. */
static int get_size(const json_t *v, const char *key, uint64_t lo, uint64_t hi, uint64_t *out,
                    char *err, size_t errlen)
{
    uint64_t b = 0;
    if (json_is_integer(v) && json_integer_value(v) >= 0)
        b = (uint64_t)json_integer_value(v);
    else if (!json_is_string(v) || kmcfg_parse_size(json_string_value(v), &b))
        return fail(err, errlen, key, "must be a size like \"64M\" or a number of bytes");
    if (b < lo || b > hi)
        return fail(err, errlen, key, "must be between %llu and %llu bytes (got %llu)",
                    (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)b);
    *out = b;
    return 0;
}

/* "env": an object of string values, checked by the rules of kenv.h. */
static int get_env(const json_t *v, json_t **out, char *err, size_t errlen)
{
    char why[300];
    if (kenv_check_object(NULL, "env", v, why, sizeof why))
        return fail(err, errlen, "env", "%s", why + (strncmp(why, "env: ", 5) ? 4 : 5));
    json_t *copy = json_deep_copy(v);
    if (!copy)
        return fail(err, errlen, "env", "out of memory");
    json_decref(*out);
    *out = copy;
    return 0;
}

/* "kernels" (lang.h), applied before "languages" so that the allow list may
 * name a language the same file defines. A language keeps whether it is
 * allowed; a new one is allowed unless "languages" was given. */
static int apply_kernels(kmcfg *cfg, const json_t *v, char *err, size_t errlen)
{
    if (!json_is_object(v))
        return fail(err, errlen, "kernels",
                    "must be an object like {\"python\": \"KERNELSPEC\"} or {\"NAME\": "
                    "{\"backend\": \"kernel-bash\"}}");
    km_langs old = cfg->langs;
    int old_allow[KM_LANG_MAX];
    memcpy(old_allow, cfg->allow, sizeof old_allow);
    const char *lk;
    json_t *lv;
    json_object_foreach((json_t *)v, lk, lv)
    {
        if (km_langs_configure(&cfg->langs, lk, lv, err, errlen) < 0) {
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

int kmcfg_apply_json(kmcfg *cfg, const json_t *obj, char *err, size_t errlen)
{
    if (!json_is_object(obj))
        return fail(err, errlen, "(top level)", "must be a JSON object");
    const json_t *kernels = json_object_get(obj, "kernels");
    if (kernels && apply_kernels(cfg, kernels, err, errlen))
        return -1;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        double d;
        if (!strcmp(key, "languages")) {
            char known[400];
            km_langs_names(&cfg->langs, known, sizeof known);
            if (!json_is_array(v))
                return fail(err, errlen, key, "must be an array of language names (%s)", known);
            int allow[KM_LANG_MAX] = {0};
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e)
            {
                int li = json_is_string(e) ? kmcfg_lang_index(cfg, json_string_value(e)) : -1;
                if (li < 0)
                    return fail(err, errlen, key, "unknown language at index %zu (allowed: %s)", i,
                                known);
                allow[li] = 1;
            }
            memcpy(cfg->allow, allow, sizeof allow);
            cfg->languages_set = 1;
        } else if (!strcmp(key, "timeout")) {
            if (get_number(v, key, 0.001, 86400 * 7, &cfg->timeout, err, errlen))
                return -1;
        } else if (!strcmp(key, "interrupt_grace")) {
            if (get_number(v, key, 0, 3600, &cfg->interrupt_grace, err, errlen))
                return -1;
        } else if (!strcmp(key, "start_timeout")) {
            if (get_number(v, key, 1, 3600, &cfg->start_timeout, err, errlen))
                return -1;
        } else if (!strcmp(key, "memory")) {
            uint64_t b;
            if (json_is_integer(v) && json_integer_value(v) >= 0) {
                cfg->memory = (uint64_t)json_integer_value(v);
            } else if (json_is_string(v) && !kmcfg_parse_size(json_string_value(v), &b)) {
                cfg->memory = b;
            } else {
                return fail(err, errlen, key, "must be a size like \"512M\" or \"2G\"");
            }
            if (cfg->memory && cfg->memory < 16u << 20)
                return fail(err, errlen, key, "must be at least 16M");
        } else if (!strcmp(key, "cpus")) {
            /* 0 or null: no rate cap; else the kernels' --cpus range */
            if (json_is_null(v))
                cfg->cpus = 0;
            else if (get_number(v, key, 0, 4096, &cfg->cpus, err, errlen))
                return -1;
            else if (cfg->cpus > 0 && cfg->cpus < 0.01)
                return fail(err, errlen, key, "must be 0 (no cap) or at least 0.01 CPUs (got %g)",
                            cfg->cpus);
        } else if (!strcmp(key, "cpu_time")) {
            /* 0 or null: no CPU-time budget per block */
            if (json_is_null(v))
                cfg->cpu_time = 0;
            else if (get_number(v, key, 0, 86400.0 * 365, &cfg->cpu_time, err, errlen))
                return -1;
            else if (cfg->cpu_time > 0 && cfg->cpu_time < 0.001)
                return fail(err, errlen, key,
                            "must be 0 (no budget) or at least 0.001 seconds (got %g)",
                            cfg->cpu_time);
        } else if (!strcmp(key, "network")) {
            if (json_is_boolean(v)) {
                cfg->network = json_is_true(v);
            } else if (json_is_string(v) && (!strcmp(json_string_value(v), "on") ||
                                             !strcmp(json_string_value(v), "off"))) {
                cfg->network = !strcmp(json_string_value(v), "on");
            } else {
                return fail(err, errlen, key, "must be \"on\" or \"off\"");
            }
        } else if (!strcmp(key, "python")) {
            if (json_is_null(v)) {
                cfg->python[0] = 0;
                continue;
            }
            if (get_string(v, key, cfg->python, sizeof cfg->python, err, errlen))
                return -1;
            if (cfg->python[0] && cfg->python[0] != '/')
                return fail(err, errlen, key, "must be an absolute path");
        } else if (!strcmp(key, "sandbox")) {
            if (get_choice(v, key, "strict", "none", cfg->sandbox, sizeof cfg->sandbox, err,
                           errlen))
                return -1;
        } else if (!strcmp(key, "transport")) {
            if (get_choice(v, key, "ipc", "tcp", cfg->transport, sizeof cfg->transport, err,
                           errlen))
                return -1;
        } else if (!strcmp(key, "transport_tcp_exposed")) {
            if (!json_is_boolean(v))
                return fail(err, errlen, key, "must be true or false");
            cfg->transport_tcp_exposed = json_is_true(v);
        } else if (!strcmp(key, "pool")) {
            if (get_count(v, key, 0, 64, &cfg->pool, err, errlen))
                return -1;
        } else if (!strcmp(key, "idle_timeout")) {
            if (get_number(v, key, 0, 86400 * 365, &cfg->idle_timeout, err, errlen))
                return -1;
        } else if (!strcmp(key, "max_kernels")) {
            if (get_count(v, key, 1, 4096, &cfg->max_kernels, err, errlen))
                return -1;
            cfg->max_kernels_auto = 0;
        } else if (!strcmp(key, "daemon_workers")) {
            if (get_count(v, key, 0, 1024, &cfg->daemon_workers, err, errlen))
                return -1;
        } else if (!strcmp(key, "daemon_queue")) {
            if (get_count(v, key, 1, 1000000, &cfg->daemon_queue, err, errlen))
                return -1;
        } else if (!strcmp(key, "client_buffer")) {
            if (get_size(v, key, 65536, 1ull << 32, &cfg->client_buffer, err, errlen))
                return -1;
        } else if (!strcmp(key, "client_timeout")) {
            if (get_number(v, key, 0.1, 86400, &cfg->client_timeout, err, errlen))
                return -1;
        } else if (!strcmp(key, "admission_timeout")) {
            if (get_number(v, key, 0, 86400, &cfg->admission_timeout, err, errlen))
                return -1;
        } else if (!strcmp(key, "output_cap")) {
            uint64_t b;
            if (json_is_integer(v) && json_integer_value(v) > 0) {
                b = (uint64_t)json_integer_value(v);
            } else if (!json_is_string(v) || kmcfg_parse_size(json_string_value(v), &b)) {
                return fail(err, errlen, key, "must be a size like \"64K\"");
            }
            if (b < 256 || b > (256u << 20))
                return fail(err, errlen, key, "must be between 256 bytes and 256M");
            cfg->output_cap = (size_t)b;
        } else if (!strcmp(key, "files_max")) {
            if (get_number(v, key, 0, 100000, &d, err, errlen))
                return -1;
            cfg->files_max = (unsigned)d;
        } else if (!strcmp(key, "files_scan_max")) {
            if (get_number(v, key, 1, 10000000, &d, err, errlen))
                return -1;
            cfg->files_scan_max = (unsigned)d;
        } else if (!strcmp(key, "files_scan_bytes")) {
            /* at most 32M: a listing of that much must fit in one API reply */
            if (get_size(v, key, 64 * 1024, 32ull << 20, &cfg->files_scan_bytes, err, errlen))
                return -1;
        } else if (!strcmp(key, "outputs_keep_runs")) {
            if (get_count(v, key, 0, 100000, &cfg->outputs_keep_runs, err, errlen))
                return -1;
        } else if (!strcmp(key, "outputs_max_age")) {
            if (get_number(v, key, 0, 86400.0 * 3650, &cfg->outputs_max_age, err, errlen))
                return -1;
        } else if (!strcmp(key, "spill_max")) {
            if (get_size(v, key, 0, 1ull << 40, &cfg->spill_max, err, errlen))
                return -1;
        } else if (!strcmp(key, "display_max")) {
            if (get_size(v, key, 0, 1ull << 30, &cfg->display_max, err, errlen))
                return -1;
        } else if (!strcmp(key, "session_outputs_max")) {
            if (get_size(v, key, 0, 1ull << 44, &cfg->session_outputs_max, err, errlen))
                return -1;
        } else if (!strcmp(key, "kernel_log_max")) {
            if (get_size(v, key, 4096, 1ull << 40, &cfg->kernel_log_max, err, errlen))
                return -1;
        } else if (!strcmp(key, "history_max")) {
            if (get_size(v, key, 4096, 1ull << 40, &cfg->history_max, err, errlen))
                return -1;
        } else if (!strcmp(key, "code_max")) {
            if (get_size(v, key, 1024, 32ull << 20, &cfg->code_max, err, errlen))
                return -1;
        } else if (!strcmp(key, "http") || !strcmp(key, "http_token") ||
                   !strcmp(key, "http_tls_cert") || !strcmp(key, "http_tls_key") ||
                   !strcmp(key, "http_origin") || !strcmp(key, "http_host")) {
            char *dst = !strcmp(key, "http")            ? cfg->http
                        : !strcmp(key, "http_token")    ? cfg->http_token
                        : !strcmp(key, "http_tls_cert") ? cfg->http_tls_cert
                        : !strcmp(key, "http_tls_key")  ? cfg->http_tls_key
                        : !strcmp(key, "http_host")     ? cfg->http_host
                                                        : cfg->http_origin;
            size_t cap = !strcmp(key, "http")            ? sizeof cfg->http
                         : !strcmp(key, "http_token")    ? sizeof cfg->http_token
                         : !strcmp(key, "http_tls_cert") ? sizeof cfg->http_tls_cert
                         : !strcmp(key, "http_tls_key")  ? sizeof cfg->http_tls_key
                         : !strcmp(key, "http_host")     ? sizeof cfg->http_host
                                                         : sizeof cfg->http_origin;
            if (json_is_null(v)) {
                dst[0] = 0;
            } else if (!json_is_string(v) || json_string_length(v) >= cap ||
                       strlen(json_string_value(v)) != json_string_length(v)) {
                return fail(err, errlen, key, "must be a string of at most %zu bytes", cap - 1);
            } else {
                snprintf(dst, cap, "%s", json_string_value(v));
            }
            if (!strcmp(key, "http_token") && dst[0] && strlen(dst) < 16)
                return fail(err, errlen, key, "must be at least 16 characters");
            if ((!strcmp(key, "http_tls_cert") || !strcmp(key, "http_tls_key")) && dst[0] &&
                dst[0] != '/')
                return fail(err, errlen, key, "must be an absolute path");
            if (!strcmp(key, "http_host") && dst[0] &&
                strspn(dst, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") !=
                    strlen(dst))
                return fail(err, errlen, key,
                            "must be a host name (letters, digits, '-', '.'), without a port");
        } else if (!strcmp(key, "http_insecure")) {
            if (!json_is_boolean(v))
                return fail(err, errlen, key, "must be true or false");
            cfg->http_insecure = json_is_true(v);
        } else if (!strcmp(key, "http_allow_unsafe_session_options")) {
            if (!json_is_boolean(v))
                return fail(err, errlen, key, "must be true or false");
            cfg->http_allow_unsafe = json_is_true(v);
        } else if (!strcmp(key, "http_max_body")) {
            if (get_size(v, key, 1024, 1ull << 30, &cfg->http_max_body, err, errlen))
                return -1;
        } else if (!strcmp(key, "http_max_message")) {
            if (get_size(v, key, 4096, 1ull << 31, &cfg->http_max_message, err, errlen))
                return -1;
        } else if (!strcmp(key, "http_max_pending")) {
            if (get_size(v, key, 65536, 1ull << 34, &cfg->http_max_pending, err, errlen))
                return -1;
        } else if (!strcmp(key, "http_max_connections")) {
            if (get_count(v, key, 1, 65536, &cfg->http_max_connections, err, errlen))
                return -1;
        } else if (!strcmp(key, "http_rate")) {
            if (get_number(v, key, 1, 1e6, &cfg->http_rate, err, errlen))
                return -1;
        } else if (!strcmp(key, "http_max_unauth_per_peer")) {
            if (get_count(v, key, 1, 65536, &cfg->http_max_unauth_per_peer, err, errlen))
                return -1;
        } else if (!strcmp(key, "http_max_unauth")) {
            if (get_count(v, key, 1, 65536, &cfg->http_max_unauth, err, errlen))
                return -1;
        } else if (!strcmp(key, "http_header_timeout")) {
            if (get_count(v, key, 1, 600, &cfg->http_header_timeout, err, errlen))
                return -1;
        } else if (!strcmp(key, "env")) {
            if (get_env(v, &cfg->env, err, errlen))
                return -1;
        } else if (!strcmp(key, "kernels")) {
            /* applied first (apply_kernels) */
        } else {
            return fail(err, errlen, key, "unknown key");
        }
    }
    /* ZeroMQ tcp cannot be made private to the kernels' owner (no CURVE in
     * Jupyter clients or connection files): the operator must say so */
    if (!strcmp(cfg->transport, "tcp") && !cfg->transport_tcp_exposed)
        return fail(err, errlen, "transport",
                    "\"tcp\": %s; set \"transport_tcp_exposed\": true to accept that, or use "
                    "\"ipc\"",
                    JP_TCP_EXPOSURE);
    /* an unset max_kernels follows the memory limit */
    if (cfg->max_kernels_auto)
        cfg->max_kernels = kmcfg_auto_max_kernels(cfg->memory);
    return 0;
}

int kmcfg_load_file(kmcfg *cfg, const char *path, unsigned flags, char *err, size_t errlen)
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
        snprintf(err, errlen, "%s %s%s", path, why_rr,
                 errno == EPERM ? " (the home's config.json must be the user's own, like the "
                                  "home: fix it or remove it)"
                                : "");
        return -1;
    }
    json_error_t jerr;
    json_t *obj = json_loadb(data, len, JSON_REJECT_DUPLICATES, &jerr);
    free(data);
    if (!obj) {
        snprintf(err, errlen, "%s: invalid JSON at line %d, column %d", path, jerr.line,
                 jerr.column);
        return -1;
    }
    char why[512];
    int rc = kmcfg_apply_json(cfg, obj, why, sizeof why);
    json_decref(obj);
    if (rc)
        snprintf(err, errlen, "%s: %s", path, why);
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
    json_t *langs = json_array();
    for (int i = 0; i < cfg->langs.n; i++)
        if (cfg->allow[i])
            json_array_append_new(langs, json_string(cfg->langs.v[i].name));
    json_t *kernels = km_langs_to_json(&cfg->langs);
    json_t *o =
        json_pack("{s:o s:f s:f s:f s:I s:s s:s* s:s s:s s:i s:f s:i s:I s:i s:i s:o}", "languages",
                  langs, "timeout", cfg->timeout, "interrupt_grace", cfg->interrupt_grace,
                  "start_timeout", cfg->start_timeout, "memory", (json_int_t)cfg->memory, "network",
                  cfg->network ? "on" : "off", "python", cfg->python[0] ? cfg->python : NULL,
                  "sandbox", cfg->sandbox, "transport", cfg->transport, "pool", (int)cfg->pool,
                  "idle_timeout", cfg->idle_timeout, "max_kernels", (int)cfg->max_kernels,
                  "output_cap", (json_int_t)cfg->output_cap, "files_max", (int)cfg->files_max,
                  "files_scan_max", (int)cfg->files_scan_max, "kernels", kernels);
    if (o) {
        json_object_set_new(o, "files_scan_bytes", json_integer((json_int_t)cfg->files_scan_bytes));
        json_object_set_new(o, "transport_tcp_exposed", json_boolean(cfg->transport_tcp_exposed));
        json_object_set_new(o, "outputs_keep_runs", json_integer(cfg->outputs_keep_runs));
        json_object_set_new(o, "outputs_max_age", json_real(cfg->outputs_max_age));
        json_object_set_new(o, "spill_max", json_integer((json_int_t)cfg->spill_max));
        json_object_set_new(o, "display_max", json_integer((json_int_t)cfg->display_max));
        json_object_set_new(o, "session_outputs_max",
                            json_integer((json_int_t)cfg->session_outputs_max));
        json_object_set_new(o, "kernel_log_max", json_integer((json_int_t)cfg->kernel_log_max));
        json_object_set_new(o, "history_max", json_integer((json_int_t)cfg->history_max));
        json_object_set_new(o, "daemon_workers", json_integer(cfg->daemon_workers));
        json_object_set_new(o, "daemon_queue", json_integer(cfg->daemon_queue));
        json_object_set_new(o, "client_buffer", json_integer((json_int_t)cfg->client_buffer));
        json_object_set_new(o, "client_timeout", json_real(cfg->client_timeout));
        json_object_set_new(o, "admission_timeout", json_real(cfg->admission_timeout));
        json_object_set_new(o, "code_max", json_integer((json_int_t)cfg->code_max));
        json_object_set_new(o, "http", cfg->http[0] ? json_string(cfg->http) : json_null());
        json_object_set_new(o, "http_tls_cert",
                            cfg->http_tls_cert[0] ? json_string(cfg->http_tls_cert) : json_null());
        json_object_set_new(o, "http_tls_key",
                            cfg->http_tls_key[0] ? json_string(cfg->http_tls_key) : json_null());
        json_object_set_new(o, "http_origin",
                            cfg->http_origin[0] ? json_string(cfg->http_origin) : json_null());
        json_object_set_new(o, "http_insecure", json_boolean(cfg->http_insecure));
        json_object_set_new(o, "http_allow_unsafe_session_options",
                            json_boolean(cfg->http_allow_unsafe));
        json_object_set_new(o, "http_max_body", json_integer((json_int_t)cfg->http_max_body));
        json_object_set_new(o, "http_max_message", json_integer((json_int_t)cfg->http_max_message));
        json_object_set_new(o, "http_max_pending", json_integer((json_int_t)cfg->http_max_pending));
        json_object_set_new(o, "http_max_connections", json_integer(cfg->http_max_connections));
        json_object_set_new(o, "http_rate", json_real(cfg->http_rate));
        json_object_set_new(o, "http_max_unauth_per_peer",
                            json_integer(cfg->http_max_unauth_per_peer));
        json_object_set_new(o, "http_max_unauth", json_integer(cfg->http_max_unauth));
        json_object_set_new(o, "http_header_timeout", json_integer(cfg->http_header_timeout));
        json_object_set_new(o, "http_host",
                            cfg->http_host[0] ? json_string(cfg->http_host) : json_null());
        json_object_set_new(o, "cpus", cfg->cpus > 0 ? json_real(cfg->cpus) : json_null());
        json_object_set_new(o, "cpu_time",
                            cfg->cpu_time > 0 ? json_real(cfg->cpu_time) : json_null());
    }
    return o;
}
