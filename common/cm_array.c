/*
 * cm_array.c — a growable NULL-terminated array of pointers (see cm_array.h).
 */
#include "common/cm_array.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int reserve(cm_array *a, size_t want) /* want: items including the NULL */
{
    if (want <= a->cap)
        return 0;
    size_t cap = a->cap ? a->cap : 8;
    while (cap < want) {
        if (cap > SIZE_MAX / 2 / sizeof *a->items) {
            errno = ENOMEM;
            return -1;
        }
        cap *= 2;
    }
    void **n = realloc(a->items, cap * sizeof *n);
    if (!n)
        return -1;
    a->items = n;
    a->cap = cap;
    return 0;
}

int cm_array_push(cm_array *a, void *item)
{
    if (!item) {
        errno = EINVAL;
        return -1;
    }
    if (reserve(a, a->len + 2) < 0)
        return -1;
    a->items[a->len++] = item;
    a->items[a->len] = NULL;
    return 0;
}

int cm_array_push_str(cm_array *a, const char *s)
{
    char *copy = s ? strdup(s) : NULL;
    if (!copy) {
        if (!s)
            errno = EINVAL;
        return -1;
    }
    if (cm_array_push(a, copy) < 0) {
        free(copy);
        return -1;
    }
    return 0;
}

void *cm_array_pop(cm_array *a)
{
    if (!a->len)
        return NULL;
    void *it = a->items[--a->len];
    a->items[a->len] = NULL;
    return it;
}

void **cm_array_steal(cm_array *a)
{
    if (reserve(a, 1) < 0)
        return NULL;
    void **items = a->items;
    items[a->len] = NULL;
    a->items = NULL;
    a->len = a->cap = 0;
    return items;
}

void cm_array_free(cm_array *a, void (*free_item)(void *))
{
    if (free_item)
        for (size_t i = 0; i < a->len; i++)
            free_item(a->items[i]);
    free(a->items);
    a->items = NULL;
    a->len = a->cap = 0;
}
