/*
 * sessionarch.h — a session as one archive, to move it to another daemon
 * (docs/MANY_MACHINES.md "Moving a session"): a POSIX ustar file of
 *
 *   kernelmgr-session.json        what was exported (informative)
 *   snapshot/manifest.json        the snapshot's manifest (no host path)
 *   snapshot/LANG/FILE            each kernel's state, as its kernel wrote it
 *   workspace/...                 the workspace: directories and regular files
 *
 * Writing walks a snapshot directory of the store fd-based (its symbolic
 * links are left out and listed). Reading treats the archive as hostile:
 * only ustar regular files and directories, relative paths of the names
 * above with no "..", "." or empty component, no links, devices or FIFOs,
 * sizes and entry counts bounded (import_max_bytes, import_max_entries),
 * everything checked before anything is written, then extracted
 * fd-relative (openat, O_NOFOLLOW, O_EXCL) into a fresh snapshot directory
 * of the importing session whose manifest this host writes anew from what
 * it extracted. Nothing of a kernel's state is interpreted: it is copied as
 * opaque bytes, exactly as a snapshot is (snapshot.h).
 *
 * Every call here is made with the session's lock held.
 */
#ifndef KERNELMGR_SESSIONARCH_H
#define KERNELMGR_SESSIONARCH_H

#include "kernelmgr/engine/kmerr.h"

#include "kernelmgr/engine/session_int.h"

#include <jansson.h>

#define SARCH_HEADER "kernelmgr-session.json"
#define SARCH_FORMAT "kernelmgr-session-archive"
#define SARCH_HEADER_MAX (64u << 10) /* bytes of kernelmgr-session.json read back */

/* Writes snapshot tag of s and header (kernelmgr-session.json) as a ustar
 * archive to fd. info gets {"entries","bytes","skipped":[{"path","reason"}]}
 * (symbolic links, paths ustar cannot hold). 0, or -1 with err. */
int sarch_write(km_manager *m, const session *s, const char *tag, const json_t *header, int fd,
                json_t *info, km_err *err);

/* Reads the archive open as fd (a regular file, from offset 0) as hostile
 * input. With s NULL it only checks it; else it extracts it into snapshot
 * tag of s (which must not exist), writing its manifest anew. Returns new
 * {"from": {"session","node_id","exported_at"} (what the archive says,
 * validated), "entries", "bytes", "kernels": [LANG]}, or NULL with err
 * naming the entry and the rule it broke. */
json_t *sarch_read(km_manager *m, session *s, int fd, const char *tag, km_err *err);

#endif
