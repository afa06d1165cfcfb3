/*
 * kspecinstall.h — `kernelmgr kernelspec install`: Jupyter kernelspecs
 * "kernelmgr-python", "kernelmgr-bash" (and "kernelmgr-NAME" for each
 * configured backend language, lang.h) for our kernels, so that
 * `jupyter console --kernel kernelmgr-python`, nbconvert/nbclient and
 * JupyterLab start a sandboxed kernel.
 *
 * Where (the Jupyter data path layout; `jupyter kernelspec list` finds both):
 *   --prefix DIR   DIR/share/jupyter/kernels/NAME
 *   --user / none  $JUPYTER_DATA_DIR/kernels, else $XDG_DATA_HOME/jupyter/kernels,
 *                  else ~/.local/share/jupyter/kernels
 */
#ifndef KERNELMGR_KSPECINSTALL_H
#define KERNELMGR_KSPECINSTALL_H

#include "kernelmgr/engine/kmerr.h"

#include "kernelmgr/engine/lang.h"

#include <jansson.h>
#include <stddef.h>

typedef struct kspecinst_opts {
    const char *prefix;     /* --prefix DIR, or NULL */
    const char *kernel_dir; /* directory holding kernel-python / kernel-bash */
    const km_langs *langs;  /* one kernelspec per backend language (lang.h);
                               NULL = the built-ins */
    /* Kernel options written into argv (NULL / -1 / 0 = the kernel's default). */
    const char *sandbox;
    const char *python; /* only for languages that take --python */
    const char *memory;
    int network;               /* KM_NET_* or -1 */
    const char *network_allow; /* KM_NET_ALLOW: the "allow:..." text */
    double cpus;               /* --cpus, 0 = none */
    double cpu_time;           /* --cpu-time, 0 = none */
    int ipython;               /* 1: --ipython on (languages that take --python) */
    const char *version;       /* kernelmgr version, recorded in the metadata */
} kspecinst_opts;

/* Installs kernelmgr-NAME for every language of o->langs run by a
 * kernel-server backend (not those run by a Jupyter kernelspec: that
 * kernelspec is already installed). Returns a new array
 * [{"name","path","argv"}] or NULL with a reason in err. */
json_t *kspecinst_install(const kspecinst_opts *o, km_err *err);

/* new (free()): the kernels directory chosen for o (see above), or NULL
 * with errno (ENOENT: no prefix, JUPYTER_DATA_DIR, XDG_DATA_HOME or HOME). */
char *kspecinst_dir(const kspecinst_opts *o);

/* 1 when the Python a kernel runs (python, or the detection order without
 * a workspace when NULL or "") can import debugpy: its kernelspec then says
 * metadata.debugger, what JupyterLab and VS Code read. Runs that
 * interpreter once (pydetect_has_module); 0 otherwise or when unsure. */
int kspecinst_python_debugger(const char *python);

#endif
