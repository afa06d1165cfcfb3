/*
 * mcp_daemon.c — the MCP server's link to the kernelmgr daemon.
 *
 * Wire (the daemon's, daemon.h): $KERNELMGR_HOME/kernelmgr.sock; one JSON
 * request per line; the daemon answers with zero or more event lines
 * ({"event": ...}, for an exec with "stream": true) and then the final line,
 * which has "ok" (false: "error": {"code","message"}). The connection and
 * autostart are the daemon's own daemon_connect(). We read the lines
 * ourselves rather than through daemon_call() because an MCP call needs a
 * heartbeat while it waits (progress notifications every second).
 */
#include "kernelmgr/mcp_daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernelmgr/daemon.h"
#include "kernelmgr/mcp_int.h"

#define MCPD_MAX_LINE ((size_t)256 << 20)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The daemon's own client: connects, and starts `kernelmgr serve` detached
 * when none answers (exactly what `kernelmgr exec` does). */
static int mcpd_connect(char *err, size_t errlen)
{
    char home[PATH_MAX];
    kmcfg_home(home, sizeof home);
    km_err kerr = {0, ""};
    int fd = daemon_connect(home, 1, NULL, &kerr);
    if (fd < 0)
        snprintf(err, errlen, "cannot reach the kernelmgr daemon: %s", kerr.msg);
    return fd;
}

static void send_interrupt(const char *session)
{
    char err[256];
    int fd = mcpd_connect(err, sizeof err);
    if (fd < 0) {
        mcp_log("interrupt %s: %s", session, err);
        return;
    }
    json_t *req = json_pack("{s:s,s:s}", "op", "interrupt", "session", session);
    if (daemon_send_json(fd, req) < 0)
        mcp_log("interrupt %s: %s", session, strerror(errno));
    json_decref(req);
    /* Read the acknowledgement so the daemon is not writing into a closed
     * socket; bounded wait. */
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 5000) > 0) {
        char buf[4096];
        ssize_t r = read(fd, buf, sizeof buf);
        (void)r;
    }
    close(fd);
}

static const char *reply_error(const json_t *reply)
{
    json_t *e = json_object_get(reply, "error");
    if (json_is_true(json_object_get(reply, "ok")))
        return NULL;
    if (!e || json_is_null(e))
        return "the daemon answered ok: false";
    if (json_is_string(e))
        return json_string_value(e);
    const char *m = json_string_value(json_object_get(e, "message"));
    return m ? m : "the daemon reported an error";
}

json_t *mcpd_request(json_t *req, mcpd_event_fn ev, mcpd_tick_fn tick, void *ud, char *err,
                     size_t errlen)
{
    if (!req) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (ev) {
        json_object_set_new(req, "stream", json_true());
        /* stream text as bytes after each event line (daemon.h): no JSON
         * escaping and parsing of a long output */
        json_object_set_new(req, "raw_text", json_true());
    }
    char session[128] = "";
    if (json_is_string(json_object_get(req, "session")))
        snprintf(session, sizeof session, "%s", json_string_value(json_object_get(req, "session")));
    int fd = mcpd_connect(err, errlen);
    if (fd < 0) {
        json_decref(req);
        return NULL;
    }
    if (daemon_send_json(fd, req) < 0) {
        snprintf(err, errlen, "cannot send to the daemon: %s", strerror(errno));
        json_decref(req);
        close(fd);
        return NULL;
    }
    json_decref(req);

    char *buf = NULL;
    size_t len = 0, cap = 0;
    double start = now_s(), next_tick = start + 0.25;
    int interrupted = 0, failed = 0;
    json_t *reply = NULL;
    json_t *pending = NULL; /* a raw stream event waiting for its text */
    size_t pending_n = 0;
    for (;;) {
        /* Complete lines first; the rest moves to the front once per read
         * (moving it after every line was quadratic in a burst of events). */
        char *nl;
        size_t off = 0;
        for (;;) {
            if (reply || !buf)
                break;
            if (pending) {
                /* a raw stream event: its text's bytes follow its line */
                if (len - off < pending_n)
                    break;
                json_object_set_new(pending, "text", json_stringn_nocheck(buf + off, pending_n));
                off += pending_n;
                ev(ud, pending);
                json_decref(pending);
                pending = NULL;
                continue;
            }
            if (!(nl = memchr(buf + off, '\n', len - off)))
                break;
            size_t ll = (size_t)(nl - (buf + off));
            json_error_t jerr;
            json_t *msg = ll ? json_loadb(buf + off, ll, 0, &jerr) : NULL;
            off += ll + 1;
            if (!msg) {
                if (ll)
                    mcp_log("daemon sent a line that is not JSON: %s", jerr.text);
                continue;
            }
            json_t *tb = json_object_get(msg, "text_bytes");
            if (ev && json_is_integer(tb) && json_object_get(msg, "event")) {
                if (json_integer_value(tb) < 0 ||
                    (unsigned long long)json_integer_value(tb) > MCPD_MAX_LINE) {
                    json_decref(msg);
                    snprintf(err, errlen, "the daemon sent a stream event of %lld bytes",
                             (long long)json_integer_value(tb));
                    failed = 1;
                    break;
                }
                pending = msg;
                pending_n = (size_t)json_integer_value(tb);
                continue;
            }
            if (!json_object_get(msg, "ok")) {
                if (ev)
                    ev(ud, msg);
                json_decref(msg);
            } else {
                reply = msg;
            }
        }
        if (off) {
            memmove(buf, buf + off, len - off);
            len -= off;
        }
        if (reply || failed)
            break;
        double now = now_s();
        int wait_ms = tick ? (int)((next_tick - now) * 1000) : 1000;
        if (wait_ms < 0)
            wait_ms = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, wait_ms);
        if (pr < 0 && errno != EINTR) {
            snprintf(err, errlen, "poll: %s", strerror(errno));
            break;
        }
        now = now_s();
        if (tick && now >= next_tick) {
            next_tick = now + 0.25;
            if (tick(ud, now - start) && !interrupted && session[0]) {
                interrupted = 1;
                send_interrupt(session);
            }
        }
        if (pr <= 0)
            continue;
        if (len + 65536 > cap || (pending && pending_n + 65536 > cap)) {
            if (cap > MCPD_MAX_LINE) {
                snprintf(err, errlen, "the daemon's reply is too large");
                break;
            }
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                snprintf(err, errlen, "out of memory");
                break;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            snprintf(err, errlen, "the daemon closed the connection without a reply%s",
                     r < 0 ? " (read error)" : " (did it crash? see daemon.log)");
            break;
        }
        len += (size_t)r;
    }
    free(buf);
    json_decref(pending);
    close(fd);
    if (reply) {
        const char *e = reply_error(reply);
        if (e) {
            snprintf(err, errlen, "%s", e);
            json_decref(reply);
            return NULL;
        }
    }
    return reply;
}
