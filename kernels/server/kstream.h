/*
 * kstream.h — coalescing of one output pipe (stdout or stderr of the worker)
 * into Jupyter `stream` messages: read what is there, publish it when enough
 * has accumulated or when the oldest unpublished byte is ~50 ms old, and
 * never split a UTF-8 character across two messages.
 */
#ifndef KERNELS_SERVER_KSTREAM_H
#define KERNELS_SERVER_KSTREAM_H

#include <stddef.h>
#include <stdint.h>

#define KSTREAM_CHUNK (64u << 10)    /* publish once this much is buffered */
#define KSTREAM_DELAY_NS 50000000ull /* or once the oldest byte is this old */

typedef struct kstream {
    const char *name; /* "stdout" | "stderr" (static) */
    char *buf;        /* owned, KSTREAM_CHUNK + 4 bytes */
    size_t len;
    uint64_t first_ns; /* monotonic time the oldest buffered byte arrived */
} kstream;

/* 0, or -1 when out of memory. */
int kstream_init(kstream *s, const char *name);
void kstream_clear(kstream *s);

/* Reads once from fd (non-blocking) into the free space. Returns the number
 * of bytes read, 0 at end of file, -1 when nothing is available (EAGAIN) or
 * the buffer is full, -2 on a read error. */
long kstream_read(kstream *s, int fd, uint64_t now_ns);

/* 1 when the buffer should be published now: it is full, or its oldest byte
 * is older than KSTREAM_DELAY_NS. */
int kstream_due(const kstream *s, uint64_t now_ns);

/* Monotonic time at which the buffer becomes due, or 0 when it is empty. */
uint64_t kstream_deadline(const kstream *s);

/* new (free()): the publishable text, with invalid UTF-8 replaced, removed
 * from the buffer; NULL when there is nothing to publish. Unless final, an
 * incomplete multi-byte character at the end stays buffered for the next
 * read. */
char *kstream_take(kstream *s, int final, uint64_t now_ns);

#endif
