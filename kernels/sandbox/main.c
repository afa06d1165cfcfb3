/*
 * kernelmgr-sandbox — the holder of one session's sandbox.
 *
 * Started by the manager for a session whose kernels share one sandbox
 * (`sandbox_per_session`), with the manager's lifeline: it listens on a
 * unix socket in the manager's private run directory, makes the session's
 * sandbox at the first kernel's request and starts every kernel's worker
 * inside it (sandbox_session_serve(), sandbox/sbx_session.c). It ends, and
 * the sandbox with every process in it, when the lifeline reports
 * end-of-file (the manager is gone), on SIGTERM (the session closed), or
 * when the sandbox's init ends.
 *
 * With an egress allow-list (--network allow:HOST,...) the sandbox's
 * network is off but for a listener on 127.0.0.1:KWORKER_EGRESS_PORT in its
 * namespace, which this process serves from outside, once for every kernel
 * of the session, with the filtering proxy (egproxy_start_policy: the list,
 * SNI, DNS resolved here only, the decision log on our stderr, bounded by
 * --log-max); kernel servers ask for its refusal count
 * (sandbox_session_egress_refusals) for their cells' network notes.
 *
 * Usage: kernelmgr-sandbox --listen PATH --workspace DIR
 *        [--network on|off|allow:HOST[,HOST...]] [--log-max BYTES]
 *        [--memory BYTES] [--cpus N] [--tmp-size BYTES] [--ro-path DIR]...
 *        [--owner-fd N] [-f FILE (ignored: the launcher's connection file)]
 */
#include "sandbox/sandbox.h"
#include "kernels/egress/egpolicy.h"
#include "kernels/egress/egproxy.h"
#include "kernels/server/kworker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define HOLDER_MAX_RO 16

static int usage(const char *why)
{
    fprintf(stderr,
            "kernelmgr-sandbox: %s\n"
            "usage: kernelmgr-sandbox --listen PATH --workspace DIR\n"
            "       [--network on|off|allow:HOST[,HOST...]] [--log-max BYTES]\n"
            "       [--memory BYTES] [--cpus N] [--tmp-size BYTES] [--ro-path DIR]...\n"
            "       [--owner-fd N] [-f FILE]\n",
            why);
    return 2;
}

/* The session's egress proxy: its list, the proxy once the sandbox is
 * made, the decision log's cap. */
typedef struct holder_egress {
    egpolicy policy;
    egproxy *proxy;
    unsigned long long log_max;
} holder_egress;

static int egress_ready(void *arg, sandbox *sb, char *err, size_t errlen)
{
    holder_egress *e = arg;
    char why[400];
    int lfd = sandbox_take_listen_fd(sb);
    e->proxy = lfd >= 0 ? egproxy_start_policy(lfd, &e->policy, why, sizeof why) : NULL;
    if (!e->proxy) {
        snprintf(err, errlen, "the egress proxy cannot start: %s",
                 lfd < 0 ? "no listening socket from the sandbox" : why);
        return -1;
    }
    egproxy_log_limit(e->proxy, e->log_max);
    return 0;
}

static long long egress_refusals(void *arg, char *last, size_t lastlen)
{
    holder_egress *e = arg;
    return e->proxy ? egproxy_refusals(e->proxy, last, lastlen) : -1;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    sandbox_config cfg;
    sandbox_config_defaults(&cfg);
    const char *listen_path = NULL, *ro[HOLDER_MAX_RO + 1] = {0};
    int nro = 0, owner_fd = -1;
    static holder_egress eg;
    egpolicy_init(&eg.policy);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--help")) {
            usage("the holder of one session's sandbox");
            return 0;
        }
        if (!v)
            return usage("an option without its value");
        i++;
        uint64_t n;
        if (!strcmp(o, "--listen")) {
            listen_path = v;
        } else if (!strcmp(o, "--workspace")) {
            cfg.workspace = v;
        } else if (!strcmp(o, "-f")) {
            /* the launcher's connection file: not used */
        } else if (!strcmp(o, "--sandbox")) {
            if (strcmp(v, "strict"))
                return usage("--sandbox: only strict has a session sandbox");
        } else if (!strcmp(o, "--network")) {
            char why[400];
            if (egpolicy_is_text(v)) {
                if (egpolicy_parse_text(&eg.policy, v, why, sizeof why) < 0) {
                    fprintf(stderr, "kernelmgr-sandbox: --network %s\n", why);
                    return 2;
                }
            } else if (strcmp(v, "on") && strcmp(v, "off")) {
                return usage("--network: on, off or allow:HOST[,HOST...]");
            } else {
                egpolicy_init(&eg.policy); /* the last --network is the one */
            }
            cfg.network = !strcmp(v, "on");
            cfg.loopback_listen_port = eg.policy.n ? KWORKER_EGRESS_PORT : 0;
        } else if (!strcmp(o, "--log-max")) {
            if (parse_u64(v, &n) < 0)
                return usage("--log-max: a number of bytes");
            eg.log_max = n;
        } else if (!strcmp(o, "--memory")) {
            if (parse_u64(v, &n) < 0)
                return usage("--memory: a number of bytes");
            cfg.memory_bytes = n;
        } else if (!strcmp(o, "--tmp-size")) {
            if (parse_u64(v, &n) < 0 || n == 0)
                return usage("--tmp-size: a number of bytes");
            cfg.tmp_bytes = n;
        } else if (!strcmp(o, "--cpus")) {
            char *end;
            double c = strtod(v, &end);
            if (end == v || *end || !(c > 0) || c > 4096)
                return usage("--cpus: a number of CPUs above 0");
            cfg.cpus = c;
        } else if (!strcmp(o, "--ro-path")) {
            if (nro >= HOLDER_MAX_RO || v[0] != '/')
                return usage("--ro-path: an absolute path (at most 16)");
            ro[nro++] = v;
        } else if (!strcmp(o, "--owner-fd")) {
            if (parse_u64(v, &n) < 0 || n < 3 || n > 1024 || fcntl((int)n, F_GETFD) < 0)
                return usage("--owner-fd: an open fd above 2");
            owner_fd = (int)n;
            fcntl(owner_fd, F_SETFD, FD_CLOEXEC);
        } else {
            return usage("unknown option");
        }
    }
    if (!listen_path || !cfg.workspace)
        return usage("--listen and --workspace are required");
    cfg.ro_paths = ro;
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (strlen(listen_path) >= sizeof a.sun_path)
        return usage("--listen: path too long for a unix socket");
    memcpy(a.sun_path, listen_path, strlen(listen_path) + 1);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        fprintf(stderr, "kernelmgr-sandbox: socket: %s\n", strerror(errno));
        return 1;
    }
    unlink(listen_path); /* a dead holder's, in the manager's private directory */
    mode_t old = umask(077);
    int b = bind(fd, (struct sockaddr *)&a, sizeof a);
    umask(old);
    if (b < 0 || listen(fd, 64) < 0) {
        fprintf(stderr, "kernelmgr-sandbox: listen on %s: %s\n", listen_path, strerror(errno));
        return 1;
    }
    char err[1024];
    sandbox_session_hooks hooks = {egress_ready, egress_refusals, &eg};
    int rc = sandbox_session_serve_with(&cfg, fd, owner_fd, eg.policy.n ? &hooks : NULL, err,
                                        sizeof err);
    egproxy_stop(&eg.proxy);
    unlink(listen_path);
    close(fd);
    if (rc < 0 && err[0])
        fprintf(stderr, "kernelmgr-sandbox: %s\n", err);
    return rc < 0 ? 1 : 0;
}
