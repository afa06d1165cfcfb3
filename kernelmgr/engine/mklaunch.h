/*
 * mklaunch.h — start and stop kernel processes.
 *
 * A kernel is started from an argv whose "{connection_file}" (and
 * "{resource_dir}") placeholders are substituted, as in a Jupyter kernelspec.
 * The child gets its own process group (so a Ctrl-C on the CLI's terminal does
 * not reach it and a kill reaches its helpers), stdin from /dev/null,
 * stdout/stderr to a log file, and no other fd: libzmq's sockets and eventfds
 * survive fork(), and a kernel holding the manager's sockets would keep them
 * alive after the manager closed them.
 */
#ifndef KERNELMGR_MKLAUNCH_H
#define KERNELMGR_MKLAUNCH_H

#include "kernelmgr/engine/kmerr.h"

#include "jp.h"

#include <limits.h>
#include <sys/types.h>

#define KLAUNCH_MAX_ARGS 64

/* The fd number at which a kernel started with a lifeline finds it (the
 * caller adds "--owner-fd 3" to the kernel's argv). */
#define KLAUNCH_OWNER_FD 3

/* How to start one kind of kernel. */
typedef struct klaunch_cmd {
    char *argv[KLAUNCH_MAX_ARGS + 1]; /* owned, NULL-terminated, with placeholders */
    char resource_dir[PATH_MAX];      /* kernelspec directory or "" */
    int interrupt_signal;             /* 1: interrupt with SIGINT; 0: interrupt_request */
    char display_name[128];
    int lifeline_fd; /* > 2: the read end of the owner's lifeline (klaunch_lifeline_open),
                        given to the child as fd KLAUNCH_OWNER_FD; 0: none */
} klaunch_cmd;

void klaunch_cmd_clear(klaunch_cmd *cmd);
/* Appends a copy of arg. 0 or -1 (full / no memory). */
int klaunch_cmd_add(klaunch_cmd *cmd, const char *arg);

/* Finds kernelspec `name` in the Jupyter data paths ($JUPYTER_PATH,
 * ~/.local/share/jupyter, /usr/local/share/jupyter, /usr/share/jupyter) and
 * fills cmd from its kernel.json. 0, or -1 with a reason in err. */
int klaunch_cmd_from_kernelspec(klaunch_cmd *cmd, const char *name, km_err *err);

/* cm_install_exe_dir() (common/cm_install.h) into out (size bytes). 0, or
 * -1 when it does not fit. */
int klaunch_self_dir(char *out, size_t size);

/* The lifeline: one pipe per manager, both ends O_CLOEXEC in the manager,
 * which keeps the write end open for its whole life and never writes. A
 * kernel started with --owner-fd gets the read end and shuts down (killing
 * its sandbox) when it reports EOF/HUP: when every write end is closed,
 * i.e. when the manager process has ended, however it ended (SIGKILL
 * included), from whichever thread it forked. fds[0] read, fds[1] write.
 * 0, or -1 with a reason in err. */
int klaunch_lifeline_open(int fds[2], km_err *err);

/* Owners. Every process that starts kernels (a daemon, a `kernelmgr run`)
 * holds a shared flock on RUN_DIR/owner-PID.lock for its life
 * (klaunch_owner_hold; refcounted within the process), and every kernel it
 * starts gets RUN_DIR/ID.pid: "KPID KSTART OPID OSTART" (kernel and owner
 * pids with their start times in clock ticks since boot, /proc/PID/stat
 * field 22), written before the connection file (KPID 0 until forked).
 * An owner is alive when its lock is held AND its pid's start time is the
 * recorded one: a reused pid is never mistaken for the owner. */

/* Takes the owner lock of this process in run_dir (several managers of one
 * process share it: refcounted, thread-safe). 0, or -1 with err. Every
 * successful call is paired with klaunch_owner_release(run_dir), which
 * removes the lock file with the last reference. */
int klaunch_owner_hold(const char *run_dir, km_err *err);
void klaunch_owner_release(const char *run_dir);

/* Start time of process pid (clock ticks since boot); 0 when it does not
 * exist (or is a zombie). */
unsigned long long klaunch_proc_start(pid_t pid);

/* SIGKILLs pid, its process group and every descendant (found through
 * /proc/PID/task/TID/children, frozen with SIGSTOP first so nothing forks
 * past the walk; at most 4096 processes). For a kernel whose owner died:
 * with --sandbox none its worker has a session of its own and the cell's
 * processes are not in the kernel's group. */
void klaunch_kill_tree(pid_t pid);

/* 1 when process pid is a live owner in run_dir: it holds its owner lock
 * there and (when start != 0) started at clock tick start; when
 * started_before > 0, it also started no later than that wall-clock time.
 * A pid with no lock file (a manager older than owner locks) counts as
 * alive when it exists and passes the start checks. */
int klaunch_owner_alive(const char *run_dir, pid_t pid, unsigned long long start,
                        double started_before);

/* The start-up scan of run_dir: for each ID.pid whose owner is dead, kills
 * the kernel's process group when pid and start time still match (its
 * sandbox dies with it: PDEATHSIG chain) and waits up to 2 s for it to be
 * gone, then removes ID.json, ID.pid, ID.json.history.jsonl and the ipc
 * sockets ID-N. Connection files with no pid file (kernels of an older
 * manager) are removed with their sockets once older than 60 s. Owner
 * lock files of dead owners are removed. Returns the number of kernels
 * killed; problems are reported on stderr (best effort). */
int klaunch_reap_orphans(const char *run_dir);

typedef struct kproc {
    pid_t pid;
    int exited; /* reaped */
    int status; /* wait status once exited */
    char cf_path[PATH_MAX];
    char pid_path[PATH_MAX]; /* RUN_DIR/ID.pid (see klaunch_owner_hold) */
    jp_connection conn;
    int interrupt_signal;
    int term_sent;   /* klaunch_stop_begin sent SIGTERM */
    off_t log_start; /* the log's size when this kernel was started */
} kproc;

/* Chooses where sockets and connection files of kernels live: home/run, or a
 * private directory under /tmp when unix socket paths would be too long.
 * Creates it (0700). 0 or -1 with err. */
int klaunch_run_dir(const char *home, char *out, size_t size, km_err *err);

/* new: writes a fresh connection file run_dir/ID.json (0600; transport "ipc"
 * with sockets run_dir/ID-N, or "tcp" on 127.0.0.1) and starts cmd with its
 * output appended to log_path. The kernel's cwd is run_dir (made absolute),
 * never a workspace: sandboxed code writes there, and a host process with
 * its cwd in it could pick up planted files (empty PATH or LD_LIBRARY_PATH
 * entries, relative imports). It also writes run_dir/ID.pid (the kernel and
 * this owner: see klaunch_owner_hold, which the caller holds). Returns NULL
 * with a reason in err. */
kproc *klaunch_start(const klaunch_cmd *cmd, const char *run_dir, const char *id,
                     const char *transport, const char *log_path, const char *kernel_name,
                     km_err *err);

/* 1 while the process runs; reaps it (non-blocking) when it has exited. */
int klaunch_alive(kproc *kp);

/* 1 when the kernel, on tcp, has ended because a port of its connection file
 * was taken before it could bind it: its log since its start says
 * "Address already in use" (ports are picked free and released, and the
 * kernel binds them a moment later: another process can take one in
 * between). A start on fresh ports then succeeds; no other failure is a
 * reason to start again. */
int klaunch_lost_port_race(kproc *kp, const char *log_path);

/* Signals the kernel's whole process group. */
void klaunch_signal(kproc *kp, int sig);

/* Describes how the kernel ended ("exited with status 1", "killed by signal 9")
 * into buf; returns buf. */
const char *klaunch_describe_exit(const kproc *kp, char *buf, size_t size);

/* Sends SIGTERM to a live kernel's group without waiting, so that several
 * kernels shut down at the same time; klaunch_stop then only waits (it does
 * not signal again). NULL-safe. */
void klaunch_stop_begin(kproc *kp);

/* Waits up to timeout_s for the kernel process to end (woken at its exit
 * through a pidfd, not by polling) and reaps it. 1 when it has ended, 0 on
 * timeout. */
int klaunch_wait_exit(kproc *kp, double timeout_s);

/* Stops the kernel: SIGTERM (unless klaunch_stop_begin sent it), up to grace
 * seconds, then SIGKILL of the group; reaps it, removes its connection file,
 * pid file and ipc sockets; frees it. NULL-safe. */
void klaunch_stop(kproc **kp, double grace);

#endif
