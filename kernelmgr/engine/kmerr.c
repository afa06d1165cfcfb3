/*
 * kmerr.c — km_err_set (kmerr.h).
 */
#include "kernelmgr/engine/kmerr.h"

#include <stdarg.h>
#include <stdio.h>

int km_err_set(km_err *e, int code, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        e->code = code;
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}
