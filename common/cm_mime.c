/*
 * cm_mime.c — the one extension/MIME table (see cm_mime.h).
 */
#include "common/cm_mime.h"

#include <string.h>
#include <strings.h>

enum { TEXT = 1, IMAGE = 2 };

/* The first row of a type gives its usual extension. */
static const struct {
    const char *ext, *mime;
    int flags;
} table[] = {
    {"png", "image/png", IMAGE},
    {"jpg", "image/jpeg", IMAGE},
    {"jpeg", "image/jpeg", IMAGE},
    {"gif", "image/gif", IMAGE},
    {"svg", "image/svg+xml", IMAGE | TEXT},
    {"webp", "image/webp", IMAGE},
    {"pdf", "application/pdf", 0},
    {"csv", "text/csv", TEXT},
    {"tsv", "text/tab-separated-values", TEXT},
    {"txt", "text/plain", TEXT},
    {"log", "text/plain", TEXT},
    {"md", "text/markdown", TEXT},
    {"json", "application/json", TEXT},
    {"jsonl", "application/jsonl", TEXT},
    {"html", "text/html", TEXT},
    {"htm", "text/html", TEXT},
    {"xml", "application/xml", TEXT},
    {"py", "text/x-python", TEXT},
    {"sh", "text/x-shellscript", TEXT},
    {"ipynb", "application/x-ipynb+json", TEXT},
    {"zip", "application/zip", 0},
    {"gz", "application/gzip", 0},
    {"tar", "application/x-tar", 0},
    {"parquet", "application/vnd.apache.parquet", 0},
    {"yaml", "application/yaml", TEXT},
    {"yml", "application/yaml", TEXT},
    {"toml", "application/toml", TEXT},
    {"c", "text/x-c", TEXT},
    {"h", "text/x-c", TEXT},
    {"js", "text/javascript", TEXT},
    {"css", "text/css", TEXT},
    {"npy", "application/octet-stream", 0},
    {"pkl", "application/octet-stream", 0},
};
#define NTABLE (sizeof table / sizeof *table)

const char *cm_mime_by_name(const char *path)
{
    if (!path)
        return NULL;
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (!dot || (slash && dot < slash))
        return NULL;
    for (size_t i = 0; i < NTABLE; i++)
        if (!strcasecmp(dot + 1, table[i].ext))
            return table[i].mime;
    return NULL;
}

static int row_of(const char *mime)
{
    if (mime)
        for (size_t i = 0; i < NTABLE; i++)
            if (!strcmp(mime, table[i].mime))
                return (int)i;
    return -1;
}

const char *cm_mime_ext(const char *mime)
{
    int i = row_of(mime);
    return i < 0 || !strcmp(mime, "application/octet-stream") ? NULL : table[i].ext;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

int cm_mime_is_text(const char *mime)
{
    if (!mime)
        return 0;
    if (!strncmp(mime, "text/", 5) || ends_with(mime, "+json") || ends_with(mime, "+xml"))
        return 1;
    int i = row_of(mime);
    return i >= 0 && (table[i].flags & TEXT);
}

int cm_mime_is_image(const char *mime)
{
    int i = row_of(mime);
    return i >= 0 && (table[i].flags & IMAGE);
}
