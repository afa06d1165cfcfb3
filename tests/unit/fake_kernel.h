/*
 * fake_kernel.h — the real kernel server in front of a fake worker, for unit
 * tests that need a kernel but not Python or Bash (xeus' mock interpreter).
 *
 * A test binary plays up to three parts; main() first calls
 * fake_kernel_main(), which runs the part argv asks for:
 *   --fake-kernel ARGS   kserver_main(ARGS) with fake_backend (the kernel);
 *   --fake-worker        the worker of kernels/WORKER_PROTOCOL.md;
 *   argv[0] named fake-kernel (a symlink made by fake_kernel_link): the
 *                        kernel, as the manager starts a language's backend
 *                        binary ({"kernels": {"fake": {"backend": PATH}}}).
 * It returns the part's exit status, or -1 when the binary is the tests.
 *
 * The worker runs each line of a cell's code as one command:
 *   out TEXT / err TEXT   TEXT and a newline on stdout / stderr
 *   stream TEXT           a "stream" event (stdout)
 *   result TEXT           an execute_result with text/plain TEXT
 *   fail                  an error event (FakeError), done with status error
 *   die N                 exit(N) at once, mid-cell
 *   exit-after            answer the cell, then exit(0): a death between cells
 *   done-exit             send done, then _exit(0) at once
 *   pid                   an execute_result with the worker's pid
 *   wait                  wait for an interrupt announcement, then report
 *                         KeyboardInterrupt (exit_code 130)
 *   hang                  ignore everything until killed
 * Anything else is ignored. It declares the "interrupt" and "debugger"
 * features: a process of its own answers the debug pipes (fds 5 and 6) by
 * echoing each request (and a "crash" request kills the worker).
 */
#ifndef TESTS_FAKE_KERNEL_H
#define TESTS_FAKE_KERNEL_H

#include <limits.h>
#include <stddef.h>

#include "kernels/server/backend.h"

#define FAKE_KERNEL_LINK "fake-kernel"
/* A file of this name beside the link, holding a count N (none: 1): the
 * next N starts of the link (each takes one; the last removes the file)
 * listen on their own tcp shell port first, so their bind fails with
 * "Address already in use" — a port another process took between the
 * manager's pick and the kernel's bind. */
#define FAKE_KERNEL_SQUAT "squat-next-start"

/* This binary's path (set by fake_kernel_main). */
extern char fake_self_exe[PATH_MAX];
extern const kbackend fake_backend;

int fake_kernel_main(int argc, char **argv);
int fake_worker(void);
/* Lines of the kernel log at path that contain needle (0 when it cannot be
 * read). Lines over 2047 bytes count once per piece. */
int fake_log_count(const char *path, const char *needle);
/* Creates DIR/fake-kernel, a symlink to this binary; its path in out. 0 or -1. */
int fake_kernel_link(const char *dir, char *out, size_t size);
/* A fresh directory /tmp/PREFIXxxxxxx (mkdtemp), a test's home, into out.
 * 0 or -1. */
int fake_tmp_dir(char *out, size_t size, const char *prefix);
/* Removes dir and everything below it (symlinks removed, not followed),
 * unless KM_TEST_KEEP_HOME is set (a failing test's home kept to read). */
void fake_tmp_remove(const char *dir);

#endif
