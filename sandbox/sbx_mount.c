/*
 * sbx_mount.c — the sandbox's filesystem: a fresh tmpfs root, remounted
 * read-only, holding only what the worker needs.
 *
 *   /usr /bin /sbin /lib* ro binds (merged-usr symlinks recreated as symlinks)
 *   /etc                  generated passwd, group, hosts, hostname (+resolv.conf
 *                         with network on) and ro binds of the pieces programs
 *                         read: ld.so.cache, alternatives, ssl, localtime, ...
 *   cfg->ro_paths         ro binds at the same absolute path (one inside the
 *                         workspace stays read-only there)
 *   workspace             rw bind at the same absolute path (tracebacks and
 *                         paths printed by the worker are valid on the host)
 *   /tmp, /dev/shm        tmpfs of cfg->tmp_bytes each
 *   /dev                  ro tmpfs with binds of null zero full random urandom
 *                         tty, a private devpts instance, the usual symlinks
 *   /proc                 fresh procfs of the sandbox's pid namespace, with
 *                         sys, sysrq-trigger, irq, bus, fs read-only
 *   /sys                  not mounted
 *
 * Two phases, because the host paths must be resolved with the caller's
 * access rights: when the caller is root the sandbox later switches to an
 * unprivileged uid that could not even traverse /root or a 0700 pytest
 * directory. sbx_mount_prepare() therefore clones every source tree with
 * open_tree(OPEN_TREE_CLONE) first; sbx_mount_build() attaches the clones
 * with move_mount() once the process has its final uid.
 *
 * Every mount is nosuid and nodev (except the bound device nodes, which are
 * noexec instead); the read-only ones are made so recursively with
 * mount_setattr(AT_RECURSIVE), so submounts of /usr cannot stay writable.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Where the new root is assembled before pivot_root (as bubblewrap does:
 * every host has it, and pivot_root uncovers the host's /tmp again). */
#define SBX_MOUNT_BASE "/tmp"

typedef enum { SBX_RO, SBX_RW, SBX_DEV } sbx_mount_mode;

typedef struct sbx_mount_tree {
    int fd;       /* detached clone from open_tree */
    char *target; /* absolute path inside the sandbox */
    int is_dir;
    sbx_mount_mode mode;
} sbx_mount_tree;

typedef struct sbx_mount_link {
    char *target;  /* absolute path inside the sandbox */
    char *content; /* what the symlink points to */
} sbx_mount_link;

struct sbx_mount_plan {
    sbx_mount_tree *trees;
    size_t ntrees, cap_trees;
    sbx_mount_link *links;
    size_t nlinks, cap_links;
    char user[64], group[64];
};

/* System directories bound read-only (or recreated as symlinks): the one
 * list, sandbox.h. */
const char *const sandbox_system_dirs[] = {"/usr",   "/bin",   "/sbin",   "/lib",
                                           "/lib32", "/lib64", "/libx32", NULL};

int sandbox_is_system_path(const char *path)
{
    for (const char *const *d = sandbox_system_dirs; *d; d++)
        if (sbx_util_path_under(path, *d))
            return 1;
    return 0;
}

/* /etc pieces programs read. Missing ones are skipped. passwd, group, hosts,
 * hostname, mtab and resolv.conf are generated instead. */
static const char *const sbx_mount_etc[] = {"/etc/ld.so.cache",
                                            "/etc/ld.so.conf",
                                            "/etc/ld.so.conf.d",
                                            "/etc/alternatives",
                                            "/etc/ssl",
                                            "/etc/ca-certificates",
                                            "/etc/ca-certificates.conf",
                                            "/etc/pki",
                                            "/etc/localtime",
                                            "/etc/timezone",
                                            "/etc/nsswitch.conf",
                                            "/etc/protocols",
                                            "/etc/services",
                                            "/etc/mime.types",
                                            "/etc/magic",
                                            "/etc/magic.mime",
                                            "/etc/os-release",
                                            "/etc/debian_version",
                                            "/etc/matplotlibrc",
                                            "/etc/python3",
                                            "/etc/python3.11",
                                            "/etc/python3.12",
                                            "/etc/python3.13",
                                            "/etc/fonts",
                                            "/etc/bash.bashrc",
                                            "/etc/inputrc",
                                            "/etc/profile",
                                            "/etc/environment",
                                            "/etc/locale.alias",
                                            "/etc/terminfo",
                                            "/etc/gitconfig",
                                            "/etc/pip.conf",
                                            "/etc/xdg",
                                            NULL};

/* Only with network on: how to resolve names. resolv.conf is generated. */
static const char *const sbx_mount_etc_net[] = {"/etc/host.conf", "/etc/gai.conf", NULL};

static const char *const sbx_mount_devs[] = {
    "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", NULL};

static int sbx_mount_add_tree(sbx_mount_plan *p, int fd, const char *target, int is_dir,
                              sbx_mount_mode mode)
{
    if (p->ntrees == p->cap_trees) {
        size_t n = p->cap_trees ? p->cap_trees * 2 : 32;
        sbx_mount_tree *t = realloc(p->trees, n * sizeof *t);
        if (!t)
            return -1;
        p->trees = t;
        p->cap_trees = n;
    }
    char *dup = strdup(target);
    if (!dup)
        return -1;
    sbx_mount_tree *t = &p->trees[p->ntrees++];
    t->fd = fd;
    t->target = dup;
    t->is_dir = is_dir;
    t->mode = mode;
    return 0;
}

static int sbx_mount_add_link(sbx_mount_plan *p, const char *target, const char *content)
{
    if (p->nlinks == p->cap_links) {
        size_t n = p->cap_links ? p->cap_links * 2 : 16;
        sbx_mount_link *l = realloc(p->links, n * sizeof *l);
        if (!l)
            return -1;
        p->links = l;
        p->cap_links = n;
    }
    char *t = strdup(target), *c = strdup(content);
    if (!t || !c) {
        free(t);
        free(c);
        return -1;
    }
    sbx_mount_link *l = &p->links[p->nlinks++];
    l->target = t;
    l->content = c;
    return 0;
}

/* Clones host path for later attachment. Symlinks are recorded as symlinks
 * when keep_links (merged /usr, /etc/localtime), else followed. Returns 0,
 * 1 when the path does not exist, -1 on error. */
static int sbx_mount_clone(sbx_mount_plan *p, const char *path, const char *target,
                           sbx_mount_mode mode, int keep_links, char *err, size_t len)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        if (errno == ENOENT)
            return 1;
        return sbx_util_fail(err, len, "mount: stat %s", path);
    }
    if (S_ISLNK(st.st_mode) && keep_links) {
        char buf[PATH_MAX];
        ssize_t n = readlink(path, buf, sizeof buf - 1);
        if (n < 0)
            return sbx_util_fail(err, len, "mount: readlink %s", path);
        buf[n] = 0;
        if (sbx_mount_add_link(p, target, buf) < 0)
            return sbx_util_fail(err, len, "mount: out of memory");
        return 0;
    }
    if (stat(path, &st) < 0) {
        if (errno == ENOENT)
            return 1; /* dangling symlink */
        return sbx_util_fail(err, len, "mount: stat %s", path);
    }
    int fd = open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (fd < 0)
        return sbx_util_fail(err, len, "mount: clone %s", path);
    if (sbx_mount_add_tree(p, fd, target, S_ISDIR(st.st_mode), mode) < 0) {
        close(fd);
        return sbx_util_fail(err, len, "mount: out of memory");
    }
    return 0;
}

/* True when path already shows up inside the sandbox through a system
 * directory (Debian's /usr/bin/python3 and its prefix /usr). */
static int sbx_mount_under_sysdir(const char *path)
{
    char real[PATH_MAX];
    if (!realpath(path, real))
        return 0;
    for (const char *const *d = sandbox_system_dirs; *d; d++) {
        char rd[PATH_MAX];
        if (!realpath(*d, rd))
            continue;
        if (sbx_util_path_under(real, rd))
            return 1;
    }
    return 0;
}

void sbx_mount_plan_free(sbx_mount_plan **pp)
{
    if (!pp || !*pp)
        return;
    sbx_mount_plan *p = *pp;
    for (size_t i = 0; i < p->ntrees; i++) {
        if (p->trees[i].fd >= 0)
            close(p->trees[i].fd);
        free(p->trees[i].target);
    }
    for (size_t i = 0; i < p->nlinks; i++) {
        free(p->links[i].target);
        free(p->links[i].content);
    }
    free(p->trees);
    free(p->links);
    free(p);
    *pp = NULL;
}

sbx_mount_plan *sbx_mount_prepare(const sandbox_config *cfg, const sbx_ids *ids, int ws_fd,
                                  char *err, size_t len)
{
    /* Nothing done here may propagate back to the host's mount namespace. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        sbx_util_fail(err, len, "mount: make / private");
        if (ws_fd >= 0)
            close(ws_fd);
        return NULL;
    }
    sbx_mount_plan *p = calloc(1, sizeof *p);
    if (!p) {
        snprintf(err, len, "mount: out of memory");
        if (ws_fd >= 0)
            close(ws_fd);
        return NULL;
    }
    /* The idmapped clone the monitor made replaces a plain one. */
    if (ws_fd >= 0 && sbx_mount_add_tree(p, ws_fd, cfg->workspace, 1, SBX_RW) < 0) {
        close(ws_fd);
        snprintf(err, len, "mount: out of memory");
        goto fail;
    }
    for (const char *const *d = sandbox_system_dirs; *d; d++)
        if (sbx_mount_clone(p, *d, *d, SBX_RO, 1, err, len) < 0)
            goto fail;
    for (const char *const *e = sbx_mount_etc; *e; e++)
        if (sbx_mount_clone(p, *e, *e, SBX_RO, 1, err, len) < 0)
            goto fail;
    if (cfg->network)
        for (const char *const *e = sbx_mount_etc_net; *e; e++)
            if (sbx_mount_clone(p, *e, *e, SBX_RO, 1, err, len) < 0)
                goto fail;
    for (const char *const *d = sbx_mount_devs; *d; d++)
        if (sbx_mount_clone(p, *d, *d, SBX_DEV, 0, err, len) < 0)
            goto fail;
    for (const char *const *r = cfg->ro_paths; r && *r; r++) {
        if ((*r)[0] != '/') {
            errno = 0;
            sbx_util_fail(err, len, "read-only path %s is not absolute", *r);
            goto fail;
        }
        if (sbx_mount_under_sysdir(*r))
            continue;
        int rc = sbx_mount_clone(p, *r, *r, SBX_RO, 0, err, len);
        if (rc < 0)
            goto fail;
        if (rc == 1) {
            errno = ENOENT;
            sbx_util_fail(err, len, "read-only path %s", *r);
            goto fail;
        }
    }
    if (cfg->workspace && ws_fd < 0) {
        int rc = sbx_mount_clone(p, cfg->workspace, cfg->workspace, SBX_RW, 0, err, len);
        if (rc != 0) {
            if (rc == 1) {
                errno = ENOENT;
                sbx_util_fail(err, len, "workspace %s", cfg->workspace);
            }
            goto fail;
        }
    }
    /* Names for the generated passwd/group, looked up while the host's /etc
     * is still visible. */
    struct passwd *pw = getpwuid(ids->uid);
    snprintf(p->user, sizeof p->user, "%s", pw && pw->pw_name ? pw->pw_name : "sandbox");
    struct group *gr = getgrgid(ids->gid);
    snprintf(p->group, sizeof p->group, "%s", gr && gr->gr_name ? gr->gr_name : "sandbox");
    return p;
fail:
    sbx_mount_plan_free(&p);
    return NULL;
}

/* mkdir -p for a path relative to the cwd (the new root). Existing
 * directories are fine even on read-only mounts. */
static int sbx_mount_mkdirs(const char *rel, mode_t mode, char *err, size_t len)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", rel) >= (int)sizeof buf) {
        errno = ENAMETOOLONG;
        return sbx_util_fail(err, len, "mount: %s", rel);
    }
    for (char *s = buf;; s++) {
        if (*s == '/' || *s == 0) {
            char c = *s;
            *s = 0;
            struct stat st;
            if (buf[0] && stat(buf, &st) < 0 && mkdir(buf, mode) < 0 && errno != EEXIST)
                return sbx_util_fail(err, len, "mount: mkdir /%s", buf);
            *s = c;
            if (c == 0)
                break;
        }
    }
    return 0;
}

static int sbx_mount_touch(const char *rel, char *err, size_t len)
{
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", rel);
    char *slash = strrchr(parent, '/');
    if (slash) {
        *slash = 0;
        if (sbx_mount_mkdirs(parent, 0755, err, len) < 0)
            return -1;
    }
    struct stat st;
    if (stat(rel, &st) == 0)
        return 0;
    int fd = open(rel, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return sbx_util_fail(err, len, "mount: create /%s", rel);
    close(fd);
    return 0;
}

static int sbx_mount_setattr(const char *rel, uint64_t set, int recursive, char *err, size_t len)
{
    struct mount_attr attr = {.attr_set = set};
    if (mount_setattr(AT_FDCWD, rel, recursive ? AT_RECURSIVE : 0, &attr, sizeof attr) < 0)
        return sbx_util_fail(err, len, "mount: set attributes of /%s", rel);
    return 0;
}

static int sbx_mount_attach(sbx_mount_tree *t, char *err, size_t len)
{
    const char *rel = t->target + 1; /* targets are absolute */
    if ((t->is_dir ? sbx_mount_mkdirs(rel, 0755, err, len) : sbx_mount_touch(rel, err, len)) < 0)
        return -1;
    if (move_mount(t->fd, "", AT_FDCWD, rel, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        return sbx_util_fail(err, len, "mount: attach %s", t->target);
    close(t->fd);
    t->fd = -1;
    uint64_t set = t->mode == SBX_RO   ? MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                   : t->mode == SBX_RW ? MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
                                       : MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
    return sbx_mount_setattr(rel, set, 1, err, len);
}

static int sbx_mount_write(const char *rel, const char *text, char *err, size_t len)
{
    int fd = open(rel, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return sbx_util_fail(err, len, "mount: create /%s", rel);
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    close(fd);
    if (w != (ssize_t)n)
        return sbx_util_fail(err, len, "mount: write /%s", rel);
    return 0;
}

static int sbx_mount_tmpfs(const char *rel, const char *opts, unsigned long flags, char *err,
                           size_t len)
{
    if (sbx_mount_mkdirs(rel, 0755, err, len) < 0)
        return -1;
    if (mount("tmpfs", rel, "tmpfs", flags, opts) < 0)
        return sbx_util_fail(err, len, "mount: tmpfs on /%s (%s)", rel, opts);
    return 0;
}

/* A world-writable scratch tmpfs (/tmp, /dev/shm) of the configured size. */
static int sbx_mount_scratch(const char *rel, const sandbox_config *cfg, char *err, size_t len)
{
    char opts[64];
    snprintf(opts, sizeof opts, "mode=1777,size=%llu", (unsigned long long)cfg->tmp_bytes);
    return sbx_mount_tmpfs(rel, opts, MS_NOSUID | MS_NODEV, err, len);
}

static int sbx_mount_etc_files(const sbx_mount_plan *p, const sandbox_config *cfg,
                               const sbx_ids *ids, char *err, size_t len)
{
    char buf[1024];
    if (sbx_mount_mkdirs("etc", 0755, err, len) < 0)
        return -1;
    /* Home is /tmp: caches (matplotlib, pip) then land in the size-capped
     * tmpfs rather than in the workspace. The caller's HOME wins anyway. */
    if (ids->uid == 65534)
        snprintf(buf, sizeof buf,
                 "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                 "nobody:x:65534:65534:nobody:/tmp:/bin/bash\n");
    else
        snprintf(buf, sizeof buf,
                 "root:x:0:0:root:/root:/usr/sbin/nologin\n"
                 "%s:x:%u:%u:sandbox user:/tmp:/bin/bash\n"
                 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                 strcmp(p->user, "root") && strcmp(p->user, "nobody") ? p->user : "sandbox",
                 (unsigned)ids->uid, (unsigned)ids->gid);
    if (sbx_mount_write("etc/passwd", buf, err, len) < 0)
        return -1;
    if (ids->gid == 65534)
        snprintf(buf, sizeof buf, "root:x:0:\nnogroup:x:65534:\n");
    else
        snprintf(buf, sizeof buf, "root:x:0:\n%s:x:%u:\nnogroup:x:65534:\n",
                 strcmp(p->group, "root") && strcmp(p->group, "nogroup") ? p->group : "sandbox",
                 (unsigned)ids->gid);
    if (sbx_mount_write("etc/group", buf, err, len) < 0)
        return -1;
    if (sbx_mount_write("etc/hostname", "sandbox\n", err, len) < 0 ||
        sbx_mount_write("etc/hosts", "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost\n",
                        err, len) < 0)
        return -1;
    /* slirp4netns forwards 10.0.2.3 to the host's resolver. */
    if (cfg->network && sbx_mount_write("etc/resolv.conf", "nameserver 10.0.2.3\n", err, len) < 0)
        return -1;
    if (symlink("../proc/self/mounts", "etc/mtab") < 0 && errno != EEXIST)
        return sbx_util_fail(err, len, "mount: symlink /etc/mtab");
    return 0;
}

static int sbx_mount_dev(sbx_mount_plan *p, const sandbox_config *cfg, char *err, size_t len)
{
    if (sbx_mount_tmpfs("dev", "mode=0755,size=64k,nr_inodes=256", MS_NOSUID | MS_NOEXEC, err,
                        len) < 0)
        return -1;
    for (size_t i = 0; i < p->ntrees; i++)
        if (p->trees[i].mode == SBX_DEV && sbx_mount_attach(&p->trees[i], err, len) < 0)
            return -1;
    if (sbx_mount_scratch("dev/shm", cfg, err, len) < 0)
        return -1;
    /* A private pty instance for programs that want one (python's pty,
     * `script`); optional, the sandbox works without it. */
    if (sbx_mount_mkdirs("dev/pts", 0755, err, len) < 0)
        return -1;
    if (mount("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
              "newinstance,ptmxmode=0666,mode=0620") == 0)
        (void)!symlink("pts/ptmx", "dev/ptmx");
    static const char *const links[][2] = {{"/proc/self/fd", "dev/fd"},
                                           {"/proc/self/fd/0", "dev/stdin"},
                                           {"/proc/self/fd/1", "dev/stdout"},
                                           {"/proc/self/fd/2", "dev/stderr"}};
    for (size_t i = 0; i < sizeof links / sizeof *links; i++)
        if (symlink(links[i][0], links[i][1]) < 0)
            return sbx_util_fail(err, len, "mount: symlink /%s", links[i][1]);
    return sbx_mount_setattr("dev", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, 0,
                             err, len);
}

static int sbx_mount_proc(char *err, size_t len)
{
    if (sbx_mount_mkdirs("proc", 0555, err, len) < 0)
        return -1;
    /* Must happen while the host's /proc is still in this mount namespace:
     * the kernel refuses a new procfs in a user namespace that cannot see a
     * full one. */
    if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return sbx_util_fail(err, len, "mount: proc");
    /* Kernel tunables and triggers stay read-only even for a future bug that
     * would give the worker capabilities over its namespaces. */
    static const char *const ro[] = {
        "proc/sys", "proc/sysrq-trigger", "proc/irq", "proc/bus", "proc/fs", NULL};
    for (const char *const *r = ro; *r; r++) {
        struct stat st;
        if (stat(*r, &st) < 0)
            continue;
        if (mount(*r, *r, NULL, MS_BIND | MS_REC, NULL) < 0)
            return sbx_util_fail(err, len, "mount: bind /%s", *r);
        if (sbx_mount_setattr(*r, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 1, err,
                              len) < 0)
            return -1;
    }
    return 0;
}

int sbx_mount_build(sbx_mount_plan *p, const sandbox_config *cfg, const sbx_ids *ids, char *err,
                    size_t len)
{
    if (mount("tmpfs", SBX_MOUNT_BASE, "tmpfs", MS_NOSUID | MS_NODEV,
              "mode=0755,size=4m,nr_inodes=4096") < 0)
        return sbx_util_fail(err, len, "mount: tmpfs root on " SBX_MOUNT_BASE);
    if (chdir(SBX_MOUNT_BASE) < 0)
        return sbx_util_fail(err, len, "mount: chdir " SBX_MOUNT_BASE);

    /* System directories and /etc pieces first: later mount points may be
     * nested under them (an interpreter prefix below /opt, say). */
    for (size_t i = 0; i < p->nlinks; i++) {
        const char *rel = p->links[i].target + 1;
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%s", rel);
        char *slash = strrchr(parent, '/');
        if (slash) {
            *slash = 0;
            if (sbx_mount_mkdirs(parent, 0755, err, len) < 0)
                return -1;
        }
        if (symlink(p->links[i].content, rel) < 0)
            return sbx_util_fail(err, len, "mount: symlink %s", p->links[i].target);
    }
    for (size_t i = 0; i < p->ntrees; i++) {
        const char *t = p->trees[i].target;
        int system = p->trees[i].mode == SBX_RO &&
                     (strncmp(t, "/etc/", 5) == 0 || strncmp(t, "/usr", 4) == 0 ||
                      strncmp(t, "/lib", 4) == 0 || !strcmp(t, "/bin") || !strcmp(t, "/sbin"));
        if (system && sbx_mount_attach(&p->trees[i], err, len) < 0)
            return -1;
    }
    if (sbx_mount_etc_files(p, cfg, ids, err, len) < 0)
        return -1;
    if (sbx_mount_dev(p, cfg, err, len) < 0 || sbx_mount_proc(err, len) < 0)
        return -1;
    if (sbx_mount_scratch("tmp", cfg, err, len) < 0)
        return -1;
    if (sbx_mount_mkdirs("var", 0755, err, len) < 0)
        return -1;
    if (symlink("../tmp", "var/tmp") < 0)
        return sbx_util_fail(err, len, "mount: symlink /var/tmp");
    /* The remaining trees (ro_paths, the workspace), each before those
     * nested in it: shortest target first, a read-only one before the
     * workspace at the same path. So an ro path holding the workspace does
     * not make the workspace ro, and one inside the workspace stays ro. */
    for (;;) {
        sbx_mount_tree *next = NULL;
        for (size_t i = 0; i < p->ntrees; i++) {
            sbx_mount_tree *t = &p->trees[i];
            if (t->fd < 0)
                continue;
            size_t n = strlen(t->target), best = next ? strlen(next->target) : 0;
            if (!next || n < best || (n == best && t->mode == SBX_RO && next->mode != SBX_RO))
                next = t;
        }
        if (!next)
            break;
        if (sbx_mount_attach(next, err, len) < 0)
            return -1;
    }

    /* pivot_root(".", ".") stacks the old root on top of the new one; the
     * lazy unmount then drops every host mount from this namespace. */
    if (syscall(SYS_pivot_root, ".", ".") < 0)
        return sbx_util_fail(err, len, "mount: pivot_root");
    if (umount2(".", MNT_DETACH) < 0)
        return sbx_util_fail(err, len, "mount: detach the host's root");
    if (chdir("/") < 0)
        return sbx_util_fail(err, len, "mount: chdir /");
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    if (mount_setattr(AT_FDCWD, "/", 0, &attr, sizeof attr) < 0)
        return sbx_util_fail(err, len, "mount: remount / read-only");
    if (cfg->workspace && chdir(cfg->workspace) < 0)
        return sbx_util_fail(err, len, "chdir %s", cfg->workspace);
    return 0;
}
