/*
 * sbx_landlock.c — Landlock as a second wall behind the mounts: even if a
 * mount were wrong, the worker can only read (and execute) below / of its
 * own root, write below the workspace, /tmp and /dev/shm, and use the few
 * device nodes of /dev; signals and abstract unix sockets are scoped to the
 * sandbox (ABI 6). TCP ports are left alone (ABI 4's rules could only name
 * ports, not addresses): with network off the empty network namespace is
 * the wall, and what it lets through is the sandbox's own loopback (see
 * sbx_net.c).
 *
 * Debian's headers predate most of this, so the ABI is spelled out here.
 * Every right a newer ABI adds is handled when the kernel knows it, so the
 * ruleset is as strict as the running kernel allows ("best effort").
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

#define SBX_LL_CREATE_RULESET_VERSION (1U << 0)
#define SBX_LL_RULE_PATH_BENEATH 1

#define SBX_LL_FS_EXECUTE (1ULL << 0)
#define SBX_LL_FS_WRITE_FILE (1ULL << 1)
#define SBX_LL_FS_READ_FILE (1ULL << 2)
#define SBX_LL_FS_READ_DIR (1ULL << 3)
#define SBX_LL_FS_REFER (1ULL << 13)     /* ABI 2 */
#define SBX_LL_FS_TRUNCATE (1ULL << 14)  /* ABI 3 */
#define SBX_LL_FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */
#define SBX_LL_FS_V1 ((1ULL << 13) - 1)  /* execute .. make_sym */
#define SBX_LL_FS_MAKE_CHAR (1ULL << 6)
#define SBX_LL_FS_MAKE_BLOCK (1ULL << 11)

#define SBX_LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define SBX_LL_SCOPE_SIGNAL (1ULL << 1)               /* ABI 6 */

struct sbx_ll_ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net; /* ABI 4; none handled */
    uint64_t scoped;
};

struct sbx_ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

int sbx_landlock_abi(void)
{
    long v = syscall(SYS_landlock_create_ruleset, NULL, 0, SBX_LL_CREATE_RULESET_VERSION);
    return v > 0 ? (int)v : 0;
}

static uint64_t sbx_landlock_fs_rights(int abi)
{
    uint64_t r = SBX_LL_FS_V1;
    if (abi >= 2)
        r |= SBX_LL_FS_REFER;
    if (abi >= 3)
        r |= SBX_LL_FS_TRUNCATE;
    if (abi >= 5)
        r |= SBX_LL_FS_IOCTL_DEV;
    return r;
}

/* Adds a rule for path if it exists; a missing path is not an error (the
 * mounts decide what exists). */
static int sbx_landlock_allow(int ruleset, const char *path, uint64_t access, char *err, size_t len)
{
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : sbx_util_fail(err, len, "landlock: open %s", path);
    struct sbx_ll_path_beneath_attr pb = {.allowed_access = access, .parent_fd = fd};
    long rc = syscall(SYS_landlock_add_rule, ruleset, SBX_LL_RULE_PATH_BENEATH, &pb, 0);
    int saved = errno;
    close(fd);
    errno = saved;
    if (rc < 0)
        return sbx_util_fail(err, len, "landlock: rule for %s", path);
    return 0;
}

int sbx_landlock_apply(const sandbox_config *cfg, char *err, size_t len)
{
    int abi = sbx_landlock_abi();
    if (abi <= 0)
        return 0;
    uint64_t fs = sbx_landlock_fs_rights(abi);
    struct sbx_ll_ruleset_attr attr = {.handled_access_fs = fs};
    size_t attr_size = sizeof attr.handled_access_fs;
    if (abi >= 4)
        attr_size += sizeof attr.handled_access_net;
    if (abi >= 6) {
        attr_size += sizeof attr.scoped;
        attr.scoped = SBX_LL_SCOPE_ABSTRACT_UNIX_SOCKET | SBX_LL_SCOPE_SIGNAL;
    }
    int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0);
    if (rs < 0)
        return sbx_util_fail(err, len, "landlock: create ruleset (ABI %d)", abi);

    const uint64_t read = SBX_LL_FS_READ_FILE | SBX_LL_FS_READ_DIR | SBX_LL_FS_EXECUTE;
    const uint64_t rw = fs & ~(SBX_LL_FS_MAKE_CHAR | SBX_LL_FS_MAKE_BLOCK);
    const uint64_t dev = fs & (SBX_LL_FS_READ_FILE | SBX_LL_FS_WRITE_FILE | SBX_LL_FS_TRUNCATE |
                               SBX_LL_FS_IOCTL_DEV);
    static const char *const devs[] = {"/dev/null",    "/dev/zero", "/dev/full", "/dev/random",
                                       "/dev/urandom", "/dev/tty",  NULL};
    int rc = sbx_landlock_allow(rs, "/", read, err, len);
    if (rc == 0 && cfg->workspace)
        rc = sbx_landlock_allow(rs, cfg->workspace, rw, err, len);
    if (rc == 0)
        rc = sbx_landlock_allow(rs, "/tmp", rw, err, len);
    if (rc == 0)
        rc = sbx_landlock_allow(rs, "/dev/shm", rw, err, len);
    if (rc == 0)
        rc = sbx_landlock_allow(rs, "/dev/pts", dev | SBX_LL_FS_READ_DIR, err, len);
    for (const char *const *d = devs; rc == 0 && *d; d++)
        rc = sbx_landlock_allow(rs, *d, dev, err, len);
    if (rc == 0 && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        rc = sbx_util_fail(err, len, "no_new_privs");
    if (rc == 0 && syscall(SYS_landlock_restrict_self, rs, 0) < 0)
        rc = sbx_util_fail(err, len, "landlock: restrict self");
    close(rs);
    return rc < 0 ? -1 : abi;
}
