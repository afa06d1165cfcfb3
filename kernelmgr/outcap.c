/*
 * outcap.c — head + tail ring with a spill file.
 */
#include "kernelmgr/outcap.h"
#include "jp.h"

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
    int spill_fd; /* -1 until overflow */
    int spill_failed;
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

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0)
            return -1;
        p += w;
        len -= (size_t)w;
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
    oc->spill_fd = open(oc->spill_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (oc->spill_fd < 0) {
        oc->spill_failed = 1;
        return -1;
    }
    char *ring = malloc(oc->tail_len ? oc->tail_len : 1);
    if (!ring)
        goto fail;
    ring_copy(oc, ring);
    int rc = write_all(oc->spill_fd, oc->head, oc->head_len) ||
             write_all(oc->spill_fd, ring, oc->tail_len);
    free(ring);
    if (rc)
        goto fail;
    return 0;
fail:
    close(oc->spill_fd);
    oc->spill_fd = -1;
    oc->spill_failed = 1;
    return -1;
}

int outcap_add(outcap *oc, const void *data, size_t len)
{
    const char *d = data;
    int rc = 0;
    int was_truncated = oc->total > oc->cap;
    oc->total += len;
    if (oc->spill_fd >= 0 && write_all(oc->spill_fd, d, len)) {
        close(oc->spill_fd);
        oc->spill_fd = -1;
        oc->spill_failed = 1;
        rc = -1;
    }
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
            /* first overflow: the spill must start with everything before this chunk */
            if (spill_open(oc) == 0) {
                if (write_all(oc->spill_fd, d + h, len - h)) {
                    close(oc->spill_fd);
                    oc->spill_fd = -1;
                    oc->spill_failed = 1;
                    rc = -1;
                }
            } else {
                rc = -1;
            }
            /* the head part of this chunk was already written as part of head */
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

char *outcap_text(const outcap *oc, size_t *kept_len)
{
    size_t hl = oc->head_len, tl = oc->tail_len;
    char marker[512] = "";
    size_t ml = 0;
    size_t skip = 0;
    if (outcap_truncated(oc)) {
        /* cut at character boundaries so the marker does not split a char */
        hl = jp_utf8_complete_prefix(oc->head, hl);
        uint64_t omitted = oc->total - oc->head_len - oc->tail_len;
        const char *sp = outcap_spill(oc);
        ml = (size_t)snprintf(marker, sizeof marker,
                              "\n[... kernelmgr: %llu bytes omitted; complete output: %s ...]\n",
                              (unsigned long long)omitted, sp ? sp : "(spill file unavailable)");
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
    char *out = jp_utf8_sanitize(raw, n, NULL);
    free(raw);
    if (kept_len)
        *kept_len = hl + tl - skip;
    return out;
}
