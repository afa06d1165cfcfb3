"""Attacks on the egress proxy from inside a session with an allow-list:
escaping to the proxy's host (its loopback, link-local metadata, its own
addresses), absolute-URI and Host-header tricks, CONNECT smuggling,
oversized and malformed heads, and DNS rebinding (a listed *name* that
resolves to a loopback address). Each asserts that the attack failed —
the target heard nothing, the answer names the policy — and that the
session still reaches its listed host afterwards.

The code runs in the session's real kernel (strict sandbox) and speaks raw
HTTP to the proxy at 127.0.0.1:3128, as a subverted program would.

DNS rebinding: the proxy resolves names itself, so the test needs a name
whose answer is a loopback address on the proxy's host without touching
that host's resolver configuration: "localhost" (every /etc/hosts has it)
and the host's own name (gethostname(), which resolves to 127.0.1.1 or an
address of the host's interfaces) are exactly such answers. A rebinding
DNS server returns the same kind of address for a public-looking name; the
proxy decides on the resolved address, not on the name, so the two cases
take the same path (egproxy.c dial_policy)."""
import json
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402
from test_egress import Servers, fetch_code, result  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="build/kernel-python not built"),
    pytest.mark.xdist_group("egress-attack"),
]

POLICY = "kernelmgr: network policy allow-list:"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    servers = Servers(tmp_path_factory.mktemp("egress-attack"))
    # targets that must hear nothing: on the host's loopback and on every
    # address of the host
    lo = sbxutil.Listener("127.0.0.1")
    anyaddr = sbxutil.Listener("0.0.0.0")
    host = socket.gethostname()
    m = mgrutil.Mgr({"sandbox": "strict", "network": {"allow": [
        f"127.0.0.1:{servers.hp}", f"127.0.0.1:{servers.sp}",
        # names, not literals: they resolve to this host, so they are refused
        f"localhost:{lo.port}", f"{host}:{anyaddr.port}"]}})
    yield servers, lo, anyaddr, host, m
    m.close()
    lo.close()
    anyaddr.close()
    servers.close()


RAW = r'''
import json, socket
def raw(data, read_tls=False):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    s.sendall(data)
    got = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            got += b
            if not read_tls and b"\r\n\r\n" in got and got.startswith(b"HTTP/1.1 200 Conn"):
                break
    except (socket.timeout, ConnectionResetError):
        pass
    s.close()
    return got
out = {}
for name, data in CASES:
    # a tunnel whose answer is wanted is read to its end (the proxy closes
    # it): the 200 and what follows may come in separate reads
    out[name] = raw(data, read_tls=name.endswith("-in-tunnel")).decode("latin-1")
print("RESULT " + json.dumps(out))
'''


def attack(m, cases):
    code = "CASES = " + repr(cases) + "\n" + RAW
    rc, res, p = m.exec("atk", code, "--lang", "python", timeout=180)
    assert res, p.stderr
    return result(res[-1])


def still_works(m, servers):
    got = result(m.exec("atk", fetch_code(f"http://127.0.0.1:{servers.hp}/", servers.pem),
                        "--lang", "python")[1][-1])
    assert got == {"status": 200, "body": "hello over http"}, got


def assert_refused(out, name, code=403, words=POLICY):
    head = out[name].split("\r\n")[0]
    assert head.startswith(f"HTTP/1.1 {code}"), (name, out[name])
    assert words in out[name], (name, out[name])


def test_escaping_to_the_proxys_host(env):
    servers, lo, anyaddr, host, m = env
    targets = ["127.0.0.1:22", f"127.0.0.1:{lo.port}", f"localhost:{servers.hp}",
               f"[::1]:{servers.hp}", "[::ffff:127.0.0.1]:%d" % servers.hp,
               "169.254.169.254:80", "[fe80::1]:80", "0.0.0.0:%d" % servers.hp,
               "127.1:%d" % servers.hp, "2130706433:%d" % servers.hp]
    targets += [f"{a}:{anyaddr.port}" for a in sbxutil.host_addresses()]
    cases = []
    for t in targets:
        cases.append(("CONNECT " + t, f"CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n".encode()))
        cases.append(("GET " + t, f"GET http://{t}/ HTTP/1.1\r\nHost: {t}\r\n\r\n".encode()))
    out = attack(m, cases)
    for name, _ in cases:
        assert_refused(out, name, words="is not allowed")
    assert lo.accepted == [] and anyaddr.accepted == [], "a host service was reached"
    still_works(m, servers)


def test_dns_rebinding_a_listed_name_that_resolves_to_this_host(env):
    servers, lo, anyaddr, host, m = env
    cases = [("localhost", f"GET http://localhost:{lo.port}/ HTTP/1.1\r\n"
                           f"Host: localhost:{lo.port}\r\n\r\n".encode()),
             ("LocalHost.", f"GET http://LocalHost.:{lo.port}/ HTTP/1.1\r\n\r\n".encode()),
             ("hostname", f"GET http://{host}:{anyaddr.port}/ HTTP/1.1\r\n\r\n".encode())]
    out = attack(m, cases)
    for name, _ in cases:
        assert_refused(out, name, words="an address of this host or of a private network")
    # CONNECT: the name passes the list, its resolved address does not: 403
    # before any tunnel
    code = f"""
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b"CONNECT localhost:{lo.port} HTTP/1.1\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += s.recv(1)
print("HEAD", head.split(b"\\r\\n")[0].decode())
ctx = ssl.create_default_context()
try:
    ctx.wrap_socket(s, server_hostname="localhost")
    print("TLS-UP")
except (ssl.SSLError, OSError) as e:
    print("TLS-REFUSED", e)
"""
    r = m.exec("atk", code, "--lang", "python")[1][-1]
    assert "HEAD HTTP/1.1 403" in r["stdout"], r
    assert "TLS-REFUSED" in r["stdout"] and "TLS-UP" not in r["stdout"], r
    assert lo.accepted == [] and anyaddr.accepted == [], "a rebinding name reached this host"
    still_works(m, servers)


def test_absolute_uri_and_host_header_tricks(env):
    servers, lo, anyaddr, host, m = env
    hp = servers.hp
    ok = f"127.0.0.1:{hp}"
    cases = [
        ("userinfo", f"GET http://{ok}@127.0.0.1:{lo.port}/ HTTP/1.1\r\n\r\n"),
        ("userinfo2", f"GET http://x@{ok}/ HTTP/1.1\r\n\r\n"),
        ("fragment", f"GET http://{ok}#@127.0.0.1:{lo.port}/ HTTP/1.1\r\n\r\n"),
        ("query", f"GET http://{ok}?@127.0.0.1:{lo.port}/ HTTP/1.1\r\n\r\n"),
        ("backslash", f"GET http://{ok}\\@127.0.0.1:{lo.port}/ HTTP/1.1\r\n\r\n"),
        ("percent", f"GET http://127.0.0.1%3a{lo.port}/ HTTP/1.1\r\n\r\n"),
        ("origin-form", f"GET / HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
        ("https-scheme", f"GET https://{ok}/ HTTP/1.1\r\n\r\n"),
        ("other-scheme", "GET file:///etc/passwd HTTP/1.1\r\n\r\n"),
        ("host-mismatch", f"GET http://{ok}/ HTTP/1.1\r\nHost: 127.0.0.1:{lo.port}\r\n\r\n"),
        ("host-name-mismatch", f"GET http://{ok}/ HTTP/1.1\r\nHost: evil.example\r\n\r\n"),
        ("two-hosts", f"GET http://{ok}/ HTTP/1.1\r\nHost: {ok}\r\nHost: evil.example\r\n\r\n"),
    ]
    out = attack(m, [(n, d.encode()) for n, d in cases])
    for name, _ in cases:
        head = out[name].split("\r\n")[0]
        assert head.startswith("HTTP/1.1 403") or head.startswith("HTTP/1.1 400"), (name, out)
        assert "hello over" not in out[name], (name, out[name])
    for name in ("host-mismatch", "host-name-mismatch", "two-hosts", "origin-form"):
        assert_refused(out, name)
    assert lo.accepted == [], "the loopback service was reached"
    still_works(m, servers)


def test_connect_smuggling_and_malformed_heads(env):
    servers, lo, anyaddr, host, m = env
    ok = f"127.0.0.1:{servers.hp}"
    before = servers.hits["http"]
    cases = [
        # a plain-text request through a tunnel: not TLS, nothing dialled
        ("plain-in-tunnel", f"CONNECT {ok} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: {ok}\r\n\r\n"),
        # a second request after the first, for an unlisted port
        ("pipelined", f"GET http://{ok}/ HTTP/1.1\r\nHost: {ok}\r\nContent-Length: 0\r\n\r\n"
                      f"GET http://127.0.0.1:{lo.port}/ HTTP/1.1\r\n\r\n"),
        ("cl-te", f"POST http://{ok}/ HTTP/1.1\r\nContent-Length: 4\r\n"
                  f"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        ("cl-cl", f"POST http://{ok}/ HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 40\r\n\r\n"),
        ("bare-lf", f"GET http://{ok}/ HTTP/1.1\r\nX: a\nHost: 127.0.0.1:{lo.port}\r\n\r\n"),
        ("folded", f"GET http://{ok}/ HTTP/1.1\r\nX: a\r\n Host: evil\r\n\r\n"),
        ("nul", f"GET http://{ok}/ HTTP/1.1\r\nX: a\0b\r\n\r\n"),
        ("oversized", f"GET http://{ok}/ HTTP/1.1\r\nX: {'a' * 20000}\r\n\r\n"),
        ("connect-no-port", "CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n"),
        ("extra-token", f"GET http://{ok}/ HTTP/1.1 x\r\n\r\n"),
    ]
    out = attack(m, [(n, d.encode()) for n, d in cases])
    # the tunnel: 200, then an alert (access_denied) instead of the server's answer
    assert out["plain-in-tunnel"].startswith("HTTP/1.1 200"), out
    assert "hello over" not in out["plain-in-tunnel"], out
    assert out["plain-in-tunnel"].endswith("\x15\x03\x03\x00\x02\x02\x31"), out
    # pipelined: the first is answered by the listed server; the second never
    # leaves for another target (Connection: close, one request a connection)
    assert "hello over http" in out["pipelined"], out
    for name in ("cl-te", "cl-cl", "bare-lf", "folded", "nul"):
        assert_refused(out, name)
    assert_refused(out, "oversized", code=431, words="larger than 16384 bytes")
    for name in ("connect-no-port", "extra-token"):
        assert out[name].startswith("HTTP/1.1 400"), (name, out)
    assert lo.accepted == [], "a smuggled request reached another target"
    assert servers.hits["http"] == before + 1, "only the pipelined first request was served"
    still_works(m, servers)


def test_a_flood_of_refusals_is_logged_bounded_and_the_proxy_keeps_serving(env):
    servers, lo, anyaddr, host, m = env
    cases = [(f"r{i}", f"GET http://refused{i}.example/ HTTP/1.1\r\n\r\n".encode())
             for i in range(200)]
    out = attack(m, cases)
    assert all(v.startswith("HTTP/1.1 403") for v in out.values())
    still_works(m, servers)
    logs = "".join(p.read_text(errors="replace") for p in m.home.rglob("*.log"))
    lines = [x for x in logs.splitlines() if "kernelmgr egress: refused" in x]
    assert 0 < len(lines) < 200, len(lines)  # rate-limited: a burst, then counted
    assert "earlier decisions not logged" in logs or len(lines) <= 60
    assert json.dumps(out)  # every answer was complete text


# ---- DNS rebinding against a real (test) resolver --------------------------

class RebindingDNS:
    """A DNS server on the host's loopback (UDP) that answers A queries for
    NAME with PUBLIC first and 127.0.0.1 next, alternating, and NXDOMAIN for
    anything else; it counts the queries it answered."""

    NAME = "rebind.test"
    PUBLIC = "198.51.100.7"  # TEST-NET-2: public-looking, never routed

    def __init__(self):
        import threading
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.queries = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                q, peer = self.sock.recvfrom(512)
            except OSError:
                return
            try:
                self.sock.sendto(self._answer(q), peer)
            except (OSError, IndexError, ValueError):
                pass

    def _answer(self, q):
        i, labels = 12, []
        while q[i]:
            labels.append(q[i + 1:i + 1 + q[i]].decode("ascii").lower())
            i += 1 + q[i]
        question = q[12:i + 5]
        if ".".join(labels) != self.NAME:
            return q[:2] + b"\x81\x83\x00\x01\x00\x00\x00\x00\x00\x00" + question
        self.queries += 1
        addr = self.PUBLIC if self.queries % 2 else "127.0.0.1"
        return (q[:2] + b"\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00" + question +
                b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x00\x00\x04" + socket.inet_aton(addr))

    def close(self):
        self.sock.close()


def _syn_sent_to(ip, port):
    """A connection attempt from this host's network namespace to ip:port
    (/proc/net/tcp, state SYN_SENT) is under way."""
    want = "%08X:%04X" % (int.from_bytes(socket.inet_aton(ip), "little"), port)
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(r.split()[2] == want and r.split()[3] == "02" for r in rows)


@pytest.fixture(scope="module")
def rebind(tmp_path_factory):
    servers = Servers(tmp_path_factory.mktemp("egress-rebind"))
    dns, lo = RebindingDNS(), sbxutil.Listener("127.0.0.1")
    m = mgrutil.Mgr({"sandbox": "strict", "network": {"allow": [
        f"127.0.0.1:{servers.hp}", f"{RebindingDNS.NAME}:{lo.port}"]}})
    # the operator's test hook: the proxy resolves with this server only
    m.env["KERNELMGR_EGRESS_RESOLVER"] = f"127.0.0.1:{dns.port}"
    yield servers, dns, lo, m
    m.close()
    lo.close()
    dns.close()
    servers.close()


def test_dns_rebinding_the_proxy_connects_only_to_the_address_it_checked(rebind):
    import time
    servers, dns, lo, m = rebind
    name, port = RebindingDNS.NAME, lo.port
    # A tunnel: the name is checked at CONNECT (answer: the public address),
    # the upstream dialled after the ClientHello. A second lookup there would
    # get 127.0.0.1 (the rebinding answer) and reach lo.
    code = f"""
import socket, ssl
t = socket.create_connection(("127.0.0.1", 3128), timeout=30)
t.sendall(b"CONNECT {name}:{port} HTTP/1.1\\r\\nHost: {name}:{port}\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += t.recv(4096)
print("HEAD", head.split(b"\\r\\n")[0].decode())
ctx = ssl.create_default_context()
tls = ctx.wrap_socket(t, server_hostname="{name}", do_handshake_on_connect=False)
tls.setblocking(False)
try:
    tls.do_handshake()  # sends the ClientHello; the answer never comes
except ssl.SSLWantReadError:
    pass
except ssl.SSLError as e:  # the proxy could not dial and said so at once
    print("ALERT", e.reason)
"""
    r = m.exec("rb", code, "--lang", "python", timeout=120)[1][-1]
    assert r["status"] == "ok" and "HEAD HTTP/1.1 200" in r["stdout"], r
    # the proxy dials the address it checked: a SYN to the public address
    # (or, on a host without a route there, its failure is logged at once)
    log = m.home / "sessions" / "rb" / "sandbox.log"
    deadline = time.monotonic() + 30
    while not (_syn_sent_to(RebindingDNS.PUBLIC, port) or
               (log.exists() and f"failed CONNECT {name}:{port}" in log.read_text())):
        assert time.monotonic() < deadline, "the proxy never dialled the checked address"
        time.sleep(0.05)
    if "ALERT" in r["stdout"]:
        # an alert answers only a failed dial of the checked address (a
        # host without a route there), never a refusal by policy
        assert "ALERT TLSV1_ALERT_ACCESS_DENIED" in r["stdout"], r
        assert f"failed CONNECT {name}:{port}" in log.read_text(), log.read_text()
        assert "refused CONNECT" not in log.read_text(), log.read_text()
    assert dns.queries == 1, dns.queries  # resolved once, for the check and the connect
    # the next lookup rebinds to 127.0.0.1: refused by policy, naming it
    out = attack(m, [("GET", f"GET http://{name}:{port}/ HTTP/1.1\r\n"
                             f"Host: {name}:{port}\r\n\r\n".encode())])
    assert_refused(out, "GET", words=f"host {name} resolves to 127.0.0.1")
    assert dns.queries == 2, dns.queries
    assert lo.accepted == [], "the rebinding answer was dialled"
    got = result(m.exec("rb", fetch_code(f"http://127.0.0.1:{servers.hp}/", servers.pem),
                        "--lang", "python")[1][-1])
    assert got == {"status": 200, "body": "hello over http"}, got
