/*
 * cli.c — `kernelmgr COMMAND [options]`: the command table, option
 * parsing, --help and dispatch. The commands are in cli_run.c (run, exec
 * and what they show while running), cli_cmds.c (the commands that are one
 * daemon request; serve, install, kernelspec, doctor) and cli_files.c
 * (files get/put/ls/rm, session export/import).
 *
 * `run` drives an in-process manager (one fresh session, torn down at the
 * end); every other session command talks to the daemon and starts it when
 * none runs, so state survives between CLI calls.
 */
#include "kernelmgr/frontends/cli.h"
#include "kernelmgr/frontends/cli_int.h"
#include "common/cm_text.h"
#include "kernelmgr/service/dtier.h"
#include "common/cm_size.h"
#include "common/cm_termsafe.h"
#include "common/cm_path.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The end of --help (cli_usage: the commands and options come from their
 * tables). */
static const char cli_usage_footer[] =
    "\n"
    "State lives in $KERNELMGR_HOME (default $XDG_STATE_HOME/kernelmgr or\n"
    "~/.local/state/kernelmgr).\n"
    "Exit status: 0 ok, 1 a block failed, 2 usage or configuration error (also code\n"
    "that is not UTF-8 or larger than code_max), 3 no such session, 4 a kernel could\n"
    "not start, 5 daemon unreachable, 6 internal error, 7 the output could not be\n"
    "written, 130 interrupted.\n";

int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int cli_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kernelmgr: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\nTry 'kernelmgr --help'.\n", stderr);
    va_end(ap);
    return KM_EUSAGE;
}

/* A message that may quote sandbox-produced text (a kernel's error, a
 * warning): escaped on a terminal (termsafe.h). */
void cli_put_msg(const char *prefix, const char *msg)
{
    fputs(prefix, stderr);
    if (isatty(2))
        termsafe_fputs(stderr, msg ? msg : "", 0);
    else
        fputs(msg ? msg : "", stderr);
    fputc('\n', stderr);
}

int cli_fail(int code, const char *msg)
{
    cli_put_msg("kernelmgr: ", msg);
    return code;
}

void cli_print_json(const json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    if (s)
        puts(s);
    free(s);
}

/* Warnings of an exec reply go to stderr in every mode: with --json they
 * are also in the first result, and stdout stays one object per block. */
void cli_print_warnings(const json_t *rep)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(rep, "warnings"), i, w)
    {
        cli_put_msg("kernelmgr: warning: ", json_string_value(w));
    }
}

/* c->home: the manager's home, made absolute; -1 (said) when it is longer
 * than KM_HOME_MAX */
static int resolve_home(cli *c)
{
    int ok = kmcfg_home(c->home, sizeof c->home) != NULL;
    if (ok && c->home[0] != '/') {
        char *cwd = getcwd(NULL, 0);
        char *abs = cwd ? cm_path_join(cwd, c->home) : NULL;
        ok = abs && strlen(abs) < sizeof c->home;
        if (ok)
            memcpy(c->home, abs, strlen(abs) + 1);
        free(abs);
        free(cwd);
    }
    if (!ok)
        fprintf(stderr,
                "kernelmgr: the kernelmgr home (KERNELMGR_HOME, XDG_STATE_HOME or HOME) is "
                "longer than %d bytes: choose a shorter one\n",
                KM_HOME_MAX);
    return ok ? 0 : -1;
}

/* ---------------------------------------------------------------- parsing */

static int cli_dispatch(int argc, char **argv);

/* run / exec: the code from -c, a FILE or - (stdin) */
static int cmd_code(cli *c)
{
    if (c->npos > 1)
        return cli_usage_error("%s takes one FILE (or - for stdin)", c->cmd);
    if (c->npos == 1 && c->code)
        return cli_usage_error("give either -c CODE or a FILE, not both");
    if (c->npos == 1)
        c->file = c->pos[0];
    return !strcmp(c->cmd, "run") ? cli_cmd_run(c) : cli_cmd_exec(c);
}

/* The docs' tables `config --doc [WHICH]` prints, each a loop over its code
 * table; the first is the default. */
static const struct {
    const char *name;
    int (*write)(FILE *f);
    const char *what;
} config_docs[] = {
    /* docs/CONFIGURATION.md, from config.c's kmcfg_opts */
    {"keys", kmcfg_doc, "the configuration keys"},
    /* docs/API.md's "Session options", from dtier.c's dtier_sessopts */
    {"session-options", dtier_sessopt_doc, "the API's session options"},
};

/* `config --doc [keys|session-options]`: a docs' table in markdown */
static int cmd_config(cli *c)
{
    if ((c->argc != 3 && c->argc != 4) || strcmp(c->argv[2], "--doc"))
        return cli_usage_error("config takes --doc [keys|session-options] (print a docs' table in "
                               "markdown)");
    const char *which = c->argc == 4 ? c->argv[3] : config_docs[0].name;
    for (size_t i = 0; i < sizeof config_docs / sizeof config_docs[0]; i++)
        if (!strcmp(which, config_docs[i].name))
            return config_docs[i].write(stdout) ? KM_EOUTPUT : 0;
    size_t n = sizeof config_docs / sizeof config_docs[0], len = 0;
    char names[160] = "";
    for (size_t i = 0; i < n && len < sizeof names; i++)
        len +=
            (size_t)snprintf(names + len, sizeof names - len, "%s%s (%s%s)",
                             !i          ? ""
                             : i + 1 < n ? ", "
                                         : " or ",
                             config_docs[i].name, config_docs[i].what, !i ? ", the default" : "");
    return cli_usage_error("config --doc takes %s, not \"%s\"", names, which);
}

static int cmd_mcp(cli *c)
{
    return mcp_main(c->argc - 1, c->argv + 1);
}

/* The commands: one entry each. A command either runs a function or is one
 * daemon request (cmd_simple): its API method, whether it needs a session
 * NAME, what it adds to the request (build), how it prints the reply
 * (print; NULL: {"ok":true} with --json, nothing else) and, for one that
 * must not start a daemon, what it says when none runs (no_daemon);
 * instead: an option that makes it another request (sessions --repair),
 * -1 when not given. own_args: it parses its own options (before any of ours). */
typedef struct cli_command cli_command;
struct cli_command {
    const char *name;
    int (*run)(cli *c);
    const char *method;
    int needs_session;
    void (*build)(cli *c, json_t *req);
    int (*print)(cli *c, const char *name, json_t *rep);
    void (*no_daemon)(cli *c);
    int (*instead)(cli *c);
    int own_args;
    const char *synopsis; /* --help: the command line (lines split on \n) */
    const char *help;     /* --help: what it does */
};

static const cli_command cli_commands[] = {
    {"run", cmd_code, NULL, 0, NULL, NULL, NULL, NULL, 0, "run [opts] (-c CODE | FILE | -)",
     "one-shot: fresh session, run every block, tear down"},
    {"exec", cmd_code, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "exec --session NAME [opts] (-c CODE | FILE | -)",
     "run in a persistent session (starts the daemon)"},
    {"sessions", NULL, "sessions.list", 0, NULL, cli_print_sessions, cli_sessions_no_daemon,
     cli_sessions_repair, 0, "sessions [--repair NAME]",
     "list sessions; --repair NAME repairs a session\nwhose session.json is damaged (says what it "
     "did:\nrewritten, or recreated with the defaults,\nworkspace kept)"},
    {"close", NULL, "close", 1, cli_build_close, NULL, NULL, NULL, 0, "close NAME [--keep]",
     "stop kernels, remove the workspace (unless --keep)"},
    {"interrupt", NULL, "interrupt", 1, NULL, NULL, NULL, NULL, 0, "interrupt NAME",
     "interrupt running code"},
    {"restart", NULL, "restart", 1, NULL, NULL, NULL, NULL, 0, "restart NAME",
     "fresh kernels, same files"},
    {"files", NULL, "files.list", 1, NULL, cli_print_files, NULL, NULL, 0, "files NAME",
     "list the session's workspace"},
    {"files get", cli_cmd_files_get, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "files get NAME PATH [-o LOCAL]", "copy a workspace file here (any size; -o -:\nstdout)"},
    {"files put", cli_cmd_files_put, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "files put NAME LOCAL [PATH]",
     "copy a local file (- for stdin) into the\nworkspace, replacing PATH"},
    {"files ls", cli_cmd_files_ls, NULL, 0, NULL, NULL, NULL, NULL, 0, "files ls NAME [PATH]",
     "the same, below PATH"},
    {"files rm", cli_cmd_files_rm, NULL, 0, NULL, NULL, NULL, NULL, 0, "files rm NAME PATH",
     "remove a file, a link or an empty directory"},
    {"export", NULL, "export", 1, cli_build_export, cli_print_export, NULL, NULL, 0,
     "export NAME [-o FILE] [--kernel NAME]", "the session's history as a Jupyter notebook"},
    {"session export", cli_cmd_session_export, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "session export NAME FILE",
     "the session (files, and its variables snapshotted\nnow) as one archive, to move it to "
     "another daemon"},
    {"session import", cli_cmd_session_import, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "session import FILE [NAME]",
     "a new session from an archive (NAME: the one it\nwas exported with); its next exec "
     "restores it"},
    {"connection-file", NULL, "connection_file", 1, cli_build_connection_file,
     cli_print_connection_file, NULL, NULL, 0, "connection-file NAME [--lang L]",
     "connection file for `jupyter console --existing`"},
    {"snapshot", NULL, "session.snapshot", 1, cli_build_tag, cli_print_snapshot, NULL, NULL, 0,
     "snapshot NAME [--tag T]", "save the session's variables and files (a snapshot)"},
    {"snapshots", NULL, "session.snapshots", 1, NULL, cli_print_snapshot, NULL, NULL, 0,
     "snapshots NAME", "list the session's snapshots"},
    {"restore", NULL, "session.restore", 1, cli_build_tag, cli_print_restore, NULL, NULL, 0,
     "restore NAME [--tag T]", "bring the session back to a snapshot (default: latest)"},
    {"fork", NULL, "session.fork", 1, cli_build_fork, cli_print_restore, NULL, cli_fork_check, 0,
     "fork SRC NEW [--tag T]",
     "a new session NEW from SRC's snapshot: its own sandbox,\n"
     "a copy of the files and the variables"},
    {"serve", cli_cmd_serve, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "serve [--pool N] [--stop]\n      [--http [ADDR:]PORT] [--tls-cert F --tls-key F] "
     "[--insecure]",
     "run the daemon in the foreground (or stop it)\nalso serve Jupyter frontends over HTTP "
     "(docs/GATEWAY.md)"},
    {"doctor", cli_cmd_doctor, NULL, 0, NULL, NULL, NULL, NULL, 0, "doctor [--json]",
     "sandbox capabilities, Python, versions\n(exit 1: configured sandbox unavailable)"},
    {"kernelspec", cli_cmd_kernelspec, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "kernelspec install [--user|--prefix DIR] [--sandbox strict|none] [--python PATH]\n      "
     "[--network on|off|allow:HOST[,HOST...]] [--memory SIZE] [--cpus N] [--cpu-time S]\n      "
     "[--ipython on|off]",
     "\n\ninstall kernelmgr-LANG kernelspecs (python,\nbash and each configured backend language)"},
    {"install", cli_cmd_install, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "install --session NAME [--manager pip|npm] [--allowlist FILE] PKG...",
     "install allowlisted packages for a session"},
    {"drain", cli_cmd_drain, NULL, 0, NULL, NULL, NULL, NULL, 0, "drain",
     "the daemon makes no new sessions (its existing\nones keep working; /readyz says draining) "
     "and\nsnapshots each live session, saying how it went"},
    {"undrain", cli_cmd_drain, NULL, 0, NULL, NULL, NULL, NULL, 0, "undrain",
     "new sessions again after drain"},
    {"mcp", cmd_mcp, NULL, 0, NULL, NULL, NULL, NULL, 1,
     "mcp [--allowlist FILE]\nmcp install --client claude|cursor|vscode|generic [--print] "
     "[--python PATH]",
     "MCP server on stdio\nadd kernelmgr to an MCP client's configuration"},
    {"config", cmd_config, NULL, 0, NULL, NULL, NULL, NULL, 1,
     "config --doc [keys|session-options]",
     "the configuration keys (or the API's session\noptions) as a markdown table"},
};

static int cmd_simple(cli *c, const cli_command *k)
{
    int st = k->instead ? k->instead(c) : -1;
    if (st >= 0)
        return st;
    const char *name = c->npos ? c->pos[0] : c->session;
    if (k->needs_session && !name)
        return cli_usage_error("%s needs a session NAME", c->cmd);
    json_t *req = json_object();
    if (name)
        json_object_set_new(req, "session", json_string(name));
    if (k->build)
        k->build(c, req);
    json_t *rep;
    km_err err;
    if (k->no_daemon) {
        int fd = cli_connect_daemon(c, 0, &err);
        if (fd < 0) {
            json_decref(req);
            k->no_daemon(c);
            return 0;
        }
        close(fd);
    }
    st = cli_call(c, k->method, req, !k->no_daemon, NULL, NULL, &rep);
    if (st)
        return st;
    cli_print_warnings(rep); /* close: a workspace it kept */
    if (k->print)
        st = k->print(c, name, rep);
    else if (c->json)
        puts("{\"ok\":true}");
    json_decref(rep);
    return st;
}

/* Every command's output is checked: a write error on stdout (a closed pipe,
 * a full disk, EIO) is said on stderr and gives KM_EOUTPUT, never exit 0.
 * SIGPIPE is ignored so that a closed pipe is an EPIPE we report (`run`
 * installs its own handler: it tears the session down first). The daemon
 * and the MCP server handle their own streams. */
int cli_main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "mcp") || !strcmp(cmd, "serve"))
        return cli_dispatch(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    int st = cli_dispatch(argc, argv);
    cli_set_active(NULL); /* it was cli_dispatch's */
    st = cli_output_close(st);
    return st;
}

/* ---------------------------------------------------------------- options
 *
 * Every command-line option is one row of cli_opts[]: its name (and short
 * letter), the name of its value in --help, the one function that parses,
 * checks and stores it, the field of cli it fills, and its --help line
 * (NULL: an option of one command, named in that command's synopsis). The
 * getopt table, the short-option string and --help are built from it; the
 * ranges of the session options are the session options' table's
 * (dtier.h). A setter returns 0, an exit status (cli_usage_error), or
 * CLI_OPT_DONE when the command line was answered (--help, --version). */

#define CLI_OPT_DONE (-1)

typedef struct cli_opt cli_opt;
struct cli_opt {
    const char *name; /* "--NAME"; NULL for a short-only option */
    char short_name;  /* "-X", or 0 */
    const char *arg;  /* the value's name in --help; NULL: takes none */
    int (*set)(cli *c, const cli_opt *o, const char *arg);
    size_t off; /* offset of the cli field the generic setters fill */
    const char *help;
};

#define CLI_FIELD(type, c, o) ((type *)(void *)((char *)(c) + (o)->off))

static int opt_str(cli *c, const cli_opt *o, const char *arg)
{
    *CLI_FIELD(const char *, c, o) = arg;
    return 0;
}

static int opt_flag(cli *c, const cli_opt *o, const char *arg)
{
    *CLI_FIELD(int, c, o) = 1;
    return 0;
}

static int opt_abs_path(cli *c, const cli_opt *o, const char *arg)
{
    if (arg[0] != '/')
        return cli_usage_error("--%s must be an absolute path", o->name);
    return opt_str(c, o, arg);
}

static int opt_lang(cli *c, const cli_opt *o, const char *arg)
{
    /* checked by the manager (the daemon for exec), which knows the
     * configured languages (lang.h) */
    if (!*arg)
        return cli_usage_error("--lang must be python, bash, a configured language or auto");
    return opt_str(c, o, arg);
}

static int opt_timeout(cli *c, const cli_opt *o, const char *arg)
{
    char *end;
    double v = strtod(arg, &end);
    if (*end || end == arg || !(v > 0) || v > 604800)
        return cli_usage_error("--timeout must be a positive number of seconds (got \"%s\")", arg);
    *CLI_FIELD(double, c, o) = v;
    return 0;
}

static int opt_network(cli *c, const cli_opt *o, const char *arg)
{
    km_err why = {0};
    if (km_net_from_text(arg, "--network", &c->network, c->net_allow, sizeof c->net_allow, &why))
        return cli_usage_error("%s", why.msg);
    return 0;
}

static int opt_memory(cli *c, const cli_opt *o, const char *arg)
{
    const dtier_sessopt *so = dtier_sessopt_find("memory");
    if (kmcfg_parse_size(arg, &c->memory) || c->memory < (uint64_t)so->min)
        return cli_usage_error("--memory must be a size of at least %lluM, like 512M or 2G "
                               "(got \"%s\")",
                               (unsigned long long)so->min >> 20, arg);
    c->memory_s = arg;
    return 0;
}

/* The API's row of the session option a flag sets ("cpu-time": cpu_time);
 * every flag of sessopt.def has one. */
static const dtier_sessopt *flag_sessopt(const cli_opt *o)
{
    char key[32];
    snprintf(key, sizeof key, "%s", o->name);
    for (char *p = key; *p; p++)
        *p = *p == '-' ? '_' : *p;
    return dtier_sessopt_find(key);
}

/* A size of at least its session option's minimum into the unsigned long
 * long field at o->off (--snapshot-max). */
static int opt_sesssize(cli *c, const cli_opt *o, const char *arg)
{
    const dtier_sessopt *so = flag_sessopt(o);
    uint64_t bytes;
    if (kmcfg_parse_size(arg, &bytes) || bytes < (uint64_t)so->min) {
        char mb[32];
        return cli_usage_error("--%s must be a size of at least %s, like 64M (got \"%s\")", o->name,
                               cm_size_format((uint64_t)so->min, mb, sizeof mb), arg);
    }
    *CLI_FIELD(unsigned long long, c, o) = bytes;
    return 0;
}

/* on|off into the int field at o->off (--zygote, --ipython). */
static int opt_onoff(cli *c, const cli_opt *o, const char *arg)
{
    if (strcmp(arg, "on") && strcmp(arg, "off"))
        return cli_usage_error("--%s must be on or off (got \"%s\")", o->name, arg);
    *CLI_FIELD(int, c, o) = !strcmp(arg, "on");
    return 0;
}

/* A number in the range of its session option into the double field at
 * o->off (--cpus, --cpu-time). */
static int opt_sessnum(cli *c, const cli_opt *o, const char *arg)
{
    const dtier_sessopt *so = flag_sessopt(o);
    char *end;
    double v = strtod(arg, &end);
    if (*end || end == arg || !(v >= so->min) || v > so->max)
        return cli_usage_error("--%s must be a number of %s from %g to %.0f (got \"%s\")", o->name,
                               kmcfg_opt_find(so->f.name)->unit, so->min, so->max, arg);
    *CLI_FIELD(double, c, o) = v;
    return 0;
}

static int opt_sandbox(cli *c, const cli_opt *o, const char *arg)
{
    if (strcmp(arg, "strict") && strcmp(arg, "none"))
        return cli_usage_error("--sandbox must be strict or none (got \"%s\")", arg);
    return opt_str(c, o, arg);
}

static int opt_pool(cli *c, const cli_opt *o, const char *arg)
{
    const kmcfg_opt *row = kmcfg_opt_find("pool"); /* the range is the config key's */
    char *end;
    long v = strtol(arg, &end, 10);
    if (*end || end == arg || v < (long)row->min || v > (long)row->max)
        return cli_usage_error("--pool must be an integer %.0f..%.0f", row->min, row->max);
    *CLI_FIELD(int, c, o) = (int)v;
    return 0;
}

static int opt_env(cli *c, const cli_opt *o, const char *arg)
{
    /* a repeated NAME keeps its last value (counted once) */
    char why[512];
    const char *eq = strchr(arg, '=');
    char *name = eq ? strndup(arg, (size_t)(eq - arg)) : NULL;
    int repeat = name && c->env && json_object_get(c->env, name);
    if (kenv_check_entry(repeat ? NULL : &c->env_budget, "--env", arg, why, sizeof why) < 0) {
        free(name);
        return cli_usage_error("%s", why);
    }
    json_t *val = json_string(eq + 1);
    if (!val) {
        cli_usage_error("--env %s: the value is not UTF-8 text", name);
        free(name);
        return KM_EUSAGE;
    }
    if (!c->env)
        c->env = json_object();
    json_object_set_new(c->env, name, val);
    free(name);
    return 0;
}

static int cli_usage(FILE *f);

static int opt_help(cli *c, const cli_opt *o, const char *arg)
{
    return cli_usage(stdout) ? KM_EOUTPUT : CLI_OPT_DONE;
}

static int opt_version(cli *c, const cli_opt *o, const char *arg)
{
    puts("kernelmgr " KM_VERSION);
    return CLI_OPT_DONE;
}

#define OFF(field) offsetof(cli, field)
static const cli_opt cli_opts[] = {
    {"lang", 0, "python|bash|auto", opt_lang, OFF(lang),
     "language of the input (default auto: Markdown fences,\nshebang, else a heuristic); or a "
     "language the\nconfiguration's \"kernels\" adds"},
    {"timeout", 0, "SECONDS", opt_timeout, OFF(timeout),
     "per block (default 60): interrupt, grace, then kill+restart"},
    {"network", 0, "on|off|allow:HOST[,HOST...]", opt_network, OFF(network),
     "network inside the sandbox (new sessions; default\noff); allow: only these hosts (HOST, "
     "HOST:PORT,\n*.DOMAIN[:PORT], an address literal; ports 80 and\n443 by default), through "
     "the filtering proxy;\nat most 32 entries"},
    {"memory", 0, "SIZE", opt_memory, 0,
     "memory limit of the session's sandbox, which its\nkernels share, e.g. 1G (new sessions)"},
/* the plain session options (sessopt.def) */
#define KM_SO_DEF_BOOL(n, fl, sf, t, d, ch, ah, lh) {fl, 0, "on|off", opt_onoff, OFF(so.n), lh},
#define KM_SO_DEF_NUMBER(n, fl, sf, t, lo, hi, z, u, wu, wn, mv, ch, ah, lh)                       \
    {fl, 0, mv, opt_sessnum, OFF(so.n), lh},
#define KM_SO_DEF_SIZE(n, fl, sf, t, lo, hi, d, wu, wn, mv, ch, ah, lh)                            \
    {fl, 0, mv, opt_sesssize, OFF(so.n), lh},
#include "kernelmgr/engine/sessopt.def"
#undef KM_SO_DEF_BOOL
#undef KM_SO_DEF_NUMBER
#undef KM_SO_DEF_SIZE
    {"workspace", 0, "DIR", opt_str, OFF(workspace), "use DIR as the workspace (new sessions)"},
    {"python", 0, "PATH", opt_abs_path, OFF(python),
     "Python interpreter of the python kernel (new sessions)"},
    {"sandbox", 0, "strict|none", opt_sandbox, OFF(sandbox),
     "sandbox level of the kernels (new sessions; default strict)"},
    {"env", 0, "NAME=VALUE", opt_env, 0,
     "a variable for the code's environment (new sessions;\nrepeatable). The sandbox gets no "
     "other variable of\nyours but LANG, LC_*, TERM and TZ"},
    {"json", 0, NULL, opt_flag, OFF(json), "one JSON result object per block, one per line"},
    {"continue-on-error", 0, NULL, opt_flag, OFF(continue_on_error),
     "run the remaining blocks after a failing one"},
    {"config", 0, "FILE", opt_str, OFF(config),
     "configuration (default $KERNELMGR_HOME/config.json)"},
    {NULL, 'c', "CODE", opt_str, OFF(code), "the code (instead of FILE or - for stdin)"},
    {"help", 'h', NULL, opt_help, 0, "this text"},
    {"version", 0, NULL, opt_version, 0, "kernelmgr's version"},
    /* options of one command (see its synopsis) */
    {"session", 0, "NAME", opt_str, OFF(session), NULL},
    {"output", 'o', "FILE", opt_str, OFF(output), NULL},
    {"keep", 0, NULL, opt_flag, OFF(keep), NULL},
    {"repair", 0, "NAME", opt_str, OFF(repair), NULL},
    {"tag", 0, "T", opt_str, OFF(tag), NULL},
    {"kernel", 0, "NAME", opt_str, OFF(kernel_name), NULL},
    {"user", 0, NULL, opt_flag, OFF(user), NULL},
    {"prefix", 0, "DIR", opt_str, OFF(prefix), NULL},
    {"pool", 0, "N", opt_pool, OFF(pool), NULL},
    {"stop", 0, NULL, opt_flag, OFF(stop), NULL},
    {"http", 0, "[ADDR:]PORT", opt_str, OFF(http), NULL},
    {"tls-cert", 0, "FILE", opt_abs_path, OFF(tls_cert), NULL},
    {"tls-key", 0, "FILE", opt_abs_path, OFF(tls_key), NULL},
    {"insecure", 0, NULL, opt_flag, OFF(insecure), NULL},
    {"manager", 0, "pip|npm", opt_str, OFF(manager), NULL},
    {"allowlist", 0, "FILE", opt_str, OFF(allowlist), NULL},
};
#undef OFF
#define CLI_NOPTS (sizeof cli_opts / sizeof cli_opts[0])
/* getopt_long's val of row i */
#define CLI_OPT_VAL(i) (1000 + (int)(i))

/* Parses argv[first..] into c: options (cli_opts[]), then the positional
 * arguments. 0, an exit status, or CLI_OPT_DONE. */
static int cli_parse_options(cli *c, int argc, char **argv, int first)
{
    struct option longopts[CLI_NOPTS + 1];
    char shorts[2 * CLI_NOPTS + 2] = ":";
    size_t nl = 0, ns = 1;
    for (size_t i = 0; i < CLI_NOPTS; i++) {
        const cli_opt *o = &cli_opts[i];
        if (o->name)
            longopts[nl++] = (struct option){o->name, o->arg ? required_argument : no_argument,
                                             NULL, CLI_OPT_VAL(i)};
        if (o->short_name) {
            shorts[ns++] = o->short_name;
            if (o->arg)
                shorts[ns++] = ':';
        }
    }
    longopts[nl] = (struct option){0, 0, 0, 0};
    shorts[ns] = 0;
    optind = first;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, shorts, longopts, NULL)) != -1) {
        if (opt == ':')
            return cli_usage_error("option %s needs a value", argv[optind - 1]);
        const cli_opt *o = NULL;
        if (opt >= CLI_OPT_VAL(0) && opt < CLI_OPT_VAL(CLI_NOPTS))
            o = &cli_opts[opt - CLI_OPT_VAL(0)];
        for (size_t i = 0; !o && opt != '?' && i < CLI_NOPTS; i++)
            if (cli_opts[i].short_name == opt)
                o = &cli_opts[i];
        if (!o)
            return cli_usage_error("unknown option \"%s\"", argv[optind - 1]);
        int st = o->set(c, o, optarg);
        if (st)
            return st;
    }
    return 0;
}

/* --help: the commands' synopses (cli_commands[]) and the options
 * (cli_opts[]). */
static int cli_usage(FILE *f)
{
    int err = fputs("Usage: kernelmgr COMMAND [options]\n\nCommands:\n", f) == EOF;
    for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++)
        if (cli_commands[i].synopsis)
            err |= cm_print_columns(f, cli_commands[i].synopsis, cli_commands[i].help, 41);
    err |= fputs("\nOptions:\n", f) == EOF;
    for (size_t i = 0; i < CLI_NOPTS; i++) {
        const cli_opt *o = &cli_opts[i];
        if (!o->help)
            continue;
        char left[64];
        if (o->name && o->short_name)
            snprintf(left, sizeof left, "-%c, --%s%s%s", o->short_name, o->name, o->arg ? " " : "",
                     o->arg ? o->arg : "");
        else if (o->name)
            snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "",
                     o->arg ? o->arg : "");
        else
            snprintf(left, sizeof left, "-%c %s", o->short_name, o->arg ? o->arg : "");
        err |= cm_print_columns(f, left, o->help, 28);
    }
    err |= fputs(cli_usage_footer, f) == EOF;
    return err ? -1 : 0;
}

static int cli_dispatch(int argc, char **argv)
{
    cli c;
    memset(&c, 0, sizeof c);
    c.network = -1;
    km_session_opts_init(&c.so);
    c.pool = -1;
    if (argc < 2)
        return cli_usage_error("no command given");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
        return cli_usage(stdout) ? KM_EOUTPUT : 0;
    if (!strcmp(argv[1], "--version")) {
        puts("kernelmgr " KM_VERSION);
        return 0;
    }
    c.cmd = argv[1];
    c.argc = argc;
    c.argv = argv;
    /* a row "files get" is the command `files get`: its two words win over
     * the one-word row "files" */
    const cli_command *command = NULL;
    int words = 0;
    for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++) {
        const char *n = cli_commands[i].name, *sp = strchr(n, ' ');
        size_t l1 = sp ? (size_t)(sp - n) : strlen(n);
        if (strncmp(n, c.cmd, l1) || c.cmd[l1])
            continue;
        if (sp && argc > 2 && !strcmp(sp + 1, argv[2])) {
            command = &cli_commands[i];
            words = 2;
        } else if (!sp && words < 2) {
            command = &cli_commands[i];
            words = 1;
        }
    }
    if (!command)
        return cli_usage_error("unknown command \"%s\"", c.cmd);
    if (words == 2)
        c.cmd = command->name;
    if (command->own_args)
        return command->run(&c);

    int st = cli_parse_options(&c, argc, argv, 1 + words);
    if (st)
        return st < 0 ? 0 : st;
    for (int i = optind; i < argc; i++) {
        if (c.npos >= 64)
            return cli_usage_error("too many arguments");
        c.pos[c.npos++] = argv[i];
    }

    if (resolve_home(&c))
        return KM_EUSAGE;
    /* the home is trusted state: refused before anything in it is read */
    km_err home_why = {0};
    if (kmhome_prepare(c.home, 0, &home_why)) {
        fprintf(stderr, "kernelmgr: %s\n", home_why.msg);
        return KM_EUSAGE;
    }
    cli_set_active(&c);
    kmcfg_defaults(&c.cfg);
    km_err why = {0};
    char cfgpath[4096];
    if (c.config)
        snprintf(cfgpath, sizeof cfgpath, "%s", c.config);
    else
        snprintf(cfgpath, sizeof cfgpath, "%s/config.json", c.home);
    if (kmcfg_load_file(&c.cfg, cfgpath, c.config ? KMCFG_MUST_EXIST : KMCFG_HOME_FILE, &why)) {
        fprintf(stderr, "kernelmgr: invalid configuration: %s\n", why.msg);
        return KM_EUSAGE;
    }
    if (c.config) {
        char *real = realpath(c.config, NULL);
        if (real)
            c.config = real; /* the daemon runs elsewhere */
    }
    /* CLI options override the configuration */
    if (c.network >= 0) {
        c.cfg.network = c.network;
        snprintf(c.cfg.network_allow, sizeof c.cfg.network_allow, "%s", c.net_allow);
    }
    if (c.memory)
        c.cfg.memory = c.memory;
    if (c.so.cpus > 0)
        c.cfg.cpus = c.so.cpus;
    if (c.so.cpu_time > 0)
        c.cfg.cpu_time = c.so.cpu_time;
    if (c.python)
        snprintf(c.cfg.python, sizeof c.cfg.python, "%s", c.python);
    if (c.sandbox)
        snprintf(c.cfg.sandbox, sizeof c.cfg.sandbox, "%s", c.sandbox);

    return command->run ? command->run(&c) : cmd_simple(&c, command);
}
