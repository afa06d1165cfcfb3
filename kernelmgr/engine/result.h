/*
 * result.h — the result JSON of one block (the contract in DESIGN.md) and
 * its readable rendering for a terminal.
 *
 *  {"session","language","status":"ok|error|timeout|killed","execution_count",
 *   "exit_code","stdout","stderr","result","displays","error","files",
 *   "truncated","duration_ms","kernel":{"restarted","state_preserved","reason"}}
 *
 * Additive members (present only when they say something): "images" (files
 * the manager saved from image outputs: [{"path","mime","size"}]) and
 * "files_omitted" (changes beyond the report limit), "history_error" (the
 * session history could not be written: why and where).
 *
 * "truncated" has a member per capped output: "stdout"/"stderr"
 * {"total_bytes","kept_bytes","spill": path|null, "spill_bytes",
 * "spill_truncated": why the spill holds only the start (spill_max,
 * session_outputs_max), "spill_error": why there is no spill (e.g. a full
 * disk, with the path)}, "displays" {"total_bytes","kept_bytes","omitted",
 * "limit"} when rich outputs passed display_max, "images" {"omitted",
 * "reason"} when images were not saved.
 *
 * exit_code: the bash kernel's status of the last command; for Python 0 when
 * ok and 1 on an exception; 124 on timeout, 137 when the kernel was killed.
 */
#ifndef KERNELMGR_RESULT_H
#define KERNELMGR_RESULT_H

#include "kernelmgr/engine/kmerr.h"

#include <jansson.h>
#include <stdio.h>

/* How a block ended: the result's "status". */
typedef enum result_status {
    RESULT_OK,      /* "ok" */
    RESULT_ERROR,   /* "error": the code raised / failed, or the manager refused it */
    RESULT_TIMEOUT, /* "timeout": interrupted at its timeout, state preserved */
    RESULT_KILLED,  /* "killed": its kernel died or was killed; state lost */
} result_status;

/* "ok", "error", "timeout", "killed" */
const char *result_status_name(result_status s);

/* The exit code a status implies: 124 timeout, 137 killed, 1 error, 0 ok. */
int result_status_exit_code(result_status s);

/* Sets r's "status" and, unless ok, its "exit_code" (an error keeps a
 * non-zero exit code the kernel reported). */
void result_set_status(json_t *r, result_status s);

/* new: a result with every member at its neutral value (status "ok"). */
json_t *result_new(const char *session, const char *language);

/* Sets result.kernel. reason may be NULL. */
void result_set_kernel(json_t *r, int restarted, int state_preserved, const char *reason);

/* new: the result's "error" member: exactly {"name","value","traceback"}
 * with traceback a list of strings. traceback is stolen (NULL = []); NULL
 * name/value become "Error"/"". Callers may add the documented extras
 * ("timeout", "value_omitted_bytes"). */
json_t *result_error(const char *name, const char *value, json_t *traceback);

/* 1 when e is a well-formed "error" member (see result_error: the three
 * keys, of the right types, plus only "timeout" (bool) and
 * "value_omitted_bytes" (integer)); else 0 with what is wrong in why. */
int result_error_valid(const json_t *e, km_err *why);

/* Sets status, its exit code and error {name, value, traceback: [value]} (a
 * manager-side failure such as a kernel that would not start). */
void result_set_failure(json_t *r, result_status status, const char *name, const char *value);

/* 1 when the block counts as failed (status other than "ok"). */
int result_failed(const json_t *r);

/* Writes a readable rendering. When streamed is 1, stdout/stderr were already
 * shown live and are not repeated (only a truncation note). */
void result_render(FILE *out, const json_t *r, int streamed);

#endif
