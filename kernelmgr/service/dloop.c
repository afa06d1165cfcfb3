/*
 * dloop.c — the daemon's event loop: connections, their input and bounded
 * output, and the pool of worker threads that runs their requests
 * (daemon_int.h).
 *
 * Concurrency model. One event-loop thread (dloop_run) accepts
 * connections and does all socket reading and the buffered writing with
 * epoll (edge-triggered, non-blocking sockets): an idle connection costs a
 * few hundred bytes and no thread. A complete request line is handed to a
 * bounded pool of worker threads (daemon_workers); a connection has at most
 * one request in flight (answers stay in order), later lines wait in its
 * buffer. "Long" requests (exec, restart, connection_file: they may run
 * code or start kernels) may occupy all but DAEMON_RESERVED workers, so
 * ping, sessions, interrupt, close, files and export are served even while
 * every other worker runs code. Requests beyond the workers wait in a FIFO
 * of at most daemon_queue entries; past it the request is refused at once
 * ("the daemon is busy").
 *
 * Output. A worker sends directly while the socket takes it; what the
 * socket does not take waits in the connection's buffer (client_buffer
 * bytes), written by the loop. A stream event that does not fit waits up to
 * DAEMON_STALL_S for the client to make room (back-pressure to the kernel
 * for a slow reader); a client that made no progress in that time stops
 * receiving stream events (the execution goes on; one notice event says how
 * many bytes it missed, the final reply still comes). A connection whose
 * buffered output makes no progress for client_timeout seconds is dropped
 * and logged; its request runs to completion or timeout and its result goes
 * to the session's history. So a stopped client never holds a session.
 */
#include "kernelmgr/service/daemon_int.h"
#include "kernelmgr/service/rpc.h"
#include "common/cm_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define DAEMON_RESERVED 4
#define DAEMON_STALL_S 1.0

typedef struct djob {
    dconn *c;
    json_t *req; /* the whole request */
    const dmethod *meth;
    int is_long;
    struct djob *next;
} djob;

typedef struct dqueue {
    djob *head, *tail;
} dqueue;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dqueue q[2]; /* [0] short, [1] long */
    unsigned queued, running_long, long_max, queue_max;
    /* finished requests and broken connections, for the loop */
    djob *done;
    int efd; /* eventfd waking the loop */
    size_t obuf_max;
    double client_timeout;
} D = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .efd = -1};

void dloop_wake(void)
{
    uint64_t one = 1;
    ssize_t w = write(D.efd, &one, sizeof one);
    (void)w;
}

/* Appends to the pending output; the caller holds c->mu. 0 or -1 (OOM). */
static int obuf_append(dconn *c, const char *p, size_t n)
{
    if (c->ohead && c->ohead == c->olen)
        c->ohead = c->olen = 0;
    if (c->ocap - c->olen < n && c->ohead) {
        memmove(c->obuf, c->obuf + c->ohead, c->olen - c->ohead);
        c->olen -= c->ohead;
        c->ohead = 0;
    }
    if (c->ocap - c->olen < n) {
        size_t cap = c->ocap ? c->ocap : 65536;
        while (cap - c->olen < n)
            cap *= 2;
        char *b = realloc(c->obuf, cap);
        if (!b)
            return -1;
        c->obuf = b;
        c->ocap = cap;
    }
    if (c->olen == c->ohead)
        c->last_progress = cm_mono_s();
    memcpy(c->obuf + c->olen, p, n);
    c->olen += n;
    return 0;
}

/* Sends what the socket takes of the pending output; caller holds c->mu.
 * An emptied buffer is freed (memory goes back after a burst). */
static void obuf_flush(dconn *c)
{
    while (!c->dead && c->olen > c->ohead) {
        ssize_t w =
            send(c->fd, c->obuf + c->ohead, c->olen - c->ohead, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w <= 0) {
            c->dead = 1;
            break;
        }
        c->ohead += (size_t)w;
        c->last_progress = cm_mono_s();
    }
    if (c->dead || c->olen == c->ohead) {
        free(c->obuf);
        c->obuf = NULL;
        c->ohead = c->olen = c->ocap = 0;
    }
    pthread_cond_broadcast(&c->cv);
}

static int append_notice(dconn *c)
{
    char text[512];
    snprintf(text, sizeof text,
             "\n[kernelmgr: %llu bytes of streamed output were not sent to this client: it "
             "read too slowly; the result holds the output (within output_cap, spill files "
             "beyond)]\n",
             c->discarded);
    json_t *o = json_pack("{s:s s:I s:s s:s}", "event", "stream", "block", c->last_block, "name",
                          "stderr", "text", text);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return -1;
    int rc = obuf_append(c, s, strlen(s)) || obuf_append(c, "\n", 1);
    free(s);
    c->discarding = 0;
    c->discarded = 0;
    return rc;
}

/* Bytes this worker thread wrote to clients in its current request (see
 * worker_thread: when to give memory back). */
static __thread size_t job_bytes;

/* Back-pressure, c->mu held: waits for the client to make room for an
 * event of n bytes, not longer than DAEMON_STALL_S without progress. 0:
 * write it; -1: not (c is dead, or now discards: the bytes are counted). */
static int conn_wait_room(dconn *c, size_t n)
{
    for (;;) {
        obuf_flush(c);
        if (c->dead || c->olen - c->ohead + n <= D.obuf_max || c->olen == c->ohead)
            return c->dead ? -1 : 0;
        double give_up = c->last_progress + DAEMON_STALL_S;
        double now = cm_mono_s();
        if (now >= give_up) {
            c->discarding = 1;
            c->discarded += n;
            return -1;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double left = give_up - now;
        if (left > 0.1)
            left = 0.1;
        ts.tv_sec += (time_t)left;
        ts.tv_nsec += (long)((left - (double)(time_t)left) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
}

/* Nothing pending, c->mu held: sends what the socket takes of *s (*n
 * bytes), advancing both. 0, or -1: c is dead. */
static int conn_send_now(dconn *c, const char **s, size_t *n)
{
    while (*n) {
        ssize_t w = send(c->fd, *s, *n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (w <= 0) {
            c->dead = 1;
            return -1;
        }
        *s += w;
        *n -= (size_t)w;
    }
    return 0;
}

void dconn_write(dconn *c, const char *s, size_t n, int is_event)
{
    job_bytes += n;
    pthread_mutex_lock(&c->mu);
    if (c->dead)
        goto out;
    if (c->discarding && c->olen - c->ohead <= D.obuf_max / 2)
        if (append_notice(c))
            c->dead = 1;
    if (is_event && c->discarding) {
        c->discarded += n;
        goto out;
    }
    if (is_event && c->olen - c->ohead + n > D.obuf_max && c->olen > c->ohead &&
        conn_wait_room(c, n))
        goto out;
    /* nothing pending: straight to the socket */
    if (c->olen == c->ohead && conn_send_now(c, &s, &n))
        goto out;
    if (n && obuf_append(c, s, n))
        c->dead = 1;
out:;
    int dead = c->dead;
    pthread_mutex_unlock(&c->mu);
    if (dead)
        dloop_wake();
}

void dconn_write_json(dconn *c, const json_t *o, int is_event)
{
    char *s = json_dumps(o, JSON_COMPACT);
    if (!s) {
        pthread_mutex_lock(&c->mu);
        c->dead = 1;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return;
    }
    line[n] = '\n';
    dconn_write(c, line, n + 1, is_event);
    free(line);
}

/* ------------------------------------------------ workers and event loop */

/* The next request a worker may take (the short queue first; a long one
 * while fewer than long_max run), off its queue; *lng says which. Waits for
 * one; the caller holds D.mu. */
static djob *job_take(int *lng)
{
    for (;;) {
        djob *j = NULL;
        *lng = 0;
        if (D.q[0].head) {
            j = D.q[0].head;
        } else if (D.q[1].head && D.running_long < D.long_max) {
            j = D.q[1].head;
            *lng = 1;
        }
        if (!j) {
            pthread_cond_wait(&D.cv, &D.mu);
            continue;
        }
        dqueue *q = &D.q[*lng];
        q->head = j->next;
        if (!q->head)
            q->tail = NULL;
        D.queued--;
        D.running_long += (unsigned)*lng;
        return j;
    }
}

/* Runs j's request (its reference to the request goes). */
static void job_run(djob *j, int lng)
{
    job_bytes = 0;
    double t0 = cm_mono_s();
    dmethod_run(j->c, j->req, j->meth);
    json_decref(j->req);
    j->req = NULL;
    /* a large result (or a burst of output) was just freed: give the
     * memory back to the system instead of keeping the high-water mark.
     * Only after a request that could have left one: 1 MiB or more sent
     * to the client, or 20 ms or more of work (a burst the client did
     * not stream). malloc_trim walks every arena, ~0.1-0.3 ms: after
     * every trivial exec it was a fifth of the daemon's CPU; here it
     * costs at most ~1 % of the request it follows. */
    if (lng && (job_bytes >= ((size_t)1 << 20) || cm_mono_s() - t0 >= 0.020))
        malloc_trim(0);
}

static void *worker_thread(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&D.mu);
    for (;;) {
        int lng;
        djob *j = job_take(&lng);
        pthread_mutex_unlock(&D.mu);

        job_run(j, lng);

        pthread_mutex_lock(&D.mu);
        D.running_long -= (unsigned)lng;
        j->next = D.done;
        D.done = j;
        /* no wake-up here: this worker looks at the queues again itself
         * (below), and takes the long request the freed slot admits. A
         * broadcast woke every idle worker (2 x cores + 32) after each exec
         * only for them to sleep again: most of the daemon's CPU per exec. */
        pthread_mutex_unlock(&D.mu);
        dloop_wake();
        pthread_mutex_lock(&D.mu);
    }
    return NULL;
}

/* Queues req (steals; a valid request for method d) of c; 0, or -1 when
 * the queue is full. */
static int submit(dconn *c, json_t *req, const dmethod *d)
{
    djob *j = calloc(1, sizeof *j);
    if (!j)
        return -1;
    j->c = c;
    j->req = req;
    j->meth = d;
    j->is_long = d->is_long;
    pthread_mutex_lock(&D.mu);
    if (D.queued >= D.queue_max) {
        pthread_mutex_unlock(&D.mu);
        free(j);
        return -1;
    }
    dqueue *q = &D.q[j->is_long];
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    D.queued++;
    /* one idle worker: every waiter takes a short request (the short queue
     * comes first), and a long one the cap does not admit now is taken by
     * the worker whose long request ends (worker_thread) */
    pthread_cond_signal(&D.cv);
    pthread_mutex_unlock(&D.mu);
    return 0;
}

dconn *dconn_new(int fd, pid_t peer_pid)
{
    dconn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->fd = fd;
    c->peer_pid = peer_pid;
    c->refs = 1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

void dconn_unref(dconn *c)
{
    if (--c->refs > 0)
        return;
    close(c->fd);
    free(c->allowlist);
    free(c->rbuf);
    free(c->obuf);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

/* Stops serving c: marks it dead (a worker running its request stops
 * writing), unregisters it; the fd closes with the last reference. */
static void conn_drop(dloop *L, dconn *c, const char *why)
{
    if (!c->registered)
        return;
    pthread_mutex_lock(&c->mu);
    size_t unsent = c->olen - c->ohead;
    c->dead = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (why)
        fprintf(stderr,
                "kernelmgr: dropped a client connection: %s (%zu bytes unsent); a request it "
                "made runs to completion or timeout, its result goes to the session's history\n",
                why, unsent);
    epoll_ctl(L->ep, EPOLL_CTL_DEL, c->fd, NULL);
    shutdown(c->fd, SHUT_RDWR);
    c->registered = 0;
    if (c->prev)
        c->prev->next = c->next;
    else
        L->all = c->next;
    if (c->next)
        c->next->prev = c->prev;
    L->nconns--;
    dconn_unref(c);
}

/* Queues c's request req (stolen) for method d, or refuses it at once
 * when the queue is full. */
static void conn_submit(dconn *c, json_t *req, const dmethod *d)
{
    c->refs++;
    c->busy = 1;
    if (submit(c, req, d) == 0)
        return;
    c->refs--;
    c->busy = 0;
    dreq r;
    dreq_init(&r, c, json_object_get(req, "id"), NULL);
    char m2[200];
    snprintf(m2, sizeof m2,
             "the daemon is busy: %u requests already wait for a worker "
             "(daemon_queue); retry later",
             D.queue_max);
    dreq_err(&r, KM_EDAEMON, m2);
    json_decref(req);
}

/* Hands the complete lines in c's buffer on, one at a time: only while no
 * request of c is in flight (answers stay in order). */
static void conn_dispatch(dconn *c)
{
    while (!c->busy && c->registered) {
        char *nl = c->rlen ? memchr(c->rbuf, '\n', c->rlen) : NULL;
        if (!nl)
            break;
        size_t n = (size_t)(nl - c->rbuf);
        json_t *req = NULL;
        const dmethod *d = dmethod_request(c, c->rbuf, n, &req);
        memmove(c->rbuf, nl + 1, c->rlen - n - 1);
        c->rlen -= n + 1;
        if (d)
            conn_submit(c, req, d);
    }
}

/* One read of what the socket has into c's buffer. 0: read on; 1: nothing
 * more for now, or EOF (rd_eof); -1: c was dropped (a line too long, out
 * of memory). */
static int conn_read(dloop *L, dconn *c)
{
    /* with a request in flight only up to one complete line is buffered
     * ahead (the next read happens when it is answered) */
    if (c->rlen >= DAEMON_MAX_LINE) {
        conn_drop(L, c, "a request line is longer than 64 MiB");
        return -1;
    }
    if (c->rcap - c->rlen < 65536) {
        size_t cap = c->rcap ? c->rcap * 2 : 16384;
        if (cap - c->rlen < 4096)
            cap *= 2;
        char *b = realloc(c->rbuf, cap);
        if (!b) {
            conn_drop(L, c, "out of memory");
            return -1;
        }
        c->rbuf = b;
        c->rcap = cap;
    }
    ssize_t n = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR)
        return 0;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 1;
    if (n <= 0) {
        c->rd_eof = 1;
        return 1;
    }
    c->rlen += (size_t)n;
    return 0;
}

/* Dispatches the complete lines in c's buffer while no request of c is in
 * flight; reads more when the buffer allows; closes at EOF once answered. */
static void conn_service(dloop *L, dconn *c)
{
    for (;;) {
        conn_dispatch(c);
        if (!c->registered)
            return;
        if (c->busy || c->rd_eof)
            break;
        int rc = conn_read(L, c);
        if (rc < 0)
            return;
        if (rc > 0)
            break;
    }
    /* an idle connection gives its read buffer back */
    if (!c->rlen && c->rcap > 16384) {
        free(c->rbuf);
        c->rbuf = NULL;
        c->rcap = 0;
    }
    pthread_mutex_lock(&c->mu);
    int dead = c->dead, pending = c->olen > c->ohead;
    pthread_mutex_unlock(&c->mu);
    if (dead || (c->rd_eof && !c->busy && !pending))
        conn_drop(L, c, NULL);
}

/* kept open to accept-and-close a connection when out of fds */
static int spare_fd = -1;
static atomic_int daemon_conns;

/* The next connection on the listening socket, or -1 when there is none
 * for now. Out of fds, one is accepted with the spare fd and closed at
 * once (the client sees EOF) rather than spin on a readable listen fd. */
static int loop_accept_fd(dloop *L)
{
    int fd = accept4(L->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
        close(spare_fd);
        fd = accept4(L->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            close(fd);
        spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        errno = EMFILE;
        fd = -1;
    }
    if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
        static double last;
        if (cm_mono_s() - last > 10) {
            fprintf(stderr, "kernelmgr: cannot accept a connection: %s\n", strerror(errno));
            last = cm_mono_s();
        }
    }
    return fd;
}

/* Registers the connection on fd of peer (closed when it cannot be). */
static void loop_register(dloop *L, int fd, pid_t peer)
{
    dconn *c = dconn_new(fd, peer);
    if (!c) {
        close(fd);
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (epoll_ctl(L->ep, EPOLL_CTL_ADD, fd, &ev)) {
        dconn_unref(c);
        return;
    }
    c->registered = 1;
    c->next = L->all;
    if (L->all)
        L->all->prev = c;
    L->all = c;
    L->nconns++;
    atomic_fetch_add(&daemon_conns, 1);
}

static void loop_accept(dloop *L)
{
    for (int i = 0; i < 1024; i++) {
        int fd = loop_accept_fd(L);
        if (fd < 0)
            return;
        /* only our own uid may talk to us, even if the mode were wrong */
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) || cred.uid != getuid()) {
            close(fd);
            continue;
        }
        loop_register(L, fd, cred.pid);
    }
}

/* Finished requests: their connections go on with the next line. */
void dloop_reap(dloop *L)
{
    pthread_mutex_lock(&D.mu);
    djob *j = D.done;
    D.done = NULL;
    pthread_mutex_unlock(&D.mu);
    /* oldest first */
    djob *rev = NULL;
    while (j) {
        djob *n = j->next;
        j->next = rev;
        rev = j;
        j = n;
    }
    while (rev) {
        djob *n = rev->next;
        dconn *c = rev->c;
        free(rev);
        c->busy = 0;
        if (c->registered)
            conn_service(L, c);
        dconn_unref(c);
        rev = n;
    }
}

/* Drops connections that are broken or whose output made no progress for
 * client_timeout seconds. */
static void loop_scan(dloop *L)
{
    double now = cm_mono_s();
    dconn *next;
    for (dconn *c = L->all; c; c = next) {
        next = c->next;
        pthread_mutex_lock(&c->mu);
        int dead = c->dead;
        int stuck = c->olen > c->ohead && now - c->last_progress > D.client_timeout;
        pthread_mutex_unlock(&c->mu);
        if (dead && !c->busy)
            conn_drop(L, c, NULL);
        else if (dead)
            conn_drop(L, c, NULL);
        else if (stuck) {
            char why[160];
            snprintf(why, sizeof why,
                     "the client read none of its output for %.0f s (client_timeout)",
                     D.client_timeout);
            conn_drop(L, c, why);
        }
    }
}

static void conn_event(dloop *L, dconn *c, uint32_t events)
{
    if (events & EPOLLERR) {
        conn_drop(L, c, NULL);
        return;
    }
    if (events & EPOLLOUT) {
        pthread_mutex_lock(&c->mu);
        obuf_flush(c);
        pthread_mutex_unlock(&c->mu);
    }
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLOUT))
        conn_service(L, c);
}

static unsigned default_workers(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        n = 1;
    if (n > 256)
        n = 256;
    return 2u * (unsigned)n + 32u;
}

/* The pool by cfg; the number of workers started (0: none could be). */
static unsigned pool_start(const kmcfg *cfg)
{
    unsigned workers = cfg->daemon_workers ? cfg->daemon_workers : default_workers();
    D.long_max = workers > DAEMON_RESERVED ? workers - DAEMON_RESERVED : 1;
    D.queue_max = cfg->daemon_queue ? cfg->daemon_queue : 4096;
    D.obuf_max = cfg->client_buffer ? (size_t)cfg->client_buffer : 8u << 20;
    D.client_timeout = cfg->client_timeout > 0 ? cfg->client_timeout : 10;
    unsigned started = 0;
    for (unsigned i = 0; i < workers; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, worker_thread, NULL) == 0)
            started++;
        pthread_attr_destroy(&attr);
    }
    if (started && started < D.long_max + 1)
        D.long_max = started > 1 ? started - 1 : 1;
    return started;
}

int dloop_start(dloop *L, const kmcfg *cfg, unsigned *workers, km_err *err)
{
    L->all = NULL;
    L->nconns = 0;
    spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    D.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    L->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = L};
    struct epoll_event eev = {.events = EPOLLIN, .data.ptr = &D};
    if (D.efd < 0 || L->ep < 0 || epoll_ctl(L->ep, EPOLL_CTL_ADD, L->lfd, &lev) ||
        epoll_ctl(L->ep, EPOLL_CTL_ADD, D.efd, &eev)) {
        km_err_set(err, KM_EDAEMON, "cannot set up the event loop: %s", strerror(errno));
        return KM_EDAEMON;
    }
    *workers = pool_start(cfg);
    if (!*workers) {
        km_err_set(err, KM_EDAEMON, "cannot start worker threads: %s", strerror(errno));
        return KM_EDAEMON;
    }
    return 0;
}

void dloop_run(dloop *L)
{
    double last_scan = cm_mono_s();
    while (!daemon_stop) {
        struct epoll_event evs[256];
        int n = epoll_wait(L->ep, evs, 256, 250);
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == L) {
                loop_accept(L);
            } else if (p == &D) {
                uint64_t v;
                ssize_t r = read(D.efd, &v, sizeof v);
                (void)r;
            } else {
                dconn *c = p;
                if (c->registered)
                    conn_event(L, c, evs[i].events);
            }
        }
        dloop_reap(L);
        double now = cm_mono_s();
        if (now - last_scan >= 0.25) {
            loop_scan(L);
            last_scan = now;
        }
    }
}

void dloop_drop_all(dloop *L)
{
    /* what is pending is sent if the socket takes it now: the loop's
     * reference goes, and the connection is freed here or, when a worker
     * still runs its request, with that request's reference (dloop_reap,
     * or a reachable job at exit) */
    while (L->all) {
        dconn *c = L->all;
        pthread_mutex_lock(&c->mu);
        obuf_flush(c);
        pthread_mutex_unlock(&c->mu);
        conn_drop(L, c, NULL);
    }
    dloop_reap(L);
}

void dloop_close(dloop *L)
{
    close(L->ep);
}
