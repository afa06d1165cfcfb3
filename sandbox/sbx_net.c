/*
 * sbx_net.c — the sandbox's network.
 *
 * Off (default): the new network namespace is empty; only lo is brought up
 * (127.0.0.1, and ::1 where the kernel has IPv6), so local servers inside
 * the sandbox work: seccomp allows TCP and UDP sockets (sbx_seccomp.c). With
 * no other interface there is no route but loopback, so a connect or send
 * to any other address fails with ENETUNREACH, which the namespace's own
 * counters record (sbx_net_no_routes()); /etc/resolv.conf is absent, so a
 * name lookup of anything but localhost (/etc/hosts) fails at once.
 *
 * Off with a loopback listener (sandbox_config.loopback_listen_port): init
 * also creates a socket listening on 127.0.0.1:port in the empty namespace,
 * before anything of the worker's exists, and hands it to the caller, who
 * serves it from the host. That socket is the only thing outside the
 * sandbox that its processes can reach; the rest is as with network off.
 *
 * On: slirp4netns (Debian) is attached to the namespace from outside and
 * gives it a tap0 with NAT to the host's network, user-mode, with
 * --disable-host-loopback so that 10.0.2.2 does not lead to the host's
 * 127.0.0.1 services. It runs in its own sandbox (--enable-sandbox,
 * --enable-seccomp) and exits when the sandbox's monitor closes its exit fd.
 * slirp4netns would still connect to the host's other addresses (a service
 * on 0.0.0.0 is reachable through eth0's address), so the sandbox gets
 * reject routes for every address of the host, installed by its init while
 * it still has CAP_NET_ADMIN in the namespace; the worker cannot remove them.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const sbx_net_slirp_paths[] = {"/usr/bin/slirp4netns", "/bin/slirp4netns",
                                                  "/usr/local/bin/slirp4netns", NULL};

int sbx_net_lo_up(char *err, size_t len)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return sbx_util_fail(err, len, "network: socket");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    int rc = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (rc == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        rc = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int saved = errno;
    close(s);
    errno = saved;
    return rc < 0 ? sbx_util_fail(err, len, "network: bring lo up") : 0;
}

int sbx_net_listen_lo(unsigned short port, char *err, size_t len)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return sbx_util_fail(err, len, "network: loopback listener: socket");
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* No SO_REUSEADDR/SO_REUSEPORT: nothing else may share the port. */
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 64) < 0) {
        int saved = errno;
        close(s);
        errno = saved;
        return sbx_util_fail(err, len, "network: loopback listener on 127.0.0.1:%u",
                             (unsigned)port);
    }
    return s;
}

static const char *sbx_net_slirp_path(void)
{
    for (const char *const *p = sbx_net_slirp_paths; *p; p++)
        if (access(*p, X_OK) == 0)
            return *p;
    return NULL;
}

int sbx_net_probe(char *err, size_t len)
{
    if (!sbx_net_slirp_path()) {
        errno = 0;
        return sbx_util_fail(err, len, "network on needs slirp4netns (Debian package slirp4netns)");
    }
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return sbx_util_fail(err, len, "network on needs /dev/net/tun");
    close(fd);
    return 0;
}

pid_t sbx_net_start_slirp(pid_t pid, int *exit_fd, char *err, size_t len)
{
    const char *slirp = sbx_net_slirp_path();
    if (!slirp) {
        errno = 0;
        sbx_util_fail(err, len, "network on needs slirp4netns (Debian package slirp4netns)");
        return -1;
    }
    int ready[2], ex[2];
    if (pipe2(ready, O_CLOEXEC) < 0) {
        sbx_util_fail(err, len, "network: pipe");
        return -1;
    }
    if (pipe2(ex, O_CLOEXEC) < 0) {
        sbx_util_fail(err, len, "network: pipe");
        close(ready[0]);
        close(ready[1]);
        return -1;
    }
    pid_t parent = getpid();
    pid_t child = fork();
    if (child < 0) {
        sbx_util_fail(err, len, "network: fork");
        close(ready[0]);
        close(ready[1]);
        close(ex[0]);
        close(ex[1]);
        return -1;
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        /* fds 3 and 4, inherited across exec; everything else closed. */
        int devnull = open("/dev/null", O_RDWR);
        if (dup2(ready[1], 3) < 0 || dup2(ex[0], 4) < 0 || devnull < 0 || dup2(devnull, 0) < 0 ||
            dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
            _exit(127);
        int keep[] = {0, 1, 2, 3, 4};
        sbx_util_close_except(keep, 5);
        char netns[64], userns[64];
        snprintf(netns, sizeof netns, "/proc/%d/ns/net", (int)pid);
        snprintf(userns, sizeof userns, "--userns-path=/proc/%d/ns/user", (int)pid);
        execl(slirp, "slirp4netns", "--configure", "--mtu=65520", "--disable-host-loopback",
              "--enable-sandbox", "--enable-seccomp", "--ready-fd=3", "--exit-fd=4",
              "--netns-type=path", userns, netns, "tap0", (char *)NULL);
        _exit(127);
    }
    close(ready[1]);
    close(ex[0]);
    struct pollfd pfd = {ready[0], POLLIN, 0};
    char c = 0;
    int rc = poll(&pfd, 1, 15000);
    ssize_t n = rc > 0 ? read(ready[0], &c, 1) : 0;
    close(ready[0]);
    if (n != 1) {
        int st = 0;
        kill(child, SIGKILL);
        waitpid(child, &st, 0);
        close(ex[1]);
        errno = 0;
        sbx_util_fail(err, len, "network: slirp4netns failed to configure tap0%s",
                      rc == 0 ? " (timeout)" : "");
        return -1;
    }
    *exit_fd = ex[1];
    return child;
}

int sbx_net_host_addrs(uint32_t *addrs, int max)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa) < 0)
        return 0;
    int n = 0;
    for (struct ifaddrs *i = ifa; i && n < max; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        uint32_t a = ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
        if ((ntohl(a) >> 24) == 127)
            continue; /* the sandbox's own loopback */
        addrs[n++] = a;
    }
    freeifaddrs(ifa);
    return n;
}

int sbx_net_block_host(const uint32_t *addrs, int n, char *err, size_t len)
{
    if (n <= 0)
        return 0;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return sbx_util_fail(err, len, "network: socket");
    for (int i = 0; i < n; i++) {
        struct rtentry rt;
        memset(&rt, 0, sizeof rt);
        struct sockaddr_in *dst = (struct sockaddr_in *)&rt.rt_dst;
        struct sockaddr_in *mask = (struct sockaddr_in *)&rt.rt_genmask;
        dst->sin_family = AF_INET;
        dst->sin_addr.s_addr = addrs[i];
        mask->sin_family = AF_INET;
        mask->sin_addr.s_addr = 0xffffffffu;
        rt.rt_flags = RTF_UP | RTF_HOST | RTF_REJECT;
        rt.rt_dev = (char *)"lo";
        if (ioctl(s, SIOCADDRT, &rt) < 0 && errno != EEXIST) {
            int saved = errno;
            close(s);
            errno = saved;
            return sbx_util_fail(err, len, "network: reject route to a host address");
        }
    }
    close(s);
    return 0;
}

int sbx_net_open_counters(pid_t pid, int fds[2])
{
    static const char *const names[2] = {"snmp", "snmp6"};
    for (int i = 0; i < 2; i++) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/net/%s", (int)pid, names[i]);
        fds[i] = open(path, O_RDONLY | O_CLOEXEC);
    }
    return fds[0] >= 0 || fds[1] >= 0 ? 0 : -1;
}

/* The whole of a small /proc file, NUL-terminated, from its start. */
static ssize_t sbx_net_read_all(int fd, char *buf, size_t size)
{
    size_t have = 0;
    while (have + 1 < size) {
        ssize_t n = pread(fd, buf + have, size - 1 - have, (off_t)have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        have += (size_t)n;
    }
    buf[have] = 0;
    return (ssize_t)have;
}

/* snmp: "Ip: Forwarding ... OutNoRoutes ...\nIp: 1 ... 0 ...": the value in
 * the column of OutNoRoutes of the line after the header. */
static long long sbx_net_snmp_no_routes(const char *text)
{
    const char *hdr = strstr(text, "Ip: ");
    const char *vals = hdr ? strstr(hdr + 4, "\nIp: ") : NULL;
    if (!vals)
        return -1;
    vals += 5;
    const char *h = hdr + 4;
    for (;;) {
        while (*h == ' ')
            h++;
        while (*vals == ' ')
            vals++;
        if (*h == '\n' || !*h || *vals == '\n' || !*vals)
            return -1;
        size_t n = strcspn(h, " \n");
        if (n == 11 && !strncmp(h, "OutNoRoutes", 11))
            return strtoll(vals, NULL, 10);
        h += n;
        vals += strcspn(vals, " \n");
    }
}

long long sbx_net_no_routes(const int fds[2])
{
    char buf[8192];
    long long total = -1;
    if (fds[0] >= 0 && sbx_net_read_all(fds[0], buf, sizeof buf) > 0) {
        long long v = sbx_net_snmp_no_routes(buf);
        if (v >= 0)
            total = v;
    }
    const char *line;
    if (fds[1] >= 0 && sbx_net_read_all(fds[1], buf, sizeof buf) > 0 &&
        (line = strstr(buf, "Ip6OutNoRoutes")) != NULL) {
        long long v = strtoll(line + 14, NULL, 10);
        if (v >= 0)
            total = (total < 0 ? 0 : total) + v;
    }
    return total;
}
