/*
 * sbx_ns.c — namespaces and the identity the sandbox runs under.
 *
 * Identity. The sandbox maps exactly one uid and one gid. setgroups is
 * denied, so supplementary groups can never be dropped to bypass a "deny
 * group" permission; as root the sandbox starts with none.
 *   - caller unprivileged: the caller's own uid, the same number inside and
 *     outside (the only one an unprivileged user namespace may map).
 *   - caller root: never root, and never a uid that owns anything on the
 *     host. Each sandbox runs as its own host uid and gid,
 *     SBX_NS_HOST_BASE + the pid of its monitor (a range no distribution
 *     allocates; unique among live sandboxes, so sandboxes share no per-user
 *     kernel limit and host processes of some real user cannot signal or
 *     ptrace them). The workspace is bound through an idmapped mount that
 *     shows its on-disk owner and group as that uid and gid: the sandbox
 *     can write a workspace owned by root or by alice, and the files it
 *     creates land on disk owned by the workspace's owner and group. Inside,
 *     the sandbox's uid is the workspace owner's (nobody, 65534, when root
 *     owns it), so `ls -l` agrees on both sides.
 *     The workspace is never chowned. Where the workspace's filesystem
 *     cannot be idmapped (some network filesystems), a workspace owned by an
 *     unprivileged user is used by running the sandbox as that user (same
 *     number inside and out); a root-owned one is refused.
 *     With its own host uid, the sandbox's user namespace is created by
 *     that uid (sbx_ns_creator_enter): the kernel charges per-user quotas
 *     to the namespace's owner at the levels above, so host root's are
 *     never touched. In the fallback the owner stays root (the sandbox
 *     runs as a real user then, who must not own its namespace).
 *   - caller root of a user namespace that does not map those uids (a
 *     rootless container, `unshare --map-root-user`): the unprivileged mode,
 *     nobody inside mapped to the caller's uid (no one's on the real host);
 *     supplementary groups are dropped where the namespace allows it.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SBX_NS_NOBODY 65534
/* systemd's table of uid ranges (UIDS-GIDS.md) leaves 0x70000000-0x7FFDFFFF
 * unused; + a pid (at most 2^22) stays inside it and below 2^31. */
#define SBX_NS_HOST_BASE 0x70000000u

/* 1 when the id map file (/proc/self/uid_map or gid_map) of this process's
 * user namespace covers nobody and every id root mode gives a sandbox
 * (SBX_NS_HOST_BASE + a pid); the initial namespace maps all. */
static int sbx_ns_maps_root_ids(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 1; /* no user namespaces at all: the initial one */
    unsigned long long in, out, n, lo = SBX_NS_HOST_BASE, hi = SBX_NS_HOST_BASE + (1u << 22);
    int base = 0, nobody = 0;
    while (fscanf(f, "%llu %llu %llu", &in, &out, &n) == 3) {
        base |= in <= lo && in + n >= hi;
        nobody |= in <= SBX_NS_NOBODY && in + n > SBX_NS_NOBODY;
    }
    fclose(f);
    return base && nobody;
}

const char *sandbox_identity(void)
{
    if (geteuid() != 0)
        return "unprivileged";
    return sbx_ns_maps_root_ids("/proc/self/uid_map") && sbx_ns_maps_root_ids("/proc/self/gid_map")
               ? "root"
               : "userns-root";
}

int sbx_ns_choose_ids(const char *workspace, sbx_ids *ids, char *err, size_t len)
{
    (void)err;
    (void)len;
    memset(ids, 0, sizeof *ids);
    if (geteuid() != 0) {
        ids->uid = ids->host_uid = geteuid();
        ids->gid = ids->host_gid = getegid();
        return 0;
    }
    /* Root of a user namespace that maps only a few ids (a rootless
     * container: `idmap: map uid 0` would fail): the unprivileged mode, as
     * nobody inside, mapped to this root, which is no one's on the host. */
    if (!sbx_ns_maps_root_ids("/proc/self/uid_map") ||
        !sbx_ns_maps_root_ids("/proc/self/gid_map")) {
        ids->uid = SBX_NS_NOBODY;
        ids->gid = SBX_NS_NOBODY;
        ids->host_uid = geteuid();
        ids->host_gid = getegid();
        ids->as_caller = 1;
        return 0;
    }
    struct stat st;
    int have = workspace && stat(workspace, &st) == 0;
    ids->uid = SBX_NS_NOBODY;
    ids->gid = SBX_NS_NOBODY;
    if (have && st.st_uid != 0) {
        ids->uid = st.st_uid;
        ids->gid = st.st_gid;
        if (ids->gid == 0) {
            struct passwd *pw = getpwuid(st.st_uid);
            ids->gid = pw && pw->pw_gid != 0 ? pw->pw_gid : SBX_NS_NOBODY;
        }
    }
    /* host_uid 0: assigned by the monitor, sbx_ns_assign_host_ids(). */
    if (have) {
        ids->idmap = 1;
        ids->ws_uid = st.st_uid;
        ids->ws_gid = st.st_gid;
    }
    return 0;
}

void sbx_ns_assign_host_ids(sbx_ids *ids)
{
    ids->host_uid = (uid_t)(SBX_NS_HOST_BASE + (unsigned)getpid());
    ids->host_gid = (gid_t)ids->host_uid;
    ids->own_uid = 1;
}

/* A user namespace whose only mapping is on-disk ws_uid:ws_gid -> the
 * sandbox's host ids: what mount_setattr(MOUNT_ATTR_IDMAP) wants. Its
 * creator exits at once; the fd keeps the namespace. Monitor only: the
 * creator is left to the monitor's wait loop (wait4(-1)) to reap. */
static int sbx_ns_idmap_userns(const sbx_ids *ids, char *err, size_t len)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return sbx_util_fail(err, len, "idmap: pipe");
    /* Single-threaded caller (the monitor): a raw clone behaves like fork. */
    pid_t pid = (pid_t)syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, NULL, NULL, NULL, 0);
    if (pid < 0) {
        sbx_util_fail(err, len, "idmap: new user namespace");
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        char c;
        close(p[1]);
        (void)!read(p[0], &c, 1);
        _exit(0);
    }
    close(p[0]);
    int fd = -1;
    char path[64], line[64];
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
    snprintf(line, sizeof line, "%u %u 1\n", (unsigned)ids->ws_uid, (unsigned)ids->host_uid);
    if (sbx_util_write_file(path, line) < 0) {
        sbx_util_fail(err, len, "idmap: map uid %u", (unsigned)ids->ws_uid);
        goto out;
    }
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
    snprintf(line, sizeof line, "%u %u 1\n", (unsigned)ids->ws_gid, (unsigned)ids->host_gid);
    if (sbx_util_write_file(path, line) < 0) {
        sbx_util_fail(err, len, "idmap: map gid %u", (unsigned)ids->ws_gid);
        goto out;
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        sbx_util_fail(err, len, "idmap: open %s", path);
out:
    /* The creator exits on this EOF. It is not waited for here (0.5-2.5 ms
     * of a sandbox's start, measured): the monitor's wait loop reaps it. */
    close(p[1]);
    return fd;
}

int sbx_ns_idmap_workspace(const char *workspace, sbx_ids *ids, char *err, size_t len)
{
    int ns = sbx_ns_idmap_userns(ids, err, len);
    if (ns < 0)
        return -1;
    int fd = open_tree(AT_FDCWD, workspace, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (fd < 0) {
        sbx_util_fail(err, len, "workspace %s", workspace);
        close(ns);
        return -1;
    }
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)ns};
    int rc = mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr);
    int e = errno;
    close(ns);
    if (rc == 0)
        return fd;
    close(fd);
    errno = e;
    if (e != EINVAL && e != EPERM && e != EOPNOTSUPP && e != ENOSYS)
        return sbx_util_fail(err, len, "workspace %s: idmapped mount", workspace);
    if (ids->ws_uid == 0) {
        snprintf(err, len,
                 "workspace %s is owned by root and its filesystem does not support idmapped "
                 "mounts (%s): use a workspace owned by an unprivileged user, or --sandbox none",
                 workspace, strerror(e));
        return -1;
    }
    /* Not root's: run as its owner, who can write it without any mapping. */
    ids->idmap = 0;
    ids->own_uid = 0;
    ids->host_uid = ids->uid;
    ids->host_gid = ids->gid;
    return -2;
}

int sbx_ns_creator_enter(const sbx_ids *ids, char *err, size_t len)
{
    if (setresgid((gid_t)-1, ids->host_gid, (gid_t)-1) < 0)
        return sbx_util_fail(err, len, "namespaces: effective gid %u", (unsigned)ids->host_gid);
    if (setresuid((uid_t)-1, ids->host_uid, (uid_t)-1) < 0) {
        sbx_util_fail(err, len, "namespaces: effective uid %u", (unsigned)ids->host_uid);
        sbx_ns_creator_leave();
        return -1;
    }
    /* Real and saved ids are still 0, so both are allowed; a second call
     * returns the value now in force. */
    setfsgid(0);
    setfsuid(0);
    if (setfsuid((uid_t)-1) != 0 || setfsgid((gid_t)-1) != 0) {
        errno = EPERM;
        sbx_util_fail(err, len, "namespaces: keep file-system ids 0");
        sbx_ns_creator_leave();
        return -1;
    }
    return 0;
}

void sbx_ns_creator_leave(void)
{
    /* Back to euid 0 (the kernel restores the effective capabilities), then
     * egid, which needs them. fsuid/fsgid follow. */
    if (setresuid((uid_t)-1, 0, (uid_t)-1) == 0)
        (void)!setresgid((gid_t)-1, 0, (gid_t)-1);
}

int sbx_ns_write_maps(pid_t pid, const sbx_ids *ids, char *err, size_t len)
{
    char path[64], line[64];
    snprintf(path, sizeof path, "/proc/%d/setgroups", (int)pid);
    if (sbx_util_write_file(path, "deny") < 0 && errno != ENOENT)
        return sbx_util_fail(err, len, "user namespace: write %s", path);
    snprintf(path, sizeof path, "/proc/%d/uid_map", (int)pid);
    snprintf(line, sizeof line, "%u %u 1\n", (unsigned)ids->uid, (unsigned)ids->host_uid);
    if (sbx_util_write_file(path, line) < 0)
        return sbx_util_fail(err, len, "user namespace: map uid %u", (unsigned)ids->host_uid);
    snprintf(path, sizeof path, "/proc/%d/gid_map", (int)pid);
    snprintf(line, sizeof line, "%u %u 1\n", (unsigned)ids->gid, (unsigned)ids->host_gid);
    if (sbx_util_write_file(path, line) < 0)
        return sbx_util_fail(err, len, "user namespace: map gid %u", (unsigned)ids->host_gid);
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
    /* A success is remembered for the life of the process: the kernel
     * server asks twice at start (sandbox_check, sandbox_protections), and
     * a fork costs ~1 ms. Only an answer, never a protection: the sandbox
     * itself still creates every namespace and fails when it cannot. */
    static int ok;
    if (ok)
        return 0;
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
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        ok = 1;
        return 0;
    }
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
