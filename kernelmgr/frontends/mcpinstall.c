/*
 * mcpinstall.c — `kernelmgr mcp install` (mcpinstall.h).
 */
#include "kernelmgr/frontends/mcpinstall.h"
#include "kernelmgr/engine/kmerr.h"
#include "common/cm_install.h"
#include "common/cm_path.h"
#include "kernelmgr/engine/kmfs.h"
#include "kernels/python/pydetect.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The clients: where their file is and under which key the servers are. */
typedef struct mcpinst_client {
    const char *name;
    const char *servers_key;
    int stdio_type; /* the entry carries "type": "stdio" */
    /* new: the default file, or NULL (print only); err when it cannot be known */
    char *(*path)(km_err *err);
} mcpinst_client;

static char *home_path(const char *rel, km_err *err)
{
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') {
        km_err_set(err, KM_EUSAGE, "HOME is not set to an absolute path: give --file");
        return NULL;
    }
    return cm_path_join(home, rel);
}

static char *claude_path(km_err *err)
{
    const char *x = getenv("XDG_CONFIG_HOME");
    if (x && x[0] == '/')
        return cm_path_join(x, "Claude/claude_desktop_config.json");
    return home_path(".config/Claude/claude_desktop_config.json", err);
}

static char *cursor_path(km_err *err)
{
    return home_path(".cursor/mcp.json", err);
}

static char *vscode_path(km_err *err)
{
    char *cwd = getcwd(NULL, 0);
    if (!cwd) {
        km_err_set(err, KM_EUSAGE, "cannot read the current directory: %s", strerror(errno));
        return NULL;
    }
    char *p = cm_path_join(cwd, ".vscode/mcp.json");
    free(cwd);
    return p;
}

static const mcpinst_client clients[] = {
    {"claude", "mcpServers", 0, claude_path},
    {"cursor", "mcpServers", 0, cursor_path},
    {"vscode", "servers", 1, vscode_path},
    {"generic", "mcpServers", 0, NULL},
};

static int usage(FILE *f, int rc)
{
    fputs("usage: kernelmgr mcp install --client claude|cursor|vscode|generic [--print]\n"
          "         [--python PATH] [--file FILE] [--name NAME] [--allowlist FILE]\n"
          "  Adds kernelmgr (this binary, by its absolute path) to an MCP client's\n"
          "  configuration, with the Python interpreter pinned (--python, else the one\n"
          "  exec and doctor use here). Other entries of the file are kept.\n"
          "  claude   $XDG_CONFIG_HOME/Claude/claude_desktop_config.json\n"
          "  cursor   ~/.cursor/mcp.json\n"
          "  vscode   .vscode/mcp.json of the current directory (the workspace)\n"
          "  generic  printed ({\"mcpServers\": ...}), or written to --file\n"
          "  --print  print the resulting file instead of writing it\n",
          f);
    return rc;
}

/* The interpreter to pin, resolved as the python kernel would (pydetect):
 * new string, or NULL with err. */
static char *pin_python(const char *given, km_err *err)
{
    pydetect_sources src = {
        .explicit_path = given,
        .env_python = given ? NULL : getenv("KERNELMGR_PYTHON"),
        .virtual_env = given ? NULL : getenv("VIRTUAL_ENV"),
        .path_env = getenv("PATH"),
    };
    if (src.env_python && !*src.env_python)
        src.env_python = NULL;
    if (src.virtual_env && !*src.virtual_env)
        src.virtual_env = NULL;
    pydetect_info info = {0};
    char why[1024];
    char *out = NULL;
    if (pydetect_find(&src, &info, why, sizeof why))
        km_err_set(err, KM_EUSAGE, "no Python interpreter to pin: %s", why);
    else if (!info.interpreter || info.interpreter[0] != '/')
        km_err_set(err, KM_EUSAGE, "the interpreter found is not an absolute path");
    else
        out = strdup(info.interpreter);
    pydetect_info_clear(&info);
    return out;
}

/* The file's JSON object (new), an empty object when it does not exist, or
 * NULL with err (not JSON, not an object, unreadable). */
static json_t *load_existing(const char *path, km_err *err)
{
    struct stat st;
    if (stat(path, &st)) {
        if (errno == ENOENT)
            return json_object();
        km_err_set(err, KM_EUSAGE, "%s: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        km_err_set(err, KM_EUSAGE, "%s is not a regular file: not changed", path);
        return NULL;
    }
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        if (st.st_size == 0)
            return json_object();
        km_err_set(err, KM_EUSAGE, "%s is not valid JSON (line %d, column %d: %s): not changed",
                   path, je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        km_err_set(err, KM_EUSAGE, "%s holds JSON that is not an object: not changed", path);
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Writes o to path atomically (temporary file in the same directory, then
 * rename), mode: the old file's, else 0600. 0, or -1 with err. */
static int write_atomic(const char *path, const json_t *o, km_err *err)
{
    struct stat st;
    mode_t mode = stat(path, &st) == 0 ? (st.st_mode & 07777) : 0600;
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    if (slash && slash != dir) {
        *slash = 0;
        if (kmfs_mkdirs(dir, 0700)) {
            km_err_set(err, KM_EUSAGE, "cannot create %s: %s", dir, strerror(errno));
            free(dir);
            return -1;
        }
    }
    free(dir);
    char *tmp = cm_path_fmt("%s.kernelmgr-XXXXXX", path);
    int fd = tmp ? mkostemp(tmp, O_CLOEXEC) : -1;
    if (fd < 0) {
        km_err_set(err, KM_EUSAGE, "cannot write beside %s: %s", path, strerror(errno));
        free(tmp);
        return -1;
    }
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    size_t len = text ? strlen(text) : 0;
    int rc = text && write(fd, text, len) == (ssize_t)len && write(fd, "\n", 1) == 1 &&
                     fchmod(fd, mode) == 0 && fsync(fd) == 0
                 ? 0
                 : -1;
    int e = errno;
    if (close(fd))
        rc = -1;
    if (rc == 0 && rename(tmp, path))
        rc = -1, e = errno;
    if (rc) {
        km_err_set(err, KM_EUSAGE, "cannot write %s: %s", path, strerror(e));
        unlink(tmp);
    }
    free(text);
    free(tmp);
    return rc;
}

int mcpinst_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"client", required_argument, NULL, 'c'}, {"print", no_argument, NULL, 'p'},
        {"python", required_argument, NULL, 'y'}, {"file", required_argument, NULL, 'f'},
        {"name", required_argument, NULL, 'n'},   {"allowlist", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    const char *client = NULL, *python = NULL, *file = NULL, *name = "kernelmgr", *allowlist = NULL;
    int print = 0;
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        switch (c) {
        case 'c':
            client = optarg;
            break;
        case 'p':
            print = 1;
            break;
        case 'y':
            python = optarg;
            break;
        case 'f':
            file = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 'a':
            allowlist = optarg;
            break;
        case 'h':
            return usage(stdout, 0);
        default:
            return usage(stderr, 2);
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kernelmgr mcp install: unexpected argument '%s'\n", argv[optind]);
        return usage(stderr, 2);
    }
    const mcpinst_client *cl = NULL;
    for (size_t i = 0; client && i < sizeof clients / sizeof clients[0]; i++)
        if (!strcmp(clients[i].name, client))
            cl = &clients[i];
    if (!cl) {
        fprintf(stderr, "kernelmgr mcp install: %s%s%s: give claude, cursor, vscode or generic\n",
                client ? "unknown client \"" : "--client is required", client ? client : "",
                client ? "\"" : "");
        return 2;
    }
    if (!name[0] || strlen(name) > 64) {
        fprintf(stderr, "kernelmgr mcp install: --name must be 1 to 64 characters\n");
        return 2;
    }
    km_err err = {0};
    char *py = pin_python(python, &err);
    char *exe_dir = cm_install_exe_dir();
    char *self = exe_dir ? cm_path_join(exe_dir, "kernelmgr") : NULL;
    char *self_real = self ? realpath(self, NULL) : NULL;
    char *al = allowlist ? realpath(allowlist, NULL) : NULL;
    char *path = NULL;
    json_t *doc = NULL;
    int rc = 2;
    if (!py) {
        fprintf(stderr, "kernelmgr mcp install: %s\n", err.msg);
        goto done;
    }
    if (!self_real) {
        fprintf(stderr, "kernelmgr mcp install: cannot find this kernelmgr binary: %s\n",
                strerror(errno));
        rc = 6;
        goto done;
    }
    if (allowlist && !al) {
        fprintf(stderr, "kernelmgr mcp install: --allowlist %s: %s\n", allowlist, strerror(errno));
        goto done;
    }
    if (file) {
        char *cwd = file[0] == '/' ? NULL : getcwd(NULL, 0);
        path = file[0] == '/' ? strdup(file) : cwd ? cm_path_join(cwd, file) : NULL;
        free(cwd);
    } else if (cl->path && !(path = cl->path(&err))) {
        fprintf(stderr, "kernelmgr mcp install: %s\n", err.msg);
        goto done;
    }
    if (!path && cl->path) {
        fprintf(stderr, "kernelmgr mcp install: out of memory\n");
        rc = 6;
        goto done;
    }
    doc = path ? load_existing(path, &err) : json_object();
    if (!doc) {
        fprintf(stderr, "kernelmgr mcp install: %s\n", err.msg);
        goto done;
    }
    json_t *servers = json_object_get(doc, cl->servers_key);
    if (servers && !json_is_object(servers)) {
        fprintf(stderr, "kernelmgr mcp install: %s: \"%s\" is not an object: not changed\n",
                path ? path : "(new)", cl->servers_key);
        goto done;
    }
    if (!servers) {
        servers = json_object();
        json_object_set_new(doc, cl->servers_key, servers);
    }
    int replaced = json_object_get(servers, name) != NULL;
    json_t *args = json_pack("[s]", "mcp");
    if (al)
        json_array_extend(args, json_pack("[s s]", "--allowlist", al));
    json_t *env = json_pack("{s:s}", "KERNELMGR_PYTHON", py);
    const char *home = getenv("KERNELMGR_HOME");
    if (home && home[0] == '/')
        json_object_set_new(env, "KERNELMGR_HOME", json_string(home));
    json_t *entry = cl->stdio_type ? json_pack("{s:s}", "type", "stdio") : json_object();
    json_object_set_new(entry, "command", json_string(self_real));
    json_object_set_new(entry, "args", args);
    json_object_set_new(entry, "env", env);
    json_object_set_new(servers, name, entry);
    if (print || !path) {
        char *text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        rc = text && printf("%s\n", text) > 0 && fflush(stdout) == 0 ? 0 : 6;
        free(text);
        goto done;
    }
    if (write_atomic(path, doc, &err)) {
        fprintf(stderr, "kernelmgr mcp install: %s\n", err.msg);
        rc = 6;
        goto done;
    }
    fprintf(stderr,
            "kernelmgr mcp install: %s \"%s\" in %s (%s mcp, Python %s)\n"
            "  a kernelmgr daemon already running keeps its own interpreter: `kernelmgr doctor`"
            " shows it\n",
            replaced ? "replaced" : "added", name, path, self_real, py);
    rc = 0;
done:
    json_decref(doc);
    free(path);
    free(al);
    free(self_real);
    free(self);
    free(exe_dir);
    free(py);
    return rc;
}
