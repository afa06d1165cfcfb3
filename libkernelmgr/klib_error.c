/*
 * klib_error.c — the error object of libkernelmgr (kernelmgr.h "Errors").
 */
#include "libkernelmgr/klib_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What an error says when even its message could not be allocated. */
static kernelmgr_error oom_error = {KERNELMGR_EINTERNAL, 0, "out of memory"};

int klib_fail(kernelmgr_error **err, int code, int rpc_code, const char *fmt, ...)
{
    if (!err)
        return -1;
    kernelmgr_error *e = malloc(sizeof *e);
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&msg, fmt, ap);
    va_end(ap);
    if (!e || n < 0) {
        free(e);
        *err = &oom_error;
        return -1;
    }
    e->code = code;
    e->rpc_code = rpc_code;
    e->msg = msg;
    *err = e;
    return -1;
}

void klib_ok(kernelmgr_error **err)
{
    if (err)
        *err = NULL;
}

KERNELMGR_API int kernelmgr_error_code(const kernelmgr_error *e)
{
    return e ? e->code : KERNELMGR_OK;
}

KERNELMGR_API int kernelmgr_error_rpc_code(const kernelmgr_error *e)
{
    return e ? e->rpc_code : 0;
}

KERNELMGR_API const char *kernelmgr_error_message(const kernelmgr_error *e)
{
    return e ? e->msg : "no error";
}

KERNELMGR_API void kernelmgr_error_free(kernelmgr_error *e)
{
    if (!e || e == &oom_error)
        return;
    free(e->msg);
    free(e);
}

KERNELMGR_API void kernelmgr_free(void *p)
{
    free(p);
}

KERNELMGR_API const char *kernelmgr_version(void)
{
#define KLIB_STR_(x) #x
#define KLIB_STR(x) KLIB_STR_(x)
    return KLIB_STR(KERNELMGR_VERSION_MAJOR) "." KLIB_STR(KERNELMGR_VERSION_MINOR) "." KLIB_STR(
        KERNELMGR_VERSION_PATCH);
}
