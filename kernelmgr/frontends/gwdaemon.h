/*
 * gwdaemon.h — the gateway as the daemon's HTTP frontend: the operations
 * `kernelmgr serve` registers with daemon_http_register() (daemon_http.h),
 * so the service layer starts and stops the gateway without knowing it.
 */
#ifndef KERNELMGR_GWDAEMON_H
#define KERNELMGR_GWDAEMON_H

#include "kernelmgr/service/daemon_http.h"

/* Starts (once per process) and stops the one gateway: in kernelmgr, whose
 * gateway is gateway_none.c, start refuses with how to restart the daemon
 * in kernelmgr-gateway. */
extern const daemon_http_ops gwdaemon_ops;

#endif
