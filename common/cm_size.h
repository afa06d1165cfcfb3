/*
 * cm_size.h — the one grammar for sizes in bytes, used by the manager's
 * configuration and options and by every kernel's command line.
 *
 *   SIZE  = DIGITS [ "." DIGITS ] [ " "... ] [ UNIT ]
 *   UNIT  = "B" | ( "K" | "M" | "G" | "T" ) [ "i" ] [ "B" ]      (any case)
 *
 * Every unit is a power of 1024 ("K", "KB" and "KiB" all mean 1024 bytes),
 * so "512", "512K", "2M", "2G", "1.5G", "2 GB" and "2GiB" are sizes. Spaces
 * may separate the number from its unit, nowhere else. A fraction needs a
 * unit larger than a byte and is rounded down to whole bytes. Rejected, with
 * a reason: an empty string, a sign, an exponent or hex ("1e3", "0x10"),
 * "inf"/"nan", an unknown unit, text after the unit, and values above
 * UINT64_MAX (16 EiB - 1).
 */
#ifndef CM_SIZE_H
#define CM_SIZE_H

#include <stddef.h>
#include <stdint.h>

/* Parses s by the grammar above into *out (untouched on failure). 0, or -1
 * with a reason naming the text and what is wrong written to err (errlen
 * bytes; err may be NULL) and errno = EINVAL (ERANGE when too large). */
int cm_size_parse(const char *s, uint64_t *out, char *err, size_t errlen);

/* Writes n for people into buf (len bytes) and returns buf: "512 bytes",
 * "64 KiB", "1.5 GiB" (one decimal when not whole). Whole values from 1 KiB
 * up parse back to n with cm_size_parse. */
const char *cm_size_format(uint64_t n, char *buf, size_t len);

#endif
