/*
 * kserver.h — the generic kernel server's state, shared by its parts (not a
 * public header; backends use backend.h):
 *   kserver.c  startup, sockets, signals, the event loop, shutdown;
 *   kshell.c   messages from clients (shell, control, stdin channels);
 *   kexec.c    the running request: worker events, output, replies, worker
 *              death, interrupts and restarts.
 * Everything runs on the main thread except the heartbeat (khb.c).
 */
#ifndef KERNELS_SERVER_KSERVER_H
#define KERNELS_SERVER_KSERVER_H

#include <stdint.h>

#include "jp.h"
#include "kernels/server/backend.h"
#include "kernels/server/kdbg.h"
#include "kernels/server/khb.h"
#include "kernels/server/khistory.h"
#include "kernels/server/kiopub.h"
#include "kernels/server/knetnote.h"
#include "kernels/server/kopts.h"
#include "kernels/server/kreplyq.h"
#include "kernels/server/kstream.h"
#include "kernels/server/kworker.h"

/* What a worker declared in its "ready" event ("features"), see
 * WORKER_PROTOCOL.md. A worker that declares nothing gets the original
 * protocol. */
#define KFEAT_INTERRUPT 1u    /* "interrupt": an interrupt request precedes each SIGINT */
#define KFEAT_EXEC_OPTIONS 2u /* "execute_options": understands `execute_ext` */
#define KFEAT_DEBUG 4u        /* "debugger": answers debug requests on its debug pipes */
#define KFEAT_SNAPSHOT 8u     /* "snapshot": saves and loads its state (`snapshot`) */

typedef enum kreq_kind {
    KREQ_NONE = 0,
    KREQ_EXECUTE,
    KREQ_COMPLETE,
    KREQ_INSPECT,
    KREQ_IS_COMPLETE,
    KREQ_SNAPSHOT,
} kreq_kind;

/* The channels a request may come on (kshell_msg.channels). */
#define KCH_SHELL 1u
#define KCH_CONTROL 2u
#define KCH_STDIN 4u

/* One Jupyter message type the server answers: the one table (kshell_msgs[]
 * in kshell.c) that the shell, control and stdin loops, the queue and the
 * replies read. A request of kind KREQ_NONE is answered at once, even
 * while code runs (answer); any other waits in the FIFO and goes to the
 * worker one at a time (start). */
struct kserver;
typedef struct kshell_msg kshell_msg;
struct kshell_msg {
    const char *type;  /* the request's msg_type */
    const char *reply; /* the reply's msg_type; NULL: none */
    unsigned channels; /* KCH_* it is accepted on */
    kreq_kind kind;
    const char *what; /* queued: how a lost state's reason names the request */
    /* immediate: answers msg (borrowed) on sock */
    void (*answer)(struct kserver *ks, void *sock, jmsg *msg, const kshell_msg *m);
    /* queued: hands msg (stolen) to the worker, or refuses it */
    void (*start)(struct kserver *ks, jmsg *msg, const kshell_msg *m);
};

/* The table, ended by an entry with a NULL type. */
extern const kshell_msg kshell_msgs[];
/* borrowed: the entry of type accepted on channel (a KCH_* bit), or NULL. */
const kshell_msg *kshell_msg_find(const char *type, unsigned channel);
/* borrowed: the entry of a queued kind (never NULL for one of the table). */
const kshell_msg *kshell_msg_of_kind(kreq_kind kind);

/* A shell request waiting for the worker. */
typedef struct kqueued {
    jmsg *msg;           /* owned */
    const kshell_msg *m; /* its entry */
    struct kqueued *next;
} kqueued;

/* How long an input_request waits for the client's stdin channel to connect. */
#define KSERVER_STDIN_WAIT_NS (10ull * 1000000000ull)
/* How long shell requests wait for a first IOPub subscriber (join_wait_ns). */
#define KSERVER_IOPUB_JOIN_WAIT_NS (3ull * 1000000000ull)

typedef struct kserver {
    const kbackend *backend;
    kopts opts;
    char workspace[4096];
    char share_dir[4096];
    char history_path[4096];
    kworker_spec spec;
    jp_connection conn;
    jp_session *session;
    char session_id[37]; /* header.session of everything we send */
    void *ctx;
    void *shell, *control, *stdin_sock, *iopub_sock;
    khb *hb;
    kiopub *iopub;
    kreplyq *replies; /* shell and control replies a slow client has not taken yet */
    khistory *history;
    json_t *protections; /* sandbox_protections(), for kernel_info */
    int bound;           /* every channel is bound: its ipc files are ours */
    int sigpipe[2];
    int execution_count;
    int quit;

    /* The worker. */
    kworker *worker;
    int worker_ready;         /* sent its "ready" event */
    int start_failures;       /* consecutive deaths before "ready" */
    uint64_t restart_at_ns;   /* when no worker runs: next start attempt */
    uint64_t kill_at_ns;      /* event pipe closed but process alive: kill then */
    uint64_t ready_by_ns;     /* a worker not "ready" by then is killed */
    unsigned worker_features; /* KFEAT_* bits from the worker's "ready" event */
    uint64_t interrupt_gen;   /* number of the last interrupt marker sent */
    int sigint_after_flush;   /* SIGINT waits until the marker left the queue */
    kstream out, err;

    /* The shell request being served by the worker. */
    jmsg *cur; /* owned; NULL when none */
    kreq_kind cur_kind;
    int cur_count; /* execution_count shown for this execution */
    int cur_silent, cur_store, cur_allow_stdin, cur_stop_on_error;
    json_t *cur_error; /* owned: {ename, evalue, traceback} of an error event */
    char cur_started[32];
    uint64_t cur_cpu_ns;  /* sandbox CPU time when it started */
    uint64_t cpu_mark_ns; /* sandbox CPU time at the end of the last
                             execution: the next one's start, so the
                             (possibly costly) query runs once per
                             cell; valid when cpu_mark_set */
    int cpu_mark_set;
    int input_pending; /* an input_request waits for the client */
    /* An input_request the client's stdin channel could not take yet (its
     * connection not established: ROUTER_MANDATORY says EHOSTUNREACH):
     * retried every loop turn until stdin_wait_until, then the input is
     * cancelled (the program sees end-of-file). Owned frames. */
    jp_frame *stdin_wait;
    size_t stdin_wait_n;
    uint64_t stdin_wait_until;
    uint64_t interrupt_deadline_ns; /* kill the worker then; 0 when not interrupting */
    uint64_t interrupt_resend_ns;   /* SIGINT once more then (a first one can
                                       be lost in a fork before exec) */
    const char *kill_reason;        /* static: why we killed the worker, or NULL */
    long long cur_oom_kills;        /* sandbox_oom_kills() when it started (-1: unknown) */
    knetnote netnote;               /* whether the network policy is why the cell failed */
    /* --cpu-time: the execution's CPU budget (kexec.c). While an execute
     * runs with a budget, the sandbox's CPU time is read at cpu_check_ns
     * (0: no check pending); once the budget is used, cpu_hit is set and
     * the execution is interrupted like a timeout. */
    uint64_t cpu_budget_base_ns; /* sandbox CPU time when the execution started */
    uint64_t cpu_check_ns;       /* next reading, monotonic ns; 0: none */
    uint64_t cpu_hit_used_ns;    /* CPU time used when the budget was found spent */
    int cpu_hit;                 /* this execution reached its budget */

    /* State loss. Every worker started gets the next generation number
     * (1 for the first); replies and kernel_info show it. A worker that
     * dies while no execute request runs (idle, between cells, or in a
     * complete/inspect request, or a silent execute) leaves lost_reason set
     * (owned, e.g. "the python worker was killed by signal 9 (Killed) while
     * idle, after cell 3"), and every execute_reply says kernel_restarted /
     * state_preserved false / reason until a non-silent one has said it. */
    uint64_t worker_gen;
    char *lost_reason;

    /* Back-pressure on clients: set while IOPub is backlogged (above its
     * high-water mark), cleared below the low-water mark; while set, no new
     * shell or control request is read (they wait in ZeroMQ's queues). */
    int clients_paused;

    /* The IOPub join wait. A client connects its IOPub subscriber and its
     * shell together, but the subscription can reach us after its first
     * request (ZeroMQ reconnects every 100 ms; a loaded machine): what we
     * publish before it is lost to that client, and one that waits for the
     * request's "idle" (jupyter console) waits forever. So while IOPub has
     * no subscriber, a pending shell request is left unread until one
     * subscribes or join_wait_ns passes; a wait that ran out sets
     * join_waived, cleared by the next subscriber: a client that never
     * subscribes waits once, not at every request. Control and stdin are
     * never held. */
    uint64_t join_wait_ns; /* 0: not waiting */
    int join_waived;

    jmsg *last_parent; /* owned: parent for output that arrives between requests */
    struct kdbg *dbg;  /* owned: debug requests in flight (kdbg.h); NULL until the first */
    int debugger_seen; /* a worker of this kernel declared "debugger" (kernel_info) */
    kqueued *qhead, *qtail;
} kserver;

/* kserver.c */
/* Logs one line to stderr (the kernel log). Rate-limited per format string
 * (a burst of 20, then one line a second; dropped lines are summarised as
 * "N similar messages suppressed"), and nothing is written once the log file
 * reached the cap of kserver_log_set_max() (one last line says so). fmt must
 * be a string literal: its address names the class. */
void kserver_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kserver_log_set_max(uint64_t bytes);
/* The cap kserver_log_set_max() set (other writers of the log honour it). */
uint64_t kserver_log_max(void);
/* Writes the summaries of suppressed lines that are due (called by the loop). */
void kserver_log_tick(void);
/* Publishes on iopub a message of msg_type with content (stolen) and parent
 * (borrowed, may be NULL). */
void kserver_publish(kserver *ks, const char *msg_type, json_t *content, const jmsg *parent);
void kserver_status(kserver *ks, const char *state, const jmsg *parent);
/* Sends a reply of msg_type on sock with content (stolen) and optional
 * metadata (stolen, may be NULL) to the sender of parent. */
void kserver_reply(kserver *ks, void *sock, const char *msg_type, json_t *content, json_t *metadata,
                   const jmsg *parent);
json_t *kserver_kernel_info(kserver *ks);

/* kshell.c */
void kshell_handle(kserver *ks, void *sock, jmsg *msg); /* steals msg */
void kshell_start_next(kserver *ks); /* give the worker the next queued request */
void kshell_abort_queued(kserver *ks, const char *why);
void kshell_receive_all(kserver *ks, void *sock, int max);

/* kexec.c */
void kexec_start_worker(kserver *ks);
void kexec_on_event(void *ks, json_t *ev);
void kexec_flush_streams(kserver *ks, int final);
void kexec_read_output(kserver *ks, kworker_pipe p);
void kexec_drain_output(kserver *ks);
void kexec_worker_gone(kserver *ks); /* the worker exited or was killed */
void kexec_interrupt(kserver *ks);
void kexec_timers(kserver *ks, uint64_t now);

/* Retries a waiting input_request (see stdin_wait); drops it when its
 * request ended or its time is up. */
void kexec_stdin_retry(kserver *ks, uint64_t now);

/* Drops a waiting input_request. */
void kexec_stdin_clear(kserver *ks);
/* Publishes the pending state-loss notice (if any) for the execution that
 * starts now; called by kshell when it starts an execute request. */
void kexec_cell_starts(kserver *ks);
int kexec_send_request(kserver *ks, const char *const *fields, size_t n);

#endif
