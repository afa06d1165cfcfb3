/*
 * backend.h — what a language backend gives the generic kernel server.
 *
 * The server (kernels/server/) owns everything Jupyter; a backend only says
 * how to start its worker and what kernel_info reports. Each kernel binary's
 * main.c is:   int main(int c, char **v) { return kserver_main(c, v, &my_backend); }
 * The worker speaks the framing of kernels/WORKER_PROTOCOL.md.
 */
#ifndef KERNELS_SERVER_BACKEND_H
#define KERNELS_SERVER_BACKEND_H

#include <jansson.h>
#include <stddef.h>

#define KSPEC_MAX_ARGS 32
#define KSPEC_MAX_ENV 96 /* the backend's few plus kopts.h KOPTS_MAX_ENV */
#define KSPEC_MAX_RO 16

/* Filled by a backend's prepare(); every string is owned by the spec and
 * released by kspec_clear(). */
typedef struct kworker_spec {
    char *argv[KSPEC_MAX_ARGS + 1];        /* NULL-terminated; argv[0] an absolute path */
    char *env[KSPEC_MAX_ENV + 1];          /* extra "NAME=value" entries, NULL-terminated */
    char *ro_paths[KSPEC_MAX_RO + 1];      /* host paths the sandbox must bind read-only
                                              (e.g. the interpreter's prefix), NULL-terminated */
    json_t *kernel_info;                   /* owned: object merged into kernel_info_reply
                                              content: language_info, implementation,
                                              implementation_version, banner, help_links */
    int quiet_start;                       /* 1: the worker starts with fd 2 on /dev/null
                                              and its stderr pipe on fd KSPEC_STDERR_FD,
                                              and moves it back itself once its start-up
                                              chatter is over (bash -i); 0: fd 2 */
    char *zygote_argv[KSPEC_MAX_ARGS + 1]; /* NULL-terminated, may be empty: the
                                         command of a zygote that can fork this
                                         worker in a session sandbox instead of a
                                         cold start (sandbox.h zygote_argv);
                                         only the backend knows one */
    int debug_pipes;                       /* 1: the worker also gets the debug pipes
                                              (fds KSPEC_DEBUG_REQ_FD and
                                              KSPEC_DEBUG_EVT_FD, WORKER_PROTOCOL.md
                                              "Debug pipes"); not with quiet_start */
} kworker_spec;

/* Where a quiet_start worker finds its stderr pipe. */
#define KSPEC_STDERR_FD 5
/* Where a debug_pipes worker finds its debug request and debug event pipes. */
#define KSPEC_DEBUG_REQ_FD 5
#define KSPEC_DEBUG_EVT_FD 6

/* Frees every owned member and zeroes the spec. NULL-safe. */
void kspec_clear(kworker_spec *spec);
/* Append helpers: copy the string; return 0, or -1 when full / out of memory. */
int kspec_add_arg(kworker_spec *spec, const char *arg);
int kspec_add_env(kworker_spec *spec, const char *name, const char *value);
int kspec_add_ro_path(kworker_spec *spec, const char *path);
int kspec_add_zygote_arg(kworker_spec *spec, const char *arg);

typedef struct kbackend {
    const char *name;        /* "bash" | "python": binary name kernel-NAME */
    const char *option_help; /* extra lines for --help, or NULL */

    /* Offered every command-line option the server does not know. Returns the
     * number of argv entries consumed (1 or 2), 0 when unknown, -1 on a bad
     * value (after writing a message to err). */
    int (*option)(int argc, char **argv, char *err, size_t errlen);

    /* Called once after options are parsed, before the first worker start.
     * share_dir: directory of the support files (build/share/kernelmgr, with
     * python/ and bash/ under it). workspace: absolute path of the worker's
     * cwd. Fills spec. Returns 0, or -1 with a message in err (the kernel then
     * exits with status 1 and prints it). */
    int (*prepare)(const char *share_dir, const char *workspace, kworker_spec *spec, char *err,
                   size_t errlen);
} kbackend;

/* The generic kernel's main: parses options, reads the connection file,
 * binds the sockets, runs the event loop. Returns the process exit status. */
int kserver_main(int argc, char **argv, const kbackend *backend);

#endif
