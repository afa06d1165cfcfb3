/* Unit tests for protocol/jp_connection.c: connection files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jp.h"

#define VALID_TCP                                                                                  \
    "{\"shell_port\": 5001, \"iopub_port\": 5002, \"stdin_port\": 5003, \"control_port\": "        \
    "5004, \"hb_port\": 5005, \"ip\": \"127.0.0.1\", \"key\": \"abc-123\", \"transport\": "        \
    "\"tcp\", \"signature_scheme\": \"hmac-sha256\", \"kernel_name\": \"kernelmgr-python\", "      \
    "\"jupyter_session\": \"extra fields are ignored\"}"

static jp_status parse(const char *text, jp_connection *c, jp_error *err)
{
    jp_status st = jp_connection_parse(text, strlen(text), c, err);
    if (st != JP_OK) {
        assert_int_equal(err->code, st);
        assert_true(strlen(err->reason) > 0);
    }
    return st;
}

/* VALID_TCP with the text `from` replaced by `to`. */
static jp_status parse_edit(const char *from, const char *to, jp_error *err)
{
    char buf[2048];
    const char *at = strstr(VALID_TCP, from);
    assert_non_null(at);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - VALID_TCP), VALID_TCP, to, at + strlen(from));
    jp_connection c;
    return parse(buf, &c, err);
}

static void test_channel_names(void **state)
{
    (void)state;
    assert_string_equal(jp_channel_name(JP_SHELL), "shell");
    assert_string_equal(jp_channel_name(JP_IOPUB), "iopub");
    assert_string_equal(jp_channel_name(JP_STDIN), "stdin");
    assert_string_equal(jp_channel_name(JP_CONTROL), "control");
    assert_string_equal(jp_channel_name(JP_HB), "hb");
    assert_string_equal(jp_channel_name(JP_CHANNEL__COUNT), "unknown");
    assert_string_equal(jp_channel_name((jp_channel)-3), "unknown");
}

static void test_parse_valid(void **state)
{
    (void)state;
    jp_connection c;
    jp_error err;
    assert_int_equal(parse(VALID_TCP, &c, &err), JP_OK);
    assert_string_equal(c.transport, "tcp");
    assert_string_equal(c.ip, "127.0.0.1");
    assert_string_equal(c.key, "abc-123");
    assert_string_equal(c.signature_scheme, "hmac-sha256");
    assert_string_equal(c.kernel_name, "kernelmgr-python");
    for (int i = 0; i < JP_CHANNEL__COUNT; i++)
        assert_int_equal(c.ports[i], 5001 + i);

    const char *ipc = "{\"shell_port\": 1, \"iopub_port\": 2, \"stdin_port\": 3, "
                      "\"control_port\": 4, \"hb_port\": 0, \"ip\": \"/tmp/k\", \"key\": \"\", "
                      "\"transport\": \"ipc\", \"signature_scheme\": \"hmac-sha256\"}";
    assert_int_equal(parse(ipc, &c, &err), JP_OK);
    assert_string_equal(c.transport, "ipc");
    assert_string_equal(c.key, "");
    assert_string_equal(c.kernel_name, "");
    assert_int_equal(c.ports[JP_HB], 0);
}

static void test_parse_errors(void **state)
{
    (void)state;
    jp_error err;
    jp_connection c;
    assert_int_equal(parse("{\"ip\": ", &c, &err), JP_ERR_JSON);
    assert_int_equal(parse("", &c, &err), JP_ERR_JSON);
    assert_int_equal(parse("[1, 2]", &c, &err), JP_ERR_CONNFILE);
    assert_int_equal(parse("\"str\"", &c, &err), JP_ERR_CONNFILE);
    assert_int_equal(parse("{\"key\": \"\xff\"}", &c, &err), JP_ERR_UTF8);
    assert_int_equal(jp_connection_parse(NULL, 3, &c, &err), JP_ERR_ARG);
    assert_int_equal(jp_connection_parse("{}", 2, NULL, &err), JP_ERR_ARG);

    /* The scheme is checked clearly, by name. */
    assert_int_equal(parse_edit("hmac-sha256", "hmac-md5", &err), JP_ERR_SCHEME);
    assert_non_null(strstr(err.reason, "hmac-md5"));
    assert_int_equal(parse_edit("\"hmac-sha256\"", "5", &err), JP_ERR_SCHEME);
    assert_int_equal(parse_edit("\"signature_scheme\"", "\"sigscheme\"", &err), JP_ERR_CONNFILE);
    assert_non_null(strstr(err.reason, "signature_scheme"));

    /* Each required field missing, and of the wrong type. */
    const char *fields[] = {"shell_port", "iopub_port", "stdin_port", "control_port",
                            "hb_port",    "ip",         "key",        "transport"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        char from[64], renamed[64];
        snprintf(from, sizeof from, "\"%s\":", fields[i]);
        snprintf(renamed, sizeof renamed, "\"%s_x\":", fields[i]);
        assert_int_equal(parse_edit(from, renamed, &err), JP_ERR_CONNFILE);
        assert_non_null(strstr(err.reason, "missing"));
    }
    assert_int_equal(parse_edit("5001", "\"5001\"", &err), JP_ERR_CONNFILE);
    assert_non_null(strstr(err.reason, "shell_port"));
    assert_int_equal(parse_edit("5005", "50.5", &err), JP_ERR_CONNFILE);
    assert_int_equal(parse_edit("5002", "0", &err), JP_ERR_CONNFILE);
    assert_int_equal(parse_edit("5002", "65536", &err), JP_ERR_CONNFILE);
    assert_int_equal(parse_edit("5002", "-1", &err), JP_ERR_CONNFILE);
    assert_int_equal(parse_edit("\"127.0.0.1\"", "null", &err), JP_ERR_CONNFILE);
    assert_int_equal(parse_edit("\"127.0.0.1\"", "\"\"", &err), JP_ERR_CONNFILE);
    assert_int_equal(parse_edit("\"abc-123\"", "123", &err), JP_ERR_CONNFILE);
    assert_int_equal(parse_edit("\"tcp\"", "\"udp\"", &err), JP_ERR_CONNFILE);
    assert_non_null(strstr(err.reason, "udp"));
    assert_int_equal(parse_edit("\"kernelmgr-python\"", "7", &err), JP_ERR_CONNFILE);

    /* Too long for the fixed fields: refused, never truncated. */
    char longkey[400];
    memset(longkey, 'k', sizeof longkey);
    longkey[0] = '"';
    longkey[sizeof longkey - 2] = '"';
    longkey[sizeof longkey - 1] = '\0';
    assert_int_equal(parse_edit("\"abc-123\"", longkey, &err), JP_ERR_CONNFILE);
    assert_non_null(strstr(err.reason, "too long"));
}

static void test_parse_too_large(void **state)
{
    (void)state;
    size_t len = (1u << 20) + 1;
    char *big = malloc(len);
    memset(big, ' ', len);
    jp_connection c;
    jp_error err;
    assert_int_equal(jp_connection_parse(big, len, &c, &err), JP_ERR_TOO_LARGE);
    free(big);
}

static char tmpdir[64];

static int mkdir_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/jp-conn-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int rm_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static void test_init_write_read_tcp(void **state)
{
    (void)state;
    jp_connection c, r;
    jp_error err;
    assert_int_equal(jp_connection_init(&c, "tcp", NULL, "kernelmgr-bash", &err), JP_OK);
    assert_string_equal(c.transport, "tcp");
    assert_string_equal(c.ip, "127.0.0.1");
    assert_string_equal(c.signature_scheme, "hmac-sha256");
    assert_string_equal(c.kernel_name, "kernelmgr-bash");
    assert_int_equal(strlen(c.key), 64);
    for (int i = 0; i < 64; i++)
        assert_non_null(strchr("0123456789abcdef", c.key[i]));
    for (int i = 0; i < JP_CHANNEL__COUNT; i++) {
        assert_true(c.ports[i] > 0 && c.ports[i] <= 65535);
        for (int j = 0; j < i; j++)
            assert_int_not_equal(c.ports[i], c.ports[j]);
    }
    jp_connection c2;
    assert_int_equal(jp_connection_init(&c2, NULL, NULL, NULL, &err), JP_OK);
    assert_string_not_equal(c.key, c2.key);
    assert_string_equal(c2.kernel_name, "");

    char path[128];
    snprintf(path, sizeof path, "%s/kernel-1.json", tmpdir);
    assert_int_equal(jp_connection_write(path, &c, &err), JP_OK);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal(count_entries(tmpdir), 1); /* no temporary left over */
    assert_int_equal(jp_connection_read(path, &r, &err), JP_OK);
    assert_memory_equal(&r, &c, sizeof r);
    /* Overwriting goes through rename too. */
    assert_int_equal(jp_connection_write(path, &c2, &err), JP_OK);
    assert_int_equal(jp_connection_read(path, &r, &err), JP_OK);
    assert_string_equal(r.key, c2.key);
    assert_int_equal(count_entries(tmpdir), 1);
}

static void test_init_ipc_and_errors(void **state)
{
    (void)state;
    jp_connection c;
    jp_error err;
    char stem[128];
    snprintf(stem, sizeof stem, "%s/kernel-ipc", tmpdir);
    assert_int_equal(jp_connection_init(&c, "ipc", stem, NULL, &err), JP_OK);
    for (int i = 0; i < JP_CHANNEL__COUNT; i++)
        assert_int_equal(c.ports[i], i + 1);
    char ep[256];
    assert_int_equal(jp_connection_endpoint(&c, JP_HB, ep, sizeof ep), 0);
    char want[256];
    snprintf(want, sizeof want, "ipc://%s-5", stem);
    assert_string_equal(ep, want);

    char path[128];
    snprintf(path, sizeof path, "%s/ipc.json", tmpdir);
    jp_connection r;
    assert_int_equal(jp_connection_write(path, &c, &err), JP_OK);
    assert_int_equal(jp_connection_read(path, &r, &err), JP_OK);
    assert_memory_equal(&r, &c, sizeof r);

    assert_int_equal(jp_connection_init(&c, "ipc", NULL, NULL, &err), JP_ERR_ARG);
    assert_int_equal(jp_connection_init(&c, "ipc", "", NULL, &err), JP_ERR_ARG);
    assert_int_equal(jp_connection_init(&c, "udp", NULL, NULL, &err), JP_ERR_ARG);
    assert_int_equal(jp_connection_init(&c, "tcp", "localhost", NULL, &err), JP_ERR_ARG);
    assert_int_equal(jp_connection_init(&c, "tcp", "192.0.2.1", NULL, &err), JP_ERR_IO);
    assert_int_equal(jp_connection_init(NULL, "tcp", NULL, NULL, &err), JP_ERR_ARG);
    char longname[300];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(jp_connection_init(&c, "ipc", longname, NULL, &err), JP_ERR_ARG);
    assert_int_equal(jp_connection_init(&c, "ipc", "x", longname, &err), JP_ERR_ARG);
}

static void test_read_write_errors(void **state)
{
    (void)state;
    jp_connection c;
    jp_error err;
    char path[256];
    assert_int_equal(jp_connection_read("/nonexistent/dir/k.json", &c, &err), JP_ERR_IO);
    assert_non_null(strstr(err.reason, "No such file"));
    assert_int_equal(jp_connection_read(tmpdir, &c, &err), JP_ERR_IO); /* a directory */
    assert_int_equal(jp_connection_read(NULL, &c, &err), JP_ERR_ARG);

    snprintf(path, sizeof path, "%s/big.json", tmpdir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < (1 << 20) + 10; i += 10)
        fputs("          ", f);
    fclose(f);
    assert_int_equal(jp_connection_read(path, &c, &err), JP_ERR_TOO_LARGE);

    snprintf(path, sizeof path, "%s/bad.json", tmpdir);
    f = fopen(path, "w");
    fputs("{\"transport\": \"tcp\", \"signature_scheme\": \"hmac-sha1\"}", f);
    fclose(f);
    assert_int_equal(jp_connection_read(path, &c, &err), JP_ERR_SCHEME);
    assert_non_null(strstr(err.reason, "bad.json")); /* says which file */

    jp_connection init;
    assert_int_equal(jp_connection_init(&init, "tcp", NULL, NULL, &err), JP_OK);
    assert_int_equal(jp_connection_write("/nonexistent/dir/k.json", &init, &err), JP_ERR_IO);
    assert_int_equal(jp_connection_write(NULL, &init, &err), JP_ERR_ARG);
    assert_int_equal(jp_connection_write(path, NULL, &err), JP_ERR_ARG);
    init.key[0] = '\xff'; /* not UTF-8: cannot be written as JSON */
    snprintf(path, sizeof path, "%s/never.json", tmpdir);
    assert_int_equal(jp_connection_write(path, &init, &err), JP_ERR_ARG);
    assert_int_not_equal(access(path, F_OK), 0);
}

static void test_endpoints(void **state)
{
    (void)state;
    jp_connection c;
    jp_error err;
    assert_int_equal(jp_connection_parse(VALID_TCP, strlen(VALID_TCP), &c, &err), JP_OK);
    char ep[64];
    assert_int_equal(jp_connection_endpoint(&c, JP_SHELL, ep, sizeof ep), 0);
    assert_string_equal(ep, "tcp://127.0.0.1:5001");
    assert_int_equal(jp_connection_endpoint(&c, JP_CONTROL, ep, sizeof ep), 0);
    assert_string_equal(ep, "tcp://127.0.0.1:5004");
    assert_int_equal(jp_connection_endpoint(&c, JP_SHELL, ep, 10), -1);
    assert_string_equal(ep, "");
    assert_int_equal(jp_connection_endpoint(&c, JP_CHANNEL__COUNT, ep, sizeof ep), -1);
    assert_int_equal(jp_connection_endpoint(NULL, JP_SHELL, ep, sizeof ep), -1);
    assert_int_equal(jp_connection_endpoint(&c, JP_SHELL, NULL, 0), -1);
    snprintf(c.ip, sizeof c.ip, "::1");
    assert_int_equal(jp_connection_endpoint(&c, JP_HB, ep, sizeof ep), 0);
    assert_string_equal(ep, "tcp://[::1]:5005");
}

/* Only numeric loopback addresses count: libzmq binds names and "*" too. */
static void test_loopback(void **state)
{
    (void)state;
    jp_connection c;
    memset(&c, 0, sizeof c);
    snprintf(c.transport, sizeof c.transport, "tcp");
    static const char *const yes[] = {"127.0.0.1", "127.255.0.9", "::1", "[::1]",
                                      "::ffff:127.0.0.1"};
    static const char *const no[] = {
        "0.0.0.0",   "*",         "localhost",       "lo",    "eth0", "::",
        "128.0.0.1", "192.0.2.1", "::ffff:10.0.0.1", "127.1", "[::1", ""};
    for (size_t i = 0; i < sizeof yes / sizeof *yes; i++) {
        snprintf(c.ip, sizeof c.ip, "%s", yes[i]);
        if (!jp_connection_is_loopback(&c))
            fail_msg("%s: not loopback", yes[i]);
    }
    for (size_t i = 0; i < sizeof no / sizeof *no; i++) {
        snprintf(c.ip, sizeof c.ip, "%s", no[i]);
        if (jp_connection_is_loopback(&c))
            fail_msg("%s: taken for loopback", no[i]);
    }
    snprintf(c.transport, sizeof c.transport, "ipc");
    snprintf(c.ip, sizeof c.ip, "/run/x/k");
    assert_true(jp_connection_is_loopback(&c));
    assert_false(jp_connection_is_loopback(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_channel_names),
        cmocka_unit_test(test_parse_valid),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_parse_too_large),
        cmocka_unit_test_setup_teardown(test_init_write_read_tcp, mkdir_setup, rm_teardown),
        cmocka_unit_test_setup_teardown(test_init_ipc_and_errors, mkdir_setup, rm_teardown),
        cmocka_unit_test_setup_teardown(test_read_write_errors, mkdir_setup, rm_teardown),
        cmocka_unit_test(test_endpoints),
        cmocka_unit_test(test_loopback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
