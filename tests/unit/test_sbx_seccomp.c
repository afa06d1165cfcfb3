/*
 * test_sbx_seccomp.c — the sandbox's seccomp filter (sbx_seccomp.c), loaded
 * in a forked child so this process stays unfiltered: denied calls fail
 * with EPERM (or ENOSYS where the filter says so), allowed ones work.
 * AF_INET/AF_INET6 are left out on purpose: whether they are allowed with
 * the network off is the loopback listener's business, not this test's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <sched.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "sandbox/sbx_internal.h"

/* In the child: one line per check that went wrong, written to fd. */
static int bad;
static void check(int fd, const char *what, long rc, int want_errno)
{
    int e = errno;
    int ok = want_errno ? rc == -1 && e == want_errno : rc >= 0;
    if (ok)
        return;
    bad++;
    dprintf(fd, "%s: returned %ld (errno %d %s), want %s\n", what, rc, rc < 0 ? e : 0,
            rc < 0 ? strerror(e) : "", want_errno ? strerror(want_errno) : "success");
}

static long sock(int domain, int type, int proto)
{
    long fd = socket(domain, type, proto);
    if (fd >= 0)
        close((int)fd);
    return fd;
}

static void filtered_child(int fd, const char *dir)
{
    sandbox_config cfg;
    memset(&cfg, 0, sizeof cfg);
    char err[256] = "";
    if (sbx_seccomp_apply(&cfg, err, sizeof err) < 0) {
        dprintf(fd, "sbx_seccomp_apply: %s\n", err);
        _exit(2);
    }
    errno = 0;
    /* denied */
    check(fd, "socket(AF_PACKET, SOCK_RAW)", sock(AF_PACKET, SOCK_RAW, 0), EPERM);
    check(fd, "socket(AF_NETLINK, NETLINK_AUDIT)", sock(AF_NETLINK, SOCK_RAW, NETLINK_AUDIT),
          EPERM);
    check(fd, "socket(AF_UNSPEC)", sock(AF_UNSPEC, SOCK_STREAM, 0), EPERM);
    check(fd, "socket(domain with high bits)", syscall(SYS_socket, 0x100000001L, SOCK_STREAM, 0),
          EPERM);
    check(fd, "ptrace(PTRACE_TRACEME)", ptrace(PTRACE_TRACEME, 0, NULL, NULL), EPERM);
    check(fd, "keyctl", syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3, 0), EPERM);
    check(fd, "personality(ADDR_NO_RANDOMIZE)", personality(ADDR_NO_RANDOMIZE), EPERM);
    check(fd, "unshare(CLONE_NEWUSER)", syscall(SYS_unshare, CLONE_NEWUSER), EPERM);
    char *p = NULL;
    if (asprintf(&p, "%s/f", dir) < 0)
        _exit(3);
    int f = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    check(fd, "open (a new file)", f, 0);
    check(fd, "chmod(S_ISUID)", chmod(p, 04755), EPERM);
    check(fd, "fchmod(S_ISGID)", fchmod(f, 02755), EPERM);
    /* allowed */
    check(fd, "chmod(0644)", chmod(p, 0644), 0);
    check(fd, "socket(AF_UNIX)", sock(AF_UNIX, SOCK_STREAM, 0), 0);
    check(fd, "socket(AF_NETLINK, NETLINK_ROUTE)", sock(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE), 0);
    check(fd, "personality(query)", personality(0xffffffff), 0);
    check(fd, "getpid", getpid(), 0);
    close(f);
    unlink(p);
    free(p);
    _exit(bad ? 1 : 0);
}

static void test_filter_denies_and_allows(void **state)
{
    (void)state;
    char err[256] = "";
    if (sbx_seccomp_probe(err, sizeof err) < 0) {
        print_message("seccomp unavailable here (%s): skipped\n", err);
        skip();
    }
    char dir[] = "/tmp/test_sbx_seccompXXXXXX";
    assert_non_null(mkdtemp(dir));
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        filtered_child(p[1], dir);
    }
    close(p[1]);
    char report[4096];
    size_t n = 0;
    for (ssize_t r; n < sizeof report - 1 && (r = read(p[0], report + n, sizeof report - 1 - n));) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        n += (size_t)r;
    }
    report[n] = '\0';
    close(p[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (n)
        print_message("%s", report);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(rmdir(dir), 0);
    /* this process was never filtered */
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(s >= 0);
    close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filter_denies_and_allows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
