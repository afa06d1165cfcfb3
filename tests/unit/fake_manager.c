/*
 * fake_manager.c — see fake_manager.h.
 */
#include "tests/unit/fake_manager.h"
#include "tests/unit/fake_kernel.h"

#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

void fake_home_open(fake_home *h, const char *prefix, const char *const *langs)
{
    fake_home_open_conf(h, prefix, langs, NULL);
}

void fake_home_open_conf(fake_home *h, const char *prefix, const char *const *langs, json_t *extra)
{
    memset(h, 0, sizeof *h);
    assert_int_equal(fake_tmp_dir(h->home, sizeof h->home, prefix), 0);
    assert_int_equal(fake_kernel_link(h->home, h->link, sizeof h->link), 0);
    kmcfg_defaults(&h->cfg);
    json_t *kernels = json_object();
    for (size_t i = 0; langs[i]; i++)
        json_object_set_new(kernels, langs[i], json_pack("{s:s}", "backend", h->link));
    json_t *conf = json_pack("{s:o, s:s}", "kernels", kernels, "sandbox", "none");
    if (extra)
        json_object_update(conf, extra);
    km_err why = {0};
    int rc = kmcfg_apply_json(&h->cfg, conf, &why);
    json_decref(conf);
    if (rc)
        print_message("config: %s\n", why.msg);
    assert_int_equal(rc, 0);
    km_err err = {0};
    h->m = km_manager_new(h->home, &h->cfg, 0, &err);
    if (!h->m)
        print_message("km_manager_new: %s\n", err.msg);
    assert_non_null(h->m);
}

void fake_home_close(fake_home *h)
{
    km_manager_destroy(&h->m);
    kmcfg_clear(&h->cfg);
    fake_tmp_remove(h->home);
}
