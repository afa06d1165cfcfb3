/*
 * test_sbx_session.c — the wire format between a kernel server, a session
 * sandbox's holder and its init (sbx_session.c): messages survive a round
 * trip with their fds; a short, garbled, truncated or fd-stuffed message is
 * refused and its fds closed; string lists must fill the payload exactly;
 * a holder answers a kernel server's egress-refusals query from its hook
 * (the reason made printable), and one without the hook says it has none.
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
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "sandbox/sandbox.h"
#include "sandbox/sbx_internal.h"

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static int open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            n++;
    return n;
}

static void test_round_trip_with_fds(void **state)
{
    (void)state;
    int sv[2], p[2];
    pair(sv);
    assert_int_equal(pipe(p), 0);
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC, .type = 'S', .id = 7, .argc = 2, .envc = 1};
    const char payload[] = "/bin/true\0-x\0A=b";
    assert_int_equal(sbx_sess_send(sv[0], &h, payload, sizeof payload, p, 2), 0);
    sbx_sess_hdr r;
    char buf[256];
    int fds[SBX_SESS_MAX_FDS], nfds = -1;
    ssize_t n = sbx_sess_recv(sv[1], &r, buf, sizeof buf, fds, &nfds, SBX_SESS_MAX_FDS);
    assert_int_equal(n, (ssize_t)sizeof payload + 1);
    assert_int_equal(r.type, 'S');
    assert_int_equal(r.id, 7);
    assert_int_equal(nfds, 2);
    char *strs[4];
    assert_int_equal(sbx_sess_split(buf, (size_t)n - 1, 3, strs), 0);
    assert_string_equal(strs[0], "/bin/true");
    assert_string_equal(strs[2], "A=b");
    assert_null(strs[3]);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    close(p[0]);
    close(p[1]);
    close(sv[0]);
    close(sv[1]);
}

static void test_bad_messages_refused_fds_closed(void **state)
{
    (void)state;
    int sv[2], p[2];
    pair(sv);
    assert_int_equal(pipe(p), 0);
    int before = open_fds();
    sbx_sess_hdr r;
    char buf[64];
    int fds[SBX_SESS_MAX_FDS], nfds;
    /* a bad magic, with fds attached: refused, the fds closed */
    sbx_sess_hdr h = {.magic = 0x1234, .type = 'O'};
    assert_int_equal(sbx_sess_send(sv[0], &h, NULL, 0, p, 2), 0);
    assert_int_equal(sbx_sess_recv(sv[1], &r, buf, sizeof buf, fds, &nfds, 2), -1);
    assert_int_equal(errno, EBADMSG);
    assert_int_equal(open_fds(), before);
    /* more fds than the receiver takes */
    h.magic = SBX_SESS_MAGIC;
    assert_int_equal(sbx_sess_send(sv[0], &h, NULL, 0, p, 2), 0);
    assert_int_equal(sbx_sess_recv(sv[1], &r, buf, sizeof buf, fds, &nfds, 1), -1);
    assert_int_equal(open_fds(), before);
    /* a short header */
    assert_int_equal(send(sv[0], "abc", 3, 0), 3);
    assert_int_equal(sbx_sess_recv(sv[1], &r, buf, sizeof buf, fds, &nfds, 0), -1);
    /* a payload larger than the buffer: truncated, refused */
    char big[200];
    memset(big, 'x', sizeof big);
    assert_int_equal(sbx_sess_send(sv[0], &h, big, sizeof big, NULL, 0), 0);
    assert_int_equal(sbx_sess_recv(sv[1], &r, buf, sizeof buf, fds, &nfds, 0), -1);
    assert_int_equal(errno, EBADMSG);
    /* nothing queued: EAGAIN, never a block */
    assert_int_equal(sbx_sess_recv(sv[1], &r, buf, sizeof buf, fds, &nfds, 0), -1);
    assert_int_equal(errno, EAGAIN);
    /* end-of-file is 0 */
    close(sv[0]);
    assert_int_equal(sbx_sess_recv(sv[1], &r, buf, sizeof buf, fds, &nfds, 0), 0);
    close(sv[1]);
    close(p[0]);
    close(p[1]);
}

static void test_split_must_fill_exactly(void **state)
{
    (void)state;
    char *out[4];
    char a[] = "one\0two"; /* sizeof includes the final NUL */
    assert_int_equal(sbx_sess_split(a, sizeof a, 2, out), 0);
    assert_int_equal(sbx_sess_split(a, sizeof a, 1, out), -1); /* bytes left */
    assert_int_equal(sbx_sess_split(a, sizeof a, 3, out), -1); /* too few */
    char b[] = {'a', 'b'};                                     /* unterminated */
    assert_int_equal(sbx_sess_split(b, sizeof b, 1, out), -1);
    assert_int_equal(sbx_sess_split(b, 0, 0, out), 0);
    assert_null(out[0]);
}

static void test_oversized_send_refused(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    sbx_sess_hdr h = {.magic = SBX_SESS_MAGIC, .type = 'S'};
    int fds[SBX_SESS_MAX_FDS + 1] = {0};
    assert_int_equal(sbx_sess_send(sv[0], &h, NULL, 0, fds, SBX_SESS_MAX_FDS + 1), -1);
    assert_int_equal(errno, EMSGSIZE);
    assert_int_equal(sbx_sess_send(sv[0], &h, "x", SBX_SESS_MAX_MSG, NULL, 0), -1);
    assert_int_equal(errno, EMSGSIZE);
    close(sv[0]);
    close(sv[1]);
}

static long long three_refusals(void *arg, char *last, size_t lastlen)
{
    (void)arg;
    snprintf(last, lastlen, "host x.example:443 is not allowed\x01");
    return 3;
}

/* A holder (sandbox_session_serve_with, hooks or NULL) in a child on a
 * socket at path, ended by closing *owner_w. Its pid. */
static pid_t holder(const char *path, const sandbox_session_hooks *hooks, int *owner_w)
{
    int life[2];
    assert_int_equal(pipe(life), 0);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    unlink(path);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 8), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(life[1]);
        sandbox_config cfg;
        sandbox_config_defaults(&cfg);
        char err[256];
        _exit(sandbox_session_serve_with(&cfg, fd, life[0], hooks, err, sizeof err) < 0);
    }
    close(fd);
    close(life[0]);
    *owner_w = life[1];
    return pid;
}

static void test_egress_refusals_query(void **state)
{
    (void)state;
    char dir[] = "/tmp/km-sbxq-XXXXXX", path[64], last[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/h.sbx", dir);
    sandbox_session_hooks hooks = {NULL, three_refusals, NULL};
    int owner, st;
    pid_t pid = holder(path, &hooks, &owner);
    assert_int_equal(sandbox_session_egress_refusals(path, last, sizeof last), 3);
    assert_string_equal(last, "host x.example:443 is not allowed?");
    /* asked again on a connection of its own: the same answer */
    assert_int_equal(sandbox_session_egress_refusals(path, NULL, 0), 3);
    close(owner);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* a holder without a proxy: none */
    pid = holder(path, NULL, &owner);
    assert_int_equal(sandbox_session_egress_refusals(path, last, sizeof last), -1);
    assert_string_equal(last, "");
    close(owner);
    assert_int_equal(waitpid(pid, &st, 0), pid);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_with_fds),
        cmocka_unit_test(test_bad_messages_refused_fds_closed),
        cmocka_unit_test(test_split_must_fill_exactly),
        cmocka_unit_test(test_oversized_send_refused),
        cmocka_unit_test(test_egress_refusals_query),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
