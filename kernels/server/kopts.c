/*
 * kopts.c — command-line parsing for every kernel binary. Accepts both
 * "--name value" and "--name=value"; unknown options are offered to the
 * backend before they are rejected.
 */
#include "kernels/server/kopts.h"
#include "common/cm_size.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

int kopts_parse_size(const char *s, uint64_t *out)
{
    return cm_size_parse(s, out, NULL, 0);
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

/* A finite decimal number in [lo, hi]. */
static int parse_seconds(const char *s, double lo, double hi, double *out)
{
    char *end;
    if (!s || !*s)
        return -1;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
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
            "  --cpus N                 CPU rate cap of the sandbox in CPUs, e.g. 0.5 or 2\n"
            "                           (cgroup cpu.max / cfs quota; default: none). Not\n"
            "                           enforceable without a cpu cgroup: kernel_info's\n"
            "                           sandbox list then says cpu-rate-cap-unavailable\n"
            "  --cpu-time SEC           CPU seconds a cell may use, every process of the\n"
            "                           sandbox counted (default: none); past it the cell\n"
            "                           is interrupted (killed after the grace) and its\n"
            "                           reply says which limit was reached\n"
            "  --interrupt-grace SEC    after an interrupt, seconds to wait before the\n"
            "                           worker is killed and restarted (default 5)\n"
            "  --log-max SIZE           stop writing this kernel's log (stderr) once the\n"
            "                           file is this large (default 1M)\n"
            "  --history-max SIZE       compact the history file (oldest entries go) when\n"
            "                           it would grow past this (default 8M)\n"
            "  --env NAME=VALUE         set a variable in the code's environment\n"
            "                           (repeatable, at most 72; wins over the backend's\n"
            "                           value). Nothing else of this process's environment\n"
            "                           reaches the code but LANG, LC_*, TERM and TZ; PATH is\n"
            "                           " KENV_SANDBOX_PATH ", HOME " KENV_SANDBOX_HOME "\n"
            "  --env-file FILE          the same from FILE: NAME=VALUE entries separated by\n"
            "                           NUL bytes (at most once; counted with --env toward\n"
            "                           the 72). FILE: a regular file, not a symlink, owned\n"
            "                           by this user, no group/other access (0600). Unlike\n"
            "                           --env, values so given never show in ps or\n"
            "                           /proc/PID/cmdline\n"
            "  --ro-path DIR            bind the absolute host path DIR read-only into\n"
            "                           the sandbox at the same path (repeatable)\n"
            "  --session-sandbox SOCK   strict: start the worker inside the session's one\n"
            "                           sandbox, served by kernelmgr-sandbox on the unix\n"
            "                           socket SOCK (its limits are the session's)\n"
            "  --owner-fd N             inherited fd N is the read end of a pipe whose\n"
            "                           write end the owner keeps: when it closes (the\n"
            "                           owner died) the kernel shuts down as on SIGTERM\n"
            "  --allow-non-loopback-ip  bind a tcp connection file's ip even when it is not\n"
            "                           a loopback address (127.0.0.0/8, ::1); refused\n"
            "                           otherwise: whoever can reach that address can\n"
            "                           read the kernel's output on IOPub (ZeroMQ PUB has\n"
            "                           no authentication)\n"
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
    static const char *const with_value[] = {"-f",         "--connection-file", "--workspace",
                                             "--sandbox",  "--memory",          "--procs",
                                             "--tmp-size", "--open-files",      "--file-size",
                                             "--network",  "--interrupt-grace", "--env",
                                             "--log-max",  "--history-max",     "--ro-path",
                                             "--env-file", "--session-sandbox", "--owner-fd",
                                             "--cpus",     "--cpu-time",        NULL};
    for (int i = 0; with_value[i]; i++)
        if (!strcmp(name, with_value[i]))
            return 1;
    return 0;
}

/* NAME=VALUE with a shell-style NAME (kenv.h); the worker's fd variables
 * are the server's own. Bounded in number and size, --env and --env-file
 * together. what names the source in messages. */
static int add_env(kopts *o, const char *what, const char *val, char *err, size_t errlen)
{
    if (kenv_check_entry(NULL, what, val, err, errlen) < 0)
        return -1;
    size_t n = 0, bytes = strlen(val);
    while (o->env[n])
        bytes += strlen(o->env[n++]);
    if (n >= KOPTS_MAX_ENV) {
        snprintf(err, errlen,
                 "%s: too many variables (limit %d) with --env and --env-file together", what,
                 KOPTS_MAX_ENV);
        return -1;
    }
    if (bytes > KOPTS_MAX_ENV_BYTES) {
        snprintf(err, errlen,
                 "%s: the variables add up to more than %u bytes (limit %u KiB) with --env "
                 "and --env-file together",
                 what, KOPTS_MAX_ENV_BYTES, KOPTS_MAX_ENV_BYTES >> 10);
        return -1;
    }
    o->env[n] = val;
    return 0;
}

/* Reads --env-file path into o->env_file_data (see kopts.h for the rules)
 * and adds its entries. */
static int add_env_file(kopts *o, const char *path, char *err, size_t errlen)
{
    if (o->env_file_data) {
        snprintf(err, errlen, "--env-file %s: only one --env-file may be given", path);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        snprintf(err, errlen, "--env-file %s: %s", path,
                 errno == ELOOP ? "it is a symbolic link (not followed)" : strerror(errno));
        return -1;
    }
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) < 0) {
        snprintf(err, errlen, "--env-file %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "--env-file %s: not a regular file", path);
        goto fail;
    }
    if (st.st_uid != geteuid()) {
        snprintf(err, errlen,
                 "--env-file %s: owned by uid %u, not by this kernel's user (uid %u); refused",
                 path, (unsigned)st.st_uid, (unsigned)geteuid());
        goto fail;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        snprintf(err, errlen,
                 "--env-file %s: mode %04o lets group or others access it (expected 0600); "
                 "refused",
                 path, (unsigned)(st.st_mode & 07777));
        goto fail;
    }
    if (st.st_size > (off_t)KOPTS_MAX_ENV_FILE) {
        snprintf(err, errlen, "--env-file %s: %lld bytes (limit %u bytes)", path,
                 (long long)st.st_size, KOPTS_MAX_ENV_FILE);
        goto fail;
    }
    /* read to the end, at most one byte past the limit: the file may have
     * grown since the fstat */
    size_t cap = (size_t)KOPTS_MAX_ENV_FILE + 1, len = 0;
    buf = malloc(cap + 1);
    if (!buf) {
        snprintf(err, errlen, "--env-file %s: out of memory", path);
        goto fail;
    }
    while (len < cap) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            snprintf(err, errlen, "--env-file %s: %s", path, strerror(errno));
            goto fail;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    if (len > KOPTS_MAX_ENV_FILE) {
        snprintf(err, errlen, "--env-file %s: more than %u bytes (limit)", path,
                 KOPTS_MAX_ENV_FILE);
        goto fail;
    }
    close(fd);
    fd = -1;
    buf[len] = '\0';
    o->env_file_data = buf;
    /* entries end at a NUL; the last one may end at the end of the file */
    size_t first = 0;
    while (o->env[first])
        first++;
    size_t nr = 0;
    for (size_t at = 0; at < len; nr++) {
        const char *e = buf + at;
        size_t elen = strlen(e);
        char what[600];
        const char *eq = memchr(e, '=', elen);
        snprintf(what, sizeof what, "--env-file %.400s: entry %zu", path, nr + 1);
        if (!elen || !eq) {
            /* the entry itself is never quoted: it may be a secret */
            snprintf(err, errlen, "%s: %s (expected NAME=VALUE, entries separated by NUL bytes)",
                     what, elen ? "no '='" : "empty");
            goto fail_entries;
        }
        if (kenv_name_valid(e, (size_t)(eq - e)))
            snprintf(what, sizeof what, "--env-file %.400s: entry %zu (%.*s)", path, nr + 1,
                     (int)(eq - e > 64 ? 64 : eq - e), e);
        if (add_env(o, what, e, err, errlen) < 0)
            goto fail_entries;
        at += elen + 1;
    }
    return 0;
fail_entries:
    /* nothing of a refused file stays in o */
    for (size_t i = first; i <= KOPTS_MAX_ENV && o->env[i]; i++)
        o->env[i] = NULL;
    o->env_file_data = NULL;
fail:
    if (fd >= 0)
        close(fd);
    if (buf) {
        explicit_bzero(buf, (size_t)KOPTS_MAX_ENV_FILE + 2);
        free(buf);
    }
    return -1;
}

void kopts_clear(kopts *o)
{
    if (!o)
        return;
    /* entries of the file point into it: none stays behind */
    memset(o->env, 0, sizeof o->env);
    if (o->env_file_data) {
        explicit_bzero(o->env_file_data, (size_t)KOPTS_MAX_ENV_FILE + 2);
        free(o->env_file_data);
        o->env_file_data = NULL;
    }
}

int kopts_apply_spec(const kopts *o, kworker_spec *spec, char *err, size_t errlen)
{
    for (size_t i = 0; o->env[i]; i++) {
        const char *eq = strchr(o->env[i], '=');
        char name[KENV_MAX_NAME + 1];
        snprintf(name, sizeof name, "%.*s", (int)(eq - o->env[i]), o->env[i]);
        if (kspec_add_env(spec, name, eq + 1) < 0) {
            snprintf(err, errlen, "--env %s: too many variables (limit %d)", name, KSPEC_MAX_ENV);
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

/* --owner-fd N: must be an open pipe (FIFO) or socket of this process, not
 * one of the standard streams. Made non-blocking and close-on-exec (the
 * worker must never hold it). */
static int set_owner_fd(kopts *o, const char *val, char *err, size_t errlen)
{
    unsigned fd;
    if (parse_uint(val, &fd) < 0 || fd < 3 || fd > INT_MAX) {
        snprintf(err, errlen, "invalid value for --owner-fd: '%s' (a file descriptor >= 3)", val);
        return -1;
    }
    if (o->owner_fd >= 0) {
        snprintf(err, errlen, "--owner-fd %s: only one --owner-fd may be given", val);
        return -1;
    }
    struct stat st;
    int fl = fcntl((int)fd, F_GETFL);
    if (fl < 0 || fstat((int)fd, &st) < 0) {
        snprintf(err, errlen, "--owner-fd %s: not an open file descriptor: %s", val,
                 strerror(errno));
        return -1;
    }
    if (!S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "--owner-fd %s: not a pipe or socket", val);
        return -1;
    }
    if (fcntl((int)fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl((int)fd, F_SETFD, FD_CLOEXEC) < 0) {
        snprintf(err, errlen, "--owner-fd %s: %s", val, strerror(errno));
        return -1;
    }
    o->owner_fd = (int)fd;
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
    } else if (!strcmp(name, "--cpus")) {
        if (parse_seconds(val, KOPTS_CPUS_MIN, KOPTS_CPUS_MAX, &c->cpus) < 0) {
            snprintf(err, errlen,
                     "invalid value for --cpus: '%s' (a number of CPUs from %g to %g, e.g. 0.5 "
                     "or 2)",
                     val, KOPTS_CPUS_MIN, KOPTS_CPUS_MAX);
            return -1;
        }
    } else if (!strcmp(name, "--cpu-time")) {
        if (parse_seconds(val, 0.001, KOPTS_CPU_TIME_MAX, &o->cpu_time) < 0) {
            snprintf(err, errlen,
                     "invalid value for --cpu-time: '%s' (seconds of CPU time per cell, more "
                     "than 0 and at most %g)",
                     val, KOPTS_CPU_TIME_MAX);
            return -1;
        }
    } else if (!strcmp(name, "--log-max")) {
        if (kopts_parse_size(val, &o->log_max) < 0 || o->log_max < 4096)
            goto bad;
    } else if (!strcmp(name, "--history-max")) {
        if (kopts_parse_size(val, &o->history_max) < 0 || o->history_max < 4096)
            goto bad;
    } else if (!strcmp(name, "--env")) {
        return add_env(o, "--env", val, err, errlen);
    } else if (!strcmp(name, "--env-file")) {
        return add_env_file(o, val, err, errlen);
    } else if (!strcmp(name, "--owner-fd")) {
        return set_owner_fd(o, val, err, errlen);
    } else if (!strcmp(name, "--session-sandbox")) {
        if (val[0] != '/') {
            snprintf(err, errlen, "--session-sandbox %s: must be an absolute path", val);
            return -1;
        }
        c->session_socket = val;
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

static int parse_args(kopts *o, int argc, char **argv, const kbackend *b, char *err, size_t errlen)
{
    sandbox_config_defaults(&o->sandbox);
    o->interrupt_grace = 5.0;
    o->log_max = KOPTS_LOG_MAX_DEFAULT;
    o->history_max = KOPTS_HISTORY_MAX_DEFAULT;
    o->owner_fd = -1;
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
        if (!strcmp(a, "--allow-non-loopback-ip")) {
            o->allow_non_loopback_ip = 1;
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

int kopts_parse(kopts *o, int argc, char **argv, const kbackend *b, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (parse_args(o, argc, argv, b, err, errlen) < 0) {
        kopts_clear(o);
        return -1;
    }
    return 0;
}
