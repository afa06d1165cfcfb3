/*
 * jp.h — the Jupyter wire protocol (v5.3) in C: messages, signing, framing,
 * replay protection and connection files. The one public header of protocol/.
 *
 * Ownership conventions (as in jansson's reference):
 *   "new"      the caller owns the returned object and must free it
 *              (jmsg_destroy, json_decref, free — as stated per function);
 *   "borrowed" the callee keeps ownership; valid while its owner lives;
 *   "steals"   the callee takes ownership of an argument, even on failure.
 * Constructors return NULL on failure; destructors take a pointer to the
 * caller's pointer and set it to NULL (NULL-safe).
 *
 * Every byte that arrives from a socket or a file is untrusted. Functions that
 * read such input return a jp_status and fill a jp_error with a reason that a
 * person can read; they never abort, leak or block unless told to block.
 */
#ifndef JP_H
#define JP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JP_PROTOCOL_VERSION "5.3"
#define JP_DELIMITER "<IDS|MSG>"
#define JP_SIGNATURE_HEX_LEN 64          /* hex of a 32-byte HMAC-SHA256 */
#define JP_DEFAULT_MAX_BYTES (64u << 20) /* per message, all frames */
#define JP_DEFAULT_MAX_FRAMES 1024u      /* ids + delimiter + 5 + buffers */
#define JP_DEFAULT_REPLAY_CAPACITY 4096u /* remembered signatures */

/* ---------------------------------------------------------------- errors */

typedef enum jp_status {
    JP_OK = 0,
    JP_ERR_NOMEM,           /* allocation failed */
    JP_ERR_ARG,             /* invalid argument from the caller (a bug) */
    JP_ERR_AGAIN,           /* non-blocking I/O: nothing to read / would block */
    JP_ERR_ZMQ,             /* libzmq reported an error (reason has zmq_strerror) */
    JP_ERR_IO,              /* file-system error (reason has strerror) */
    JP_ERR_TOO_MANY_FRAMES, /* more frames than the configured maximum */
    JP_ERR_TOO_LARGE,       /* more bytes than the configured maximum */
    JP_ERR_NO_DELIMITER,    /* no "<IDS|MSG>" frame */
    JP_ERR_FRAME_COUNT,     /* fewer than signature + 4 JSON frames after it */
    JP_ERR_SIG_LENGTH,      /* signature frame has the wrong length / not hex */
    JP_ERR_SIG_MISMATCH,    /* HMAC does not match */
    JP_ERR_REPLAY,          /* this signature was seen before */
    JP_ERR_UTF8,            /* a JSON frame is not valid UTF-8 */
    JP_ERR_JSON,            /* a JSON frame does not parse */
    JP_ERR_FIELD_MISSING,   /* a required field is absent */
    JP_ERR_FIELD_TYPE,      /* a field has the wrong JSON type */
    JP_ERR_SCHEME,          /* unsupported signature_scheme */
    JP_ERR_CONNFILE,        /* connection file content is invalid */
    JP_ERR__COUNT
} jp_status;

typedef struct jp_error {
    jp_status code;
    char reason[256]; /* NUL-terminated, human readable, never empty on error */
} jp_error;

/* Static English name of a status, e.g. "signature mismatch". Never NULL. */
const char *jp_strerror(jp_status code);

/* ---------------------------------------------------------------- helpers */

/* Writes a random (libsodium) RFC 4122 version-4 uuid, lowercase, 36 chars + NUL. */
void jp_uuid4(char out[37]);

/* Writes the current UTC time as "2026-12-01T00:32:36.123456Z" (27 chars + NUL). */
void jp_now_iso8601(char out[32]);

/* Parses an ISO 8601 date-time as Jupyter headers carry it ("date"):
 * "2026-12-01T00:32:36.123456Z", also with a space for the "T", without or
 * with any number of fraction digits, and with "Z", "+HH:MM", "-HHMM" or no
 * zone (taken as UTC). 0 with *epoch_s (seconds since 1970, UTC), or -1 when
 * s is not such a date. The kernel's own clock: a manager compares two of
 * its dates, never one of them with its own clock. */
int jp_iso8601_parse(const char *s, double *epoch_s);

/* cm_write_all (common/cm_io.h), kept for the callers that still use it:
 * writes all len bytes of buf to fd, retrying short writes and EINTR.
 * 0, or -1 with errno set (ENOSPC for a write that made no progress). */
int jp_write_all(int fd, const void *buf, size_t len);

/* ---------------------------------------------------------------- frames */

/* One owned byte buffer (a ZeroMQ frame, a routing id or a binary buffer). */
typedef struct jp_frame {
    void *data; /* owned, malloc()ed; may be NULL when size == 0 */
    size_t size;
} jp_frame;

/* Frees every frame's data and the array itself; sets *frames to NULL. */
void jp_frames_free(jp_frame **frames, size_t n);

/* ---------------------------------------------------------------- messages */

/* A Jupyter message. Fields are public for reading and may be replaced by the
 * owner of the message; every pointer below is owned by the message. */
typedef struct jmsg {
    jp_frame *ids; /* routing identities (ROUTER sockets); may be NULL */
    size_t n_ids;
    json_t *header;        /* object: msg_id, session, username, date, msg_type, version */
    json_t *parent_header; /* object, {} when none */
    json_t *metadata;      /* object */
    json_t *content;       /* object */
    jp_frame *buffers;     /* extra binary frames; may be NULL */
    size_t n_buffers;
} jmsg;

/* new: a message of msg_type with a fresh header (uuid4 msg_id, date now,
 * version "5.3"), session and username copied (NULL → "" / "kernel").
 * When parent is not NULL (borrowed): parent_header is a deep copy of its
 * header and the routing ids are copied, so a reply goes back to the sender.
 * metadata and content start as {}. */
jmsg *jmsg_new(const char *msg_type, const char *session, const char *username, const jmsg *parent);

/* Destroys the message and everything it owns; sets *msg to NULL. */
void jmsg_destroy(jmsg **msg);

/* Replaces the content; steals content (must be an object). Returns 0 or -1
 * (content not an object: it is still released). */
int jmsg_set_content(jmsg *msg, json_t *content);

/* Replaces the metadata; steals metadata (must be an object). 0 or -1. */
int jmsg_set_metadata(jmsg *msg, json_t *metadata);

/* Appends a copy of data[0..size) as a binary buffer. 0 or -1 (no memory). */
int jmsg_add_buffer(jmsg *msg, const void *data, size_t size);

/* Replaces the routing ids with copies of ids[0..n). 0 or -1. */
int jmsg_set_ids(jmsg *msg, const jp_frame *ids, size_t n);

/* borrowed: header.msg_type / header.msg_id / header.session, or "" when absent. */
const char *jmsg_type(const jmsg *msg);
const char *jmsg_id(const jmsg *msg);
const char *jmsg_session(const jmsg *msg);

/* ---------------------------------------------------------------- sessions */

/* A signing session: the key, the limits and the replay cache of one peer
 * connection (one per process side, shared by its sockets, like
 * jupyter_client's Session). Not thread-safe: use one per thread. */
typedef struct jp_session jp_session;

/* new: key[0..key_len) (copied; key_len 0 disables signing and verification),
 * scheme must be "hmac-sha256" (NULL means that); anything else fails with
 * JP_ERR_SCHEME in err (err may be NULL). */
jp_session *jp_session_new(const void *key, size_t key_len, const char *scheme, jp_error *err);
void jp_session_destroy(jp_session **s);

/* Limits; 0 restores the default. Replay capacity is the number of recent
 * signatures remembered (oldest forgotten first). */
void jp_session_set_max_bytes(jp_session *s, size_t max_bytes);
void jp_session_set_max_frames(jp_session *s, size_t max_frames);
void jp_session_set_replay_capacity(jp_session *s, size_t capacity);

/* Writes the lowercase hex HMAC-SHA256 of the concatenated parts (in order)
 * plus a NUL into out. With an empty key, writes "". */
void jp_session_sign(const jp_session *s, const jp_frame parts[4],
                     char out[JP_SIGNATURE_HEX_LEN + 1]);

/* Decodes a multipart message already received as frames (borrowed).
 * Order of checks: frame count and total size; delimiter; signature length
 * and hex; HMAC (constant time) over the four JSON frames exactly as received;
 * replay; only then UTF-8 and JSON parsing; header fields msg_id, msg_type
 * (strings) required; parent_header, metadata, content must be objects.
 * On JP_OK *out is new; otherwise *out is NULL and err says why (err may be
 * NULL). A message that failed verification is not remembered as seen (a
 * signature is remembered only once the whole message decoded). With an
 * empty key the signature frame is ignored, as in jupyter_client. JSON is
 * parsed with JSON_ALLOW_NUL (Python writes "\u0000" for NUL characters) and
 * duplicate keys are accepted, last one wins, as Python's json does. */
jp_status jp_session_decode(jp_session *s, const jp_frame *frames, size_t n, jmsg **out,
                            jp_error *err);

/* Encodes msg (borrowed) into frames: ids, delimiter, signature, header,
 * parent_header, metadata, content, buffers. *frames is new (jp_frames_free). */
jp_status jp_session_encode(const jp_session *s, const jmsg *msg, jp_frame **frames, size_t *n,
                            jp_error *err);

/* Sends msg (borrowed) on a ZeroMQ socket. flags: 0 or ZMQ_DONTWAIT
 * (JP_ERR_AGAIN when the socket would block; nothing is sent then). A signal
 * interrupting a blocking send before anything left also gives JP_ERR_AGAIN. */
jp_status jp_session_send(const jp_session *s, void *zsock, const jmsg *msg, int flags,
                          jp_error *err);

/* Receives one whole multipart message (all parts are always drained, even
 * when the message is rejected, so the socket stays in sync). flags: 0 or
 * ZMQ_DONTWAIT (JP_ERR_AGAIN when nothing is waiting). Oversized messages are
 * discarded part by part without being stored. *out is new on JP_OK. A
 * signal interrupting a blocking wait before the first part gives JP_ERR_AGAIN
 * (nothing consumed; call again). */
jp_status jp_session_recv(jp_session *s, void *zsock, int flags, jmsg **out, jp_error *err);

/* ---------------------------------------------------------------- connection files */

typedef enum jp_channel {
    JP_SHELL = 0,
    JP_IOPUB,
    JP_STDIN,
    JP_CONTROL,
    JP_HB,
    JP_CHANNEL__COUNT
} jp_channel;

/* borrowed: "shell", "iopub", "stdin", "control", "hb". */
const char *jp_channel_name(jp_channel ch);

typedef struct jp_connection {
    char transport[8]; /* "tcp" or "ipc" */
    char ip[256];      /* tcp: address; ipc: path stem */
    int ports[JP_CHANNEL__COUNT];
    char key[256];             /* the HMAC key as text ("" = no signing) */
    char signature_scheme[32]; /* "hmac-sha256" */
    char kernel_name[128];     /* may be "" */
} jp_connection;

/* Parses connection-file JSON text (len bytes, need not be NUL-terminated).
 * Required: transport ("tcp"|"ipc"), ip, the five *_port as integers
 * (1..65535 for tcp, >= 0 for ipc), key (string), signature_scheme
 * ("hmac-sha256"). Optional: kernel_name. */
jp_status jp_connection_parse(const char *text, size_t len, jp_connection *out, jp_error *err);

/* Reads and parses a file (at most 1 MiB). */
jp_status jp_connection_read(const char *path, jp_connection *out, jp_error *err);

/* Writes the connection as JSON to path with mode 0600 (created exclusively
 * through a temporary file in the same directory, then renamed). */
jp_status jp_connection_write(const char *path, const jp_connection *c, jp_error *err);

/* Fills c for a new kernel: transport "tcp" (ip default "127.0.0.1", five
 * distinct free ports found by binding port 0) or "ipc" (ip = path stem,
 * required, ports 1..5); a fresh random 256-bit key as 64 hex chars;
 * signature_scheme "hmac-sha256"; kernel_name (may be NULL). */
jp_status jp_connection_init(jp_connection *c, const char *transport, const char *ip,
                             const char *kernel_name, jp_error *err);

/* What the tcp transport exposes, said once for every warning and refusal:
 * ZeroMQ authenticates no tcp peer (the HMAC key signs messages, it does not
 * hide them), so whoever can reach a kernel's iopub port subscribes and
 * reads everything the kernel publishes; on loopback that is every local
 * user. Jupyter clients and connection files have no CURVE support that
 * could close it. */
#define JP_TCP_EXPOSURE                                                                            \
    "any local user can read every kernel's output on IOPub (ZeroMQ PUB has no authentication)"

/* 1 when c's sockets can only be bound on this host's loopback: transport
 * "ipc", or "tcp" with a numeric loopback ip (127.0.0.0/8, ::1, ::ffff:127.x,
 * brackets allowed). 0 for any other ip, names included: libzmq also binds
 * "*", interface names ("eth0") and host names. */
int jp_connection_is_loopback(const jp_connection *c);

/* Writes the ZeroMQ endpoint of a channel, "tcp://IP:PORT" or
 * "ipc://STEM-PORT", into buf. Returns 0, or -1 when it does not fit. */
int jp_connection_endpoint(const jp_connection *c, jp_channel ch, char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* JP_H */
