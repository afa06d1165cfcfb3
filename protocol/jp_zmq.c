/*
 * jp_zmq.c — sending and receiving whole Jupyter messages on ZeroMQ sockets.
 */
#include "jp_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static void jp_zmq_free_frame(void *data, void *hint)
{
    (void)hint;
    free(data);
}

jp_status jp_session_send(const jp_session *s, void *zsock, const jmsg *msg, int flags,
                          jp_error *err)
{
    jp_error_clear(err);
    if (!s || !zsock || !msg)
        return jp_error_set(err, JP_ERR_ARG, "session, socket or message is NULL");
    if (flags & ~ZMQ_DONTWAIT)
        return jp_error_set(err, JP_ERR_ARG, "flags must be 0 or ZMQ_DONTWAIT");
    jp_frame *frames = NULL;
    size_t n = 0;
    jp_status st = jp_session_encode(s, msg, &frames, &n, err);
    if (st != JP_OK)
        return st;
    for (size_t i = 0; i < n; i++) {
        zmq_msg_t part;
        /* Zero-copy: libzmq frees the buffer when it is done with it. */
        int rc = frames[i].size ? zmq_msg_init_data(&part, frames[i].data, frames[i].size,
                                                    jp_zmq_free_frame, NULL)
                                : zmq_msg_init(&part);
        if (rc != 0) {
            st = jp_error_set(err, JP_ERR_NOMEM, "zmq_msg_init: %s", zmq_strerror(zmq_errno()));
            goto out;
        }
        if (frames[i].size)
            frames[i].data = NULL; /* owned by part now */
        /* Only the first part can meet the high-water mark: libzmq delivers
         * multipart messages atomically, and once the first part is queued
         * the rest always fits. So DONTWAIT matters for part 0 only and a
         * refusal there leaves nothing half-sent. */
        int pflags = (i == 0 ? flags : 0) | (i + 1 < n ? ZMQ_SNDMORE : 0);
        do {
            rc = zmq_msg_send(&part, zsock, pflags);
        } while (rc < 0 && zmq_errno() == EINTR && i > 0);
        if (rc < 0) {
            int e = zmq_errno();
            zmq_msg_close(&part);
            if (e == EAGAIN && i == 0)
                st = jp_error_set(err, JP_ERR_AGAIN, "socket would block; nothing sent");
            else if (e == EINTR && i == 0)
                st = jp_error_set(err, JP_ERR_AGAIN, "interrupted by a signal; nothing sent");
            else
                st = jp_error_set(err, JP_ERR_ZMQ, "zmq_msg_send (part %zu of %zu): %s", i + 1, n,
                                  zmq_strerror(e));
            goto out;
        }
    }
out:
    jp_frames_free(&frames, n);
    return st;
}

jp_status jp_session_recv(jp_session *s, void *zsock, int flags, jmsg **out, jp_error *err)
{
    jp_error_clear(err);
    if (out)
        *out = NULL;
    if (!s || !zsock || !out)
        return jp_error_set(err, JP_ERR_ARG, "session, socket or out is NULL");
    if (flags & ~ZMQ_DONTWAIT)
        return jp_error_set(err, JP_ERR_ARG, "flags must be 0 or ZMQ_DONTWAIT");

    const size_t max_frames = jp_session_max_frames(s);
    const size_t max_bytes = jp_session_max_bytes(s);
    jp_frame *frames = NULL;
    size_t n = 0, cap = 0, total = 0, parts = 0;
    jp_status st = JP_OK;
    int more = 1;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        int rc = -1;
        /* Later parts are already here (atomic delivery), so only the first
         * receive honours DONTWAIT; EINTR there is retried so a signal never
         * leaves the rest of a message queued in front of the next one. */
        do {
            rc = zmq_msg_recv(&part, zsock, parts == 0 ? flags : 0);
        } while (rc < 0 && zmq_errno() == EINTR && parts > 0);
        if (rc < 0) {
            int e = zmq_errno();
            zmq_msg_close(&part);
            if (parts == 0 && e == EAGAIN)
                st = jp_error_set(err, JP_ERR_AGAIN, "no message waiting");
            else if (parts == 0 && e == EINTR)
                st = jp_error_set(err, JP_ERR_AGAIN, "interrupted by a signal; nothing received");
            else
                st = jp_error_set(err, JP_ERR_ZMQ, "zmq_msg_recv (part %zu): %s", parts + 1,
                                  zmq_strerror(e));
            goto out;
        }
        parts++;
        more = zmq_msg_more(&part);
        size_t size = zmq_msg_size(&part);
        if (st == JP_OK) {
            /* Past a limit: remember why, drop what was stored, and keep
             * draining without storing so the socket stays in sync. */
            if (parts > max_frames)
                st = jp_error_set(err, JP_ERR_TOO_MANY_FRAMES, "message has more than %zu frames",
                                  max_frames);
            else if (size > max_bytes - total)
                st = jp_error_set(err, JP_ERR_TOO_LARGE, "message exceeds %zu bytes", max_bytes);
            if (st != JP_OK) {
                jp_frames_free(&frames, n);
                n = cap = 0;
            }
        }
        if (st == JP_OK) {
            total += size;
            if (n == cap) {
                size_t ncap = cap ? cap * 2 : 16;
                jp_frame *g = realloc(frames, ncap * sizeof *g);
                if (!g) {
                    st = jp_error_set(err, JP_ERR_NOMEM, "out of memory receiving");
                    jp_frames_free(&frames, n);
                    n = cap = 0;
                    zmq_msg_close(&part);
                    continue;
                }
                frames = g;
                cap = ncap;
            }
            frames[n].data = NULL;
            frames[n].size = size;
            if (size && !(frames[n].data = malloc(size))) {
                st = jp_error_set(err, JP_ERR_NOMEM, "out of memory receiving");
                jp_frames_free(&frames, n);
                n = cap = 0;
                zmq_msg_close(&part);
                continue;
            }
            if (size)
                memcpy(frames[n].data, zmq_msg_data(&part), size);
            n++;
        }
        zmq_msg_close(&part);
    }
    if (st == JP_OK)
        st = jp_session_decode_frames(s, frames, n, 1, out, err);
out:
    jp_frames_free(&frames, n);
    return st;
}
