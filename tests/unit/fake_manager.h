/*
 * fake_manager.h — a manager on a fresh home whose languages are all the
 * fake kernel (fake_kernel.h), sandbox none: the world the engine's and the
 * daemon's unit tests start from (cmocka's assertions fail the test on any
 * error).
 */
#ifndef TESTS_FAKE_MANAGER_H
#define TESTS_FAKE_MANAGER_H

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/km.h"

#include <jansson.h>
#include <limits.h>

/* Owned by the test; fake_home_open() fills it, fake_home_close() ends it. */
typedef struct fake_home {
    char home[64];       /* /tmp/PREFIXxxxxxx */
    char link[PATH_MAX]; /* HOME/fake-kernel: the backend of every language */
    kmcfg cfg;
    km_manager *m;
} fake_home;

/* A fresh home /tmp/PREFIXxxxxxx (mkdtemp), the fake kernel linked into it,
 * a configuration naming each of langs (NULL-terminated) a language backed
 * by it, and a manager on them. */
void fake_home_open(fake_home *h, const char *prefix, const char *const *langs);
/* The same, with the keys of extra (borrowed; NULL: none) set in the
 * configuration too (e.g. {"transport": "tcp"}). */
void fake_home_open_conf(fake_home *h, const char *prefix, const char *const *langs,
                         json_t *extra);
/* Destroys the manager (if h->m is still set), clears the configuration and
 * removes the home (kept when the environment has KM_TEST_KEEP_HOME). */
void fake_home_close(fake_home *h);

#endif
