/*
 * cli_run.c — `kernelmgr run` and `exec`: the code read and checked, the
 * request sent (to an in-process manager or the daemon), and what is shown
 * while it runs (live output, the elapsed-time ticker, Ctrl-C as an
 * interrupt, a failed stdout write as one too).
 */
#include "kernelmgr/frontends/cli.h"
#include "kernelmgr/frontends/cli_int.h"
#include "kernelmgr/engine/codeblocks.h"
#include "kernelmgr/engine/sessopt.h"
#include "kernelmgr/service/daemon.h"
#include "kernelmgr/engine/mkclient.h"
#include "kernelmgr/engine/result.h"
#include "common/cm_termsafe.h"
#include "common/cm_clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    cli_put_msg("kernelmgr: ", json_string_value(json_object_get(ev, "message")));
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

int cli_cmd_run(cli *c)
{
    km_err why = {0};
    int badcode;
    char *code = read_code_checked(c, &badcode, &why);
    if (!code)
        return badcode ? cli_fail(KM_EUSAGE, why.msg) : cli_usage_error("%s", why.msg);
    if (c->workspace) {
        /* relative paths are the user's cwd */
        char *real = realpath(c->workspace, NULL);
        if (!real) {
            free(code);
            return cli_usage_error("--workspace %s: %s", c->workspace, strerror(errno));
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
        return cli_fail(err.code, err.msg);
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
        status = cli_fail(err.code, err.msg);
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

int cli_connect_daemon(cli *c, int autostart, km_err *err)
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
    int fd = cli_connect_daemon(c, 0, &err);
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
int cli_call(cli *c, const char *method, json_t *params, int autostart,
             void (*ev)(void *, const json_t *), void *ud, json_t **reply)
{
    km_err err = {0, ""};
    *reply = NULL;
    int fd = cli_connect_daemon(c, autostart, &err);
    if (fd < 0) {
        json_decref(params);
        return cli_fail(err.code ? err.code : KM_EDAEMON, err.msg);
    }
    active_cli = c;
    daemon_callbacks cb = {ev, tick_sigint, send_interrupt, ud};
    int rc = daemon_call(fd, method, params, &cb, reply, &err);
    close(fd);
    if (rc) {
        if (c->json && rc != KM_EDAEMON) {
            json_t *e = json_pack("{s:{s:i s:s}}", "error", "code", rc, "message", err.msg);
            cli_print_json(e);
            json_decref(e);
        }
        return cli_fail(rc, err.msg);
    }
    return 0;
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

int cli_cmd_exec(cli *c)
{
    if (!c->session)
        return cli_usage_error("exec needs --session NAME");
    if (!km_name_valid(c->session))
        return cli_usage_error("invalid session name \"%s\"", c->session);
    km_err why = {0};
    int badcode;
    char *code = read_code_checked(c, &badcode, &why);
    if (!code)
        return badcode ? cli_fail(KM_EUSAGE, why.msg) : cli_usage_error("%s", why.msg);
    char *ws = NULL;
    if (c->workspace && !(ws = realpath(c->workspace, NULL))) {
        free(code);
        return cli_usage_error("--workspace %s: %s", c->workspace, strerror(errno));
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
    int st = cli_call(c, "exec", req, 1, on_event, &rc, &rep);
    ticker_end(c);
    if (st)
        return st;
    cli_print_warnings(rep);
    st = exec_status(c, rep);
    json_decref(rep);
    return sigint_count ? 130 : st;
}

/* sessions --repair NAME: the daemon's session.repair, its message said. */
int cli_cmd_repair(cli *c)
{
    json_t *req = json_pack("{s:s}", "session", c->repair);
    json_t *rep;
    int st = cli_call(c, "session.repair", req, 1, NULL, NULL, &rep);
    if (st)
        return st;
    if (c->json)
        cli_print_json(rep);
    else
        cli_put_msg("kernelmgr: ", json_string_value(json_object_get(rep, "message")));
    json_decref(rep);
    return 0;
}

void cli_set_active(cli *c)
{
    active_cli = c;
}

int cli_output_close(int st)
{
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
