/*
 * sbx_ns.c — namespaces and the identity the sandbox runs under.
 *
 * Identity. The sandbox maps exactly one uid and one gid, and uses the same
 * number inside as outside, so `id`, `ls -l` and files in the workspace agree
 * on both sides. Which host uid:
 *   - caller unprivileged: the caller's own uid (the only one an unprivileged
 *     user namespace may map);
 *   - caller root: never root. The workspace's owner when that is not root
 *     (a root daemon serving alice's workspace writes files as alice);
 *     otherwise nobody (65534), and the top directory of the root-owned
 *     workspace is chowned to it so that the sandbox can write there.
 * setgroups is denied, so supplementary groups can never be dropped to bypass
 * a "deny group" permission; as root the sandbox starts with none.
 */
#include "kernels/sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SBX_NS_NOBODY 65534

int sbx_ns_choose_ids(const char *workspace, sbx_ids *ids, char *err, size_t len)
{
    memset(ids, 0, sizeof *ids);
    if (geteuid() != 0) {
        ids->uid = geteuid();
        ids->gid = getegid();
        return 0;
    }
    struct stat st;
    if (workspace && stat(workspace, &st) == 0 && st.st_uid != 0) {
        ids->uid = st.st_uid;
        ids->gid = st.st_gid;
        if (ids->gid == 0) {
            struct passwd *pw = getpwuid(st.st_uid);
            ids->gid = pw && pw->pw_gid != 0 ? pw->pw_gid : SBX_NS_NOBODY;
        }
        return 0;
    }
    ids->uid = SBX_NS_NOBODY;
    ids->gid = SBX_NS_NOBODY;
    ids->chown_workspace = workspace != NULL;
    (void)err;
    (void)len;
    return 0;
}

int sbx_ns_write_maps(pid_t pid, const sbx_ids *ids, char *err, size_t len)
{
    char path[64], line[64];
    snprintf(path, sizeof path, "/proc/%d/setgroups", (int)pid);
    if (sbx_util_write_file(path, "deny") < 0 && errno != ENOENT)
        return sbx_util_fail(err, len, "user namespace: write %s", path);
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
    snprintf(line, sizeof line, "%u %u 1\n", (unsigned)ids->uid, (unsigned)ids->uid);
    if (sbx_util_write_file(path, line) < 0)
        return sbx_util_fail(err, len, "user namespace: map uid %u", (unsigned)ids->uid);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
    snprintf(line, sizeof line, "%u %u 1\n", (unsigned)ids->gid, (unsigned)ids->gid);
    if (sbx_util_write_file(path, line) < 0)
        return sbx_util_fail(err, len, "user namespace: map gid %u", (unsigned)ids->gid);
    return 0;
}

int sbx_ns_become(const sbx_ids *ids, char *err, size_t len)
{
    /* When the caller is root, this process still has host uid 0, which is
     * unmapped here: files it created would fail with EOVERFLOW. Switching
     * uid keeps the namespace's capabilities (the kernel only clears them on
     * a transition away from the namespace's root uid, which 0 is not), but
     * make sure of it: the rest of the setup needs CAP_SYS_ADMIN. */
    prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
    if (setresgid(ids->gid, ids->gid, ids->gid) < 0)
        return sbx_util_fail(err, len, "setresgid %u", (unsigned)ids->gid);
    if (setresuid(ids->uid, ids->uid, ids->uid) < 0)
        return sbx_util_fail(err, len, "setresuid %u", (unsigned)ids->uid);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) < 0)
        return sbx_util_fail(err, len, "capget");
    data[0].effective = data[0].permitted;
    data[1].effective = data[1].permitted;
    if (syscall(SYS_capset, &hdr, data) < 0)
        return sbx_util_fail(err, len, "capset");
    prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0);
    return 0;
}

static long sbx_ns_read_long(const char *path)
{
    FILE *f = fopen(path, "re");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

int sbx_ns_probe(char *err, size_t len)
{
    pid_t pid = fork();
    if (pid < 0)
        return sbx_util_fail(err, len, "user namespaces unavailable: fork");
    if (pid == 0) {
        int rc = unshare(SBX_NS_CLONE_FLAGS) < 0 ? errno : 0;
        _exit(rc > 255 ? 255 : rc);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 0;
    int e = WIFEXITED(st) ? WEXITSTATUS(st) : EINTR;
    const char *hint = "";
    if (sbx_ns_read_long("/proc/sys/user/max_user_namespaces") == 0)
        hint = " (user.max_user_namespaces is 0)";
    else if (sbx_ns_read_long("/proc/sys/kernel/unprivileged_userns_clone") == 0)
        hint = " (kernel.unprivileged_userns_clone is 0)";
    else if (sbx_ns_read_long("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == 1)
        hint = " (kernel.apparmor_restrict_unprivileged_userns is 1)";
    snprintf(err, len, "user namespaces unavailable: %s%s", strerror(e), hint);
    return -1;
}
