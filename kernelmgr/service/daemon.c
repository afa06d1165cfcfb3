/*
 * daemon.c — `kernelmgr serve`: the home, the lock (one daemon per home),
 * signals, the listening socket, the pid file and the tick thread; it wires
 * the event loop (dloop.c) to the methods (dmethods.c). The client is
 * dclient.c; daemon_int.h says what each file of the daemon does.
 *
 * The API — versioned JSON-RPC 2.0 over the unix socket, one message per
 * line, its methods, params, results, events and error codes — is
 * documented in docs/API.md; the framing and validation are rpc.c's (the
 * MCP server uses the same).
 */
#include "kernelmgr/service/daemon_int.h"
#include "kernelmgr/service/daemon_http.h"
#include "kernelmgr/engine/kmhome.h"
#include "common/cm_path.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

volatile sig_atomic_t daemon_stop;
km_manager *daemon_mgr;

int daemon_socket_path(const char *home, char *buf, size_t size, km_err *err)
{
    struct sockaddr_un sun;
    int n = snprintf(buf, size, "%s/kernelmgr.sock", home);
    if (n < 0 || (size_t)n >= size || (size_t)n >= sizeof sun.sun_path) {
        if (err) {
            km_err_set(err, KM_EDAEMON,
                       "socket path %s/kernelmgr.sock is longer than %zu bytes: use a shorter "
                       "KERNELMGR_HOME",
                       home, sizeof sun.sun_path - 1);
        }
        return -1;
    }
    return 0;
}

static void *tick_thread(void *arg)
{
    (void)arg;
    int steps = (int)(km_tick_interval(daemon_mgr) * 10 + 0.5);
    while (!daemon_stop) {
        km_tick(daemon_mgr);
        for (int i = 0; i < steps && !daemon_stop; i++) {
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static void on_signal(int sig)
{
    (void)sig;
    daemon_stop = 1;
}

/* One daemon per home: takes home/daemon.lock (the lock outlives crashes:
 * the kernel drops it). *lockfd is the held lock. 0, DAEMON_SERVE_ALREADY
 * (nothing taken), or KM_EDAEMON with err. */
static int serve_lock(const char *home, const char *sock, int *lockfd, km_err *err)
{
    char *path = cm_path_join(home, "daemon.lock");
    /* files the manager makes: no link followed, no FIFO waited on */
    int fd = path ? open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600) : -1;
    if (fd < 0) {
        km_err_set(err, KM_EDAEMON, "%s/daemon.lock: %s", home, strerror(errno));
        free(path);
        return KM_EDAEMON;
    }
    free(path);
    /* The lock is held by a serving daemon (its socket answers: nothing to
     * do) or by one still stopping its kernels (wait for it, up to 30 s). */
    for (int tries = 0; flock(fd, LOCK_EX | LOCK_NB); tries++) {
        /* flock's errno, not the connect's: a socket already gone (ENOENT)
         * is a daemon still stopping, to be waited for */
        int held = errno == EWOULDBLOCK;
        int sfd = held ? daemon_try_connect(sock) : -1;
        if (sfd >= 0 || !held || tries >= 300) {
            if (sfd >= 0)
                close(sfd);
            close(fd);
            return DAEMON_SERVE_ALREADY;
        }
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    *lockfd = fd;
    return 0;
}

/* The process's setting for serving: signals end the loop, SIGPIPE is
 * ignored, the fd limit is the hard one (every idle connection is an fd). */
static void serve_process_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* The listening socket at sock (non-blocking), or -1 with err. Bound and
 * listening under a temporary name, then renamed into place: whoever sees
 * kernelmgr.sock can connect (a client that found the file between bind
 * and listen was refused). The temporary name is shorter than the
 * socket's, so it fits where the socket's does. */
static int serve_listen(const char *home, const char *sock, km_err *err)
{
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s/.s%d", home, (int)getpid());
    unlink(sun.sun_path);
    mode_t old = umask(0177);
    int brc = lfd >= 0 ? bind(lfd, (struct sockaddr *)&sun, sizeof sun) : -1;
    umask(old);
    /* the kernel caps the backlog at net.core.somaxconn */
    if (brc || chmod(sun.sun_path, 0600) || listen(lfd, 65535) || rename(sun.sun_path, sock)) {
        km_err_set(err, KM_EDAEMON, "cannot listen on %s: %s", sock, strerror(errno));
        unlink(sun.sun_path);
        if (lfd >= 0)
            close(lfd);
        return -1;
    }
    return lfd;
}

/* malloc'd: home/daemon.pid, written with our pid (NULL when out of memory). */
static char *serve_pidfile(const char *home)
{
    char *pidfile = cm_path_join(home, "daemon.pid");
    int pfd = pidfile
                  ? open(pidfile,
                         O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644)
                  : -1;
    if (pfd >= 0) {
        dprintf(pfd, "%d\n", (int)getpid());
        close(pfd);
    }
    return pidfile;
}

/* Serves on L until daemon_stop, with the tick thread, then stops: clients
 * are dropped, HTTP stops, the socket goes, then the kernels (the
 * workspaces and session.json stay, so the next daemon brings the sessions
 * back with fresh kernels). Workers still running a request die with the
 * process. */
static void serve_run(dloop *L, const char *sock)
{
    pthread_t ticker;
    int have_ticker = pthread_create(&ticker, NULL, tick_thread, NULL) == 0;
    dloop_run(L);
    fprintf(stderr, "kernelmgr: daemon stopping\n");
    dloop_drop_all(L);
    daemon_http_stop();
    close(L->lfd);
    unlink(sock);
    if (have_ticker)
        pthread_join(ticker, NULL);
    km_manager_destroy(&daemon_mgr);
    dloop_reap(L); /* requests that ended meanwhile release their connection */
    dloop_close(L);
}

int daemon_serve(const char *home, const kmcfg *cfg, km_err *err)
{
    char sock[256];
    if (daemon_socket_path(home, sock, sizeof sock, err))
        return KM_EDAEMON;
    /* the home is trusted state (kmhome.h): made, or refused, before a file
     * in it is opened */
    if (kmhome_prepare(home, 1, err)) {
        return KM_EUSAGE;
    }
    int lockfd = -1;
    int rc = serve_lock(home, sock, &lockfd, err);
    if (rc)
        return rc;
    serve_process_setup();
    daemon_mgr = km_manager_new(home, cfg, 1, err);
    if (!daemon_mgr) {
        close(lockfd);
        return err->code ? err->code : KM_EINTERNAL;
    }
    dloop L = {-1, -1, NULL, 0};
    unsigned workers = 0;
    int http_started;
    L.lfd = serve_listen(home, sock, err);
    if (L.lfd < 0) {
        rc = KM_EDAEMON;
        goto fail_mgr;
    }
    if ((rc = dloop_start(&L, cfg, &workers, err)))
        goto fail_socket;
    /* Jupyter frontends over HTTP (daemon_http.h), when configured */
    if (cfg->http[0] && daemon_http_start(daemon_mgr, NULL, &http_started, NULL, 0, NULL, err)) {
        rc = err->code;
        goto fail_socket;
    }
    char *pidfile = serve_pidfile(home);
    fprintf(stderr, "kernelmgr: serving %s (pid %d, %u workers, max_kernels %u)\n", sock,
            (int)getpid(), workers, cfg->max_kernels);
    serve_run(&L, sock);
    if (pidfile)
        unlink(pidfile);
    free(pidfile);
    close(lockfd);
    return 0;
fail_socket:
    close(L.lfd);
    unlink(sock);
fail_mgr:
    km_manager_destroy(&daemon_mgr);
    close(lockfd);
    return rc;
}
