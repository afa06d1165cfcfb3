/*
 * config.h — the manager's configuration: defaults, the JSON file
 * ($KERNELMGR_HOME/config.json or --config) and validation.
 *
 * Every key is optional; an unknown key or a value of the wrong type/range is
 * refused with the key and the reason, never silently ignored, because a typo
 * in a limit ("memroy") must not leave a sandbox unlimited.
 */
#ifndef KERNELMGR_CONFIG_H
#define KERNELMGR_CONFIG_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernelmgr/engine/netopt.h"
#include "kernelmgr/engine/lang.h"

typedef struct kmcfg {
    km_langs langs;         /* the languages: the built-ins and "kernels" (lang.h) */
    int allow[KM_LANG_MAX]; /* "languages": allowed, by index in langs (default: all) */
    int languages_set;      /* "languages" was given: a language configured later is
                               not allowed unless listed */
    double timeout;         /* "timeout": seconds per execution (default 60) */
    double interrupt_grace; /* "interrupt_grace": seconds after interrupt (default 5) */
    double start_timeout;   /* "start_timeout": kernel start (default 60) */
    uint64_t memory;        /* "memory": bytes, 0 = kernel default */
    int network;            /* "network": KM_NET_OFF (default), KM_NET_ON, KM_NET_ALLOW */
    char python[4096];      /* "python": interpreter path, "" = detected */
    char sandbox[16];       /* "sandbox": "strict" (default) | "none" */
    int session_sandbox;    /* "session_sandbox": a strict session's kernels share one
                               sandbox (mksbx.c); 0: one sandbox per kernel */
    unsigned zygote_forks;  /* "zygote_forks": forks before a zygote is replaced */
    /* the plain session options' configuration values (sessopt.def): cpus
     * (CPU rate cap per sandbox, 0 = none), cpu_time (CPU seconds per block,
     * 0 = none), zygote (later Python kernels of a session sandbox forked by
     * its zygote, sbx_zygote.c), ipython (Python cells through IPython's
     * shell, kipython.py), snapshot_max (bytes of one snapshot) */
#define KM_SO_DEF_BOOL(name, ...) int name;
#define KM_SO_DEF_NUMBER(name, ...) double name;
#define KM_SO_DEF_SIZE(name, ...) uint64_t name;
#include "kernelmgr/engine/sessopt.def"
#undef KM_SO_DEF_BOOL
#undef KM_SO_DEF_NUMBER
#undef KM_SO_DEF_SIZE
    char transport[8];          /* "transport": "ipc" (default) | "tcp" */
    int transport_tcp_exposed;  /* "transport_tcp_exposed": the operator accepts that with
                                   "tcp" any local user can read every kernel's IOPub
                                   (JP_TCP_EXPOSURE); "tcp" is refused without it */
    unsigned pool;              /* "pool": warm sessions kept ready (default 0) */
    double idle_timeout;        /* "idle_timeout": seconds, 0 = never (default 3600) */
    unsigned max_kernels;       /* "max_kernels": live kernels, a safety cap (default: from
                                   the fd limit, kmcfg_auto_max_kernels) */
    uint64_t memory_budget;     /* "memory_budget": bytes the live kernels may use together,
                                   measured (mkslots.c); 0 = auto (kmem_auto_budget) */
    size_t output_cap;          /* "output_cap": bytes kept per stream (default 64 KiB) */
    unsigned files_max;         /* "files_max": changes reported per execution (100) */
    unsigned files_scan_max;    /* "files_scan_max": entries walked (default 50000) */
    uint64_t files_scan_bytes;  /* "files_scan_bytes": bytes a walk holds: paths, link
                                   text, per-entry overhead (fsdiff.h; default 16M) */
    unsigned outputs_keep_runs; /* "outputs_keep_runs": one-shot run outputs kept (20) */
    double outputs_max_age;     /* "outputs_max_age": seconds, 0 = no age limit (7 d) */
    json_t *env;                /* "env": {NAME: "value"} for the code of every session, or NULL.
                                   Owned: replaced by kmcfg_apply_json, released by kmcfg_clear; a
                                   struct copy shares it (copy it with json_deep_copy to keep it). */
    /* Host-side bounds on what sandboxed code can make the manager store */
    uint64_t spill_max;           /* "spill_max": spill file bytes per stream per block (64M) */
    uint64_t display_max;         /* "display_max": rich output bytes per block (16M) */
    uint64_t session_outputs_max; /* "session_outputs_max": outputs/ bytes per session (512M) */
    uint64_t kernel_log_max;      /* "kernel_log_max": a kernel log file's size (1M) */
    uint64_t history_max;         /* "history_max": each history file's size (8M) */
    uint64_t import_max_bytes;    /* "import_max_bytes": bytes of a session archive (1G) */
    unsigned import_max_entries;  /* "import_max_entries": entries of one (100000) */
    double snapshot_interval;     /* "snapshot_interval": cell seconds between automatic
                                     snapshots, 0 = off (default) */
    /* The daemon under load (daemon.c, mkslots.c admission) */
    unsigned daemon_workers;  /* "daemon_workers": request threads, 0 = 2 x cores + 32 */
    unsigned daemon_queue;    /* "daemon_queue": requests waiting for a worker (4096) */
    uint64_t client_buffer;   /* "client_buffer": unsent bytes per connection (8M) */
    double client_timeout;    /* "client_timeout": seconds a client may not read (10) */
    double admission_timeout; /* "admission_timeout": seconds a kernel start waits for a
                                 slot under max_kernels (300) */
    int max_kernels_auto;     /* max_kernels not set: derived from the fd limit (config.c) */
    uint64_t code_max;        /* "code_max": bytes of code per request (16M) */
    /* The HTTP gateway (gateway.h); "http" "" = not served */
    char http[128];                /* "http": "[ADDR:]PORT" */
    char http_token[256];          /* "http_token": "" = generated in HOME/http-token */
    char http_token_file[1024];    /* "http_token_file": a file holding the token (gateway.h) */
    char http_tls_cert[1024];      /* "http_tls_cert": PEM file, with http_tls_key */
    char http_tls_key[1024];       /* "http_tls_key": PEM file */
    char http_origin[512];         /* "http_origin": another allowed WebSocket Origin */
    int http_insecure;             /* "http_insecure": non-loopback without TLS */
    int http_allow_unsafe;         /* "http_allow_unsafe_session_options": the API over HTTP
                                      may relax the sandbox (gwapi.h) */
    uint64_t http_max_body;        /* "http_max_body": request body bytes (1M) */
    uint64_t http_max_message;     /* "http_max_message": WebSocket message bytes (64M) */
    uint64_t http_max_pending;     /* "http_max_pending": bytes a client may leave unread (64M) */
    unsigned http_max_connections; /* "http_max_connections": WebSockets at once (64) */
    double http_rate;              /* "http_rate": messages per second per connection (500) */
    /* Before authentication (gateway.c, gwpeers.h): what a peer without the token may hold */
    unsigned http_max_unauth_per_peer; /* "http_max_unauth_per_peer": per IP address (16) */
    unsigned http_max_unauth;          /* "http_max_unauth": from all peers together (256) */
    unsigned http_header_timeout;      /* "http_header_timeout": seconds for the request line
                                          and headers to arrive (10) */
    char http_host[256];               /* "http_host": a DNS name the gateway answers to besides
                                          its listen address (and localhost on loopback) */
    /* Many machines (docs/MANY_MACHINES.md) */
    char node_id[33]; /* "node_id": this daemon's name behind a balancer ([A-Za-z0-9_]{1,32}):
                         in kernel ids, errors, and create: false by default over HTTP */

    /* "network" KM_NET_ALLOW: the canonical list (netopt.h), else "" */
    char network_allow[KM_NET_ALLOW_MAX];
} kmcfg;

/* The configuration options: one row per key of config.json, the one place
 * its name, type, range, default, field and help are declared (config.c's
 * kmcfg_opts[]); kmcfg_defaults, kmcfg_apply_json, kmcfg_to_json and
 * kmcfg_doc are loops over it. */
typedef enum kmcfg_type {
    KMCFG_BOOL,    /* int: true or false */
    KMCFG_UINT,    /* unsigned: a whole number in [min, max] */
    KMCFG_SECONDS, /* double: a number in [min, max] (seconds, or the row's unit) */
    KMCFG_SIZE,    /* uint64_t: bytes or "64M", in [min, max] */
    KMCFG_STRING,  /* char[size]: a string of at most size - 1 bytes, null = "", then check */
    KMCFG_ENUM,    /* char[size]: values[0] or values[1] */
    KMCFG_SPECIAL, /* a structured key: the row's hooks (struct kmcfg_special) */
} kmcfg_type;

/* Row flags. */
#define KMCFG_F_NONE                                                                               \
    1u                    /* SECONDS: 0 or null = "none" (the row's zero), else in [min, max];     \
                             to_json: null for none */
#define KMCFG_F_TRUNC 2u  /* UINT: a number in range, its fraction dropped (not refused) */
#define KMCFG_F_SECRET 4u /* never in kmcfg_to_json (a token; env values may be credentials) */
#define KMCFG_F_AUTO 8u   /* UINT max_kernels: from the fd limit until given (max_kernels_auto) */
#define KMCFG_F_FIRST 16u /* applied before every other key of the same object */

/* A special key's hooks: its default (NULL: zero), its validation and
 * storing (the error "KEY: reason"), its value for to_json (new; NULL
 * omits the key). */
typedef struct kmcfg_special {
    void (*defaults)(kmcfg *cfg);
    int (*apply)(kmcfg *cfg, const json_t *v, km_err *err);
    json_t *(*to_json)(const kmcfg *cfg);
} kmcfg_special;

typedef struct kmcfg_opt {
    const char *name;
    kmcfg_type type;
    size_t off;       /* offsetof(kmcfg, field); SPECIAL: unused */
    size_t size;      /* sizeof the field */
    double min, max;  /* UINT, SECONDS, SIZE */
    double def;       /* UINT, SECONDS, SIZE, BOOL: the default */
    const char *sdef; /* STRING, ENUM: the default ("" = null); SPECIAL, AUTO: as the docs say it */
    const char *values[2]; /* ENUM: the two words */
    unsigned flags;        /* KMCFG_F_* */
    const char *zero;      /* what 0 (or null) means, for the docs and KMCFG_F_NONE's message */
    const char *unit;      /* SECONDS: the unit in messages and the docs ("seconds", "CPUs") */
    const char *(*check)(const char *s); /* STRING, non-empty: NULL, or the reason it is refused */
    const kmcfg_special *special;        /* SPECIAL */
    const char *help;                    /* one line for the docs, naming the unit */
} kmcfg_opt;

/* The options, terminated by a row with name NULL. */
extern const kmcfg_opt kmcfg_opts[];

/* borrowed: the row of a key, or NULL. */
const kmcfg_opt *kmcfg_opt_find(const char *name);

/* Writes the markdown table of the options (key, default, meaning and
 * range) to f: the docs' configuration table. 0, or -1 on a write error. */
int kmcfg_doc(FILE *f);

/* o's default as the configuration table says it (`"256M"`, `null` (no
 * cap), detected) into buf (n bytes; 96 hold every row's); returns buf.
 * For other docs that name a key's default (dtier_sessopt_doc). */
const char *kmcfg_doc_default(const kmcfg_opt *o, char *buf, size_t n);

/* The default max_kernels: a safety cap, not the memory rule (that is
 * memory_budget): min(KMCFG_MAX_KERNELS_CAP, RLIMIT_NOFILE's hard limit / 2
 * / KMCFG_FDS_PER_KERNEL), at least 2. A kernel holds about 12 of the
 * daemon's file descriptors (its client's five ZeroMQ sockets, their
 * connections and mailboxes, measured: 10-11). */
#define KMCFG_MAX_KERNELS_CAP 1024u
#define KMCFG_FDS_PER_KERNEL 12u
unsigned kmcfg_auto_max_kernels(void);

/* Fills cfg with the defaults (does not release an earlier cfg->env). */
void kmcfg_defaults(kmcfg *cfg);

/* Releases what cfg owns (env). NULL-safe. */
void kmcfg_clear(kmcfg *cfg);

/* Applies a JSON object (borrowed) on top of cfg. Returns 0, or -1 with
 * "KEY: reason" in err; cfg may be partially updated then. */
int kmcfg_apply_json(kmcfg *cfg, const json_t *obj, km_err *err);

/* The largest configuration file read. */
#define KMCFG_FILE_MAX (1u << 20)
/* kmcfg_load_file flags: a missing file is an error; the file is the home's
 * config.json, trusted state (kmhome.h), read only when it is owned by the
 * effective uid and not group- or world-writable. */
#define KMCFG_MUST_EXIST 1u
#define KMCFG_HOME_FILE 2u
/* Reads path (cm_read_regular: no link, no FIFO, at most KMCFG_FILE_MAX
 * bytes) and applies it. Returns 0, or -1 with "PATH: KEY: reason" in err
 * (the file's text is never quoted). */
int kmcfg_load_file(kmcfg *cfg, const char *path, unsigned flags, km_err *err);

/* Parses "512M", "2G", "1048576", "1.5GiB" into bytes. 0 or -1. */
int kmcfg_parse_size(const char *s, uint64_t *out);

/* Index in cfg->langs of a language name or alias, or -1. */
int kmcfg_lang_index(const kmcfg *cfg, const char *name);
/* borrowed: the name of language idx ("python"). */
const char *kmcfg_lang_name(const kmcfg *cfg, int idx);

/* Writes the manager's home into buf and returns buf: $KERNELMGR_HOME, else
 * $XDG_STATE_HOME/kernelmgr, else $HOME/.local/state/kernelmgr (HOME unset:
 * /tmp). Not made absolute. NULL (buf "") when it does not fit in len bytes:
 * a home is never truncated. */
const char *kmcfg_home(char *buf, size_t len);

/* new: the configuration as a JSON object (the keys kmcfg_apply_json takes). */
json_t *kmcfg_to_json(const kmcfg *cfg);

#endif
