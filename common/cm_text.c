/*
 * cm_text.c — two-column text for --help screens (cm_text.h).
 */
#include "common/cm_text.h"

#include <string.h>

int cm_print_columns(FILE *f, const char *left, const char *right, int col)
{
    int err = 0;
    const char *l = left ? left : "", *r = right ? right : "";
    while (*l || *r) {
        size_t ln = strcspn(l, "\n"), rn = strcspn(r, "\n");
        err |= fprintf(f, "  %.*s", (int)ln, l) < 0;
        if (rn) {
            if ((int)ln + 2 >= col)
                err |= fprintf(f, "\n%*s", col, "") < 0;
            else
                err |= fprintf(f, "%*s", col - 2 - (int)ln, "") < 0;
            err |= fprintf(f, "%.*s", (int)rn, r) < 0;
        }
        err |= fputc('\n', f) == EOF;
        l += ln + (l[ln] == '\n');
        r += rn + (r[rn] == '\n');
    }
    return err ? -1 : 0;
}
