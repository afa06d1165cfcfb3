/*
 * daemon_http.c — the registered gateway operations (daemon_http.h).
 */
#include "kernelmgr/service/daemon_http.h"

#include <stdio.h>

static const daemon_http_ops *http_ops; /* set before daemon_serve, then read only */

void daemon_http_register(const daemon_http_ops *ops)
{
    http_ops = ops;
}

int daemon_http_start(km_manager *m, const daemon_http_listen *l, int *started, char *url,
                      size_t urlsize, int *port, km_err *err)
{
    *started = 0;
    if (!http_ops) {
        km_err_set(err, KM_EUSAGE, "this daemon has no HTTP frontend");
        return err->code;
    }
    return http_ops->start(m, l, started, url, urlsize, port, err);
}

void daemon_http_stop(void)
{
    if (http_ops)
        http_ops->stop();
}
