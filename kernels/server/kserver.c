/*
 * kserver.c — kserver_main(): options, connection file, sockets, signals and
 * the single-threaded event loop. The loop never blocks on the worker: it
 * polls the client sockets together with the worker's pipes, so control,
 * stdin and kernel_info are served while code runs; the heartbeat has its
 * own thread (khb.c).
 */
#include "kernels/server/kserver.h"
#include "common/cm_install.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static const char *log_prefix = "kernel";
static int signal_fd = -1; /* write end of the self-pipe, for the handler */

/* ---------------------------------------------------------------- logging
 *
 * Much of what the kernel logs is caused by the sandboxed code (malformed
 * worker events, unknown events, worker "log" events), and the log is a file
 * on the host's state filesystem. Two bounds keep it small whatever the code
 * does: a token bucket per message format (KLOG_BURST at once, then one per
 * second; what was dropped is summarised as "N similar messages suppressed"
 * when that format may log again, or from the loop's tick), and a hard cap
 * on the file's size (--log-max): past it one last line says so and nothing
 * more is written. */

#define KLOG_BURST 20.0
#define KLOG_RATE 1.0 /* lines per second once the burst is spent */
#define KLOG_CLASSES 32

typedef struct klog_class {
    const char *fmt; /* the class: the format string (a literal: its address) */
    double tokens;
    double last;
    unsigned long suppressed;
} klog_class;

static klog_class klog_classes[KLOG_CLASSES];
static uint64_t klog_max = KOPTS_LOG_MAX_DEFAULT;
static int klog_full;

static double klog_now(void)
{
    return (double)kworker_now_ns() / 1e9;
}

void kserver_log_set_max(uint64_t bytes)
{
    klog_max = bytes;
}

uint64_t kserver_log_max(void)
{
    return klog_max;
}

/* Writes one line to stderr unless the log file reached its cap. */
static void klog_write(const char *line)
{
    if (klog_full)
        return;
    size_t len = strlen(line);
    struct stat st;
    if (fstat(STDERR_FILENO, &st) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size + len > klog_max) {
        char last[256];
        int n = snprintf(last, sizeof last,
                         "%s: the log reached its size limit (%llu bytes, --log-max); "
                         "further messages are not written\n",
                         log_prefix, (unsigned long long)klog_max);
        if (n > 0 && write(STDERR_FILENO, last, (size_t)n) < 0) {
            /* nothing left to report it to */
        }
        klog_full = 1;
        return;
    }
    while (len) {
        ssize_t w = write(STDERR_FILENO, line, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        line += w;
        len -= (size_t)w;
    }
}

static void klog_summary(klog_class *c)
{
    if (!c->suppressed)
        return;
    char line[256];
    snprintf(line, sizeof line, "%s: (%lu similar messages suppressed)\n", log_prefix,
             c->suppressed);
    c->suppressed = 0;
    klog_write(line);
}

static klog_class *klog_class_of(const char *fmt, double now)
{
    klog_class *free_slot = NULL, *oldest = &klog_classes[0];
    for (int i = 0; i < KLOG_CLASSES; i++) {
        klog_class *c = &klog_classes[i];
        if (c->fmt == fmt)
            return c;
        if (!c->fmt && !free_slot)
            free_slot = c;
        if (c->last < oldest->last)
            oldest = c;
    }
    klog_class *c = free_slot ? free_slot : oldest;
    if (c->fmt)
        klog_summary(c);
    c->fmt = fmt;
    c->tokens = KLOG_BURST;
    c->last = now;
    c->suppressed = 0;
    return c;
}

void kserver_log_tick(void)
{
    double now = klog_now();
    for (int i = 0; i < KLOG_CLASSES; i++) {
        klog_class *c = &klog_classes[i];
        if (c->fmt && c->suppressed && now - c->last >= 1.0 / KLOG_RATE) {
            c->tokens += (now - c->last) * KLOG_RATE;
            if (c->tokens > KLOG_BURST)
                c->tokens = KLOG_BURST;
            c->last = now;
            klog_summary(c);
        }
    }
}

void kserver_log(const char *fmt, ...)
{
    double now = klog_now();
    klog_class *c = klog_class_of(fmt, now);
    c->tokens += (now - c->last) * KLOG_RATE;
    if (c->tokens > KLOG_BURST)
        c->tokens = KLOG_BURST;
    c->last = now;
    if (c->tokens < 1.0) {
        c->suppressed++;
        return;
    }
    c->tokens -= 1.0;
    klog_summary(c);
    char buf[1024], line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    snprintf(line, sizeof line, "%s: %s\n", log_prefix, buf);
    klog_write(line);
}

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char c = (unsigned char)sig;
    if (signal_fd >= 0 && write(signal_fd, &c, 1) < 0) {
        /* pipe full: a wake-up is already pending */
    }
    errno = saved;
}

static int install_signals(kserver *ks)
{
    if (pipe2(ks->sigpipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return -1;
    signal_fd = ks->sigpipe[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++)
        if (sigaction(sigs[i], &sa, NULL) < 0)
            return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

/* ---------------------------------------------------------------- sending */

void kserver_publish(kserver *ks, const char *msg_type, json_t *content, const jmsg *parent)
{
    jmsg *m = jmsg_new(msg_type, ks->session_id, "kernel", parent);
    if (!m) {
        json_decref(content);
        return;
    }
    /* iopub has no routing ids; the topic frame is the message type. */
    jp_frame topic = {(void *)msg_type, strlen(msg_type)};
    char topic_buf[128];
    snprintf(topic_buf, sizeof topic_buf, "kernel.%s.%s", ks->session_id, msg_type);
    topic.data = topic_buf;
    topic.size = strlen(topic_buf);
    jmsg_set_ids(m, &topic, 1);
    jmsg_set_content(m, content ? content : json_object());
    jp_error err;
    if (kiopub_publish(ks->iopub, m, &err) < 0)
        kserver_log("cannot publish %s: %s", msg_type, err.reason);
    jmsg_destroy(&m);
}

void kserver_status(kserver *ks, const char *state, const jmsg *parent)
{
    kserver_publish(ks, "status", json_pack("{s:s}", "execution_state", state), parent);
}

void kserver_reply(kserver *ks, void *sock, const char *msg_type, json_t *content, json_t *metadata,
                   const jmsg *parent)
{
    jmsg *m = jmsg_new(msg_type, ks->session_id, "kernel", parent);
    if (!m) {
        json_decref(content);
        json_decref(metadata);
        return;
    }
    jmsg_set_content(m, content ? content : json_object());
    if (metadata)
        jmsg_set_metadata(m, metadata);
    jp_error err;
    if (sock == ks->shell || sock == ks->control) {
        /* Never lost to a slow reader: see kreplyq.h. */
        jp_frame *frames = NULL;
        size_t n = 0;
        char why[256];
        if (jp_session_encode(ks->session, m, &frames, &n, &err) != JP_OK)
            kserver_log("cannot send %s: %s", msg_type, err.reason);
        else if (kreplyq_send(ks->replies, sock, frames, n, why, sizeof why) < 0)
            kserver_log("cannot send %s: %s", msg_type, why);
    } else if (sock == ks->stdin_sock) {
        /* The client's stdin connection may still be on its way (a client
         * that just connected, on a loaded machine): an input_request waits
         * for it instead of being lost, which would hang the cell. */
        jp_frame *frames = NULL;
        size_t n = 0;
        kexec_stdin_clear(ks);
        if (jp_session_encode(ks->session, m, &frames, &n, &err) != JP_OK) {
            kserver_log("cannot send %s: %s", msg_type, err.reason);
        } else {
            ks->stdin_wait = frames;
            ks->stdin_wait_n = n;
            ks->stdin_wait_until = kworker_now_ns() + KSERVER_STDIN_WAIT_NS;
            kexec_stdin_retry(ks, kworker_now_ns());
        }
    } else if (jp_session_send(ks->session, sock, m, ZMQ_DONTWAIT, &err) != JP_OK) {
        kserver_log("cannot send %s: %s", msg_type, err.reason);
    }
    jmsg_destroy(&m);
}

json_t *kserver_kernel_info(kserver *ks)
{
    json_t *info =
        json_pack("{s:s, s:s, s:s, s:s, s:b, s:[]}", "status", "ok", "protocol_version",
                  JP_PROTOCOL_VERSION, "implementation", "kernelmgr", "implementation_version",
                  KSERVER_VERSION, "debugger", ks->debugger_seen, "help_links");
    if (!info)
        return NULL;
    if (ks->spec.kernel_info)
        json_object_update(info, ks->spec.kernel_info);
    /* worker_ready: the current worker said it is ready (kernel_info is
     * answered while a worker still starts; one that dies before it is
     * ready had no state to lose, so its death is no restart notice) */
    json_t *km = json_pack("{s:O, s:s, s:s, s:I, s:b}", "sandbox", ks->protections, "level",
                           ks->opts.sandbox.level == SANDBOX_NONE ? "none" : "strict", "workspace",
                           ks->workspace, "worker_generation", (json_int_t)ks->worker_gen,
                           "worker_ready", ks->worker && ks->worker_ready);
    /* the limits in force, as given (null: none); whether the CPU rate cap
     * is enforced here is in "sandbox" (cgroup-v*-cpu-max or
     * cpu-rate-cap-unavailable) */
    const sandbox_config *sc = &ks->opts.sandbox;
    json_t *lim = json_pack("{s:I, s:i, s:i, s:I, s:I, s:o, s:o}", "memory_bytes",
                            (json_int_t)sc->memory_bytes, "procs", (int)sc->max_procs, "open_files",
                            (int)sc->max_open_files, "file_size_bytes",
                            (json_int_t)sc->max_file_bytes, "tmp_bytes", (json_int_t)sc->tmp_bytes,
                            "cpus", sc->cpus > 0 ? json_real(sc->cpus) : json_null(), "cpu_time",
                            ks->opts.cpu_time > 0 ? json_real(ks->opts.cpu_time) : json_null());
    if (km && lim)
        json_object_set_new(km, "limits", lim);
    else
        json_decref(lim);
    if (km)
        json_object_set_new(info, "kernelmgr", km);
    return info;
}

/* ---------------------------------------------------------------- setup */

/* Finds the share directory (support files) relative to the executable
 * (cm_install.h: the build tree or an installed prefix); $KERNELMGR_SHARE
 * wins. */
static int find_share_dir(kserver *ks)
{
    char *dir = cm_install_share_dir();
    if (!dir)
        return -1;
    snprintf(ks->share_dir, sizeof ks->share_dir, "%s", dir);
    free(dir);
    return 0;
}

/* zmq_bind with umask 077: an ipc socket file is created with the process's
 * umask, and connecting needs write permission on it, so under a lax umask
 * (002 in a shared group directory) other users could subscribe to IOPub.
 * Only this thread creates files meanwhile (the worker starts later and
 * gets the umask back). */
static int bind_private(void *s, const char *ep)
{
    mode_t old = umask(077);
    int rc = zmq_bind(s, ep);
    int e = errno;
    umask(old);
    errno = e;
    return rc;
}

static void *make_socket(kserver *ks, int type, jp_channel ch, char *err, size_t errlen)
{
    char ep[512];
    void *s = zmq_socket(ks->ctx, type);
    if (!s) {
        snprintf(err, errlen, "zmq_socket: %s", zmq_strerror(errno));
        return NULL;
    }
    int zero = 0, one = 1;
    int64_t maxmsg = JP_DEFAULT_MAX_BYTES;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (type == ZMQ_ROUTER)
        zmq_setsockopt(s, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    /* A reply to a peer whose queue is full waits in kreplyq (EAGAIN)
     * instead of being dropped silently. */
    if (type == ZMQ_ROUTER && (ch == JP_SHELL || ch == JP_CONTROL || ch == JP_STDIN))
        zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    if (type == ZMQ_XPUB) {
        /* Lossless with back-pressure; see kiopub.h for the stuck-subscriber
         * escape. VERBOSER: told about every subscriber that leaves. */
        int hwm = KIOPUB_HWM;
        zmq_setsockopt(s, ZMQ_XPUB_NODROP, &one, sizeof one);
        zmq_setsockopt(s, ZMQ_XPUB_VERBOSER, &one, sizeof one);
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    }
    if (jp_connection_endpoint(&ks->conn, ch, ep, sizeof ep) < 0 || bind_private(s, ep) < 0) {
        snprintf(err, errlen, "cannot bind the %s channel to %.300s: %s", jp_channel_name(ch), ep,
                 zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* The heartbeat first, before the (possibly slow) backend preparation:
 * jupyter_client's wait_for_ready() pings it from the start and declares a
 * kernel that does not answer within a second dead ("Kernel died before
 * replying to kernel_info") while it is only starting slowly on a loaded
 * machine. Requests sent meanwhile wait in the clients' queues. */
static int open_heartbeat(kserver *ks, char *err, size_t errlen)
{
    ks->ctx = zmq_ctx_new();
    if (!ks->ctx) {
        snprintf(err, errlen, "zmq_ctx_new: %s", zmq_strerror(errno));
        return -1;
    }
    char ep[512];
    if (jp_connection_endpoint(&ks->conn, JP_HB, ep, sizeof ep) < 0) {
        snprintf(err, errlen, "heartbeat endpoint too long");
        return -1;
    }
    mode_t old = umask(077); /* its ipc socket too (bind_private) */
    ks->hb = khb_start(ks->ctx, ep, err, errlen);
    umask(old);
    return ks->hb ? 0 : -1;
}

static int open_sockets(kserver *ks, char *err, size_t errlen)
{
    if (!(ks->shell = make_socket(ks, ZMQ_ROUTER, JP_SHELL, err, errlen)) ||
        !(ks->control = make_socket(ks, ZMQ_ROUTER, JP_CONTROL, err, errlen)) ||
        !(ks->stdin_sock = make_socket(ks, ZMQ_ROUTER, JP_STDIN, err, errlen)) ||
        !(ks->iopub_sock = make_socket(ks, ZMQ_XPUB, JP_IOPUB, err, errlen)))
        return -1;
    ks->bound = 1;
    ks->iopub = kiopub_new(ks->ctx, ks->iopub_sock, ks->session);
    ks->replies = kreplyq_new();
    if (!ks->iopub || !ks->replies) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return 0;
}

static void close_sockets(kserver *ks)
{
    khb_stop(&ks->hb);
    if (ks->replies) {
        kreplyq_flush(ks->replies);
        kreplyq_destroy(&ks->replies);
    }
    if (ks->iopub) {
        kiopub_flush(ks->iopub);
        kiopub_destroy(&ks->iopub);
    }
    void **socks[] = {&ks->shell, &ks->control, &ks->stdin_sock, &ks->iopub_sock};
    /* Give the last replies (shutdown_reply, the final idle) a moment to
     * leave, without letting a vanished peer hold up the exit. */
    int linger = 500;
    for (size_t i = 0; i < sizeof socks / sizeof *socks; i++) {
        if (*socks[i]) {
            zmq_setsockopt(*socks[i], ZMQ_LINGER, &linger, sizeof linger);
            zmq_close(*socks[i]);
        }
        *socks[i] = NULL;
    }
    if (ks->ctx)
        zmq_ctx_term(ks->ctx);
    ks->ctx = NULL;
    /* libzmq removes its ipc files on close; make sure none is left behind. */
    if (ks->bound && !strcmp(ks->conn.transport, "ipc")) {
        for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++) {
            char ep[512];
            if (jp_connection_endpoint(&ks->conn, (jp_channel)ch, ep, sizeof ep) == 0 &&
                !strncmp(ep, "ipc://", 6))
                unlink(ep + 6);
        }
    }
}

/* ---------------------------------------------------------------- loop */

static void handle_signals(kserver *ks)
{
    unsigned char sigs[64];
    ssize_t n;
    while ((n = read(ks->sigpipe[0], sigs, sizeof sigs)) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            switch (sigs[i]) {
            case SIGINT:
                kexec_interrupt(ks);
                break;
            case SIGTERM:
            case SIGHUP:
                kserver_log("terminated by signal %d, shutting down", sigs[i]);
                ks->quit = 1;
                break;
            default: /* SIGCHLD: the loop reaps on every turn */
                break;
            }
        }
    }
}

static uint64_t min_deadline(uint64_t a, uint64_t b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    return a < b ? a : b;
}

/* The owner's pipe (--owner-fd): end-of-file or an error means the owner
 * is gone; anything it writes is ignored. */
static void check_owner(kserver *ks)
{
    char buf[256];
    for (;;) {
        ssize_t r = read(ks->opts.owner_fd, buf, sizeof buf);
        if (r > 0)
            continue;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        kserver_log("the owner's pipe (--owner-fd %d) %s: the owner is gone, shutting down",
                    ks->opts.owner_fd, r == 0 ? "was closed" : strerror(errno));
        ks->quit = 1;
        return;
    }
}

/* Back-pressure on clients: while IOPub is backlogged, new shell and
 * control requests are left in ZeroMQ's queues (bounded by its high-water
 * mark), so a client flooding requests slows itself down instead of
 * growing our queue or getting a subscriber that does read disconnected. */
static void update_client_pause(kserver *ks)
{
    size_t backlog = kiopub_count(ks->iopub);
    size_t replies = kreplyq_waiting(ks->replies);
    if (!ks->clients_paused && (backlog > KIOPUB_BACKLOG_HIGH || kiopub_congested(ks->iopub))) {
        ks->clients_paused = 1;
        kserver_log("IOPub is backlogged (%zu messages waiting): not reading new requests "
                    "until subscribers catch up",
                    backlog);
    } else if (!ks->clients_paused && replies) {
        /* a client reads its replies slowly: wait for it (quietly) */
        ks->clients_paused = 1;
    } else if (ks->clients_paused && backlog < KIOPUB_BACKLOG_LOW && !kiopub_congested(ks->iopub) &&
               !replies) {
        ks->clients_paused = 0;
    }
}

/* The IOPub join wait (see join_wait_ns in kserver.h): 1 while shell
 * requests are held for a first subscriber. */
static int join_waiting(kserver *ks, uint64_t now)
{
    if (kiopub_subscriptions(ks->iopub) > 0) {
        ks->join_wait_ns = 0;
        ks->join_waived = 0;
        return 0;
    }
    if (!ks->join_wait_ns)
        return 0;
    if (now < ks->join_wait_ns)
        return 1;
    ks->join_wait_ns = 0;
    ks->join_waived = 1;
    kserver_log("no IOPub subscriber within %llu s: answering shell requests without one "
                "(what they publish reaches nobody)",
                KSERVER_IOPUB_JOIN_WAIT_NS / 1000000000ull);
    return 0;
}

/* A shell request is pending: 1 when it has to wait for a subscriber
 * (starts the wait). */
static int join_wait_starts(kserver *ks, uint64_t now)
{
    if (ks->join_waived || kiopub_subscriptions(ks->iopub) > 0)
        return 0;
    ks->join_wait_ns = now + KSERVER_IOPUB_JOIN_WAIT_NS;
    return 1;
}

static void run_loop(kserver *ks)
{
    while (!ks->quit) {
        zmq_pollitem_t items[12];
        int n = 0;
        update_client_pause(ks);
        short client_ev = ks->clients_paused ? 0 : ZMQ_POLLIN;
        int joining = join_waiting(ks, kworker_now_ns());
        int i_shell = n;
        items[n++] = (zmq_pollitem_t){ks->shell, 0, joining ? 0 : client_ev, 0};
        int i_control = n;
        items[n++] = (zmq_pollitem_t){ks->control, 0, client_ev, 0};
        int i_stdin = n;
        items[n++] = (zmq_pollitem_t){ks->stdin_sock, 0, ZMQ_POLLIN, 0};
        int i_iopub = n;
        items[n++] = (zmq_pollitem_t){ks->iopub_sock, 0, ZMQ_POLLIN, 0};
        int i_sig = n;
        items[n++] = (zmq_pollitem_t){NULL, ks->sigpipe[0], ZMQ_POLLIN, 0};
        int i_owner = -1;
        if (ks->opts.owner_fd >= 0) {
            i_owner = n;
            items[n++] = (zmq_pollitem_t){NULL, ks->opts.owner_fd, ZMQ_POLLIN, 0};
        }
        int i_out = -1, i_err = -1, i_evt = -1, i_req = -1, i_devt = -1, i_dreq = -1;
        kworker *w = ks->worker;
        /* Back-pressure: while IOPub is congested, leave the worker's pipes
         * alone; they fill up and the worker blocks on its writes. */
        if (w && !kiopub_congested(ks->iopub)) {
            if (kworker_fd(w, KW_STDOUT) >= 0 && ks->out.len < KSTREAM_CHUNK) {
                i_out = n;
                items[n++] = (zmq_pollitem_t){NULL, kworker_fd(w, KW_STDOUT), ZMQ_POLLIN, 0};
            }
            if (kworker_fd(w, KW_STDERR) >= 0 && ks->err.len < KSTREAM_CHUNK) {
                i_err = n;
                items[n++] = (zmq_pollitem_t){NULL, kworker_fd(w, KW_STDERR), ZMQ_POLLIN, 0};
            }
            if (kworker_fd(w, KW_EVENTS) >= 0) {
                i_evt = n;
                items[n++] = (zmq_pollitem_t){NULL, kworker_fd(w, KW_EVENTS), ZMQ_POLLIN, 0};
            }
            if (kworker_fd(w, KW_DEBUG_EVT) >= 0) {
                i_devt = n;
                items[n++] = (zmq_pollitem_t){NULL, kworker_fd(w, KW_DEBUG_EVT), ZMQ_POLLIN, 0};
            }
        }
        if (w && kworker_debug_wants_write(w)) {
            i_dreq = n;
            items[n++] = (zmq_pollitem_t){NULL, kworker_fd(w, KW_DEBUG_REQ), ZMQ_POLLOUT, 0};
        }
        /* a worker in a session sandbox: its exit is reported there */
        int i_wait = -1;
        if (w && sandbox_wait_fd(kworker_sandbox(w)) >= 0) {
            i_wait = n;
            items[n++] = (zmq_pollitem_t){NULL, sandbox_wait_fd(kworker_sandbox(w)), ZMQ_POLLIN, 0};
        }
        (void)i_wait;
        if (w && kworker_wants_write(w)) {
            i_req = n;
            items[n++] = (zmq_pollitem_t){NULL, kworker_fd(w, KW_REQUESTS), ZMQ_POLLOUT, 0};
        }

        uint64_t now = kworker_now_ns();
        uint64_t due = 0;
        due = min_deadline(due, kstream_deadline(&ks->out));
        due = min_deadline(due, kstream_deadline(&ks->err));
        due = min_deadline(due, ks->interrupt_deadline_ns);
        due = min_deadline(due, ks->interrupt_resend_ns);
        due = min_deadline(due, ks->cpu_check_ns);
        due = min_deadline(due, ks->restart_at_ns);
        due = min_deadline(due, ks->kill_at_ns);
        due = min_deadline(due, ks->join_wait_ns);
        if (ks->worker && !ks->worker_ready)
            due = min_deadline(due, ks->ready_by_ns);
        if (kreplyq_waiting(ks->replies))
            due = min_deadline(due, now + 5000000ull);
        if (kiopub_pending(ks->iopub)) {
            due = min_deadline(due, now + 5000000ull);
            due = min_deadline(due, kiopub_deadline(ks->iopub));
        }
        long timeout = -1;
        if (due)
            timeout = due <= now ? 0 : (long)((due - now + 999999) / 1000000);
        /* Worker death is also noticed through SIGCHLD; this bound only
         * protects against a lost wake-up. */
        if (ks->worker && (timeout < 0 || timeout > 1000))
            timeout = 1000;

        int rc = zmq_poll(items, n, timeout);
        if (rc < 0 && errno != EINTR) {
            kserver_log("zmq_poll: %s", zmq_strerror(errno));
            ks->quit = 1;
            break;
        }
        if (items[i_sig].revents & ZMQ_POLLIN)
            handle_signals(ks);
        if (i_owner >= 0 && (items[i_owner].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            check_owner(ks);
        if (ks->quit)
            break;
        /* Each request answered may publish on IOPub: stop at the mark. */
        if ((items[i_control].revents & ZMQ_POLLIN) && !ks->clients_paused)
            kshell_receive_all(ks, ks->control, 64);
        update_client_pause(ks);
        if ((items[i_shell].revents & ZMQ_POLLIN) && !ks->clients_paused &&
            !join_wait_starts(ks, kworker_now_ns()))
            kshell_receive_all(ks, ks->shell, 64);
        if (items[i_stdin].revents & ZMQ_POLLIN)
            kshell_receive_all(ks, ks->stdin_sock, 64);
        if (items[i_iopub].revents & ZMQ_POLLIN)
            kiopub_drain_subscriptions(ks->iopub, ks->session_id);
        if (ks->worker && i_out >= 0 && (items[i_out].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            kexec_read_output(ks, KW_STDOUT);
        if (ks->worker && i_err >= 0 && (items[i_err].revents & (ZMQ_POLLIN | ZMQ_POLLERR)))
            kexec_read_output(ks, KW_STDERR);
        if (ks->worker && i_evt >= 0 && (items[i_evt].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) {
            for (int k = 0; k < 64 && ks->worker; k++) {
                /* Output written before an event is in the pipes before the
                 * event is: take it first, before every read of events. */
                kexec_drain_output(ks);
                int r = kworker_read_events(ks->worker, kexec_on_event, ks);
                if (r == 1) {
                    kworker_close_fd(ks->worker, KW_EVENTS);
                    /* Give the process a moment to be reaped normally. */
                    if (!ks->kill_at_ns)
                        ks->kill_at_ns = kworker_now_ns() + 500000000ull;
                    break;
                }
                if (r < 0)
                    break;
            }
        }
        if (ks->worker && i_devt >= 0 && (items[i_devt].revents & (ZMQ_POLLIN | ZMQ_POLLERR))) {
            for (int k = 0; k < 64 && ks->worker; k++) {
                int r = kworker_read_debug(ks->worker, kdbg_on_line, ks);
                if (r == 1)
                    kworker_close_fd(ks->worker, KW_DEBUG_EVT);
                if (r != 0)
                    break;
            }
        }
        if (ks->worker && i_dreq >= 0 && (items[i_dreq].revents & (ZMQ_POLLOUT | ZMQ_POLLERR))) {
            if (kworker_debug_write(ks->worker) < 0)
                kworker_close_fd(ks->worker, KW_DEBUG_REQ);
        }
        if (ks->worker && i_req >= 0 && (items[i_req].revents & (ZMQ_POLLOUT | ZMQ_POLLERR))) {
            if (kworker_write(ks->worker) < 0)
                kworker_close_fd(ks->worker, KW_REQUESTS);
        }
        if (ks->worker && kworker_reap(ks->worker))
            kexec_worker_gone(ks);
        kexec_timers(ks, kworker_now_ns());
        if (ks->stdin_wait)
            kexec_stdin_retry(ks, kworker_now_ns());
        kserver_log_tick();
        kiopub_flush(ks->iopub);
        kreplyq_flush(ks->replies);
        kshell_start_next(ks);
    }
}

/* ---------------------------------------------------------------- main */

static void server_free(kserver *ks)
{
    kexec_stdin_clear(ks);
    kworker_destroy(&ks->worker);
    close_sockets(ks);
    jmsg_destroy(&ks->cur);
    jmsg_destroy(&ks->last_parent);
    kdbg_free(ks);
    json_decref(ks->cur_error);
    free(ks->lost_reason);
    ks->lost_reason = NULL;
    while (ks->qhead) {
        kqueued *q = ks->qhead;
        ks->qhead = q->next;
        jmsg_destroy(&q->msg);
        free(q);
    }
    khistory_destroy(&ks->history);
    jp_session_destroy(&ks->session);
    json_decref(ks->protections);
    kspec_clear(&ks->spec);
    kopts_clear(&ks->opts);
    kstream_clear(&ks->out);
    kstream_clear(&ks->err);
    if (ks->sigpipe[0] >= 0) {
        signal_fd = -1;
        close(ks->sigpipe[0]);
        close(ks->sigpipe[1]);
    }
}

int kserver_main(int argc, char **argv, const kbackend *backend)
{
    static char prefix[64];
    snprintf(prefix, sizeof prefix, "kernel-%s", backend->name);
    log_prefix = prefix;
    kserver ks_storage, *ks = &ks_storage;
    memset(ks, 0, sizeof *ks);
    ks->sigpipe[0] = ks->sigpipe[1] = -1;
    ks->backend = backend;
    char err[512] = "";
    int status = 1;

    if (kopts_parse(&ks->opts, argc, argv, backend, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\nTry 'kernel-%s --help'.\n", prefix, err, backend->name);
        return 2;
    }
    kserver_log_set_max(ks->opts.log_max);
    /* from here on every return goes through server_free() (or at least
     * kopts_clear(): the --env-file content is wiped) */
    if (ks->opts.help) {
        kopts_usage(stdout, backend);
        kopts_clear(&ks->opts);
        return 0;
    }
    if (ks->opts.version) {
        printf("kernel-%s (kernelmgr) %s, Jupyter protocol %s\n", backend->name, KSERVER_VERSION,
               JP_PROTOCOL_VERSION);
        kopts_clear(&ks->opts);
        return 0;
    }
    if (!ks->opts.connection_file) {
        fprintf(stderr, "%s: missing -f CONNECTION_FILE\nTry 'kernel-%s --help'.\n", prefix,
                backend->name);
        kopts_clear(&ks->opts);
        return 2;
    }
    jp_error jerr;
    if (jp_connection_read(ks->opts.connection_file, &ks->conn, &jerr) != JP_OK) {
        fprintf(stderr, "%s: cannot use connection file %s: %s\n", prefix, ks->opts.connection_file,
                jerr.reason);
        kopts_clear(&ks->opts);
        return 1;
    }
    if (!jp_connection_is_loopback(&ks->conn) && !ks->opts.allow_non_loopback_ip) {
        fprintf(stderr,
                "%s: connection file %s: ip \"%s\" is not a loopback address (127.0.0.0/8, "
                "::1): whoever can reach it could read the kernel's output on IOPub (ZeroMQ PUB "
                "has no authentication); use 127.0.0.1, or pass --allow-non-loopback-ip to "
                "accept that exposure\n",
                prefix, ks->opts.connection_file, ks->conn.ip);
        kopts_clear(&ks->opts);
        return 1;
    }
    /* Every socket is bound first, before the workspace and sandbox checks
     * and the backend's preparation (finding an interpreter takes
     * milliseconds, more on a cold cache): a client that connects right
     * after the spawn (jupyter_client does) is accepted at once instead of
     * being refused and retrying only after ZeroMQ's reconnect interval
     * (100 ms by default). Requests sent meanwhile wait in the sockets'
     * queues until the loop runs; a check that fails still exits 1. */
    find_share_dir(ks);
    if (open_heartbeat(ks, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", prefix, err);
        goto out;
    }
    ks->session =
        jp_session_new(ks->conn.key, strlen(ks->conn.key), ks->conn.signature_scheme, &jerr);
    if (!ks->session) {
        fprintf(stderr, "%s: connection file %s: %s\n", prefix, ks->opts.connection_file,
                jerr.reason);
        goto out;
    }
    jp_uuid4(ks->session_id);
    if (open_sockets(ks, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", prefix, err);
        goto out;
    }
    const char *ws = ks->opts.workspace_arg ? ks->opts.workspace_arg : ".";
    struct stat st;
    errno = 0; /* "not a directory" when nothing failed */
    if (!realpath(ws, ks->workspace) || stat(ks->workspace, &st) < 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: workspace %s: %s\n", prefix, ws,
                errno ? strerror(errno) : "not a directory");
        goto out;
    }
    ks->opts.sandbox.workspace = ks->workspace;
    if (sandbox_check(&ks->opts.sandbox, err, sizeof err) < 0) {
        fprintf(stderr,
                "%s: the %s sandbox is not available on this host: %s\n"
                "(--sandbox none runs the code without isolation)\n",
                prefix, ks->opts.sandbox.level == SANDBOX_STRICT ? "strict" : "requested", err);
        goto out;
    }
    if (kstream_init(&ks->out, "stdout") < 0 || kstream_init(&ks->err, "stderr") < 0) {
        fprintf(stderr, "%s: out of memory\n", prefix);
        goto out;
    }
    if (backend->prepare(ks->share_dir, ks->workspace, &ks->spec, err, sizeof err) < 0 ||
        kopts_apply_spec(&ks->opts, &ks->spec, err, sizeof err) < 0) {
        fprintf(stderr, "%s: %s\n", prefix, err);
        goto out;
    }
    if (install_signals(ks) < 0) {
        fprintf(stderr, "%s: signals: %s\n", prefix, strerror(errno));
        goto out;
    }
    snprintf(ks->history_path, sizeof ks->history_path, "%s.history.jsonl",
             ks->opts.connection_file);
    ks->history = khistory_open(ks->history_path, ks->opts.history_max);
    if (!ks->history) {
        fprintf(stderr, "%s: out of memory\n", prefix);
        goto out;
    }
    kserver_log("listening (%s, workspace %s, sandbox %s)", ks->conn.transport, ks->workspace,
                ks->opts.sandbox.level == SANDBOX_NONE ? "none" : "strict");
    if (strcmp(ks->conn.transport, "ipc"))
        kserver_log("warning: tcp transport on %s: %s", ks->conn.ip, JP_TCP_EXPOSURE);
    kserver_status(ks, "starting", NULL);
    kexec_start_worker(ks);
    /* Only kernel_info replies need the list, and making it (a throwaway
     * cgroup set, made and removed) takes ~0.5 ms: done while the worker
     * boots, not before it starts. */
    ks->protections = sandbox_protections(&ks->opts.sandbox);
    if (!ks->protections)
        ks->protections = json_array();
    run_loop(ks);
    khistory_sweep(ks->history_path);
    status = 0;
out:
    server_free(ks);
    return status;
}
