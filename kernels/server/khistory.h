/*
 * khistory.h — the execution history behind history_request: every input
 * stored with store_history, kept in memory and appended to a JSON-lines file
 * beside the connection file so that later kernels (new sessions) see it.
 */
#ifndef KERNELS_SERVER_KHISTORY_H
#define KERNELS_SERVER_KHISTORY_H

#include <jansson.h>
#include <stdint.h>

typedef struct khistory khistory;

/* new: loads path (missing is fine; unreadable lines are skipped, an
 * incomplete last line is cut off the file) and starts a new session
 * numbered one past the highest stored. path NULL keeps the history in
 * memory only. The file never grows past max bytes (at least 4096): when an
 * append would pass it, the oldest entries go (from memory too) and the
 * newest that fit in max/2 are rewritten atomically (temp + rename). An
 * input whose record alone exceeds max/2 is kept in memory only. NULL when
 * out of memory. */
khistory *khistory_open(const char *path, uint64_t max);
void khistory_destroy(khistory **h);

/* The session number of this kernel run (1-based). */
int khistory_session(const khistory *h);

/* Records input number line of this session. 0, or -1 (memory). A failure to
 * append to the file is logged once and otherwise ignored. */
int khistory_add(khistory *h, int line, const char *input);

/* new: the "history" list of a history_reply for request content (borrowed):
 * hist_access_type "tail" (n), "range" (session, start, stop), "search"
 * (pattern as a glob, n, unique); output true gives [input, null] pairs. */
json_t *khistory_query(const khistory *h, const json_t *content);

/* Removes the history files that outlived their connection files in the
 * directory of path (this kernel's own history file, which is kept): a
 * Jupyter client makes a connection file per kernel and removes it after
 * the kernel ends, so each kernel it started would leave its history file
 * behind in the runtime directory. Only regular files of this user named
 * NAME.history.jsonl whose NAME is gone, empty or starting as a record of
 * ours, are removed. Called as a kernel ends: off the start path, and every
 * ended kernel's file goes at the next end. */
void khistory_sweep(const char *path);

#endif
