/*
 * cm_text.h — text layout for --help screens: two columns, one option or
 * command per row, the help text wrapped by the caller with \n.
 */
#ifndef COMMON_CM_TEXT_H
#define COMMON_CM_TEXT_H

#include <stdio.h>

/* Writes left and right as two columns, line by line (both split on \n),
 * indented by two spaces, the right one starting at column col; a right
 * line whose left line is too wide goes on a line of its own. 0, or -1 on a
 * write error. */
int cm_print_columns(FILE *f, const char *left, const char *right, int col);

#endif
