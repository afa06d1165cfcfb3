/*
 * outcap.h — a capped collector for one output stream.
 *
 * Keeps at most `cap` bytes in memory: the first cap/2 bytes (head) and the
 * last cap/2 bytes (tail, a ring). While the total fits, nothing is lost and
 * no file is written. The moment the total first exceeds the cap, everything
 * received so far (still complete: head + ring) is written to the spill file
 * and every later chunk is appended to it, so the spill always holds the
 * complete stream while memory stays bounded whatever a kernel produces.
 */
#ifndef KERNELMGR_OUTCAP_H
#define KERNELMGR_OUTCAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct outcap outcap;

/* new: cap bytes kept (>= 16); spill_path is where the complete stream goes
 * when it overflows (copied; the file is created only then). */
outcap *outcap_new(size_t cap, const char *spill_path);
void outcap_destroy(outcap **oc);

/* Appends data. Returns 0, or -1 when the spill file cannot be written (the
 * bytes are still counted and the capped view stays correct). */
int outcap_add(outcap *oc, const void *data, size_t len);

uint64_t outcap_total(const outcap *oc);
int outcap_truncated(const outcap *oc);
/* borrowed: the spill path, or NULL when nothing was spilled (or it failed). */
const char *outcap_spill(const outcap *oc);

/* new (free()): the kept text, valid UTF-8 (sanitised), NUL-terminated. When
 * truncated: head, a marker line naming the omitted byte count and the spill
 * file, then tail. *kept_len (may be NULL) gets the number of stream bytes
 * kept (head + tail, without the marker). NULL only when out of memory. */
char *outcap_text(const outcap *oc, size_t *kept_len);

#endif
