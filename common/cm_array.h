/*
 * cm_array.h — a growable array of pointers, always NULL-terminated (so a
 * string array is an argv for execv). Zero-initialise it (CM_ARRAY_INIT);
 * it owns its storage, the items belong to whoever cm_array_free says.
 */
#ifndef CM_ARRAY_H
#define CM_ARRAY_H

#include <stddef.h>

typedef struct cm_array {
    void **items; /* len items then NULL (items is NULL while len is 0 and nothing was pushed) */
    size_t len, cap;
} cm_array;

#define CM_ARRAY_INIT                                                                              \
    {                                                                                              \
        NULL, 0, 0                                                                                 \
    }

/* Appends item (which may not be NULL: the terminator). 0, or -1 with errno
 * (ENOMEM, EINVAL for a NULL item); the array is unchanged on failure. */
int cm_array_push(cm_array *a, void *item);

/* Appends a malloc'd copy of s, which the array's cm_array_free(a, free)
 * releases. 0, or -1 with errno. */
int cm_array_push_str(cm_array *a, const char *s);

/* Removes and returns the last item (the caller owns it), or NULL. */
void *cm_array_pop(cm_array *a);

/* Hands the NULL-terminated items to the caller (free() it, and its items
 * as they were owned) and leaves the array empty; never NULL for an
 * empty array unless out of memory. */
void **cm_array_steal(cm_array *a);

/* Frees the storage, first calling free_item (may be NULL) on each item;
 * leaves the array empty and reusable. */
void cm_array_free(cm_array *a, void (*free_item)(void *));

#endif
