"""The Jupyter kernel gateway: the kernels REST API and the kernel
WebSocket served by the daemon, tested with real clients — plain HTTP,
python3-websocket in both message forms, and jupyter_server's own
GatewayClient (a `jupyter server --gateway-url=...` whose kernels are ours).

Every attack asserts that it failed and that the agent's session still
works afterwards. Servers listen on loopback; no fixed sleeps."""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
from kutil import poll_until as poll  # noqa: E402

import websocket  # noqa: E402  (Debian python3-websocket, in make deps)

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="no kernel-python")


class GW:
    """A manager whose daemon serves the gateway (config "http")."""

    def __init__(self, make_mgr, **cfg):
        self.m = make_mgr({"http": "127.0.0.1:0", **cfg})
        rc, res, p = self.m.exec("agent", "x = 41")
        assert rc == 0, p.stderr
        info = poll(self._info, lambda v: v is not None, 30, "http.json written")
        self.url = info["url"].rstrip("/")
        self.port = info["port"]
        tok = self.m.home / "http-token"
        st = tok.stat()
        assert st.st_mode & 0o077 == 0, oct(st.st_mode)
        self.token = tok.read_text().strip()

    def _info(self):
        try:
            return json.loads((self.m.home / "http.json").read_text())
        except (OSError, ValueError):
            return None

    def req(self, method, path, body=None, token=True, headers=None, raw=None):
        h = dict(headers or {})
        if token is True:
            h["Authorization"] = f"token {self.token}"
        elif token:
            h["Authorization"] = f"token {token}"
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        r = urllib.request.Request(self.url + path, data=data, method=method, headers=h)
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

    def kernel_of(self, session, lang="python"):
        st, ks = self.req("GET", "/api/kernels")
        assert st == 200, ks
        for k in ks:
            if k["kernelmgr"]["session"] == session and k["kernelmgr"]["language"] == lang:
                return k
        return None

    def ws(self, kid, subprotocol=None, origin=None, token=True):
        url = self.url.replace("http", "ws", 1) + f"/api/kernels/{kid}/channels"
        h = [f"Authorization: token {self.token}"] if token else []
        kw = {"subprotocols": [subprotocol]} if subprotocol else {}
        if origin:
            kw["origin"] = origin
        return websocket.create_connection(url, header=h, timeout=60, **kw)


@pytest.fixture
def gw(make_mgr):
    return GW(make_mgr)


def msg(msg_type, content, channel="shell"):
    return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": "s",
                       "username": "test", "date": "2026-12-01T00:00:00Z", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "content": content, "channel": channel}


def v1_encode(m):
    parts = [json.dumps(m[k]).encode() for k in ("header", "parent_header", "metadata",
                                                  "content")]
    ch = m["channel"].encode()
    offs = [8 * (1 + 1 + len(parts) + 1)]
    offs.append(offs[-1] + len(ch))
    for p in parts:
        offs.append(offs[-1] + len(p))
    return b"".join([len(offs).to_bytes(8, "little")] + [o.to_bytes(8, "little") for o in offs]
                    + [ch] + parts)


def v1_decode(b):
    n = int.from_bytes(b[:8], "little")
    offs = [int.from_bytes(b[8 * (i + 1):8 * (i + 2)], "little") for i in range(n)]
    ch = b[offs[0]:offs[1]].decode()
    parts = [b[offs[i]:offs[i + 1]] for i in range(1, n - 1)]
    out = {k: json.loads(parts[i]) for i, k in enumerate(("header", "parent_header", "metadata",
                                                          "content"))}
    out["channel"] = ch
    out["buffers"] = parts[4:]
    return out


def execute(ws, code, v1=False, deadline=60):
    """Runs code over the WebSocket: (stdout text, reply content, iopub msgs)."""
    m = msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                "user_expressions": {}, "allow_stdin": False,
                                "stop_on_error": True})
    ws.send_binary(v1_encode(m)) if v1 else ws.send(json.dumps(m))
    mid = m["header"]["msg_id"]
    out, reply, iopub, idle = "", None, [], False
    end = time.monotonic() + deadline
    while not (reply and idle):
        assert time.monotonic() < end, f"no reply/idle for {code!r}: {iopub}"
        raw = ws.recv()
        r = v1_decode(raw) if v1 else json.loads(raw)
        if r["parent_header"].get("msg_id") != mid:
            continue
        t = r["header"]["msg_type"]
        if r["channel"] == "iopub":
            iopub.append(r)
            if t == "stream" and r["content"]["name"] == "stdout":
                out += r["content"]["text"]
            if t == "status" and r["content"]["execution_state"] == "idle":
                idle = True
        elif r["channel"] == "shell" and t == "execute_reply":
            reply = r["content"]
    return out, reply, iopub


def close_code(ws, deadline=60):
    """Reads frames until the server's close frame: (code, reason)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            # the raw frame: recv_data_frame would answer a close first, and
            # a server already gone makes that answer fail
            frame = ws.recv_frame()
        except (websocket.WebSocketConnectionClosedException, ConnectionError):
            return None, f"closed without a close frame: {sys.exc_info()[1]!r}"
        if frame.opcode == websocket.ABNF.OPCODE_CLOSE:
            d = frame.data
            return (struct.unpack("!H", d[:2])[0] if len(d) >= 2 else None,
                    d[2:].decode(errors="replace"))
    raise AssertionError("no close frame")


def wait_ready(ws, deadline=60):
    """kernel_info_request every 0.5 s until one is answered, as Jupyter
    clients do on connect (jupyter_server's gateway proxy drops a message
    sent before its own connection to the gateway is up)."""
    end = time.monotonic() + deadline
    ws.settimeout(0.5)
    try:
        while time.monotonic() < end:
            ws.send(json.dumps(msg("kernel_info_request", {})))
            try:
                while True:
                    r = json.loads(ws.recv())
                    if r["header"]["msg_type"] == "kernel_info_reply":
                        return r["content"]
            except websocket.WebSocketTimeoutException:
                pass
    finally:
        ws.settimeout(60)
    raise AssertionError("no kernel_info_reply through the proxy")


def agent_works(gw, code="print(x + 1)", want="42"):
    rc, res, p = gw.m.exec("agent", code)
    assert rc == 0 and want in res[0]["stdout"], (p.stderr, res)


# ------------------------------------------------------------------ REST

def test_token_required(gw):
    for tok in (None, "wrong" * 8, gw.token[:-1]):
        st, body = gw.req("GET", "/api/kernels", token=tok)
        assert st == 401, (tok, st, body)
    st, body = gw.req("GET", f"/api/kernels?token={gw.token}", token=None)
    assert st == 200, body
    agent_works(gw)


def test_routes_answer_every_method_and_path(gw):
    """Every method on every path gets an answer from the route table, and
    the daemon lives on: /api itself is GET only."""
    st, body = gw.req("GET", "/api")
    assert st == 200 and body["kernelmgr"] == "gateway", body
    for method, path, want in [("POST", "/api", 404), ("DELETE", "/api", 404),
                               ("GET", "/api/nope", 404), ("DELETE", "/api/kernels", 405),
                               ("POST", "/api/kernelspecs", 404), ("GET", "/api/kernelmgr", 405),
                               ("GET", "/api/kernels/nope/interrupt", 404)]:
        st, body = gw.req(method, path, raw=b"{}" if method == "POST" else None)
        assert st == want, (method, path, st, body)
    agent_works(gw)


def test_kernelspecs_and_the_agents_kernel_listed(gw):
    st, specs = gw.req("GET", "/api/kernelspecs")
    assert st == 200
    assert specs["default"] == "kernelmgr-python"
    assert set(specs["kernelspecs"]) >= {"kernelmgr-python", "kernelmgr-bash"}
    assert specs["kernelspecs"]["kernelmgr-bash"]["spec"]["language"] == "bash"
    st, one = gw.req("GET", "/api/kernelspecs/kernelmgr-python")
    assert st == 200 and one["name"] == "kernelmgr-python"
    assert gw.req("GET", "/api/kernelspecs/nope")[0] == 404
    k = gw.kernel_of("agent")
    # named by the session's own kernelspec: a saved notebook reopens on it
    assert k and k["name"] == "kernelmgr-python--agent" and k["execution_state"] in ("idle",
                                                                                    "busy")
    assert isinstance(k["kernelmgr"]["pid"], int)
    uuid.UUID(k["id"])
    st, same = gw.req("GET", f"/api/kernels/{k['id']}")
    assert st == 200 and same["id"] == k["id"]
    assert gw.req("GET", "/api/kernels/00000000-0000-0000-0000-000000000000")[0] == 404


def test_start_interrupt_restart_delete(gw):
    # a frontend's "env" (jupyter_server sends its whole process environment)
    # never reaches the sandbox; "kernelmgr": {"env"} is the explicit way
    st, k = gw.req("POST", "/api/kernels", {"name": "kernelmgr-python",
                                            "env": {"KERNEL_USERNAME": "u", "LEAK": "host"},
                                            "kernelmgr": {"env": {"GREETING": "hi"}}})
    assert st == 201, k
    sess = k["kernelmgr"]["session"]
    assert sess.startswith("jupyter-")
    listed = json.loads(gw.m.run("sessions", "--json").stdout or "[]")
    names = [s["name"] for s in (listed if isinstance(listed, list) else listed.get("sessions", []))]
    assert sess in names, listed
    ws = gw.ws(k["id"])
    try:
        out, reply, _ = execute(ws, "import os; print(os.environ.get('GREETING'), "
                                    "os.environ.get('KERNEL_USERNAME'), os.environ.get('LEAK'))")
        assert reply["status"] == "ok" and out.strip() == "hi None None", out
        # interrupt a sleeping cell through REST
        m = msg("execute_request", {"code": "import time; print('sleeping', flush=True); "
                                            "time.sleep(60)", "silent": False})
        ws.send(json.dumps(m))
        while True:
            r = json.loads(ws.recv())
            if r["header"]["msg_type"] == "stream" and "sleeping" in r["content"]["text"]:
                break
        assert gw.req("POST", f"/api/kernels/{k['id']}/interrupt", {})[0] == 204
        while True:
            r = json.loads(ws.recv())
            if r["channel"] == "shell" and r["parent_header"].get("msg_id") == m["header"]["msg_id"]:
                assert r["content"]["status"] == "error"
                assert r["content"]["ename"] == "KeyboardInterrupt"
                break
    finally:
        ws.close()
    st, k2 = gw.req("POST", f"/api/kernels/{k['id']}/restart", {})
    assert st == 200 and k2["id"] == k["id"], k2
    assert gw.req("DELETE", f"/api/kernels/{k['id']}")[0] == 204
    assert gw.req("GET", f"/api/kernels/{k['id']}")[0] == 404
    listed = json.loads(gw.m.run("sessions", "--json").stdout or "[]")
    names = [s["name"] for s in (listed if isinstance(listed, list) else listed.get("sessions", []))]
    assert sess not in names, listed
    # the agent's own session is detached from, never shut down: its state stays
    ak = gw.kernel_of("agent")
    assert gw.req("DELETE", f"/api/kernels/{ak['id']}")[0] == 204
    assert gw.kernel_of("agent")["id"] == ak["id"]
    agent_works(gw)


def test_a_sessions_kernelspec_attaches_to_it(gw):
    st, specs = gw.req("GET", "/api/kernelspecs")
    spec = specs["kernelspecs"]["kernelmgr-python--agent"]
    assert spec["spec"]["metadata"]["session"] == "agent", spec
    assert "agent" in spec["spec"]["display_name"]
    before = gw.kernel_of("agent")
    st, k = gw.req("POST", "/api/kernels", {"name": "kernelmgr-python--agent"})
    assert st == 201 and k["id"] == before["id"] and k["kernelmgr"]["session"] == "agent", k
    # the bash kernel of the session starts on demand, in the same workspace
    st, kb = gw.req("POST", "/api/kernels", {"name": "kernelmgr-bash--agent"})
    assert st == 201 and kb["kernelmgr"]["language"] == "bash", kb
    assert gw.req("POST", "/api/kernels", {"name": "kernelmgr-python--nosuch"})[0] == 404
    agent_works(gw)


# ------------------------------------------------------------------ WebSocket

@pytest.mark.parametrize("v1", [False, True], ids=["json", "v1"])
def test_websocket_runs_in_the_agents_live_state(gw, v1):
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"], "v1.kernel.websocket.jupyter.org" if v1 else None)
    try:
        out, reply, iopub = execute(ws, "print(x + 1)\ny = 'from-jupyter'", v1=v1)
        assert out == "42\n" and reply["status"] == "ok", (out, reply)
        states = [r["content"]["execution_state"] for r in iopub if r["header"]["msg_type"] == "status"]
        assert states[0] == "busy" and states[-1] == "idle", states
        # display data with a PNG: the binary-safe path
        out, reply, iopub = execute(
            ws, "import matplotlib\nmatplotlib.use('agg')\nimport matplotlib.pyplot as plt\n"
                "plt.plot([1, 2, 3]); plt.show()", v1=v1)
        assert reply["status"] == "ok", reply
        pngs = [r for r in iopub if r["header"]["msg_type"] == "display_data"
                and "image/png" in r["content"]["data"]]
        assert pngs, [r["header"]["msg_type"] for r in iopub]
    finally:
        ws.close()
    # the agent sees what the frontend did
    agent_works(gw, "print(y)", "from-jupyter")


def test_websocket_auth_origin_and_path(gw):
    k = gw.kernel_of("agent")
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        gw.ws(k["id"], token=False)
    assert e.value.status_code == 401
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        gw.ws(k["id"], origin="http://evil.example")
    assert e.value.status_code == 403
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        gw.ws("not-a-kernel/../../x")
    assert e.value.status_code in (400, 404)
    # the Host's own origin is fine
    ws = gw.ws(k["id"], origin=f"http://127.0.0.1:{gw.port}")
    ws.close()
    agent_works(gw)


# ------------------------------------------------------------------ attacks

def test_bad_messages_are_dropped_and_the_connection_lives(gw):
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"])
    try:
        for bad in ("not json", "[]", json.dumps({"header": {}}),
                    json.dumps({**msg("execute_request", {"code": "1"}), "channel": "iopub"})):
            ws.send(bad)
        ws.send_binary(b"\xff" * 64)
        out, reply, _ = execute(ws, "print(x + 1)")
        assert out == "42\n"
    finally:
        ws.close()
    agent_works(gw)


def test_oversized_body_and_message_refused(make_mgr):
    g = GW(make_mgr, http_max_body=4096, http_max_message=65536)
    st, body = g.req("POST", "/api/kernels", raw=b"{" + b" " * 10000 + b"}",
                     headers={"Content-Type": "application/json"})
    assert st == 413 and "4096" in body["message"], body
    k = g.kernel_of("agent")
    ws = g.ws(k["id"])
    ws.send(json.dumps(msg("execute_request", {"code": "#" * 100000})))
    code, why = close_code(ws)
    assert code == 1009 and "65536" in why, (code, why)
    ws.close()
    agent_works(g)


def test_message_flood_hits_the_rate_limit(make_mgr):
    g = GW(make_mgr, http_rate=20)
    k = g.kernel_of("agent")
    ws = g.ws(k["id"])
    try:
        for i in range(60):  # over the burst of 2 x 20
            ws.send(json.dumps(msg("kernel_info_request", {})))
    except (websocket.WebSocketConnectionClosedException, BrokenPipeError, ConnectionError):
        pass
    code, why = close_code(ws)
    # The server closes with 1008 naming the limit; a client still sending
    # when the server closes may see a reset before that frame (TCP drops
    # what it had not read), so the daemon's log is the proof of the reason.
    assert code == 1008 or code is None, (code, why)
    if code == 1008:
        assert "rate limit of 20 messages per second" in why, why
    log = poll(lambda: (g.m.home / "daemon.log").read_text(),
               lambda t: "rate limit of 20 messages per second exceeded" in t, 30,
               "the limit in the daemon's log")
    assert k["id"] in log
    ws.close()
    agent_works(g)


def test_slow_client_is_cut_not_waited_for(make_mgr):
    g = GW(make_mgr, http_max_pending=1 << 20)
    k = g.kernel_of("agent")
    url = g.url.replace("http", "ws", 1) + f"/api/kernels/{k['id']}/channels"
    # a raw client that sends one request and then never reads
    s = socket.create_connection(("127.0.0.1", g.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    s.sendall((f"GET /api/kernels/{k['id']}/channels HTTP/1.1\r\nHost: 127.0.0.1:{g.port}\r\n"
               f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
               f"Sec-WebSocket-Version: 13\r\nAuthorization: token {g.token}\r\n\r\n").encode())
    payload = json.dumps(msg("execute_request", {
        "code": "for i in range(20000): print('x' * 1000)", "silent": False})).encode()
    mask = b"\x01\x02\x03\x04"
    frame = bytes([0x81, 0x80 | 127]) + struct.pack("!Q", len(payload)) + mask + \
        bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    s.sendall(frame)
    # the agent's own work finishes meanwhile: the kernel is not stalled
    agent_works(g, "print(sum(range(10)))", "45")
    s.close()
    agent_works(g)
    del url


def test_non_loopback_needs_tls_or_insecure(make_mgr):
    m = make_mgr()
    p = m.run("serve", "--http", "0.0.0.0:0", timeout=60)
    assert p.returncode == 2 and "TLS" in p.stderr and "--insecure" in p.stderr, p.stderr


def test_tls(make_mgr, tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                    str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
                   check=True, capture_output=True, timeout=120)
    g = GW(make_mgr, http_tls_cert=str(cert), http_tls_key=str(key))
    assert g.url.startswith("https://")
    import ssl
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    r = urllib.request.Request(g.url + "/api/kernels",
                               headers={"Authorization": f"token {g.token}"})
    with urllib.request.urlopen(r, context=ctx, timeout=60) as resp:
        ks = json.loads(resp.read())
    assert any(k["kernelmgr"]["session"] == "agent" for k in ks)
    # plain HTTP to the TLS port gets nothing useful
    with pytest.raises(Exception):
        urllib.request.urlopen(g.url.replace("https", "http") + "/api/kernels", timeout=10)
    agent_works(g)


# ------------------------------------------------------------------ real Jupyter Server

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.fixture
def jupyter_server(gw, tmp_path):
    port = free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"),
               HOME=str(tmp_path))
    p = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser",
                          f"--port={port}", "--ip=127.0.0.1", "--ServerApp.token=srvtok",
                          "--allow-root", f"--gateway-url={gw.url}",
                          f"--GatewayClient.auth_token={gw.token}",
                          f"--ServerApp.root_dir={tmp_path}", "--debug"],
                         env=env, stdout=open(tmp_path / "server.log", "w"), stderr=subprocess.STDOUT)

    def up():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api?token=srvtok", timeout=5):
                return True
        except OSError:
            return p.poll() is not None

    poll(up, bool, 90, "jupyter server up")
    assert p.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
    yield port
    p.terminate()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def test_jupyter_server_gateway_client(gw, jupyter_server):
    port = jupyter_server
    base = f"http://127.0.0.1:{port}"
    h = {"Authorization": "token srvtok", "Content-Type": "application/json"}

    def call(method, path, body=None):
        r = urllib.request.Request(base + path, data=json.dumps(body).encode() if body is not None
                                   else None, method=method, headers=h)
        with urllib.request.urlopen(r, timeout=120) as resp:
            t = resp.read()
            return json.loads(t) if t else None

    specs = call("GET", "/api/kernelspecs")
    assert "kernelmgr-python" in specs["kernelspecs"], specs
    # the agent's session is offered as a kernelspec of its own
    assert "kernelmgr-python--agent" in specs["kernelspecs"], specs
    agent_id = gw.kernel_of("agent")["id"]
    # a notebook session on the agent's live kernel, through the server
    s = call("POST", "/api/sessions", {"path": "agent.ipynb", "type": "notebook",
                                       "kernel": {"name": "kernelmgr-python--agent"}})
    assert s["kernel"]["id"] == agent_id, s
    ks = call("GET", "/api/kernels")
    assert [k for k in ks if k["id"] == agent_id], ks
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}/api/kernels/{agent_id}/channels?token=srvtok", timeout=60)
    try:
        assert wait_ready(ws)["language_info"]["name"] == "python"
        out, reply, _ = execute(ws, "print(x + 1)")
        assert out == "42\n" and reply["status"] == "ok"
    finally:
        ws.close()
    # a kernel started through the server is a kernelmgr session
    s2 = call("POST", "/api/sessions", {"path": "new.ipynb", "type": "notebook",
                                        "kernel": {"name": "kernelmgr-python"}})
    kid = s2["kernel"]["id"]
    st, model = gw.req("GET", f"/api/kernels/{kid}")
    assert st == 200 and model["kernelmgr"]["session"].startswith("jupyter-"), model
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{port}/api/kernels/{kid}/channels?token=srvtok", timeout=60)
    try:
        wait_ready(ws)
        out, reply, _ = execute(ws, "import os; print(os.getcwd() != '', 6 * 7)")
        assert out.strip().endswith("42"), out
    finally:
        ws.close()
    call("DELETE", f"/api/sessions/{s2['id']}")
    # closing the notebook on the agent's kernel leaves the agent's state
    call("DELETE", f"/api/sessions/{s['id']}")
    agent_works(gw)


# ------------------------------------------------------------------ the kernelmgr API over HTTP

def rpc(method, params=None, id=1):
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params or {}}


def test_api_over_http_post(gw):
    st, r = gw.req("POST", "/api/kernelmgr", rpc("exec", {"session": "agent",
                                                          "code": "print(x + 1)"}))
    assert st == 200 and r["id"] == 1, r
    assert "42" in r["result"]["results"][0]["stdout"], r
    st, r = gw.req("POST", "/api/kernelmgr", rpc("files.write", {
        "session": "remote", "path": "a.txt", "content": "hello", "create": True}, id="w"))
    assert st == 200 and r["id"] == "w" and "result" in r, r
    st, r = gw.req("POST", "/api/kernelmgr", rpc("files.read", {"session": "remote",
                                                                "path": "a.txt"}))
    assert r["result"]["content"] == "hello", r
    # the daemon's own validation answers, unchanged
    st, r = gw.req("POST", "/api/kernelmgr", rpc("close", {"session": "remote", "kep": True}))
    assert r["error"]["code"] == -32602 and "kep" in r["error"]["message"], r
    assert gw.req("POST", "/api/kernelmgr", token=None, body=rpc("ping"))[0] == 401
    assert gw.req("GET", "/api/kernelmgr")[0] == 405
    st, r = gw.req("POST", "/api/kernelmgr", raw=b"{not json")
    assert r["error"]["code"] == -32700, r


@pytest.mark.parametrize("method,params,why", [
    ("shutdown", {}, "operator"),
    ("connection_file", {"session": "agent"}, "host path"),
    ("exec", {"session": "s2", "code": "1", "sandbox": "none"}, "sandbox"),
    ("session.create", {"session": "s3", "network": "on"}, "network"),
    ("session.create", {"session": "s4", "workspace": "/etc"}, "workspace"),
    ("session.create", {"session": "s5", "python": "/usr/bin/python3"}, "python"),
    ("exec", {"session": "agent", "code": "1", "raw_text": True}, "raw_text"),
])
def test_api_over_http_refuses_what_relaxes_the_host(gw, method, params, why):
    st, r = gw.req("POST", "/api/kernelmgr", rpc(method, params))
    assert st == 200 and r["error"]["code"] == -32602 and why in r["error"]["message"], r
    # nothing happened: the daemon serves, no such session was made
    listed = json.loads(gw.m.run("sessions", "--json").stdout or "[]")
    names = [s["name"] for s in (listed if isinstance(listed, list) else listed.get("sessions", []))]
    assert not {"s2", "s3", "s4", "s5"} & set(names), names
    agent_works(gw)


def test_api_over_websocket_streams_exec_events(gw):
    ws = websocket.create_connection(gw.url.replace("http", "ws", 1) + "/api/kernelmgr/ws",
                                     header=[f"Authorization: token {gw.token}"], timeout=60)
    try:
        ws.send(json.dumps(rpc("exec", {"session": "agent", "stream": True,
                                        "code": "for i in range(3): print('line', i, flush=True)"},
                               id=7)))
        events, resp = [], None
        while resp is None:
            m = json.loads(ws.recv())
            if m.get("method") == "event":
                events.append(m["params"])
            elif m.get("id") == 7:
                resp = m
        assert resp["result"]["results"][0]["stdout"] == "line 0\nline 1\nline 2\n", resp
        text = "".join(e.get("text", "") for e in events if e["event"] == "stream")
        assert "line 2" in text and all(e["request_id"] == 7 for e in events), events
        ws.send(json.dumps(rpc("shutdown", id=8)))
        m = json.loads(ws.recv())
        assert m["id"] == 8 and m["error"]["code"] == -32602, m
    finally:
        ws.close()
    agent_works(gw)


def test_websocket_follows_a_restart_made_by_the_agent(gw):
    """A kernel restarted by someone else (here the agent's CLI) has new
    endpoints; an open WebSocket follows it and keeps working."""
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"])
    try:
        out, reply, _ = execute(ws, "print(x + 1)")
        assert out == "42\n"
        before = gw.kernel_of("agent")["kernelmgr"]["pid"]
        p = gw.m.run("restart", "agent")
        assert p.returncode == 0, p.stderr
        assert gw.kernel_of("agent")["kernelmgr"]["pid"] != before
        wait_ready(ws)  # answered by the new kernel, through the same connection
        out, reply, _ = execute(ws, "print('x' in globals())")
        assert out == "False\n" and reply["status"] == "ok", (out, reply)
    finally:
        ws.close()
    agent_works(gw, "x = 41; print(x + 1)")


def test_two_binaries_exec_never_loads_the_gateway(gw):
    """`kernelmgr` (what every `exec` runs) is built without libwebsockets
    and OpenSSL; the daemon serving HTTP is kernelmgr-gateway, which the
    `serve` command became (same process, exec'd)."""
    libs = subprocess.run(["ldd", mgrutil.KM], capture_output=True, text=True,
                          check=True).stdout
    for lib in ("libwebsockets", "libssl", "libcrypto"):
        assert lib not in libs, libs
    pid = gw.m.daemon_pid()
    assert pid
    exe = os.readlink(f"/proc/{pid}/exe")
    assert os.path.basename(exe) == "kernelmgr-gateway", exe
    assert os.path.dirname(exe) == os.path.dirname(os.path.realpath(mgrutil.KM))
    # the agent's session works through the CLI after all that
    rc, res, p = gw.m.exec("agent", "print(x + 1)")
    assert rc == 0 and res[-1]["stdout"] == "42\n", (p.stderr, res)


def test_serve_http_without_the_gateway_binary_says_so(tmp_path):
    """A kernelmgr copied somewhere without kernelmgr-gateway beside it:
    `serve --http` fails at once, naming the missing binary."""
    km = tmp_path / "kernelmgr"
    shutil.copy2(mgrutil.KM, km)
    home = tempfile.mkdtemp(prefix="kmg", dir="/tmp")
    try:
        p = subprocess.run([str(km), "serve", "--http", "127.0.0.1:0"], capture_output=True,
                           text=True, timeout=60,
                           env=dict(os.environ, KERNELMGR_HOME=home))
        assert p.returncode != 0
        assert f"serving HTTP needs {tmp_path}/kernelmgr-gateway" in p.stderr, p.stderr
        assert "No such file or directory" in p.stderr, p.stderr
        assert not os.path.exists(os.path.join(home, "kernelmgr.sock"))
    finally:
        shutil.rmtree(home, ignore_errors=True)
