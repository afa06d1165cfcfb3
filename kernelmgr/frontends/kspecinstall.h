/*
 * kspecinstall.h — `kernelmgr kernelspec install`: Jupyter kernelspecs
 * "kernelmgr-python" and "kernelmgr-bash" for our kernels, so that
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

#include <jansson.h>
#include <stddef.h>

typedef struct kspecinst_opts {
    const char *prefix;     /* --prefix DIR, or NULL */
    const char *kernel_dir; /* directory holding kernel-python / kernel-bash */
    /* Kernel options written into argv (NULL / -1 = the kernel's default). */
    const char *sandbox;
    const char *python;
    const char *memory;
    int network;
    const char *version; /* kernelmgr version, recorded in the metadata */
} kspecinst_opts;

/* Installs both kernelspecs. Returns a new array
 * [{"name","path","argv"}] or NULL with a reason in err. */
json_t *kspecinst_install(const kspecinst_opts *o, char *err, size_t errlen);

/* new (free()): the kernels directory chosen for o (see above), or NULL
 * with errno (ENOENT: no prefix, JUPYTER_DATA_DIR, XDG_DATA_HOME or HOME). */
char *kspecinst_dir(const kspecinst_opts *o);

#endif
