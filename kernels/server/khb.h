/*
 * khb.h — the heartbeat channel on its own thread: an echo (zmq_proxy of a
 * ROUTER socket onto itself, as ipykernel does) that keeps answering however
 * busy the main loop is.
 */
#ifndef KERNELS_SERVER_KHB_H
#define KERNELS_SERVER_KHB_H

#include <stddef.h>

/* Largest heartbeat frame accepted (ZMQ_MAXMSGSIZE); bigger ones drop the
 * connection. */
#define KHB_MAX_FRAME 1024

typedef struct khb khb;

/* new: binds endpoint in ctx (borrowed) and starts echoing. NULL with a
 * reason in err when the bind or the thread fails. */
khb *khb_start(void *ctx, const char *endpoint, char *err, size_t errlen);

/* Stops the thread and closes its socket. NULL-safe. */
void khb_stop(khb **hb);

#endif
