/*
 * doctor.h — `kernelmgr doctor`: what this host gives the kernels.
 *
 * The report answers the questions one asks before trusting a sandbox: which
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
 *    "kernels": {"python": {"path","found","allowed","kernelspec"}, "bash": {...}, ...}
 *                 (one per language of the table, lang.h),
 *    "python": {"found": bool, "interpreter","version","source","is_venv",
 *               "prefix","error"},
 *    "bash": {"found": bool, "path","version"},
 *    "sandbox": {"configured": "strict|none", "ok": bool,
 *                "levels": {"strict": {"available","missing","protections"},
 *                           "none": {...}}},
 *    "config": {...}}
 * "ok" is 1 when the configured sandbox level is available. */
json_t *doctor_report(const kmcfg *cfg, const char *home, const char *version);

/* Readable rendering of a report (borrowed). */
void doctor_render(FILE *out, const json_t *report);

#endif
