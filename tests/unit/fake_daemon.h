/*
 * fake_daemon.h — a real daemon (daemon_serve, what `kernelmgr serve` runs
 * after its gateway check) on a test's home, in a child of its own, its one
 * language the fake kernel (fake_kernel.h), sandbox none: the commands and
 * the MCP server of a test then talk to it as to any daemon.
 */
#ifndef TESTS_FAKE_DAEMON_H
#define TESTS_FAKE_DAEMON_H

#include <stddef.h>
#include <sys/types.h>

#include <jansson.h>

#include "kernelmgr/service/daemon_http.h"

/* Links the fake kernel into home (its path in link) and writes
 * HOME/config.json: language "fake" backed by it, sandbox none, and the
 * keys of extra (borrowed; NULL: none). */
void fake_daemon_config(const char *home, char *link, size_t size, json_t *extra);

/* Starts the daemon on home (configured by fake_daemon_config; its output
 * in HOME/daemon.test.log), its HTTP gateway's operations http (NULL: none,
 * as in the plain kernelmgr binary), and returns its pid once it answers. */
pid_t fake_daemon_start(const char *home, const daemon_http_ops *http);

/* `kernelmgr serve --stop` on home, then waits: the daemon must end with
 * status 0. */
void fake_daemon_stop(const char *home, pid_t pid);

#endif
