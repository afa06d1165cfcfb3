/*
 * cm_install.h — where kernelmgr's own files are, found from the running
 * binary (/proc/self/exe), never from PATH or the working directory.
 *
 * Two layouts work, and a copy of either can be moved anywhere:
 *   the build tree   build/kernelmgr, build/kernel-python, ... side by side,
 *                    support files in build/share/kernelmgr;
 *   an installation  BINDIR/kernelmgr, the helpers (kernel-python,
 *                    kernel-bash, kernelmgr-gateway) in LIBEXECDIR/kernelmgr,
 *                    support files in DATADIR/kernelmgr.
 * The installed layout is known as paths relative to each other, fixed at
 * build time from the Makefile's BINDIR, LIBEXECDIR and DATADIR
 * (CM_REL_BIN_LIBEXEC, CM_REL_LIBEXEC_DATA, CM_REL_BIN_DATA), so `make
 * install DESTDIR=... PREFIX=...` needs no rebuild and a relocated prefix
 * still works.
 *
 * Every function returns a malloc'd string the caller frees, or NULL with
 * errno set.
 */
#ifndef CM_INSTALL_H
#define CM_INSTALL_H

/* The directory of the running executable (no trailing slash). */
char *cm_install_exe_dir(void);

/* The directory holding the helper programs: EXE_DIR/CM_REL_BIN_LIBEXEC
 * when that is a directory (an installed kernelmgr in BINDIR), else
 * EXE_DIR (the build tree, or a helper itself running in LIBEXECDIR). */
char *cm_install_helper_dir(void);

/* The support files' directory (driver.py, bootstrap and cell scripts):
 * $KERNELMGR_SHARE when set, else the first existing of
 * EXE_DIR/share/kernelmgr (build tree), EXE_DIR/CM_REL_LIBEXEC_DATA (a
 * helper in LIBEXECDIR/kernelmgr), EXE_DIR/CM_REL_BIN_DATA (a binary in
 * BINDIR); canonical (realpath). When none exists: the build-tree path
 * (so the error that follows names where it looked first). */
char *cm_install_share_dir(void);

/* 1 when dir is an existing directory. */
int cm_install_is_dir(const char *dir);

#endif
