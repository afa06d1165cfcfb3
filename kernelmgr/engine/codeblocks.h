/*
 * codeblocks.h — split an agent's input into code blocks and pick a language.
 *
 * With --lang auto (the default) the input is read as Markdown: every fenced
 * block (``` or ~~~, up to 3 spaces of indent) whose info string names a
 * language we run (a name or alias of the language table, lang.h, ignoring
 * case) becomes a block; the built-ins:
 *   python, py, python3, ipython, ipython3 -> python
 *   bash, sh, shell, zsh                   -> bash
 *   console, shell-session                 -> the shell-like language (bash);
 *                                             only lines starting with
 *                                             "$ " (or "# " as root) are kept,
 *                                             prompt stripped; "> " continues
 * Fences with other info strings (text, json, output, none) are prose and are
 * skipped. Input without any fence is one block whose language comes from a
 * shebang ("#!...python..." / "#!...sh") or, failing that, the heuristic in
 * cblocks_guess_language(): the table's python-like or shell-like entry.
 */
#ifndef KERNELMGR_CODEBLOCKS_H
#define KERNELMGR_CODEBLOCKS_H

#include "kernelmgr/engine/kmerr.h"

#include "kernelmgr/engine/lang.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cblock {
    int lang;      /* index in the language table, or -1 (not runnable, see info) */
    char *code;    /* owned */
    char info[64]; /* the fence's info word, or "" for raw input */
    int line;      /* 1-based line of the block's first code line in the input */
} cblock;

typedef struct cblock_list {
    cblock *v; /* owned */
    size_t n;
} cblock_list;

/* Checks code before anything is sent to a kernel (run, exec, the daemon and
 * MCP share it through km_exec; the CLI also calls it on what it read):
 * len bytes (the text may hold NUL bytes, which are refused), at most max
 * bytes (code_max; 0 = no limit), valid UTF-8 (strict: no overlong forms,
 * surrogates or code points above U+10FFFF). 0, or -1 with the reason in err:
 *   "code is 52428800 bytes, more than code_max (16 MiB)"
 *   "code is not valid UTF-8 (byte 17)"        (0-based offset of the bad byte)
 *   "code contains a NUL byte (byte 4)" */
int cblocks_check_code(const char *code, size_t len, uint64_t max, km_err *err);

/* Splits text (NUL-terminated) by the languages of langs (borrowed; NULL =
 * the built-ins). lang: -1 for auto, else the language (index in langs) of
 * the whole input taken raw. Fills out (new; cblocks_free). 0, or -1 (no
 * memory). */
int cblocks_split(const char *text, const km_langs *langs, int lang, cblock_list *out);

/* Frees every block and zeroes the list. */
void cblocks_free(cblock_list *list);

/* Language of unfenced code: a shebang decides; else a score of Python
 * signals (def/class/import/from-import lines, trailing ':' blocks,
 * print(...), assignments "x = ...", triple quotes) against shell signals
 * (a known command word first on a line, $VAR/${...}, pipes into commands,
 * "&&", "fi/done/esac", flags "-x"/"--long", redirections "> file").
 * Ties go to python. Returns KM_LANG_ROLE_PYTHON or KM_LANG_ROLE_SHELL
 * (km_langs_role gives the table's entry). */
km_lang_role cblocks_guess_language(const char *code);

#endif
