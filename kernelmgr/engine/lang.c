/*
 * lang.c — the language table: the built-ins and the configured ones.
 */
#include "kernelmgr/engine/lang.h"
#include "common/cm_install.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* The built-in languages, in table order (python first: the default of
 * connection-file and of ties in the guesser). */
static const km_lang builtins[] = {
    {
        .name = "python",
        .id = "py",
        .aliases = {"py", "python3", "ipython", "ipython3"},
        .naliases = 4,
        .backend = "kernel-python",
        .takes_python = 1,
        .packages = KM_LANG_PKG_PIP,
        .title = "Python",
        .display_name = "Python 3 (kernelmgr sandbox)",
        .file_extension = ".py",
        .warm_code = "None",
        .role = KM_LANG_ROLE_PYTHON,
        .builtin = 1,
    },
    {
        .name = "bash",
        .id = "bash",
        .aliases = {"sh", "shell", "zsh"},
        .naliases = 3,
        .backend = "kernel-bash",
        .packages = KM_LANG_PKG_NPM,
        .title = "Bash",
        .display_name = "Bash (kernelmgr sandbox)",
        .file_extension = ".sh",
        .mimetype = "text/x-sh",
        .vscode_id = "shellscript",
        .cell_magic = "%%bash",
        .warm_code = ":",
        .role = KM_LANG_ROLE_SHELL,
        .builtin = 1,
    },
};

/* Words with another meaning for --lang or fences. */
static const char *const reserved[] = {"auto", "console", "shell-session", "shellsession", NULL};

void km_langs_builtin(km_langs *t)
{
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        t->v[t->n++] = builtins[i];
}

static int find(const km_langs *t, const char *word, int (*cmp)(const char *, const char *))
{
    if (!word)
        return -1;
    for (int i = 0; i < t->n; i++)
        if (!cmp(t->v[i].name, word))
            return i;
    for (int i = 0; i < t->n; i++)
        for (int a = 0; a < t->v[i].naliases; a++)
            if (!cmp(t->v[i].aliases[a], word))
                return i;
    return -1;
}

int km_langs_find(const km_langs *t, const char *word)
{
    return find(t, word, strcmp);
}

int km_langs_find_nocase(const km_langs *t, const char *word)
{
    return find(t, word, strcasecmp);
}

int km_langs_role(const km_langs *t, km_lang_role r)
{
    for (int i = 0; i < t->n; i++)
        if (t->v[i].role == r)
            return i;
    return -1;
}

static int fail(km_err *err, const char *name, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(km_err *err, const char *name, const char *field, const char *fmt, ...)
{
    char why[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    km_err_set(err, KM_EUSAGE, "kernels.%.40s%s%s: %s", name, field ? "." : "", field ? field : "",
               why);
    return -1;
}

/* [a-z][a-z0-9_-]{0,31} */
static int word_ok(const char *w)
{
    size_t n = strlen(w);
    if (n < 1 || n > KM_LANG_NAME_MAX || w[0] < 'a' || w[0] > 'z')
        return 0;
    for (const char *p = w; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
            return 0;
    return 1;
}

static int reserved_word(const char *w)
{
    for (int i = 0; reserved[i]; i++)
        if (!strcasecmp(w, reserved[i]))
            return 1;
    return 0;
}

static int kernelspec_ok(const char *s)
{
    if (!*s || !strcmp(s, ".") || !strcmp(s, ".."))
        return 0;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              strchr("._-", *p)))
            return 0;
    return 1;
}

static int copy_str(char *dst, size_t size, const char *s, const char *name, const char *field,
                    km_err *err)
{
    if (strlen(s) >= size)
        return fail(err, name, field, "too long (max %zu bytes)", size - 1);
    memcpy(dst, s, strlen(s) + 1);
    return 0;
}

/* Is word (a name or alias of entry self) used by another language of t?
 * A configured name may take over a built-in's alias (take_over). */
static int word_taken(const km_langs *t, int self, const char *word, int take_over)
{
    for (int i = 0; i < t->n; i++) {
        if (i == self)
            continue;
        if (!strcasecmp(t->v[i].name, word))
            return 1;
        if (take_over && t->v[i].builtin)
            continue;
        for (int a = 0; a < t->v[i].naliases; a++)
            if (!strcasecmp(t->v[i].aliases[a], word))
                return 1;
    }
    return 0;
}

/* Removes word from the aliases of the built-ins (a configured language
 * took it over). */
static void drop_builtin_alias(km_langs *t, const char *word)
{
    for (int i = 0; i < t->n; i++) {
        km_lang *l = &t->v[i];
        if (!l->builtin)
            continue;
        for (int a = 0; a < l->naliases; a++)
            if (!strcasecmp(l->aliases[a], word)) {
                memmove(l->aliases[a], l->aliases[a + 1],
                        (size_t)(l->naliases - a - 1) * sizeof l->aliases[0]);
                l->naliases--;
                a--;
            }
    }
}

static int configure_builtin(km_lang *l, const json_t *v, km_err *err)
{
    if (json_is_null(v)) {
        l->kernelspec[0] = 0;
        return 0;
    }
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
        return fail(err, l->name, NULL,
                    "a built-in language takes a Jupyter kernelspec name or null");
    if (copy_str(l->kernelspec, sizeof l->kernelspec, json_string_value(v), l->name, NULL, err))
        return -1;
    if (!kernelspec_ok(l->kernelspec)) {
        l->kernelspec[0] = 0;
        return fail(err, l->name, NULL, "not a kernelspec name");
    }
    return 0;
}

/* The object form of a new language into *e. 0 or -1 with err. */
static int configure_object(km_lang *e, const char *name, const json_t *v, km_err *err)
{
    static const char *const keys[] = {"backend",        "kernelspec", "display_name",
                                       "file_extension", "cell_magic", NULL};
    json_t *sv[5] = {NULL}, *aliases = NULL, *packages = NULL;
    json_error_t je;
    if (json_unpack_ex((json_t *)v, &je, JSON_STRICT, "{s?o s?o s?o s?o s?o s?o s?o}", keys[0],
                       &sv[0], keys[1], &sv[1], keys[2], &sv[2], keys[3], &sv[3], keys[4], &sv[4],
                       "aliases", &aliases, "packages", &packages)) {
        /* jansson names the unknown key */
        const char *unk = strstr(je.text, "unpacked: ");
        if (unk)
            return fail(err, name, unk + 10,
                        "unknown key (known: backend, kernelspec, aliases, display_name, "
                        "file_extension, cell_magic, packages)");
        return fail(err, name, NULL, "%s", je.text);
    }
    for (int k = 0; keys[k]; k++)
        if (sv[k] && (!json_is_string(sv[k]) ||
                      strlen(json_string_value(sv[k])) != json_string_length(sv[k])))
            return fail(err, name, keys[k], "must be a string");
    const char *backend = json_string_value(sv[0]), *kspec = json_string_value(sv[1]),
               *display = json_string_value(sv[2]), *ext = json_string_value(sv[3]),
               *magic = json_string_value(sv[4]);
    if (!!backend == !!kspec)
        return fail(err, name, NULL,
                    "needs exactly one of \"backend\" (a kernel-server binary) and "
                    "\"kernelspec\" (a Jupyter kernelspec name)");
    if (backend) {
        if (!*backend || copy_str(e->backend, sizeof e->backend, backend, name, "backend", err))
            return *backend ? -1 : fail(err, name, "backend", "must not be empty");
        if (backend[0] != '/' && strchr(backend, '/'))
            return fail(err, name, "backend",
                        "must be a binary name in the kernel directory or an absolute path");
        if (backend[0] != '/' && (!strcmp(backend, ".") || !strcmp(backend, "..")))
            return fail(err, name, "backend", "not a binary name");
    } else {
        if (copy_str(e->kernelspec, sizeof e->kernelspec, kspec, name, "kernelspec", err))
            return -1;
        if (!kernelspec_ok(kspec))
            return fail(err, name, "kernelspec", "not a kernelspec name");
    }
    if (aliases) {
        if (!json_is_array(aliases))
            return fail(err, name, "aliases", "must be an array of strings");
        if (json_array_size(aliases) > KM_LANG_ALIAS_MAX)
            return fail(err, name, "aliases", "at most %d", KM_LANG_ALIAS_MAX);
        size_t i;
        json_t *a;
        json_array_foreach(aliases, i, a)
        {
            const char *w = json_string_value(a);
            if (!w || !word_ok(w))
                return fail(err, name, "aliases",
                            "entry %zu is not a word like \"posix\" ([a-z][a-z0-9_-]{0,31})", i);
            snprintf(e->aliases[e->naliases++], sizeof e->aliases[0], "%s", w);
        }
    }
    if (display &&
        copy_str(e->display_name, sizeof e->display_name, display, name, "display_name", err))
        return -1;
    if (ext &&
        (copy_str(e->file_extension, sizeof e->file_extension, ext, name, "file_extension", err) ||
         (ext[0] != '.' &&
          fail(err, name, "file_extension", "must start with '.' (got \"%s\")", ext))))
        return -1;
    if (magic && (copy_str(e->cell_magic, sizeof e->cell_magic, magic, name, "cell_magic", err) ||
                  (strncmp(magic, "%%", 2) || !magic[2] || strpbrk(magic, "\n\r")
                       ? fail(err, name, "cell_magic",
                              "must be an IPython cell magic like \"%%%%bash\" (got \"%s\")", magic)
                       : 0)))
        return -1;
    if (packages && !json_is_null(packages)) {
        const char *p = json_string_value(packages);
        if (p && !strcmp(p, "pip"))
            e->packages = KM_LANG_PKG_PIP;
        else if (p && !strcmp(p, "npm"))
            e->packages = KM_LANG_PKG_NPM;
        else
            return fail(err, name, "packages", "must be \"pip\", \"npm\" or null");
        if (kspec)
            return fail(err, name, "packages",
                        "only for a backend language (a kernelspec's kernel does not get the "
                        "session's packages)");
    }
    return 0;
}

int km_langs_configure(km_langs *t, const char *name, const json_t *v, km_err *err)
{
    int idx = km_langs_find(t, name);
    if (idx >= 0 && t->v[idx].builtin && !strcmp(t->v[idx].name, name))
        return configure_builtin(&t->v[idx], v, err) ? -1 : idx;
    if (!word_ok(name))
        return fail(err, name, NULL,
                    "not a language name ([a-z][a-z0-9_-]{0,31}; a built-in is python or bash)");
    if (reserved_word(name))
        return fail(err, name, NULL, "\"%s\" is reserved", name);
    /* replacing an earlier configured entry of that name */
    int self = -1;
    for (int i = 0; i < t->n; i++)
        if (!t->v[i].builtin && !strcmp(t->v[i].name, name))
            self = i;
    if (json_is_null(v)) {
        if (self >= 0) {
            memmove(&t->v[self], &t->v[self + 1], (size_t)(t->n - self - 1) * sizeof t->v[0]);
            t->n--;
        }
        return self >= 0 ? 0
                         : fail(err, name, NULL,
                                "null removes a configured "
                                "language; there is none");
    }
    if (self < 0 && t->n >= KM_LANG_MAX)
        return fail(err, name, NULL, "too many languages (max %d)", KM_LANG_MAX);
    km_lang e;
    memset(&e, 0, sizeof e);
    snprintf(e.name, sizeof e.name, "%s", name);
    snprintf(e.id, sizeof e.id, "%s", name);
    if (json_is_string(v)) {
        e.string_form = 1;
        if (copy_str(e.kernelspec, sizeof e.kernelspec, json_string_value(v), name, NULL, err))
            return -1;
        if (strlen(e.kernelspec) != json_string_length(v) || !kernelspec_ok(e.kernelspec))
            return fail(err, name, NULL, "not a kernelspec name");
    } else if (json_is_object(v)) {
        if (configure_object(&e, name, v, err))
            return -1;
    } else {
        return fail(err, name, NULL,
                    "must be a Jupyter kernelspec name or an object like {\"backend\": "
                    "\"kernel-bash\"}");
    }
    if (!e.display_name[0])
        snprintf(e.display_name, sizeof e.display_name, "%s (kernelmgr%s)", name,
                 e.backend[0] ? " sandbox" : "");
    snprintf(e.title, sizeof e.title, "%s", name);
    /* collisions: a name may take over a built-in's alias, nothing else */
    if (word_taken(t, self, name, 1))
        return fail(err, name, NULL,
                    "\"%s\" is already the name or alias of another "
                    "configured language",
                    name);
    for (int a = 0; a < e.naliases; a++) {
        const char *w = e.aliases[a];
        int other = km_langs_find_nocase(t, w);
        if (!strcasecmp(w, name) || reserved_word(w) || (other >= 0 && other != self))
            return fail(err, name, "aliases", "\"%s\" is already %s", w,
                        reserved_word(w)       ? "a reserved word"
                        : !strcasecmp(w, name) ? "its name"
                                               : "a name or alias of another language");
        for (int b = 0; b < a; b++)
            if (!strcasecmp(e.aliases[b], w))
                return fail(err, name, "aliases", "\"%s\" is listed twice", w);
    }
    drop_builtin_alias(t, name);
    if (self < 0)
        self = t->n++;
    t->v[self] = e;
    return self;
}

const char *km_langs_names(const km_langs *t, char *buf, size_t len)
{
    size_t off = 0;
    if (len)
        buf[0] = 0;
    for (int i = 0; i < t->n && off < len; i++) {
        int w = snprintf(buf + off, len - off, "%s%s", i ? ", " : "", t->v[i].name);
        if (w < 0)
            break;
        off += (size_t)w;
    }
    return buf;
}

json_t *km_langs_to_json(const km_langs *t)
{
    json_t *o = json_object();
    for (int i = 0; o && i < t->n; i++) {
        const km_lang *l = &t->v[i];
        json_t *v;
        if (l->builtin) {
            v = l->kernelspec[0] ? json_string(l->kernelspec) : json_null();
        } else if (l->string_form) {
            v = json_string(l->kernelspec);
        } else {
            v = json_object();
            json_object_set_new(v, l->backend[0] ? "backend" : "kernelspec",
                                json_string(l->backend[0] ? l->backend : l->kernelspec));
            json_t *al = json_array();
            for (int a = 0; a < l->naliases; a++)
                json_array_append_new(al, json_string(l->aliases[a]));
            json_object_set_new(v, "aliases", al);
            json_object_set_new(v, "display_name", json_string(l->display_name));
            if (l->file_extension[0])
                json_object_set_new(v, "file_extension", json_string(l->file_extension));
            if (l->cell_magic[0])
                json_object_set_new(v, "cell_magic", json_string(l->cell_magic));
            json_object_set_new(v, "packages",
                                l->packages == KM_LANG_PKG_PIP   ? json_string("pip")
                                : l->packages == KM_LANG_PKG_NPM ? json_string("npm")
                                                                 : json_null());
        }
        json_object_set_new(o, l->name, v);
    }
    return o;
}

char *km_lang_backend_path(const km_lang *l, const char *kernel_dir, km_err *err)
{
    char *bin = NULL;
    if (!l->backend[0]) {
        km_err_set(err, KM_EUSAGE, "language %s has no kernel-server backend (kernelspec %s)",
                   l->name, l->kernelspec);
        return NULL;
    }
    if (l->backend[0] == '/') {
        bin = strdup(l->backend);
    } else {
        const char *env = getenv("KERNELMGR_KERNEL_DIR");
        char *self = NULL;
        const char *dir = kernel_dir && *kernel_dir ? kernel_dir
                          : env && *env             ? env
                                                    : (self = cm_install_helper_dir());
        if (!dir) {
            km_err_set(err, KM_EUSAGE, "cannot find the directory of the kernelmgr helpers");
            return NULL;
        }
        if (asprintf(&bin, "%s/%s", dir, l->backend) < 0)
            bin = NULL;
        free(self);
    }
    if (!bin) {
        km_err_set(err, KM_EUSAGE, "out of memory");
        return NULL;
    }
    struct stat st;
    const char *why = NULL;
    if (access(bin, X_OK))
        why = strerror(errno);
    else if (stat(bin, &st) || !S_ISREG(st.st_mode))
        why = "not a regular file";
    if (why) {
        km_err_set(err, KM_EUSAGE, "%s kernel backend %s: %s", l->name, bin, why);
        free(bin);
        return NULL;
    }
    return bin;
}
