/*
 * doctor.h — `kernelmgr doctor`: what this host gives the kernels.
 *
 * The report answers the questions one asks before trusting a sandbox: does
 * a kernel of each language really start here (a trial cell), which
 * protections the strict level gets here (sandbox_check/sandbox_protections
 * of sandbox), which Python the python kernel would run (the same
 * detection as the kernel, kernels/python/pydetect), which bash, and the
 * versions of the libraries linked in.
 */
#ifndef KERNELMGR_DOCTOR_H
#define KERNELMGR_DOCTOR_H

#include "kernelmgr/engine/config.h"

#include <jansson.h>
#include <stdio.h>

/* new: the report as JSON:
 *   {"kernelmgr": VERSION, "host": {"kernel","arch","uid"}, "home",
 *    "versions": {"libzmq","libsodium","jansson","libseccomp","bash","python"},
 *    "helpers": the helper directory (cm_install.h),
 *    "kernels": {"python": {"path","found","allowed","kernelspec"}, "bash": {...}, ...}
 *                 (one per language of the table, lang.h),
 *    "python": {"found": bool, "interpreter","version","source","is_venv",
 *               "prefix","error", "used_by": ["exec","mcp","serve"],
 *               "packages": {"numpy": {"ok","version"|"error"}, "pandas", "matplotlib"},
 *               "demo": {"interpreter": "/usr/bin/python3", "same": bool, "packages"},
 *               "daemon": {the running daemon's interpreter, "pid"}},
 *    "bash": {"found": bool, "path","version"},
 *    "sandbox": {"configured": "strict|none", "ok": bool,
 *                "levels": {"strict": {"available","missing","protections"},
 *                           "none": {...}}},
 *    "privileges": {"identity": "root|unprivileged|userns-root",
 *                   "capabilities": {"SYS_ADMIN","SETUID","SETGID","KILL": bool},
 *                   "missing": [what a root daemon lacks]},
 *    "container": {"detected": bool, "kind", "evidence"},
 *    "cgroup": {"version": "v1|v2|hybrid|none", "writable", "delegated",
 *               "memory": "cgroup|rlimit", "cpu_rate_cap": bool},
 *    "trials": {LANG: {"ok": bool, "error", "ms"}} (a real start and a cell
 *               through the configured sandbox, for each allowed language),
 *    "warnings": [...], "problems": [...],
 *    "ok": bool, "config": {...}}
 * "sandbox.ok" is 1 when the configured level passes the static check; "ok"
 * only when there is no problem: the sandbox is available, every trial cell
 * ran, and a root daemon has the capabilities it needs. */
json_t *doctor_report(const kmcfg *cfg, const char *home, const char *version);

/* Readable rendering of a report (borrowed). */
void doctor_render(FILE *out, const json_t *report);

#endif
