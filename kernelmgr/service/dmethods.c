/*
 * dmethods.c — the daemon's methods: the table dmethods[] (each method's
 * tiers and fields, read by the tier check before any handler runs) and
 * the handlers (daemon_int.h). docs/API.md is the reference.
 *
 * Each method validates its params once, with rpc_unpack (json_unpack_ex,
 * JSON_STRICT): an unknown, missing or mistyped field is refused naming it,
 * before anything is done. A handler's format string is its params; the
 * request context (dreq) holds the one reason buffer and the km_err of the
 * call it makes, and dreq_reply answers by that call's outcome.
 */
#include "kernelmgr/service/daemon_int.h"
#include "kernelmgr/service/daemon_http.h"
#include "kernelmgr/service/rpc.h"
#include "kernelmgr/packages/pkgsession.h"
#include "kernelmgr/engine/wsfile.h"

#include <sodium.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The session options every method that may create a session takes: the
 * table dtier_sessopts says their types, ranges, ceilings and tiers
 * (dtier.h), and sopts_fill reads them; a method's rpc_unpack (JSON_STRICT)
 * sees params without them (new; params itself, a new reference, when it
 * is no object: rpc_unpack says so). The strings rpc_unpack gives are
 * params' own (the copy is shallow). */
static json_t *sopts_strip(const json_t *p)
{
    if (!json_is_object(p))
        return json_incref((json_t *)p);
    json_t *own = json_copy((json_t *)p);
    for (const dtier_sessopt *o = dtier_sessopts; own && o->f.name; o++)
        json_object_del(own, o->f.name);
    return own;
}

/* Checks the session options of params by the table and against the
 * operator's ceilings for r's tier, and fills so (borrowing from params).
 * 0, or -1 with the reason naming the field in r->why.msg. */
static int sopts_fill(dreq *r, const json_t *p, km_session_opts *so)
{
    return dtier_sopts_fill(p, so, &r->why) ||
                   dtier_sopts_ceiling(&r->dc->grant, km_manager_config(daemon_mgr), p, so, &r->why)
               ? -1
               : 0;
}

static json_t *hello_for(km_manager *m, const dtier_grant *g);

static void m_ping(dreq *r, const json_t *p)
{
    if (rpc_unpack(p, &r->why, "{}"))
        return dreq_invalid(r, r->why.msg);
    dreq_ok(r, hello_for(daemon_mgr, &r->dc->grant));
}

static void m_initialize(dreq *r, const json_t *p)
{
    json_int_t want = DAEMON_API_VERSION;
    const char *client = NULL, *tname = NULL, *allow = NULL;
    int unsafe = 0;
    if (rpc_unpack(p, &r->why, "{s?I s?s s?s s?s s?b}", "api_version", &want, "client", &client,
                   "tier", &tname, "allowlist", &allow, "allow_unsafe_session_options", &unsafe))
        return dreq_invalid(r, r->why.msg);
    if (want != DAEMON_API_VERSION)
        return dreq_invalidf(r,
                             "api_version %lld is not served here: this daemon speaks "
                             "api_version %d",
                             (long long)want, DAEMON_API_VERSION);
    dconn *dc = r->dc;
    dtier t = dc->grant.tier;
    if (tname && dtier_parse(tname, &t))
        return dreq_invalidf(r,
                             "field \"tier\": must be \"owner\", \"mcp\" or \"http\" (got "
                             "\"%.40s\")",
                             tname);
    if (t < dc->grant.tier)
        return dreq_invalidf(r,
                             "field \"tier\": a connection may only lower its tier (it is "
                             "\"%s\", asked for \"%s\")",
                             dtier_name(dc->grant.tier), dtier_name(t));
    if (allow && allow[0] != '/')
        return dreq_invalid(r, "field \"allowlist\": must be an absolute path");
    /* allowlist and allow_unsafe_session_options are owner fields (the
     * table): what the operator gave the lowering party, fixed for the
     * connection before its tier drops */
    if (allow) {
        char *a = strdup(allow);
        if (!a)
            return dreq_err(r, KM_EINTERNAL, "out of memory");
        free(dc->allowlist);
        dc->allowlist = a;
    }
    if (unsafe)
        dc->grant.unsafe = 1;
    /* the operator's configuration opts the HTTP tier in */
    if (t == DT_HTTP && dc->grant.tier != DT_HTTP)
        dc->grant.unsafe |= km_manager_config(daemon_mgr)->http_allow_unsafe;
    dc->grant.tier = t;
    r->tier = t;
    dreq_ok(r, hello_for(daemon_mgr, &dc->grant));
}

static void m_session_create(dreq *r, const json_t *p)
{
    const char *name;
    km_session_opts so;
    json_t *own = sopts_strip(p);
    int bad = rpc_unpack(own, &r->why, "{s:s}", "session", &name);
    json_decref(own);
    if (bad || sopts_fill(r, p, &so))
        return dreq_invalid(r, r->why.msg);
    dreq_reply(r, km_session_create(daemon_mgr, name, &so, &r->err));
}

/* exec's default for "create": true, but over HTTP on a daemon with a
 * node_id (behind a balancer) false, so a request the balancer sent to
 * the wrong node never makes an empty session there (docs/MANY_MACHINES.md). */
static int create_default(const dreq *r)
{
    return !(r->dc->grant.tier == DT_HTTP && km_manager_config(daemon_mgr)->node_id[0]);
}

static void m_exec(dreq *r, const json_t *p)
{
    const char *name, *code, *lang = NULL;
    double timeout = 0;
    int coe = 0, stream = 0, raw = 0, create = create_default(r);
    km_session_opts so;
    json_t *own = sopts_strip(p);
    int bad = rpc_unpack(own, &r->why, "{s:s s:s s?s s?F s?b s?b s?b s?b}", "session", &name,
                         "code", &code, "lang", &lang, "timeout", &timeout, "continue_on_error",
                         &coe, "stream", &stream, "raw_text", &raw, "create", &create);
    json_decref(own);
    if (bad || sopts_fill(r, p, &so))
        return dreq_invalid(r, r->why.msg);
    so.no_create = !create;
    /* the one check of the language: the configuration's table (lang.h);
     * the CLI and MCP pass it through */
    const kmcfg *cfg = km_manager_config(daemon_mgr);
    if (lang && strcmp(lang, "auto") && kmcfg_lang_index(cfg, lang) < 0) {
        char known[400];
        return dreq_invalidf(r, "field \"lang\": unknown language \"%.64s\" (known: %s or auto)",
                             lang, km_langs_names(&cfg->langs, known, sizeof known));
    }
    if (json_object_get(p, "timeout") && !(timeout > 0 && timeout <= 604800))
        return dreq_invalid(r, "field \"timeout\": must be a number of seconds in (0, 604800]");
    km_exec_opts eo = {lang, timeout, coe};
    r->raw = stream && raw;
    km_exec_set_client((int)r->dc->peer_pid);
    dreq_reply(
        r, km_exec(daemon_mgr, name, &so, &eo, code, stream ? dreq_on_event : NULL, r, &r->err));
}

static void m_sessions_list(dreq *r, const json_t *p)
{
    if (rpc_unpack(p, &r->why, "{}"))
        return dreq_invalid(r, r->why.msg);
    dreq_ok(r, json_pack("{s:o s:o}", "sessions", km_sessions(daemon_mgr), "pool",
                         km_pool_status(daemon_mgr)));
}

static void m_close(dreq *r, const json_t *p)
{
    const char *name;
    int keep = 0;
    if (rpc_unpack(p, &r->why, "{s:s s?b}", "session", &name, "keep", &keep))
        return dreq_invalid(r, r->why.msg);
    json_t *warnings = json_array();
    if (km_close_warn(daemon_mgr, name, keep ? KM_KEEP : 0, warnings, &r->err)) {
        json_decref(warnings);
        return dreq_fail(r);
    }
    json_t *res = json_pack("{s:s s:b}", "session", name, "kept", keep);
    if (res && json_array_size(warnings))
        json_object_set(res, "warnings", warnings);
    json_decref(warnings);
    dreq_ok(r, res);
}

static void m_session_repair(dreq *r, const json_t *p)
{
    const char *name;
    if (rpc_unpack(p, &r->why, "{s:s}", "session", &name))
        return dreq_invalid(r, r->why.msg);
    dreq_reply(r, km_session_repair(daemon_mgr, name, &r->err));
}

/* session.snapshot / session.snapshots / session.restore / session.fork */
static void m_snapshot(dreq *r, const json_t *p)
{
    const char *name, *tag = NULL;
    if (rpc_unpack(p, &r->why, "{s:s s?s}", "session", &name, "tag", &tag))
        return dreq_invalid(r, r->why.msg);
    dreq_reply(r, km_snapshot(daemon_mgr, name, tag, &r->err));
}

static void m_snapshots(dreq *r, const json_t *p)
{
    const char *name;
    if (rpc_unpack(p, &r->why, "{s:s}", "session", &name))
        return dreq_invalid(r, r->why.msg);
    dreq_reply(r, km_snapshots(daemon_mgr, name, &r->err));
}

static void m_restore(dreq *r, const json_t *p)
{
    const char *name, *tag = NULL;
    if (rpc_unpack(p, &r->why, "{s:s s?s}", "session", &name, "tag", &tag))
        return dreq_invalid(r, r->why.msg);
    dreq_reply(r, km_restore(daemon_mgr, name, tag, &r->err));
}

static void m_fork(dreq *r, const json_t *p)
{
    const char *name, *to, *tag = NULL;
    if (rpc_unpack(p, &r->why, "{s:s s:s s?s}", "session", &name, "new_session", &to, "tag", &tag))
        return dreq_invalid(r, r->why.msg);
    dreq_reply(r, km_fork(daemon_mgr, name, to, tag, &r->err));
}

static void m_interrupt_restart(dreq *r, const json_t *p)
{
    const char *name;
    if (rpc_unpack(p, &r->why, "{s:s}", "session", &name))
        return dreq_invalid(r, r->why.msg);
    int rc = !strcmp(r->method, "interrupt") ? km_interrupt(daemon_mgr, name, &r->err)
                                             : km_restart(daemon_mgr, name, &r->err);
    if (rc)
        return dreq_fail(r);
    dreq_ok(r, json_pack("{s:s}", "session", name));
}

/* files.list and files.read never create a session: they take "create"
 * only as false, so a client can send it on every call */
static int never_creates(dreq *r, int create)
{
    if (!create)
        return 0;
    km_err_set(&r->why, KM_EUSAGE,
               "field \"create\": %s never creates a session (only false is accepted; make one "
               "with session.create)",
               r->method);
    return -1;
}

static void m_files_list(dreq *r, const json_t *p)
{
    const char *name, *path = NULL;
    int create = 0;
    if (rpc_unpack(p, &r->why, "{s:s s?s s?b}", "session", &name, "path", &path, "create",
                   &create) ||
        never_creates(r, create))
        return dreq_invalid(r, r->why.msg);
    char sub[WSFILE_PATH_MAX + 1];
    if (wsfile_normalize(path ? path : "", 1, sub, &r->why) < 0)
        return dreq_invalid(r, r->why.msg);
    json_t *f = km_files(daemon_mgr, name, &r->err);
    if (!f)
        return dreq_fail(r);
    if (strcmp(sub, ".")) {
        /* below a sub-directory: the walk never follows a link (fsdiff), so
         * filtering the whole listing by prefix cannot leave the workspace */
        json_t *all = json_object_get(f, "files"), *keep = json_array();
        size_t i, plen = strlen(sub);
        json_t *fe;
        json_array_foreach(all, i, fe)
        {
            const char *fp = json_string_value(json_object_get(fe, "path"));
            if (fp && !strncmp(fp, sub, plen) && fp[plen] == '/')
                json_array_append(keep, fe);
        }
        json_object_set_new(f, "files", keep);
        json_object_set_new(f, "path", json_string(sub));
    }
    dreq_ok(r, f);
}

static void m_files_read(dreq *r, const json_t *p)
{
    const char *name, *path, *enc = "auto";
    json_int_t off = 0, len = 0;
    int create = 0;
    if (rpc_unpack(p, &r->why, "{s:s s:s s?I s?I s?s s?b}", "session", &name, "path", &path,
                   "offset", &off, "length", &len, "encoding", &enc, "create", &create) ||
        never_creates(r, create))
        return dreq_invalid(r, r->why.msg);
    if (off < 0 || (json_object_get(p, "length") && len < 1))
        return dreq_invalid(r, "field \"offset\" must be >= 0 and field \"length\" >= 1");
    km_err bad = {0};
    if (wsfile_encoding(enc, WSFILE_ENC_READ, &bad) < 0)
        return dreq_invalidf(r, "field \"encoding\": %s", bad.msg);
    dreq_reply(r, km_file_read(daemon_mgr, name, path, (uint64_t)off, (uint64_t)len, enc, &r->err));
}

/* content in encoding enc (wsfile_enc) as bytes: *data borrows content ("text") or is
 * *bin (new, "base64"); *len its length in, its bytes out. 0, or -1: not
 * valid base64. */
static int content_bytes(const char *content, int enc, const void **data, unsigned char **bin,
                         size_t *len)
{
    *data = content;
    *bin = NULL;
    if (enc != WSFILE_ENC_BASE64)
        return 0;
    size_t binlen = 0;
    *bin = malloc(*len / 4 * 3 + 3);
    if (!*bin || sodium_base642bin(*bin, *len / 4 * 3 + 3, content, *len, " \t\r\n", &binlen, NULL,
                                   sodium_base64_VARIANT_ORIGINAL) != 0) {
        free(*bin);
        *bin = NULL;
        return -1;
    }
    *data = *bin;
    *len = binlen;
    return 0;
}

static void m_files_write(dreq *r, const json_t *p)
{
    const char *name, *path, *content, *enc = "text";
    int append = 0, create = 0;
    km_session_opts so;
    json_t *own = sopts_strip(p);
    int bad =
        rpc_unpack(own, &r->why, "{s:s s:s s:s s?s s?b s?b}", "session", &name, "path", &path,
                   "content", &content, "encoding", &enc, "append", &append, "create", &create);
    json_decref(own);
    if (bad || sopts_fill(r, p, &so))
        return dreq_invalid(r, r->why.msg);
    km_err why = {0};
    int e = wsfile_encoding(enc, WSFILE_ENC_WRITE, &why);
    if (e < 0)
        return dreq_invalidf(r, "field \"encoding\": %s", why.msg);
    char norm[WSFILE_PATH_MAX + 1];
    /* a bad path is refused before a session is created for it */
    if (wsfile_normalize(path, 0, norm, &r->why) < 0)
        return dreq_invalid(r, r->why.msg);
    size_t len = json_string_length(json_object_get(p, "content"));
    unsigned char *bin;
    const void *data;
    if (content_bytes(content, e, &data, &bin, &len))
        return dreq_invalid(r, "field \"content\": not valid base64");
    json_t *created = NULL;
    if (create && !(created = km_session_create(daemon_mgr, name, &so, &r->err))) {
        free(bin);
        return dreq_fail(r);
    }
    json_t *res = km_file_write(daemon_mgr, name, path, data, len, append, &r->err);
    free(bin);
    if (res && json_is_array(json_object_get(created, "warnings")))
        json_object_set(res, "warnings", json_object_get(created, "warnings"));
    json_decref(created);
    dreq_reply(r, res);
}

static void m_files_remove(dreq *r, const json_t *p)
{
    const char *name, *path;
    if (rpc_unpack(p, &r->why, "{s:s s:s}", "session", &name, "path", &path))
        return dreq_invalid(r, r->why.msg);
    char norm[WSFILE_PATH_MAX + 1];
    if (wsfile_normalize(path, 0, norm, &r->why) < 0)
        return dreq_invalid(r, r->why.msg);
    dreq_reply(r, km_file_remove(daemon_mgr, name, norm, &r->err));
}

static void m_packages_install(dreq *r, const json_t *p)
{
    const char *name, *manager, *allow = NULL;
    json_t *pkgs;
    if (rpc_unpack(p, &r->why, "{s:s s:s s:o s?s}", "session", &name, "manager", &manager,
                   "packages", &pkgs, "allowlist", &allow))
        return dreq_invalid(r, r->why.msg);
    if (!json_is_array(pkgs))
        return dreq_invalid(r, "field \"packages\": expected an array of strings");
    /* a tier below owner never names the file (the table): the allowlist
     * its operator fixed for the connection at initialize, else the
     * daemon's own */
    if (!allow)
        allow = r->dc->allowlist;
    dreq_reply(r, pkgsession_install(daemon_mgr, name, allow, manager, pkgs, &r->err));
}

static void m_export(dreq *r, const json_t *p)
{
    const char *name, *kname = NULL;
    if (rpc_unpack(p, &r->why, "{s:s s?s}", "session", &name, "kernel_name", &kname))
        return dreq_invalid(r, r->why.msg);
    json_t *nb = km_export(daemon_mgr, name, kname, &r->err);
    if (!nb)
        return dreq_fail(r);
    dreq_ok(r, json_pack("{s:o}", "notebook", nb));
}

static void m_connection_file(dreq *r, const json_t *p)
{
    const char *name, *lang = NULL;
    if (rpc_unpack(p, &r->why, "{s:s s?s}", "session", &name, "lang", &lang))
        return dreq_invalid(r, r->why.msg);
    char path[4096];
    if (km_connection_file(daemon_mgr, name, lang, path, sizeof path, &r->err))
        return dreq_fail(r);
    dreq_ok(r, json_pack("{s:s}", "connection_file", path));
}

/* Starts serving HTTP in this running daemon (daemon_http.h): what `serve
 * --http` asks of a daemon an agent's exec started. */
static void m_http_start(dreq *r, const json_t *p)
{
    const char *listen, *cert = NULL, *key = NULL;
    int insecure = 0;
    if (rpc_unpack(p, &r->why, "{s:s s?s s?s s?b}", "listen", &listen, "tls_cert", &cert, "tls_key",
                   &key, "insecure", &insecure))
        return dreq_invalid(r, r->why.msg);
    if ((cert && cert[0] != '/') || (key && key[0] != '/'))
        return dreq_invalid(r, "fields \"tls_cert\", \"tls_key\": must be absolute paths");
    daemon_http_listen l = {listen, cert, key, insecure};
    char url[256];
    int started = 0, port = 0;
    if (daemon_http_start(daemon_mgr, &l, &started, url, sizeof url, &port, &r->err))
        return dreq_fail(r);
    dreq_ok(r, json_pack("{s:s s:i s:b s:i}", "url", url, "port", port, "started", started, "pid",
                         (int)getpid()));
}

/* Draining (km.h): no new sessions, the existing ones keep working; the
 * gateway's /readyz says so. "drain": false ends it. Draining also takes a
 * snapshot ("drain", kernels and workspace) of every session with a live
 * kernel, one after the other, so each can be moved (session.export) or
 * brought back after the daemon is gone; "snapshot": false skips them.
 * With "stream", an event per session as it is done. */
static void m_daemon_drain(dreq *r, const json_t *p)
{
    int on = 1, snap = 1, stream = 0;
    if (rpc_unpack(p, &r->why, "{s?b s?b s?b}", "drain", &on, "snapshot", &snap, "stream", &stream))
        return dreq_invalid(r, r->why.msg);
    km_set_draining(daemon_mgr, on);
    json_t *ss = km_sessions(daemon_mgr);
    const char *node = km_manager_config(daemon_mgr)->node_id;
    fprintf(stderr, "kernelmgr: %s (%zu sessions)\n",
            on ? "draining: no new sessions" : "no longer draining", json_array_size(ss));
    json_t *results = json_array();
    size_t i, n = json_array_size(ss);
    json_t *sv;
    int failed = 0;
    json_array_foreach(ss, i, sv)
    {
        const char *name = json_string_value(json_object_get(sv, "name"));
        int live = 0;
        const char *ln;
        json_t *kv;
        json_object_foreach(json_object_get(sv, "kernels"), ln, kv)
        {
            live |= json_is_object(kv);
        }
        if (!on || !snap || !name)
            continue;
        json_t *res;
        if (!live) {
            res = json_pack("{s:s s:s s:s}", "session", name, "status", "skipped", "reason",
                            "no live kernel: its state is on disk already (its workspace, and "
                            "any snapshot its kernels wait to restore)");
        } else {
            km_err e = {0, ""};
            json_t *man = km_snapshot(daemon_mgr, name, "drain", &e);
            if (man) {
                res = json_pack("{s:s s:s s:s s:O s:O}", "session", name, "status", "snapshotted",
                                "tag", "drain", "kernels", json_object_get(man, "kernels"),
                                "failed", json_object_get(man, "failed"));
                json_decref(man);
            } else {
                failed++;
                res = json_pack("{s:s s:s s:s}", "session", name, "status", "failed", "reason",
                                e.msg);
            }
        }
        fprintf(stderr, "kernelmgr: drain: session %s %s (%zu of %zu)%s%s\n", name,
                json_string_value(json_object_get(res, "status")), i + 1, n,
                json_object_get(res, "reason") ? ": " : "",
                json_string_value(json_object_get(res, "reason")) ?: "");
        if (stream) {
            json_t *ev = json_pack("{s:s s:I s:I s:O}", "event", "drain", "done", (json_int_t)i + 1,
                                   "of", (json_int_t)n, "session", res);
            dreq_on_event(r, ev);
            json_decref(ev);
        }
        json_array_append_new(results, res);
    }
    json_t *out = json_pack("{s:b s:I s:s?}", "draining", on, "sessions", (json_int_t)n, "node_id",
                            node[0] ? node : NULL);
    if (on && snap) {
        json_object_set_new(out, "snapshots", results);
        json_object_set_new(out, "snapshots_failed", json_integer(failed));
    } else {
        json_decref(results);
    }
    dreq_ok(r, out);
    json_decref(ss);
}

/* session.export: the session's archive (sessionarch.h), built at the first
 * call (no "archive"), read in chunks of at most 1 MiB. */
static void m_session_export(dreq *r, const json_t *p)
{
    const char *name, *archive = NULL;
    json_int_t off = 0, len = 0;
    if (rpc_unpack(p, &r->why, "{s:s s?s s?I s?I}", "session", &name, "archive", &archive, "offset",
                   &off, "length", &len))
        return dreq_invalid(r, r->why.msg);
    if (off < 0 || (json_object_get(p, "length") && (len < 1 || len > KM_ARCHIVE_CHUNK_MAX)))
        return dreq_invalidf(r, "field \"offset\" must be >= 0 and field \"length\" 1 to %u",
                             KM_ARCHIVE_CHUNK_MAX);
    dreq_reply(r,
               km_session_export(daemon_mgr, name, archive, (uint64_t)off, (uint64_t)len, &r->err));
}

/* session.import: an archive in chunks (base64 "data" at "offset"), the
 * last with "final": checked as hostile input, then a new session. */
static void m_session_import(dreq *r, const json_t *p)
{
    const char *name, *data;
    json_int_t off = 0;
    int final = 0;
    km_session_opts so;
    json_t *own = sopts_strip(p);
    int bad = rpc_unpack(own, &r->why, "{s:s s:s s:I s?b}", "session", &name, "data", &data,
                         "offset", &off, "final", &final);
    json_decref(own);
    if (bad || sopts_fill(r, p, &so))
        return dreq_invalid(r, r->why.msg);
    if (off < 0)
        return dreq_invalid(r, "field \"offset\" must be >= 0");
    size_t len = json_string_length(json_object_get(p, "data"));
    unsigned char *bin;
    const void *bytes;
    if (content_bytes(data, WSFILE_ENC_BASE64, &bytes, &bin, &len))
        return dreq_invalid(r, "field \"data\": not valid base64");
    json_t *res =
        km_session_import(daemon_mgr, name, &so, (uint64_t)off, bytes, len, final, &r->err);
    free(bin);
    dreq_reply(r, res);
}

static void m_shutdown(dreq *r, const json_t *p)
{
    if (rpc_unpack(p, &r->why, "{}"))
        return dreq_invalid(r, r->why.msg);
    dreq_ok(r, NULL);
    daemon_stop = 1;
    dloop_wake();
}

/* The fields of each method and the tiers that may send them (dtier.h).
 * The session options are the table dtier_sessopts. */
#define F_ALL(name)                                                                                \
    {                                                                                              \
        name, DT_ALL, 0, NULL                                                                      \
    }
static const dtier_field f_none[] = {{NULL, 0, 0, NULL}};
static const dtier_field f_session[] = {F_ALL("session"), {NULL, 0, 0, NULL}};
static const dtier_field f_initialize[] = {
    F_ALL("api_version"),
    F_ALL("client"),
    F_ALL("tier"),
    {"allowlist", DT_O, 0, "it names a host path: the operator's allowlist applies"},
    {"allow_unsafe_session_options", DT_O, 0, "only the operator opts a connection in"},
    {NULL, 0, 0, NULL}};
static const dtier_field f_exec[] = {F_ALL("session"),
                                     F_ALL("code"),
                                     F_ALL("lang"),
                                     F_ALL("timeout"),
                                     F_ALL("continue_on_error"),
                                     F_ALL("stream"),
                                     {"raw_text", DT_O | DT_M, 0, "messages over HTTP are JSON"},
                                     F_ALL("create"),
                                     {NULL, 0, 0, NULL}};
static const dtier_field f_snapshot[] = {F_ALL("session"), F_ALL("tag"), {NULL, 0, 0, NULL}};
static const dtier_field f_fork[] = {
    F_ALL("session"), F_ALL("new_session"), F_ALL("tag"), {NULL, 0, 0, NULL}};
static const dtier_field f_close[] = {F_ALL("session"), F_ALL("keep"), {NULL, 0, 0, NULL}};
static const dtier_field f_files_list[] = {
    F_ALL("session"), F_ALL("path"), F_ALL("create"), {NULL, 0, 0, NULL}};
static const dtier_field f_files_read[] = {F_ALL("session"),  F_ALL("path"),     F_ALL("offset"),
                                           F_ALL("length"),   F_ALL("encoding"), F_ALL("create"),
                                           {NULL, 0, 0, NULL}};
static const dtier_field f_files_write[] = {F_ALL("session"),  F_ALL("path"),   F_ALL("content"),
                                            F_ALL("encoding"), F_ALL("append"), F_ALL("create"),
                                            {NULL, 0, 0, NULL}};
static const dtier_field f_files_remove[] = {F_ALL("session"), F_ALL("path"), {NULL, 0, 0, NULL}};
static const dtier_field f_packages[] = {
    F_ALL("session"),
    F_ALL("manager"),
    F_ALL("packages"),
    {"allowlist", DT_O, 0, "it names a host path: the operator's allowlist applies"},
    {NULL, 0, 0, NULL}};
static const dtier_field f_export[] = {F_ALL("session"), F_ALL("kernel_name"), {NULL, 0, 0, NULL}};
static const dtier_field f_connection_file[] = {
    F_ALL("session"), F_ALL("lang"), {NULL, 0, 0, NULL}};
static const dtier_field f_drain[] = {
    F_ALL("drain"), F_ALL("snapshot"), F_ALL("stream"), {NULL, 0, 0, NULL}};
static const dtier_field f_sexport[] = {
    F_ALL("session"), F_ALL("archive"), F_ALL("offset"), F_ALL("length"), {NULL, 0, 0, NULL}};
static const dtier_field f_simport[] = {
    F_ALL("session"), F_ALL("data"), F_ALL("offset"), F_ALL("final"), {NULL, 0, 0, NULL}};
static const dtier_field f_http_start[] = {
    F_ALL("listen"), F_ALL("tls_cert"), F_ALL("tls_key"), F_ALL("insecure"), {NULL, 0, 0, NULL}};

/* is_long: may run code, start kernels or wait for a session's running
 * cell; at most all workers but DAEMON_RESERVED (dloop.c) run these. */
static const dmethod dmethods[] = {
    {"initialize", m_initialize, 0, DT_ALL, NULL, f_initialize, 0},
    {"ping", m_ping, 0, DT_ALL, NULL, f_none, 0},
    {"session.create", m_session_create, 0, DT_ALL, NULL, f_session, 1},
    {"exec", m_exec, 1, DT_ALL, NULL, f_exec, 1},
    {"interrupt", m_interrupt_restart, 0, DT_ALL, NULL, f_session, 0},
    {"restart", m_interrupt_restart, 1, DT_ALL, NULL, f_session, 0},
    {"close", m_close, 0, DT_ALL, NULL, f_close, 0},
    {"sessions.list", m_sessions_list, 0, DT_ALL, NULL, f_none, 0},
    {"session.repair", m_session_repair, 0, DT_O,
     "repairing the daemon's state files is its operator's", f_session, 0},
    /* a session's own state, bounded (snapshot_max, SNAP_COUNT_MAX): as
     * exec and files.write, every tier */
    {"session.snapshot", m_snapshot, 1, DT_ALL, NULL, f_snapshot, 0},
    {"session.snapshots", m_snapshots, 0, DT_ALL, NULL, f_session, 0},
    {"session.restore", m_restore, 1, DT_ALL, NULL, f_snapshot, 0},
    {"session.fork", m_fork, 1, DT_ALL, NULL, f_fork, 0},
    /* moving a session between daemons: the operator and the remote
     * clients that route by session (HTTP); not the MCP tier, whose agent
     * has no use for archive bytes and whose sandboxed code must not get
     * to hand a daemon crafted archives */
    {"session.export", m_session_export, 1, DT_O | DT_H,
     "moving a session is its operator's or an HTTP client's, not an agent's", f_sexport, 0},
    {"session.import", m_session_import, 1, DT_O | DT_H,
     "moving a session is its operator's or an HTTP client's, not an agent's", f_simport, 1},
    {"files.list", m_files_list, 0, DT_ALL, NULL, f_files_list, 0},
    {"files.read", m_files_read, 0, DT_ALL, NULL, f_files_read, 0},
    {"files.write", m_files_write, 1, DT_ALL, NULL, f_files_write, 1},
    {"files.remove", m_files_remove, 1, DT_ALL, NULL, f_files_remove, 0},
    {"export", m_export, 0, DT_ALL, NULL, f_export, 0},
    {"packages.install", m_packages_install, 1, DT_ALL, NULL, f_packages, 0},
    {"connection_file", m_connection_file, 1, DT_O,
     "a connection file is a host path; over HTTP use the kernel WebSocket", f_connection_file, 0},
    {"shutdown", m_shutdown, 0, DT_O, "the daemon is its operator's to stop", f_none, 0},
    {"http.start", m_http_start, 0, DT_O, "the daemon's listening addresses are its operator's",
     f_http_start, 0},
    {"daemon.drain", m_daemon_drain, 1, DT_O, "draining a daemon is its operator's", f_drain, 0},
    {NULL, NULL, 0, 0, NULL, NULL, 0},
};

/* The tier check before any handler runs: the method and every field the
 * request sent must be permitted for the connection's tier. 0, or -1 with
 * the refusal sent. */
static int tier_check(dreq *r, const dmethod *d, const json_t *params)
{
    const dtier_grant *g = &r->dc->grant;
    km_err why = {0};
    if (!(d->tiers & DT_BIT(g->tier))) {
        km_err_set(&why, KM_EUSAGE, "%s is not available to %s (%s)", d->name,
                   dtier_clients(g->tier), d->why ? d->why : "not permitted for its tier");
        json_t *o = rpc_error_params(r->id, why.msg);
        if (o)
            dconn_write_json(r->dc, o, 0);
        json_decref(o);
        return -1;
    }
    if (json_is_object(params) && dtier_check_fields(g, d->fields, d->sopts, params, &why)) {
        dreq_invalid(r, why.msg);
        return -1;
    }
    return 0;
}

static json_t *hello(km_manager *m)
{
    json_t *methods = json_array();
    for (const dmethod *d = dmethods; d->name; d++)
        json_array_append_new(methods, json_string(d->name));
    const char *node = km_manager_config(m)->node_id;
    return json_pack("{s:i s:s s:s s:i s:s s:o s:o s:s? s:b}", "api_version", DAEMON_API_VERSION,
                     "server", "kernelmgr", "version", DAEMON_VERSION, "pid", (int)getpid(), "home",
                     km_manager_home(m), "pool", km_pool_status(m), "methods", methods, "node_id",
                     node[0] ? node : NULL, "draining", km_draining(m));
}

/* The methods a connection of grant g may call, for its hello. */
static json_t *hello_for(km_manager *m, const dtier_grant *g)
{
    json_t *h = hello(m);
    json_t *methods = json_array();
    for (const dmethod *d = dmethods; d->name; d++)
        if (d->tiers & DT_BIT(g->tier))
            json_array_append_new(methods, json_string(d->name));
    json_object_set_new(h, "methods", methods);
    json_object_set_new(h, "tier", json_string(dtier_name(g->tier)));
    return h;
}

static const dmethod *dmethod_find(const char *name)
{
    for (const dmethod *d = dmethods; d->name; d++)
        if (!strcmp(d->name, name))
            return d;
    return NULL;
}

const dmethod *dmethod_request(dconn *c, const char *line, size_t len, json_t **req)
{
    rpc_msg msg;
    km_err why = {0};
    int kind = rpc_parse(line, len, &msg, &why);
    const dmethod *d = NULL;
    if (kind < 0) {
        if (!msg.silent) {
            json_t *o = rpc_error(msg.id, kind, why.msg, NULL);
            if (o)
                dconn_write_json(c, o, 0);
            json_decref(o);
        }
    } else if (kind == RPC_REQUEST && !(d = dmethod_find(msg.method))) {
        char m2[200];
        snprintf(m2, sizeof m2, "Method not found: %.100s", msg.method);
        json_t *o = rpc_error(msg.id, RPC_METHOD_NOT_FOUND, m2, NULL);
        if (o)
            dconn_write_json(c, o, 0);
        json_decref(o);
    }
    /* the API defines no client notifications, and sends no requests whose
     * responses could come back: both are ignored */
    if (d)
        *req = json_incref(msg.root);
    rpc_msg_clear(&msg);
    return d;
}

void dmethod_run(dconn *c, const json_t *req, const dmethod *d)
{
    dreq r;
    dreq_init(&r, c, json_object_get(req, "id"), d->name);
    const json_t *params = json_object_get(req, "params");
    if (tier_check(&r, d, params) == 0)
        d->fn(&r, params);
}

void dmethod_run_line(dconn *c, const char *line, size_t len)
{
    json_t *req = NULL;
    const dmethod *d = dmethod_request(c, line, len, &req);
    if (d)
        dmethod_run(c, req, d);
    json_decref(req);
}
