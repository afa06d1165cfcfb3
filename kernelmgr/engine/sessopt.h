/*
 * sessopt.h — the session options as one table: each row declares an
 * option's name (the config key it overrides, whose kmcfg_opts row gives
 * its type, range and help), its fields in km_session_opts, struct session
 * and kmcfg (offsetof), its "unset" value, whether setting it takes the
 * session out of the warm pool, how session.json's "options" holds it, how a
 * fork copies it and how the "ignored on an existing session" warning says
 * it. session.c (the pool test, create, the warnings, fork) and
 * session_store.c (save, load) are loops over it; the few options with
 * checks or shapes of their own (network, workspace, env) keep hooks in
 * their row. The API's and MCP's view of the same options (tiers, schema)
 * is dtier.c's dtier_sessopts, checked against this one by
 * tests/unit/test_km_sessopt.c.
 *
 * Adding a plain session option (on/off, a number, a size) is one row in
 * sessopt.def, from which its fields, its row here, its config key, its API
 * row and its CLI flag are made, and the code that uses it. An option of
 * another shape needs a field in km_session_opts and in session, a row here
 * (with hooks when no type fits), a row in dtier_sessopts, its config key in
 * kmcfg_opts and its CLI flag.
 */
#ifndef KERNELMGR_SESSOPT_H
#define KERNELMGR_SESSOPT_H

#include <jansson.h>
#include <stddef.h>

#include "kernelmgr/engine/km.h"

struct session;

typedef enum km_sotype {
    KM_SO_BOOL,   /* int: -1 unset (the configuration's), 0, 1; on|off in warnings */
    KM_SO_SIZE,   /* unsigned long long bytes: 0 unset; an integer in session.json */
    KM_SO_NUMBER, /* double: set when > 0, 0 unset; a number in session.json */
    KM_SO_STRING, /* const char * in the options (NULL unset), char[s_size] in the
                     session ("" unset), char[] in kmcfg */
    KM_SO_SPECIAL /* the row's hooks do every part */
} km_sotype;

/* Row flags. */
#define KM_SO_POOL_SAME                                                                            \
    1u                      /* set to the configuration's value, still a warm-pool session         \
                               (otherwise any set value makes the session its own) */
#define KM_SO_SAVE_UNSET 2u /* in session.json even when unset (0, "") */
#define KM_SO_CFG_FILL 4u   /* STRING: unset, the session takes the configuration's value */
#define KM_SO_WARN 8u       /* given to an existing session with another value: a warning */
#define KM_SO_NO_FORK 16u   /* a fork does not take it over (workspace: its own) */
#define KM_SO_NO_CONFIG 32u /* no config key of that name (workspace): c_off unused */
#define KM_SO_INT_UNSET 64u /* SPECIAL: its km_session_opts field is an int, -1 unset (network) */

/* A SPECIAL row's hooks (NULL: nothing to do for that part). */
typedef struct km_sessopt_hooks {
    /* 1 when o's value is what the warm pool's sessions have */
    int (*is_default)(const km_manager *m, const km_session_opts *o);
    /* o (NULL: none given) into the new session s; 0, or -1 out of memory */
    int (*create)(const km_manager *m, struct session *s, const km_session_opts *o);
    /* appends to arr the warning when o's value is not s's */
    void (*warn)(const km_manager *m, const struct session *s, const km_session_opts *o,
                 json_t *arr);
    /* s's value into opts (session.json's "options"); 0, or -1 */
    int (*save)(const struct session *s, json_t *opts);
    /* opts' value into s */
    void (*load)(const km_manager *m, struct session *s, const json_t *opts, const char *name);
    /* s's value into o for a fork; a new reference the caller releases after
     * the creation can go in *hold */
    void (*fork)(const struct session *s, km_session_opts *o, json_t **hold);
} km_sessopt_hooks;

typedef struct km_sessopt {
    const char *name; /* the session option, its key in session.json's "options"
                         and the config key it overrides */
    const char *flag; /* the CLI's flag, as warnings name it ("--cpu-time") */
    km_sotype type;
    size_t o_off;                  /* offsetof(km_session_opts, field) */
    size_t s_off;                  /* offsetof(struct session, field) */
    size_t s_size;                 /* sizeof that field */
    size_t c_off;                  /* offsetof(kmcfg, field): the configuration's value */
    unsigned flags;                /* KM_SO_* */
    const char *unit;              /* SIZE, NUMBER: after a number in the warning (" bytes") */
    const char *none;              /* the warning's words when the value in force is unset/0/"" */
    const km_sessopt_hooks *hooks; /* SPECIAL */
} km_sessopt;

/* The rows, terminated by one with name NULL, in the order of the warnings. */
extern const km_sessopt km_sessopts[];

/* borrowed: the row of a session option, or NULL. */
const km_sessopt *km_sessopt_find(const char *name);

/* Every option of o unset. */
void km_sessopt_init(km_session_opts *o);
/* Every option of s unset: the configuration's (a new session, a warm-pool
 * entry, a repaired one). */
void km_sessopt_unset(struct session *s);
/* 1 when every option of o (NULL: none) is what the warm pool's sessions have. */
int km_sessopt_default(const km_manager *m, const km_session_opts *o);
/* o's options (NULL: none) into the new session s. 0, or -1 out of memory. */
int km_sessopt_create(const km_manager *m, struct session *s, const km_session_opts *o);
/* Appends to arr a warning for each option of o that is not s's. */
void km_sessopt_warn(const km_manager *m, const struct session *s, const km_session_opts *o,
                     json_t *arr);
/* s's options into opts (an object). 0, or -1 (a value that is not UTF-8). */
int km_sessopt_save(const struct session *s, json_t *opts);
/* The options of opts (session.json's "options"; NULL: none) into s; a
 * value that is damaged or out of range is the configuration's. name: the
 * session's, for what load says on stderr. */
void km_sessopt_load(const km_manager *m, struct session *s, const json_t *opts, const char *name);
/* s's options into o (km_sessopt_init first) for a fork; *hold (NULL
 * first) gets what the caller releases after the creation. */
void km_sessopt_fork(const struct session *s, km_session_opts *o, json_t **hold);

/* The options of o that are set, as API params into req (an object): the
 * rows of types BOOL, SIZE, NUMBER and STRING (the CLI says the SPECIAL
 * ones, memory's size text and its absolute workspace its own way). */
void km_sessopt_params(const km_session_opts *o, json_t *req);

/* Appends to arr that option opt (value given) was ignored because session
 * sname keeps what kept_fmt formats. */
__attribute__((format(printf, 5, 6))) void km_sessopt_warn_ignored(json_t *arr, const char *sname,
                                                                   const char *opt,
                                                                   const char *given,
                                                                   const char *kept_fmt, ...);

#endif
