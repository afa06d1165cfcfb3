/*
 * kenv.c — the sandbox environment's rules, see kenv.h.
 */
#include "kernels/server/kenv.h"

#include <stdio.h>
#include <string.h>

static int is_alpha_(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

int kenv_name_valid(const char *name, size_t len)
{
    if (!name || len == 0 || len > KENV_MAX_NAME || !is_alpha_(name[0]))
        return 0;
    for (size_t i = 1; i < len; i++)
        if (!is_alpha_(name[i]) && !(name[i] >= '0' && name[i] <= '9'))
            return 0;
    return 1;
}

int kenv_name_reserved(const char *name, size_t len)
{
    return len == 16 &&
           (!strncmp(name, "KERNELMGR_REQ_FD", 16) || !strncmp(name, "KERNELMGR_EVT_FD", 16));
}

int kenv_check(kenv_budget *b, const char *what, const char *name, size_t nlen, const char *value,
               char *err, size_t errlen)
{
    if (!kenv_name_valid(name, nlen)) {
        snprintf(err, errlen,
                 "%s: invalid variable name '%.*s' (expected [A-Za-z_][A-Za-z0-9_]*, at most %d "
                 "bytes)",
                 what, (int)(nlen > 64 ? 64 : nlen), name ? name : "", KENV_MAX_NAME);
        return -1;
    }
    if (kenv_name_reserved(name, nlen)) {
        snprintf(err, errlen, "%s: %.*s is set by the kernel itself and cannot be passed", what,
                 (int)nlen, name);
        return -1;
    }
    if (!value) {
        snprintf(err, errlen, "%s: %.*s has no value (expected NAME=VALUE)", what, (int)nlen, name);
        return -1;
    }
    size_t vlen = strlen(value);
    if (vlen > KENV_MAX_VALUE) {
        snprintf(err, errlen, "%s: the value of %.*s is %zu bytes (limit %u bytes per value)", what,
                 (int)nlen, name, vlen, KENV_MAX_VALUE);
        return -1;
    }
    if (!b)
        return 0;
    if (b->count + 1 > KENV_MAX_VARS) {
        snprintf(err, errlen, "%s: too many variables (limit %d)", what, KENV_MAX_VARS);
        return -1;
    }
    if (b->bytes + nlen + 1 + vlen > KENV_MAX_TOTAL) {
        snprintf(err, errlen, "%s: the variables add up to more than %u bytes (limit %u KiB)", what,
                 KENV_MAX_TOTAL, KENV_MAX_TOTAL >> 10);
        return -1;
    }
    b->count++;
    b->bytes += nlen + 1 + vlen;
    return 0;
}

int kenv_check_entry(kenv_budget *b, const char *what, const char *entry, char *err, size_t errlen)
{
    const char *eq = entry ? strchr(entry, '=') : NULL;
    if (!eq) {
        snprintf(err, errlen, "%s '%.64s': expected NAME=VALUE", what, entry ? entry : "");
        return -1;
    }
    return kenv_check(b, what, entry, (size_t)(eq - entry), eq + 1, err, errlen);
}

int kenv_check_object(kenv_budget *b, const char *what, const json_t *obj, char *err, size_t errlen)
{
    kenv_budget local = {0, 0};
    if (!b)
        b = &local;
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "%s must be an object like {\"NAME\": \"value\"}", what);
        return -1;
    }
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)obj, name, v)
    {
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
            snprintf(err, errlen, "%s: the value of %.64s must be a string without NUL bytes", what,
                     name);
            return -1;
        }
        if (kenv_check(b, what, name, strlen(name), json_string_value(v), err, errlen) < 0)
            return -1;
    }
    return 0;
}

int kenv_host_allowed(const char *entry)
{
    const char *eq = strchr(entry, '=');
    if (!eq)
        return 0;
    size_t nl = (size_t)(eq - entry);
    if (!kenv_name_valid(entry, nl))
        return 0;
    int ok = (nl == 4 && !strncmp(entry, "LANG", 4)) ||
             (nl == 8 && !strncmp(entry, "LANGUAGE", 8)) || (nl > 3 && !strncmp(entry, "LC_", 3)) ||
             (nl == 4 && !strncmp(entry, "TERM", 4)) || (nl == 2 && !strncmp(entry, "TZ", 2));
    if (!ok)
        return 0;
    size_t vl = strlen(eq + 1);
    if (vl > KENV_MAX_HOST_VALUE)
        return 0;
    for (const char *p = eq + 1; *p; p++)
        if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
            return 0;
    return 1;
}
