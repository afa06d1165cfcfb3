/*
 * cli.c — `kernelmgr COMMAND [options]`.
 *
 * `run` drives an in-process manager (one fresh session, torn down at the
 * end); every other session command talks to the daemon and starts it when
 * none runs, so state survives between CLI calls.
 */
#include "kernelmgr/frontends/cli.h"
#include "kernelmgr/engine/codeblocks.h"
#include "kernelmgr/service/daemon.h"
#include "kernelmgr/service/dtier.h"
#include "kernelmgr/frontends/doctor.h"
#include "kernelmgr/frontends/gateway.h"
#include "kernelmgr/engine/kclient.h"
#include "kernelmgr/engine/klaunch.h"
#include "kernelmgr/frontends/kspecinstall.h"
#include "kernelmgr/engine/km.h"
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/engine/result.h"
#include "kernelmgr/frontends/termsafe.h"
#include "kernels/server/kenv.h"
#include "common/cm_clock.h"
#include "common/cm_path.h"
#include "jp.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KM_VERSION "0.1.0"

static const char usage_text[] =
    "Usage: kernelmgr COMMAND [options]\n"
    "\n"
    "Commands:\n"
    "  run [opts] (-c CODE | FILE | -)        one-shot: fresh session, run every block, tear down\n"
    "  exec --session NAME [opts] (-c CODE | FILE | -)\n"
    "                                         run in a persistent session (starts the daemon)\n"
    "  sessions                               list sessions\n"
    "  sessions --repair NAME                 repair a session whose session.json is damaged\n"
    "                                         (says what it did: rewritten, or recreated with\n"
    "                                         the defaults, workspace kept)\n"
    "  close NAME [--keep]                    stop kernels, remove the workspace (unless --keep)\n"
    "  interrupt NAME | restart NAME          interrupt running code | fresh kernels, same files\n"
    "  files NAME                             list the session's workspace\n"
    "  export NAME [-o FILE] [--kernel NAME]  the session's history as a Jupyter notebook\n"
    "  connection-file NAME [--lang L]        connection file for `jupyter console --existing`\n"
    "  install --session NAME [--manager pip|npm] [--allowlist FILE] PKG...\n"
    "                                         install allowlisted packages for a session\n"
    "  serve [--pool N] [--stop]              run the daemon in the foreground (or stop it)\n"
    "        [--http [ADDR:]PORT] [--tls-cert F --tls-key F] [--insecure]\n"
    "                                         also serve Jupyter frontends over HTTP "
    "(docs/GATEWAY.md)\n"
    "  mcp                                    MCP server on stdio\n"
    "  config --doc                           the configuration keys as a markdown table\n"
    "  doctor                                 sandbox capabilities, Python, versions\n"
    "                                         (exit 1: configured sandbox unavailable)\n"
    "  kernelspec install [--user|--prefix DIR] [--sandbox strict|none] [--python PATH]\n"
    "        [--network on|off] [--memory SIZE] [--cpus N] [--cpu-time S]\n"
    "                                         install kernelmgr-LANG kernelspecs (python,\n"
    "                                         bash and each configured backend language)\n"
    "\n"
    "Options:\n"
    "  --lang python|bash|auto   language of the input (default auto: Markdown fences,\n"
    "                            shebang, else a heuristic); or a language the\n"
    "                            configuration's \"kernels\" adds\n"
    "  --timeout SECONDS         per block (default 60): interrupt, grace, then kill+restart\n"
    "  --network on|off          network inside the sandbox (new sessions; default off)\n"
    "  --memory SIZE             memory limit of the session's sandbox, which its kernels\n"
    "                            share, e.g. 1G (new sessions)\n"
    "  --cpus N                  CPU rate cap of each kernel in CPUs, e.g. 1.5 (new sessions)\n"
    "  --cpu-time SECONDS        CPU-time budget per block (new sessions)\n"
    "  --workspace DIR           use DIR as the workspace (new sessions)\n"
    "  --python PATH             Python interpreter of the python kernel (new sessions)\n"
    "  --sandbox strict|none     sandbox level of the kernels (new sessions; default strict)\n"
    "  --env NAME=VALUE          a variable for the code's environment (new sessions;\n"
    "                            repeatable). The sandbox gets no other variable of\n"
    "                            yours but LANG, LC_*, TERM and TZ\n"
    "  --json                    one JSON result object per block, one per line\n"
    "  --continue-on-error       run the remaining blocks after a failing one\n"
    "  --config FILE             configuration (default $KERNELMGR_HOME/config.json)\n"
    "  -c CODE                   the code (instead of FILE or - for stdin)\n"
    "\n"
    "State lives in $KERNELMGR_HOME (default $XDG_STATE_HOME/kernelmgr or\n"
    "~/.local/state/kernelmgr).\n"
    "Exit status: 0 ok, 1 a block failed, 2 usage or configuration error (also code\n"
    "that is not UTF-8 or larger than code_max), 3 no such session, 4 a kernel could\n"
    "not start, 5 daemon unreachable, 6 internal error, 7 the output could not be\n"
    "written, 130 interrupted.\n";

/* The elapsed-time ticker of a running command, and what it interrupts: a
 * thread (ticker_main) that shows "[running N s]" on a terminal and turns
 * Ctrl-C or a `run`'s stop signal into interrupts. Owned by the command's
 * cli; stop, cond under lock; on, shown, t0 under out_lock. */
typedef struct cli_ticker {
    int on, shown;
    double t0;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* ticker_end() wakes the thread at once */
    int stop;
    km_manager *mgr;      /* `run`: the in-process manager, else NULL */
    const char *session;  /* `run`: its session */
    double stop_deadline; /* `run` stopped by a signal: give up on the cell */
} cli_ticker;

typedef struct cli {
    const char *cmd;
    const char *lang, *code, *file, *session, *workspace, *python, *sandbox, *config;
    const char *output, *kernel_name, *prefix, *memory_s, *manager, *allowlist;
    const char *http, *tls_cert, *tls_key; /* serve --http ... */
    int insecure;
    json_t *env; /* --env: {NAME: "value"}, NULL when none was given */
    kenv_budget env_budget;
    double timeout;
    double cpus, cpu_time; /* 0 unset */
    int network;           /* -1 unset */
    uint64_t memory;
    int json, continue_on_error, keep, user, stop, pool;
    const char *repair; /* sessions --repair NAME */
    size_t code_len;    /* bytes of the code read from FILE or stdin */
    int npos;
    char *pos[64];
    char home[KM_HOME_MAX + 1];
    kmcfg cfg;
    cli_ticker ticker;
    char *serve_extra[4]; /* connect_daemon: options for an autostarted daemon */
    int argc;             /* the command line (borrowed), for exec_gateway_binary */
    char **argv;
} cli;

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
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
static void put_msg(const char *prefix, const char *msg)
{
    fputs(prefix, stderr);
    if (isatty(2))
        termsafe_fputs(stderr, msg ? msg : "", 0);
    else
        fputs(msg ? msg : "", stderr);
    fputc('\n', stderr);
}

static int fail(int code, const char *msg)
{
    put_msg("kernelmgr: ", msg);
    return code;
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

/* new (free()): the code of -c, FILE or - (stdin), checked like km_exec
 * checks it (cblocks_check_code: code_max, NUL bytes, UTF-8) so that run and
 * exec say the same before anything starts. *bad is set when the code was
 * read but refused (exit 2 with err), 0 for I/O errors. */
static char *read_code_checked(cli *c, int *bad, char *err, size_t errlen);
static char *read_code(cli *c, char *err, size_t errlen)
{
    if (c->code)
        return strdup(c->code);
    const char *f = c->file;
    if (!f) {
        snprintf(err, errlen, "no code given: use -c CODE, a FILE, or - for stdin");
        return NULL;
    }
    FILE *fp = strcmp(f, "-") ? fopen(f, "r") : stdin;
    if (!fp) {
        snprintf(err, errlen, "%s: %s", f, strerror(errno));
        return NULL;
    }
    /* keeps at most code_max + 1 bytes; the rest is counted, so the error
     * can say how large the code was */
    uint64_t keep = c->cfg.code_max ? c->cfg.code_max + 1 : (64u << 20);
    size_t cap = 65536, n = 0, total = 0;
    char *buf = malloc(cap);
    char sink[65536];
    if (!buf)
        snprintf(err, errlen, "out of memory");
    for (size_t r = 1; buf && r; total += r) {
        if (n >= keep) {
            r = fread(sink, 1, sizeof sink, fp);
            continue;
        }
        if (n + 4096 > cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                snprintf(err, errlen, "%s: out of memory", f);
                break;
            }
            buf = b;
            cap *= 2;
        }
        size_t want = cap - n - 1;
        if (want > keep - n)
            want = (size_t)(keep - n);
        r = fread(&buf[n], 1, want, fp);
        n += r;
    }
    int rerr = ferror(fp) ? errno : 0;
    if (fp != stdin)
        fclose(fp);
    if (buf && rerr) {
        free(buf);
        snprintf(err, errlen, "%s: %s", f, strerror(rerr));
        return NULL;
    }
    if (buf) {
        buf[n] = 0;
        c->code_len = total;
    }
    return buf;
}

static char *read_code_checked(cli *c, int *bad, char *err, size_t errlen)
{
    *bad = 0;
    c->code_len = 0;
    char *code = read_code(c, err, errlen);
    if (!code)
        return NULL;
    size_t len = c->code ? strlen(code) : c->code_len;
    if (cblocks_check_code(code, len, c->cfg.code_max, err, errlen)) {
        *bad = 1;
        free(code);
        return NULL;
    }
    return code;
}

/* ---------------------------------------------------------------- output while running */

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
/* The first error writing stdout (EPIPE, ENOSPC, EIO; 0: none). Every write
 * is checked; the command stops its cell and exits KM_EOUTPUT with a
 * message (cli_main). */
static int out_errno;
static void output_failed(void);

/* Flushes stdout and notes its first error. */
static void out_flush(void)
{
    int before = errno; /* a failed fputs before us left its errno */
    errno = 0;
    if ((fflush(stdout) == EOF || ferror(stdout)) && !out_errno) {
        out_errno = errno ? errno : before ? before : EIO;
        output_failed();
    }
}
static volatile sig_atomic_t sigint_count;
/* `run`: the first of SIGTERM, SIGHUP, SIGPIPE (or SIGINT) received: the
 * cell is interrupted, the run tears down and exits with 128 + it */
static volatile sig_atomic_t run_stop_sig;
/* The command running (set by cli_dispatch before it runs one): what a failed
 * stdout write interrupts (output_failed, called from out_flush). */
static cli *active_cli;

static void clear_ticker_locked(cli_ticker *t)
{
    if (t->shown) {
        fputs("\r\033[K", stderr);
        t->shown = 0;
    }
}

static void *ticker_main(void *arg)
{
    cli_ticker *t = arg;
    int interrupted = 0;
    for (;;) {
        struct timespec ts = cm_mono_deadline(0.2);
        pthread_mutex_lock(&t->lock);
        while (!t->stop && pthread_cond_timedwait(&t->cond, &t->lock, &ts) == 0) {
        }
        int stop = t->stop;
        pthread_mutex_unlock(&t->lock);
        if (stop)
            break;
        if (sigint_count && !interrupted && t->mgr) {
            interrupted = 1;
            km_interrupt(t->mgr, t->session, NULL);
        }
        if (run_stop_sig && t->mgr) {
            /* again on every tick: a cell that had not started yet when the
             * signal came (a kernel still starting) is interrupted too */
            km_interrupt(t->mgr, t->session, NULL);
            if (t->stop_deadline == 0) {
                t->stop_deadline = kclient_now() + km_manager_config(t->mgr)->interrupt_grace + 10;
            } else if (kclient_now() > t->stop_deadline) {
                /* the cell does not end: leave; the kernels' lifeline ends them
                 * and the next manager start removes the session directory */
                static const char msg[] = "kernelmgr: the cell did not stop; exiting\n";
                if (write(2, msg, sizeof msg - 1) < 0) {
                }
                _exit(128 + run_stop_sig);
            }
        }
        pthread_mutex_lock(&out_lock);
        double el = kclient_now() - t->t0;
        if (t->on && el >= 2) {
            fprintf(stderr, "\r\033[K[running %.0f s]", el);
            t->shown = 1;
        }
        pthread_mutex_unlock(&out_lock);
    }
    return NULL;
}

static void on_sigint(int sig)
{
    (void)sig;
    if (++sigint_count >= 2) {
        static const char msg[] = "\nkernelmgr: interrupted\n";
        if (write(2, msg, sizeof msg - 1) < 0) {
        }
        _exit(130);
    }
}

static void on_run_signal(int sig)
{
    if (!run_stop_sig) {
        run_stop_sig = sig;
    } else if (sig != SIGPIPE) {
        /* a second request: no teardown (the lifeline and the next start-up
         * scan clean up) */
        static const char msg[] = "\nkernelmgr: terminated\n";
        if (write(2, msg, sizeof msg - 1) < 0) {
        }
        _exit(128 + sig);
    }
}

/* `run` tears down on SIGTERM, SIGHUP and SIGPIPE (SIGINT: on_sigint). */
static void run_signals_install(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_run_signal;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGTERM, SIGHUP, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
}

typedef struct render_ctx {
    cli *c;
    int streamed;  /* stdout/stderr shown live for the current block */
    int colour[2]; /* stdout/stderr: a colour sequence was passed in this block */
} render_ctx;

static void on_event(void *ud, const json_t *ev)
{
    render_ctx *rc = ud;
    const char *type = json_string_value(json_object_get(ev, "event"));
    if (!type)
        return;
    pthread_mutex_lock(&out_lock);
    clear_ticker_locked(&rc->c->ticker);
    if (!strcmp(type, "stream") && !rc->c->json) {
        const char *name = json_string_value(json_object_get(ev, "name"));
        const char *text = json_string_value(json_object_get(ev, "text"));
        FILE *f = name && !strcmp(name, "stderr") ? stderr : stdout;
        if (text) {
            /* on a terminal, escape what could drive it (termsafe.h) */
            if (isatty(fileno(f)))
                rc->colour[f == stderr] |= termsafe_fputs(f, text, TERMSAFE_KEEP_SGR);
            else
                fputs(text, f);
            if (f == stdout)
                out_flush();
            else
                fflush(f);
        }
        rc->streamed = 1;
    } else if (!strcmp(type, "notice")) {
        /* e.g. waiting for a cell another client started: stderr in every mode */
        put_msg("kernelmgr: ", json_string_value(json_object_get(ev, "message")));
    } else if (!strcmp(type, "result")) {
        json_t *r = json_object_get(ev, "result");
        if (rc->c->json) {
            char *s = json_dumps(r, JSON_COMPACT);
            if (s) {
                puts(s);
                free(s);
            }
            out_flush();
        } else {
            /* colours a cell left on are not ours to keep */
            for (int i = 0; i < 2; i++)
                if (rc->colour[i]) {
                    fputs("\033[0m", i ? stderr : stdout);
                    fflush(i ? stderr : stdout);
                    rc->colour[i] = 0;
                }
            /* live output may not end with a newline */
            result_render(stdout, r, 1);
            out_flush();
        }
        rc->streamed = 0;
        rc->c->ticker.t0 = kclient_now();
    }
    pthread_mutex_unlock(&out_lock);
}

/* Starts c's ticker for a command (mgr, session: a `run`'s, else NULL);
 * ticker_end() stops it. */
static void ticker_start(cli *c, km_manager *mgr, const char *session)
{
    cli_ticker *t = &c->ticker;
    pthread_mutex_lock(&out_lock);
    t->on = isatty(2) && !c->json;
    t->shown = 0;
    t->t0 = kclient_now();
    pthread_mutex_unlock(&out_lock);
    t->stop = 0;
    t->mgr = mgr;
    t->session = session;
    t->stop_deadline = 0;
    pthread_mutex_init(&t->lock, NULL);
    cm_cond_init_mono(&t->cond);
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    pthread_create(&t->thread, NULL, ticker_main, t);
}

static void ticker_end(cli *c)
{
    cli_ticker *t = &c->ticker;
    pthread_mutex_lock(&t->lock);
    t->stop = 1;
    pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->lock);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cond);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_lock(&out_lock);
    clear_ticker_locked(t);
    pthread_mutex_unlock(&out_lock);
    t->mgr = NULL;
    t->session = NULL;
}

/* ---------------------------------------------------------------- commands */

static void print_json(const json_t *o);

static void fill_session_opts(cli *c, km_session_opts *so)
{
    km_session_opts_init(so);
    so->network = c->network;
    so->memory = c->memory;
    so->cpus = c->cpus;
    so->cpu_time = c->cpu_time;
    so->python = c->python;
    so->workspace = c->workspace;
    so->sandbox = c->sandbox;
    so->env = c->env;
}

/* The exit status of run / exec from its reply (1 when a block failed),
 * saying on stderr how many later blocks were not run. */
static int exec_status(const cli *c, const json_t *reply)
{
    json_int_t skipped = json_integer_value(json_object_get(reply, "skipped"));
    if (skipped && !c->json)
        fprintf(stderr, "kernelmgr: %lld later block(s) not run (use --continue-on-error)\n",
                (long long)skipped);
    return json_is_true(json_object_get(reply, "failed")) ? 1 : 0;
}

static int cmd_run(cli *c)
{
    char why[512];
    int badcode;
    char *code = read_code_checked(c, &badcode, why, sizeof why);
    if (!code)
        return badcode ? fail(KM_EUSAGE, why) : usage_error("%s", why);
    if (c->workspace) {
        /* relative paths are the user's cwd */
        char *real = realpath(c->workspace, NULL);
        if (!real) {
            free(code);
            return usage_error("--workspace %s: %s", c->workspace, strerror(errno));
        }
        c->workspace = real; /* leaked on purpose: lives until exit */
    }
    c->cfg.pool = 0;
    c->cfg.idle_timeout = 0;
    run_signals_install();
    km_err err = {0, ""};
    km_manager *m = km_manager_new(c->home, &c->cfg, 0, &err);
    if (!m) {
        free(code);
        return fail(err.code, err.msg);
    }
    char name[64];
    snprintf(name, sizeof name, "run-%d-%ld", (int)getpid(), (long)time(NULL));
    km_session_opts so;
    fill_session_opts(c, &so);
    km_exec_opts eo = {c->lang, c->timeout, c->continue_on_error};
    render_ctx rc = {c, 0, {0, 0}};
    ticker_start(c, m, name);
    json_t *res = NULL;
    if (run_stop_sig) {
        err.code = KM_EINTERNAL;
        snprintf(err.msg, sizeof err.msg, "stopped by signal %d (%s) before the code ran",
                 (int)run_stop_sig, strsignal(run_stop_sig));
    } else {
        res = km_exec(m, name, &so, &eo, code, on_event, &rc, &err);
    }
    ticker_end(c);
    free(code);
    int status;
    if (!res) {
        status = fail(err.code, err.msg);
    } else {
        status = exec_status(c, res);
        json_decref(res);
    }
    km_close(m, name, KM_KEEP_OUTPUTS, NULL);
    km_manager_destroy(&m);
    if (run_stop_sig)
        return 128 + run_stop_sig;
    return sigint_count ? 130 : status;
}

static int connect_daemon(cli *c, int autostart, km_err *err)
{
    int k = 0;
    if (c->config) {
        c->serve_extra[k++] = "--config";
        c->serve_extra[k++] = (char *)c->config;
    }
    c->serve_extra[k] = NULL;
    return daemon_connect(c->home, autostart, c->serve_extra, err);
}

/* Interrupts the cell of the running command's session through the daemon
 * (on a connection of its own: the command's waits for the response). */
static void send_interrupt(void *ud)
{
    (void)ud;
    cli *c = active_cli;
    km_err err;
    int fd = connect_daemon(c, 0, &err);
    if (fd < 0)
        return;
    json_t *rep = NULL;
    daemon_call(fd, "interrupt", json_pack("{s:s}", "session", c->session), NULL, &rep, &err);
    json_decref(rep);
    close(fd);
}

/* Nobody reads what the cell prints any more: stop it (like Ctrl-C). */
static void output_failed(void)
{
    cli *c = active_cli;
    if (c && c->ticker.mgr)
        km_interrupt(c->ticker.mgr, c->ticker.session, NULL);
    else if (c && c->session)
        send_interrupt(NULL);
}

static int tick_sigint(void *ud)
{
    (void)ud;
    return sigint_count != 0;
}

/* One API request (method, params stolen) to the daemon; returns the exit
 * status, *reply (new: the result) on success. With --json a failure is
 * also printed as {"error":{"code","message"}} (code: the exit status). */
static int call(cli *c, const char *method, json_t *params, int autostart,
                void (*ev)(void *, const json_t *), void *ud, json_t **reply)
{
    km_err err = {0, ""};
    *reply = NULL;
    int fd = connect_daemon(c, autostart, &err);
    if (fd < 0) {
        json_decref(params);
        return fail(err.code ? err.code : KM_EDAEMON, err.msg);
    }
    active_cli = c;
    daemon_callbacks cb = {ev, tick_sigint, send_interrupt, ud};
    int rc = daemon_call(fd, method, params, &cb, reply, &err);
    close(fd);
    if (rc) {
        if (c->json && rc != KM_EDAEMON) {
            json_t *e = json_pack("{s:{s:i s:s}}", "error", "code", rc, "message", err.msg);
            print_json(e);
            json_decref(e);
        }
        return fail(rc, err.msg);
    }
    return 0;
}

/* Warnings of an exec reply go to stderr in every mode: with --json they
 * are also in the first result, and stdout stays one object per block. */
static void print_warnings(const json_t *rep)
{
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(rep, "warnings"), i, w)
    {
        put_msg("kernelmgr: warning: ", json_string_value(w));
    }
}

/* The session options given on the command line, as API params. */
static void add_session_opts(const cli *c, json_t *req, const char *ws)
{
    if (c->network >= 0)
        json_object_set_new(req, "network", json_string(c->network ? "on" : "off"));
    if (c->memory_s)
        json_object_set_new(req, "memory", json_string(c->memory_s));
    if (c->cpus > 0)
        json_object_set_new(req, "cpus", json_real(c->cpus));
    if (c->cpu_time > 0)
        json_object_set_new(req, "cpu_time", json_real(c->cpu_time));
    if (c->python)
        json_object_set_new(req, "python", json_string(c->python));
    if (ws)
        json_object_set_new(req, "workspace", json_string(ws));
    if (c->sandbox)
        json_object_set_new(req, "sandbox", json_string(c->sandbox));
    if (c->env)
        json_object_set(req, "env", c->env);
}

static int cmd_exec(cli *c)
{
    if (!c->session)
        return usage_error("exec needs --session NAME");
    if (!km_name_valid(c->session))
        return usage_error("invalid session name \"%s\"", c->session);
    char why[512];
    int badcode;
    char *code = read_code_checked(c, &badcode, why, sizeof why);
    if (!code)
        return badcode ? fail(KM_EUSAGE, why) : usage_error("%s", why);
    char *ws = NULL;
    if (c->workspace && !(ws = realpath(c->workspace, NULL))) {
        free(code);
        return usage_error("--workspace %s: %s", c->workspace, strerror(errno));
    }
    json_t *req = json_pack("{s:s s:s s:s s:b s:b}", "session", c->session, "code", code, "lang",
                            c->lang ? c->lang : "auto", "continue_on_error", c->continue_on_error,
                            "stream", 1);
    /* stream text as bytes after each event line, not as a JSON string to
     * parse (daemon.h): a long output runs at the kernel's rate */
    json_object_set_new(req, "raw_text", json_true());
    free(code);
    if (c->timeout > 0)
        json_object_set_new(req, "timeout", json_real(c->timeout));
    add_session_opts(c, req, ws);
    free(ws);
    render_ctx rc = {c, 0, {0, 0}};
    ticker_start(c, NULL, NULL);
    json_t *rep;
    int st = call(c, "exec", req, 1, on_event, &rc, &rep);
    ticker_end(c);
    if (st)
        return st;
    print_warnings(rep);
    st = exec_status(c, rep);
    json_decref(rep);
    return sigint_count ? 130 : st;
}

static void print_json(const json_t *o)
{
    char *s = json_dumps(o, JSON_COMPACT);
    if (s)
        puts(s);
    free(s);
}

/* sessions --repair NAME: the daemon's session.repair, its message said. */
static int cmd_repair(cli *c)
{
    json_t *req = json_pack("{s:s}", "session", c->repair);
    json_t *rep;
    int st = call(c, "session.repair", req, 1, NULL, NULL, &rep);
    if (st)
        return st;
    if (c->json)
        print_json(rep);
    else
        put_msg("kernelmgr: ", json_string_value(json_object_get(rep, "message")));
    json_decref(rep);
    return 0;
}

/* ------------------------------------------- commands that are one request */

/* What `sessions`, `close`, ... add to their request beyond the session. */
static void build_close(cli *c, json_t *req)
{
    if (c->keep)
        json_object_set_new(req, "keep", json_true());
}

static void build_connection_file(cli *c, json_t *req)
{
    json_object_set_new(req, "lang", json_string(c->lang ? c->lang : "python"));
}

static void build_export(cli *c, json_t *req)
{
    if (c->kernel_name)
        json_object_set_new(req, "kernel_name", json_string(c->kernel_name));
}

/* sessions --repair NAME is session.repair instead; -1 without it. */
static int sessions_repair(cli *c)
{
    return c->repair ? cmd_repair(c) : -1;
}

/* listing sessions must not start a daemon just to say "none" */
static void sessions_no_daemon(cli *c)
{
    if (c->json)
        puts("[]");
    else
        puts("no sessions (no daemon running)");
}

/* How each prints its reply (rep borrowed); the exit status. */
static int print_sessions(cli *c, const char *name, json_t *rep)
{
    json_t *ss = json_object_get(rep, "sessions");
    if (c->json) {
        print_json(ss);
    } else {
        size_t i;
        json_t *s;
        if (!json_array_size(ss))
            puts("no sessions");
        json_t *pool = json_object_get(rep, "pool");
        if (json_integer_value(json_object_get(pool, "size")))
            printf("warm pool: %lld of %lld ready\n",
                   (long long)json_integer_value(json_object_get(pool, "ready")),
                   (long long)json_integer_value(json_object_get(pool, "size")));
        json_array_foreach(ss, i, s)
        {
            json_t *k = json_object_get(s, "kernels");
            char *ws =
                termsafe_escape(json_string_value(json_object_get(s, "workspace")) ?: "",
                                strlen(json_string_value(json_object_get(s, "workspace")) ?: ""),
                                TERMSAFE_NAME, NULL, NULL);
            /* one column per language of the daemon's table */
            printf("%-20s %-5s", json_string_value(json_object_get(s, "name")),
                   json_is_true(json_object_get(s, "busy")) ? "busy" : "idle");
            const char *ln;
            json_t *kv;
            json_object_foreach(k, ln, kv)
            {
                char *lsafe = termsafe_escape(ln, strlen(ln), TERMSAFE_NAME, NULL, NULL);
                printf(" %s:%-8s", lsafe ? lsafe : "?", json_is_null(kv) ? "-" : "live");
                free(lsafe);
            }
            printf(" %s\n", ws ? ws : "?");
            free(ws);
        }
    }
    return 0;
}

static int print_files(cli *c, const char *name, json_t *rep)
{
    if (c->json) {
        print_json(rep);
    } else {
        size_t i;
        json_t *f;
        /* names are the sandbox's: always escaped, one per line */
        fputs("workspace: ", stdout);
        termsafe_fputs(stdout, json_string_value(json_object_get(rep, "workspace")), TERMSAFE_NAME);
        fputc('\n', stdout);
        json_array_foreach(json_object_get(rep, "files"), i, f)
        {
            const char *mime = json_string_value(json_object_get(f, "mime"));
            char *m = termsafe_escape(mime ? mime : "", mime ? strlen(mime) : 0, TERMSAFE_NAME,
                                      NULL, NULL);
            printf("%10lld  %-24s ", (long long)json_integer_value(json_object_get(f, "size")),
                   m ? m : "?");
            free(m);
            termsafe_fputs(stdout, json_string_value(json_object_get(f, "path")), TERMSAFE_NAME);
            fputc('\n', stdout);
        }
        json_int_t left = json_integer_value(json_object_get(rep, "files_omitted"));
        if (left)
            printf("(%lld more entries not listed)\n", (long long)left);
        /* never a listing with holes that looks complete */
        const char *why = json_string_value(
            json_object_get(json_object_get(json_object_get(rep, "truncated"), "files"), "reason"));
        if (why) {
            fputs("(incomplete: ", stdout);
            termsafe_fputs(stdout, why, TERMSAFE_NAME);
            fputs(")\n", stdout);
        }
    }
    return 0;
}

static int print_connection_file(cli *c, const char *name, json_t *rep)
{
    const char *p = json_string_value(json_object_get(rep, "connection_file"));
    if (c->json)
        print_json(rep);
    else
        puts(p ? p : "");
    return 0;
}

static int print_export(cli *c, const char *name, json_t *rep)
{
    json_t *nb = json_object_get(rep, "notebook");
    size_t wi;
    json_t *w;
    json_t *kmmd = json_object_get(json_object_get(nb, "metadata"), "kernelmgr");
    json_array_foreach(json_object_get(kmmd, "warnings"), wi, w)
    {
        put_msg("kernelmgr: warning: ", json_string_value(w));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s", c->output ? c->output : "");
    if (!path[0])
        snprintf(path, sizeof path, "%s.ipynb", name);
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f)
        return fail(KM_EINTERNAL, strerror(errno));
    int werr = json_dumpf(nb, f, JSON_INDENT(1) | JSON_ENSURE_ASCII) ? (errno ? errno : EIO) : 0;
    if (!werr && fputc('\n', f) == EOF)
        werr = errno;
    if (f != stdout) {
        if ((fclose(f) || werr) && !werr)
            werr = errno ? errno : EIO;
        if (werr) {
            /* no truncated notebook is left behind */
            unlink(path);
            fprintf(stderr, "kernelmgr: cannot write %s: %s\n", path, strerror(werr));
            return KM_EOUTPUT;
        }
        if (c->json)
            printf("{\"notebook\":\"%s\",\"cells\":%zu}\n", path,
                   json_array_size(json_object_get(nb, "cells")));
        else
            printf("wrote %s (%zu cells)\n", path, json_array_size(json_object_get(nb, "cells")));
    }
    return 0;
}

typedef struct cli_command cli_command;
static int cmd_simple(cli *c, const cli_command *k);

/* `kernelmgr install`: the API's packages.install, as MCP's install_packages. */

/* new: path made absolute with its directory resolved (realpath) and its
 * last component kept as given, so a symbolic link there stays one. NULL
 * with errno (ENOENT for a missing directory, EINVAL for a path ending in
 * "/", "." or ".."). */
static char *absolute_keep_last(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!*base || !strcmp(base, ".") || !strcmp(base, "..")) {
        errno = EINVAL;
        return NULL;
    }
    char *dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    if (!dir)
        return NULL;
    char *real = realpath(*dir ? dir : "/", NULL);
    free(dir);
    if (!real)
        return NULL;
    char *abs = cm_path_join(real, base);
    free(real);
    if (!abs)
        errno = ENOMEM;
    return abs;
}

static int cmd_install(cli *c)
{
    if (!c->session)
        return usage_error("install needs --session NAME");
    if (!km_name_valid(c->session))
        return usage_error("invalid session name \"%s\"", c->session);
    const char *manager = c->manager ? c->manager : "pip";
    if (strcmp(manager, "pip") && strcmp(manager, "npm"))
        return usage_error("--manager must be pip or npm (got \"%s\")", manager);
    if (!c->npos || c->npos > 50)
        return usage_error("install needs 1 to 50 package names");
    json_t *pk = json_array();
    for (int i = 0; i < c->npos; i++)
        json_array_append_new(pk, json_string(c->pos[i]));
    json_t *req =
        json_pack("{s:s s:s s:o}", "session", c->session, "manager", manager, "packages", pk);
    if (c->allowlist) {
        /* absolute for the daemon (another cwd), but the last component as
         * given: the daemon refuses a symbolic link there, which resolving
         * it here would hide */
        char *abs = absolute_keep_last(c->allowlist);
        if (!abs) {
            json_decref(req);
            return usage_error("--allowlist %s: %s", c->allowlist, strerror(errno));
        }
        json_object_set_new(req, "allowlist", json_string(abs));
        free(abs);
    }
    json_t *rep;
    int st = call(c, "packages.install", req, 1, NULL, NULL, &rep);
    if (st)
        return st;
    if (c->json) {
        print_json(rep);
    } else {
        size_t i;
        json_t *inst;
        printf("installed for session %s (%s):", c->session, manager);
        json_array_foreach(json_object_get(rep, "installed"), i, inst)
        {
            printf("%s %s %s", i ? "," : "", json_string_value(json_object_get(inst, "name")),
                   json_string_value(json_object_get(inst, "version")) ?: "?");
        }
        putchar('\n');
    }
    json_decref(rep);
    return 0;
}

/* `serve`: this binary has no gateway (gateway.h, "Two binaries"), so the
 * command continues in kernelmgr-gateway beside it, in this process: a
 * daemon can then serve HTTP later too (http.start), at the cost of loading
 * libwebsockets and OpenSSL once per daemon (about 5 ms, 2 MiB of RSS), never
 * per `exec`. Returns only when that binary cannot run, with its path in bin
 * (binsize bytes) and errno set. */
static void exec_gateway_binary(cli *c, char *bin, size_t binsize)
{
    char dir[4096];
    bin[0] = 0;
    if (klaunch_self_dir(dir, sizeof dir)) {
        snprintf(bin, binsize, "kernelmgr-gateway (the kernelmgr binary's directory is unknown)");
        errno = ENOENT;
        return;
    }
    char *path = cm_path_join(dir, "kernelmgr-gateway");
    char **av = calloc((size_t)c->argc + 1, sizeof *av);
    if (!path || !av) {
        free(path);
        free(av);
        errno = ENOMEM;
        return;
    }
    snprintf(bin, binsize, "%s", path);
    av[0] = path;
    for (int i = 1; i < c->argc; i++)
        av[i] = c->argv[i];
    fflush(NULL);
    execv(path, av);
    int e = errno;
    free(path);
    free(av);
    errno = e;
}

/* `serve --http` on a home whose daemon already runs: that daemon starts
 * serving HTTP (http.start), its sessions and kernels as they are. */
static int serve_http_in_running_daemon(cli *c)
{
    json_t *hi = NULL;
    if (call(c, "ping", NULL, 0, NULL, NULL, &hi))
        return KM_EDAEMON;
    int known = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(hi, "methods"), i, m)
    {
        if (json_is_string(m) && !strcmp(json_string_value(m), "http.start"))
            known = 1;
    }
    int pid = (int)json_integer_value(json_object_get(hi, "pid"));
    json_decref(hi);
    if (!known) {
        char why[2600];
        snprintf(why, sizeof why,
                 "the daemon serving %s (pid %d) is older than this kernelmgr and cannot start "
                 "serving HTTP: stop it with `kernelmgr serve --stop` (its kernels end: "
                 "variables are lost, workspaces and sessions stay), then run `kernelmgr serve "
                 "--http %s`",
                 c->home, pid, c->cfg.http);
        return fail(KM_EUSAGE, why);
    }
    /* the daemon runs elsewhere: TLS files by absolute path */
    char *cert = c->cfg.http_tls_cert[0] ? realpath(c->cfg.http_tls_cert, NULL) : NULL;
    char *key = c->cfg.http_tls_key[0] ? realpath(c->cfg.http_tls_key, NULL) : NULL;
    if ((c->cfg.http_tls_cert[0] && !cert) || (c->cfg.http_tls_key[0] && !key)) {
        char why[2200];
        snprintf(why, sizeof why, "TLS file %s: %s",
                 cert ? c->cfg.http_tls_key : c->cfg.http_tls_cert, strerror(errno));
        free(cert);
        free(key);
        return fail(KM_EUSAGE, why);
    }
    json_t *params =
        json_pack("{s:s s:b}", "listen", c->cfg.http, "insecure", c->cfg.http_insecure);
    if (cert)
        json_object_set_new(params, "tls_cert", json_string(cert));
    if (key)
        json_object_set_new(params, "tls_key", json_string(key));
    free(cert);
    free(key);
    json_t *rep = NULL;
    int st = call(c, "http.start", params, 0, NULL, NULL, &rep);
    if (st)
        return st;
    const char *url = json_string_value(json_object_get(rep, "url"));
    fprintf(stderr,
            "kernelmgr: the daemon serving %s (pid %d) %s the Jupyter gateway at %s (token in "
            "%s/http-token)\n",
            c->home, pid,
            json_is_true(json_object_get(rep, "started")) ? "now serves" : "already serves",
            url ? url : "?", c->home);
    json_decref(rep);
    return 0;
}

static int cmd_serve(cli *c)
{
    if (c->stop) {
        km_err err;
        int fd = connect_daemon(c, 0, &err);
        if (fd < 0) {
            puts("no daemon running");
            return 0;
        }
        close(fd);
        json_t *rep;
        int st = call(c, "shutdown", NULL, 0, NULL, NULL, &rep);
        json_decref(rep);
        /* wait until the socket is gone: kernels are stopped by then */
        char sock[256];
        daemon_socket_path(c->home, sock, sizeof sock, NULL);
        for (int i = 0; i < 200 && access(sock, F_OK) == 0; i++) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        return st;
    }
    if (c->pool >= 0)
        c->cfg.pool = (unsigned)c->pool;
    if (c->http)
        snprintf(c->cfg.http, sizeof c->cfg.http, "%s", c->http);
    if (c->tls_cert)
        snprintf(c->cfg.http_tls_cert, sizeof c->cfg.http_tls_cert, "%s", c->tls_cert);
    if (c->tls_key)
        snprintf(c->cfg.http_tls_key, sizeof c->cfg.http_tls_key, "%s", c->tls_key);
    if (c->insecure)
        c->cfg.http_insecure = 1;
    if (c->cfg.http[0]) {
        char why[512];
        if (gateway_listen_valid(c->cfg.http, c->cfg.http_tls_cert[0] != 0, c->cfg.http_insecure,
                                 why, sizeof why))
            return fail(KM_EUSAGE, why);
        if ((c->cfg.http_tls_cert[0] != 0) != (c->cfg.http_tls_key[0] != 0))
            return fail(KM_EUSAGE, "TLS needs both --tls-cert and --tls-key");
    }
    if (!gateway_built_in()) {
        char bin[4200];
        exec_gateway_binary(c, bin, sizeof bin);
        char why[4400];
        snprintf(why, sizeof why, "serving HTTP needs %s (built beside kernelmgr by make): %s", bin,
                 strerror(errno));
        if (c->cfg.http[0])
            return fail(KM_EINTERNAL, why);
        fprintf(stderr, "kernelmgr: note: %s; this daemon cannot serve HTTP later\n", why);
    }
    km_err err = {0, ""};
    int st = daemon_serve(c->home, &c->cfg, &err);
    if (st == DAEMON_SERVE_ALREADY) {
        if (c->cfg.http[0])
            return serve_http_in_running_daemon(c);
        fprintf(stderr, "kernelmgr: a daemon already serves %s\n", c->home);
        return 0;
    }
    if (st)
        return fail(st, err.msg);
    return 0;
}

static int cmd_kernelspec(cli *c)
{
    if (c->npos != 1 || strcmp(c->pos[0], "install"))
        return usage_error("usage: kernelmgr kernelspec install [--user | --prefix DIR] "
                           "[--sandbox strict|none] [--python PATH] [--network on|off] "
                           "[--memory SIZE] [--cpus N] [--cpu-time S]");
    if (c->user && c->prefix)
        return usage_error("kernelspec install: give --user or --prefix DIR, not both");
    char self[4096];
    const char *env = getenv("KERNELMGR_KERNEL_DIR");
    if (env && *env)
        snprintf(self, sizeof self, "%s", env);
    else if (klaunch_self_dir(self, sizeof self))
        return fail(KM_EINTERNAL, "cannot find the kernelmgr binary's directory");
    kspecinst_opts o = {
        .prefix = c->prefix,
        .kernel_dir = self,
        .langs = &c->cfg.langs,
        .sandbox = c->sandbox,
        .python = c->python,
        .memory = c->memory_s,
        .network = c->network,
        .cpus = c->cpus,
        .cpu_time = c->cpu_time,
        .version = KM_VERSION,
    };
    char why[1024];
    json_t *done = kspecinst_install(&o, why, sizeof why);
    if (!done)
        return fail(KM_EINTERNAL, why);
    if (c->json) {
        json_t *o2 = json_pack("{s:o}", "installed", done);
        print_json(o2);
        json_decref(o2);
        return 0;
    }
    size_t i;
    json_t *e;
    json_array_foreach(done, i, e)
    {
        printf("installed kernelspec %s in %s\n", json_string_value(json_object_get(e, "name")),
               json_string_value(json_object_get(e, "path")));
    }
    json_decref(done);
    return 0;
}

static int cmd_doctor(cli *c)
{
    if (c->npos)
        return usage_error("doctor takes no arguments");
    json_t *o = doctor_report(&c->cfg, c->home, KM_VERSION);
    if (!o)
        return fail(KM_EINTERNAL, "out of memory");
    if (c->json)
        print_json(o);
    else
        doctor_render(stdout, o);
    int ok = json_is_true(json_object_get(json_object_get(o, "sandbox"), "ok"));
    json_decref(o);
    /* 1: kernels with the configured sandbox level cannot start here */
    return ok ? 0 : 1;
}

/* ---------------------------------------------------------------- parsing */

enum {
    OPT_LANG = 256,
    OPT_TIMEOUT,
    OPT_NETWORK,
    OPT_MEMORY,
    OPT_HTTP,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_INSECURE,
    OPT_WORKSPACE,
    OPT_PYTHON,
    OPT_SANDBOX,
    OPT_JSON,
    OPT_CONTINUE,
    OPT_CONFIG,
    OPT_SESSION,
    OPT_KEEP,
    OPT_REPAIR,
    OPT_KERNEL,
    OPT_USER,
    OPT_PREFIX,
    OPT_POOL,
    OPT_STOP,
    OPT_HELP,
    OPT_VERSION,
    OPT_ENV,
    OPT_CPUS,
    OPT_CPU_TIME,
    OPT_MANAGER,
    OPT_ALLOWLIST,
};

static int cli_dispatch(int argc, char **argv);

/* run / exec: the code from -c, a FILE or - (stdin) */
static int cmd_code(cli *c)
{
    if (c->npos > 1)
        return usage_error("%s takes one FILE (or - for stdin)", c->cmd);
    if (c->npos == 1 && c->code)
        return usage_error("give either -c CODE or a FILE, not both");
    if (c->npos == 1)
        c->file = c->pos[0];
    return !strcmp(c->cmd, "run") ? cmd_run(c) : cmd_exec(c);
}

/* `config --doc`: the docs' configuration table, from config.c's table */
static int cmd_config(cli *c)
{
    if (c->argc != 3 || strcmp(c->argv[2], "--doc"))
        return usage_error("config takes --doc (print the configuration table in markdown)");
    return kmcfg_doc(stdout) ? KM_EOUTPUT : 0;
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
};

static const cli_command cli_commands[] = {
    {"run", cmd_code, NULL, 0, NULL, NULL, NULL, NULL, 0},
    {"exec", cmd_code, NULL, 0, NULL, NULL, NULL, NULL, 0},
    {"sessions", NULL, "sessions.list", 0, NULL, print_sessions, sessions_no_daemon,
     sessions_repair, 0},
    {"close", NULL, "close", 1, build_close, NULL, NULL, NULL, 0},
    {"interrupt", NULL, "interrupt", 1, NULL, NULL, NULL, NULL, 0},
    {"restart", NULL, "restart", 1, NULL, NULL, NULL, NULL, 0},
    {"files", NULL, "files.list", 1, NULL, print_files, NULL, NULL, 0},
    {"export", NULL, "export", 1, build_export, print_export, NULL, NULL, 0},
    {"connection-file", NULL, "connection_file", 1, build_connection_file, print_connection_file,
     NULL, NULL, 0},
    {"serve", cmd_serve, NULL, 0, NULL, NULL, NULL, NULL, 0},
    {"doctor", cmd_doctor, NULL, 0, NULL, NULL, NULL, NULL, 0},
    {"kernelspec", cmd_kernelspec, NULL, 0, NULL, NULL, NULL, NULL, 0},
    {"install", cmd_install, NULL, 0, NULL, NULL, NULL, NULL, 0},
    {"mcp", cmd_mcp, NULL, 0, NULL, NULL, NULL, NULL, 1},
    {"config", cmd_config, NULL, 0, NULL, NULL, NULL, NULL, 1},
};

static int cmd_simple(cli *c, const cli_command *k)
{
    int st = k->instead ? k->instead(c) : -1;
    if (st >= 0)
        return st;
    const char *name = c->npos ? c->pos[0] : c->session;
    if (k->needs_session && !name)
        return usage_error("%s needs a session NAME", c->cmd);
    json_t *req = json_object();
    if (name)
        json_object_set_new(req, "session", json_string(name));
    if (k->build)
        k->build(c, req);
    json_t *rep;
    km_err err;
    if (k->no_daemon) {
        int fd = connect_daemon(c, 0, &err);
        if (fd < 0) {
            json_decref(req);
            k->no_daemon(c);
            return 0;
        }
        close(fd);
    }
    st = call(c, k->method, req, !k->no_daemon, NULL, NULL, &rep);
    if (st)
        return st;
    print_warnings(rep); /* close: a workspace it kept */
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
    active_cli = NULL; /* it was cli_dispatch's */
    int before = errno;
    errno = 0;
    if ((fflush(stdout) == EOF || ferror(stdout)) && !out_errno)
        out_errno = errno ? errno : before ? before : EIO;
    errno = 0;
    if (fclose(stdout) && !out_errno)
        out_errno = errno ? errno : EIO;
    if (out_errno) {
        fprintf(stderr, "kernelmgr: cannot write the output: %s\n", strerror(out_errno));
        /* a run stopped by SIGPIPE keeps its 128 + signal status */
        if (st < 128)
            st = KM_EOUTPUT;
    }
    return st;
}

static int cli_dispatch(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"lang", required_argument, 0, OPT_LANG},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"network", required_argument, 0, OPT_NETWORK},
        {"memory", required_argument, 0, OPT_MEMORY},
        {"http", required_argument, 0, OPT_HTTP},
        {"tls-cert", required_argument, 0, OPT_TLS_CERT},
        {"tls-key", required_argument, 0, OPT_TLS_KEY},
        {"insecure", no_argument, 0, OPT_INSECURE},
        {"workspace", required_argument, 0, OPT_WORKSPACE},
        {"python", required_argument, 0, OPT_PYTHON},
        {"sandbox", required_argument, 0, OPT_SANDBOX},
        {"json", no_argument, 0, OPT_JSON},
        {"continue-on-error", no_argument, 0, OPT_CONTINUE},
        {"config", required_argument, 0, OPT_CONFIG},
        {"session", required_argument, 0, OPT_SESSION},
        {"keep", no_argument, 0, OPT_KEEP},
        {"repair", required_argument, 0, OPT_REPAIR},
        {"kernel", required_argument, 0, OPT_KERNEL},
        {"user", no_argument, 0, OPT_USER},
        {"prefix", required_argument, 0, OPT_PREFIX},
        {"pool", required_argument, 0, OPT_POOL},
        {"stop", no_argument, 0, OPT_STOP},
        {"output", required_argument, 0, 'o'},
        {"help", no_argument, 0, OPT_HELP},
        {"version", no_argument, 0, OPT_VERSION},
        {"env", required_argument, 0, OPT_ENV},
        {"cpus", required_argument, 0, OPT_CPUS},
        {"cpu-time", required_argument, 0, OPT_CPU_TIME},
        {"manager", required_argument, 0, OPT_MANAGER},
        {"allowlist", required_argument, 0, OPT_ALLOWLIST},
        {0, 0, 0, 0},
    };
    cli c;
    memset(&c, 0, sizeof c);
    c.network = -1;
    c.pool = -1;
    if (argc < 2)
        return usage_error("no command given");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage_text, stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        puts("kernelmgr " KM_VERSION);
        return 0;
    }
    c.cmd = argv[1];
    c.argc = argc;
    c.argv = argv;
    const cli_command *command = NULL;
    for (size_t i = 0; i < sizeof cli_commands / sizeof cli_commands[0]; i++)
        if (!strcmp(cli_commands[i].name, c.cmd))
            command = &cli_commands[i];
    if (!command)
        return usage_error("unknown command \"%s\"", c.cmd);
    if (command->own_args)
        return command->run(&c);

    optind = 2;
    opterr = 0;
    int opt;
    while ((opt = getopt_long(argc, argv, ":c:o:", longopts, NULL)) != -1) {
        char *end;
        switch (opt) {
        case 'c':
            c.code = optarg;
            break;
        case 'o':
            c.output = optarg;
            break;
        case OPT_LANG:
            /* checked by the manager (the daemon for exec), which knows the
             * configured languages (lang.h) */
            if (!*optarg)
                return usage_error("--lang must be python, bash, a configured language or auto");
            c.lang = optarg;
            break;
        case OPT_TIMEOUT:
            c.timeout = strtod(optarg, &end);
            if (*end || end == optarg || !(c.timeout > 0) || c.timeout > 604800)
                return usage_error("--timeout must be a positive number of seconds (got \"%s\")",
                                   optarg);
            break;
        case OPT_NETWORK:
            if (strcmp(optarg, "on") && strcmp(optarg, "off"))
                return usage_error("--network must be on or off (got \"%s\")", optarg);
            c.network = !strcmp(optarg, "on");
            break;
        /* the ranges are the session options' table (dtier.h) */
        case OPT_MEMORY:
            if (kmcfg_parse_size(optarg, &c.memory) ||
                c.memory < (uint64_t)dtier_sessopt_find("memory")->min)
                return usage_error("--memory must be a size of at least %lluM, like 512M or 2G "
                                   "(got \"%s\")",
                                   (unsigned long long)dtier_sessopt_find("memory")->min >> 20,
                                   optarg);
            c.memory_s = optarg;
            break;
        case OPT_CPUS: {
            const dtier_sessopt *o = dtier_sessopt_find("cpus");
            c.cpus = strtod(optarg, &end);
            if (*end || end == optarg || !(c.cpus >= o->min) || c.cpus > o->max)
                return usage_error("--cpus must be a number of CPUs from %g to %.0f, like 1 or "
                                   "0.5 (got \"%s\")",
                                   o->min, o->max, optarg);
            break;
        }
        case OPT_CPU_TIME: {
            const dtier_sessopt *o = dtier_sessopt_find("cpu_time");
            c.cpu_time = strtod(optarg, &end);
            if (*end || end == optarg || !(c.cpu_time >= o->min) || c.cpu_time > o->max)
                return usage_error("--cpu-time must be a number of seconds from %g to %.0f (got "
                                   "\"%s\")",
                                   o->min, o->max, optarg);
            break;
        }
        case OPT_MANAGER:
            c.manager = optarg;
            break;
        case OPT_ALLOWLIST:
            c.allowlist = optarg;
            break;
        case OPT_WORKSPACE:
            c.workspace = optarg;
            break;
        case OPT_PYTHON:
            if (optarg[0] != '/')
                return usage_error("--python must be an absolute path");
            c.python = optarg;
            break;
        case OPT_SANDBOX:
            if (strcmp(optarg, "strict") && strcmp(optarg, "none"))
                return usage_error("--sandbox must be strict or none (got \"%s\")", optarg);
            c.sandbox = optarg;
            break;
        case OPT_JSON:
            c.json = 1;
            break;
        case OPT_CONTINUE:
            c.continue_on_error = 1;
            break;
        case OPT_CONFIG:
            c.config = optarg;
            break;
        case OPT_SESSION:
            c.session = optarg;
            break;
        case OPT_KEEP:
            c.keep = 1;
            break;
        case OPT_REPAIR:
            c.repair = optarg;
            break;
        case OPT_KERNEL:
            c.kernel_name = optarg;
            break;
        case OPT_USER:
            c.user = 1;
            break;
        case OPT_PREFIX:
            c.prefix = optarg;
            break;
        case OPT_POOL:
            c.pool = (int)strtol(optarg, &end, 10);
            if (*end || c.pool < 0 || c.pool > 64)
                return usage_error("--pool must be an integer 0..64");
            break;
        case OPT_STOP:
            c.stop = 1;
            break;
        case OPT_HTTP:
            c.http = optarg;
            break;
        case OPT_TLS_CERT:
        case OPT_TLS_KEY:
            if (optarg[0] != '/')
                return usage_error("--%s must be an absolute path",
                                   opt == OPT_TLS_CERT ? "tls-cert" : "tls-key");
            if (opt == OPT_TLS_CERT)
                c.tls_cert = optarg;
            else
                c.tls_key = optarg;
            break;
        case OPT_INSECURE:
            c.insecure = 1;
            break;
        case OPT_HELP:
            fputs(usage_text, stdout);
            return 0;
        case OPT_VERSION:
            puts("kernelmgr " KM_VERSION);
            return 0;
        case OPT_ENV: {
            /* a repeated NAME keeps its last value (counted once) */
            char why[512];
            const char *eq = strchr(optarg, '=');
            char *name = eq ? strndup(optarg, (size_t)(eq - optarg)) : NULL;
            int repeat = name && c.env && json_object_get(c.env, name);
            if (kenv_check_entry(repeat ? NULL : &c.env_budget, "--env", optarg, why, sizeof why) <
                0) {
                free(name);
                return usage_error("%s", why);
            }
            json_t *val = json_string(eq + 1);
            if (!val) {
                usage_error("--env %s: the value is not UTF-8 text", name);
                free(name);
                return KM_EUSAGE;
            }
            if (!c.env)
                c.env = json_object();
            json_object_set_new(c.env, name, val);
            free(name);
            break;
        }
        case ':':
            return usage_error("option %s needs a value", argv[optind - 1]);
        default:
            return usage_error("unknown option \"%s\"", argv[optind - 1]);
        }
    }
    for (int i = optind; i < argc; i++) {
        if (c.npos >= 64)
            return usage_error("too many arguments");
        c.pos[c.npos++] = argv[i];
    }

    if (resolve_home(&c))
        return KM_EUSAGE;
    /* the home is trusted state: refused before anything in it is read */
    char home_why[1024];
    if (kmhome_prepare(c.home, 0, home_why, sizeof home_why)) {
        fprintf(stderr, "kernelmgr: %s\n", home_why);
        return KM_EUSAGE;
    }
    active_cli = &c;
    kmcfg_defaults(&c.cfg);
    char why[1024];
    char cfgpath[4096];
    if (c.config)
        snprintf(cfgpath, sizeof cfgpath, "%s", c.config);
    else
        snprintf(cfgpath, sizeof cfgpath, "%s/config.json", c.home);
    if (kmcfg_load_file(&c.cfg, cfgpath, c.config ? KMCFG_MUST_EXIST : KMCFG_HOME_FILE, why,
                        sizeof why)) {
        fprintf(stderr, "kernelmgr: invalid configuration: %s\n", why);
        return KM_EUSAGE;
    }
    if (c.config) {
        char *real = realpath(c.config, NULL);
        if (real)
            c.config = real; /* the daemon runs elsewhere */
    }
    /* CLI options override the configuration */
    if (c.network >= 0)
        c.cfg.network = c.network;
    if (c.memory)
        c.cfg.memory = c.memory;
    if (c.cpus > 0)
        c.cfg.cpus = c.cpus;
    if (c.cpu_time > 0)
        c.cfg.cpu_time = c.cpu_time;
    if (c.python)
        snprintf(c.cfg.python, sizeof c.cfg.python, "%s", c.python);
    if (c.sandbox)
        snprintf(c.cfg.sandbox, sizeof c.cfg.sandbox, "%s", c.sandbox);

    return command->run ? command->run(&c) : cmd_simple(&c, command);
}
