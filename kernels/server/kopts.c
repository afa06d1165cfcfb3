/*
 * kopts.c — command-line parsing for every kernel binary. Accepts both
 * "--name value" and "--name=value"; unknown options are offered to the
 * backend before they are rejected.
 */
#include "kernels/server/kopts.h"
#include "common/cm_size.h"
#include "common/cm_text.h"

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

static int bad_value(const char *name, const char *val, char *err, size_t errlen)
{
    snprintf(err, errlen, "invalid value for %s: '%s'", name, val);
    return -1;
}

static int set_connection_file(kopts *o, const char *name, const char *val, char *err,
                               size_t errlen)
{
    o->connection_file = val;
    return 0;
}

static int set_workspace(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    o->workspace_arg = val;
    return 0;
}

static int set_sandbox(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    if (!strcmp(val, "strict"))
        o->sandbox.level = SANDBOX_STRICT;
    else if (!strcmp(val, "none"))
        o->sandbox.level = SANDBOX_NONE;
    else
        return bad_value(name, val, err, errlen);
    return 0;
}

static int set_memory(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    uint64_t *v = &o->sandbox.memory_bytes;
    return kopts_parse_size(val, v) < 0 || *v < (16u << 20) ? bad_value(name, val, err, errlen) : 0;
}

static int set_tmp_size(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    return kopts_parse_size(val, &o->sandbox.tmp_bytes) < 0 ? bad_value(name, val, err, errlen) : 0;
}

static int set_file_size(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    uint64_t *v = &o->sandbox.max_file_bytes;
    return kopts_parse_size(val, v) < 0 || *v == 0 ? bad_value(name, val, err, errlen) : 0;
}

static int set_procs(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    unsigned *v = &o->sandbox.max_procs;
    return parse_uint(val, v) < 0 || *v == 0 ? bad_value(name, val, err, errlen) : 0;
}

static int set_open_files(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    unsigned *v = &o->sandbox.max_open_files;
    return parse_uint(val, v) < 0 || *v < 16 ? bad_value(name, val, err, errlen) : 0;
}

static int set_network(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    if (!strcmp(val, "on")) {
        o->sandbox.network = 1;
    } else if (!strcmp(val, "off")) {
        o->sandbox.network = 0;
    } else if (egpolicy_is_text(val)) {
        char why[400];
        if (egpolicy_parse_text(&o->egress, val, why, sizeof why)) {
            snprintf(err, errlen, "invalid value for --network: %s", why);
            return -1;
        }
        o->sandbox.network = 0;
    } else {
        return bad_value(name, val, err, errlen);
    }
    if (!egpolicy_is_text(val))
        o->egress.n = 0;
    return 0;
}

static int set_interrupt_grace(kopts *o, const char *name, const char *val, char *err,
                               size_t errlen)
{
    return parse_seconds(val, 0, 3600, &o->interrupt_grace) < 0 ? bad_value(name, val, err, errlen)
                                                                : 0;
}

static int set_cpus(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    if (parse_seconds(val, KOPTS_CPUS_MIN, KOPTS_CPUS_MAX, &o->sandbox.cpus) < 0) {
        snprintf(err, errlen,
                 "invalid value for --cpus: '%s' (a number of CPUs from %g to %g, e.g. 0.5 "
                 "or 2)",
                 val, KOPTS_CPUS_MIN, KOPTS_CPUS_MAX);
        return -1;
    }
    return 0;
}

static int set_cpu_time(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    if (parse_seconds(val, 0.001, KOPTS_CPU_TIME_MAX, &o->cpu_time) < 0) {
        snprintf(err, errlen,
                 "invalid value for --cpu-time: '%s' (seconds of CPU time per cell, more "
                 "than 0 and at most %g)",
                 val, KOPTS_CPU_TIME_MAX);
        return -1;
    }
    return 0;
}

static int set_log_max(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    return kopts_parse_size(val, &o->log_max) < 0 || o->log_max < 4096
               ? bad_value(name, val, err, errlen)
               : 0;
}

static int set_history_max(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    return kopts_parse_size(val, &o->history_max) < 0 || o->history_max < 4096
               ? bad_value(name, val, err, errlen)
               : 0;
}

static int set_env(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    return add_env(o, "--env", val, err, errlen);
}

static int set_env_file(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    return add_env_file(o, val, err, errlen);
}

static int set_owner(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    return set_owner_fd(o, val, err, errlen);
}

static int set_session_sandbox(kopts *o, const char *name, const char *val, char *err,
                               size_t errlen)
{
    if (val[0] != '/') {
        snprintf(err, errlen, "--session-sandbox %s: must be an absolute path", val);
        return -1;
    }
    o->sandbox.session_socket = val;
    return 0;
}

static int set_zygote(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    unsigned *v = &o->sandbox.zygote_forks;
    return parse_uint(val, v) < 0 || *v > KOPTS_ZYGOTE_FORKS_MAX ? bad_value(name, val, err, errlen)
                                                                 : 0;
}

static int set_ro_path(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
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
    return 0;
}

static int set_help(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    o->help = 1;
    return 0;
}

static int set_version(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    o->version = 1;
    return 0;
}

static int set_non_loopback(kopts *o, const char *name, const char *val, char *err, size_t errlen)
{
    o->allow_non_loopback_ip = 1;
    return 0;
}

/* Every option of the kernel binaries, one row each: its names, the name of
 * its value (NULL: it takes none), the one function that checks and stores
 * it, and its --help text (kopts_usage). A backend's own options come after
 * (kbackend.option). */
typedef struct kopt {
    const char *name, *alias;
    const char *arg;
    int (*set)(kopts *o, const char *name, const char *val, char *err, size_t errlen);
    const char *help;
} kopt;

static const kopt kopt_table[] = {
    {"--connection-file", "-f", "FILE", set_connection_file,
     "Jupyter connection file (tcp or ipc) [required]"},
    {"--workspace", NULL, "DIR", set_workspace,
     "working directory of the code, read-write in the\nsandbox (default: the current "
     "directory)"},
    {"--sandbox", NULL, "strict|none", set_sandbox,
     "isolation level (default: strict); 'none' runs the\nworker as a plain child process"},
    {"--memory", NULL, "SIZE", set_memory, "memory limit, e.g. 512M, 2G (default 2G)"},
    {"--procs", NULL, "N", set_procs, "process/thread limit (default 256)"},
    {"--tmp-size", NULL, "SIZE", set_tmp_size,
     "size of the sandbox's /tmp and /dev/shm (default 512M)"},
    {"--open-files", NULL, "N", set_open_files, "open file limit (default 1024)"},
    {"--file-size", NULL, "SIZE", set_file_size, "largest file the code may write (default 1G)"},
    {"--network", NULL, "on|off|allow:HOST[,HOST...]", set_network,
     "network access from the sandbox (default off);\nallow: only the listed hosts, through the "
     "egress\nproxy this server runs outside the sandbox"},
    {"--cpus", NULL, "N", set_cpus,
     "CPU rate cap of the sandbox in CPUs, e.g. 0.5 or 2\n(cgroup cpu.max / cfs quota; default: "
     "none). Not\nenforceable without a cpu cgroup: kernel_info's\nsandbox list then says "
     "cpu-rate-cap-unavailable"},
    {"--cpu-time", NULL, "SEC", set_cpu_time,
     "CPU seconds a cell may use, every process of the\nsandbox counted (default: none); past "
     "it the cell\nis interrupted (killed after the grace) and its\nreply says which limit was "
     "reached"},
    {"--interrupt-grace", NULL, "SEC", set_interrupt_grace,
     "after an interrupt, seconds to wait before the\nworker is killed and restarted (default "
     "5)"},
    {"--log-max", NULL, "SIZE", set_log_max,
     "stop writing this kernel's log (stderr) once the\nfile is this large (default 1M)"},
    {"--history-max", NULL, "SIZE", set_history_max,
     "compact the history file (oldest entries go) when\nit would grow past this (default 8M)"},
    {"--env", NULL, "NAME=VALUE", set_env,
     "set a variable in the code's environment\n(repeatable, at most 72; wins over the "
     "backend's\nvalue). Nothing else of this process's environment\nreaches the code but LANG, "
     "LC_*, TERM and TZ; PATH is\n" KENV_SANDBOX_PATH ", HOME " KENV_SANDBOX_HOME},
    {"--env-file", NULL, "FILE", set_env_file,
     "the same from FILE: NAME=VALUE entries separated by\nNUL bytes (at most once; counted "
     "with --env toward\nthe 72). FILE: a regular file, not a symlink, owned\nby this user, no "
     "group/other access (0600). Unlike\n--env, values so given never show in ps or\n"
     "/proc/PID/cmdline"},
    {"--ro-path", NULL, "DIR", set_ro_path,
     "bind the absolute host path DIR read-only into\nthe sandbox at the same path "
     "(repeatable)"},
    {"--session-sandbox", NULL, "SOCK", set_session_sandbox,
     "strict: start the worker inside the session's one\nsandbox, served by kernelmgr-sandbox on "
     "the unix\nsocket SOCK (its limits are the session's)"},
    {"--zygote", NULL, "N", set_zygote,
     "with --session-sandbox: the worker may be forked by\nthe session's zygote (a pre-started "
     "worker that\nruns no code of the session's), which is replaced\nafter N forks; 0: always "
     "a cold start (default 0).\nOnly backends that have a zygote (python) use it"},
    {"--owner-fd", NULL, "N", set_owner,
     "inherited fd N is the read end of a pipe whose\nwrite end the owner keeps: when it "
     "closes (the\nowner died) the kernel shuts down as on SIGTERM"},
    {"--allow-non-loopback-ip", NULL, NULL, set_non_loopback,
     "bind a tcp connection file's ip even when it is not\na loopback address (127.0.0.0/8, "
     "::1); refused\notherwise: whoever can reach that address can\nread the kernel's output on "
     "IOPub (ZeroMQ PUB has\nno authentication)"},
    {"--help", "-h", NULL, set_help, "show this help and exit"},
    {"--version", NULL, NULL, set_version, "show the version and exit"},
};

/* The row of option name (or its alias), or NULL when it is not ours. */
static const kopt *kopt_find(const char *name)
{
    for (size_t i = 0; i < sizeof kopt_table / sizeof *kopt_table; i++)
        if (!strcmp(name, kopt_table[i].name) ||
            (kopt_table[i].alias && !strcmp(name, kopt_table[i].alias)))
            return &kopt_table[i];
    return NULL;
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
        const kopt *k = kopt_find(name);
        if (k && !k->arg && val) {
            snprintf(err, errlen, "option %s takes no value", name);
            return -1;
        }
        if (k) {
            if (k->arg && !val) {
                if (i + 1 >= argc) {
                    snprintf(err, errlen, "option %s needs a value", name);
                    return -1;
                }
                val = argv[++i];
            }
            if (k->set(o, name, val, err, errlen) < 0)
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
    if (o->egress.n && o->sandbox.level != SANDBOX_STRICT) {
        snprintf(err, errlen,
                 "--network allow: needs --sandbox strict (without the sandbox nothing keeps the "
                 "code from the host's network)");
        return -1;
    }
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
            "Options:\n",
            b->name, b->name);
    for (size_t i = 0; i < sizeof kopt_table / sizeof *kopt_table; i++) {
        const kopt *k = &kopt_table[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s%s", k->alias ? k->alias : "", k->alias ? ", " : "",
                 k->name, k->arg ? " " : "", k->arg ? k->arg : "");
        cm_print_columns(out, left, k->help, 27);
    }
    if (b->option_help)
        fprintf(out, "\n%s options:\n%s", b->name, b->option_help);
    fprintf(out, "\nHistory is kept in CONNECTION_FILE.history.jsonl.\n"
                 "Exit status: 0 after a shutdown request or SIGTERM, 1 on a startup\n"
                 "error (connection file, sockets, sandbox), 2 on a usage error.\n");
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
