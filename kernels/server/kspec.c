/*
 * kspec.c — the kworker_spec helpers of backend.h: a backend's description of
 * its worker (argv, extra environment, read-only paths, kernel_info).
 */
#include "kernels/server/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void free_list(char **list, size_t cap)
{
    for (size_t i = 0; i < cap && list[i]; i++) {
        free(list[i]);
        list[i] = NULL;
    }
}

void kspec_clear(kworker_spec *spec)
{
    if (!spec)
        return;
    free_list(spec->argv, KSPEC_MAX_ARGS);
    free_list(spec->env, KSPEC_MAX_ENV);
    free_list(spec->ro_paths, KSPEC_MAX_RO);
    free_list(spec->zygote_argv, KSPEC_MAX_ARGS);
    json_decref(spec->kernel_info);
    memset(spec, 0, sizeof *spec);
}

/* Appends a copy of s to a NULL-terminated list of at most cap entries. */
static int append(char **list, size_t cap, const char *s)
{
    size_t n = 0;
    if (!s)
        return -1;
    while (n < cap && list[n])
        n++;
    if (n >= cap)
        return -1;
    list[n] = strdup(s);
    if (!list[n])
        return -1;
    list[n + 1] = NULL;
    return 0;
}

int kspec_add_arg(kworker_spec *spec, const char *arg)
{
    return append(spec->argv, KSPEC_MAX_ARGS, arg);
}

int kspec_add_env(kworker_spec *spec, const char *name, const char *value)
{
    if (!name || !value || !*name || strchr(name, '='))
        return -1;
    size_t len = strlen(name) + strlen(value) + 2;
    char *kv = malloc(len);
    if (!kv)
        return -1;
    snprintf(kv, len, "%s=%s", name, value);
    /* A later value for the same name replaces the earlier one. */
    size_t nl = strlen(name);
    for (size_t i = 0; i < KSPEC_MAX_ENV && spec->env[i]; i++) {
        if (!strncmp(spec->env[i], name, nl) && spec->env[i][nl] == '=') {
            free(spec->env[i]);
            spec->env[i] = kv;
            return 0;
        }
    }
    int rc = append(spec->env, KSPEC_MAX_ENV, kv);
    free(kv);
    return rc;
}

int kspec_add_ro_path(kworker_spec *spec, const char *path)
{
    return append(spec->ro_paths, KSPEC_MAX_RO, path);
}

int kspec_add_zygote_arg(kworker_spec *spec, const char *arg)
{
    return append(spec->zygote_argv, KSPEC_MAX_ARGS, arg);
}
