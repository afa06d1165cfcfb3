/*
 * pykernel.h — the Python backend's worker description: how to start
 * driver.py under a detected interpreter (pydetect.h), what the sandbox must
 * expose read-only, and what kernel_info reports.
 */
#ifndef KERNELS_PYTHON_PYKERNEL_H
#define KERNELS_PYTHON_PYKERNEL_H

#include <jansson.h>
#include <stddef.h>

#include "kernels/python/pydetect.h"
#include "kernels/server/backend.h"

/* new: the kernel_info_reply fields for info: language_info (name "python",
 * the interpreter's version, ipython3 lexer...), implementation "kernelmgr",
 * implementation_version, banner, help_links, and "interpreter" (path,
 * executable, version, prefix, base_prefix, venv, source). NULL on OOM. */
json_t *pykernel_kernel_info(const pydetect_info *info);

/* Fills spec (argv, env extras, ro_paths, kernel_info) to run
 * SHARE_DIR/python/driver.py with info's interpreter for workspace; the worker's PATH
 * is the interpreter's bin directory before KENV_SANDBOX_PATH. info is checked with
 * pydetect_validate() first: only validated prefixes and the interpreter's
 * own directories are bound read-only (never "/", never the workspace).
 * Returns 0, or -1 with a reason in err (e.g. the driver is not installed,
 * or a prefix that is not the interpreter's real location). */
int pykernel_fill_spec(const pydetect_info *info, const char *share_dir, const char *workspace,
                       kworker_spec *spec, char *err, size_t errlen);

#endif
