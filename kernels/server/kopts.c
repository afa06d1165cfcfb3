/*
 * kopts.c — command-line parsing for every kernel binary. Accepts both
 * "--name value" and "--name=value"; unknown options are offered to the
 * backend before they are rejected.
 */
#include "kernels/server/kopts.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int kopts_parse_size(const char *s, uint64_t *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -1;
    uint64_t mult = 1;
    if (*end) {
        switch (*end) {
        case 'k':
        case 'K':
            mult = 1ull << 10;
            break;
        case 'm':
        case 'M':
            mult = 1ull << 20;
            break;
        case 'g':
        case 'G':
            mult = 1ull << 30;
            break;
        case 't':
        case 'T':
            mult = 1ull << 40;
            break;
        case 'b':
        case 'B':
            break;
        default:
            return -1;
        }
        end++;
        if (mult > 1 && (!strcasecmp(end, "ib") || !strcasecmp(end, "b")))
            end += strlen(end);
        if (*end)
            return -1;
    }
    double bytes = v * (double)mult;
    if (bytes >= 18446744073709551615.0)
        return -1;
    *out = (uint64_t)bytes;
    return 0;
}

static int parse_uint(const char *s, unsigned *out)
{
    char *end;
    if (!s || !*s || *s == '-')
        return -1;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v > 1000000000ul)
        return -1;
    *out = (unsigned)v;
    return 0;
}

void kopts_usage(FILE *out, const kbackend *b)
{
    fprintf(out,
            "Usage: kernel-%s -f CONNECTION_FILE [options]\n"
            "\n"
            "A Jupyter kernel (messaging protocol 5.3) for %s. The code runs in a\n"
            "worker process inside a sandbox; this process speaks ZeroMQ.\n"
            "\n"
            "Options:\n"
            "  -f, --connection-file FILE  Jupyter connection file (tcp or ipc) [required]\n"
            "  --workspace DIR          working directory of the code, read-write in the\n"
            "                           sandbox (default: the current directory)\n"
            "  --sandbox strict|none    isolation level (default: strict); 'none' runs the\n"
            "                           worker as a plain child process\n"
            "  --memory SIZE            memory limit, e.g. 512M, 2G (default 2G)\n"
            "  --procs N                process/thread limit (default 256)\n"
            "  --tmp-size SIZE          size of the sandbox's /tmp and /dev/shm (default 512M)\n"
            "  --open-files N           open file limit (default 1024)\n"
            "  --file-size SIZE         largest file the code may write (default 1G)\n"
            "  --network on|off         network access from the sandbox (default off)\n"
            "  --interrupt-grace SEC    after an interrupt, seconds to wait before the\n"
            "                           worker is killed and restarted (default 5)\n"
            "  --env NAME=VALUE         set a variable in the code's environment\n"
            "                           (repeatable; wins over the backend's value)\n"
            "  --ro-path DIR            bind the absolute host path DIR read-only into\n"
            "                           the sandbox at the same path (repeatable)\n"
            "  -h, --help               show this help and exit\n"
            "  --version                show the version and exit\n",
            b->name, b->name);
    if (b->option_help)
        fprintf(out, "\n%s options:\n%s", b->name, b->option_help);
    fprintf(out, "\nHistory is kept in CONNECTION_FILE.history.jsonl.\n"
                 "Exit status: 0 after a shutdown request or SIGTERM, 1 on a startup\n"
                 "error (connection file, sockets, sandbox), 2 on a usage error.\n");
}

/* Which of our options take a value; 0 when name is not ours. */
static int takes_value(const char *name)
{
    static const char *const with_value[] = {"-f",
                                             "--connection-file",
                                             "--workspace",
                                             "--sandbox",
                                             "--memory",
                                             "--procs",
                                             "--tmp-size",
                                             "--open-files",
                                             "--file-size",
                                             "--network",
                                             "--interrupt-grace",
                                             "--env",
                                             "--ro-path",
                                             NULL};
    for (int i = 0; with_value[i]; i++)
        if (!strcmp(name, with_value[i]))
            return 1;
    return 0;
}

/* NAME=VALUE with a shell-style NAME; the worker's fd variables are the
 * server's own. */
static int add_env(kopts *o, const char *val, char *err, size_t errlen)
{
    const char *eq = strchr(val, '=');
    size_t nl = eq ? (size_t)(eq - val) : 0;
    int ok = nl > 0 && (isalpha((unsigned char)val[0]) || val[0] == '_');
    for (size_t i = 1; ok && i < nl; i++)
        ok = isalnum((unsigned char)val[i]) || val[i] == '_';
    if (!ok) {
        snprintf(err, errlen, "--env '%s': expected NAME=VALUE", val);
        return -1;
    }
    if (!strncmp(val, "KERNELMGR_REQ_FD=", nl + 1) || !strncmp(val, "KERNELMGR_EVT_FD=", nl + 1)) {
        snprintf(err, errlen, "--env '%.*s': set by the kernel itself", (int)nl, val);
        return -1;
    }
    size_t n = 0;
    while (o->env[n])
        n++;
    if (n >= KOPTS_MAX_ENV) {
        snprintf(err, errlen, "at most %d --env options", KOPTS_MAX_ENV);
        return -1;
    }
    o->env[n] = val;
    return 0;
}

int kopts_apply_spec(const kopts *o, kworker_spec *spec, char *err, size_t errlen)
{
    for (size_t i = 0; o->env[i]; i++) {
        const char *eq = strchr(o->env[i], '=');
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(eq - o->env[i]), o->env[i]);
        if (kspec_add_env(spec, name, eq + 1) < 0) {
            snprintf(err, errlen, "--env %s: too many variables", name);
            return -1;
        }
    }
    for (size_t i = 0; o->ro_paths[i]; i++)
        if (kspec_add_ro_path(spec, o->ro_paths[i]) < 0) {
            snprintf(err, errlen, "--ro-path %s: too many read-only paths", o->ro_paths[i]);
            return -1;
        }
    return 0;
}

static int set_option(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    sandbox_config *c = &o->sandbox;
    if (!strcmp(name, "-f") || !strcmp(name, "--connection-file")) {
        o->connection_file = val;
    } else if (!strcmp(name, "--workspace")) {
        o->workspace_arg = val;
    } else if (!strcmp(name, "--sandbox")) {
        if (!strcmp(val, "strict"))
            c->level = SANDBOX_STRICT;
        else if (!strcmp(val, "none"))
            c->level = SANDBOX_NONE;
        else
            goto bad;
    } else if (!strcmp(name, "--memory")) {
        if (kopts_parse_size(val, &c->memory_bytes) < 0 || c->memory_bytes < (16u << 20))
            goto bad;
    } else if (!strcmp(name, "--tmp-size")) {
        if (kopts_parse_size(val, &c->tmp_bytes) < 0)
            goto bad;
    } else if (!strcmp(name, "--file-size")) {
        if (kopts_parse_size(val, &c->max_file_bytes) < 0 || c->max_file_bytes == 0)
            goto bad;
    } else if (!strcmp(name, "--procs")) {
        if (parse_uint(val, &c->max_procs) < 0 || c->max_procs == 0)
            goto bad;
    } else if (!strcmp(name, "--open-files")) {
        if (parse_uint(val, &c->max_open_files) < 0 || c->max_open_files < 16)
            goto bad;
    } else if (!strcmp(name, "--network")) {
        if (!strcmp(val, "on"))
            c->network = 1;
        else if (!strcmp(val, "off"))
            c->network = 0;
        else
            goto bad;
    } else if (!strcmp(name, "--interrupt-grace")) {
        char *end;
        errno = 0;
        double g = strtod(val, &end);
        if (errno || end == val || *end || !isfinite(g) || g < 0 || g > 3600)
            goto bad;
        o->interrupt_grace = g;
    } else if (!strcmp(name, "--env")) {
        return add_env(o, val, err, errlen);
    } else if (!strcmp(name, "--ro-path")) {
        if (val[0] != '/') {
            snprintf(err, errlen, "--ro-path %s: must be an absolute path", val);
            return -1;
        }
        size_t n = 0;
        while (o->ro_paths[n])
            n++;
        if (n >= KOPTS_MAX_RO) {
            snprintf(err, errlen, "at most %d --ro-path options", KOPTS_MAX_RO);
            return -1;
        }
        o->ro_paths[n] = val;
    }
    return 0;
bad:
    snprintf(err, errlen, "invalid value for %s: '%s'", name, val);
    return -1;
}

int kopts_parse(kopts *o, int argc, char **argv, const kbackend *b, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    sandbox_config_defaults(&o->sandbox);
    o->interrupt_grace = 5.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            o->help = 1;
            continue;
        }
        if (!strcmp(a, "--version")) {
            o->version = 1;
            continue;
        }
        /* Split "--name=value" (and "-fFILE" is not supported on purpose). */
        char name[128];
        const char *val = NULL;
        const char *eq = !strncmp(a, "--", 2) ? strchr(a, '=') : NULL;
        if (eq) {
            size_t n = (size_t)(eq - a);
            if (n >= sizeof name) {
                snprintf(err, errlen, "unknown option '%s'", a);
                return -1;
            }
            memcpy(name, a, n);
            name[n] = '\0';
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        if (takes_value(name)) {
            if (!val) {
                if (i + 1 >= argc) {
                    snprintf(err, errlen, "option %s needs a value", name);
                    return -1;
                }
                val = argv[++i];
            }
            if (set_option(o, name, val, err, errlen) < 0)
                return -1;
            continue;
        }
        if (b->option && a[0] == '-') {
            int used;
            if (eq) {
                char *pair[3] = {name, (char *)val, NULL};
                used = b->option(2, pair, err, errlen);
                if (used == 1) {
                    snprintf(err, errlen, "option %s takes no value", name);
                    return -1;
                }
            } else {
                used = b->option(argc - i, argv + i, err, errlen);
            }
            if (used < 0)
                return -1;
            if (used > 0) {
                if (!eq)
                    i += used - 1;
                continue;
            }
        }
        snprintf(err, errlen, a[0] == '-' ? "unknown option '%s'" : "unexpected argument '%s'", a);
        return -1;
    }
    return 0;
}
