/*
 * kspecinstall.c — write the kernelmgr-LANG kernelspecs (one per backend
 * language of the table: kernelmgr-python, kernelmgr-bash, ...).
 */
#include "kernelmgr/frontends/kspecinstall.h"
#include "kernelmgr/engine/netopt.h"
#include "common/cm_path.h"
#include "kernelmgr/engine/kmfs.h"
#include "kernelmgr/engine/config.h"
#include "kernels/python/pydetect.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *kspecinst_dir(const kspecinst_opts *o)
{
    const char *jd = getenv("JUPYTER_DATA_DIR");
    const char *xdg = getenv("XDG_DATA_HOME");
    const char *home = getenv("HOME");
    if (o->prefix)
        return cm_path_join(o->prefix, "share/jupyter/kernels");
    if (jd && *jd)
        return cm_path_join(jd, "kernels");
    if (xdg && *xdg)
        return cm_path_join(xdg, "jupyter/kernels");
    if (home && *home)
        return cm_path_join(home, ".local/share/jupyter/kernels");
    errno = ENOENT;
    return NULL;
}

static void kspecinst_opt(json_t *argv, const char *opt, const char *value)
{
    json_array_append_new(argv, json_string(opt));
    json_array_append_new(argv, json_string(value));
}

/* Writes via a temporary file so a reader never sees half a kernel.json;
 * the temporary file is created fresh (O_EXCL | O_NOFOLLOW), never written
 * through a symlink or into a FIFO someone left there. */
static int kspecinst_write(const char *path, const json_t *spec, km_err *err)
{
    char *tmp = NULL;
    if (asprintf(&tmp, "%s.tmp", path) < 0) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return -1;
    }
    unlink(tmp); /* a stale one from a crash (a symlink is removed, not followed) */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int rc = 0;
    if (fd < 0 || json_dumpfd(spec, fd, JSON_INDENT(1)) || fchmod(fd, 0644) || close(fd) ||
        (fd = -1, rename(tmp, path))) {
        km_err_set(err, KM_EUSAGE, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        rc = -1;
    }
    free(tmp);
    return rc;
}

int kspecinst_python_debugger(const char *python)
{
    pydetect_sources src = {
        .explicit_path = python && *python ? python : NULL,
        .env_python = getenv("KERNELMGR_PYTHON"),
        .virtual_env = getenv("VIRTUAL_ENV"),
        .path_env = getenv("PATH"),
    };
    pydetect_info info = {0};
    char err[1024];
    int yes = pydetect_find(&src, &info, err, sizeof err) == 0 &&
              pydetect_has_module(&info, "debugpy", err, sizeof err) == 1;
    pydetect_info_clear(&info);
    return yes;
}

/* Installs the kernelspec of language l under base: new {"name","path",
 * "argv"}, or NULL with err. */
static json_t *kspecinst_one(const kspecinst_opts *o, const char *base, const km_lang *lg,
                             km_err *err)
{
    const char *ln = lg->name;
    char *bin = NULL, *dir = NULL, *path = NULL;
    json_t *spec = NULL, *out = NULL;
    if ((lg->backend[0] == '/' ? asprintf(&bin, "%s", lg->backend)
                               : asprintf(&bin, "%s/%s", o->kernel_dir, lg->backend)) < 0) {
        bin = NULL;
        km_err_set(err, KM_EUSAGE, "out of memory");
        goto done;
    }
    /* the backend as the manager starts it: a symbolic link stays one (a
     * multi-call binary may tell its part by the name it was started as) */
    errno = 0;
    char *exe = cm_path_absolute(bin);
    if (!exe || access(exe, X_OK)) {
        km_err_set(err, KM_EUSAGE, "%s: %s (build the kernels first: make)", bin,
                   strerror(errno ? errno : ENOENT));
        free(exe);
        goto done;
    }
    json_t *argv = json_pack("[s s s]", exe, "-f", "{connection_file}");
    free(exe);
    if (o->sandbox)
        kspecinst_opt(argv, "--sandbox", o->sandbox);
    if (o->network >= 0)
        kspecinst_opt(argv, "--network", km_net_text(o->network, o->network_allow));
    if (o->memory)
        kspecinst_opt(argv, "--memory", o->memory);
    char num[64];
    if (o->cpus > 0) {
        snprintf(num, sizeof num, "%.6g", o->cpus);
        kspecinst_opt(argv, "--cpus", num);
    }
    if (o->cpu_time > 0) {
        snprintf(num, sizeof num, "%.6g", o->cpu_time);
        kspecinst_opt(argv, "--cpu-time", num);
    }
    if (o->python && lg->takes_python)
        kspecinst_opt(argv, "--python", o->python);
    if (o->ipython == 1 && lg->takes_python)
        kspecinst_opt(argv, "--ipython", "on");
    spec = json_pack("{s:o s:s s:s s:s s:{s:{s:s s:s}}}", "argv", argv, "display_name",
                     lg->display_name, "language", ln, "interrupt_mode", "message", "metadata",
                     "kernelmgr", "version", o->version ? o->version : "", "sandbox",
                     o->sandbox ? o->sandbox : "strict");
    if (lg->takes_python && kspecinst_python_debugger(o->python))
        json_object_set_new(json_object_get(spec, "metadata"), "debugger", json_true());
    if (asprintf(&dir, "%s/kernelmgr-%s", base, ln) < 0 ||
        asprintf(&path, "%s/kernelmgr-%s/kernel.json", base, ln) < 0) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        goto done;
    }
    if (kmfs_mkdirs(dir, 0755)) {
        km_err_set(err, KM_EUSAGE, "cannot create %s: %s", dir, strerror(errno));
        goto done;
    }
    if (kspecinst_write(path, spec, err))
        goto done;
    out = json_pack("{s:o s:s s:O}", "name", json_sprintf("kernelmgr-%s", ln), "path", dir, "argv",
                    json_object_get(spec, "argv"));
done:
    json_decref(spec);
    free(bin);
    free(dir);
    free(path);
    return out;
}

json_t *kspecinst_install(const kspecinst_opts *o, km_err *err)
{
    if (o->prefix && o->prefix[0] != '/') {
        km_err_set(err, KM_EUSAGE, "--prefix %s: must be an absolute path", o->prefix);
        return NULL;
    }
    char *base = kspecinst_dir(o);
    if (!base) {
        km_err_set(err, KM_EUSAGE,
                   errno == ENOMEM ? "out of memory"
                                   : "cannot tell where to install: set HOME, or use "
                                     "--prefix DIR");
        return NULL;
    }
    km_langs builtin;
    const km_langs *t = o->langs;
    if (!t) {
        km_langs_builtin(&builtin);
        t = &builtin;
    }
    json_t *done = json_array();
    for (int l = 0; l < t->n; l++) {
        if (!t->v[l].backend[0])
            continue; /* run by a Jupyter kernelspec: nothing of ours */
        json_t *one = kspecinst_one(o, base, &t->v[l], err);
        if (!one) {
            json_decref(done);
            done = NULL;
            break;
        }
        json_array_append_new(done, one);
    }
    free(base);
    return done;
}
