/*
 * kernel-bash — the Bash Jupyter kernel: the generic kernel server with a
 * persistent interactive bash as its worker (kernels/bash/bootstrap.sh).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/server/backend.h"
#include "kernels/server/kcache.h"

static const char *bash_path; /* --bash PATH, or NULL: found on PATH */

static int bash_option(int argc, char **argv, char *err, size_t errlen)
{
    if (strcmp(argv[0], "--bash") != 0)
        return 0;
    if (argc < 2 || !argv[1] || argv[1][0] != '/') {
        snprintf(err, errlen, "--bash needs an absolute path");
        return -1;
    }
    bash_path = argv[1];
    return 2;
}

static int is_executable(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

static int find_bash(char *out, size_t size)
{
    if (bash_path) {
        snprintf(out, size, "%s", bash_path);
        return is_executable(out) ? 0 : -1;
    }
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path && *path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *dir = strtok_r(buf, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        if (dir[0] != '/')
            continue;
        snprintf(out, size, "%s/bash", dir);
        if (is_executable(out))
            return 0;
    }
    snprintf(out, size, "/bin/bash");
    return is_executable(out) ? 0 : -1;
}

/* "5.2.15(1)-release" of the bash binary, or "" when it cannot be run. */
static void bash_version(const char *bash, char *out, size_t size)
{
    char cmd[4200], key[8192] = "bash-version-1;";
    out[0] = '\0';
    /* Asking bash costs a shell start; the answer for this very file is
     * cached (kcache.h). */
    int cacheable = kcache_file_key(bash, key, sizeof key) == 0;
    char *cached = cacheable ? kcache_get("bashversion", key) : NULL;
    if (cached) {
        snprintf(out, size, "%s", cached);
        free(cached);
        if (out[0])
            return;
    }
    snprintf(cmd, sizeof cmd,
             "'%s' --norc --noprofile -c 'printf %%s \"$BASH_VERSION\"' 2>/dev/null", bash);
    if (strchr(bash, '\''))
        return;
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    if (!fgets(out, (int)size, p))
        out[0] = '\0';
    if (pclose(p) == 0 && out[0] && cacheable)
        kcache_put("bashversion", key, out);
}

static int bash_prepare(const char *share_dir, const char *workspace, kworker_spec *spec, char *err,
                        size_t errlen)
{
    (void)workspace;
    char bash[4096], boot[4200], dir[4096], version[128];
    if (find_bash(bash, sizeof bash) < 0) {
        snprintf(err, errlen, "no bash found%s%s", bash_path ? " at " : " on PATH",
                 bash_path ? bash_path : "");
        return -1;
    }
    snprintf(dir, sizeof dir, "%.4000s/bash", share_dir);
    snprintf(boot, sizeof boot, "%s/bootstrap.sh", dir);
    if (access(boot, R_OK) < 0) {
        snprintf(err, errlen, "missing support file %.3000s: %s (is the kernel installed?)", boot,
                 strerror(errno));
        return -1;
    }
    bash_version(bash, version, sizeof version);
    /* An interactive shell (see bootstrap.sh) whose startup messages about
     * job control go to /dev/null; the real stderr waits on fd
     * KSPEC_STDERR_FD (5), which bootstrap.sh moves back to 2. */
    spec->quiet_start = 1;
    if (kspec_add_arg(spec, bash) < 0 || kspec_add_arg(spec, "--noprofile") < 0 ||
        kspec_add_arg(spec, "--norc") < 0 || kspec_add_arg(spec, "-i") < 0 ||
        kspec_add_arg(spec, boot) < 0 || kspec_add_ro_path(spec, dir) < 0 ||
        kspec_add_env(spec, "PAGER", "cat") < 0 || kspec_add_env(spec, "GIT_PAGER", "cat") < 0 ||
        kspec_add_env(spec, "TERM", "dumb") < 0) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    if (!getenv("LC_ALL") && !getenv("LC_CTYPE") && !getenv("LANG"))
        kspec_add_env(spec, "LANG", "C.UTF-8");
    char banner[512];
    snprintf(banner, sizeof banner,
             "GNU bash %s in a kernelmgr kernel.\n"
             "`display FILE` shows an image or HTML file; `read` asks the client for input.",
             version[0] ? version : "(unknown version)");
    spec->kernel_info = json_pack(
        "{s:{s:s, s:s, s:s, s:s, s:s, s:s}, s:s, s:[{s:s, s:s}]}", "language_info", "name", "bash",
        "version", version, "mimetype", "text/x-sh", "file_extension", ".sh", "pygments_lexer",
        "bash", "codemirror_mode", "shell", "banner", banner, "help_links", "text",
        "GNU Bash manual", "url", "https://www.gnu.org/software/bash/manual/");
    return spec->kernel_info ? 0 : -1;
}

static const kbackend bash_backend = {
    .name = "bash",
    .option_help = "  --bash PATH              the bash binary (default: bash on PATH)\n",
    .option = bash_option,
    .prepare = bash_prepare,
};

int main(int argc, char **argv)
{
    return kserver_main(argc, argv, &bash_backend);
}
