/*
 * cm_termsafe.h — sandbox-produced text made safe for a terminal.
 *
 * Bytes a cell prints, and names of files it creates, reach the user's
 * terminal through the CLI's readable output. Raw, they could set the
 * clipboard (OSC 52), change the window title, clear the screen, move the
 * cursor or forge kernelmgr's own status lines. The escaper writes them in a
 * visible, unambiguous form instead:
 *
 *   ESC → \e   CR → \r   BS → \b   other C0 and DEL → \xHH
 *   C1 controls (U+0080–U+009F) and bidi overrides/isolates
 *   (U+202A–U+202E, U+2066–U+2069) → \uHHHH
 *   bytes that are not UTF-8 → \xHH
 *
 * \n and \t stay in text; TERMSAFE_NAME (file names and other one-line
 * fields) escapes them too (\n, \t) and doubles a backslash, so a name
 * always stays on its line and reads back unambiguously.
 * TERMSAFE_KEEP_SGR keeps colour sequences ESC [ digits ; : ... m (at most
 * 64 bytes) as they are — tracebacks, `ls --color`, test runners use them —
 * and escapes every other escape sequence.
 */
#ifndef COMMON_CM_TERMSAFE_H
#define COMMON_CM_TERMSAFE_H

#include <stddef.h>
#include <stdio.h>

#define TERMSAFE_NAME 1     /* one-line field: also \n, \t and backslash */
#define TERMSAFE_KEEP_SGR 2 /* keep SGR colour sequences */

/* new (free()): the escaped form of s[0..len), NUL-terminated, its length in
 * *outlen when outlen is not NULL. *kept_sgr (may be NULL) is set to 1 when
 * an SGR sequence was kept. NULL when out of memory. */
char *termsafe_escape(const char *s, size_t len, int flags, size_t *outlen, int *kept_sgr);

/* Writes the escaped form of the string s (NULL: nothing) to f. Returns 1
 * when an SGR sequence was kept (the caller resets colours, "\033[0m", before
 * its own text), else 0. On a memory shortage the text is replaced by a
 * marker. */
int termsafe_fputs(FILE *f, const char *s, int flags);

#endif
