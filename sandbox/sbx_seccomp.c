/*
 * sbx_seccomp.c — the system-call deny list (libseccomp).
 *
 * Default allow, deny what a REPL never needs and what has a history of
 * kernel exploits or of reaching outside a namespace: debugging other
 * processes, keyrings, BPF, perf, userfaultfd, io_uring, every mount and
 * namespace call, kexec/modules/reboot/swap, terminal injection, file
 * handles, personality changes, LDT entries (modify_ldt), secret memory
 * (memfd_secret), LSM attributes, exotic socket families; the full list is
 * sbx_seccomp_denied below (checked against the x86_64 table of Linux 6.18).
 * Denied calls fail with EPERM so programs see an ordinary error; clone3
 * fails with ENOSYS so libc falls back to clone, whose flags (unlike
 * clone3's) can be inspected, and statmount/listmount with ENOSYS so that
 * libmount falls back to /proc/self/mountinfo. A name this build's
 * libseccomp does not know is denied by its number when it is one of the
 * calls numbered alike on every architecture (Linux 5.1 on), else skipped.
 * Left allowed on purpose: landlock_* (the worker can only restrict itself
 * further), map_shadow_stack (glibc's makecontext needs it where shadow
 * stacks are on), mseal, cachestat, futex_waitv and the futex2 calls, the
 * *xattrat and file_[gs]etattr calls (what setxattr/ioctl already allow),
 * NUMA policy calls (numeric libraries use them), uretprobe/uprobe (the
 * kernel lets them through seccomp; they only work from its trampoline).
 * A call made through a foreign architecture (32-bit int 0x80, x32) kills
 * the process: the filter only speaks the native one.
 *
 * Sockets: AF_UNIX always; AF_NETLINK only NETLINK_ROUTE (ip, getifaddrs —
 * it only shows the sandbox's own network namespace); every other family
 * denied, for socketpair() too (it creates a socket of the family before it
 * can fail, loading the family's module). AF_INET/AF_INET6: everything with
 * network on. With network off (with or without a loopback listener, see
 * sandbox.h) only SOCK_STREAM and SOCK_DGRAM with protocol 0, TCP or UDP:
 * the namespace holds nothing but lo, so these reach only the sandbox's own
 * 127.0.0.1 and ::1 (local servers, test suites, debuggers), and a connect
 * or send to any other address fails with ENETUNREACH; raw and packet
 * sockets, ICMP (ping) sockets, SCTP, MPTCP, UDP-Lite and every other
 * protocol or type stay denied.
 *
 * Set-id bits: chmod/fchmod/fchmodat/fchmodat2 and the creating calls
 * (open/openat with O_CREAT or O_TMPFILE, creat, mknod/mknodat) fail with
 * EPERM when the mode has S_ISUID or S_ISGID; openat2 (whose mode sits in a
 * struct the filter cannot read) fails with ENOSYS, so libc falls back. A
 * root caller's sandbox writes a root-owned workspace through an idmapped
 * mount: without this, code could leave a setuid-root program on the host.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

/* libseccomp's SCMP_A0..SCMP_A5 macros leave datum_b to zero-initialisation,
 * which clang reports at every use. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Wmissing-field-initializers"
#endif

#ifndef CLONE_NEWTIME
#define CLONE_NEWTIME 0x00000080
#endif

/* Denied with EPERM. nr: the number to use when this build's libseccomp
 * does not know the name (see sbx_seccomp_nr), -1 for none. */
static const struct {
    const char *name;
    int nr;
} sbx_seccomp_denied[] = {
    /* other processes, even inside the sandbox */
    {"ptrace", -1},
    {"process_vm_readv", -1},
    {"process_vm_writev", -1},
    {"pidfd_getfd", 438},
    {"kcmp", -1},
    {"process_madvise", 440},
    {"process_mrelease", 448},
    /* keyrings, BPF, perf, userfaultfd, io_uring: kernel attack surface */
    {"keyctl", -1},
    {"add_key", -1},
    {"request_key", -1},
    {"bpf", -1},
    {"perf_event_open", -1},
    {"userfaultfd", -1},
    {"io_uring_setup", 425},
    {"io_uring_enter", 426},
    {"io_uring_register", 427},
    /* mounts and namespaces */
    {"mount", -1},
    {"umount", -1},
    {"umount2", -1},
    {"move_mount", 429},
    {"open_tree", 428},
    {"open_tree_attr", 467},
    {"fsopen", 430},
    {"fsconfig", 431},
    {"fsmount", 432},
    {"fspick", 433},
    {"mount_setattr", 442},
    {"pivot_root", -1},
    {"chroot", -1},
    {"unshare", -1},
    {"setns", -1},
    /* the machine: kexec, modules, reboot, swap, accounting, quotas, clock */
    {"kexec_load", -1},
    {"kexec_file_load", -1},
    {"init_module", -1},
    {"finit_module", -1},
    {"delete_module", -1},
    {"reboot", -1},
    {"swapon", -1},
    {"swapoff", -1},
    {"acct", -1},
    {"quotactl", -1},
    {"quotactl_fd", 443},
    {"syslog", -1},
    {"settimeofday", -1},
    {"clock_settime", -1},
    {"clock_adjtime", -1},
    {"adjtimex", -1},
    /* file handles bypass path permissions */
    {"open_by_handle_at", -1},
    {"name_to_handle_at", -1},
    /* terminals, I/O ports, segment descriptors, secret memory */
    {"vhangup", -1},
    {"iopl", -1},
    {"ioperm", -1},
    {"modify_ldt", -1},
    {"memfd_secret", 447},
    /* LSM attributes of the process (the /proc/self/attr of a new API) */
    {"lsm_get_self_attr", 459},
    {"lsm_set_self_attr", 460},
    {"lsm_list_modules", 461},
    /* NUMA home node: nothing a REPL sets */
    {"set_mempolicy_home_node", 450},
    /* obsolete interfaces with a history of bugs */
    {"lookup_dcookie", -1},
    {"uselib", -1},
    {"nfsservctl", -1},
    {"_sysctl", -1},
    {"sysfs", -1},
    {"ustat", -1},
    {"fanotify_init", -1},
    {"vm86", -1},
    {"vm86old", -1},
};

/* Fail with ENOSYS, so that libraries fall back to the older interface
 * (libmount reads /proc/self/mountinfo instead). */
static const struct {
    const char *name;
    int nr;
} sbx_seccomp_enosys[] = {
    {"clone3", 435}, /* libc falls back to clone, whose flags can be inspected */
    {"statmount", 457},
    {"listmount", 458},
};

/* The number of a system call on the native architecture: libseccomp's,
 * else fallback when it is a call added since Linux 5.1 (>= 424: numbered
 * alike on every architecture but alpha, which this does not build for),
 * else __NR_SCMP_ERROR: not on this architecture, or unknown to this
 * libseccomp and older than the unified numbering — skipped. */
static int sbx_seccomp_nr(const char *name, int fallback)
{
    int nr = seccomp_syscall_resolve_name(name);
    if (nr != __NR_SCMP_ERROR)
        return nr;
#ifndef __alpha__
    if (fallback >= 424)
        return fallback;
#endif
    return __NR_SCMP_ERROR;
}

int sbx_seccomp_probe(char *err, size_t len)
{
    if (prctl(PR_GET_SECCOMP, 0, 0, 0, 0) < 0)
        return sbx_util_fail(err, len, "seccomp unavailable");
    uint32_t action = SECCOMP_RET_KILL_PROCESS;
    if (syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) < 0)
        return sbx_util_fail(err, len, "seccomp unavailable (no filter mode with kill-process)");
    return 0;
}

#ifndef __O_TMPFILE
#define __O_TMPFILE 020000000
#endif

/* Where the mode (and, for open, the flags) is among the arguments. */
static const struct {
    const char *name;
    unsigned mode_arg;
    int flags_arg; /* -1: the call always creates */
    int nr;        /* see sbx_seccomp_nr */
} sbx_seccomp_mode_calls[] = {
    {"chmod", 1, -1, -1},      {"fchmod", 1, -1, -1}, {"fchmodat", 2, -1, -1},
    {"fchmodat2", 2, -1, 452}, {"creat", 1, -1, -1},  {"mknod", 1, -1, -1},
    {"mknodat", 2, -1, -1},    {"open", 2, 1, -1},    {"openat", 3, 2, -1},
};

/* Denies every call of sbx_seccomp_mode_calls whose mode has a set-id bit. */
static int sbx_seccomp_setid(scmp_filter_ctx ctx, const char **what)
{
    static const uint64_t bits[] = {S_ISUID, S_ISGID};
    static const uint64_t creating[] = {O_CREAT, __O_TMPFILE};
    int rc = 0;
    for (size_t i = 0;
         rc == 0 && i < sizeof sbx_seccomp_mode_calls / sizeof *sbx_seccomp_mode_calls; i++) {
        int nr = sbx_seccomp_nr(sbx_seccomp_mode_calls[i].name, sbx_seccomp_mode_calls[i].nr);
        if (nr == __NR_SCMP_ERROR)
            continue;
        *what = sbx_seccomp_mode_calls[i].name;
        for (size_t b = 0; rc == 0 && b < 2; b++) {
            struct scmp_arg_cmp c[2] = {
                {sbx_seccomp_mode_calls[i].mode_arg, SCMP_CMP_MASKED_EQ, bits[b], bits[b]},
            };
            if (sbx_seccomp_mode_calls[i].flags_arg < 0) {
                rc = seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO(EPERM), nr, 1, c);
                continue;
            }
            for (size_t f = 0; rc == 0 && f < 2; f++) {
                c[1] = (struct scmp_arg_cmp){(unsigned)sbx_seccomp_mode_calls[i].flags_arg,
                                             SCMP_CMP_MASKED_EQ, creating[f], creating[f]};
                rc = seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO(EPERM), nr, 2, c);
            }
        }
    }
    int nr = sbx_seccomp_nr("openat2", 437);
    if (rc == 0 && nr != __NR_SCMP_ERROR) {
        *what = "openat2";
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
    }
    return rc;
}

#define SBX_SC_RULE(ctx, action, name, ...)                                                        \
    seccomp_rule_add((ctx), (action), seccomp_syscall_resolve_name(name), __VA_ARGS__)

int sbx_seccomp_apply(const sandbox_config *cfg, char *err, size_t len)
{
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return sbx_util_fail(err, len, "seccomp: init");
    const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
    int rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
    const char *what = "bad-arch action";
    for (size_t i = 0; rc == 0 && i < sizeof sbx_seccomp_denied / sizeof *sbx_seccomp_denied; i++) {
        int nr = sbx_seccomp_nr(sbx_seccomp_denied[i].name, sbx_seccomp_denied[i].nr);
        if (nr == __NR_SCMP_ERROR)
            continue; /* not on this architecture */
        what = sbx_seccomp_denied[i].name;
        rc = seccomp_rule_add(ctx, eperm, nr, 0);
    }
    if (rc == 0)
        rc = sbx_seccomp_setid(ctx, &what);
    for (size_t i = 0; rc == 0 && i < sizeof sbx_seccomp_enosys / sizeof *sbx_seccomp_enosys; i++) {
        int nr = sbx_seccomp_nr(sbx_seccomp_enosys[i].name, sbx_seccomp_enosys[i].nr);
        if (nr == __NR_SCMP_ERROR)
            continue;
        what = sbx_seccomp_enosys[i].name;
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
    }
    /* clone's flags are its first argument on x86_64 and arm64 alike; one
     * masked compare per namespace flag. */
    static const uint64_t ns_flags[] = {CLONE_NEWUSER,   CLONE_NEWNS,  CLONE_NEWPID,
                                        CLONE_NEWNET,    CLONE_NEWIPC, CLONE_NEWUTS,
                                        CLONE_NEWCGROUP, CLONE_NEWTIME};
    for (size_t i = 0; rc == 0 && i < sizeof ns_flags / sizeof *ns_flags; i++) {
        what = "clone";
        rc = SBX_SC_RULE(ctx, eperm, "clone", 1,
                         SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    }
    /* The ioctl request is an unsigned int: compare the low 32 bits only, or
     * a caller could set high bits to slip past an exact 64-bit compare. */
    if (rc == 0) {
        what = "ioctl TIOCSTI";
        rc = SBX_SC_RULE(ctx, eperm, "ioctl", 1, SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI));
    }
    if (rc == 0) {
        what = "ioctl TIOCLINUX";
        rc = SBX_SC_RULE(ctx, eperm, "ioctl", 1,
                         SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX));
    }
    /* personality: only the query (0xffffffff). Setting a persona can turn
     * off ASLR (ADDR_NO_RANDOMIZE) or make data executable; libseccomp cannot
     * express a set of allowed values in one rule, and nothing a REPL runs
     * needs to set one. */
    if (rc == 0) {
        what = "personality";
        rc = SBX_SC_RULE(ctx, eperm, "personality", 1, SCMP_A0(SCMP_CMP_NE, 0xffffffffu));
    }
    /* socket(domain, ...): the domain is an int, so any value with high bits
     * set is >= AF_NETLINK + 1 as a 64-bit number and falls in the last range. */
    if (rc == 0) {
        what = "socket";
        rc = SBX_SC_RULE(ctx, eperm, "socket", 1, SCMP_A0(SCMP_CMP_EQ, AF_UNSPEC));
        for (uint64_t af = 3; rc == 0 && af < AF_NETLINK; af++)
            if (af != AF_INET6)
                rc = SBX_SC_RULE(ctx, eperm, "socket", 1, SCMP_A0(SCMP_CMP_EQ, af));
        if (rc == 0)
            rc = SBX_SC_RULE(ctx, eperm, "socket", 1, SCMP_A0(SCMP_CMP_GT, AF_NETLINK));
        if (rc == 0)
            rc = SBX_SC_RULE(ctx, eperm, "socket", 2, SCMP_A0(SCMP_CMP_EQ, AF_NETLINK),
                             SCMP_A2(SCMP_CMP_NE, NETLINK_ROUTE));
        /* Network off: the INET families for plain TCP and UDP only. The
         * type's low 4 bits (SOCK_TYPE_MASK) must be SOCK_STREAM or
         * SOCK_DGRAM (SOCK_CLOEXEC / SOCK_NONBLOCK above them are fine); the
         * protocol 0, TCP or UDP (anything with high bits is > UDP). */
        static const uint64_t inet[] = {AF_INET, AF_INET6};
        for (size_t f = 0; rc == 0 && !cfg->network && f < 2; f++) {
            what = "socket (network off)";
            for (uint64_t t = 0; rc == 0 && t <= 0xf; t++)
                if (t != SOCK_STREAM && t != SOCK_DGRAM)
                    rc = SBX_SC_RULE(ctx, eperm, "socket", 2, SCMP_A0(SCMP_CMP_EQ, inet[f]),
                                     SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, t));
            for (uint64_t p = 1; rc == 0 && p < IPPROTO_UDP; p++)
                if (p != IPPROTO_TCP)
                    rc = SBX_SC_RULE(ctx, eperm, "socket", 2, SCMP_A0(SCMP_CMP_EQ, inet[f]),
                                     SCMP_A2(SCMP_CMP_EQ, p));
            if (rc == 0)
                rc = SBX_SC_RULE(ctx, eperm, "socket", 2, SCMP_A0(SCMP_CMP_EQ, inet[f]),
                                 SCMP_A2(SCMP_CMP_GT, IPPROTO_UDP));
        }
        /* socketpair() only exists for AF_UNIX, but makes a socket of the
         * family it is given before it fails. */
        if (rc == 0) {
            what = "socketpair";
            rc = SBX_SC_RULE(ctx, eperm, "socketpair", 1, SCMP_A0(SCMP_CMP_NE, AF_UNIX));
        }
    }
    if (rc == 0) {
        what = "load";
        rc = seccomp_load(ctx);
    }
    seccomp_release(ctx);
    if (rc < 0) {
        errno = -rc;
        return sbx_util_fail(err, len, "seccomp: %s", what);
    }
    return 0;
}
