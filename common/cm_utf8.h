/*
 * cm_utf8.h — UTF-8 as every layer checks it: the wire protocol (strings in
 * messages), the manager (outputs cut without splitting a character, file
 * reads), the terminal escaping. Strict: no overlongs, no surrogates,
 * nothing above U+10FFFF. Pure functions, no allocation but
 * cm_utf8_sanitize's result.
 */
#ifndef COMMON_CM_UTF8_H
#define COMMON_CM_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length (1-4) of the valid UTF-8 sequence at buf (len bytes left), with
 * its code point in *cp (may be NULL), or 0 when it is not one: overlong,
 * surrogate, above U+10FFFF, a stray continuation byte or truncated. */
size_t cm_utf8_decode(const void *buf, size_t len, uint32_t *cp);

/* Returns 1 when buf[0..len) is valid UTF-8 (no overlongs, no surrogates,
 * <= U+10FFFF), else 0. NUL bytes are valid. */
int cm_utf8_valid(const void *buf, size_t len);

/* new (free()): a NUL-terminated copy of buf[0..len) where every byte sequence
 * that is not valid UTF-8 is replaced by U+FFFD, and NUL bytes are replaced by
 * U+FFFD too (so the result can become a JSON string). *out_len (may be NULL)
 * gets the length without the NUL. Returns NULL only when out of memory. */
char *cm_utf8_sanitize(const void *buf, size_t len, size_t *out_len);

/* Length of the longest prefix of buf[0..len) that does not end inside a
 * (possibly valid) multi-byte sequence: use it to split a stream into chunks
 * without cutting a character in two. Returns len when buf ends cleanly. */
size_t cm_utf8_complete_prefix(const void *buf, size_t len);

#endif
