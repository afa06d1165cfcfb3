/*
 * klaunch.h — start and stop kernel processes.
 *
 * A kernel is started from an argv whose "{connection_file}" (and
 * "{resource_dir}") placeholders are substituted, as in a Jupyter kernelspec.
 * The child gets its own process group (so a Ctrl-C on the CLI's terminal does
 * not reach it and a kill reaches its helpers), stdin from /dev/null,
 * stdout/stderr to a log file, and no other fd: libzmq's sockets and eventfds
 * survive fork(), and a kernel holding the manager's sockets would keep them
 * alive after the manager closed them.
 */
#ifndef KERNELMGR_KLAUNCH_H
#define KERNELMGR_KLAUNCH_H

#include "jp.h"

#include <limits.h>
#include <sys/types.h>

#define KLAUNCH_MAX_ARGS 64

/* How to start one kind of kernel. */
typedef struct klaunch_cmd {
    char *argv[KLAUNCH_MAX_ARGS + 1]; /* owned, NULL-terminated, with placeholders */
    char resource_dir[PATH_MAX];      /* kernelspec directory or "" */
    int interrupt_signal;             /* 1: interrupt with SIGINT; 0: interrupt_request */
    char display_name[128];
} klaunch_cmd;

void klaunch_cmd_clear(klaunch_cmd *cmd);
/* Appends a copy of arg. 0 or -1 (full / no memory). */
int klaunch_cmd_add(klaunch_cmd *cmd, const char *arg);

/* Finds kernelspec `name` in the Jupyter data paths ($JUPYTER_PATH,
 * ~/.local/share/jupyter, /usr/local/share/jupyter, /usr/share/jupyter) and
 * fills cmd from its kernel.json. 0, or -1 with a reason in err. */
int klaunch_cmd_from_kernelspec(klaunch_cmd *cmd, const char *name, char *err, size_t errlen);

/* Directory of the running executable (for build/kernel-*). 0 or -1. */
int klaunch_self_dir(char *out, size_t size);

typedef struct kproc {
    pid_t pid;
    int exited; /* reaped */
    int status; /* wait status once exited */
    char cf_path[PATH_MAX];
    jp_connection conn;
    int interrupt_signal;
} kproc;

/* Chooses where sockets and connection files of kernels live: home/run, or a
 * private directory under /tmp when unix socket paths would be too long.
 * Creates it (0700). 0 or -1 with err. */
int klaunch_run_dir(const char *home, char *out, size_t size, char *err, size_t errlen);

/* new: writes a fresh connection file run_dir/ID.json (0600; transport "ipc"
 * with sockets run_dir/ID-N, or "tcp" on 127.0.0.1) and starts cmd with its
 * output appended to log_path. The kernel's cwd is run_dir (made absolute),
 * never a workspace: sandboxed code writes there, and a host process with
 * its cwd in it could pick up planted files (empty PATH or LD_LIBRARY_PATH
 * entries, relative imports). Returns NULL with a reason in err. */
kproc *klaunch_start(const klaunch_cmd *cmd, const char *run_dir, const char *id,
                     const char *transport, const char *log_path, const char *kernel_name,
                     char *err, size_t errlen);

/* 1 while the process runs; reaps it (non-blocking) when it has exited. */
int klaunch_alive(kproc *kp);

/* Signals the kernel's whole process group. */
void klaunch_signal(kproc *kp, int sig);

/* Describes how the kernel ended ("exited with status 1", "killed by signal 9")
 * into buf; returns buf. */
const char *klaunch_describe_exit(const kproc *kp, char *buf, size_t size);

/* Stops the kernel: SIGTERM, up to grace seconds, then SIGKILL of the group;
 * reaps it, removes its connection file and ipc sockets; frees it. NULL-safe. */
void klaunch_stop(kproc **kp, double grace);

#endif
