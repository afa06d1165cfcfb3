/*
 * codeexec.h — one execution on one live kernel: send execute_request,
 * collect its outputs (capped), enforce the time limit (interrupt, grace;
 * judged by the kernel's own clock, so a stalled manager never calls a
 * finished cell a timeout), report workspace changes, and build the result
 * JSON of DESIGN.md.
 *
 * Restarting a kernel is the session's job: the outcome says when the kernel
 * must be killed and restarted (state lost) and why.
 */
#ifndef KERNELMGR_CODEEXEC_H
#define KERNELMGR_CODEEXEC_H

#include "kernelmgr/engine/mkclient.h"
#include "kernelmgr/engine/mklaunch.h"
#include "kernelmgr/engine/km.h"

#include <stdatomic.h>

typedef struct codeexec_params {
    const char *session;    /* name, for the result */
    const char *language;   /* the language's name ("python", "bash", ...) */
    int block;              /* index of the block, for events */
    double timeout;         /* seconds until interrupt */
    double grace;           /* seconds after interrupt until the kernel is killed */
    size_t output_cap;      /* bytes kept per stream (and per error output) */
    uint64_t spill_max;     /* bytes of a stream's spill file */
    uint64_t display_max;   /* bytes of rich outputs (results, displays, errors) kept;
                               counts what was accepted, clear_output does not reset it */
    uint64_t *outputs_left; /* the session's outputs/ budget, decreased by what is
                               written (spill files, images); NULL: unlimited */
    const char *outdir;     /* where spill files and images go (created on demand) */
    const char *tag;        /* unique file name prefix, e.g. "0007-python" */
    const char *workspace;
    size_t files_max, scan_max, scan_bytes; /* the file report (fsdiff.h) */
    atomic_int *interrupt_flag;             /* set by another thread to interrupt; may be NULL */
    km_event_fn fn;                         /* live events; may be NULL */
    void *ud;
    /* Each message of another client's request received while this
     * execution waits (a Jupyter frontend's cell on the same kernel): given
     * to other(other_ud, ch, m) (m borrowed), which returns 1 when it is
     * part of another client's cell. May be NULL (such messages are
     * dropped). */
    int (*other)(void *other_ud, jp_channel ch, const jmsg *m);
    void *other_ud;
} codeexec_params;

typedef struct codeexec_outcome {
    int need_restart; /* kill and restart the kernel: its state is gone or stuck */
    int state_lost;   /* the kernel itself reported that its state was lost */
    char reason[512];
    json_t *nb_outputs; /* new: nbformat 4 outputs of this execution (for history) */
    /* seconds from sending the request until the kernel started it, when
     * another client's cell ran on the kernel in between (it was queued in
     * the kernel behind it); else 0 */
    double queued_s;
} codeexec_outcome;

/* new: the result of running code; never NULL unless out of memory. The
 * result's "kernel" member says restarted=false; the session updates it when
 * it restarts the kernel. */
json_t *codeexec_run(kclient *kc, kproc *kp, const codeexec_params *p, const char *code,
                     codeexec_outcome *out);

/* A cell another client runs on a kernel, followed from the kernel's IOPub
 * (the messages whose parent is that client's execute_request): its
 * nbformat outputs, within the same caps as a block of ours (output_cap per
 * stream and per error output, display_max for rich outputs, the same count
 * caps). Nothing is written to disk: images stay in the outputs only.
 * Owned by the caller; one thread at a time. */
typedef struct codeexec_watch codeexec_watch;

/* new (codeexec_watch_destroy); NULL when out of memory. */
codeexec_watch *codeexec_watch_new(size_t output_cap, uint64_t display_max);
/* One IOPub message (type, content borrowed) of the cell. */
void codeexec_watch_iopub(codeexec_watch *w, const char *type, const json_t *content);
/* 1 once the kernel reported idle for the cell. */
int codeexec_watch_idle(const codeexec_watch *w);
/* new: the cell's nbformat outputs so far (the watch keeps its own);
 * *errored 1 when one of them is an error; *count the execution count
 * (-1: unknown). */
json_t *codeexec_watch_outputs(const codeexec_watch *w, int *errored, json_int_t *count);
void codeexec_watch_destroy(codeexec_watch **w);

/* Removes ANSI escape sequences (colour codes in tracebacks) in place. */
void codeexec_strip_ansi(char *s);

#endif
