/*
 * export.h — a session's history as an nbformat 4 notebook.
 *
 * Cells are the executed blocks in order with their outputs (streams, results,
 * displays including images, errors). A cell whose result never came (its
 * manager was killed while it ran) has an error output saying so and
 * metadata.kernelmgr.status "unknown". A history line that cannot be read
 * is never skipped silently: a markdown cell marks its place, and
 * metadata.kernelmgr.warnings ("export: skipped N unreadable history
 * record(s) (line 7)") and .unreadable_records (line numbers) say so. Every cell's metadata says
 * its language
 * ({"kernelmgr": {"language": "bash"}}).
 *
 * Which kernel re-runs it (metadata.kernelspec), by the language table
 * (lang.h):
 *  - a session of one language other than python: that language's kernel
 *    (kernelmgr-bash; a kernelspec language's kernelspec), cells as they are.
 *    One shell runs them all, so variables and cwd carry over as they did.
 *  - otherwise python3 (ipykernel), or the kernel_name asked for. Cells of
 *    another language are written with its cell magic ("%%bash" cells, each
 *    in its own bash process: workspace files carry over, shell variables
 *    do not; metadata.kernelmgr.warnings says so, naming the language and
 *    the count). A language without a cell magic in a Python notebook, or
 *    any other language in a non-Python notebook, is refused (*bad_request)
 *    naming the language and the count: never dropped silently.
 */
#ifndef KERNELMGR_EXPORT_H
#define KERNELMGR_EXPORT_H

#include "kernelmgr/engine/kmerr.h"

/* The largest history.jsonl an export reads (history_max keeps it smaller). */
#define EXPORT_HISTORY_MAX (1u << 30)

#include "kernelmgr/engine/lang.h"

#include <jansson.h>
#include <stddef.h>

#define EXPORT_PYTHON_KERNEL "kernelmgr-python"

/* new: the notebook of session_dir/history.jsonl, its cells' languages
 * looked up in langs (borrowed; NULL = the built-ins); kernel_name (NULL =
 * chosen as above) goes to metadata.kernelspec. NULL with err on failure, e.g.
 * kernelmgr-bash asked for a session with Python cells (*bad_request set to
 * 1 then; 0 for I/O errors). Caveats for the
 * chosen kernel are in metadata.kernelmgr.warnings (array of strings). */
json_t *export_notebook(const char *session_dir, const char *session_name, const km_langs *langs,
                        const char *kernel_name, int *bad_request, km_err *err);

/* This process's manager id (random, per process; borrowed): written in
 * "started" history records, so export tells a cell still running in this
 * manager from one whose manager stopped while it ran. */
const char *export_manager_id(void);

/* Splits text into nbformat's list of lines (each keeping its "\n"). new. */
json_t *export_lines(const char *text);

#endif
