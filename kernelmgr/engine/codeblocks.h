/*
 * codeblocks.h — split an agent's input into code blocks and pick a language.
 *
 * With --lang auto (the default) the input is read as Markdown: every fenced
 * block (``` or ~~~, up to 3 spaces of indent) whose info string names a
 * language we run becomes a block:
 *   python, py, python3, ipython           -> python
 *   bash, sh, shell, zsh                   -> bash
 *   console, shell-session                 -> bash; only lines starting with
 *                                             "$ " (or "# " as root) are kept,
 *                                             prompt stripped; "> " continues
 * Fences with other info strings (text, json, output, none) are prose and are
 * skipped. Input without any fence is one block whose language comes from a
 * shebang ("#!...python..." / "#!...sh") or, failing that, the heuristic in
 * cblocks_guess_language().
 */
#ifndef KERNELMGR_CODEBLOCKS_H
#define KERNELMGR_CODEBLOCKS_H

#include <stddef.h>
#include <stdint.h>

typedef struct cblock {
    int lang;      /* KMCFG_LANG_PYTHON / KMCFG_LANG_BASH, or -1 (not runnable, see info) */
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
int cblocks_check_code(const char *code, size_t len, uint64_t max, char *err, size_t errlen);

/* Splits text (NUL-terminated). lang: -1 for auto, else the language of the
 * whole input taken raw. Fills out (new; cblocks_free). 0, or -1 (no memory). */
int cblocks_split(const char *text, int lang, cblock_list *out);

/* Frees every block and zeroes the list. */
void cblocks_free(cblock_list *list);

/* Language of unfenced code: a shebang decides; else a score of Python
 * signals (def/class/import/from-import lines, trailing ':' blocks,
 * print(...), assignments "x = ...", triple quotes) against shell signals
 * (a known command word first on a line, $VAR/${...}, pipes into commands,
 * "&&", "fi/done/esac", flags "-x"/"--long", redirections "> file").
 * Ties go to python. Returns KMCFG_LANG_PYTHON or KMCFG_LANG_BASH. */
int cblocks_guess_language(const char *code);

#endif
