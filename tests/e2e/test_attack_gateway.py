"""Attacks on the HTTP gateway from peers that have no token (and a few
that have one): the connection floods of an outside review that filled the
daemon's fd table, DNS rebinding, a session name cut to another session's,
host paths in REST answers.

Each attack asserts that it failed and that the service still works: a
token holder's exec over HTTP and the local CLI's exec. Small bounds come
from the test's config.json (docs/SECURITY.md "The gateway under
unauthenticated load"); the flood's peers are loopback addresses
(127.0.0.0/8 is all local on Linux), the token holder another one. Run as
the invoking user and, when that is root, also as nobody. No fixed sleeps:
closures are polled with deadlines."""
import http.client
import json
import os
import re
import resource
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402
from kutil import poll_until as poll  # noqa: E402

import websocket  # noqa: E402  (Debian python3-websocket, in make deps)

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="no kernel-python")

PER_PEER = 8
UNAUTH = 24
HEADER_TIMEOUT = 1
TOKEN_PEER = "127.0.0.2"



class GwKM:
    """A KERNELMGR_HOME owned by user whose daemon serves the gateway."""

    def __init__(self, user, config=None, nofile=None):
        if user == "nobody" and not sbxutil.IS_ROOT:
            pytest.skip("the nobody variant needs root to switch users (the invoker variant "
                        "already runs unprivileged)")
        self.user = user
        self.prefix = sbxutil.SETPRIV if user == "nobody" else []
        self.bin = sbxutil.kernelmgr_for(user)
        self.home = Path(tempfile.mkdtemp(prefix="kmga", dir="/tmp"))
        cfg = {"sandbox": mgrutil.SANDBOX, "python": "/usr/bin/python3",
               "http": "127.0.0.1:0", "http_header_timeout": HEADER_TIMEOUT,
               "http_max_unauth_per_peer": PER_PEER, "http_max_unauth": UNAUTH}
        cfg.update(config or {})
        (self.home / "config.json").write_text(json.dumps(cfg))
        if user == "nobody":
            for p in (self.home, self.home / "config.json"):
                os.chown(p, sbxutil.NOBODY, sbxutil.NOBODY)
        self.env = dict(os.environ, KERNELMGR_HOME=str(self.home))
        self.nofile = nofile  # RLIMIT_NOFILE (soft and hard) of the CLI, so of the daemon it starts
        rc, res, p = self.exec("agent", "x = 41")
        assert rc == 0, p.stderr
        info = poll(self._info, lambda v: v is not None, 30, "http.json written")
        self.port = info["port"]
        self.pid = info["pid"]
        self.token = (self.home / "http-token").read_text().strip()
        self.workspace = str(self.home / "sessions" / "agent" / "workspace")

    def _limit(self):
        if self.nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def _info(self):
        try:
            return json.loads((self.home / "http.json").read_text())
        except (OSError, ValueError):
            return None

    def exec(self, session, code):
        p = subprocess.run([*self.prefix, self.bin, "exec", "--session", session, "-c", code,
                            "--json"], capture_output=True, text=True, env=self.env,
                           timeout=120, preexec_fn=self._limit)
        res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return p.returncode, res, p

    def log(self):
        try:
            return (self.home / "daemon.log").read_text()
        except OSError:
            return ""

    def fds(self):
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def budget(self):
        m = poll(lambda: re.search(r"gateway: at most (\d+) connections", self.log()),
                 lambda v: v, 30, "the gateway's budget logged")
        return int(m.group(1))

    def request(self, method, path, body=None, token=True, host=None, source=TOKEN_PEER):
        """One request on its own connection from source: (status, text)."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120,
                                       source_address=(source, 0))
        h = {"Host": host or f"127.0.0.1:{self.port}"}
        if token:
            h["Authorization"] = f"token {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            return r.status, r.read().decode(errors="replace")
        finally:
            c.close()

    def close(self):
        try:
            subprocess.run([*self.prefix, self.bin, "serve", "--stop"], env=self.env,
                           capture_output=True, timeout=30)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(params=sbxutil.USERS)
def gk(request):
    k = GwKM(request.param)
    yield k
    k.close()


def service_works(gk, want="42"):
    """A token holder's exec over HTTP and the local CLI's exec both run."""
    st, text = gk.request("POST", "/api/kernelmgr",
                          {"jsonrpc": "2.0", "id": 1, "method": "exec",
                           "params": {"session": "agent", "code": "print(x + 1)"}})
    assert st == 200, text
    r = json.loads(text)["result"]["results"][0]
    assert r["status"] == "ok" and r["stdout"].strip() == want, r
    rc, res, p = gk.exec("agent", "print(x + 1)")
    assert rc == 0 and res[0]["stdout"].strip() == want, p.stderr


class Peer:
    """Plain sockets from one source address, each polled for closure."""

    def __init__(self, port, source, n, send=b""):
        self.socks, self.got = [], {}
        for _ in range(n):
            s = socket.socket()
            s.bind((source, 0))
            s.connect(("127.0.0.1", port))
            if send:
                s.sendall(send)
            s.setblocking(False)
            self.socks.append(s)
            self.got[s] = b""
        self.closed = set()

    def poll_closed(self):
        for s in self.socks:
            if s in self.closed:
                continue
            try:
                while True:
                    d = s.recv(65536)
                    if not d:
                        self.closed.add(s)
                        break
                    self.got[s] += d
            except BlockingIOError:
                pass
            except OSError:
                self.closed.add(s)
        return len(self.closed)

    def close(self):
        for s in self.socks:
            s.close()


def test_flood_from_one_peer_is_cut_to_its_bound(gk):
    base = gk.fds()
    budget = gk.budget()
    n = 300
    idle = Peer(gk.port, "127.0.0.1", n)
    half = Peer(gk.port, "127.0.0.1", 20, b"GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
    try:
        # at most PER_PEER of the 320 are held; the rest are closed at once
        poll(lambda: idle.poll_closed() + half.poll_closed(), lambda v: v >= n + 20 - PER_PEER,
             10, "connections over http_max_unauth_per_peer closed")
        refused = [idle.got[s] for s in idle.closed] + [half.got[s] for s in half.closed]
        assert any(b"503" in g and b"http_max_unauth_per_peer: %d" % PER_PEER in g
                   for g in refused), refused[:3]
        held = gk.fds() - base
        assert held <= PER_PEER + 4, held
        assert gk.fds() < budget
        # meanwhile another peer with the token, and the local CLI, are served
        service_works(gk)
        # the held ones (idle or half-sent) are closed by the header timeout
        poll(lambda: idle.poll_closed() + half.poll_closed(), lambda v: v == n + 20,
             10 + HEADER_TIMEOUT, "every flood connection closed")
        poll(gk.log, lambda t: f"over http_max_unauth_per_peer {PER_PEER}" in t, 30,
             "the refusals logged")
    finally:
        idle.close()
        half.close()
    service_works(gk)
    poll(gk.fds, lambda v: v <= base + 2, 10, "the daemon's fds back to where they were")


def test_flood_from_many_peers_is_cut_to_the_total_bound(gk):
    base = gk.fds()
    peers = [Peer(gk.port, f"127.0.1.{i}", 4) for i in range(1, 41)]  # 160, 4 per address
    try:
        poll(lambda: sum(p.poll_closed() for p in peers), lambda v: v >= 160 - UNAUTH, 10,
             "connections over http_max_unauth closed")
        got = [p.got[s] for p in peers for s in p.closed]
        assert any(b"http_max_unauth: %d" % UNAUTH in g for g in got), got[:3]
        assert gk.fds() - base <= UNAUTH + 4
        # the local CLI never competes with HTTP peers
        rc, res, p = gk.exec("agent", "print(x + 1)")
        assert rc == 0 and res[0]["stdout"].strip() == "42", p.stderr
        # the header timeout frees the places: a token holder is served again
        poll(lambda: sum(p.poll_closed() for p in peers), lambda v: v == 160,
             10 + HEADER_TIMEOUT, "every flood connection closed")
        service_works(gk)
    finally:
        for p in peers:
            p.close()


def test_slow_headers_and_raw_tricks_do_not_outlive_the_header_timeout(gk):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.connect(("127.0.0.1", gk.port))
    s.sendall(b"GET /api HTTP/1.1\r\n")

    def trickle():  # one header byte per poll: the timeout counts from the start
        try:
            s.send(b"X")
            return False
        except OSError:
            return True
    poll(trickle, lambda v: v, 10 + HEADER_TIMEOUT, "a trickling client cut")
    s.close()
    # CONNECT would make lws a raw, timeout-less connection
    c = Peer(gk.port, "127.0.0.1", 1, b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    poll(c.poll_closed, lambda v: v == 1, 10, "CONNECT closed")
    c.close()
    # an unauthenticated request is answered once and closed (no keep-alive
    # to hold its place), even with a body still to come
    u = Peer(gk.port, "127.0.0.1", 1,
             b"POST /api/kernels HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n{")
    poll(u.poll_closed, lambda v: v == 1, 10, "an unauthenticated POST closed")
    assert b"401" in u.got[u.socks[0]].split(b"\r\n", 1)[0]
    u.close()
    # h2c is not served, with the token either
    h = Peer(gk.port, TOKEN_PEER, 1,
             f"GET /api/kernelmgr/ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, "
             f"HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
             f"Authorization: token {gk.token}\r\n\r\n".encode())
    poll(lambda: (h.poll_closed(), h.got[h.socks[0]]), lambda v: b"\r\n\r\n" in v[1], 10,
         "h2c answered")
    assert b" 400 " in h.got[h.socks[0]].split(b"\r\n", 1)[0], h.got
    h.close()
    service_works(gk)


def ws_url(gk, path):
    return f"ws://127.0.0.1:{gk.port}{path}"


def test_dns_rebinding_host_refused(gk):
    st, kernels = gk.request("GET", "/api/kernels")
    assert st == 200
    kid = [k for k in json.loads(kernels) if k["kernelmgr"]["session"] == "agent"][0]["id"]
    evil = f"rebind.attacker.example:{gk.port}"
    # with the token, so it is the Host check that refuses
    for method, path in (("GET", "/api/kernels"), ("POST", "/api/kernels")):
        st, text = gk.request(method, path, {} if method == "POST" else None, host=evil)
        assert st == 403, text
        assert "DNS rebinding" in json.loads(text)["message"]
    for path in (f"/api/kernels/{kid}/channels", "/api/kernelmgr/ws"):
        with pytest.raises(websocket.WebSocketBadStatusException) as ei:
            websocket.create_connection(ws_url(gk, path), host=evil,
                                        origin=f"http://{evil}",
                                        header=[f"Authorization: token {gk.token}"], timeout=30)
        assert ei.value.status_code == 403
    # an Origin too long to copy no longer skips the Origin check
    with pytest.raises(websocket.WebSocketBadStatusException) as ei:
        websocket.create_connection(ws_url(gk, f"/api/kernels/{kid}/channels"),
                                    origin="http://" + "o" * 600,
                                    header=[f"Authorization: token {gk.token}"], timeout=30)
    assert ei.value.status_code == 403
    # the gateway's own names still work: its address, and localhost on loopback
    for host in (f"127.0.0.1:{gk.port}", f"localhost:{gk.port}"):
        st, text = gk.request("GET", "/api", host=host)
        assert st == 200, text
    ws = websocket.create_connection(ws_url(gk, f"/api/kernels/{kid}/channels"),
                                     host=f"localhost:{gk.port}",
                                     origin=f"http://localhost:{gk.port}",
                                     header=[f"Authorization: token {gk.token}"], timeout=30)
    ws.close()
    service_works(gk)


def test_a_long_session_name_is_refused_not_cut(gk):
    cut = "a" * 64
    rc, res, p = gk.exec(cut, "y = 'mine'")
    assert rc == 0, p.stderr
    st, ks = gk.request("GET", "/api/kernels")
    before = {k["kernelmgr"]["session"]: k["kernelmgr"]["pid"] for k in json.loads(ks)}
    for body in ({"name": "kernelmgr-python", "kernelmgr": {"session": "a" * 200}},
                 {"name": "kernelmgr-python--" + "a" * 200},
                 {"name": "kernelmgr-python", "kernelmgr": {"session": "../x"}}):
        st, text = gk.request("POST", "/api/kernels", body)
        assert st == 400, text
        assert "at most 64 bytes" in json.loads(text)["message"], text
    st, ks = gk.request("GET", "/api/kernels")
    after = {k["kernelmgr"]["session"]: k["kernelmgr"]["pid"] for k in json.loads(ks)}
    assert after == before  # nothing created, nothing restarted
    rc, res, p = gk.exec(cut, "print(y)")
    assert rc == 0 and res[0]["stdout"].strip() == "mine", p.stderr
    service_works(gk)


def test_rest_answers_name_no_host_path(gk):
    home = str(gk.home)
    paths = {home, os.path.realpath(home), gk.workspace}
    answers = []

    def ask(method, path, body=None, **kw):
        st, text = gk.request(method, path, body, **kw)
        answers.append((method, path, st, text))
        return st, text

    ask("GET", "/api")
    ask("GET", "/api/kernelspecs")
    ask("GET", "/api/kernelspecs/kernelmgr-python--agent")
    ask("GET", "/api/kernelspecs/nope")
    ask("GET", "/kernelspecs/kernelmgr-python/logo-64x64.png")
    ask("GET", "/api/kernelspecs-resources/kernelmgr-python/kernel.json")
    ask("GET", "/api/sessions")
    st, text = ask("POST", "/api/kernels", {"name": "kernelmgr-python"})
    assert st == 201, text
    kid = json.loads(text)["id"]
    ask("GET", "/api/kernels")
    ask("GET", f"/api/kernels/{kid}")
    ask("POST", f"/api/kernels/{kid}/interrupt")
    ask("POST", f"/api/kernels/{kid}/restart")
    ask("GET", f"/api/kernels/{uuid.uuid4()}")
    ask("POST", "/api/kernels", {"name": "kernelmgr-nope"})
    ask("POST", "/api/kernels", {"name": "kernelmgr-python--nosuchsession"})
    ask("POST", "/api/kernels", {"name": "kernelmgr-python", "kernelmgr": {"env": 3}})
    ask("DELETE", f"/api/kernels/{kid}")
    ask("GET", "/api", token=False)
    for method, path, st, text in answers:
        for p in paths:
            assert p not in text, (method, path, st, text)
    # a WebSocket's close reason too: a kernel that is gone
    ws = websocket.create_connection(ws_url(gk, f"/api/kernels/{kid}/channels"),
                                     header=[f"Authorization: token {gk.token}"], timeout=30)
    try:
        reason = b""
        try:
            while True:
                op, data = ws.recv_data(control_frame=True)
                if op == websocket.ABNF.OPCODE_CLOSE:
                    reason = data
                    break
        except (websocket.WebSocketConnectionClosedException, OSError):
            pass
        for p in paths:
            assert p.encode() not in reason, reason
    finally:
        ws.close()
    service_works(gk)


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_connections_beyond_the_fd_budget_are_refused(user):
    """With RLIMIT_NOFILE 1024 the gateway takes at most half: token holders
    too are refused past the budget, and the daemon keeps the rest."""
    gk = GwKM(user, {"http_max_connections": 4}, nofile=1024)
    try:
        budget = gk.budget()
        assert budget <= (1024 // 2 - 4 * 16) // 3, budget
        base = gk.fds()
        req = (f"GET /api HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: token {gk.token}\r\n\r\n").encode()
        # kept alive after their answer (5 s): authenticated, so only the
        # budget bounds them. Opened 6 at a time, each batch answered before
        # the next, so that they never hit the unauthenticated bounds
        peers = []
        try:
            for i in range(1, (budget + 40) // 6 + 2):
                p = Peer(gk.port, f"127.0.2.{i}", 6, req)
                peers.append(p)
                poll(lambda: [p.poll_closed(), p.got], lambda v: all(
                     s in p.closed or b"\r\n\r\n" in p.got[s] for s in p.socks), 10,
                     "a batch answered")
            got = [p.got[s] for p in peers for s in p.socks]
            refused = [g for g in got if b"connection budget" in g]
            assert len(refused) >= 30, got[-3:]
            assert b"the gateway's connection budget (from RLIMIT_NOFILE): %d" % budget \
                in refused[0], refused[0]
            assert sum(g.startswith(b"HTTP/1.1 200") for g in got) >= budget - 8
            assert gk.fds() <= base + budget + 8 < 1024
            # the daemon's own socket still serves the local CLI
            rc, res, p = gk.exec("agent", "print(x + 1)")
            assert rc == 0 and res[0]["stdout"].strip() == "42", p.stderr
            poll(gk.log, lambda t: re.search(r"[1-9]\d* over the connection budget", t), 30,
                 "the refusals logged")
        finally:
            for p in peers:
                p.close()
        poll(gk.fds, lambda v: v <= base + 2, 15, "the daemon's fds back to where they were")
        service_works(gk)
    finally:
        gk.close()


def test_a_too_small_fd_table_is_refused_at_start():
    home = Path(tempfile.mkdtemp(prefix="kmgz", dir="/tmp"))
    try:
        (home / "config.json").write_text(json.dumps({"http": "127.0.0.1:0",
                                                      "sandbox": mgrutil.SANDBOX}))
        p = subprocess.run([mgrutil.KM, "serve"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, KERNELMGR_HOME=str(home)),
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                                                 (256, 256)))
        assert p.returncode == 2, p.stderr
        assert "RLIMIT_NOFILE of 256" in p.stderr and "http_max_unauth 256" in p.stderr, p.stderr
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_tls_handshakes_are_bounded_too(tmp_path):
    """Over TLS the bounds hold from accept, before any handshake: idle
    TCP connections to the TLS port are cut to the per-address bound and the
    rest closed by the header timeout, while a token holder is served."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, timeout=120)
    gk = GwKM("invoker", {"http_tls_cert": str(cert), "http_tls_key": str(key)})
    try:
        flood = Peer(gk.port, "127.0.0.1", 60)
        try:
            poll(flood.poll_closed, lambda v: v >= 60 - PER_PEER, 10,
                 "handshakes over http_max_unauth_per_peer closed")
            ctx = ssl.create_default_context(cafile=str(cert))
            ctx.check_hostname = False
            c = http.client.HTTPSConnection("127.0.0.1", gk.port, context=ctx, timeout=60,
                                            source_address=(TOKEN_PEER, 0))
            c.request("GET", "/api/kernels", headers={"Authorization": f"token {gk.token}"})
            r = c.getresponse()
            assert r.status == 200 and b"agent" in r.read()
            c.close()
            poll(flood.poll_closed, lambda v: v == 60, 10 + HEADER_TIMEOUT,
                 "unfinished handshakes closed by the header timeout")
        finally:
            flood.close()
        rc, res, p = gk.exec("agent", "print(x + 1)")
        assert rc == 0 and res[0]["stdout"].strip() == "42", p.stderr
    finally:
        gk.close()
