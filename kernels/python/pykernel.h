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

/* The worker's `python -c` program; its one argument is the real path of
 * SHARE_DIR/python/driver.py. It runs the driver as __main__ exactly as
 * `python driver.py` would (__file__, sys.argv, code filenames), but takes
 * the code from CPython's own cache next to the source,
 * SHARE_DIR/python/__pycache__/driver.<cache tag>[.opt-N].pyc, which `make`
 * writes in checked-hash mode: SourceFileLoader.get_code() uses it only
 * when its magic number is the interpreter's and its hash is that of the
 * current driver.py, else it compiles the source (an edited driver, another
 * interpreter version). While the driver loads, sys.pycache_prefix is unset
 * (PYTHONPYCACHEPREFIX could name a sandbox-writable directory) and nothing
 * is written (sys.dont_write_bytecode): the cache is read only from our own
 * share directory, which the sandbox binds read-only. */
#define PYKERNEL_BOOT                                                                              \
    "import sys,_frozen_importlib_external as e\n"                                                 \
    "f=sys.argv[1];p=sys.pycache_prefix,sys.dont_write_bytecode\n"                                 \
    "sys.pycache_prefix,sys.dont_write_bytecode=None,True\n"                                       \
    "l=e.SourceFileLoader('__main__',f);c=l.get_code('__main__')\n"                                \
    "sys.pycache_prefix,sys.dont_write_bytecode=p\n"                                               \
    "sys.argv[:]=[f];__file__,__loader__=f,l\n"                                                    \
    "del e,f,p,l\n"                                                                                \
    "exec(globals().pop('c'))\n"

/* new: the kernel_info_reply fields for info: language_info (name "python",
 * the interpreter's version, ipython3 lexer...), implementation "kernelmgr",
 * implementation_version, banner, help_links, and "interpreter" (path,
 * executable, version, prefix, base_prefix, venv, source). NULL on OOM. */
json_t *pykernel_kernel_info(const pydetect_info *info);

/* Fills spec (argv, env extras, ro_paths, kernel_info) to run
 * SHARE_DIR/python/driver.py with info's interpreter for workspace (argv:
 * the interpreter, "-c", PYKERNEL_BOOT, the driver's real path); the worker's PATH
 * is the interpreter's bin directory before KENV_SANDBOX_PATH. info is checked with
 * pydetect_validate() first: only validated prefixes and the interpreter's
 * own directories are bound read-only (never "/", never the workspace).
 * Returns 0, or -1 with a reason in err (e.g. the driver is not installed,
 * or a prefix that is not the interpreter's real location). */
int pykernel_fill_spec(const pydetect_info *info, const char *share_dir, const char *workspace,
                       kworker_spec *spec, char *err, size_t errlen);

#endif
