/*
 * netopt.c — a session's network option (see netopt.h).
 */
#include "kernelmgr/engine/netopt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_policy(const egpolicy *p, int *network, char *allow, size_t n, const char *what,
                      km_err *err)
{
    char text[KM_NET_ALLOW_MAX];
    egpolicy_format(p, text, sizeof text);
    if (strlen(text) + 1 > n) {
        km_err_set(err, KM_EUSAGE, "%s: the allow list is too long", what);
        return -1;
    }
    snprintf(allow, n, "%s", text);
    *network = KM_NET_ALLOW;
    return 0;
}

int km_net_from_json(const json_t *v, const char *what, int *network, char *allow, size_t n,
                     km_err *err)
{
    allow[0] = 0;
    if (json_is_boolean(v)) {
        *network = json_is_true(v) ? KM_NET_ON : KM_NET_OFF;
        return 0;
    }
    const char *s = json_string_value(v);
    if (s && (!strcmp(s, "on") || !strcmp(s, "off"))) {
        *network = !strcmp(s, "on") ? KM_NET_ON : KM_NET_OFF;
        return 0;
    }
    if (!json_is_object(v)) {
        km_err_set(err, KM_EUSAGE,
                   "%s: must be \"on\", \"off\" or {\"allow\": [\"host[:port]\", ...]} (got %s)",
                   what,
                   s                   ? "another string"
                   : json_is_number(v) ? "a number"
                   : json_is_array(v)  ? "an array"
                   : json_is_null(v)   ? "null"
                                       : "another value");
        return -1;
    }
    egpolicy *p = malloc(sizeof *p);
    if (!p) {
        km_err_set(err, KM_EUSAGE, "%s: out of memory", what);
        return -1;
    }
    char why[sizeof err->msg];
    int rc = 0;
    if (egpolicy_from_json(p, v, what, why, sizeof why)) {
        km_err_set(err, KM_EUSAGE, "%s", why);
        rc = -1;
    } else {
        rc = set_policy(p, network, allow, n, what, err);
    }
    free(p);
    return rc ? -1 : 0;
}

int km_net_from_text(const char *s, const char *what, int *network, char *allow, size_t n,
                     km_err *err)
{
    allow[0] = 0;
    if (!strcmp(s, "on") || !strcmp(s, "off")) {
        *network = !strcmp(s, "on") ? KM_NET_ON : KM_NET_OFF;
        return 0;
    }
    if (!egpolicy_is_text(s)) {
        km_err_set(err, KM_EUSAGE, "%s must be on, off or allow:HOST[,HOST...] (got \"%.80s\")",
                   what, s);
        return -1;
    }
    egpolicy *p = malloc(sizeof *p);
    if (!p) {
        km_err_set(err, KM_EUSAGE, "%s: out of memory", what);
        return -1;
    }
    char why[600];
    int rc = 0;
    if (egpolicy_parse_text(p, s, why, sizeof why)) {
        km_err_set(err, KM_EUSAGE, "%s: %s", what, why);
        rc = -1;
    } else {
        rc = set_policy(p, network, allow, n, what, err);
    }
    free(p);
    return rc;
}

json_t *km_net_json(int network, const char *allow)
{
    if (network != KM_NET_ALLOW)
        return json_string(network == KM_NET_ON ? "on" : "off");
    egpolicy *p = malloc(sizeof *p);
    char why[400];
    json_t *j = p && !egpolicy_parse_text(p, allow, why, sizeof why) ? egpolicy_to_json(p) : NULL;
    free(p);
    return j ? j : json_string("off");
}

const char *km_net_text(int network, const char *allow)
{
    return network == KM_NET_ALLOW ? allow : network == KM_NET_ON ? "on" : "off";
}

int km_net_equal(int a, const char *a_allow, int b, const char *b_allow)
{
    return a == b && (a != KM_NET_ALLOW || !strcmp(a_allow ? a_allow : "", b_allow ? b_allow : ""));
}
