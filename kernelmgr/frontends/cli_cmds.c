/*
 * cli_cmds.c — the CLI commands that are one daemon request (what each adds
 * to its request, how it prints the reply), and serve, install, kernelspec,
 * doctor.
 */
#include "kernelmgr/frontends/cli.h"
#include "kernelmgr/frontends/cli_int.h"
#include "kernelmgr/frontends/gwdaemon.h"
#include "kernelmgr/service/daemon.h"
#include "kernelmgr/frontends/doctor.h"
#include "common/cm_install.h"
#include "kernelmgr/frontends/gateway.h"
#include "kernelmgr/frontends/kspecinstall.h"
#include "common/cm_termsafe.h"
#include "common/cm_path.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------- commands that are one request */

/* What `sessions`, `close`, ... add to their request beyond the session. */
void cli_build_close(cli *c, json_t *req)
{
    if (c->keep)
        json_object_set_new(req, "keep", json_true());
}

void cli_build_connection_file(cli *c, json_t *req)
{
    json_object_set_new(req, "lang", json_string(c->lang ? c->lang : "python"));
}

void cli_build_export(cli *c, json_t *req)
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
void cli_build_tag(cli *c, json_t *req)
{
    if (c->tag)
        json_object_set_new(req, "tag", json_string(c->tag));
}

int cli_fork_check(cli *c)
{
    if (c->npos != 2)
        return cli_usage_error("fork needs SRC and NEW: kernelmgr fork SRC NEW [--tag T]");
    return -1;
}

void cli_build_fork(cli *c, json_t *req)
{
    json_object_set_new(req, "new_session", json_string(c->pos[1]));
    cli_build_tag(c, req);
}

/* One line a snapshot (--json: the reply). */
int cli_print_snapshot(cli *c, const char *name, json_t *rep)
{
    if (c->json) {
        cli_print_json(rep);
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

int cli_print_restore(cli *c, const char *name, json_t *rep)
{
    if (c->json) {
        cli_print_json(rep);
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
int cli_sessions_repair(cli *c)
{
    return c->repair ? cli_cmd_repair(c) : -1;
}

/* listing sessions must not start a daemon just to say "none" */
void cli_sessions_no_daemon(cli *c)
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
int cli_cmd_drain(cli *c)
{
    if (c->npos)
        return cli_usage_error("%s takes no arguments", c->cmd);
    km_err err = {0, ""};
    int fd = cli_connect_daemon(c, 0, &err);
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
    int st = cli_call(c, "daemon.drain", req, 0, drain_event, c, &rep);
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
        cli_print_json(rep);
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

int cli_print_sessions(cli *c, const char *name, json_t *rep)
{
    json_t *ss = json_object_get(rep, "sessions");
    if (c->json) {
        cli_print_json(ss);
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

int cli_print_files(cli *c, const char *name, json_t *rep)
{
    if (c->json) {
        cli_print_json(rep);
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

int cli_print_connection_file(cli *c, const char *name, json_t *rep)
{
    const char *p = json_string_value(json_object_get(rep, "connection_file"));
    if (c->json)
        cli_print_json(rep);
    else
        puts(p ? p : "");
    return 0;
}

int cli_print_export(cli *c, const char *name, json_t *rep)
{
    json_t *nb = json_object_get(rep, "notebook");
    size_t wi;
    json_t *w;
    json_t *kmmd = json_object_get(json_object_get(nb, "metadata"), "kernelmgr");
    json_array_foreach(json_object_get(kmmd, "warnings"), wi, w)
    {
        cli_put_msg("kernelmgr: warning: ", json_string_value(w));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s", c->output ? c->output : "");
    if (!path[0])
        snprintf(path, sizeof path, "%s.ipynb", name);
    FILE *f = strcmp(path, "-") ? fopen(path, "w") : stdout;
    if (!f)
        return cli_fail(KM_EINTERNAL, strerror(errno));
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

/* `kernelmgr install`: the API's packages.install, as MCP's install_packages. */

int cli_cmd_install(cli *c)
{
    if (!c->session)
        return cli_usage_error("install needs --session NAME");
    if (!km_name_valid(c->session))
        return cli_usage_error("invalid session name \"%s\"", c->session);
    const char *manager = c->manager ? c->manager : "pip";
    if (strcmp(manager, "pip") && strcmp(manager, "npm"))
        return cli_usage_error("--manager must be pip or npm (got \"%s\")", manager);
    if (!c->npos || c->npos > 50)
        return cli_usage_error("install needs 1 to 50 package names");
    json_t *pk = json_array();
    for (int i = 0; i < c->npos; i++)
        json_array_append_new(pk, json_string(c->pos[i]));
    json_t *req =
        json_pack("{s:s s:s s:o}", "session", c->session, "manager", manager, "packages", pk);
    if (c->allowlist) {
        /* absolute for the daemon (another cwd), but the last component as
         * given: the daemon refuses a symbolic link there, which resolving
         * it here would hide */
        char *abs = cm_path_absolute(c->allowlist);
        if (!abs) {
            json_decref(req);
            return cli_usage_error("--allowlist %s: %s", c->allowlist, strerror(errno));
        }
        json_object_set_new(req, "allowlist", json_string(abs));
        free(abs);
    }
    json_t *rep;
    int st = cli_call(c, "packages.install", req, 1, NULL, NULL, &rep);
    if (st)
        return st;
    if (c->json) {
        cli_print_json(rep);
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
    if (cli_call(c, "ping", NULL, 0, NULL, NULL, &hi))
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
        return cli_fail(KM_EUSAGE, why);
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
        return cli_fail(KM_EUSAGE, why);
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
    int st = cli_call(c, "http.start", params, 0, NULL, NULL, &rep);
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

int cli_cmd_serve(cli *c)
{
    if (c->stop) {
        km_err err;
        int fd = cli_connect_daemon(c, 0, &err);
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
        int st = cli_call(c, "shutdown", NULL, 0, NULL, NULL, &rep);
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
            return cli_fail(KM_EUSAGE, why.msg);
        if ((c->cfg.http_tls_cert[0] != 0) != (c->cfg.http_tls_key[0] != 0))
            return cli_fail(KM_EUSAGE, "TLS needs both --tls-cert and --tls-key");
    }
    if (!gateway_built_in()) {
        char bin[4200];
        exec_gateway_binary(c, bin, sizeof bin);
        char why[4400];
        snprintf(why, sizeof why, "serving HTTP needs %s (built beside kernelmgr by make): %s", bin,
                 strerror(errno));
        if (c->cfg.http[0])
            return cli_fail(KM_EINTERNAL, why);
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
        return cli_fail(st, err.msg);
    return 0;
}

int cli_cmd_kernelspec(cli *c)
{
    if (c->npos != 1 || strcmp(c->pos[0], "install"))
        return cli_usage_error(
            "usage: kernelmgr kernelspec install [--user | --prefix DIR] "
            "[--sandbox strict|none] [--python PATH] [--network on|off|allow:HOSTS] "
            "[--memory SIZE] [--cpus N] [--cpu-time S] [--ipython on|off]");
    if (c->user && c->prefix)
        return cli_usage_error("kernelspec install: give --user or --prefix DIR, not both");
    char self[4096];
    const char *env = getenv("KERNELMGR_KERNEL_DIR");
    char *helpers = env && *env ? NULL : cm_install_helper_dir();
    if (!(env && *env) && !helpers)
        return cli_fail(KM_EINTERNAL, "cannot find the kernelmgr helpers' directory");
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
        return cli_fail(KM_EINTERNAL, why.msg);
    if (c->json) {
        json_t *o2 = json_pack("{s:o}", "installed", done);
        cli_print_json(o2);
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

int cli_cmd_doctor(cli *c)
{
    if (c->npos)
        return cli_usage_error("doctor takes no arguments");
    json_t *o = doctor_report(&c->cfg, c->home, KM_VERSION);
    if (!o)
        return cli_fail(KM_EINTERNAL, "out of memory");
    if (c->json)
        cli_print_json(o);
    else
        doctor_render(stdout, o);
    int ok = json_is_true(json_object_get(o, "ok"));
    json_decref(o);
    /* 1: a problem: kernels with the configured sandbox did not start here,
     * or a root daemon lacks a capability it needs */
    return ok ? 0 : 1;
}
