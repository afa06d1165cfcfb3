/* Unit tests of common/cm_io.c: whole reads and writes over real pipes and
 * files, with short transfers (a full pipe) and signals (EINTR). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cm_io.h"

#define BIG (1u << 20) /* far more than a pipe holds: the writer blocks, writes short */

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

/* The other end of the pipe, in a thread that never takes SIGALRM: waits
 * until the main thread has been interrupted a few times while blocked in
 * cm_write_all (full pipe) or cm_read_all (empty pipe), then does its part. */
typedef struct peer {
    int fd, reads;
    const char *src;
    char *data;
    size_t len;
    int rc;
} peer;

static void *peer_side(void *arg)
{
    peer *p = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    for (int i = 0; i < 10000 && alarms < 3; i++) /* a deadline of about 10 s */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    if (p->reads) {
        p->rc = cm_read_all(p->fd, BIG, &p->data, &p->len);
    } else {
        p->rc = cm_write_all(p->fd, p->src, BIG);
        close(p->fd);
    }
    return NULL;
}

static char *pattern(size_t n)
{
    char *p = malloc(n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (char)('a' + i % 23);
    return p;
}

/* Signals without SA_RESTART every 2 ms: a blocked write or read returns
 * short or fails with EINTR, which the functions must ride out. */
static void alarms_on(int on)
{
    struct sigaction sa = {.sa_handler = on ? on_alarm : SIG_IGN};
    sigemptyset(&sa.sa_mask);
    struct itimerval it = {{0, on ? 2000 : 0}, {0, on ? 2000 : 0}};
    if (on) {
        alarms = 0;
        assert_int_equal(sigaction(SIGALRM, &sa, NULL), 0);
        assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    } else {
        setitimer(ITIMER_REAL, &it, NULL);
        sigaction(SIGALRM, &sa, NULL); /* one may still be pending */
    }
}

static void write_all_through_a_pipe_with_signals(void **state)
{
    (void)state;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    char *src = pattern(BIG);
    peer r = {.fd = pfd[0], .reads = 1, .rc = -2};
    alarms_on(1);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, peer_side, &r), 0);
    int rc = cm_write_all(pfd[1], src, BIG);
    close(pfd[1]);
    pthread_join(th, NULL);
    alarms_on(0);
    close(pfd[0]);
    assert_int_equal(rc, 0);
    assert_true(alarms >= 3);
    assert_int_equal(r.rc, 0);
    assert_int_equal(r.len, BIG);
    assert_int_equal(r.data[BIG], '\0');
    assert_memory_equal(r.data, src, BIG);
    free(r.data);
    free(src);
}

static void read_all_through_a_pipe_with_signals(void **state)
{
    (void)state;
    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    char *src = pattern(BIG);
    peer w = {.fd = pfd[1], .reads = 0, .src = src, .rc = -2};
    alarms_on(1);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, peer_side, &w), 0);
    char *data = NULL;
    size_t len = 0;
    int rc = cm_read_all(pfd[0], BIG, &data, &len);
    close(pfd[0]); /* a failed read must not leave the writer blocked */
    pthread_join(th, NULL);
    alarms_on(0);
    assert_int_equal(rc, 0);
    assert_int_equal(w.rc, 0);
    assert_true(alarms >= 3);
    assert_int_equal(len, BIG);
    assert_memory_equal(data, src, BIG);
    free(data);
    free(src);
}

static void write_all_reports_errors(void **state)
{
    (void)state;
    errno = 0;
    assert_int_equal(cm_write_all(-1, "x", 1), -1);
    assert_int_equal(errno, EBADF);
    int fd = open("/dev/full", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        assert_int_equal(cm_write_all(fd, "x", 1), -1);
        assert_int_equal(errno, ENOSPC);
        close(fd);
    }
    assert_int_equal(cm_write_all(-1, "", 0), 0); /* nothing to write */
}

static int tmpfile_with(const char *content, size_t n)
{
    char path[] = "/tmp/test_common_io.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    assert_int_equal(cm_write_all(fd, content, n), 0);
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    return fd;
}

static void read_all_limits(void **state)
{
    (void)state;
    char *d = NULL;
    size_t n = 99;
    int fd = tmpfile_with("hello", 5);
    assert_int_equal(cm_read_all(fd, 5, &d, &n), 0); /* exactly max: fine */
    assert_int_equal(n, 5);
    assert_string_equal(d, "hello");
    free(d);
    assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
    errno = 0;
    assert_int_equal(cm_read_all(fd, 4, &d, &n), -1); /* one byte more than max */
    assert_int_equal(errno, EFBIG);
    assert_null(d);
    close(fd);

    fd = tmpfile_with("", 0);
    assert_int_equal(cm_read_all(fd, 0, &d, &n), 0);
    assert_int_equal(n, 0);
    assert_string_equal(d, "");
    free(d);
    close(fd);

    /* larger than the first allocation: grows */
    char *src = pattern(100000);
    fd = tmpfile_with(src, 100000);
    assert_int_equal(cm_read_all(fd, 100000, &d, &n), 0);
    assert_int_equal(n, 100000);
    assert_memory_equal(d, src, n);
    free(d);
    free(src);
    close(fd);

    assert_int_equal(cm_read_all(-1, 10, &d, &n), -1);
    assert_int_equal(errno, EBADF);
    assert_null(d);
}

static void read_full_stops_at_eof(void **state)
{
    (void)state;
    int fd = tmpfile_with("abcdef", 6);
    char buf[16];
    assert_int_equal(cm_read_full(fd, buf, 4), 4);
    assert_memory_equal(buf, "abcd", 4);
    assert_int_equal(cm_read_full(fd, buf, sizeof buf), 2);
    assert_memory_equal(buf, "ef", 2);
    assert_int_equal(cm_read_full(fd, buf, sizeof buf), 0);
    close(fd);
    assert_int_equal(cm_read_full(-1, buf, 1), -1);
    assert_int_equal(errno, EBADF);
}

static char *tmpdir_new(void)
{
    char tmpl[] = "/tmp/cm-io-test.XXXXXX";
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static void rr_refuses(const char *path, size_t max, unsigned flags, const char *why_expected)
{
    char *data = (char *)"untouched";
    size_t len = 99;
    const char *why = NULL;
    assert_int_equal(cm_read_regular(path, max, flags, &data, &len, &why), -1);
    assert_null(data);
    assert_int_equal(len, 0);
    assert_non_null(why);
    if (!strstr(why, why_expected))
        fail_msg("%s: reason \"%s\" lacks \"%s\"", path, why, why_expected);
}

static void read_regular_refuses_what_is_not_a_plain_file(void **state)
{
    (void)state;
    char *d = tmpdir_new(), p[512], l[512], fifo[512], big[512];
    snprintf(p, sizeof p, "%s/plain", d);
    snprintf(l, sizeof l, "%s/link", d);
    snprintf(fifo, sizeof fifo, "%s/fifo", d);
    snprintf(big, sizeof big, "%s/big", d);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("secret-token rest", f);
    fclose(f);
    assert_int_equal(chmod(p, 0600), 0);
    assert_int_equal(symlink(p, l), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    f = fopen(big, "w");
    assert_non_null(f);
    for (int i = 0; i < 100; i++)
        fputs("0123456789", f);
    fclose(f);

    char *data = NULL;
    size_t len = 0;
    const char *why = NULL;
    assert_int_equal(cm_read_regular(p, 1024, CM_RR_OWNED, &data, &len, &why), 0);
    assert_string_equal(data, "secret-token rest");
    assert_int_equal(len, 17);
    free(data);

    rr_refuses(l, 1024, 0, "symbolic link");
    rr_refuses(fifo, 1024, 0, "not a regular file"); /* and did not block */
    rr_refuses(d, 1024, 0, "not a regular file");
    rr_refuses(big, 999, 0, "larger than the limit");
    assert_int_equal(chmod(p, 0622), 0);
    rr_refuses(p, 1024, CM_RR_OWNED, "writable by group or others");
    assert_int_equal(cm_read_regular(p, 1024, 0, &data, &len, &why), 0);
    free(data);
    char missing[600];
    snprintf(missing, sizeof missing, "%s/missing", d);
    rr_refuses(missing, 1024, 0, "No such file");

    unlink(p), unlink(l), unlink(fifo), unlink(big);
    rmdir(d);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(write_all_through_a_pipe_with_signals),
        cmocka_unit_test(read_all_through_a_pipe_with_signals),
        cmocka_unit_test(write_all_reports_errors),
        cmocka_unit_test(read_all_limits),
        cmocka_unit_test(read_full_stops_at_eof),
        cmocka_unit_test(read_regular_refuses_what_is_not_a_plain_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
