/*
 * sbx_cgwarm.c — take the slow, one-time wait of a cgroup v1 attach off the
 * critical path of a sandbox's start.
 *
 * On cgroup v1 (no clone3(CLONE_INTO_CGROUP)) the monitor moves the
 * sandbox's init into its cgroups by writing cgroup.procs. The first such
 * write in a while waits for an RCU grace period (the global cgroup
 * threadgroup lock switches its readers to the slow path): 7-16 ms on the
 * 2-vCPU VM this was measured on, the longest single step of a cold start.
 * A write within about one grace period of the previous one takes ~0.05 ms,
 * and a writer that arrives while another one waits shares its grace
 * period.
 *
 * So a thread of the caller, started by sandbox_spawn() as soon as the
 * sandbox's cgroups exist (the wait holds the cgroup mutex: cgroups made
 * during it would wait too), moves itself - only itself, a thread that
 * exits right after - into the cgroup it is already in, by writing its
 * thread id to that cgroup's tasks file ("0" would mean the same thread
 * but skips the lock, and the wait with it). That changes nothing, but it
 * opens the grace period while the monitor sets up the namespaces and init
 * builds the root; the monitor's attach of init, 2-4 ms later, shares it
 * or finds it just passed. Measured: the attach ends 3-4 ms earlier, init
 * waits for it 2.6 ms instead of 5.6 (medians; bash cold start 21.3 ->
 * 17.7 ms).
 * Best effort: without cgroup v1 or write access nothing happens.
 */
#include "sandbox/sbx_internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The hierarchies sbx_limits.c attaches to on v1 (each one's lock is the
 * same global one: any of them will do). */
static const char *const sbx_cgwarm_ctrls[] = {"memory", "pids", "cpuacct"};

/* new: "/sys/fs/cgroup/CTRL/PATH/tasks" of the calling thread's cgroup in
 * the first v1 hierarchy of sbx_cgwarm_ctrls it is in, or NULL. */
static char *sbx_cgwarm_tasks_path(void)
{
    FILE *f = fopen("/proc/thread-self/cgroup", "re");
    if (!f)
        return NULL;
    char *line = NULL, *out = NULL;
    size_t cap = 0;
    for (size_t want = 0; !out && want < sizeof sbx_cgwarm_ctrls / sizeof *sbx_cgwarm_ctrls;
         want++) {
        rewind(f);
        while (!out && getline(&line, &cap, f) > 0) {
            /* "ID:CONTROLLERS:PATH\n"; v2's line has no controllers */
            char *c1 = strchr(line, ':');
            char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
            if (!c2)
                continue;
            *c2 = 0;
            char *save = NULL;
            for (char *tok = strtok_r(c1 + 1, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                if (!strcmp(tok, sbx_cgwarm_ctrls[want])) {
                    char *path = c2 + 1;
                    path[strcspn(path, "\n")] = 0;
                    if (asprintf(&out, "/sys/fs/cgroup/%s%s/tasks", sbx_cgwarm_ctrls[want],
                                 strcmp(path, "/") ? path : "") < 0)
                        out = NULL;
                    break;
                }
        }
    }
    free(line);
    fclose(f);
    return out;
}

static void *sbx_cgwarm_thread(void *arg)
{
    (void)arg;
    char *tasks = sbx_cgwarm_tasks_path();
    if (!tasks)
        return NULL;
    int fd = open(tasks, O_WRONLY | O_CLOEXEC);
    free(tasks);
    if (fd < 0)
        return NULL;
    /* This thread, by its id ("0" would skip the lock, and the wait with
     * it), into the cgroup it is in. */
    char tid[24];
    int n = snprintf(tid, sizeof tid, "%d", (int)gettid());
    ssize_t w = write(fd, tid, (size_t)n);
    (void)w;
    close(fd);
    return NULL;
}

void sbx_cgwarm_start(void)
{
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0)
        return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    /* Signals stay with the caller's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    /* Without a thread the monitor's attach just waits itself. */
    int rc = pthread_create(&t, &attr, sbx_cgwarm_thread, NULL);
    (void)rc;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}
