/*
 * jp_internal.h — helpers shared by the protocol/ sources. Not installed, not
 * part of the API: kernels and the manager include jp.h only.
 */
#ifndef JP_INTERNAL_H
#define JP_INTERNAL_H

#include "jp.h"

/* Fills err (may be NULL) with code and a printf-formatted reason; returns
 * code so callers can write `return jp_error_set(err, JP_ERR_X, "...")`. */
jp_status jp_error_set(jp_error *err, jp_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Clears err to JP_OK / "" (err may be NULL). */
void jp_error_clear(jp_error *err);

/* Makes sure libsodium is initialised (idempotent, thread-safe). Returns 0,
 * or -1 when libsodium cannot start (no entropy source). */
int jp_sodium_ready(void);

/* Like jp_session_decode, but the frames are steal-able: when steal is 1 the
 * data of routing-id and buffer frames is moved into the message (their
 * jp_frame entries are set to NULL/0) instead of copied, so a 64 MiB buffer
 * is not copied twice on receive. The caller still frees the array. */
jp_status jp_session_decode_frames(jp_session *s, jp_frame *frames, size_t n, int steal, jmsg **out,
                                   jp_error *err);

/* Limits of a session, for jp_session_recv's bounded draining. */
size_t jp_session_max_bytes(const jp_session *s);
size_t jp_session_max_frames(const jp_session *s);

#endif /* JP_INTERNAL_H */
