/*
 * jp_connection.c — Jupyter connection files: parse, read, write, create
 * (with free tcp ports and a fresh key), and ZeroMQ endpoints.
 */
#include "jp_internal.h"
#include "common/cm_utf8.h"
#include "common/cm_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define JP_CONNFILE_MAX (1u << 20)

static const char *const jp_channel_names[JP_CHANNEL__COUNT] = {"shell", "iopub", "stdin",
                                                                "control", "hb"};
/* The connection-file key of each channel's port. */
static const char *const jp_port_keys[JP_CHANNEL__COUNT] = {
    "shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"};

const char *jp_channel_name(jp_channel ch)
{
    if ((int)ch < 0 || ch >= JP_CHANNEL__COUNT)
        return "unknown";
    return jp_channel_names[ch];
}

/* Copies the string field `key` of obj into dst[size]. required: absent is
 * an error; otherwise absent leaves dst as is. */
static jp_status get_string(json_t *obj, const char *key, char *dst, size_t size, int required,
                            jp_error *err)
{
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return jp_error_set(err, JP_ERR_CONNFILE, "connection file: \"%s\" is missing", key);
        return JP_OK;
    }
    if (!json_is_string(v))
        return jp_error_set(err, JP_ERR_CONNFILE, "connection file: \"%s\" is not a string", key);
    size_t len = json_string_length(v);
    if (len >= size)
        return jp_error_set(err, JP_ERR_CONNFILE,
                            "connection file: \"%s\" is too long (%zu bytes, limit %zu)", key, len,
                            size - 1);
    memcpy(dst, json_string_value(v), len + 1);
    return JP_OK;
}

jp_status jp_connection_parse(const char *text, size_t len, jp_connection *out, jp_error *err)
{
    jp_error_clear(err);
    if (!out || (len && !text))
        return jp_error_set(err, JP_ERR_ARG, "text or out is NULL");
    memset(out, 0, sizeof *out);
    if (len > JP_CONNFILE_MAX)
        return jp_error_set(err, JP_ERR_TOO_LARGE, "connection file is %zu bytes (limit %u)", len,
                            JP_CONNFILE_MAX);
    if (!cm_utf8_valid(text, len))
        return jp_error_set(err, JP_ERR_UTF8, "connection file is not valid UTF-8");
    json_error_t je; /* zeroed: see parse_object() in jp_session.c */
    memset(&je, 0, sizeof je);
    json_t *root = json_loadb(text ? text : "", len, JSON_DECODE_ANY, &je);
    if (!root && (json_error_code(&je) == json_error_out_of_memory || je.text[0] == '\0'))
        return jp_error_set(err, JP_ERR_NOMEM, "connection file: out of memory parsing JSON");
    if (!root)
        return jp_error_set(err, JP_ERR_JSON, "connection file: %s (line %d, column %d)", je.text,
                            je.line, je.column);
    jp_status st = JP_OK;
    if (!json_is_object(root)) {
        st = jp_error_set(err, JP_ERR_CONNFILE, "connection file is not a JSON object");
        goto out;
    }
    /* Scheme first: a file meant for another scheme must say so clearly,
     * not fail on some unrelated field. */
    if ((st = get_string(root, "signature_scheme", out->signature_scheme,
                         sizeof out->signature_scheme, 1, err)) != JP_OK) {
        if (json_object_get(root, "signature_scheme"))
            st = jp_error_set(err, JP_ERR_SCHEME,
                              "connection file: unsupported signature_scheme (only "
                              "hmac-sha256 is supported)");
        goto out;
    }
    if (strcmp(out->signature_scheme, "hmac-sha256") != 0) {
        st = jp_error_set(err, JP_ERR_SCHEME,
                          "connection file: unsupported signature_scheme \"%.64s\" (only "
                          "hmac-sha256 is supported)",
                          out->signature_scheme);
        goto out;
    }
    if ((st = get_string(root, "transport", out->transport, sizeof out->transport, 1, err)) !=
        JP_OK)
        goto out;
    int tcp = strcmp(out->transport, "tcp") == 0;
    if (!tcp && strcmp(out->transport, "ipc") != 0) {
        st = jp_error_set(err, JP_ERR_CONNFILE,
                          "connection file: transport \"%s\" is not \"tcp\" or \"ipc\"",
                          out->transport);
        goto out;
    }
    if ((st = get_string(root, "ip", out->ip, sizeof out->ip, 1, err)) != JP_OK)
        goto out;
    if (out->ip[0] == '\0' || strlen(out->ip) != json_string_length(json_object_get(root, "ip"))) {
        st = jp_error_set(err, JP_ERR_CONNFILE, "connection file: \"ip\" is empty or has NUL");
        goto out;
    }
    for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++) {
        json_t *v = json_object_get(root, jp_port_keys[ch]);
        if (!v) {
            st = jp_error_set(err, JP_ERR_CONNFILE, "connection file: \"%s\" is missing",
                              jp_port_keys[ch]);
            goto out;
        }
        if (!json_is_integer(v)) {
            st = jp_error_set(err, JP_ERR_CONNFILE, "connection file: \"%s\" is not an integer",
                              jp_port_keys[ch]);
            goto out;
        }
        json_int_t p = json_integer_value(v);
        json_int_t lo = tcp ? 1 : 0, hi = tcp ? 65535 : INT_MAX;
        if (p < lo || p > hi) {
            st = jp_error_set(err, JP_ERR_CONNFILE,
                              "connection file: \"%s\" is %lld, outside %lld..%lld",
                              jp_port_keys[ch], (long long)p, (long long)lo, (long long)hi);
            goto out;
        }
        out->ports[ch] = (int)p;
    }
    if ((st = get_string(root, "key", out->key, sizeof out->key, 1, err)) != JP_OK)
        goto out;
    if (strlen(out->key) != json_string_length(json_object_get(root, "key"))) {
        st = jp_error_set(err, JP_ERR_CONNFILE, "connection file: \"key\" contains NUL");
        goto out;
    }
    st = get_string(root, "kernel_name", out->kernel_name, sizeof out->kernel_name, 0, err);
out:
    json_decref(root);
    if (st != JP_OK)
        memset(out, 0, sizeof *out);
    return st;
}

jp_status jp_connection_read(const char *path, jp_connection *out, jp_error *err)
{
    jp_error_clear(err);
    if (!path || !out)
        return jp_error_set(err, JP_ERR_ARG, "path or out is NULL");
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return jp_error_set(err, JP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        close(fd);
        return jp_error_set(err, JP_ERR_IO, "%s: %s", path, strerror(e));
    }
    /* A FIFO or device would block or never end. */
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return jp_error_set(err, JP_ERR_IO, "%s: not a regular file", path);
    }
    char *buf = NULL;
    size_t len = 0;
    int rc = cm_read_all(fd, JP_CONNFILE_MAX, &buf, &len), e = errno;
    close(fd);
    jp_status st;
    if (rc < 0 && e == EFBIG)
        st = jp_error_set(err, JP_ERR_TOO_LARGE, "%s: larger than %u bytes", path, JP_CONNFILE_MAX);
    else if (rc < 0 && e == ENOMEM)
        return jp_error_set(err, JP_ERR_NOMEM, "out of memory reading %s", path);
    else if (rc < 0)
        return jp_error_set(err, JP_ERR_IO, "%s: %s", path, strerror(e));
    else
        st = jp_connection_parse(buf, len, out, err);
    if (st != JP_OK && st != JP_ERR_TOO_LARGE && err) {
        /* Say which file, keeping the parser's reason. */
        char reason[sizeof err->reason];
        snprintf(reason, sizeof reason, "%s", err->reason);
        jp_error_set(err, st, "%.80s: %s", path, reason);
    }
    free(buf);
    return st;
}

jp_status jp_connection_write(const char *path, const jp_connection *c, jp_error *err)
{
    jp_error_clear(err);
    if (!path || !c || !*path)
        return jp_error_set(err, JP_ERR_ARG, "path or connection is NULL");
    const char *texts[] = {c->ip, c->key, c->transport, c->signature_scheme, c->kernel_name};
    const size_t sizes[] = {sizeof c->ip, sizeof c->key, sizeof c->transport,
                            sizeof c->signature_scheme, sizeof c->kernel_name};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
        if (!cm_utf8_valid(texts[i], strnlen(texts[i], sizes[i])))
            return jp_error_set(err, JP_ERR_ARG, "connection field \"%.40s\" is not valid UTF-8",
                                texts[i]);
    /* Same keys as jupyter_client's write_connection_file. */
    json_t *root = json_object();
    if (!root)
        return jp_error_set(err, JP_ERR_NOMEM, "out of memory");
    int bad = 0;
    for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++)
        bad |= json_object_set_new(root, jp_port_keys[ch], json_integer(c->ports[ch]));
    bad |= json_object_set_new(root, "ip", json_stringn(c->ip, strnlen(c->ip, sizeof c->ip)));
    bad |= json_object_set_new(root, "key", json_stringn(c->key, strnlen(c->key, sizeof c->key)));
    bad |= json_object_set_new(
        root, "transport", json_stringn(c->transport, strnlen(c->transport, sizeof c->transport)));
    bad |=
        json_object_set_new(root, "signature_scheme",
                            json_stringn(c->signature_scheme,
                                         strnlen(c->signature_scheme, sizeof c->signature_scheme)));
    bad |= json_object_set_new(
        root, "kernel_name",
        json_stringn(c->kernel_name, strnlen(c->kernel_name, sizeof c->kernel_name)));
    char *text = bad ? NULL : json_dumps(root, JSON_INDENT(2));
    json_decref(root);
    if (!text)
        return jp_error_set(err, JP_ERR_NOMEM, "out of memory writing a connection file");

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) {
        free(text);
        return jp_error_set(err, JP_ERR_NOMEM, "out of memory");
    }
    snprintf(tmp, plen + 16, "%s.tmp-XXXXXX", path);
    /* mkstemp creates the file exclusively with mode 0600, so the key is
     * never readable by others, not even for a moment. */
    int fd = mkostemp(tmp, O_CLOEXEC);
    jp_status st = JP_OK;
    if (fd < 0) {
        st = jp_error_set(err, JP_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    if (fchmod(fd, 0600) < 0) {
        st = jp_error_set(err, JP_ERR_IO, "chmod %s: %s", tmp, strerror(errno));
        goto fail;
    }
    size_t len = strlen(text), done = 0;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            st = jp_error_set(err, JP_ERR_IO, "write %s: %s", tmp, strerror(errno));
            goto fail;
        }
        done += (size_t)w;
    }
    if (write(fd, "\n", 1) != 1) {
        st = jp_error_set(err, JP_ERR_IO, "write %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) < 0) {
        fd = -1;
        st = jp_error_set(err, JP_ERR_IO, "close %s: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        st = jp_error_set(err, JP_ERR_IO, "rename to %s: %s", path, strerror(errno));
        goto fail;
    }
    goto out;
fail:
    if (fd >= 0)
        close(fd);
    unlink(tmp);
out:
    free(tmp);
    free(text);
    return st;
}

/* Binds n sockets to port 0 on ip and records the ports the kernel chose.
 * All stay bound until every port is known, so the five are distinct. */
static jp_status pick_ports(const char *ip, int *ports, int n, jp_error *err)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (strcmp(ip, "*") == 0 || inet_pton(AF_INET, ip, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        if (strcmp(ip, "*") == 0)
            in4->sin_addr.s_addr = htonl(INADDR_ANY);
        sl = sizeof *in4;
    } else if (inet_pton(AF_INET6, ip, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        sl = sizeof *in6;
    } else {
        return jp_error_set(err, JP_ERR_ARG, "ip \"%.200s\" is not a numeric IPv4/IPv6 address",
                            ip);
    }
    int fds[JP_CHANNEL__COUNT];
    int made = 0;
    jp_status st = JP_OK;
    for (; made < n; made++) {
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            st = jp_error_set(err, JP_ERR_IO, "socket: %s", strerror(errno));
            break;
        }
        fds[made] = fd;
        struct sockaddr_storage got;
        socklen_t gl = sizeof got;
        if (bind(fd, (struct sockaddr *)&ss, sl) < 0 ||
            getsockname(fd, (struct sockaddr *)&got, &gl) < 0) {
            st = jp_error_set(err, JP_ERR_IO, "bind %s:0: %s", ip, strerror(errno));
            made++;
            break;
        }
        ports[made] = ntohs(got.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&got)->sin6_port
                                                      : ((struct sockaddr_in *)&got)->sin_port);
    }
    for (int i = 0; i < made; i++)
        close(fds[i]);
    return st;
}

jp_status jp_connection_init(jp_connection *c, const char *transport, const char *ip,
                             const char *kernel_name, jp_error *err)
{
    jp_error_clear(err);
    if (!c)
        return jp_error_set(err, JP_ERR_ARG, "connection is NULL");
    memset(c, 0, sizeof *c);
    if (!transport)
        transport = "tcp";
    int tcp = strcmp(transport, "tcp") == 0;
    if (!tcp && strcmp(transport, "ipc") != 0)
        return jp_error_set(err, JP_ERR_ARG, "transport \"%.32s\" is not \"tcp\" or \"ipc\"",
                            transport);
    if (!tcp && (!ip || !*ip))
        return jp_error_set(err, JP_ERR_ARG, "ipc transport needs a path stem as ip");
    if (tcp && !ip)
        ip = "127.0.0.1";
    if (strlen(ip) >= sizeof c->ip)
        return jp_error_set(err, JP_ERR_ARG, "ip is longer than %zu bytes", sizeof c->ip - 1);
    if (kernel_name && strlen(kernel_name) >= sizeof c->kernel_name)
        return jp_error_set(err, JP_ERR_ARG, "kernel_name is longer than %zu bytes",
                            sizeof c->kernel_name - 1);
    if (jp_sodium_ready() < 0)
        return jp_error_set(err, JP_ERR_IO, "libsodium failed to initialise");
    snprintf(c->transport, sizeof c->transport, "%s", transport);
    snprintf(c->ip, sizeof c->ip, "%s", ip);
    snprintf(c->signature_scheme, sizeof c->signature_scheme, "hmac-sha256");
    if (kernel_name)
        snprintf(c->kernel_name, sizeof c->kernel_name, "%s", kernel_name);
    unsigned char key[32];
    randombytes_buf(key, sizeof key);
    sodium_bin2hex(c->key, sizeof c->key, key, sizeof key);
    sodium_memzero(key, sizeof key);
    if (tcp) {
        jp_status st = pick_ports(ip, c->ports, JP_CHANNEL__COUNT, err);
        if (st != JP_OK) {
            memset(c, 0, sizeof *c);
            return st;
        }
    } else {
        for (int ch = 0; ch < JP_CHANNEL__COUNT; ch++)
            c->ports[ch] = ch + 1;
    }
    return JP_OK;
}

int jp_connection_is_loopback(const jp_connection *c)
{
    if (!c)
        return 0;
    if (!strcmp(c->transport, "ipc"))
        return 1;
    char ip[sizeof c->ip];
    size_t n = strnlen(c->ip, sizeof c->ip);
    if (n >= 2 && c->ip[0] == '[' && c->ip[n - 1] == ']') {
        memcpy(ip, c->ip + 1, n - 2);
        ip[n - 2] = '\0';
    } else {
        memcpy(ip, c->ip, n);
        ip[n] = '\0';
    }
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, ip, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, ip, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return 0;
}

int jp_connection_endpoint(const jp_connection *c, jp_channel ch, char *buf, size_t size)
{
    if (!c || !buf || size == 0 || (int)ch < 0 || ch >= JP_CHANNEL__COUNT)
        return -1;
    int n;
    if (strcmp(c->transport, "ipc") == 0)
        n = snprintf(buf, size, "ipc://%s-%d", c->ip, c->ports[ch]);
    else if (strchr(c->ip, ':') && c->ip[0] != '[')
        n = snprintf(buf, size, "%s://[%s]:%d", c->transport, c->ip, c->ports[ch]);
    else
        n = snprintf(buf, size, "%s://%s:%d", c->transport, c->ip, c->ports[ch]);
    if (n < 0 || (size_t)n >= size) {
        buf[0] = '\0';
        return -1;
    }
    return 0;
}
