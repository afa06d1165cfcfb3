/*
 * cm_mime.h — the one table of file-name extensions and MIME types, and
 * which types are text and which are images the manager saves. The returned
 * strings are static.
 */
#ifndef CM_MIME_H
#define CM_MIME_H

/* The MIME type of a file by its name's extension (case-insensitive, the
 * last "." after the last "/"), e.g. "out/plot.PNG" -> "image/png"; NULL
 * when there is none or it is not in the table. */
const char *cm_mime_by_name(const char *path);

/* The usual extension (no dot) for a MIME type of the table, e.g.
 * "image/jpeg" -> "jpg"; NULL for one it does not have. */
const char *cm_mime_ext(const char *mime);

/* 1 when a type's content is text (UTF-8): any text/ type, the table's textual
 * application types (JSON, XML, YAML, TOML, notebooks), image/svg+xml and any
 * "+json"/"+xml" type; else 0. */
int cm_mime_is_text(const char *mime);

/* 1 for an image type the manager saves from a display and shows inline:
 * image/png, image/jpeg, image/gif, image/webp, image/svg+xml; else 0. */
int cm_mime_is_image(const char *mime);

#endif
