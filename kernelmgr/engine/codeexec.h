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

#include "kernelmgr/engine/kclient.h"
#include "kernelmgr/engine/klaunch.h"
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
} codeexec_params;

typedef struct codeexec_outcome {
    int need_restart; /* kill and restart the kernel: its state is gone or stuck */
    int state_lost;   /* the kernel itself reported that its state was lost */
    char reason[512];
    json_t *nb_outputs; /* new: nbformat 4 outputs of this execution (for history) */
} codeexec_outcome;

/* new: the result of running code; never NULL unless out of memory. The
 * result's "kernel" member says restarted=false; the session updates it when
 * it restarts the kernel. */
json_t *codeexec_run(kclient *kc, kproc *kp, const codeexec_params *p, const char *code,
                     codeexec_outcome *out);

/* Removes ANSI escape sequences (colour codes in tracebacks) in place. */
void codeexec_strip_ansi(char *s);

#endif
