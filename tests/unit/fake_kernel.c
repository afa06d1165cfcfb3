/*
 * fake_kernel.c — a kernel with a scripted worker for unit tests
 * (fake_kernel.h).
 */
#include "tests/unit/fake_kernel.h"
#include "jp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---------------------------------------------------------------- the worker
 *
 * Requests on fd 3, events on fd 4. It declares the "interrupt" feature.
 * Each line of a cell's code is one command:
 *   out TEXT / err TEXT   TEXT and a newline on stdout / stderr
 *   stream TEXT           a "stream" event (stdout)
 *   result TEXT           an execute_result with text/plain TEXT
 *   fail                  an error event (FakeError), done with status error
 *   die N                 exit(N) at once, mid-cell
 *   exit-after            answer the cell, then exit(0): a death between cells
 *   done-exit             send done, then _exit(0) at once: a death right
 *                         after the cell's completion message
 *   pid                   an execute_result with the worker's pid
 *   wait                  wait for an interrupt announcement, then report
 *                         KeyboardInterrupt (exit_code 130)
 *   hang                  ignore everything until killed
 * Anything else is ignored. */

static int evt_fd = 4;

static void ev(json_t *e) /* steals e */
{
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    if (!s)
        _exit(70);
    size_t n = strlen(s);
    s[n] = '\n'; /* overwrites the NUL: the line is written by length */
    const char *p = s;
    size_t left = n + 1;
    while (left) {
        ssize_t w = write(evt_fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            _exit(71);
        p += w;
        left -= (size_t)w;
    }
    free(s);
}

/* Reads one NUL-terminated field (new), NULL at end of file. */
static char *field(void)
{
    size_t cap = 64, len = 0;
    char *b = malloc(cap);
    if (!b)
        _exit(74);
    for (;;) {
        char c;
        ssize_t r = read(3, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            free(b);
            return NULL;
        }
        if (len + 1 >= cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb)
                _exit(74);
            b = nb;
        }
        b[len++] = c;
        if (!c)
            return b;
    }
}

/* An output event: with "sync", and nothing more is written until the
 * server's sync came (WORKER_PROTOCOL.md, Ordering). A stray interrupt
 * announcement read meanwhile is skipped. */
static void ev_sync(json_t *e) /* steals e */
{
    json_object_set_new(e, "sync", json_true());
    ev(e);
    for (char *f; (f = field());) {
        int is_sync = !strcmp(f, "sync"), is_interrupt = !strcmp(f, "interrupt");
        free(f);
        if (is_sync)
            return;
        if (is_interrupt)
            free(field());
    }
    _exit(73);
}

static void say(int fd, const char *text)
{
    if (write(fd, text, strlen(text)) < 0 || write(fd, "\n", 1) < 0)
        _exit(72);
}

/* Runs one cell; returns 1 when the worker must exit after answering. */
static int fake_cell(char *code)
{
    int exit_after = 0;
    for (char *save = NULL, *line = strtok_r(code, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "out ", 4)) {
            say(1, line + 4);
        } else if (!strncmp(line, "err ", 4)) {
            say(2, line + 4);
        } else if (!strncmp(line, "stream ", 7)) {
            ev_sync(
                json_pack("{s:s, s:s, s:s}", "type", "stream", "name", "stdout", "text", line + 7));
        } else if (!strncmp(line, "result ", 7)) {
            ev_sync(json_pack("{s:s, s:{s:s}, s:{}}", "type", "execute_result", "data",
                              "text/plain", line + 7, "metadata"));
        } else if (!strcmp(line, "pid")) {
            char pid[24];
            snprintf(pid, sizeof pid, "%d", (int)getpid());
            ev_sync(json_pack("{s:s, s:{s:s}, s:{}}", "type", "execute_result", "data",
                              "text/plain", pid, "metadata"));
        } else if (!strcmp(line, "fail")) {
            ev_sync(json_pack("{s:s, s:s, s:s, s:[s]}", "type", "error", "ename", "FakeError",
                              "evalue", "boom", "traceback", "boom"));
            ev(json_pack("{s:s, s:s, s:i}", "type", "done", "status", "error", "exit_code", 1));
            return exit_after;
        } else if (!strncmp(line, "die ", 4)) {
            _exit(atoi(line + 4)); /* no atexit: LSan would change the status */
        } else if (!strcmp(line, "done-exit")) {
            ev(json_pack("{s:s, s:s, s:i}", "type", "done", "status", "ok", "exit_code", 0));
            _exit(0);
        } else if (!strcmp(line, "exit-after")) {
            exit_after = 1;
        } else if (!strcmp(line, "wait")) {
            char *f;
            while ((f = field())) {
                int is_interrupt = !strcmp(f, "interrupt");
                free(f);
                if (is_interrupt) {
                    free(field()); /* the generation */
                    break;
                }
            }
            ev(json_pack("{s:s, s:s, s:s, s:[s]}", "type", "error", "ename", "KeyboardInterrupt",
                         "evalue", "", "traceback", "KeyboardInterrupt"));
            ev(json_pack("{s:s, s:s, s:i}", "type", "done", "status", "error", "exit_code", 130));
            return exit_after;
        } else if (!strcmp(line, "hang")) {
            for (char *f; (f = field());)
                free(f);
            pause();
        }
    }
    ev(json_pack("{s:s, s:s, s:i}", "type", "done", "status", "ok", "exit_code", 0));
    return exit_after;
}

/* The debug side (fds 5 and 6, WORKER_PROTOCOL.md "Debug pipes"), in a
 * process of its own: for each request line {"id", "request"} it writes a
 * malformed line, a reply to no request, an event echoing the request and
 * then the reply; a request whose command is "crash" ends the whole worker
 * without an answer. */
static void fake_debugger(void)
{
    FILE *in = fdopen(5, "r");
    char *line = NULL;
    size_t cap = 0;
    while (in && getline(&line, &cap, in) > 0) {
        json_t *m = json_loads(line, 0, NULL);
        json_t *id = json_object_get(m, "id"), *req = json_object_get(m, "request");
        const char *cmd = json_string_value(json_object_get(req, "command"));
        if (cmd && !strcmp(cmd, "crash"))
            kill(0, SIGKILL); /* the whole worker: its process group */
        say(6, "not json at all");
        say(6, "{\"id\": 424242, \"reply\": {}}");
        json_t *e = json_pack("{s:{s:s, s:s, s:O}}", "event", "type", "event", "event", "echo",
                              "body", req);
        json_t *r = json_pack("{s:O, s:{s:s, s:O, s:b, s:O, s:{s:O}}}", "id", id, "reply", "type",
                              "response", "request_seq", json_object_get(req, "seq"), "success", 1,
                              "command", json_object_get(req, "command"), "body", "echo", req);
        char *es = json_dumps(e, JSON_COMPACT), *rs = json_dumps(r, JSON_COMPACT);
        say(6, es);
        say(6, rs);
        free(es);
        free(rs);
        json_decref(e);
        json_decref(r);
        json_decref(m);
    }
    free(line);
    _exit(0);
}

int fake_worker(void)
{
    signal(SIGINT, SIG_IGN); /* interrupts are read from the request pipe */
    setpgid(0, 0);
    pid_t dbg = fcntl(5, F_GETFD) >= 0 ? fork() : -1;
    if (dbg == 0)
        fake_debugger();
    close(5);
    close(6);
    ev(json_pack("{s:s, s:[s, s]}", "type", "ready", "features", "interrupt", "debugger"));
    for (char *type; (type = field());) {
        char *f[5] = {0};
        int exit_after = 0;
        if (!strcmp(type, "execute")) {
            for (int i = 0; i < 5; i++)
                f[i] = field();
            exit_after = fake_cell(f[0] ? f[0] : (char *)"");
        } else if (!strcmp(type, "is_complete")) {
            f[0] = field();
            ev(json_pack("{s:s, s:s}", "type", "is_complete_reply", "status", "complete"));
        } else if (!strcmp(type, "interrupt") || !strcmp(type, "input_reply")) {
            f[0] = field(); /* stray: skipped, as the protocol says */
        }
        for (int i = 0; i < 5; i++)
            free(f[i]);
        free(type);
        if (exit_after)
            return 0;
    }
    return 0;
}

/* ---------------------------------------------------------------- the kernel */

char fake_self_exe[PATH_MAX];

static int fake_prepare(const char *share_dir, const char *workspace, kworker_spec *spec, char *err,
                        size_t errlen)
{
    (void)share_dir;
    (void)workspace;
    if (kspec_add_arg(spec, fake_self_exe) < 0 || kspec_add_arg(spec, "--fake-worker") < 0) {
        snprintf(err, errlen, "fake backend: argv full");
        return -1;
    }
    spec->kernel_info = json_pack("{s:{s:s}}", "language_info", "name", "fake");
    spec->debug_pipes = 1;
    return 0;
}

const kbackend fake_backend = {.name = "fake", .prepare = fake_prepare};

/* FAKE_KERNEL_SQUAT beside the link (fake_kernel.h): a start takes one of
 * its count and first listens on its own shell port, as another process
 * that took the port between the manager's pick and the kernel's bind. */
static void squat_if_asked(int argc, char **argv, int dirlen)
{
    char marker[PATH_MAX];
    if (snprintf(marker, sizeof marker, "%.*s/%s", dirlen, argv[0], FAKE_KERNEL_SQUAT) >=
        (int)sizeof marker)
        return;
    FILE *f = fopen(marker, "r");
    int left = 0;
    if (!f)
        return;
    if (fscanf(f, "%d", &left) != 1)
        left = 1;
    fclose(f);
    if (left <= 1) {
        unlink(marker);
    } else if ((f = fopen(marker, "w"))) {
        fprintf(f, "%d\n", left - 1);
        fclose(f);
    }
    const char *cf = NULL;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "-f"))
            cf = argv[i + 1];
    jp_connection conn;
    jp_error err;
    if (!cf || jp_connection_read(cf, &conn, &err) != JP_OK || strcmp(conn.transport, "tcp"))
        return;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)conn.ports[JP_SHELL])};
    int fd = socket(AF_INET, SOCK_STREAM, 0); /* kept open: the kernel's bind fails */
    if (fd < 0 || inet_pton(AF_INET, conn.ip, &sa.sin_addr) != 1 ||
        bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 1))
        fprintf(stderr, "fake-kernel: cannot squat port %d: %s\n", conn.ports[JP_SHELL],
                strerror(errno));
}

int fake_kernel_main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", fake_self_exe, sizeof fake_self_exe - 1);
    if (n <= 0)
        return 1;
    fake_self_exe[n] = '\0';
    if (argc > 1 && !strcmp(argv[1], "--fake-worker"))
        return fake_worker();
    if (argc > 1 && !strcmp(argv[1], "--fake-kernel"))
        return kserver_main(argc - 1, argv + 1, &fake_backend);
    /* started by the manager as a language's backend binary: a link named
     * fake-kernel to this binary (fake_kernel_link) */
    const char *base = strrchr(argv[0], '/');
    if (!strcmp(base ? base + 1 : argv[0], FAKE_KERNEL_LINK)) {
        squat_if_asked(argc, argv, base ? (int)(base - argv[0]) : 0);
        return kserver_main(argc, argv, &fake_backend);
    }
    return -1;
}

int fake_log_count(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

int fake_kernel_link(const char *dir, char *out, size_t size)
{
    if ((size_t)snprintf(out, size, "%s/%s", dir, FAKE_KERNEL_LINK) >= size)
        return -1;
    return symlink(fake_self_exe, out);
}

int fake_tmp_dir(char *out, size_t size, const char *prefix)
{
    int n = snprintf(out, size, "/tmp/%sXXXXXX", prefix);
    if (n < 0 || (size_t)n >= size)
        return -1;
    return mkdtemp(out) ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if ((type == FTW_DP ? rmdir(path) : unlink(path)) && errno != ENOENT)
        fprintf(stderr, "fake_tmp_remove: %s: %s\n", path, strerror(errno));
    return 0;
}

void fake_tmp_remove(const char *dir)
{
    if (!dir[0] || getenv("KM_TEST_KEEP_HOME"))
        return;
    nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}
