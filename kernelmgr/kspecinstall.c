/*
 * kspecinstall.c — write kernelmgr-python / kernelmgr-bash kernelspecs.
 */
#include "kernelmgr/kspecinstall.h"
#include "kernelmgr/kmfs.h"
#include "kernelmgr/config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Paths are built into fixed PATH_MAX buffers whose overflow is checked
 * where it matters; gcc's truncation guesses are noise here (clang has no
 * such warning). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wformat-truncation"
#endif

int kspecinst_dir(const kspecinst_opts *o, char *out, size_t size)
{
    const char *jd = getenv("JUPYTER_DATA_DIR");
    const char *xdg = getenv("XDG_DATA_HOME");
    const char *home = getenv("HOME");
    int n;
    if (o->prefix)
        n = snprintf(out, size, "%s/share/jupyter/kernels", o->prefix);
    else if (jd && *jd)
        n = snprintf(out, size, "%s/kernels", jd);
    else if (xdg && *xdg)
        n = snprintf(out, size, "%s/jupyter/kernels", xdg);
    else if (home && *home)
        n = snprintf(out, size, "%s/.local/share/jupyter/kernels", home);
    else
        return -1;
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static void kspecinst_opt(json_t *argv, const char *opt, const char *value)
{
    json_array_append_new(argv, json_string(opt));
    json_array_append_new(argv, json_string(value));
}

/* Writes via a temporary file so a reader never sees half a kernel.json. */
static int kspecinst_write(const char *path, const json_t *spec, char *err, size_t errlen)
{
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(spec, tmp, JSON_INDENT(1)) || chmod(tmp, 0644) || rename(tmp, path)) {
        snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

json_t *kspecinst_install(const kspecinst_opts *o, char *err, size_t errlen)
{
    char base[PATH_MAX], dir[PATH_MAX], bin[PATH_MAX], path[PATH_MAX];
    if (kspecinst_dir(o, base, sizeof base)) {
        snprintf(err, errlen, "cannot tell where to install: set HOME, or use --prefix DIR");
        return NULL;
    }
    if (o->prefix && o->prefix[0] != '/') {
        snprintf(err, errlen, "--prefix %s: must be an absolute path", o->prefix);
        return NULL;
    }
    json_t *done = json_array();
    for (int l = 0; l < KMCFG_NLANG; l++) {
        const char *ln = kmcfg_lang_name(l);
        snprintf(bin, sizeof bin, "%s/kernel-%s", o->kernel_dir, ln);
        char *real = realpath(bin, NULL);
        if (!real || access(real, X_OK)) {
            snprintf(err, errlen, "%s: %s (build the kernels first: make)", bin,
                     strerror(errno ? errno : ENOENT));
            free(real);
            json_decref(done);
            return NULL;
        }
        json_t *argv = json_pack("[s s s]", real, "-f", "{connection_file}");
        free(real);
        if (o->sandbox)
            kspecinst_opt(argv, "--sandbox", o->sandbox);
        if (o->network >= 0)
            kspecinst_opt(argv, "--network", o->network ? "on" : "off");
        if (o->memory)
            kspecinst_opt(argv, "--memory", o->memory);
        if (o->python && l == KMCFG_LANG_PYTHON)
            kspecinst_opt(argv, "--python", o->python);
        json_t *spec = json_pack(
            "{s:o s:s s:s s:s s:{s:{s:s s:s}}}", "argv", argv, "display_name",
            l == KMCFG_LANG_BASH ? "Bash (kernelmgr sandbox)" : "Python 3 (kernelmgr sandbox)",
            "language", ln, "interrupt_mode", "message", "metadata", "kernelmgr", "version",
            o->version ? o->version : "", "sandbox", o->sandbox ? o->sandbox : "strict");
        snprintf(dir, sizeof dir, "%s/kernelmgr-%s", base, ln);
        if (kmfs_mkdirs(dir, 0755)) {
            snprintf(err, errlen, "cannot create %s: %s", dir, strerror(errno));
            json_decref(spec);
            json_decref(done);
            return NULL;
        }
        snprintf(path, sizeof path, "%s/kernel.json", dir);
        if (kspecinst_write(path, spec, err, errlen)) {
            json_decref(spec);
            json_decref(done);
            return NULL;
        }
        json_array_append_new(done,
                              json_pack("{s:o s:s s:O}", "name", json_sprintf("kernelmgr-%s", ln),
                                        "path", dir, "argv", json_object_get(spec, "argv")));
        json_decref(spec);
    }
    return done;
}
