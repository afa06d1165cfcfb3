/*
 * sbx_caps.c — leave no privilege behind: no_new_privs (so no setuid binary,
 * file capability or LSM transition can give any back on exec) and every
 * capability set emptied, the bounding set included.
 */
#include "sandbox/sbx_internal.h"

#include <errno.h>
#include <linux/capability.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static int sbx_caps_last(void)
{
    FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
    int last = 63;
    if (f) {
        if (fscanf(f, "%d", &last) != 1)
            last = 63;
        fclose(f);
    }
    return last;
}

int sbx_caps_drop_all(char *err, size_t len)
{
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return sbx_util_fail(err, len, "no_new_privs");
    /* /proc may already be the sandbox's own: cap_last_cap is readable
     * there; 63 is a safe upper bound when it is not (EINVAL ends it). */
    int last = sbx_caps_last();
    for (int c = 0; c <= last; c++)
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
            return sbx_util_fail(err, len, "drop capability %d from the bounding set", c);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return sbx_util_fail(err, len, "clear ambient capabilities");
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof data);
    if (syscall(SYS_capset, &hdr, data) < 0)
        return sbx_util_fail(err, len, "drop capabilities");
    return 0;
}
