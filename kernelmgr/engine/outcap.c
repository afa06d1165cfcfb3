/*
 * outcap.c — head + tail ring with a spill file.
 */
#include "kernelmgr/engine/outcap.h"
#include "common/cm_utf8.h"
#include "common/cm_io.h"
#include "common/cm_size.h"
#include "jp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct outcap {
    size_t cap, head_cap, tail_cap;
    char *head;
    size_t head_len;
    char *tail; /* ring of tail_cap bytes */
    size_t tail_pos, tail_len;
    uint64_t total;
    char *spill_path;
    int spill_fd; /* -1 until overflow, and again once the spill stopped */
    int spill_failed;
    uint64_t spill_max;      /* bytes the spill file may hold */
    uint64_t spill_bytes;    /* bytes written to it */
    uint64_t *budget;        /* shared, borrowed; NULL: none */
    const char *budget_name; /* static */
    char note[160];          /* why the spill stopped early ("" : it did not) */
    char error[512];         /* why the spill failed ("" : it did not) */
};

outcap *outcap_new(size_t cap, const char *spill_path)
{
    if (cap < 16)
        cap = 16;
    outcap *oc = calloc(1, sizeof *oc);
    if (!oc)
        return NULL;
    oc->cap = cap;
    oc->head_cap = cap / 2;
    oc->tail_cap = cap - oc->head_cap;
    oc->head = malloc(oc->head_cap);
    oc->tail = malloc(oc->tail_cap);
    oc->spill_path = spill_path ? strdup(spill_path) : NULL;
    oc->spill_fd = -1;
    oc->spill_max = UINT64_MAX;
    if (!oc->head || !oc->tail || (spill_path && !oc->spill_path)) {
        outcap_destroy(&oc);
        return NULL;
    }
    return oc;
}

void outcap_destroy(outcap **p)
{
    if (!p || !*p)
        return;
    outcap *oc = *p;
    if (oc->spill_fd >= 0)
        close(oc->spill_fd);
    free(oc->head);
    free(oc->tail);
    free(oc->spill_path);
    free(oc);
    *p = NULL;
}

void outcap_set_limits(outcap *oc, uint64_t spill_max, uint64_t *budget, const char *budget_name)
{
    oc->spill_max = spill_max;
    oc->budget = budget;
    oc->budget_name = budget_name ? budget_name : "the session's output limit";
}

const char *outcap_fmt_size(uint64_t n, char *buf, size_t len)
{
    return cm_size_format(n, buf, len);
}

static void spill_fail(outcap *oc, int err)
{
    snprintf(oc->error, sizeof oc->error, "%s (%s)", strerror(err), oc->spill_path);
    if (oc->spill_fd >= 0)
        close(oc->spill_fd);
    oc->spill_fd = -1;
    oc->spill_failed = 1;
    /* a partial file is of no use and holds space a full disk needs */
    if (oc->spill_path)
        unlink(oc->spill_path);
    if (oc->budget)
        *oc->budget += oc->spill_bytes;
    oc->spill_bytes = 0;
}

/* Appends to the open spill within its limits; past them the spill stops
 * for good (the file keeps what it has) and note says why. */
static int spill_write(outcap *oc, const char *d, size_t len)
{
    if (oc->spill_fd < 0)
        return oc->spill_failed ? -1 : 0;
    uint64_t room = oc->spill_max - oc->spill_bytes;
    const char *why = "spill_max";
    uint64_t limit = oc->spill_max;
    if (oc->budget && *oc->budget < room) {
        room = *oc->budget;
        why = oc->budget_name;
        limit = oc->spill_bytes + room;
    }
    size_t n = len < room ? len : (size_t)room;
    if (n && cm_write_all(oc->spill_fd, d, n)) {
        spill_fail(oc, errno);
        return -1;
    }
    oc->spill_bytes += n;
    if (oc->budget)
        *oc->budget -= n;
    if (n < len) {
        char sz[32];
        outcap_fmt_size(limit, sz, sizeof sz);
        if (why == oc->budget_name)
            snprintf(oc->note, sizeof oc->note,
                     "spill truncated at %s: the session's outputs reached their limit (%s)", sz,
                     why);
        else
            snprintf(oc->note, sizeof oc->note, "spill truncated at %s (%s)", sz, why);
        close(oc->spill_fd);
        oc->spill_fd = -1;
    }
    return 0;
}

static void ring_add(outcap *oc, const char *data, size_t len)
{
    if (len >= oc->tail_cap) {
        memcpy(oc->tail, data + len - oc->tail_cap, oc->tail_cap);
        oc->tail_pos = 0;
        oc->tail_len = oc->tail_cap;
        return;
    }
    size_t first = oc->tail_cap - oc->tail_pos;
    if (first > len)
        first = len;
    memcpy(oc->tail + oc->tail_pos, data, first);
    memcpy(oc->tail, data + first, len - first);
    oc->tail_pos = (oc->tail_pos + len) % oc->tail_cap;
    oc->tail_len = oc->tail_len + len > oc->tail_cap ? oc->tail_cap : oc->tail_len + len;
}

/* Copies the ring in order into out (tail_len bytes). */
static void ring_copy(const outcap *oc, char *out)
{
    size_t start = (oc->tail_pos + oc->tail_cap - oc->tail_len) % oc->tail_cap;
    size_t first = oc->tail_cap - start;
    if (first > oc->tail_len)
        first = oc->tail_len;
    memcpy(out, oc->tail + start, first);
    memcpy(out + first, oc->tail, oc->tail_len - first);
}

static int spill_open(outcap *oc)
{
    if (!oc->spill_path || oc->spill_failed)
        return -1;
    /* no link written through, no FIFO in its place waited on */
    oc->spill_fd = open(oc->spill_path,
                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (oc->spill_fd < 0) {
        spill_fail(oc, errno);
        return -1;
    }
    char *ring = malloc(oc->tail_len ? oc->tail_len : 1);
    if (!ring) {
        spill_fail(oc, ENOMEM);
        return -1;
    }
    ring_copy(oc, ring);
    int rc = spill_write(oc, oc->head, oc->head_len);
    if (rc == 0)
        rc = spill_write(oc, ring, oc->tail_len);
    free(ring);
    return rc;
}

int outcap_add(outcap *oc, const void *data, size_t len)
{
    const char *d = data;
    int rc = 0;
    int was_truncated = oc->total > oc->cap;
    oc->total += len;
    if (oc->spill_fd >= 0 && spill_write(oc, d, len))
        rc = -1;
    /* fill the head first; the rest goes to the ring */
    size_t h = 0;
    if (oc->head_len < oc->head_cap) {
        h = oc->head_cap - oc->head_len;
        if (h > len)
            h = len;
        memcpy(oc->head + oc->head_len, d, h);
        oc->head_len += h;
    }
    if (len > h) {
        if (!was_truncated && oc->total > oc->cap) {
            /* first overflow: the spill must start with everything before this chunk
             * (the head part of this chunk was already copied into head) */
            if (spill_open(oc) == 0)
                rc = spill_write(oc, d + h, len - h);
            else
                rc = -1;
        }
        ring_add(oc, d + h, len - h);
    }
    return rc;
}

uint64_t outcap_total(const outcap *oc)
{
    return oc->total;
}

int outcap_truncated(const outcap *oc)
{
    return oc->total > oc->cap;
}

const char *outcap_spill(const outcap *oc)
{
    return (outcap_truncated(oc) && !oc->spill_failed) ? oc->spill_path : NULL;
}

uint64_t outcap_spill_bytes(const outcap *oc)
{
    return oc->spill_bytes;
}

const char *outcap_spill_note(const outcap *oc)
{
    return oc->note[0] && !oc->spill_failed ? oc->note : NULL;
}

const char *outcap_spill_error(const outcap *oc)
{
    return oc->error[0] ? oc->error : NULL;
}

char *outcap_text(const outcap *oc, size_t *kept_len)
{
    size_t hl = oc->head_len, tl = oc->tail_len;
    char marker[1024] = "";
    size_t ml = 0;
    size_t skip = 0;
    if (outcap_truncated(oc)) {
        /* cut at character boundaries so the marker does not split a char */
        hl = cm_utf8_complete_prefix(oc->head, hl);
        uint64_t omitted = oc->total - oc->head_len - oc->tail_len;
        const char *sp = outcap_spill(oc);
        const char *note = outcap_spill_note(oc);
        const char *serr = outcap_spill_error(oc);
        if (sp && note)
            ml = (size_t)snprintf(marker, sizeof marker,
                                  "\n[... kernelmgr: %llu bytes omitted; the first %llu bytes of "
                                  "the output are in %s (%s) ...]\n",
                                  (unsigned long long)omitted, (unsigned long long)oc->spill_bytes,
                                  sp, note);
        else if (sp)
            ml =
                (size_t)snprintf(marker, sizeof marker,
                                 "\n[... kernelmgr: %llu bytes omitted; complete output: %s ...]\n",
                                 (unsigned long long)omitted, sp);
        else
            ml = (size_t)snprintf(marker, sizeof marker,
                                  "\n[... kernelmgr: %llu bytes omitted; no spill file: %s ...]\n",
                                  (unsigned long long)omitted,
                                  serr ? serr : "spill file unavailable");
        if (ml >= sizeof marker)
            ml = sizeof marker - 1;
    }
    char *raw = malloc(hl + ml + tl + 1);
    if (!raw)
        return NULL;
    memcpy(raw, oc->head, hl);
    memcpy(raw + hl, marker, ml);
    ring_copy(oc, raw + hl + ml);
    if (ml) {
        /* drop continuation bytes at the start of the tail */
        while (skip < 3 && skip < tl && ((unsigned char)raw[hl + ml + skip] & 0xC0) == 0x80)
            skip++;
        memmove(raw + hl + ml, raw + hl + ml + skip, tl - skip);
    }
    size_t n = hl + ml + tl - skip;
    char *out = cm_utf8_sanitize(raw, n, NULL);
    free(raw);
    if (kept_len)
        *kept_len = hl + tl - skip;
    return out;
}
