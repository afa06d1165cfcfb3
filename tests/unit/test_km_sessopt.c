/* Unit tests of kernelmgr/engine/sessopt.c, the session options' table:
 * each row is consistent (its name unique, its config key in kmcfg_opts
 * with the same field and a matching type, its fields inside the structs,
 * its hooks there), the API's table (dtier_sessopts) names the same
 * options, and a session's options survive create -> save -> load -> fork
 * through the table's code, with the warm-pool test and the warnings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/netopt.h"
#include "kernelmgr/engine/session_int.h"
#include "kernelmgr/engine/sessopt.h"
#include "kernelmgr/service/dtier.h"

/* the size of the km_session_opts field of a row's type */
static size_t opts_size(const km_sessopt *r)
{
    switch (r->type) {
    case KM_SO_BOOL:
        return sizeof(int);
    case KM_SO_SIZE:
        return sizeof(unsigned long long);
    case KM_SO_NUMBER:
        return sizeof(double);
    case KM_SO_STRING:
        return sizeof(const char *);
    case KM_SO_SPECIAL:
        break;
    }
    return 1;
}

static void rows_consistent(void **state)
{
    (void)state;
    int n = 0;
    for (const km_sessopt *r = km_sessopts; r->name; r++, n++) {
        /* unique */
        for (const km_sessopt *q = km_sessopts; q < r; q++)
            assert_string_not_equal(q->name, r->name);
        assert_ptr_equal(km_sessopt_find(r->name), r);
        /* the warning's flag: --NAME with - for _ */
        char flag[64];
        snprintf(flag, sizeof flag, "--%s", r->name);
        for (char *p = flag; *p; p++)
            if (*p == '_')
                *p = '-';
        assert_string_equal(r->flag, flag);
        /* inside the structs */
        assert_true(r->o_off + opts_size(r) <= sizeof(km_session_opts));
        assert_true(r->s_size > 0 && r->s_off + r->s_size <= sizeof(session));
        if (r->type == KM_SO_BOOL)
            assert_int_equal(r->s_size, sizeof(int));
        if (r->type == KM_SO_SIZE)
            assert_int_equal(r->s_size, sizeof(unsigned long long));
        if (r->type == KM_SO_NUMBER)
            assert_int_equal(r->s_size, sizeof(double));
        if (r->type == KM_SO_STRING)
            assert_true(r->s_size > 1);
        if (r->type == KM_SO_SPECIAL)
            assert_non_null(r->hooks);
        else
            assert_null(r->hooks);
        if (r->flags & KM_SO_CFG_FILL)
            assert_int_equal(r->type, KM_SO_STRING);
        if ((r->flags & KM_SO_WARN) && (r->type == KM_SO_SIZE || r->type == KM_SO_NUMBER))
            assert_true(r->unit && r->none);
        /* the config key it overrides */
        const kmcfg_opt *c = kmcfg_opt_find(r->name);
        if (r->flags & KM_SO_NO_CONFIG) {
            assert_null(c);
            continue;
        }
        assert_non_null(c);
        assert_true(r->c_off < sizeof(kmcfg));
        if (c->type != KMCFG_SPECIAL)
            assert_int_equal(c->off, r->c_off);
        switch (r->type) {
        case KM_SO_BOOL:
            assert_int_equal(c->type, KMCFG_BOOL);
            break;
        case KM_SO_NUMBER:
            assert_int_equal(c->type, KMCFG_SECONDS);
            break;
        case KM_SO_SIZE:
            assert_true(c->type == KMCFG_SIZE || c->type == KMCFG_SPECIAL);
            break;
        case KM_SO_STRING:
            assert_true(c->type == KMCFG_STRING || c->type == KMCFG_ENUM ||
                        c->type == KMCFG_SPECIAL);
            if (c->type != KMCFG_SPECIAL)
                assert_true(c->size >= 2);
            break;
        case KM_SO_SPECIAL:
            break;
        }
    }
    assert_true(n > 0);
    /* the API's table names the same options */
    int nd = 0;
    for (const dtier_sessopt *d = dtier_sessopts; d->f.name; d++, nd++)
        assert_non_null(km_sessopt_find(d->f.name));
    assert_int_equal(nd, n);
}

static km_manager *manager(void)
{
    km_manager *m = calloc(1, sizeof *m);
    assert_non_null(m);
    kmcfg_defaults(&m->cfg);
    return m;
}

static void manager_free(km_manager *m)
{
    json_decref(m->cfg.env);
    free(m);
}

/* opts with every option of the table set to a value other than the
 * configuration's (env to own, a fresh object) */
static void opts_all(km_session_opts *o, json_t *env)
{
    km_session_opts_init(o);
    o->network = KM_NET_ALLOW;
    snprintf(o->network_allow_buf, sizeof o->network_allow_buf, "allow:pypi.org");
    o->network_allow = o->network_allow_buf;
    o->memory = 300ull << 20;
    o->cpus = 1.5;
    o->cpu_time = 30;
    o->python = "/usr/bin/python3";
    o->workspace = "/tmp";
    o->sandbox = "none";
    o->zygote = 0;
    o->ipython = 1;
    o->snapshot_max = 1ull << 20;
    json_object_set_new(env, "MY_SETTING", json_string("a b=c"));
    o->env = env;
}

static void pool_default(void **state)
{
    (void)state;
    km_manager *m = manager();
    km_session_opts o;
    km_session_opts_init(&o);
    assert_true(km_sessopt_default(m, NULL));
    assert_true(km_sessopt_default(m, &o));
    /* the configuration's own values keep a session in the pool */
    o.zygote = m->cfg.zygote;
    o.ipython = m->cfg.ipython;
    o.sandbox = m->cfg.sandbox;
    assert_true(km_sessopt_default(m, &o));
    o.ipython = !m->cfg.ipython;
    assert_false(km_sessopt_default(m, &o));
    km_session_opts_init(&o);
    o.cpus = 1;
    assert_false(km_sessopt_default(m, &o));
    km_session_opts_init(&o);
    o.python = "/usr/bin/python3";
    assert_false(km_sessopt_default(m, &o));
    manager_free(m);
}

static void round_trip(void **state)
{
    (void)state;
    km_manager *m = manager();
    json_t *env = json_object();
    km_session_opts o;
    opts_all(&o, env);
    session *s = calloc(1, sizeof *s), *t = calloc(1, sizeof *t);
    assert_non_null(s);
    assert_non_null(t);
    snprintf(s->name, sizeof s->name, "s");
    assert_int_equal(km_sessopt_create(m, s, &o), 0);
    assert_int_equal(s->network, KM_NET_ALLOW);
    assert_string_equal(s->net_allow, "allow:pypi.org");
    assert_string_equal(s->python, "/usr/bin/python3");
    assert_string_equal(s->sandbox, "none");
    assert_int_equal(s->ipython, 1);
    assert_int_equal(s->zygote, 0);
    /* the same options again: no warning */
    json_t *arr = json_array();
    snprintf(s->workspace, sizeof s->workspace, "/tmp");
    km_sessopt_warn(m, s, &o, arr);
    assert_int_equal(json_array_size(arr), 0);
    /* save -> load */
    json_t *saved = json_object();
    assert_int_equal(km_sessopt_save(s, saved), 0);
    assert_int_equal(json_integer_value(json_object_get(saved, "memory")), 300 << 20);
    assert_true(json_is_true(json_object_get(saved, "ipython")));
    assert_true(json_is_false(json_object_get(saved, "zygote")));
    assert_null(json_object_get(saved, "workspace"));
    km_sessopt_load(m, t, saved, "s");
    snprintf(t->name, sizeof t->name, "s");
    for (const km_sessopt *r = km_sessopts; r->name; r++)
        if (r->type != KM_SO_SPECIAL)
            assert_memory_equal((char *)s + r->s_off, (char *)t + r->s_off, r->s_size);
    assert_int_equal(t->network, s->network);
    assert_string_equal(t->net_allow, s->net_allow);
    assert_true(json_equal(t->env, s->env));
    /* fork: the loaded session's options are the ones created */
    km_session_opts f;
    km_session_opts_init(&f);
    json_t *hold = NULL;
    km_sessopt_fork(t, &f, &hold);
    assert_non_null(hold);
    assert_int_equal(f.memory, o.memory);
    assert_true(f.cpus == o.cpus && f.cpu_time == o.cpu_time);
    assert_string_equal(f.python, o.python);
    assert_string_equal(f.sandbox, o.sandbox);
    assert_int_equal(f.ipython, o.ipython);
    assert_int_equal(f.zygote, o.zygote);
    assert_int_equal(f.snapshot_max, o.snapshot_max);
    assert_true(json_equal((json_t *)f.env, env));
    assert_null(f.workspace);
    /* other values to the existing session: one warning per warned option */
    km_session_opts w;
    km_session_opts_init(&w);
    w.memory = 400ull << 20;
    w.ipython = 0;
    w.zygote = 1; /* not warned */
    w.sandbox = "strict";
    km_sessopt_warn(m, t, &w, arr);
    assert_int_equal(json_array_size(arr), 3);
    assert_string_equal(json_string_value(json_array_get(arr, 2)),
                        "session \"s\" already exists: --ipython off was ignored (the session "
                        "keeps ipython on); options of a session are fixed when it is created: "
                        "close it to change them");
    assert_non_null(strstr(json_string_value(json_array_get(arr, 0)),
                           "--memory 419430400 bytes was ignored (the session keeps memory "
                           "314572800 bytes)"));
    json_decref(arr);
    json_decref(hold);
    json_decref(saved);
    json_decref(s->env);
    json_decref(t->env);
    free(s);
    free(t);
    json_decref(env);
    manager_free(m);
}

static void unset_round_trip(void **state)
{
    (void)state;
    km_manager *m = manager();
    session *s = calloc(1, sizeof *s), *t = calloc(1, sizeof *t);
    assert_non_null(s);
    assert_non_null(t);
    /* a session as allocated: every option the configuration's */
    km_sessopt_unset(s);
    assert_int_equal(s->ipython, -1);
    assert_int_equal(s->zygote, -1);
    assert_int_equal(s->network, -1);
    assert_int_equal(km_sessopt_create(m, s, NULL), 0);
    assert_int_equal(s->ipython, -1);
    assert_int_equal(s->zygote, -1);
    assert_string_equal(s->sandbox, m->cfg.sandbox);
    json_t *saved = json_object();
    assert_int_equal(km_sessopt_save(s, saved), 0);
    /* unset options are not saved, but memory, python and sandbox always are */
    assert_null(json_object_get(saved, "ipython"));
    assert_null(json_object_get(saved, "cpus"));
    assert_non_null(json_object_get(saved, "memory"));
    assert_non_null(json_object_get(saved, "python"));
    km_sessopt_load(m, t, saved, "s");
    for (const km_sessopt *r = km_sessopts; r->name; r++)
        if (r->type != KM_SO_SPECIAL)
            assert_memory_equal((char *)s + r->s_off, (char *)t + r->s_off, r->s_size);
    /* out of the config key's range: unset */
    json_object_set_new(saved, "cpus", json_real(1e9));
    json_object_set_new(saved, "snapshot_max", json_integer(100));
    json_object_set_new(saved, "ipython", json_string("yes"));
    km_sessopt_load(m, t, saved, "s");
    assert_true(t->cpus == 0);
    assert_int_equal(t->snapshot_max, 0);
    assert_int_equal(t->ipython, -1);
    json_decref(saved);
    free(s);
    free(t);
    manager_free(m);
}

/* The plain options as sessopt.def declares them, expanded here once more:
 * each is in every table made from it, with the type, range, default and
 * help of its row, and survives create -> save -> load -> fork with a
 * value that is not the configuration's (a row added there is checked
 * without a line here). */
typedef struct plain_row {
    const char *name;
    km_sotype type;
    double min, max, def;
    const char *api_help;
} plain_row;

static const plain_row plain_rows[] = {
#define KM_SO_DEF_BOOL(n, fl, sf, t, d, ch, ah, lh) {#n, KM_SO_BOOL, 0, 1, d, ah},
#define KM_SO_DEF_NUMBER(n, fl, sf, t, lo, hi, z, u, wu, wn, mv, ch, ah, lh)                       \
    {#n, KM_SO_NUMBER, lo, hi, 0, ah},
#define KM_SO_DEF_SIZE(n, fl, sf, t, lo, hi, d, wu, wn, mv, ch, ah, lh)                            \
    {#n, KM_SO_SIZE, lo, hi, d, ah},
#include "kernelmgr/engine/sessopt.def"
#undef KM_SO_DEF_BOOL
#undef KM_SO_DEF_NUMBER
#undef KM_SO_DEF_SIZE
};
#define NPLAIN (sizeof plain_rows / sizeof plain_rows[0])

static void plain_rows_everywhere(void **state)
{
    (void)state;
    km_manager *m = manager();
    km_session_opts o;
    km_session_opts_init(&o);
    for (size_t i = 0; i < NPLAIN; i++) {
        const plain_row *p = &plain_rows[i];
        const km_sessopt *r = km_sessopt_find(p->name);
        const kmcfg_opt *c = kmcfg_opt_find(p->name);
        const dtier_sessopt *d = dtier_sessopt_find(p->name);
        assert_non_null(r);
        assert_non_null(c);
        assert_non_null(d);
        assert_int_equal(r->type, p->type);
        assert_string_equal(d->help, p->api_help);
        char *cv = (char *)&m->cfg + r->c_off;
        char *ov = (char *)&o + r->o_off;
        switch (p->type) {
        case KM_SO_BOOL:
            assert_int_equal(c->type, KMCFG_BOOL);
            assert_int_equal(d->type, DT_SO_BOOL);
            assert_int_equal(*(int *)(void *)cv, (int)p->def);
            *(int *)(void *)ov = !(int)p->def;
            break;
        case KM_SO_NUMBER:
            assert_int_equal(c->type, KMCFG_SECONDS);
            assert_int_equal(d->type, DT_SO_NUMBER);
            assert_true(c->min == p->min && c->max == p->max);
            assert_true(d->min == p->min && d->max == p->max);
            assert_int_equal(d->ceiling, DT_CEIL_CFG);
            *(double *)(void *)ov = p->min * 2;
            break;
        case KM_SO_SIZE:
            assert_int_equal(c->type, KMCFG_SIZE);
            assert_int_equal(d->type, DT_SO_SIZE);
            assert_true(c->min == p->min && c->max == p->max && d->min == p->min);
            assert_true(*(uint64_t *)(void *)cv == (uint64_t)p->def);
            assert_int_equal(d->ceiling, DT_CEIL_CFG);
            *(unsigned long long *)(void *)ov = (unsigned long long)p->min * 2;
            break;
        default:
            fail();
        }
    }
    session *s = calloc(1, sizeof *s), *t = calloc(1, sizeof *t);
    assert_non_null(s);
    assert_non_null(t);
    km_sessopt_unset(s);
    km_sessopt_unset(t);
    snprintf(s->name, sizeof s->name, "p");
    assert_int_equal(km_sessopt_create(m, s, &o), 0);
    json_t *saved = json_object();
    assert_int_equal(km_sessopt_save(s, saved), 0);
    km_sessopt_load(m, t, saved, "p");
    km_session_opts f;
    km_session_opts_init(&f);
    json_t *hold = NULL;
    km_sessopt_fork(t, &f, &hold);
    for (size_t i = 0; i < NPLAIN; i++) {
        const km_sessopt *r = km_sessopt_find(plain_rows[i].name);
        assert_non_null(json_object_get(saved, r->name));
        assert_memory_equal((char *)s + r->s_off, (char *)t + r->s_off, r->s_size);
        assert_memory_equal((char *)&o + r->o_off, (char *)&f + r->o_off, r->s_size);
    }
    json_decref(hold);
    json_decref(saved);
    json_decref(s->env);
    json_decref(t->env);
    free(s);
    free(t);
    manager_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rows_consistent),
        cmocka_unit_test(pool_default),
        cmocka_unit_test(round_trip),
        cmocka_unit_test(unset_round_trip),
        cmocka_unit_test(plain_rows_everywhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
