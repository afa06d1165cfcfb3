"""The egress allow-list (`network: {"allow": [...]}`, `--network
allow:HOST,...`): the real daemon, real kernels in the strict sandbox, the
proxy outside it. A local HTTP and a local HTTPS server (a self-signed
certificate made here with openssl) on the host's 127.0.0.1 stand in for
allowed hosts. The proxy reaches them only because the list names them as
address literals ("127.0.0.1:PORT"): a *name* that resolves to a loopback
address is refused (the DNS-rebinding defence, test_attack_egress.py), and
the sandbox's own 127.0.0.1 is another machine's loopback, so nothing but
the proxy can get there.

No fixed sleeps: waits are polls with deadlines."""
import http.server
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
                       reason="build/kernel-python and build/kernel-bash not built"),
    pytest.mark.xdist_group("egress"),
]

POLICY = "kernelmgr: network policy allow-list:"


class Servers:
    """An HTTP and an HTTPS server on the host's 127.0.0.1, counting the
    requests they answered."""

    def __init__(self, tmp):
        self.hits = {"http": 0, "https": 0}
        self.cert, key = tmp / "cert.pem", tmp / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                        "-keyout", str(key), "-out", str(self.cert)],
                       check=True, capture_output=True)
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                kind = "https" if isinstance(self.connection, ssl.SSLSocket) else "http"
                outer.hits[kind] += 1
                body = f"hello over {kind}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.https = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, key)
        self.https.socket = ctx.wrap_socket(self.https.socket, server_side=True,
                                            do_handshake_on_connect=False)
        self.hp, self.sp = self.http.server_address[1], self.https.server_address[1]
        for s in (self.http, self.https):
            threading.Thread(target=s.serve_forever, daemon=True).start()
        self.pem = self.cert.read_text()

    def close(self):
        for s in (self.http, self.https):
            s.shutdown()
            s.server_close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    s = Servers(tmp_path_factory.mktemp("egress"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def mgr(servers):
    """A daemon whose configuration allows the two servers (and nothing else)."""
    m = mgrutil.Mgr({"sandbox": "strict", "network": {
        "allow": [f"127.0.0.1:{servers.hp}", f"127.0.0.1:{servers.sp}"]}})
    yield m
    m.close()


def py(mgr, code, session="eg"):
    rc, res, p = mgr.exec(session, code, "--lang", "python", timeout=120)
    assert res, p.stderr
    return res[-1]


def sh(mgr, code, session="eg"):
    rc, res, p = mgr.exec(session, code, "--lang", "bash", timeout=120)
    assert res, p.stderr
    return res[-1]


def fetch_code(url, pem):
    """Python that fetches url through the environment's proxies (urllib
    reads HTTP_PROXY / HTTPS_PROXY) and prints {"status", "body"} as JSON."""
    return f"""
import json, ssl, urllib.request, urllib.error
ctx = ssl.create_default_context(cadata={pem!r})
try:
    r = urllib.request.urlopen({url!r}, context=ctx, timeout=30)
    out = {{"status": r.status, "body": r.read().decode()}}
except urllib.error.HTTPError as e:
    out = {{"status": e.code, "body": e.read().decode()}}
except Exception as e:
    out = {{"status": 0, "body": repr(e)}}
print("RESULT " + json.dumps(out))
"""


def result(r):
    line = [x for x in r["stdout"].splitlines() if x.startswith("RESULT ")]
    assert line, r
    return json.loads(line[-1][7:])


def test_the_sandbox_gets_the_proxy_variables_and_only_lo(mgr):
    r = py(mgr, "import os\nfor v in ('HTTP_PROXY','HTTPS_PROXY','http_proxy','https_proxy',"
                "'NO_PROXY','no_proxy'): print(v, os.environ.get(v))\n"
                "print('IF', sorted(n for _, n in __import__('socket').if_nameindex()))")
    out = r["stdout"]
    for v in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert f"{v} http://127.0.0.1:3128" in out, out
    assert "NO_PROXY localhost,::1" in out, out  # 127.0.0.1 is listed: through the proxy
    assert "IF ['lo']" in out, out


def test_a_listed_host_gets_through_from_python(mgr, servers):
    before = dict(servers.hits)
    got = result(py(mgr, fetch_code(f"http://127.0.0.1:{servers.hp}/", servers.pem)))
    assert got == {"status": 200, "body": "hello over http"}, got
    got = result(py(mgr, fetch_code(f"https://127.0.0.1:{servers.sp}/", servers.pem)))
    assert got == {"status": 200, "body": "hello over https"}, got
    assert servers.hits["http"] > before["http"] and servers.hits["https"] > before["https"]


def test_a_listed_host_gets_through_from_bash_curl(mgr, servers):
    r = sh(mgr, f"cat > /tmp/ca.pem <<'EOF'\n{servers.pem}EOF\n"
                f"curl -sS --cacert /tmp/ca.pem https://127.0.0.1:{servers.sp}/; echo\n"
                f"curl -sS http://127.0.0.1:{servers.hp}/; echo")
    assert r["stdout"].split() == ["hello", "over", "https", "hello", "over", "http"], r


def test_another_host_is_refused_with_a_named_403(mgr, servers):
    r = py(mgr, fetch_code("http://example.com/", servers.pem))
    got = result(r)
    assert got["status"] == 403, got
    assert got["body"].startswith(f"{POLICY} host example.com:80 is not allowed (allowed: "
                                  f"127.0.0.1:{servers.hp}, 127.0.0.1:{servers.sp})"), got
    # https: the CONNECT gets the 403 (urllib says "Tunnel connection failed: 403")
    got = result(py(mgr, fetch_code("https://pypi.org/simple/", servers.pem)))
    assert got["status"] == 0 and "403" in got["body"], got
    # a cell that fails because of it gets the policy's note
    r = py(mgr, "import urllib.request\nurllib.request.urlopen('https://pypi.org/', timeout=30)")
    assert r["status"] == "error", r
    note = " ".join(r.get("limits_hit") or [])
    assert "network policy allow-list" in note and "pypi.org:443 is not allowed" in note, r
    # curl: its own words, and the proxy's reason in the note
    r = sh(mgr, "curl -sS https://example.com/")
    assert r["exit_code"] != 0 and "403" in r["stderr"], r
    assert "example.com:443 is not allowed" in " ".join(r.get("limits_hit") or []), r


def test_ip_literals_and_unlisted_ports_are_refused(mgr, servers):
    other = sbxutil.Listener()
    try:
        for url in ("http://93.184.215.14/", "http://[2001:db8::1]/",
                    f"http://127.0.0.1:{other.port}/"):
            got = result(py(mgr, fetch_code(url, servers.pem)))
            assert got["status"] == 403 and got["body"].startswith(POLICY), (url, got)
            assert "is not allowed" in got["body"], got
        assert other.accepted == [], "the unlisted port was reached"
    finally:
        other.close()


def test_a_tunnel_whose_sni_names_another_host_is_refused(mgr, servers):
    before = servers.hits["https"]
    code = f"""
import socket, ssl
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b"CONNECT 127.0.0.1:{servers.sp} HTTP/1.1\\r\\nHost: 127.0.0.1:{servers.sp}\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += s.recv(1)
print("HEAD", head.split(b"\\r\\n")[0].decode())
ctx = ssl.create_default_context(cadata={servers.pem!r})
ctx.check_hostname = False
try:
    t = ctx.wrap_socket(s, server_hostname="evil.example")
    t.sendall(b"GET / HTTP/1.1\\r\\nHost: evil.example\\r\\n\\r\\n")
    print("GOT", t.recv(100))
except ssl.SSLError as e:
    print("TLS-REFUSED", e.reason)
"""
    r = py(mgr, code)
    assert "HEAD HTTP/1.1 200" in r["stdout"], r
    assert "TLS-REFUSED" in r["stdout"] and "GOT" not in r["stdout"], r
    assert "ACCESS_DENIED" in r["stdout"].upper(), r
    assert servers.hits["https"] == before, "the upstream saw the mismatched handshake"
    # the same session still reaches the listed host
    got = result(py(mgr, fetch_code(f"https://127.0.0.1:{servers.sp}/", servers.pem)))
    assert got["status"] == 200, got


def test_there_is_no_dns_inside_the_sandbox(mgr):
    r = py(mgr, "import socket\ntry:\n    socket.getaddrinfo('pypi.org', 443)\n"
                "    print('RESOLVED')\nexcept socket.gaierror as e:\n    print('NO-DNS', e)")
    assert "NO-DNS" in r["stdout"] and "RESOLVED" not in r["stdout"], r
    r = sh(mgr, "getent hosts pypi.org || echo NO-DNS; test -e /etc/resolv.conf || echo NO-CONF")
    assert "NO-DNS" in r["stdout"] and "NO-CONF" in r["stdout"], r


def test_the_cli_option_makes_an_allow_list_session(make_mgr, servers):
    m = make_mgr({"sandbox": "strict"})  # the configuration's network: off
    code = fetch_code(f"http://127.0.0.1:{servers.hp}/", servers.pem)
    rc, res, p = m.exec("cli", code, "--lang", "python",
                        "--network", f"allow:127.0.0.1:{servers.hp}")
    assert res and result(res[-1]) == {"status": 200, "body": "hello over http"}, p.stderr
    p = m.run("sessions", "--json")
    s = [x for x in json.loads(p.stdout) if x["name"] == "cli"][0]
    assert s["limits"]["network"] == {"allow": [f"127.0.0.1:{servers.hp}"]}, s
    # the session keeps its list; the other server's port is not on it
    rc, res, p = m.exec("cli", fetch_code(f"http://127.0.0.1:{servers.sp}/", servers.pem),
                        "--lang", "python")
    assert result(res[-1])["status"] == 403, res


@pytest.mark.parametrize("value,words", [
    ("allow:", "no entry"),
    ("allow:pypi.org,", "empty entry"),
    ("allow:pypi.org:0", "port must be a number from 1 to 65535"),
    ("allow:pypi.org:99999", "port must be a number from 1 to 65535"),
    ("allow:pypi.org:http", "port must be a number from 1 to 65535"),
    ("allow:foo.*.example.com", "wildcard must be the whole first label"),
    ("allow:*.com", "at least two labels"),
    ("allow:*", "wildcard must be the whole first label"),
    ("allow:a..b", "empty label"),
    ("allow:2001:db8::1", "must be in brackets"),
    ("allow:" + ",".join(f"h{i}.example.com" for i in range(33)), "more than 32 entries"),
    ("allow:" + "a" * 300 + ".com", "longer than 270 bytes"),
    ("maybe", "must be on, off or allow:HOST[,HOST...]"),
])
def test_cli_refuses_bad_allow_entries_by_name(make_mgr, value, words):
    m = make_mgr({"sandbox": "strict"})
    p = m.run("exec", "--session", "bad", "--network", value, "-c", "print(1)")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert words in p.stderr and "--network" in p.stderr, p.stderr
    assert m.daemon_pid() is None  # refused before anything started


def test_an_allow_list_needs_the_strict_sandbox(make_mgr):
    m = make_mgr({"sandbox": "none"})
    p = m.run("exec", "--session", "loose", "--network", "allow:pypi.org", "-c", "print(1)")
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "needs the strict sandbox" in p.stderr, p.stderr
    # nothing was made; the daemon still serves other sessions
    rc, res, p = m.exec("fine", "print(6 * 7)", "--lang", "python")
    assert rc == 0 and res[-1]["stdout"] == "42\n", p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the daemon as nobody")
def test_as_nobody_a_listed_host_gets_through_and_another_is_refused(servers, tmp_path):
    """The same policy with the daemon, the kernels and the proxy running as
    an unprivileged user."""
    home = Path(tempfile.mkdtemp(prefix="kmn", dir="/tmp"))
    try:
        os.chmod(home, 0o700)
        (home / "config.json").write_text(json.dumps({"sandbox": "strict",
                                                      "python": "/usr/bin/python3"}))
        for p in (home, home / "config.json"):
            os.chown(p, sbxutil.NOBODY, sbxutil.NOBODY)
        km = sbxutil.kernelmgr_for("nobody")
        env = dict(os.environ, KERNELMGR_HOME=str(home))
        code = (fetch_code(f"http://127.0.0.1:{servers.hp}/", servers.pem)
                + fetch_code("http://example.com/", servers.pem))
        p = subprocess.run([*sbxutil.SETPRIV, km, "run", "--json", "--lang", "python",
                            "--network", f"allow:127.0.0.1:{servers.hp}", "-c", code],
                           capture_output=True, text=True, env=env, timeout=120)
        res = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
        assert res, p.stderr
        got = [json.loads(x[7:]) for x in res[-1]["stdout"].splitlines()
               if x.startswith("RESULT ")]
        assert got[0] == {"status": 200, "body": "hello over http"}, got
        assert got[1]["status"] == 403 and got[1]["body"].startswith(POLICY), got
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_less_trusted_tier_may_only_narrow_the_operators_list(mgr, servers):
    """Over the daemon's API as an MCP-tier client: a list within the
    configuration's is taken (and enforced), a wider one or "on" is refused
    by name."""
    from test_api import Conn
    py(mgr, "1")  # the daemon is up
    c = Conn(mgr)
    try:
        c.ok("initialize", {"api_version": 1, "client": "egress-test", "tier": "mcp"})
        narrow = {"allow": [f"127.0.0.1:{servers.hp}"]}
        c.ok("session.create", {"session": "narrow", "network": narrow})
        for net, words in (({"allow": ["pypi.org"]}, "not within the operator's allow list"),
                           ({"allow": [f"127.0.0.1:{servers.hp + 1}"]}, "not within"),
                           ("on", '"on" is not available to MCP clients')):
            e = c.error("session.create", {"session": "wide", "network": net})
            assert 'field "network"' in e["message"] and words in e["message"], e
        r = c.ok("exec", {"session": "narrow", "code": fetch_code(
            f"http://127.0.0.1:{servers.hp}/", servers.pem) + fetch_code(
            f"https://127.0.0.1:{servers.sp}/", servers.pem), "lang": "python"})
        got = [json.loads(x[7:]) for x in r["results"][-1]["stdout"].splitlines()
               if x.startswith("RESULT ")]
        assert got[0]["status"] == 200, got
        assert got[1]["status"] == 0 and "403" in got[1]["body"], got
        names = {s["name"] for s in c.ok("sessions.list")["sessions"]}
        assert "narrow" in names and "wide" not in names, names
    finally:
        c.close()


def test_a_session_keeps_its_list_across_a_daemon_restart(make_mgr, servers):
    m = make_mgr({"sandbox": "strict"})
    allow = f"allow:127.0.0.1:{servers.hp}"
    rc, res, p = m.exec("kept", "print(1)", "--lang", "python", "--network", allow)
    assert rc == 0, p.stderr
    saved = json.loads((m.home / "sessions" / "kept" / "session.json").read_text())
    assert saved["options"]["network"] == {"allow": [f"127.0.0.1:{servers.hp}"]}, saved
    pid = m.daemon_pid()
    assert m.run("serve", "--stop", timeout=60).returncode == 0

    def gone():
        try:
            os.kill(pid, 0)
            return False
        except OSError:
            return True
    # `serve --stop` returns before the old daemon has exited, and an exec
    # that autostarts meanwhile fails ("a daemon already serves"): wait
    kutil.poll_until(gone, bool, 60, "the old daemon exited")
    code = (fetch_code(f"http://127.0.0.1:{servers.hp}/", servers.pem)
            + fetch_code(f"http://127.0.0.1:{servers.sp}/", servers.pem))
    rc, res, p = m.exec("kept", code, "--lang", "python")
    out = "".join(r["stdout"] for r in res)
    got = [json.loads(x[7:]) for x in out.splitlines() if x.startswith("RESULT ")]
    assert len(got) == 2, (res, p.stderr)
    assert got[0]["status"] == 200 and got[1]["status"] == 403, got
