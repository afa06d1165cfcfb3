/*
 * cli.c — `kernelmgr COMMAND [options]`.
 *
 * `run` drives an in-process manager (one fresh session, torn down at the
 * end); every other session command talks to the daemon and starts it when
 * none runs, so state survives between CLI calls.
 */
#include "kernelmgr/frontends/cli.h"
#include "kernelmgr/frontends/gwdaemon.h"
#include "common/cm_text.h"
#include "kernelmgr/engine/codeblocks.h"
#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/sessopt.h"
#include "kernelmgr/service/daemon.h"
#include "kernelmgr/service/dtier.h"
#include "kernelmgr/frontends/doctor.h"
#include "common/cm_install.h"
#include "kernelmgr/frontends/gateway.h"
#include "kernelmgr/engine/mkclient.h"
#include "kernelmgr/engine/mklaunch.h"
#include "kernelmgr/frontends/kspecinstall.h"
#include "kernelmgr/engine/km.h"
#include "kernelmgr/engine/kmhome.h"
#include "kernelmgr/engine/result.h"
#include "common/cm_size.h"
#include "common/cm_termsafe.h"
#include "kernels/server/kenv.h"
#include "common/cm_clock.h"
#include "common/cm_io.h"
#include "common/cm_path.h"
#include "jp.h"

#include <sodium.h>

#include <errno.h>
#include <fcntl.h>
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
    const char *tag;                       /* --tag of snapshot, restore, fork */
    const char *http, *tls_cert, *tls_key; /* serve --http ... */
    int insecure;
    json_t *env; /* --env: {NAME: "value"}, NULL when none was given */
    kenv_budget env_budget;
    double timeout;
    int network;                      /* -1 unset, else KM_NET_* */
    char net_allow[KM_NET_ALLOW_MAX]; /* KM_NET_ALLOW: the canonical list */
    uint64_t memory;
    /* the plain session options (sessopt.def: their flags' rows name the
     * field), unset when not given; the others are the fields above */
    km_session_opts so;
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
static char *read_code_checked(cli *c, int *bad, km_err *err);
static char *read_code(cli *c, km_err *err)
{
    if (c->code)
        return strdup(c->code);
    const char *f = c->file;
    if (!f) {
        km_err_set(err, KM_EUSAGE, "no code given: use -c CODE, a FILE, or - for stdin");
        return NULL;
    }
    FILE *fp = strcmp(f, "-") ? fopen(f, "r") : stdin;
    if (!fp) {
        km_err_set(err, KM_EUSAGE, "%s: %s", f, strerror(errno));
        return NULL;
    }
    /* keeps at most code_max + 1 bytes; the rest is counted, so the error
     * can say how large the code was */
    uint64_t keep = c->cfg.code_max ? c->cfg.code_max + 1 : (64u << 20);
    size_t cap = 65536, n = 0, total = 0;
    char *buf = malloc(cap);
    char sink[65536];
    if (!buf)
        km_err_set(err, KM_EUSAGE, "out of memory");
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
                km_err_set(err, KM_EUSAGE, "%s: out of memory", f);
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
        km_err_set(err, KM_EUSAGE, "%s: %s", f, strerror(rerr));
        return NULL;
    }
    if (buf) {
        buf[n] = 0;
        c->code_len = total;
    }
    return buf;
}

static char *read_code_checked(cli *c, int *bad, km_err *err)
{
    *bad = 0;
    c->code_len = 0;
    char *code = read_code(c, err);
    if (!code)
        return NULL;
    size_t len = c->code ? strlen(code) : c->code_len;
    if (cblocks_check_code(code, len, c->cfg.code_max, err)) {
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

/* The streaming printer's events, a row per event type (others are not
 * shown); each runs under out_lock, the ticker cleared. */
static void ev_stream(render_ctx *rc, const json_t *ev)
{
    if (rc->c->json)
        return;
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
}

static void ev_notice(render_ctx *rc, const json_t *ev)
{
    /* e.g. waiting for a cell another client started: stderr in every mode */
    put_msg("kernelmgr: ", json_string_value(json_object_get(ev, "message")));
}

static void ev_result(render_ctx *rc, const json_t *ev)
{
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

static const struct {
    const char *type;
    void (*fn)(render_ctx *rc, const json_t *ev);
} ev_printers[] = {
    {"stream", ev_stream},
    {"notice", ev_notice},
    {"result", ev_result},
};

static void on_event(void *ud, const json_t *ev)
{
    render_ctx *rc = ud;
    const char *type = json_string_value(json_object_get(ev, "event"));
    if (!type)
        return;
    pthread_mutex_lock(&out_lock);
    clear_ticker_locked(&rc->c->ticker);
    for (size_t i = 0; i < sizeof ev_printers / sizeof *ev_printers; i++)
        if (!strcmp(type, ev_printers[i].type)) {
            ev_printers[i].fn(rc, ev);
            break;
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
    *so = c->so;
    so->network = c->network;
    so->network_allow = c->network == KM_NET_ALLOW ? c->net_allow : NULL;
    so->memory = c->memory;
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
    km_err why = {0};
    int badcode;
    char *code = read_code_checked(c, &badcode, &why);
    if (!code)
        return badcode ? fail(KM_EUSAGE, why.msg) : usage_error("%s", why.msg);
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
        km_err_set(&err, KM_EINTERNAL, "stopped by signal %d (%s) before the code ran",
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
        json_object_set_new(req, "network", km_net_json(c->network, c->net_allow));
    if (c->memory_s)
        json_object_set_new(req, "memory", json_string(c->memory_s));
    km_sessopt_params(&c->so, req);
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
    km_err why = {0};
    int badcode;
    char *code = read_code_checked(c, &badcode, &why);
    if (!code)
        return badcode ? fail(KM_EUSAGE, why.msg) : usage_error("%s", why.msg);
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

/* 1 while process pid runs: exists and is not a zombie (a daemon whose
 * parent has not reaped it yet has ended). */
static int daemon_running(pid_t pid)
{
    char p[64], buf[512];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(p, "re");
    if (!f)
        return kill(pid, 0) == 0 && errno != ESRCH;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *rp = strrchr(buf, ')');
    return rp && rp[1] == ' ' && rp[2] != 'Z' && rp[2] != 'X';
}

/* snapshot, restore, fork: --tag; fork's second name is the new session */
static void build_tag(cli *c, json_t *req)
{
    if (c->tag)
        json_object_set_new(req, "tag", json_string(c->tag));
}

static int fork_check(cli *c)
{
    if (c->npos != 2)
        return usage_error("fork needs SRC and NEW: kernelmgr fork SRC NEW [--tag T]");
    return -1;
}

static void build_fork(cli *c, json_t *req)
{
    json_object_set_new(req, "new_session", json_string(c->pos[1]));
    build_tag(c, req);
}

/* One line a snapshot (--json: the reply). */
static int print_snapshot(cli *c, const char *name, json_t *rep)
{
    if (c->json) {
        print_json(rep);
        return 0;
    }
    json_t *list = json_object_get(rep, "snapshots");
    json_t *one = json_pack("[O]", rep);
    size_t i;
    json_t *v;
    json_array_foreach(list ? list : one, i, v)
    {
        const char *e = json_string_value(json_object_get(v, "error"));
        if (e) {
            printf("%s\terror: %s\n", json_string_value(json_object_get(v, "tag")), e);
            continue;
        }
        printf("%s\t%s\t%lld bytes\t%s", json_string_value(json_object_get(v, "tag")),
               json_string_value(json_object_get(v, "at")),
               (long long)json_integer_value(json_object_get(v, "bytes")),
               json_string_value(json_object_get(v, "reason")));
        const char *k;
        json_t *kv;
        json_object_foreach(json_object_get(v, "kernels"), k, kv)
        {
            json_t *lost = json_object_get(kv, "lost");
            printf("\t%s", k);
            if (json_array_size(lost)) {
                printf(" (lost:");
                size_t j;
                json_t *lv;
                json_array_foreach(lost, j, lv)
                {
                    printf(" %s", json_string_value(json_object_get(lv, "name")));
                }
                printf(")");
            }
        }
        printf("\n");
    }
    json_decref(one);
    (void)name;
    return 0;
}

static int print_restore(cli *c, const char *name, json_t *rep)
{
    if (c->json) {
        print_json(rep);
        return 0;
    }
    const char *t = json_string_value(json_object_get(rep, "tag"));
    if (json_object_get(rep, "from"))
        printf("kernelmgr: session %s forked from %s (snapshot %s); workspace %s\n",
               json_string_value(json_object_get(rep, "session")),
               json_string_value(json_object_get(rep, "from")), t,
               json_string_value(json_object_get(rep, "workspace")));
    else
        printf("kernelmgr: session %s restored from snapshot %s\n", name, t);
    return 0;
}

/* undrain is daemon.drain with "drain": false */
static void build_drain(cli *c, json_t *req)
{
    if (!strcmp(c->cmd, "undrain"))
        json_object_set_new(req, "drain", json_false());
}

/* nothing to drain, and a daemon started later is not draining */
static void drain_no_daemon(cli *c)
{
    if (c->json)
        puts("{\"draining\":false,\"daemon\":false}");
    else
        puts("no daemon running: nothing to drain (a daemon started later is not draining)");
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

/* One session's drain snapshot, as it is done (an event of daemon.drain
 * with "stream"): progress on stdout. */
static void drain_event(void *ud, const json_t *ev)
{
    cli *c = ud;
    const json_t *v = json_object_get(ev, "session");
    if (c->json || !json_is_object(v))
        return;
    const char *stt = json_string_value(json_object_get(v, "status"));
    const char *why = json_string_value(json_object_get(v, "reason"));
    printf(
        "  session %s: %s%s%s (%lld of %lld)\n", json_string_value(json_object_get(v, "session")),
        stt && !strcmp(stt, "snapshotted") ? "snapshot \"drain\" taken"
        : stt                              ? stt
                                           : "?",
        why ? ": " : "", why ? why : "", (long long)json_integer_value(json_object_get(ev, "done")),
        (long long)json_integer_value(json_object_get(ev, "of")));
    fflush(stdout);
}

static int print_drain(cli *c, const char *name, json_t *rep);

/* drain / undrain: daemon.drain, its snapshots' progress said as each is
 * done; nothing to do when no daemon runs. */
static int cmd_drain(cli *c)
{
    if (c->npos)
        return usage_error("%s takes no arguments", c->cmd);
    km_err err = {0, ""};
    int fd = connect_daemon(c, 0, &err);
    if (fd < 0) {
        drain_no_daemon(c);
        return 0;
    }
    close(fd);
    json_t *req = json_object();
    build_drain(c, req);
    if (strcmp(c->cmd, "undrain"))
        json_object_set_new(req, "stream", json_true());
    json_t *rep;
    int st = call(c, "daemon.drain", req, 0, drain_event, c, &rep);
    if (st)
        return st;
    st = print_drain(c, NULL, rep);
    json_decref(rep);
    return st;
}

/* How each prints its reply (rep borrowed); the exit status. */
static int print_drain(cli *c, const char *name, json_t *rep)
{
    if (c->json) {
        print_json(rep);
        return 0;
    }
    const char *node = json_string_value(json_object_get(rep, "node_id"));
    json_int_t n = json_integer_value(json_object_get(rep, "sessions"));
    if (json_is_true(json_object_get(rep, "draining")))
        printf("draining%s%s: no new sessions; the existing ones (%lld) keep working (undo: "
               "kernelmgr undrain)\n",
               node ? " node " : "", node ? node : "", (long long)n);
    json_int_t bad = json_integer_value(json_object_get(rep, "snapshots_failed"));
    if (bad)
        printf("%lld session(s) could not be snapshotted (above); they keep working\n",
               (long long)bad);
    if (!json_is_true(json_object_get(rep, "draining")))
        printf("not draining%s%s: new sessions are made again (%lld existing)\n",
               node ? ", node " : "", node ? node : "", (long long)n);
    return 0;
}

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

/* `kernelmgr files get|put|ls|rm`: files of any size through the API's
 * files.* methods, in chunks on one connection. files.read returns at most
 * 1 MiB per call; a files.write is one request line of at most 64 MiB, so
 * a put sends 4 MiB (5.4 MiB of base64) per call. */
#define FILES_READ_CHUNK ((json_int_t)1 << 20)
#define FILES_WRITE_CHUNK ((size_t)4 << 20)

/* One files.* call (params stolen) on fd; the exit status, *rep (new) on
 * success; a failure said as call() says it (with --json also on stdout),
 * prefixed with what was being done. */
static int files_rpc(cli *c, int fd, const char *method, json_t *params, const char *doing,
                     json_t **rep)
{
    km_err err = {0, ""};
    int rc = daemon_call(fd, method, params, NULL, rep, &err);
    if (!rc)
        return 0;
    char msg[sizeof err.msg + 512];
    snprintf(msg, sizeof msg, "%s: %s", doing, err.msg);
    if (c->json) {
        json_t *e = json_pack("{s:{s:i s:s}}", "error", "code", rc, "message", msg);
        print_json(e);
        json_decref(e);
    }
    return fail(rc, msg);
}

static int files_local_error(cli *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int files_local_error(cli *c, int code, const char *fmt, ...)
{
    char msg[4096 + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->json) {
        json_t *e = json_pack("{s:{s:i s:s}}", "error", "code", code, "message", msg);
        print_json(e);
        json_decref(e);
    }
    return fail(code, msg);
}

static const char *last_component(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* The session NAME and the path argument of files get|put|rm, checked. */
static int files_args(cli *c, int min, int max, const char *usage)
{
    if (c->npos < min || c->npos > max)
        return usage_error("usage: kernelmgr %s", usage);
    if (!km_name_valid(c->pos[0]))
        return usage_error("invalid session name \"%s\"", c->pos[0]);
    return 0;
}

/* Reads NAME:PATH chunk by chunk into *out; *total its bytes. When *out
 * is -1, the file is made from tmpl (mkstemp) once the first chunk has
 * come, so that a refusal by the daemon (no such file, no session) is said
 * whatever the local directory is. */
static int files_get_into(cli *c, int fd, const char *name, const char *path, int *out, char *tmpl,
                          const char *local, json_int_t *total)
{
    json_int_t off = 0, size = -1;
    char doing[4200];
    snprintf(doing, sizeof doing, "cannot read %s from session \"%s\"", path, name);
    for (;;) {
        json_t *rep;
        int st =
            files_rpc(c, fd, "files.read",
                      json_pack("{s:s s:s s:I s:I s:s}", "session", name, "path", path, "offset",
                                off, "length", FILES_READ_CHUNK, "encoding", "base64"),
                      doing, &rep);
        if (st)
            return st;
        const char *b64 = json_string_value(json_object_get(rep, "content"));
        size_t b64len = json_string_length(json_object_get(rep, "content"));
        int eof = json_is_true(json_object_get(rep, "eof"));
        /* the file as it was when the read began: one a cell keeps
         * appending to does not keep the read going */
        if (size < 0)
            size = json_integer_value(json_object_get(rep, "size"));
        unsigned char *bin = malloc(b64len / 4 * 3 + 3);
        size_t n = 0;
        int bad = !b64 || !bin ||
                  sodium_base642bin(bin, b64len / 4 * 3 + 3, b64, b64len, NULL, &n, NULL,
                                    sodium_base64_VARIANT_ORIGINAL) != 0;
        json_decref(rep);
        if (bad) {
            free(bin);
            return files_local_error(c, KM_EDAEMON,
                                     "%s: the daemon sent content that is not base64", doing);
        }
        if (*out < 0 && (*out = mkstemp(tmpl)) < 0) {
            free(bin);
            return files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
        }
        int werr = n && cm_write_all(*out, bin, n) ? errno : 0;
        free(bin);
        if (werr)
            return files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(werr));
        off += (json_int_t)n;
        if (eof || n == 0 || off >= size)
            break;
    }
    *total = off;
    return 0;
}

/* files get NAME PATH [-o LOCAL]: LOCAL (default: PATH's last component
 * here; a directory: that name in it; "-": stdout) is written to a
 * temporary file beside it and renamed into place only when complete. */
static int cmd_files_get(cli *c)
{
    int st = files_args(c, 2, 2, "files get NAME PATH [-o LOCAL]");
    if (st)
        return st;
    const char *name = c->pos[0], *path = c->pos[1];
    const char *o = c->output ? c->output : last_component(path);
    if (!*o)
        return usage_error("files get: PATH \"%s\" names no file (give -o LOCAL)", path);
    int to_stdout = !strcmp(o, "-");
    char local[4096];
    struct stat lst;
    if (!to_stdout && !stat(o, &lst) && S_ISDIR(lst.st_mode))
        snprintf(local, sizeof local, "%s/%s", o, last_component(path));
    else
        snprintf(local, sizeof local, "%s", o);
    km_err err = {0, ""};
    int fd = connect_daemon(c, 1, &err);
    if (fd < 0)
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    json_int_t total = 0;
    int out = to_stdout ? 1 : -1;
    char tmp[4200];
    const char *base = last_component(local);
    snprintf(tmp, sizeof tmp, "%.*s.%s.kmpart.XXXXXX", (int)(base - local), local, base);
    st = files_get_into(c, fd, name, path, &out, tmp, to_stdout ? "the output" : local, &total);
    close(fd);
    if (to_stdout)
        return st;
    mode_t um = umask(0);
    umask(um);
    if (!st && (fchmod(out, 0666 & ~um) || fsync(out)))
        st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
    if (out >= 0 && close(out) && !st)
        st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
    if (!st && rename(tmp, local))
        st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
    if (st) {
        if (out >= 0)
            unlink(tmp); /* nothing half-written is left behind */
        return st;
    }
    if (c->json) {
        json_t *r = json_pack("{s:s s:s s:s s:I}", "session", name, "path", path, "local", local,
                              "size", total);
        print_json(r);
        json_decref(r);
    } else {
        printf("wrote %s (%lld bytes from %s:%s)\n", local, (long long)total, name, path);
    }
    return 0;
}

/* files put NAME LOCAL [PATH]: LOCAL ("-": stdin) to PATH (default LOCAL's
 * last component) in the session's workspace, replacing it. */
static int cmd_files_put(cli *c)
{
    int st = files_args(c, 2, 3, "files put NAME LOCAL [PATH]");
    if (st)
        return st;
    const char *name = c->pos[0], *local = c->pos[1];
    int from_stdin = !strcmp(local, "-");
    const char *path = c->npos > 2 ? c->pos[2] : from_stdin ? NULL : last_component(local);
    if (!path || !*path)
        return usage_error("files put: give the workspace PATH (files put NAME %s PATH)", local);
    int in = from_stdin ? 0 : open(local, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat lst;
    if (in < 0)
        return files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local, strerror(errno));
    if (!from_stdin && (fstat(in, &lst) || !S_ISREG(lst.st_mode))) {
        close(in);
        return files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local,
                                 S_ISDIR(lst.st_mode) ? "it is a directory" : "not a regular file");
    }
    if (!from_stdin)
        fcntl(in, F_SETFL, fcntl(in, F_GETFL) & ~O_NONBLOCK);
    km_err err = {0, ""};
    int fd = connect_daemon(c, 1, &err);
    if (fd < 0) {
        if (!from_stdin)
            close(in);
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    }
    unsigned char *buf = malloc(FILES_WRITE_CHUNK);
    size_t b64cap = sodium_base64_ENCODED_LEN(FILES_WRITE_CHUNK, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(b64cap);
    char doing[4200];
    snprintf(doing, sizeof doing, "cannot write %s in session \"%s\"", path, name);
    json_int_t total = 0;
    int sent = 0;
    st = buf && b64 ? 0 : files_local_error(c, KM_EINTERNAL, "out of memory");
    while (!st) {
        ssize_t n = cm_read_full(in, buf, FILES_WRITE_CHUNK);
        if (n < 0) {
            st = files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local, strerror(errno));
            break;
        }
        if (n == 0 && sent)
            break;
        sodium_bin2base64(b64, b64cap, buf, (size_t)n, sodium_base64_VARIANT_ORIGINAL);
        json_t *rep;
        st = files_rpc(c, fd, "files.write",
                       json_pack("{s:s s:s s:s s:s s:b}", "session", name, "path", path, "content",
                                 b64, "encoding", "base64", "append", sent),
                       doing, &rep);
        json_decref(rep);
        if (st && total)
            fprintf(stderr, "kernelmgr: %s in session \"%s\" holds the first %lld bytes of %s\n",
                    path, name, (long long)total, local);
        sent = 1;
        total += n;
        if ((size_t)n < FILES_WRITE_CHUNK)
            break;
    }
    free(buf);
    free(b64);
    close(fd);
    if (!from_stdin)
        close(in);
    if (st)
        return st;
    if (c->json) {
        json_t *r = json_pack("{s:s s:s s:s s:I}", "session", name, "path", path, "local", local,
                              "size", total);
        print_json(r);
        json_decref(r);
    } else {
        printf("wrote %s:%s (%lld bytes from %s)\n", name, path, (long long)total,
               from_stdin ? "stdin" : local);
    }
    return 0;
}

/* session export NAME FILE: the session's archive (session.export, chunk by
 * chunk on one connection) into FILE ("-": stdout), written beside it and
 * renamed into place only when complete. */
static int cmd_session_export(cli *c)
{
    int st = files_args(c, 2, 2, "session export NAME FILE");
    if (st)
        return st;
    const char *name = c->pos[0], *local = c->pos[1];
    int to_stdout = !strcmp(local, "-");
    km_err err = {0, ""};
    int fd = connect_daemon(c, 1, &err);
    if (fd < 0)
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    char tmp[4200], doing[200], archive[64] = "";
    const char *base = last_component(local);
    snprintf(tmp, sizeof tmp, "%.*s.%s.kmpart.XXXXXX", (int)(base - local), local, base);
    snprintf(doing, sizeof doing, "cannot export session \"%s\"", name);
    int out = to_stdout ? 1 : -1;
    json_int_t off = 0, size = -1;
    json_t *first = NULL;
    for (;;) {
        json_t *req = json_pack("{s:s s:I}", "session", name, "offset", off);
        if (archive[0])
            json_object_set_new(req, "archive", json_string(archive));
        json_t *rep;
        st = files_rpc(c, fd, "session.export", req, doing, &rep);
        if (st)
            break;
        const char *b64 = json_string_value(json_object_get(rep, "data"));
        size_t b64len = json_string_length(json_object_get(rep, "data"));
        unsigned char *bin = malloc(b64len / 4 * 3 + 3);
        size_t n = 0;
        int bad = !b64 || !bin ||
                  sodium_base642bin(bin, b64len / 4 * 3 + 3, b64, b64len, NULL, &n, NULL,
                                    sodium_base64_VARIANT_ORIGINAL) != 0;
        int eof = json_is_true(json_object_get(rep, "eof"));
        if (!archive[0]) {
            snprintf(archive, sizeof archive, "%s",
                     json_string_value(json_object_get(rep, "archive")) ?: "");
            size = json_integer_value(json_object_get(rep, "size"));
            first = json_incref(rep);
        }
        json_decref(rep);
        if (bad) {
            free(bin);
            st = files_local_error(c, KM_EDAEMON, "%s: the daemon sent data that is not base64",
                                   doing);
            break;
        }
        if (out < 0 && (out = mkstemp(tmp)) < 0) {
            free(bin);
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
            break;
        }
        int werr = n && cm_write_all(out, bin, n) ? errno : 0;
        free(bin);
        if (werr) {
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(werr));
            break;
        }
        off += (json_int_t)n;
        if (eof || n == 0 || off >= size)
            break;
    }
    close(fd);
    if (!to_stdout && out >= 0) {
        if (!st && (fchmod(out, 0600) || fsync(out)))
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
        if (close(out) && !st)
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
        if (!st && rename(tmp, local))
            st = files_local_error(c, KM_EOUTPUT, "cannot write %s: %s", local, strerror(errno));
        if (st)
            unlink(tmp); /* nothing half-written is left behind */
    }
    if (!st && !to_stdout) {
        json_t *skipped = json_object_get(first, "skipped");
        if (c->json) {
            json_t *r =
                json_pack("{s:s s:s s:I s:O* s:O*}", "session", name, "file", local, "size", off,
                          "kernels", json_object_get(first, "kernels"), "skipped", skipped);
            print_json(r);
            json_decref(r);
        } else {
            printf("exported session %s to %s (%lld bytes", name, local, (long long)off);
            size_t i;
            json_t *v;
            json_array_foreach(json_object_get(first, "kernels"), i, v)
            {
                printf("%s%s", i ? ", " : "; the state of its kernels: ", json_string_value(v));
            }
            puts(")");
            json_array_foreach(skipped, i, v)
            {
                printf("  not in the archive: %s (%s)\n",
                       json_string_value(json_object_get(v, "path")),
                       json_string_value(json_object_get(v, "reason")));
            }
        }
    }
    json_decref(first);
    return st;
}

/* The session name an archive was exported with: its first entry,
 * kernelmgr-session.json (the daemon checks the whole archive again). */
static int archive_session_name(int in, char *out, size_t size)
{
    unsigned char h[512];
    if (pread(in, h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h, "kernelmgr-session.json", 23))
        return -1;
    char sz[13];
    memcpy(sz, h + 124, 12);
    sz[12] = 0;
    unsigned long long n = strtoull(sz, NULL, 8);
    if (n == 0 || n > 65536)
        return -1;
    char *buf = malloc(n);
    int rc = -1;
    if (buf && pread(in, buf, n, 512) == (ssize_t)n) {
        json_error_t je;
        json_t *o = json_loadb(buf, n, 0, &je);
        const char *nm = json_string_value(json_object_get(o, "session"));
        if (nm && km_name_valid(nm)) {
            snprintf(out, size, "%s", nm);
            rc = 0;
        }
        json_decref(o);
    }
    free(buf);
    return rc;
}

/* session import FILE [NAME]: FILE ("-": stdin) to session.import in
 * chunks on one connection; NAME defaults to the name it was exported
 * with. */
static int cmd_session_import(cli *c)
{
    if (c->npos < 1 || c->npos > 2)
        return usage_error("usage: kernelmgr session import FILE [NAME]");
    const char *local = c->pos[0];
    int from_stdin = !strcmp(local, "-");
    int in = from_stdin ? 0 : open(local, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat lst;
    if (in < 0)
        return files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local, strerror(errno));
    if (!from_stdin && (fstat(in, &lst) || !S_ISREG(lst.st_mode))) {
        close(in);
        return files_local_error(c, KM_EUSAGE, "cannot read %s: not a regular file", local);
    }
    if (!from_stdin)
        fcntl(in, F_SETFL, fcntl(in, F_GETFL) & ~O_NONBLOCK);
    char name[KM_NAME_MAX + 1];
    if (c->npos > 1) {
        snprintf(name, sizeof name, "%s", c->pos[1]);
    } else if (from_stdin || archive_session_name(in, name, sizeof name)) {
        if (!from_stdin)
            close(in);
        return usage_error("session import: give the NAME of the new session (%s names none)",
                           local);
    }
    if (!km_name_valid(name)) {
        if (!from_stdin)
            close(in);
        return usage_error("invalid session name \"%s\"", name);
    }
    km_err err = {0, ""};
    int fd = connect_daemon(c, 1, &err);
    if (fd < 0) {
        if (!from_stdin)
            close(in);
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    }
    unsigned char *buf = malloc(FILES_WRITE_CHUNK);
    size_t b64cap = sodium_base64_ENCODED_LEN(FILES_WRITE_CHUNK, sodium_base64_VARIANT_ORIGINAL);
    char *b64 = malloc(b64cap);
    char doing[200];
    snprintf(doing, sizeof doing, "cannot import session \"%s\" from %.100s", name, local);
    json_int_t total = 0;
    json_t *rep = NULL;
    int st = buf && b64 ? 0 : files_local_error(c, KM_EINTERNAL, "out of memory");
    while (!st) {
        ssize_t n = cm_read_full(in, buf, FILES_WRITE_CHUNK);
        if (n < 0) {
            st = files_local_error(c, KM_EUSAGE, "cannot read %s: %s", local, strerror(errno));
            break;
        }
        int final = (size_t)n < FILES_WRITE_CHUNK;
        sodium_bin2base64(b64, b64cap, buf, (size_t)n, sodium_base64_VARIANT_ORIGINAL);
        json_decref(rep);
        rep = NULL;
        st = files_rpc(c, fd, "session.import",
                       json_pack("{s:s s:s s:I s:b}", "session", name, "data", b64, "offset", total,
                                 "final", final),
                       doing, &rep);
        total += n;
        if (final)
            break;
    }
    free(buf);
    free(b64);
    close(fd);
    if (!from_stdin)
        close(in);
    if (!st) {
        if (c->json) {
            print_json(rep);
        } else {
            printf("imported session %s from %s (%lld bytes); its next exec restores", name,
                   from_stdin ? "stdin" : local, (long long)total);
            const char *ln;
            json_t *v;
            int any = 0;
            json_object_foreach(json_object_get(rep, "kernels"), ln, v)
            {
                printf("%s%s", any++ ? ", " : " the ", ln);
            }
            puts(any ? " state and its files" : " its files");
        }
    }
    json_decref(rep);
    return st;
}

/* files ls NAME [PATH]: as `files NAME`, below PATH when given. */
static int cmd_files_ls(cli *c)
{
    int st = files_args(c, 1, 2, "files ls NAME [PATH]");
    if (st)
        return st;
    json_t *req = json_pack("{s:s}", "session", c->pos[0]);
    if (c->npos > 1)
        json_object_set_new(req, "path", json_string(c->pos[1]));
    json_t *rep;
    st = call(c, "files.list", req, 1, NULL, NULL, &rep);
    if (st)
        return st;
    st = print_files(c, c->pos[0], rep);
    json_decref(rep);
    return st;
}

/* files rm NAME PATH: a file, a symbolic link or an empty directory. */
static int cmd_files_rm(cli *c)
{
    int st = files_args(c, 2, 2, "files rm NAME PATH");
    if (st)
        return st;
    km_err err = {0, ""};
    int fd = connect_daemon(c, 1, &err);
    if (fd < 0)
        return files_local_error(c, err.code ? err.code : KM_EDAEMON, "%s", err.msg);
    char doing[4200];
    snprintf(doing, sizeof doing, "cannot remove %s from session \"%s\"", c->pos[1], c->pos[0]);
    json_t *rep;
    st = files_rpc(c, fd, "files.remove",
                   json_pack("{s:s s:s}", "session", c->pos[0], "path", c->pos[1]), doing, &rep);
    close(fd);
    if (st)
        return st;
    if (c->json)
        print_json(rep);
    else
        printf("removed %s:%s\n", c->pos[0], json_string_value(json_object_get(rep, "path")));
    json_decref(rep);
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
    bin[0] = 0;
    char *dir = cm_install_helper_dir(); /* beside us, or LIBEXECDIR/kernelmgr */
    if (!dir) {
        snprintf(bin, binsize, "kernelmgr-gateway (the kernelmgr helpers' directory is unknown)");
        errno = ENOENT;
        return;
    }
    char *path = cm_path_join(dir, "kernelmgr-gateway");
    free(dir);
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
        /* the daemon's pid, to wait for its end: it snapshots its sessions
         * and stops their kernels after its socket is gone */
        long dpid = 0;
        char *pidfile = cm_path_join(c->home, "daemon.pid");
        FILE *pf = pidfile ? fopen(pidfile, "re") : NULL;
        if (!pf || fscanf(pf, "%ld", &dpid) != 1)
            dpid = 0;
        if (pf)
            fclose(pf);
        free(pidfile);
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
        /* and until it has ended (at most 5 minutes: snapshots of big
         * states take their time), so a next command starts a fresh one */
        for (int i = 0; dpid > 1 && st == 0 && i < 6000 && daemon_running((pid_t)dpid); i++) {
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
        km_err why = {0};
        if (gateway_listen_valid(c->cfg.http, c->cfg.http_tls_cert[0] != 0, c->cfg.http_insecure,
                                 &why))
            return fail(KM_EUSAGE, why.msg);
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
    daemon_http_register(&gwdaemon_ops);
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
                           "[--sandbox strict|none] [--python PATH] [--network on|off|allow:HOSTS] "
                           "[--memory SIZE] [--cpus N] [--cpu-time S] [--ipython on|off]");
    if (c->user && c->prefix)
        return usage_error("kernelspec install: give --user or --prefix DIR, not both");
    char self[4096];
    const char *env = getenv("KERNELMGR_KERNEL_DIR");
    char *helpers = env && *env ? NULL : cm_install_helper_dir();
    if (!(env && *env) && !helpers)
        return fail(KM_EINTERNAL, "cannot find the kernelmgr helpers' directory");
    snprintf(self, sizeof self, "%s", env && *env ? env : helpers);
    free(helpers);
    kspecinst_opts o = {
        .prefix = c->prefix,
        .kernel_dir = self,
        .langs = &c->cfg.langs,
        .sandbox = c->sandbox,
        .python = c->python,
        .memory = c->memory_s,
        .network = c->network,
        .network_allow = c->net_allow,
        .cpus = c->so.cpus,
        .cpu_time = c->so.cpu_time,
        .ipython = c->so.ipython,
        .version = KM_VERSION,
    };
    km_err why = {0};
    json_t *done = kspecinst_install(&o, &why);
    if (!done)
        return fail(KM_EINTERNAL, why.msg);
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
    int ok = json_is_true(json_object_get(o, "ok"));
    json_decref(o);
    /* 1: a problem: kernels with the configured sandbox did not start here,
     * or a root daemon lacks a capability it needs */
    return ok ? 0 : 1;
}

/* ---------------------------------------------------------------- parsing */

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
        return usage_error("config takes --doc [keys|session-options] (print a docs' table in "
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
    return usage_error("config --doc takes %s, not \"%s\"", names, which);
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
    const char *synopsis; /* --help: the command line (lines split on \n) */
    const char *help;     /* --help: what it does */
};

static const cli_command cli_commands[] = {
    {"run", cmd_code, NULL, 0, NULL, NULL, NULL, NULL, 0, "run [opts] (-c CODE | FILE | -)",
     "one-shot: fresh session, run every block, tear down"},
    {"exec", cmd_code, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "exec --session NAME [opts] (-c CODE | FILE | -)",
     "run in a persistent session (starts the daemon)"},
    {"sessions", NULL, "sessions.list", 0, NULL, print_sessions, sessions_no_daemon,
     sessions_repair, 0, "sessions [--repair NAME]",
     "list sessions; --repair NAME repairs a session\nwhose session.json is damaged (says what it "
     "did:\nrewritten, or recreated with the defaults,\nworkspace kept)"},
    {"close", NULL, "close", 1, build_close, NULL, NULL, NULL, 0, "close NAME [--keep]",
     "stop kernels, remove the workspace (unless --keep)"},
    {"interrupt", NULL, "interrupt", 1, NULL, NULL, NULL, NULL, 0, "interrupt NAME",
     "interrupt running code"},
    {"restart", NULL, "restart", 1, NULL, NULL, NULL, NULL, 0, "restart NAME",
     "fresh kernels, same files"},
    {"files", NULL, "files.list", 1, NULL, print_files, NULL, NULL, 0, "files NAME",
     "list the session's workspace"},
    {"files get", cmd_files_get, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "files get NAME PATH [-o LOCAL]", "copy a workspace file here (any size; -o -:\nstdout)"},
    {"files put", cmd_files_put, NULL, 0, NULL, NULL, NULL, NULL, 0, "files put NAME LOCAL [PATH]",
     "copy a local file (- for stdin) into the\nworkspace, replacing PATH"},
    {"files ls", cmd_files_ls, NULL, 0, NULL, NULL, NULL, NULL, 0, "files ls NAME [PATH]",
     "the same, below PATH"},
    {"files rm", cmd_files_rm, NULL, 0, NULL, NULL, NULL, NULL, 0, "files rm NAME PATH",
     "remove a file, a link or an empty directory"},
    {"export", NULL, "export", 1, build_export, print_export, NULL, NULL, 0,
     "export NAME [-o FILE] [--kernel NAME]", "the session's history as a Jupyter notebook"},
    {"session export", cmd_session_export, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "session export NAME FILE",
     "the session (files, and its variables snapshotted\nnow) as one archive, to move it to "
     "another daemon"},
    {"session import", cmd_session_import, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "session import FILE [NAME]",
     "a new session from an archive (NAME: the one it\nwas exported with); its next exec "
     "restores it"},
    {"connection-file", NULL, "connection_file", 1, build_connection_file, print_connection_file,
     NULL, NULL, 0, "connection-file NAME [--lang L]",
     "connection file for `jupyter console --existing`"},
    {"snapshot", NULL, "session.snapshot", 1, build_tag, print_snapshot, NULL, NULL, 0,
     "snapshot NAME [--tag T]", "save the session's variables and files (a snapshot)"},
    {"snapshots", NULL, "session.snapshots", 1, NULL, print_snapshot, NULL, NULL, 0,
     "snapshots NAME", "list the session's snapshots"},
    {"restore", NULL, "session.restore", 1, build_tag, print_restore, NULL, NULL, 0,
     "restore NAME [--tag T]", "bring the session back to a snapshot (default: latest)"},
    {"fork", NULL, "session.fork", 1, build_fork, print_restore, NULL, fork_check, 0,
     "fork SRC NEW [--tag T]",
     "a new session NEW from SRC's snapshot: its own sandbox,\n"
     "a copy of the files and the variables"},
    {"serve", cmd_serve, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "serve [--pool N] [--stop]\n      [--http [ADDR:]PORT] [--tls-cert F --tls-key F] "
     "[--insecure]",
     "run the daemon in the foreground (or stop it)\nalso serve Jupyter frontends over HTTP "
     "(docs/GATEWAY.md)"},
    {"doctor", cmd_doctor, NULL, 0, NULL, NULL, NULL, NULL, 0, "doctor [--json]",
     "sandbox capabilities, Python, versions\n(exit 1: configured sandbox unavailable)"},
    {"kernelspec", cmd_kernelspec, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "kernelspec install [--user|--prefix DIR] [--sandbox strict|none] [--python PATH]\n      "
     "[--network on|off|allow:HOST[,HOST...]] [--memory SIZE] [--cpus N] [--cpu-time S]\n      "
     "[--ipython on|off]",
     "\n\ninstall kernelmgr-LANG kernelspecs (python,\nbash and each configured backend language)"},
    {"install", cmd_install, NULL, 0, NULL, NULL, NULL, NULL, 0,
     "install --session NAME [--manager pip|npm] [--allowlist FILE] PKG...",
     "install allowlisted packages for a session"},
    {"drain", cmd_drain, NULL, 0, NULL, NULL, NULL, NULL, 0, "drain",
     "the daemon makes no new sessions (its existing\nones keep working; /readyz says draining) "
     "and\nsnapshots each live session, saying how it went"},
    {"undrain", cmd_drain, NULL, 0, NULL, NULL, NULL, NULL, 0, "undrain",
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

/* ---------------------------------------------------------------- options
 *
 * Every command-line option is one row of cli_opts[]: its name (and short
 * letter), the name of its value in --help, the one function that parses,
 * checks and stores it, the field of cli it fills, and its --help line
 * (NULL: an option of one command, named in that command's synopsis). The
 * getopt table, the short-option string and --help are built from it; the
 * ranges of the session options are the session options' table's
 * (dtier.h). A setter returns 0, an exit status (usage_error), or
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
        return usage_error("--%s must be an absolute path", o->name);
    return opt_str(c, o, arg);
}

static int opt_lang(cli *c, const cli_opt *o, const char *arg)
{
    /* checked by the manager (the daemon for exec), which knows the
     * configured languages (lang.h) */
    if (!*arg)
        return usage_error("--lang must be python, bash, a configured language or auto");
    return opt_str(c, o, arg);
}

static int opt_timeout(cli *c, const cli_opt *o, const char *arg)
{
    char *end;
    double v = strtod(arg, &end);
    if (*end || end == arg || !(v > 0) || v > 604800)
        return usage_error("--timeout must be a positive number of seconds (got \"%s\")", arg);
    *CLI_FIELD(double, c, o) = v;
    return 0;
}

static int opt_network(cli *c, const cli_opt *o, const char *arg)
{
    km_err why = {0};
    if (km_net_from_text(arg, "--network", &c->network, c->net_allow, sizeof c->net_allow, &why))
        return usage_error("%s", why.msg);
    return 0;
}

static int opt_memory(cli *c, const cli_opt *o, const char *arg)
{
    const dtier_sessopt *so = dtier_sessopt_find("memory");
    if (kmcfg_parse_size(arg, &c->memory) || c->memory < (uint64_t)so->min)
        return usage_error("--memory must be a size of at least %lluM, like 512M or 2G "
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
        return usage_error("--%s must be a size of at least %s, like 64M (got \"%s\")", o->name,
                           cm_size_format((uint64_t)so->min, mb, sizeof mb), arg);
    }
    *CLI_FIELD(unsigned long long, c, o) = bytes;
    return 0;
}

/* on|off into the int field at o->off (--zygote, --ipython). */
static int opt_onoff(cli *c, const cli_opt *o, const char *arg)
{
    if (strcmp(arg, "on") && strcmp(arg, "off"))
        return usage_error("--%s must be on or off (got \"%s\")", o->name, arg);
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
        return usage_error("--%s must be a number of %s from %g to %.0f (got \"%s\")", o->name,
                           kmcfg_opt_find(so->f.name)->unit, so->min, so->max, arg);
    *CLI_FIELD(double, c, o) = v;
    return 0;
}

static int opt_sandbox(cli *c, const cli_opt *o, const char *arg)
{
    if (strcmp(arg, "strict") && strcmp(arg, "none"))
        return usage_error("--sandbox must be strict or none (got \"%s\")", arg);
    return opt_str(c, o, arg);
}

static int opt_pool(cli *c, const cli_opt *o, const char *arg)
{
    const kmcfg_opt *row = kmcfg_opt_find("pool"); /* the range is the config key's */
    char *end;
    long v = strtol(arg, &end, 10);
    if (*end || end == arg || v < (long)row->min || v > (long)row->max)
        return usage_error("--pool must be an integer %.0f..%.0f", row->min, row->max);
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
        return usage_error("%s", why);
    }
    json_t *val = json_string(eq + 1);
    if (!val) {
        usage_error("--env %s: the value is not UTF-8 text", name);
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
            return usage_error("option %s needs a value", argv[optind - 1]);
        const cli_opt *o = NULL;
        if (opt >= CLI_OPT_VAL(0) && opt < CLI_OPT_VAL(CLI_NOPTS))
            o = &cli_opts[opt - CLI_OPT_VAL(0)];
        for (size_t i = 0; !o && opt != '?' && i < CLI_NOPTS; i++)
            if (cli_opts[i].short_name == opt)
                o = &cli_opts[i];
        if (!o)
            return usage_error("unknown option \"%s\"", argv[optind - 1]);
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
        return usage_error("no command given");
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
        return usage_error("unknown command \"%s\"", c.cmd);
    if (words == 2)
        c.cmd = command->name;
    if (command->own_args)
        return command->run(&c);

    int st = cli_parse_options(&c, argc, argv, 1 + words);
    if (st)
        return st < 0 ? 0 : st;
    for (int i = optind; i < argc; i++) {
        if (c.npos >= 64)
            return usage_error("too many arguments");
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
    active_cli = &c;
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
