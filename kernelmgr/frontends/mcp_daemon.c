/*
 * mcp_daemon.c — the MCP server's link to the kernelmgr daemon: one API
 * request per tool call through daemon_call (daemon.h), with the daemon
 * autostarted by daemon_connect as `kernelmgr exec` does.
 */
#include "kernelmgr/frontends/mcp_daemon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernelmgr/service/daemon.h"
#include "kernelmgr/frontends/mcp_int.h"
#include "common/cm_clock.h"

typedef struct mcpd_wait {
    mcpd_event_fn ev;
    mcpd_tick_fn tick;
    void *ud;
    char *home;
    const char *session; /* borrowed from the params */
    double start;
} mcpd_wait;

/* What the operator gave this MCP server (mcpd_configure): fixed on every
 * connection at initialize, before it lowers itself to the mcp tier. */
static char *op_allowlist;
static int op_unsafe;

void mcpd_configure(const mcp_options *o)
{
    /* --allowlist, else the environment's; neither: the daemon's default
     * (home/allowlist.json). Made absolute here: the daemon's cwd is not
     * ours. */
    const char *env = getenv("KERNELMGR_ALLOWLIST");
    const char *al = o->allowlist_path ? o->allowlist_path : env && *env ? env : NULL;
    free(op_allowlist);
    op_allowlist = NULL;
    if (al) {
        char *real = realpath(al, NULL);
        op_allowlist = real ? real : strdup(al);
    }
    op_unsafe = o->allow_unsafe_session_options;
}

/* A connection to the daemon at the mcp tier (autostarted): fd, or -1. */
static int connect_mcp(const char *home, km_err *err)
{
    int fd = daemon_connect(home, 1, NULL, err);
    const char *al = op_allowlist && op_allowlist[0] == '/' ? op_allowlist : NULL;
    if (fd >= 0 && daemon_declare_tier(fd, "mcp", al, op_unsafe, err)) {
        close(fd);
        return -1;
    }
    return fd;
}

static char *home_path(void)
{
    char buf[KM_HOME_MAX + 1];
    return kmcfg_home(buf, sizeof buf) ? strdup(buf) : NULL;
}

/* Events and ticks come only once daemon_call has sent the request. */
static void on_event(void *ud, const json_t *params)
{
    mcpd_wait *w = ud;
    mcp_call_delivered();
    w->ev(w->ud, params);
}

static int on_tick(void *ud)
{
    mcpd_wait *w = ud;
    mcp_call_delivered();
    return w->tick ? w->tick(w->ud, cm_mono_s() - w->start) : 0;
}

static void on_cancel(void *ud)
{
    mcpd_wait *w = ud;
    if (!w->session)
        return;
    json_t *res = NULL;
    km_err err = {0, ""};
    int fd = connect_mcp(w->home, &err);
    if (fd < 0 ||
        daemon_call(fd, "interrupt", json_pack("{s:s}", "session", w->session), NULL, &res, &err))
        mcp_log("interrupt %s: %s", w->session, err.msg);
    if (fd >= 0)
        close(fd);
    json_decref(res);
}

json_t *mcpd_request(const char *method, json_t *params, mcpd_event_fn ev, mcpd_tick_fn tick,
                     void *ud, km_err *err)
{
    if (!params) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return NULL;
    }
    if (ev) {
        json_object_set_new(params, "stream", json_true());
        /* stream text as bytes after each event line (daemon.h): no JSON
         * escaping and parsing of a long output */
        json_object_set_new(params, "raw_text", json_true());
    }
    mcpd_wait w = {
        ev,         tick, ud, home_path(), json_string_value(json_object_get(params, "session")),
        cm_mono_s()};
    if (!w.home) {
        json_decref(params);
        km_err_set(err, KM_EUSAGE, "the kernelmgr home is longer than %d bytes (or out of memory)",
                   KM_HOME_MAX);
        return NULL;
    }
    json_incref(params); /* w.session borrows from it */
    daemon_callbacks cb = {ev ? on_event : NULL, on_tick, on_cancel, &w};
    json_t *res = NULL;
    km_err kerr = {0, ""};
    int fd = connect_mcp(w.home, &kerr);
    if (fd < 0) {
        km_err_set(err, KM_EUSAGE, "cannot reach the kernelmgr daemon: %s", kerr.msg);
        json_decref(params);
    } else {
        if (daemon_call(fd, method, params, &cb, &res, &kerr))
            km_err_set(err, KM_EUSAGE, "%s", kerr.msg);
        close(fd);
    }
    json_decref(params);
    free(w.home);
    return res;
}
