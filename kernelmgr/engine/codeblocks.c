/*
 * codeblocks.c — Markdown fences, shebangs and the language heuristic.
 */
#include "kernelmgr/engine/codeblocks.h"
#include "common/cm_utf8.h"
#include "kernelmgr/engine/config.h"
#include "kernelmgr/engine/outcap.h"
#include "protocol/jp.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A growable string. */
typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static int sbuf_add(sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int list_push(cblock_list *l, int lang, sbuf *code, const char *info, int line)
{
    cblock *v = realloc(l->v, (l->n + 1) * sizeof *v);
    if (!v)
        return -1;
    l->v = v;
    cblock *b = &v[l->n++];
    memset(b, 0, sizeof *b);
    b->lang = lang;
    b->code = code->p ? code->p : strdup("");
    code->p = NULL;
    code->n = code->cap = 0;
    if (!b->code)
        return -1;
    size_t i;
    for (i = 0; info[i] && i + 1 < sizeof b->info; i++)
        b->info[i] = (char)tolower((unsigned char)info[i]);
    b->info[i] = 0;
    b->line = line;
    return 0;
}

void cblocks_free(cblock_list *list)
{
    for (size_t i = 0; i < list->n; i++)
        free(list->v[i].code);
    free(list->v);
    list->v = NULL;
    list->n = 0;
}

/* Language (index in t) of a fence's info word: a name or alias of the
 * table, ignoring case; -2 for console transcripts, -1 for prose. */
static int fence_lang(const km_langs *t, const char *info)
{
    static const char *con[] = {"console", "shell-session", "shellsession", NULL};
    for (int i = 0; con[i]; i++)
        if (!strcasecmp(info, con[i]))
            return -2;
    return km_langs_find_nocase(t, info);
}

/* Is line (len bytes) a fence? Returns the fence length and fills ch. */
static size_t fence_at(const char *line, size_t len, char *ch)
{
    size_t i = 0;
    while (i < len && i < 3 && line[i] == ' ')
        i++;
    if (i >= len || (line[i] != '`' && line[i] != '~'))
        return 0;
    char c = line[i];
    size_t j = i;
    while (j < len && line[j] == c)
        j++;
    if (j - i < 3)
        return 0;
    *ch = c;
    return j - i;
}

static km_lang_role shebang_role(const char *code)
{
    if (strncmp(code, "#!", 2))
        return KM_LANG_ROLE_NONE;
    const char *nl = strchr(code, '\n');
    size_t n = nl ? (size_t)(nl - code) : strlen(code);
    char line[256];
    if (n >= sizeof line)
        n = sizeof line - 1;
    memcpy(line, code, n);
    line[n] = 0;
    if (strstr(line, "python"))
        return KM_LANG_ROLE_PYTHON;
    if (strstr(line, "sh"))
        return KM_LANG_ROLE_SHELL;
    return KM_LANG_ROLE_NONE;
}

int cblocks_split(const char *text, const km_langs *langs, int lang, cblock_list *out)
{
    memset(out, 0, sizeof *out);
    km_langs *own = NULL;
    if (!langs) {
        own = malloc(sizeof *own);
        if (!own)
            return -1;
        km_langs_builtin(own);
        langs = own;
    }
    /* console transcripts run in the shell-like language */
    int shell = km_langs_role(langs, KM_LANG_ROLE_SHELL);
    sbuf code = {0};
    if (lang >= 0) {
        if (sbuf_add(&code, text, strlen(text)) || list_push(out, lang, &code, "", 1))
            goto oom;
        free(own);
        return 0;
    }

    int in_fence = 0, flang = -1, start_line = 0, lineno = 0, any_fence = 0;
    char fch = 0, info[64] = "";
    size_t flen = 0;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        size_t full = nl ? len + 1 : len;
        lineno++;
        char ch = 0;
        size_t fl = fence_at(p, len, &ch);
        if (!in_fence && fl) {
            any_fence = 1;
            in_fence = 1;
            fch = ch;
            flen = fl;
            /* info string: first word after the fence, "{.python}" forms too */
            const char *q = p + (size_t)(strchr(p, ch) - p) + fl;
            const char *end = p + len;
            while (q < end && (*q == ' ' || *q == '{' || *q == '.'))
                q++;
            size_t k = 0;
            while (q < end && k + 1 < sizeof info && !isspace((unsigned char)*q) && *q != '}' &&
                   *q != ',')
                info[k++] = *q++;
            info[k] = 0;
            flang = fence_lang(langs, info);
            if (flang == -2 && shell < 0)
                flang = -1;
            start_line = lineno + 1;
        } else if (in_fence && fl >= flen && ch == fch) {
            /* a closing fence has nothing but spaces after it */
            const char *q = p + len;
            const char *r = strchr(p, ch) + fl;
            while (r < q && isspace((unsigned char)*r))
                r++;
            if (r == q) {
                in_fence = 0;
                if (flang != -1 &&
                    list_push(out, flang == -2 ? shell : flang, &code, info, start_line))
                    goto oom;
                free(code.p);
                code = (sbuf){0};
            } else if (flang != -1 && sbuf_add(&code, p, full)) {
                goto oom;
            }
        } else if (in_fence && flang == -2) {
            /* console transcript: commands after a prompt, "> " continuations */
            if (len >= 2 && (p[0] == '$' || p[0] == '#') && p[1] == ' ') {
                if (sbuf_add(&code, p + 2, full - 2))
                    goto oom;
            } else if (len == 1 && p[0] == '$') {
                /* empty prompt */
            } else if (len >= 2 && p[0] == '>' && p[1] == ' ' && code.n) {
                if (sbuf_add(&code, p + 2, full - 2))
                    goto oom;
            }
            if (nl && code.n && code.p[code.n - 1] != '\n' && sbuf_add(&code, "\n", 1))
                goto oom;
        } else if (in_fence && flang != -1) {
            if (sbuf_add(&code, p, full))
                goto oom;
        }
        p += full;
    }
    if (in_fence && flang != -1) {
        /* an unterminated fence runs to the end of the input (CommonMark) */
        if (list_push(out, flang == -2 ? shell : flang, &code, info, start_line))
            goto oom;
    }
    free(code.p);
    code = (sbuf){0};
    if (!any_fence) {
        int l = km_langs_role(langs, cblocks_guess_language(text));
        if (l < 0)
            l = 0;
        if (sbuf_add(&code, text, strlen(text)) || list_push(out, l, &code, "", 1))
            goto oom;
    }
    free(own);
    return 0;
oom:
    free(code.p);
    free(own);
    cblocks_free(out);
    return -1;
}

static int starts_word(const char *s, const char *w)
{
    size_t n = strlen(w);
    return !strncmp(s, w, n) && (s[n] == 0 || s[n] == ' ' || s[n] == '\t' || s[n] == '\n' ||
                                 s[n] == ';' || s[n] == '\r');
}

km_lang_role cblocks_guess_language(const char *code)
{
    km_lang_role l = shebang_role(code);
    if (l != KM_LANG_ROLE_NONE)
        return l;
    static const char *cmds[] = {
        "ls",   "cd",       "echo",    "cat",    "grep",   "awk",     "sed",  "export",  "mkdir",
        "rm",   "cp",       "mv",      "touch",  "head",   "tail",    "wc",   "sort",    "uniq",
        "find", "chmod",    "curl",    "wget",   "git",    "pip",     "apt",  "apt-get", "make",
        "set",  "source",   "alias",   "printf", "pwd",    "which",   "tar",  "du",      "df",
        "ps",   "kill",     "sleep",   "uv",     "npm",    "then",    "fi",   "done",    "esac",
        "do",   "local",    "unset",   "test",   "read",   "cut",     "tr",   "xargs",   "env",
        "true", "false",    "exit",    "seq",    "python", "python3", "date", "whoami",  "uname",
        "ln",   "basename", "dirname", "jq",     "tee",    "diff",    "stat", "file",    NULL};
    int py = 0, sh = 0;
    const char *p = code;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[512];
        size_t n = len < sizeof line - 1 ? len : sizeof line - 1;
        memcpy(line, p, n);
        line[n] = 0;
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        size_t sl = strlen(s);
        while (sl && isspace((unsigned char)s[sl - 1]))
            s[--sl] = 0;
        if (*s && *s != '#') {
            if (starts_word(s, "import") || starts_word(s, "def") || starts_word(s, "class") ||
                starts_word(s, "elif") || starts_word(s, "try:") || starts_word(s, "with") ||
                starts_word(s, "lambda") || starts_word(s, "return") || starts_word(s, "raise"))
                py += 3;
            else if (starts_word(s, "from") && strstr(s, " import "))
                py += 3;
            if (!strncmp(s, "print(", 6) || strstr(s, "\"\"\"") || strstr(s, "'''"))
                py += 2;
            if (sl && s[sl - 1] == ':' && !strchr(s, '$'))
                py += 1;
            if (strstr(s, "f\"") || strstr(s, ".append(") || strstr(s, "len(") ||
                strstr(s, "self.") || strstr(s, "None") || strstr(s, "True"))
                py += 1;
            /* "x = 1" is python; "x=1" is shell */
            const char *eq = strchr(s, '=');
            if (eq && eq > s && eq[-1] == ' ' && eq[1] == ' ')
                py += 1;
            else if (eq && eq > s && eq[-1] != ' ' && eq[1] != '=' && eq[1] != ' ' &&
                     !strchr(s, '(')) {
                int ident = 1;
                for (const char *q = s; q < eq; q++)
                    if (!isalnum((unsigned char)*q) && *q != '_')
                        ident = 0;
                if (ident)
                    sh += 2;
            }
            for (int i = 0; cmds[i]; i++)
                if (starts_word(s, cmds[i])) {
                    sh += 2;
                    break;
                }
            if (strstr(s, "${") || strstr(s, "$(") || strstr(s, " | ") || strstr(s, "&&") ||
                strstr(s, " --") || strstr(s, " -") || strstr(s, " > ") || strstr(s, " >> ") ||
                strstr(s, "2>"))
                sh += 1;
            if (s[0] == '$' && s[1] && (isalpha((unsigned char)s[1]) || s[1] == '{'))
                sh += 1;
            if ((!strncmp(s, "if [", 4) || !strncmp(s, "for ", 4) || !strncmp(s, "while ", 6)) &&
                (strstr(s, "; do") || strstr(s, "; then")))
                sh += 3;
            if (!strncmp(s, "if [", 4))
                sh += 2;
        }
        p += nl ? len + 1 : len;
    }
    return sh > py ? KM_LANG_ROLE_SHELL : KM_LANG_ROLE_PYTHON;
}

int cblocks_check_code(const char *code, size_t len, uint64_t max, km_err *err)
{
    if (max && len > max) {
        char sz[32];
        km_err_set(err, KM_EUSAGE, "code is %zu bytes, more than code_max (%s)", len,
                   outcap_fmt_size(max, sz, sizeof sz));
        return -1;
    }
    const unsigned char *p = (const unsigned char *)(code ? code : "");
    for (size_t i = 0; i < len;) {
        if (p[i] == 0) {
            km_err_set(err, KM_EUSAGE, "code contains a NUL byte (byte %zu)", i);
            return -1;
        }
        size_t n = cm_utf8_decode(p + i, len - i, NULL);
        if (!n) {
            km_err_set(err, KM_EUSAGE, "code is not valid UTF-8 (byte %zu)", i);
            return -1;
        }
        i += n;
    }
    return 0;
}
