/* Unit tests for protocol/jp_util.c: errors, uuid4, timestamps, frames (UTF-8: test_common_utf8.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jp.h"

static void test_strerror_names_every_code(void **state)
{
    (void)state;
    for (int i = 0; i < JP_ERR__COUNT; i++) {
        const char *a = jp_strerror((jp_status)i);
        assert_non_null(a);
        assert_true(strlen(a) > 0);
        assert_string_not_equal(a, "unknown error");
        for (int j = 0; j < i; j++)
            assert_string_not_equal(a, jp_strerror((jp_status)j));
    }
    assert_string_equal(jp_strerror(JP_ERR__COUNT), "unknown error");
    assert_string_equal(jp_strerror((jp_status)-1), "unknown error");
    assert_string_equal(jp_strerror(JP_ERR_SIG_MISMATCH), "signature mismatch");
}

static int is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static void test_uuid4_format_and_uniqueness(void **state)
{
    (void)state;
    char seen[64][37];
    for (int n = 0; n < 64; n++) {
        char *u = seen[n];
        jp_uuid4(u);
        assert_int_equal(strlen(u), 36);
        for (int i = 0; i < 36; i++) {
            if (i == 8 || i == 13 || i == 18 || i == 23)
                assert_int_equal(u[i], '-');
            else
                assert_true(is_hex(u[i]));
        }
        assert_int_equal(u[14], '4');
        assert_non_null(strchr("89ab", u[19]));
        for (int j = 0; j < n; j++)
            assert_string_not_equal(u, seen[j]);
    }
}

static void test_now_iso8601_format(void **state)
{
    (void)state;
    char d[32];
    time_t before = time(NULL);
    jp_now_iso8601(d);
    time_t after = time(NULL);
    assert_int_equal(strlen(d), 27);
    const char *shape = "dddd-dd-ddTdd:dd:dd.ddddddZ";
    for (int i = 0; i < 27; i++) {
        if (shape[i] == 'd')
            assert_true(d[i] >= '0' && d[i] <= '9');
        else
            assert_int_equal(d[i], shape[i]);
    }
    struct tm tm = {0};
    assert_non_null(strptime(d, "%Y-%m-%dT%H:%M:%S", &tm));
    time_t t = timegm(&tm);
    assert_true(t >= before - 1 && t <= after + 1);
    /* and it reads back what it wrote */
    double back = 0;
    assert_int_equal(jp_iso8601_parse(d, &back), 0);
    assert_true(back >= (double)before - 1 && back <= (double)after + 1);
}

static void test_iso8601_parse(void **state)
{
    (void)state;
    double t = 0;
    assert_int_equal(jp_iso8601_parse("1970-01-01T00:00:00Z", &t), 0);
    assert_true(t == 0);
    assert_int_equal(jp_iso8601_parse("2026-12-01T00:32:36.250000Z", &t), 0);
    assert_true(t == 1796085156.25);
    /* the zones a Jupyter kernel may write (ipykernel: +00:00) */
    assert_int_equal(jp_iso8601_parse("2026-12-01T01:32:36.25+01:00", &t), 0);
    assert_true(t == 1796085156.25);
    assert_int_equal(jp_iso8601_parse("2026-11-30T23:02:36.25-0130", &t), 0);
    assert_true(t == 1796085156.25);
    assert_int_equal(jp_iso8601_parse("2026-12-01 00:32:36", &t), 0);
    assert_true(t == 1796085156);
    /* not dates: refused, never guessed */
    const char *bad[] = {"",
                         "2026-12-01",
                         "2026-13-01T00:00:00Z",
                         "2026-12-01T24:00:00Z",
                         "2026-12-01T00:00:00.Z",
                         "2026-12-01T00:00:00Zjunk",
                         "2026-12-01T00:00:00+1",
                         "x026-12-01T00:00:00Z",
                         NULL};
    for (int i = 0; bad[i]; i++)
        assert_int_equal(jp_iso8601_parse(bad[i], &t), -1);
    assert_int_equal(jp_iso8601_parse(NULL, &t), -1);
}

static void test_write_all(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    char buf[100000];
    memset(buf, 'x', sizeof buf);
    /* more than a pipe holds at once would block: write from a child */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        _exit(jp_write_all(fds[1], buf, sizeof buf) == 0 ? 0 : 1);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    char rd[8192];
    while ((n = read(fds[0], rd, sizeof rd)) > 0)
        got += (size_t)n;
    close(fds[0]);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(got, sizeof buf);
    int devfull = open("/dev/full", O_WRONLY);
    if (devfull >= 0) {
        errno = 0;
        assert_int_equal(jp_write_all(devfull, buf, 10), -1);
        assert_int_equal(errno, ENOSPC);
        close(devfull);
    }
}

static void test_frames_free(void **state)
{
    (void)state;
    jp_frames_free(NULL, 3);
    jp_frame *f = NULL;
    jp_frames_free(&f, 3);
    f = calloc(2, sizeof *f);
    f[0].data = strdup("x");
    f[0].size = 1;
    jp_frames_free(&f, 2);
    assert_null(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_names_every_code),
        cmocka_unit_test(test_uuid4_format_and_uniqueness),
        cmocka_unit_test(test_now_iso8601_format),
        cmocka_unit_test(test_iso8601_parse),
        cmocka_unit_test(test_write_all),
        cmocka_unit_test(test_frames_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
