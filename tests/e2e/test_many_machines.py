"""Running on many machines: three daemons (plain processes, each its own
home, node_id and HTTP port on loopback) behind a real nginx started from
deploy/nginx/kernelmgr.conf (consistent hashing on the session, no
failover), driven through the one front address: the JSON-RPC API with the
X-Kernelmgr-Session header and under /s/NAME/, the Jupyter REST API under
/s/NAME/api/kernels, kernel WebSockets (under the prefix, and by the node
field of the kernel id), /api/kernelmgr/ws per session; create: false,
/healthz and /readyz without a token, drain and undrain, and a dead
daemon's sessions failing closed instead of being made anew elsewhere.

Also: the Kubernetes manifests of deploy/k8s/ parsed and checked offline.
No fixed sleeps: everything polls with a deadline."""
import base64
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
from kutil import poll_until as poll  # noqa: E402

import websocket  # noqa: E402  (Debian python3-websocket)
import yaml  # noqa: E402  (Debian python3-yaml)

from test_gateway import close_code, execute, msg, wait_ready  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[2]
NGINX_CONF = ROOT / "deploy" / "nginx" / "kernelmgr.conf"
K8S = ROOT / "deploy" / "k8s"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
TOKEN = "many-machines-" + os.urandom(12).hex()
NODES = ("n0", "n1", "n2")
TEMPLATE_PORTS = (8891, 8892, 8893)
TEMPLATE_FRONT = 8890


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One daemon: its own home, node_id and HTTP port; `kernelmgr serve`
    in the foreground, a plain process."""

    def __init__(self, node_id, token_file=None):
        self.id = node_id
        cfg = {"http": "127.0.0.1:0", "node_id": node_id}
        env = {}
        if token_file:
            cfg["http_token_file"] = str(token_file)
        else:
            env["KERNELMGR_HTTP_TOKEN"] = TOKEN
        self.m = mgrutil.Mgr(cfg)
        self.m.env.update(env)
        self.log = open(self.m.home / "serve.log", "w")
        self.p = subprocess.Popen([mgrutil.KM, "serve"], env=self.m.env, stdout=self.log,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        info = poll(self._info, lambda v: v is not None, 30, f"{node_id}: http.json written")
        self.port = info["port"]
        self.url = f"http://127.0.0.1:{self.port}"

    def _info(self):
        assert self.p.poll() is None, (self.m.home / "serve.log").read_text()
        try:
            return json.loads((self.m.home / "http.json").read_text())
        except (OSError, ValueError):
            return None

    def sessions(self):
        """sessions.list asked of this daemon directly (not through the front)."""
        st, r = http("POST", self.url + "/api/kernelmgr", rpc("sessions.list"))
        assert st == 200 and "result" in r, r
        return {s["name"] for s in r["result"]["sessions"]}

    def kill(self):
        self.p.kill()
        self.p.wait(timeout=30)

    def close(self):
        if self.p.poll() is None:
            self.m.run("serve", "--stop", timeout=60)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()
        self.m.close()


def rpc(method, params=None, id=1):
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}


def http(method, url, body=None, token=TOKEN, headers=None):
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"token {token}"
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(r, timeout=120) as resp:
            text = resp.read()
            return resp.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text.decode(errors="replace")


def nginx_config(tmp, ports, front):
    """deploy/nginx/kernelmgr.conf with the test's ports, wrapped in a
    minimal nginx.conf whose files all live in tmp."""
    text = NGINX_CONF.read_text()
    for tp, p in zip(TEMPLATE_PORTS, ports):
        text = text.replace(f"127.0.0.1:{tp}", f"127.0.0.1:{p}")
    assert f"127.0.0.1:{TEMPLATE_FRONT}" in text
    text = text.replace(f"127.0.0.1:{TEMPLATE_FRONT}", f"127.0.0.1:{front}")
    (tmp / "kernelmgr.conf").write_text(text)
    for d in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / d).mkdir(exist_ok=True)
    main = f"""
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 512; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/kernelmgr.conf;
}}
"""
    (tmp / "nginx.conf").write_text(main)
    return tmp / "nginx.conf"


class Front:
    """nginx in the foreground (daemon off) on a free loopback port."""

    def __init__(self, tmp, ports):
        last = None
        for _ in range(5):  # a free port may be taken before nginx binds it
            self.port = free_port()
            conf = nginx_config(tmp, ports, self.port)
            t = subprocess.run([NGINX, "-t", "-p", str(tmp), "-e", str(tmp / "error.log"),
                                "-c", str(conf)], capture_output=True, text=True)
            assert t.returncode == 0, t.stderr
            self.p = subprocess.Popen([NGINX, "-p", str(tmp), "-e", str(tmp / "error.log"),
                                       "-c", str(conf), "-g", "daemon off;"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      stdin=subprocess.DEVNULL)
            self.url = f"http://127.0.0.1:{self.port}"
            try:
                poll(self._up, bool, 15, "nginx answers")
                return
            except AssertionError as e:
                last = e
                self.close()
        raise AssertionError(f"nginx did not start: {last}")

    def _up(self):
        if self.p.poll() is not None:
            raise AssertionError(self.p.stderr.read().decode(errors="replace"))
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def close(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGQUIT)
            try:
                self.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


@pytest.fixture
def cluster(tmp_path):
    if not os.access(NGINX, os.X_OK):
        pytest.fail("nginx is missing (make deps installs Debian's nginx)")
    tok = tmp_path / "http-token"
    fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (TOKEN + "\n").encode())
    os.close(fd)
    nodes = []
    front = None
    try:
        # two daemons read the token from http_token_file, one from the environment
        for i, n in enumerate(NODES):
            nodes.append(Node(n, tok if i < 2 else None))
        ngx = tmp_path / "nginx"
        ngx.mkdir()
        front = Front(ngx, [n.port for n in nodes])
        yield front, nodes
    finally:
        if front:
            front.close()
        for n in nodes:
            n.close()


def call(front, session, method, params, prefix=False, id=1):
    """A JSON-RPC call through the front, routed by the header (or the
    /s/NAME/ prefix)."""
    if prefix:
        return http("POST", f"{front.url}/s/{session}/api/kernelmgr", rpc(method, params, id))
    return http("POST", front.url + "/api/kernelmgr", rpc(method, params, id),
                headers={"X-Kernelmgr-Session": session})


def ws_connect(url, headers=()):
    return websocket.create_connection(url.replace("http", "ws", 1),
                                       header=[f"Authorization: token {TOKEN}", *headers],
                                       timeout=60)


def ws_rpc(ws, req):
    ws.send(json.dumps(req))
    while True:
        m = json.loads(ws.recv())
        if m.get("id") == req["id"]:
            return m


def test_sessions_routed_by_name_through_nginx(cluster):
    front, nodes = cluster
    by_id = {n.id: n for n in nodes}

    # health: no token, nothing but the status, direct and through the front
    for url in [n.url for n in nodes] + [front.url]:
        assert http("GET", url + "/healthz", token=None) == (200, {"status": "ok"})
        assert http("GET", url + "/readyz", token=None) == (200, {"status": "ready"})
    assert http("GET", front.url + "/api/kernels", token=None)[0] == 401
    assert http("POST", front.url + "/healthz", {}, token=None)[0] == 401  # GET only
    # draining is the operator's: not over HTTP
    st, r = call(front, "x", "daemon.drain", {})
    assert r["error"]["code"] == -32602 and "not available to HTTP" in r["error"]["message"], r

    # sessions made through the front land on one daemon each, by name
    names = [f"user{i}" for i in range(9)]
    for s in names:
        st, r = call(front, s, "session.create", {"session": s})
        assert st == 200 and r["result"]["created"] is True, r
    where = {}
    for n in nodes:
        for s in n.sessions():
            assert s not in where, f"{s} on {where.get(s)} and {n.id}"
            where[s] = n.id
    assert set(where) == set(names), where
    assert len(set(where.values())) >= 2, where
    # every request of a session reaches its daemon: ping says which
    for s in names:
        for prefix in (False, True):
            st, r = call(front, s, "ping", {}, prefix=prefix)
            assert st == 200 and r["result"]["node_id"] == where[s], (s, r)
    a = names[0]
    x = where[a]
    b = next(s for s in names if where[s] != x)
    y = where[b]

    # the JSON-RPC API: header and prefix reach the same kernel
    st, r = call(front, a, "exec", {"session": a, "code": "x = 6 * 7"})
    assert st == 200 and r["result"]["results"][0]["status"] == "ok", r
    st, r = call(front, a, "exec", {"session": a, "code": "print(x)"}, prefix=True)
    assert r["result"]["results"][0]["stdout"] == "42\n", r
    # a header that disagrees with the body is refused, nothing done
    st, r = call(front, a, "exec", {"session": b, "code": "y = 1"})
    assert r["error"]["code"] == -32602 and "routed by" in r["error"]["message"], r
    # create: false is the default over HTTP with a node_id: no empty session
    st, r = call(front, "nosuch", "exec", {"session": "nosuch", "code": "1"})
    assert r["error"]["code"] == -32003, r
    assert "nosuch" in r["error"]["message"] and "create: false" in r["error"]["message"], r
    st, r = call(front, "nosuch", "files.write", {"session": "nosuch", "path": "f", "content": ""})
    assert r["error"]["code"] == -32003, r
    st, r = call(front, a, "files.list", {"session": a, "create": False})
    assert "result" in r, r
    st, r = call(front, a, "files.read", {"session": a, "path": "f", "create": True})
    assert r["error"]["code"] == -32602 and "never creates" in r["error"]["message"], r
    assert not any("nosuch" in n.sessions() for n in nodes)

    # the Jupyter REST API under /s/NAME/: the session's own kernels
    st, ks = http("GET", f"{front.url}/s/{a}/api/kernels")
    assert st == 200 and [k["kernelmgr"]["session"] for k in ks] == [a], ks
    ka = ks[0]["id"]
    assert ka.startswith(x + "-") and re.fullmatch(r"\w+-\w+-\w+-\w+-\w+", ka), ka
    st, kb = http("POST", f"{front.url}/s/{b}/api/kernels", {"name": "kernelmgr-python"})
    assert st == 201 and kb["kernelmgr"]["session"] == b, kb
    assert kb["id"].startswith(y + "-"), kb
    # a kernel URL without the prefix goes to the node its id names
    st, k = http("GET", f"{front.url}/api/kernels/{kb['id']}")
    assert st == 200 and k["kernelmgr"]["session"] == b, k
    st, k = http("GET", f"{front.url}/s/{a}/api/kernels/{kb['id']}")
    assert st == 404, k  # a's daemon: not its kernel

    # kernel WebSockets: under the prefix, and by the kernel id's node
    ws = ws_connect(f"{front.url}/s/{a}/api/kernels/{ka}/channels")
    try:
        out, reply, _ = execute(ws, "print(x + 1)")
        assert out == "43\n" and reply["status"] == "ok", (out, reply)
    finally:
        ws.close()
    ws = ws_connect(f"{front.url}/api/kernels/{kb['id']}/channels")
    try:
        out, reply, _ = execute(ws, "y = 'b'; print(y)")
        assert out == "b\n", (out, reply)
    finally:
        ws.close()

    # /api/kernelmgr/ws per session: by the prefix, or the header
    ws = ws_connect(f"{front.url}/s/{a}/api/kernelmgr/ws")
    try:
        r = ws_rpc(ws, rpc("exec", {"session": a, "code": "print(x)"}, id=5))
        assert r["result"]["results"][0]["stdout"] == "42\n", r
        r = ws_rpc(ws, rpc("exec", {"session": b, "code": "print(y)"}, id=6))
        assert r["error"]["code"] == -32602 and "routed by" in r["error"]["message"], r
    finally:
        ws.close()
    ws = ws_connect(front.url + "/api/kernelmgr/ws", [f"X-Kernelmgr-Session: {b}"])
    try:
        r = ws_rpc(ws, rpc("exec", {"session": b, "code": "print(y)"}, id=7))
        assert r["result"]["results"][0]["stdout"] == "b\n", r
    finally:
        ws.close()

    # drain y: readyz says so, its sessions keep working, new ones are refused
    p = by_id[y].m.run("drain")
    assert p.returncode == 0 and "draining" in p.stdout, (p.stdout, p.stderr)
    # draining snapshotted every live session of y
    assert f'session {b}: snapshot "drain" taken' in p.stdout, p.stdout
    assert http("GET", by_id[y].url + "/readyz", token=None) == (503, {"status": "draining"})
    assert http("GET", f"{front.url}/s/{b}/readyz", token=None) == (503, {"status": "draining"})
    assert http("GET", by_id[y].url + "/healthz", token=None) == (200, {"status": "ok"})
    st, r = call(front, b, "exec", {"session": b, "code": "print(y * 2)"})
    assert r["result"]["results"][0]["stdout"] == "bb\n", r
    refused = None
    for i in range(60):  # until a new name hashes to y
        s = f"fresh{i}"
        st, r = call(front, s, "session.create", {"session": s})
        if "error" in r:
            refused = (s, r)
            break
        assert r["result"]["created"] is True, r
    assert refused, "no new session name hashed to the draining node in 60 tries"
    s, r = refused
    assert r["error"]["code"] == -32005, r
    assert "draining" in r["error"]["message"] and f'node "{y}"' in r["error"]["message"], r
    st, r = http("POST", f"{front.url}/s/{s}/api/kernels", {"name": "kernelmgr-python"})
    assert st == 503 and "draining" in r["message"], r
    assert s not in by_id[y].sessions()
    p = by_id[y].m.run("undrain")
    assert p.returncode == 0 and "not draining" in p.stdout, p.stdout
    assert http("GET", by_id[y].url + "/readyz", token=None) == (200, {"status": "ready"})
    st, r = call(front, s, "session.create", {"session": s})
    assert r["result"]["created"] is True, r

    # a move: b's archive exported through the front (routed to y by b's
    # name), imported as a name the balancer sends to a third node, the
    # old session closed; the balancer is told nothing
    st, r = call(front, b, "exec", {"session": b, "lang": "bash",
                                    "code": "word=moved; mkdir -p d && echo deep > d/f.txt"})
    assert r["result"]["results"][0]["status"] == "ok", r
    st, r = call(front, b, "session.export", {"session": b})
    assert st == 200 and "result" in r, r
    archive = base64.b64decode(r["result"]["data"])
    while not r["result"]["eof"]:
        st, r = call(front, b, "session.export", {"session": b, "offset": len(archive),
                                                  "archive": r["result"]["archive"]})
        archive += base64.b64decode(r["result"]["data"])
    with tarfile.open(fileobj=io.BytesIO(archive)) as t:  # what the host wrote names no path of it
        for name in ("kernelmgr-session.json", "snapshot/manifest.json"):
            assert str(by_id[y].m.home) not in t.extractfile(name).read().decode(), name
    c = next(f"moved{i}" for i in range(200)
             if call(front, f"moved{i}", "ping", {})[1]["result"]["node_id"] not in (x, y))
    st, r = call(front, c, "session.import", {"session": c, "offset": 0, "final": True,
                                              "data": base64.b64encode(archive).decode()})
    assert st == 200 and r["result"]["from"] == {"session": b, "node_id": y,
                                                 "exported_at": r["result"]["from"]["exported_at"]}
    assert "workspace" not in r["result"], r  # no host path over HTTP
    st, r = call(front, b, "close", {"session": b})
    assert "result" in r, r
    assert b not in by_id[y].sessions()
    st, r = call(front, c, "exec", {"session": c, "lang": "python", "code": "print(y * 3)"})
    assert r["result"]["results"][0]["stdout"] == "bbb\n", r
    st, r = call(front, c, "exec", {"session": c, "lang": "bash", "code": "echo $word; cat d/f.txt"})
    assert r["result"]["results"][0]["stdout"] == "moved\ndeep\n", r
    st, r = call(front, c, "files.read", {"session": c, "path": "d/f.txt"})
    assert r["result"]["content"] == "deep\n", r
    st, r = call(front, b, "exec", {"session": b, "code": "print(y)"})
    assert r["error"]["code"] == -32003, r  # gone from y, not made anew

    # a dead daemon: its sessions fail closed, never made anew elsewhere
    pid = ks[0]["kernelmgr"]["pid"]
    by_id[x].kill()
    st, r = call(front, a, "exec", {"session": a, "code": "print(x)"})
    assert st == 502 and "unreachable" in r["message"] and a in r["message"], (st, r)
    st, r = http("GET", f"{front.url}/api/kernels/{ka}")
    assert st == 502, (st, r)
    for n in nodes:
        if n.id != x:
            assert a not in n.sessions(), n.id
    # a request that reached another daemon anyway (a failover) finds nothing
    st, r = http("POST", by_id[y].url + "/api/kernelmgr",
                 rpc("exec", {"session": a, "code": "print(x)"}))
    assert r["error"]["code"] == -32003 and f'node "{y}"' in r["error"]["message"], r
    assert a not in by_id[y].sessions()
    # the dead daemon's kernel ends with it (its lifeline)
    poll(lambda: _alive(pid), lambda v: not v, 30, f"kernel {pid} of the dead daemon ends")
    # the others still serve
    st, r = call(front, c, "exec", {"session": c, "code": "print(y)"})
    assert r["result"]["results"][0]["stdout"] == "b\n", r


def test_jupyter_server_on_one_session_through_the_front(cluster, tmp_path):
    """`jupyter server --gateway-url http://front/s/NAME` (jupyter_server's
    own GatewayClient): the kernel its notebook starts is session NAME's, on
    the daemon NAME hashes to, and runs cells there."""
    front, nodes = cluster
    port = free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               HOME=str(tmp_path))
    log = open(tmp_path / "server.log", "w")
    p = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser",
                          f"--port={port}", "--ip=127.0.0.1", "--ServerApp.token=srvtok",
                          "--allow-root", f"--gateway-url={front.url}/s/nb1",
                          f"--GatewayClient.auth_token={TOKEN}",
                          f"--ServerApp.root_dir={tmp_path}"],
                         env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        def up():
            assert p.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(base + "/api?token=srvtok", timeout=5):
                    return True
            except OSError:
                return False

        poll(up, bool, 90, "jupyter server up")
        st, s = http("POST", base + "/api/sessions", {"path": "nb.ipynb", "type": "notebook",
                                                      "kernel": {"name": "kernelmgr-python"}},
                     token="srvtok")
        assert st == 201, (st, s)
        kid = s["kernel"]["id"]
        owners = [n for n in nodes if "nb1" in n.sessions()]
        assert len(owners) == 1 and kid.startswith(owners[0].id + "-"), (kid, owners)
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{port}/api/kernels/{kid}/channels?token=srvtok", timeout=60)
        try:
            wait_ready(ws)
            out, reply, _ = execute(ws, "z = 5; print(z * 2)")
            assert out == "10\n", (out, reply)
        finally:
            ws.close()
        # the agent's API sees the same state, through the front
        st, r = call(front, "nb1", "exec", {"session": "nb1", "code": "print(z)"})
        assert r["result"]["results"][0]["stdout"] == "5\n", r
        st, ks = http("GET", base + "/api/kernels", token="srvtok")
        assert st == 200 and [k["id"] for k in ks] == [kid], ks
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


def test_attack_a_route_stays_in_its_session(tmp_path):
    """One daemon (node_id n0): whatever a client puts in the prefix, the
    header or the body, a request routed to session b never reaches
    session a, malformed names are refused, the prefix bypasses no token
    and the health endpoints tell nothing; a keeps working after each."""
    n = Node("n0")
    try:
        u = n.url
        for s in ("a", "b"):
            st, r = http("POST", u + "/api/kernelmgr", rpc("session.create", {"session": s}))
            assert r["result"]["created"] is True, r
        st, r = http("POST", u + "/api/kernelmgr",
                     rpc("exec", {"session": "a", "code": "secret = 'A'"}))
        assert r["result"]["results"][0]["status"] == "ok", r

        def a_works():
            st, r = http("POST", u + "/s/a/api/kernelmgr",
                         rpc("exec", {"session": "a", "code": "print(secret)"}))
            assert r["result"]["results"][0]["stdout"] == "A\n", r

        st, ks = http("GET", u + "/s/a/api/kernels")
        ka = ks[0]["id"]
        pid = ks[0]["kernelmgr"]["pid"]
        # another session's kernel under /s/b/: not found, whatever the method
        for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/interrupt"),
                             ("POST", "/restart")):
            st, r = http(method, f"{u}/s/b/api/kernels/{ka}{path}",
                         {} if method == "POST" else None)
            assert st == 404 and "not a kernel of session" in r["message"], (method, path, st, r)
        st, r = http("GET", u + "/s/b/api/kernels")
        assert st == 200 and all(k["kernelmgr"]["session"] == "b" for k in r), r
        # a kernel start naming a under /s/b/
        for body in ({"name": "kernelmgr-python--a"},
                     {"name": "kernelmgr-python", "kernelmgr": {"session": "a"}}):
            st, r = http("POST", u + "/s/b/api/kernels", body)
            assert st == 400 and '"a"' in r["message"], (body, st, r)
        # the JSON-RPC API: prefix, header, both
        for url, hdr in ((u + "/s/b/api/kernelmgr", {}),
                         (u + "/api/kernelmgr", {"X-Kernelmgr-Session": "b"})):
            for m, params in (("exec", {"session": "a", "code": "secret = 'B'"}),
                              ("close", {"session": "a"}),
                              ("files.write", {"session": "a", "path": "x", "content": "B"})):
                st, r = http("POST", url, rpc(m, params), headers=hdr)
                assert r["error"]["code"] == -32602 and "routed by" in r["error"]["message"], r
        st, r = http("POST", u + "/s/b/api/kernelmgr", rpc("ping"),
                     headers={"X-Kernelmgr-Session": "a"})
        assert st == 400 and "different sessions" in r["message"], r
        # the kernel WebSocket of a under /s/b/: closed, saying why
        ws = ws_connect(f"{u}/s/b/api/kernels/{ka}/channels")
        try:
            code, why = close_code(ws)
            assert "not a kernel of session b" in why, (code, why)
        finally:
            ws.close()
        ws = ws_connect(u + "/s/b/api/kernelmgr/ws")
        try:
            r = ws_rpc(ws, rpc("exec", {"session": "a", "code": "secret = 'B'"}, id=3))
            assert r["error"]["code"] == -32602, r
            r = ws_rpc(ws, rpc("exec", {"session": "b", "code": "print('b ok')"}, id=4))
            assert r["result"]["results"][0]["stdout"] == "b ok\n", r
        finally:
            ws.close()
        a_works()
        # malformed names: refused, never cut, nothing made
        for path in ("/s/", "/s//api/kernels", "/s/.hidden/api/kernels",
                     "/s/" + "x" * 65 + "/api/kernels", "/s/a%20b/api/kernels"):
            st, r = http("GET", u + path)
            assert st in (400, 404), (path, st, r)
        for hv in ("x" * 65, "../a", ".a", "a b", "a/b"):
            st, r = http("GET", u + "/api/kernels", headers={"X-Kernelmgr-Session": hv})
            assert st == 400 and "X-Kernelmgr-Session" in r["message"], (hv, st, r)
        assert n.sessions() == {"a", "b"}
        # the prefix bypasses no check: token, then Host
        assert http("GET", u + "/s/a/api/kernels", token=None)[0] == 401
        assert http("GET", u + "/s/a/api/kernels", token="wrong-token-wrong-token")[0] == 401
        st, r = http("GET", u + "/s/a/api/kernels", headers={"Host": "evil.example"})
        assert st == 403, (st, r)
        for path in ("/healthzx", "/healthz/x", "/s/a/healthz/../api/kernels", "/readyz/"):
            assert http("GET", u + path, token=None)[0] in (401, 404), path
        # health: a status word, whatever the Host, nothing else
        for path in ("/healthz", "/s/a/healthz", "/readyz"):
            st, r = http("GET", u + path, token=None, headers={"Host": "evil.example"})
            assert st == 200 and set(r) == {"status"}, (path, st, r)
        assert _alive(pid)
        a_works()
    finally:
        n.close()


def test_token_file_symlink_refused(tmp_path):
    real = tmp_path / "real"
    fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, (TOKEN + "\n").encode())
    os.close(fd)
    link = tmp_path / "link"
    link.symlink_to(real)
    m = mgrutil.Mgr({"http": "127.0.0.1:0", "http_token_file": str(link)})
    try:
        p = subprocess.run([mgrutil.KM, "serve"], env=m.env, capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode != 0 and "symbolic link" in p.stderr, p.stderr
        assert TOKEN not in p.stderr
    finally:
        m.close()


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def test_token_file_must_be_private(tmp_path):
    tok = tmp_path / "tok"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o644)
    m = mgrutil.Mgr({"http": "127.0.0.1:0", "http_token_file": str(tok)})
    try:
        p = subprocess.run([mgrutil.KM, "serve"], env=m.env, capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode != 0 and "http_token_file" in p.stderr and "chmod 600" in p.stderr, \
            p.stderr
        assert TOKEN not in p.stderr
        tok.chmod(0o600)
        env = dict(m.env, KERNELMGR_HTTP_TOKEN="short")
        p = subprocess.run([mgrutil.KM, "serve"], env=env, capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL)
        assert p.returncode != 0 and "KERNELMGR_HTTP_TOKEN" in p.stderr and "16" in p.stderr, \
            p.stderr
    finally:
        m.close()


# ------------------------------------------------------------------ Kubernetes, offline

K8S_STS = "kernelmgr"
K8S_NODES = "kernelmgr-nodes"
K8S_PORT = 8889
K8S_LISTEN = 8080


def k8s_nginx_conf():
    """deploy/nginx/kernelmgr.conf for the StatefulSet of deploy/k8s: its
    pods (kernelmgr-N.kernelmgr-nodes:8889, node ids kernelmgr_N) where the
    example has 127.0.0.1:889x and n0-n2, listening on 8080. The ConfigMap of
    balancer.yaml must hold exactly this (`python3
    tests/e2e/test_many_machines.py` rewrites it)."""
    text = NGINX_CONF.read_text()
    for i, tp in enumerate(TEMPLATE_PORTS):
        text = text.replace(f"127.0.0.1:{tp}", f"{K8S_STS}-{i}.{K8S_NODES}:{K8S_PORT}")
        text = text.replace(f"    n{i} kernelmgr_n{i}; # @node",
                            f"    {K8S_STS}_{i} kernelmgr_n{i}; # @node")
    text = text.replace(f"listen 127.0.0.1:{TEMPLATE_FRONT};", f"listen {K8S_LISTEN};")
    return text


def test_k8s_balancer_config_is_the_nginx_example():
    docs = [d for _, d in k8s_docs() if d["kind"] == "ConfigMap"
            and "kernelmgr.conf" in d.get("data", {})]
    assert len(docs) == 1, "one ConfigMap holds the balancer's kernelmgr.conf"
    assert docs[0]["data"]["kernelmgr.conf"] == k8s_nginx_conf(), \
        "deploy/k8s/balancer.yaml differs from deploy/nginx/kernelmgr.conf: regenerate it"


def test_k8s_balancer_config_is_valid_nginx(tmp_path):
    """The balancer's configuration passes `nginx -t` (pod names replaced by
    loopback: nginx resolves upstream names when it loads)."""
    text = k8s_nginx_conf()
    for i in range(3):
        text = text.replace(f"{K8S_STS}-{i}.{K8S_NODES}:{K8S_PORT}", f"127.0.0.1:{9000 + i}")
    # nginx -t binds the listen address: a free loopback port
    text = text.replace(f"listen {K8S_LISTEN};", f"listen 127.0.0.1:{free_port()};")
    conf = nginx_config(tmp_path, [9000, 9001, 9002], 1)
    (tmp_path / "kernelmgr.conf").write_text(text)
    t = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"),
                        "-c", str(conf)], capture_output=True, text=True)
    assert t.returncode == 0, t.stderr


def k8s_docs():
    docs = []
    for f in sorted(K8S.glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d is not None:
                docs.append((f.name, d))
    return docs


def test_k8s_manifests_are_consistent():
    docs = k8s_docs()
    assert docs, "no manifests in deploy/k8s"
    kinds = {}
    for name, d in docs:
        for key in ("apiVersion", "kind", "metadata"):
            assert key in d, f"{name}: {key} missing"
        assert d["metadata"].get("name"), f"{name}: metadata.name missing"
        kinds.setdefault(d["kind"], []).append(d)
    for k in ("StatefulSet", "Service", "ConfigMap", "Deployment"):
        assert k in kinds, f"no {k} in deploy/k8s ({sorted(kinds)})"
    (sts,) = kinds["StatefulSet"]
    spec = sts["spec"]
    assert spec["replicas"] >= 1 and spec["serviceName"]
    labels = spec["selector"]["matchLabels"]
    tpl = spec["template"]
    assert all(tpl["metadata"]["labels"].get(k) == v for k, v in labels.items())
    # a volume per pod for its state
    (vct,) = spec["volumeClaimTemplates"]
    assert vct["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert vct["spec"]["resources"]["requests"]["storage"]
    pod = tpl["spec"]
    sc = pod["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0, sc
    (c,) = [c for c in pod["containers"] if c["name"] == "kernelmgr"]
    assert any(m["name"] == vct["metadata"]["name"] for m in c["volumeMounts"])
    port = next(p["containerPort"] for p in c["ports"] if p["name"] == "http")
    csc = c["securityContext"]
    assert csc["allowPrivilegeEscalation"] is False and csc["capabilities"]["drop"] == ["ALL"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        g = c[probe]["httpGet"]
        assert g["path"] == path and g["port"] in (port, "http"), (probe, g)
    env = {e["name"]: e for e in c.get("env", [])}
    assert "secretKeyRef" in env["KERNELMGR_HTTP_TOKEN"]["valueFrom"], env
    # the headless Service the StatefulSet names
    svcs = {s["metadata"]["name"]: s for s in kinds["Service"]}
    hl = svcs[spec["serviceName"]]
    assert hl["spec"]["clusterIP"] == "None"
    assert hl["spec"]["selector"] == labels
    assert any(p["port"] == port or p.get("targetPort") in (port, "http")
               for p in hl["spec"]["ports"])
    # the balancer: nginx with consistent hashing on the session, no failover
    cms = {m["metadata"]["name"]: m for m in kinds["ConfigMap"]}
    ngx_conf = "\n".join(v for m in cms.values() for v in m.get("data", {}).values())
    assert re.search(r"hash \$kernelmgr_session consistent;", ngx_conf)
    assert "proxy_next_upstream off;" in ngx_conf and "max_fails=0" in ngx_conf
    assert "X-Kernelmgr-Session" in ngx_conf or "x_kernelmgr_session" in ngx_conf
    for i in range(spec["replicas"]):
        host = f"{sts['metadata']['name']}-{i}.{spec['serviceName']}"
        assert host in ngx_conf, f"replica {i} ({host}) is not behind the balancer"
        assert f":{port}" in ngx_conf
    deps = [d for d in kinds["Deployment"]
            if any("nginx" in c["image"] for c in d["spec"]["template"]["spec"]["containers"])]
    assert deps, "no nginx Deployment"
    dep = deps[0]
    vols = dep["spec"]["template"]["spec"]["volumes"]
    assert any(v.get("configMap", {}).get("name") in cms for v in vols)
    # the nginx config of the ConfigMap is what deploy/nginx documents
    for m in ("$kernelmgr_prefix_session", "$kernelmgr_node", "@kernelmgr_down"):
        assert m in ngx_conf and m in NGINX_CONF.read_text(), m


if __name__ == "__main__":
    # rewrites the balancer ConfigMap's kernelmgr.conf in deploy/k8s/balancer.yaml
    # from deploy/nginx/kernelmgr.conf
    path = K8S / "balancer.yaml"
    lines = path.read_text().split("\n")
    start = lines.index("  kernelmgr.conf: |") + 1
    end = lines.index("---", start)
    body = ["    " + line if line else "" for line in k8s_nginx_conf().rstrip("\n").split("\n")]
    path.write_text("\n".join(lines[:start] + body + lines[end:]))
    print(f"{path}: kernelmgr.conf regenerated")
