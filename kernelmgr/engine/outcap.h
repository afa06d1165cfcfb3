/*
 * outcap.h — a capped collector for one output stream.
 *
 * Keeps at most `cap` bytes in memory: the first cap/2 bytes (head) and the
 * last cap/2 bytes (tail, a ring). While the total fits, nothing is lost and
 * no file is written. The moment the total first exceeds the cap, everything
 * received so far (still complete: head + ring) is written to the spill file
 * and every later chunk is appended to it, so the spill always holds the
 * complete stream while memory stays bounded whatever a kernel produces.
 *
 * The spill file is bounded too (outcap_set_limits): at most spill_max bytes,
 * and no more than a budget shared by everything a session stores under
 * outputs/. Past either, the spill stops (the file keeps the first bytes of
 * the stream) and outcap_spill_note() says why; a write error (a full disk)
 * removes the partial file and outcap_spill_error() says what failed where.
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

/* Bounds the spill file: at most spill_max bytes, and at most *budget
 * (borrowed, may be NULL: no shared budget), which is decreased by every
 * byte written. budget_name names the shared limit in messages (e.g.
 * "session_outputs_max"; borrowed, static). Call before the first add. */
void outcap_set_limits(outcap *oc, uint64_t spill_max, uint64_t *budget, const char *budget_name);

/* Writes n as "64 MiB", "1.5 KiB" or "100 bytes" into buf (cm_size_format).
 * Returns buf. */
const char *outcap_fmt_size(uint64_t n, char *buf, size_t len);

/* Appends data. Returns 0, or -1 when the spill file cannot be written (the
 * bytes are still counted and the capped view stays correct). */
int outcap_add(outcap *oc, const void *data, size_t len);

uint64_t outcap_total(const outcap *oc);
int outcap_truncated(const outcap *oc);
/* borrowed: the spill path, or NULL when nothing was spilled (or it failed). */
const char *outcap_spill(const outcap *oc);
/* Bytes in the spill file. */
uint64_t outcap_spill_bytes(const outcap *oc);
/* borrowed: why the spill holds only the start of the stream, e.g. "spill
 * truncated at 64 MiB (spill_max)", or NULL when it is complete. */
const char *outcap_spill_note(const outcap *oc);
/* borrowed: why there is no spill file, e.g. "No space left on device
 * (/path)", or NULL. */
const char *outcap_spill_error(const outcap *oc);

/* new (free()): the kept text, valid UTF-8 (sanitised), NUL-terminated. When
 * truncated: head, a marker line naming the omitted byte count and the spill
 * file, then tail. *kept_len (may be NULL) gets the number of stream bytes
 * kept (head + tail, without the marker). NULL only when out of memory. */
char *outcap_text(const outcap *oc, size_t *kept_len);

#endif
