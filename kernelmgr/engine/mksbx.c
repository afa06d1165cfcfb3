/*
 * mksbx.c — a session's one sandbox: its holder process.
 *
 * With "session_sandbox", a strict session's kernels do not each make a
 * sandbox: the session has one, owned by a holder (build/kernelmgr-sandbox,
 * sandbox_session_serve()) that this file starts with the manager's
 * lifeline before the session's first kernel, and each kernel server is
 * told its socket (--session-sandbox) and starts its worker inside. The
 * holder is launched like a kernel (klaunch: its own process group, a pid
 * file the start-up scan reaps after a crash, its connection file unused)
 * and gets the session's limits: they are the sandbox's, one cgroup for
 * all its kernels. Its read-only paths are those every built-in kernel
 * needs (the share directory, the Python interpreter's prefixes, the
 * session's package directories); a kernel needing another is refused by
 * the holder with the path named.
 *
 * Ownership: s->sbx (the holder's kproc) belongs to the session, under
 * s->lock; ksbx_stop() ends it, after the session's kernels.
 */
#include "kernelmgr/engine/session_int.h"
#include "common/cm_install.h"
#include "common/cm_path.h"
#include "kernelmgr/engine/pkgdirs.h"
#include "sandbox/sandbox.h"

#include <errno.h>
#include <limits.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 1 when s's kernels share one sandbox. A warm-pool entry has one too:
 * its package directory is renamed at hand-out, but its kernels name it by
 * the pool's path before and after (kcmd_pkg_root), which the sandbox bound
 * once. An egress allow-list is the holder's to serve (one proxy on the
 * session's 127.0.0.1:3128, kernels/sandbox/main.c). */
static int ksbx_wanted(const km_manager *m, const session *s)
{
    const char *level = s->sandbox[0] ? s->sandbox : m->cfg.sandbox;
    return m->cfg.session_sandbox && !strcmp(level, "strict");
}

const char *ksbx_socket(const session *s)
{
    return s->sbx && s->sbx_sock[0] ? s->sbx_sock : NULL;
}

/* Adds "--ro-path dir" unless dir is empty, a system directory (always
 * there) or in the workspace: the sandbox binds that read-write, and a
 * read-only path inside it stays read-only there (sbx_mount.c), which would
 * freeze a workspace venv the kernels install into. */
static int add_ro(klaunch_cmd *cmd, const char *dir, const char *workspace)
{
    if (!dir || dir[0] != '/' || !strcmp(dir, "/") || sandbox_is_system_path(dir))
        return 0;
    if (cm_path_under(dir, workspace))
        return 0;
    char *rd = realpath(dir, NULL), *rw = workspace ? realpath(workspace, NULL) : NULL;
    int inside = rd && rw && cm_path_under(rd, rw);
    free(rd);
    free(rw);
    if (inside)
        return 0;
    return klaunch_cmd_add(cmd, "--ro-path") | klaunch_cmd_add(cmd, dir);
}

/* The kernels' share directory, as the kernel servers find it from their
 * own binary (kserver.c, cm_install_share_dir): $KERNELMGR_SHARE; with
 * $KERNELMGR_KERNEL_DIR, its share/kernelmgr (a build tree) or
 * ../../share/kernelmgr (LIBEXECDIR/kernelmgr); else ours. 0 when it exists,
 * else -1 (the holder then binds none: the kernel's own error names it). */
static int share_dir(char *out, size_t size)
{
    const char *kd = getenv("KERNELMGR_KERNEL_DIR");
    char *dir = NULL;
    if (!getenv("KERNELMGR_SHARE") && kd && *kd) {
        static const char *const rel[] = {"share/kernelmgr", "../../share/kernelmgr"};
        for (size_t i = 0; !dir && i < sizeof rel / sizeof *rel; i++) {
            char *cand = cm_path_fmt("%s/%s", kd, rel[i]);
            dir = cand && cm_install_is_dir(cand) ? realpath(cand, NULL) : NULL;
            free(cand);
        }
    } else {
        dir = cm_install_share_dir();
    }
    int rc = dir && strlen(dir) < size && cm_install_is_dir(dir) ? 0 : -1;
    if (!rc)
        memcpy(out, dir, strlen(dir) + 1);
    free(dir);
    return rc;
}

/* The holder's command: the session's limits, its workspace, the paths. */
static int holder_cmd(km_manager *m, session *s, klaunch_cmd *cmd, km_err *err)
{
    memset(cmd, 0, sizeof *cmd);
    /* where the kernels are (lang.c): $KERNELMGR_KERNEL_DIR, else beside
     * us or LIBEXECDIR/kernelmgr */
    const char *env = getenv("KERNELMGR_KERNEL_DIR");
    char *dir = env && *env ? strdup(env) : cm_install_helper_dir();
    char bin[PATH_MAX], num[64];
    if (!dir || snprintf(bin, sizeof bin, "%s/kernelmgr-sandbox", dir) >= (int)sizeof bin) {
        free(dir);
        km_err_set(err, KM_EKERNEL, "cannot find kernelmgr-sandbox beside kernelmgr's helpers");
        return -1;
    }
    free(dir);
    if (access(bin, X_OK) < 0) {
        km_err_set(err, KM_EKERNEL, "%s: %s (the session sandbox's holder is not installed)", bin,
                   strerror(errno));
        return -1;
    }
    int rc = klaunch_cmd_add(cmd, bin);
    if (m->lifeline[0] > 2) {
        snprintf(num, sizeof num, "%d", KLAUNCH_OWNER_FD);
        rc |= klaunch_cmd_add(cmd, "--owner-fd") | klaunch_cmd_add(cmd, num);
        cmd->lifeline_fd = m->lifeline[0];
    }
    rc |= klaunch_cmd_add(cmd, "-f") | klaunch_cmd_add(cmd, "{connection_file}") |
          klaunch_cmd_add(cmd, "--listen") | klaunch_cmd_add(cmd, s->sbx_sock) |
          klaunch_cmd_add(cmd, "--workspace") | klaunch_cmd_add(cmd, s->workspace) |
          klaunch_cmd_add(cmd, "--network") | klaunch_cmd_add(cmd, kcmd_net_text(m, s));
    snprintf(num, sizeof num, "%llu", (unsigned long long)m->cfg.kernel_log_max);
    rc |= klaunch_cmd_add(cmd, "--log-max") | klaunch_cmd_add(cmd, num);
    rc |= kcmd_add_limits(m, s, cmd);
    char share[PATH_MAX];
    if (share_dir(share, sizeof share) == 0)
        rc |= add_ro(cmd, share, s->workspace);
    /* the Python kernel's interpreter: a venv's prefix, the real
     * interpreter's prefix (bin/..) */
    const char *py = s->python[0] ? s->python : m->cfg.python;
    char *shared_py = !s->python[0] ? kcmd_python_resolved(py, s->workspace) : NULL;
    const char *interp = shared_py ? shared_py : py;
    if (interp[0] == '/') {
        char a[PATH_MAX], b[PATH_MAX];
        snprintf(a, sizeof a, "%s", interp);
        rc |= add_ro(cmd, dirname(dirname(a)), s->workspace);
        if (realpath(interp, b)) {
            char *pre = dirname(dirname(b));
            if (strcmp(pre, a))
                rc |= add_ro(cmd, pre, s->workspace);
        }
    }
    free(shared_py);
    /* the session's package directories (made here if missing) */
    char root[PATH_MAX], ro[PATH_MAX];
    const char *kinds[] = {"pip", "npm"};
    if (kcmd_pkg_root(m, s, root) == 0)
        for (size_t i = 0; i < 2; i++) {
            char **penv = pkgdirs_kernel_env(root, kinds[i], ro);
            if (penv && ro[0])
                rc |= add_ro(cmd, ro, s->workspace);
            pkgdirs_env_free(&penv);
        }
    if (rc) {
        klaunch_cmd_clear(cmd);
        km_err_set(err, KM_EKERNEL, "the session sandbox's command is too long");
        return -1;
    }
    return 0;
}

int ksbx_ensure(km_manager *m, session *s, km_err *err)
{
    if (!ksbx_wanted(m, s))
        return 0;
    if (s->sbx && klaunch_alive(s->sbx))
        return 0;
    if (s->sbx)
        klaunch_stop(&s->sbx, 0.5); /* gone: its sandbox with it */
    char id[48], u[37];
    jp_uuid4(u);
    snprintf(id, sizeof id, "%.8s%.4s-sbx", u, u + 9);
    if (!s->sbx_sock[0] && snprintf(s->sbx_sock, sizeof s->sbx_sock, "%s/%s.sbx", m->run_dir, id) >=
                               (int)sizeof s->sbx_sock) {
        s->sbx_sock[0] = 0;
        km_err_set(err, KM_EKERNEL, "run directory path too long for the session sandbox's socket");
        return -1;
    }
    klaunch_cmd cmd;
    if (holder_cmd(m, s, &cmd, err) < 0)
        return -1;
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%.4000s/sandbox.log", s->dir);
    s->sbx = klaunch_start(&cmd, m->run_dir, id, m->cfg.transport, log, "kernelmgr-sandbox", err);
    klaunch_cmd_clear(&cmd);
    return s->sbx ? 0 : -1;
}

void ksbx_stop(session *s)
{
    if (s->sbx)
        klaunch_stop(&s->sbx, 2.0);
    if (s->sbx_sock[0])
        unlink(s->sbx_sock);
}
