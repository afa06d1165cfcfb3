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

/* What the options set. */
typedef struct holder_opts {
    sandbox_config cfg;
    const char *listen_path;
    const char *ro[HOLDER_MAX_RO + 1];
    int nro, owner_fd;
    holder_egress *eg;
} holder_opts;

/* One option's value: 0, or the exit status once the reason is said. */
typedef int (*holder_opt_fn)(holder_opts *h, const char *v);

static int opt_listen(holder_opts *h, const char *v)
{
    h->listen_path = v;
    return 0;
}

static int opt_workspace(holder_opts *h, const char *v)
{
    h->cfg.workspace = v;
    return 0;
}

static int opt_connection_file(holder_opts *h, const char *v)
{
    return 0; /* the launcher's connection file: not used */
}

static int opt_sandbox(holder_opts *h, const char *v)
{
    return strcmp(v, "strict") ? usage("--sandbox: only strict has a session sandbox") : 0;
}

static int opt_network(holder_opts *h, const char *v)
{
    char why[400];
    if (egpolicy_is_text(v)) {
        if (egpolicy_parse_text(&h->eg->policy, v, why, sizeof why) < 0) {
            fprintf(stderr, "kernelmgr-sandbox: --network %s\n", why);
            return 2;
        }
    } else if (strcmp(v, "on") && strcmp(v, "off")) {
        return usage("--network: on, off or allow:HOST[,HOST...]");
    } else {
        egpolicy_init(&h->eg->policy); /* the last --network is the one */
    }
    h->cfg.network = !strcmp(v, "on");
    h->cfg.loopback_listen_port = h->eg->policy.n ? KWORKER_EGRESS_PORT : 0;
    return 0;
}

static int opt_log_max(holder_opts *h, const char *v)
{
    uint64_t n;
    if (parse_u64(v, &n) < 0)
        return usage("--log-max: a number of bytes");
    h->eg->log_max = n;
    return 0;
}

static int opt_memory(holder_opts *h, const char *v)
{
    uint64_t n;
    if (parse_u64(v, &n) < 0)
        return usage("--memory: a number of bytes");
    h->cfg.memory_bytes = n;
    return 0;
}

static int opt_tmp_size(holder_opts *h, const char *v)
{
    uint64_t n;
    if (parse_u64(v, &n) < 0 || n == 0)
        return usage("--tmp-size: a number of bytes");
    h->cfg.tmp_bytes = n;
    return 0;
}

static int opt_cpus(holder_opts *h, const char *v)
{
    char *end;
    double c = strtod(v, &end);
    if (end == v || *end || !(c > 0) || c > 4096)
        return usage("--cpus: a number of CPUs above 0");
    h->cfg.cpus = c;
    return 0;
}

static int opt_ro_path(holder_opts *h, const char *v)
{
    if (h->nro >= HOLDER_MAX_RO || v[0] != '/')
        return usage("--ro-path: an absolute path (at most 16)");
    h->ro[h->nro++] = v;
    return 0;
}

static int opt_owner_fd(holder_opts *h, const char *v)
{
    uint64_t n;
    if (parse_u64(v, &n) < 0 || n < 3 || n > 1024 || fcntl((int)n, F_GETFD) < 0)
        return usage("--owner-fd: an open fd above 2");
    h->owner_fd = (int)n;
    fcntl(h->owner_fd, F_SETFD, FD_CLOEXEC);
    return 0;
}

/* Every option takes a value; a row per option. */
static const struct {
    const char *name;
    holder_opt_fn fn;
} holder_options[] = {
    {"--listen", opt_listen},   {"--workspace", opt_workspace}, {"-f", opt_connection_file},
    {"--sandbox", opt_sandbox}, {"--network", opt_network},     {"--log-max", opt_log_max},
    {"--memory", opt_memory},   {"--tmp-size", opt_tmp_size},   {"--cpus", opt_cpus},
    {"--ro-path", opt_ro_path}, {"--owner-fd", opt_owner_fd},
};

int main(int argc, char **argv)
{
    static holder_egress eg;
    static holder_opts h = {.owner_fd = -1, .eg = &eg};
    sandbox_config_defaults(&h.cfg);
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
        size_t k = 0, nopts = sizeof holder_options / sizeof *holder_options;
        while (k < nopts && strcmp(o, holder_options[k].name))
            k++;
        if (k == nopts)
            return usage("unknown option");
        int rc = holder_options[k].fn(&h, v);
        if (rc)
            return rc;
    }
    sandbox_config cfg = h.cfg;
    const char *listen_path = h.listen_path;
    int owner_fd = h.owner_fd;
    if (!listen_path || !cfg.workspace)
        return usage("--listen and --workspace are required");
    cfg.ro_paths = h.ro;
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
