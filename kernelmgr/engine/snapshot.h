/*
 * snapshot.h — snapshots of a session: each live kernel's state, saved and
 * loaded by the kernel itself inside its sandbox (the worker protocol's
 * `snapshot` request, kernels/WORKER_PROTOCOL.md), plus a copy of the
 * workspace. The host only moves bytes: it makes an empty staging
 * directory in the workspace, asks the kernel to save into it (or to load
 * from it), and copies the regular files it finds there, fd-based, never
 * following a link, bounded by snapshot_max, into the store — or back. It
 * never unpickles, sources or otherwise interprets what the sandbox wrote.
 *
 *   sessions/NAME/snapshots/TAG/manifest.json   written by the host
 *   sessions/NAME/snapshots/TAG/LANG/FILE       a kernel's state, as written
 *   sessions/NAME/snapshots/TAG/workspace/      a copy of the workspace
 *
 * A snapshot directory is self-contained (it names no path of this host
 * beyond the manifest's informative "workspace"), so it can be copied to
 * another daemon. The tag "auto" is the automatic one (idle cull,
 * eviction, daemon stop, periodic), replaced each time.
 *
 * Every call here is made with the session's lock held.
 */
#ifndef KERNELMGR_SNAPSHOT_H
#define KERNELMGR_SNAPSHOT_H

#include "kernelmgr/engine/kmerr.h"

#include "kernelmgr/engine/session_int.h"

#include <jansson.h>

#define SNAP_TAG_MAX 64
#define SNAP_AUTO "auto"
#define SNAP_MANIFEST_MAX (1u << 20) /* bytes of a manifest.json read back */
#define SNAP_COUNT_MAX 32            /* snapshots a session keeps ("auto" included) */

/* 0 when tag is a valid snapshot tag ([A-Za-z0-9._-], 1..64 bytes, not
 * starting with "."), else -1 with the reason. */
int snap_tag_check(const char *tag, km_err *err);

/* new: takes snapshot tag (NULL: a new one named by the time) of s: every
 * live kernel saves its state (a kernel that fails is named in the
 * manifest's "failed"; all failing fails the call), and with with_ws the
 * workspace is copied. Replaces an earlier snapshot of that tag only once
 * the new one is complete (temp directory, fsync, rename). Returns the
 * manifest, or NULL with the reason (a bound hit names snapshot_max). */
json_t *snap_take(km_manager *m, session *s, const char *tag, int with_ws, const char *why,
                  km_err *err);

/* new: loads language l's state of snapshot tag into slot l's live kernel.
 * Returns {"from": "snapshot", "tag", "at", "lost": [names]} (the
 * "restored" of a result; "lost_detail" has types and reasons), or NULL
 * with the reason (no such snapshot, a corrupt one, the kernel refused). */
json_t *snap_load(km_manager *m, session *s, int l, const char *tag, km_err *err);

/* 1 when snapshot tag of s holds a state of language l. */
int snap_has(km_manager *m, const session *s, int l, const char *tag);

/* new: the manifests of s's snapshots, newest first (an unreadable one is
 * listed with its "error"). */
json_t *snap_list(km_manager *m, const session *s);

/* The newest snapshot's tag of s into out; 0, or -1 when there is none. */
int snap_newest(km_manager *m, const session *s, char *out, size_t outlen);

/* Replaces the contents of s's workspace with snapshot tag's copy. 0, or -1
 * with the reason. */
int snap_restore_workspace(km_manager *m, session *s, const char *tag, km_err *err);

/* Copies snapshot tag of src into dst's store as tag dst_tag (a fork):
 * kernel states and workspace copy, every file copied (never linked). 0, or
 * -1 with the reason. */
int snap_copy_to(km_manager *m, const session *src, const char *tag, const session *dst,
                 const char *dst_tag, km_err *err);

/* Automatic snapshot before s's kernels are stopped (idle cull, eviction,
 * daemon stop): snapshot "auto" of the live kernels (no workspace copy:
 * the workspace stays), and each saved kernel's next start restores it
 * (kslot.restore). A failure is logged and leaves things as they were. */
void snap_before_stop(km_manager *m, session *s, const char *why);

/* After slot l's kernel started: loads kslot.restore's snapshot when one is
 * pending and keeps what it said in kslot.restored for the next result. */
void snap_after_start(km_manager *m, session *s, int l);

/* Periodic snapshots (snapshot_interval): adds secs of cell time to slot l
 * and takes snapshot "auto" when the interval is reached. */
void snap_cell_time(km_manager *m, session *s, int l, double secs);

/* Before a cell with periodic snapshots on: when slot l's worker is no
 * longer the one its last snapshot saw (the kernel server restarted a
 * crashed worker: kernel_info's worker_generation), its "auto" snapshot is
 * restored first. */
void snap_check_worker(km_manager *m, session *s, int l);

/* For a session archive (sessionarch.h): the path of snapshot tag of s
 * (tag "": the snapshots' directory, with a trailing "/"), 0 or -1 (too
 * long); its manifest (new, or NULL with the reason); a manifest written
 * into dir (temp, fsync, rename; 0 or -1); a kernel's "lost" list cut to
 * the bounds a manifest keeps (new). */
int snap_path(const session *s, const char *tag, char *out, size_t size);
json_t *snap_manifest(const session *s, const char *tag, km_err *err);
int snap_write_manifest(const char *dir, json_t *manifest);
json_t *snap_lost_sanitized(const json_t *lost);

/* Copies into snapshot tag of s the state of every kernel that is not
 * running but waits to be restored from another snapshot (culled, or
 * stopped with the daemon), so that tag holds all of the session's
 * variables. 0, or -1 with the reason. */
int snap_adopt_pending(km_manager *m, session *s, const char *tag, km_err *err);

#endif
