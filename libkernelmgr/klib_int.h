/*
 * klib_int.h — what the files of libkernelmgr share (not installed). The
 * public interface is kernelmgr.h; everything here has hidden visibility in
 * the shared library (-fvisibility=hidden and the version script).
 *
 * One file per job: klib_error (the error object), klib_home (the home, the
 * daemon binary, starting a daemon), klib_conn (the connection, the line
 * reader, one call with its events), klib_session (options, sessions,
 * exec), klib_result (the result and file-list accessors), klib_files
 * (files.read/write/list), klib_b64 (base64).
 */
#ifndef LIBKERNELMGR_KLIB_INT_H
#define LIBKERNELMGR_KLIB_INT_H

#include "libkernelmgr/kernelmgr.h"

#include <jansson.h>
#include <pthread.h>

/* The daemon's bound on one line (docs/API.md "Transport and framing"). */
#define KLIB_MAX_LINE (64u << 20)
/* How long kernelmgr_connect waits for a daemon it started. */
#define KLIB_START_SECONDS 45

struct kernelmgr_error {
    int code;     /* kernelmgr_code */
    int rpc_code; /* the daemon's JSON-RPC code, 0 when not the daemon's */
    char *msg;    /* owned */
};

/* Sets *err (when err is not NULL) to a new error; printf-style message.
 * Always returns -1 (for `return klib_fail(...)`). */
int klib_fail(kernelmgr_error **err, int code, int rpc_code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* *err = NULL when err is not NULL. */
void klib_ok(kernelmgr_error **err);

/* ---------------------------------------------------------- klib_home.c */

/* The home as the CLI resolves it (given, else $KERNELMGR_HOME, else
 * $XDG_STATE_HOME/kernelmgr, else $HOME/.local/state/kernelmgr), made
 * absolute against the cwd. New string, or NULL with *err. */
char *klib_home_resolve(const char *given, kernelmgr_error **err);
/* The `kernelmgr` to start: given, else $KERNELMGR_BIN, else
 * KLIB_BINDIR/kernelmgr when it is executable, else the first executable
 * kernelmgr in an absolute entry of $PATH. New string, or NULL with *err. */
char *klib_find_daemon(const char *given, kernelmgr_error **err);
/* Starts `daemon serve` for home, detached, and waits until home's socket
 * sock answers. New connected fd, or -1 with *err. */
int klib_start_daemon(const char *daemon, const char *home, const char *sock,
                      kernelmgr_error **err);

/* ---------------------------------------------------------- klib_conn.c */

/* A line reader with a bounded line length over fd. */
typedef struct klib_reader {
    int fd;
    char *buf; /* owned */
    size_t head, len, cap;
} klib_reader;

/* The next line (NUL-terminated in r's buffer: borrowed until the next
 * call; *n its length), or NULL at EOF / error / a line over KLIB_MAX_LINE
 * (*why says which). Waits without bound. */
char *klib_reader_next(klib_reader *r, size_t *n, const char **why);

struct kernelmgr_client {
    char *home;           /* owned */
    char *sock;           /* owned: home/kernelmgr.sock */
    pthread_mutex_t lock; /* one request at a time on fd */
    int fd;
    long long next_id;
    klib_reader r;
};

/* A connected socket to sock, or -1 (errno). */
int klib_dial(const char *sock);

/* What a call hears while it waits: each event notification's params
 * (borrowed), for the request's own id. */
typedef struct klib_events {
    void (*on_event)(void *ud, const json_t *params);
    void *ud;
} klib_events;

/* One request on c's connection (under its lock): method with params
 * (stolen; NULL = {}). 0 with *result (new), or -1 with *err: the daemon's
 * error (its message, code from data.km_code or the JSON-RPC code) or
 * KERNELMGR_EDAEMON when it could not be talked to. */
int klib_call(kernelmgr_client *c, const char *method, json_t *params, const klib_events *ev,
              json_t **result, kernelmgr_error **err);
/* The same on a connection of its own to sock (for interrupt). */
int klib_call_once(const char *sock, const char *method, json_t *params, json_t **result,
                   kernelmgr_error **err);
/* The kernelmgr_code of a JSON-RPC error object e (borrowed). */
int klib_error_code_of(const json_t *e);

/* -------------------------------------------------------- klib_session.c */

struct kernelmgr_options {
    json_t *obj; /* owned: the options as they are sent */
};

struct kernelmgr_session {
    kernelmgr_client *c; /* borrowed: outlives the session */
    char *name;          /* owned */
    char *workspace;     /* owned, "" when the daemon gave none */
    int created;
    json_t *warnings; /* owned: array of strings */
};

/* {"session": name} (new), or NULL when out of memory. */
json_t *klib_session_params(const kernelmgr_session *s);

/* --------------------------------------------------------- klib_result.c */

struct kernelmgr_result {
    json_t *root;   /* owned: the exec response's result */
    json_t *blocks; /* borrowed from root: array of block results */
    char *json;     /* owned: root as the daemon sent it, compact text */
};

/* A result over root (stolen): an exec response ({"results": [...]}) or,
 * with one_block, a single block's result. NULL (root freed) when it does
 * not have that shape, with *err. */
kernelmgr_result *klib_result_new(json_t *root, int one_block, kernelmgr_error **err);

struct kernelmgr_filelist {
    json_t *root;  /* owned */
    json_t *files; /* borrowed from root */
    char *json;    /* owned: root as compact text */
};

/* ----------------------------------------------------------- klib_b64.c */

/* Base64 (RFC 4648, padded) of n bytes: new NUL-terminated string, or NULL
 * when out of memory. */
char *klib_b64_encode(const void *data, size_t n);
/* Decodes n characters of base64 s (padding required, whitespace refused)
 * into out (room for n / 4 * 3 bytes); the length, or -1 when s is not
 * valid base64. */
long long klib_b64_decode(const char *s, size_t n, unsigned char *out);

#endif
