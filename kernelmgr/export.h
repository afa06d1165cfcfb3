/*
 * export.h — a session's history as an nbformat 4 notebook.
 *
 * Cells are the executed blocks in order with their outputs (streams, results,
 * displays including images, errors). Every cell's metadata says its language
 * ({"kernelmgr": {"language": "bash"}}); Python cells are plain code. Bash
 * cells are written as IPython "%%bash" cells, so the notebook re-runs with a
 * Python kernel (nbclient, JupyterLab): note that each such cell then runs in
 * its own bash process (workspace files carry over, shell variables do not).
 */
#ifndef KERNELMGR_EXPORT_H
#define KERNELMGR_EXPORT_H

#include <jansson.h>
#include <stddef.h>

/* new: the notebook of session_dir/history.jsonl; kernel_name (NULL =
 * "python3") goes to metadata.kernelspec. NULL with err on failure. */
json_t *export_notebook(const char *session_dir, const char *session_name, const char *kernel_name,
                        char *err, size_t errlen);

/* Splits text into nbformat's list of lines (each keeping its "\n"). new. */
json_t *export_lines(const char *text);

#endif
