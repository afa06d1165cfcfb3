"""README "When a client goes away": whichever front end a cell came from,
a client that goes away (its process killed, its socket closed, MCP's stdin
closed) does not interrupt it; the cell runs to its end and its result goes
to the session's history (and `export`). Only an explicit interrupt stops
it (covered by the interrupt and cancellation tests).

Each cell marks when it has begun (a file in the workspace), so the client
is made to go away on that condition, then sleeps briefly and writes its
result file: the test polls for that file and for the finished cell in the
history and the exported notebook.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mgrutil import KM, have_kernel  # noqa: E402
import kutil  # noqa: E402

pytestmark = pytest.mark.skipif(not have_kernel("python"), reason="kernels not built")

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"
CLIENT = NODE_DIR / "mcp_client.mjs"


def cell(tag):
    return (f"import pathlib, time\npathlib.Path('{tag}.began').write_text('1')\n"
            f"time.sleep(1.5)\npathlib.Path('{tag}.done').write_text('finished')\n"
            f"print('{tag} finished')")


def workspace(mgr, session):
    """The session's workspace, starting its daemon and kernel."""
    rc, res, p = mgr.exec(session, "w = 1", "--lang", "python")
    assert rc == 0 and res[0]["status"] == "ok", (p.stdout, p.stderr)
    p = mgr.run("sessions", "--json")
    assert p.returncode == 0, p.stderr
    for line in p.stdout.splitlines():
        if not line.startswith("{") and not line.startswith("["):
            continue
        o = json.loads(line)
        for s in (o.get("sessions", o) if isinstance(o, dict) else o):
            if isinstance(s, dict) and s.get("name") == session:
                return Path(s["workspace"])
    raise AssertionError(f"session {session} not listed: {p.stdout}")


def finished_record(mgr, session, tag):
    path = mgr.home / "sessions" / session / "history.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        try:
            h = json.loads(line)
        except ValueError:
            continue
        if h.get("event") == "finished" and f"{tag}.done" in json.dumps(h):
            return h
    return None


def assert_ran_to_its_end(mgr, session, ws, tag):
    """The cell's file appears, its finished record says ok (not
    interrupted), the exported notebook has it with its output, and the
    session still works."""
    kutil.poll_until(lambda: (ws / f"{tag}.done").exists(), bool, deadline=120,
                     msg=f"{tag}.done to appear in the workspace")
    assert (ws / f"{tag}.done").read_text() == "finished"
    h = kutil.poll_until(lambda: finished_record(mgr, session, tag), bool, deadline=60,
                         msg=f"the finished record of the {tag} cell in the history")
    text = json.dumps(h)
    assert "KeyboardInterrupt" not in text and "Timeout" not in text, h
    status = h.get("status") or (h.get("result") or {}).get("status")
    assert status == "ok", h
    p = mgr.run("export", session, "-o", "-")
    assert p.returncode == 0, p.stderr
    nb = json.loads(p.stdout)
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"
             and f"{tag}.done" in "".join(c["source"])]
    assert cells, [c.get("source") for c in nb["cells"]]
    outs = json.dumps(cells[-1]["outputs"])
    assert f"{tag} finished" in outs and "KeyboardInterrupt" not in outs, outs
    rc, res, p = mgr.exec(session, "print(w + 1)", "--lang", "python")
    assert rc == 0 and res[0]["stdout"] == "2\n", (p.stdout, p.stderr)


def wait_began(ws, tag):
    kutil.poll_until(lambda: (ws / f"{tag}.began").exists(), bool, deadline=120,
                     msg=f"the {tag} cell to begin")


def mcp_server_of(node_pid):
    """The pid of `kernelmgr mcp` started by the SDK client node_pid."""
    for c in kutil.children_of(node_pid):
        try:
            cmd = Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mcp" in cmd:
            return c
    return None


def test_mcp_sdk_client_killed_mid_cell(make_mgr):
    if not shutil.which("node") or \
            not (NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail("node and the MCP SDK are needed (make deps)")
    mgr = make_mgr()
    ws = workspace(mgr, "gone")
    steps = [{"op": "call", "name": "code_exec", "timeout_ms": 120000,
              "arguments": {"code": cell("mcp"), "language": "python", "session": "gone"}}]
    node = subprocess.Popen(["node", str(CLIENT), KM, json.dumps(steps), "[]"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=mgr.env, cwd=NODE_DIR)
    server = None
    try:
        server = kutil.poll_until(lambda: mcp_server_of(node.pid), bool, deadline=60,
                                  msg="the SDK client to start kernelmgr mcp")
        wait_began(ws, "mcp")
        # the client dies: the server's stdin ends and nobody reads its stdout
        node.kill()
        node.wait()
        assert_ran_to_its_end(mgr, "gone", ws, "mcp")
        # the server does not stay behind (an orphan now): it exits
        assert not kutil.wait_dead([server], timeout=30), "kernelmgr mcp did not exit"
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
        if server:
            kutil.kill_left([server], timeout=0)


def test_mcp_stdin_closed_mid_cell_still_answers_and_exits(make_mgr):
    """Only stdin closes, the client still reads: the cell runs to its end,
    its answer is written, then the server exits."""
    mgr = make_mgr()
    ws = workspace(mgr, "gone")
    p = subprocess.Popen([KM, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=mgr.env)
    try:
        req = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
               "params": {"name": "code_exec",
                          "arguments": {"code": cell("eof"), "language": "python",
                                        "session": "gone"}}}
        p.stdin.write((json.dumps(req) + "\n").encode())
        p.stdin.flush()
        wait_began(ws, "eof")
        out, err = p.communicate(timeout=120)  # closes stdin, reads on
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    answers = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert [a.get("id") for a in answers] == [7], answers
    res = answers[0]["result"]
    assert res["isError"] is False, res
    assert "eof finished" in json.dumps(res), res
    assert_ran_to_its_end(mgr, "gone", ws, "eof")


def test_socket_client_disconnects_mid_cell(make_mgr):
    mgr = make_mgr()
    ws = workspace(mgr, "gone")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(mgr.home / "kernelmgr.sock"))
    req = {"jsonrpc": "2.0", "id": 1, "method": "exec",
           "params": {"session": "gone", "lang": "python", "code": cell("sock"),
                      "stream": True}}
    s.sendall((json.dumps(req) + "\n").encode())
    try:
        wait_began(ws, "sock")
    finally:
        s.close()
    assert_ran_to_its_end(mgr, "gone", ws, "sock")


def test_cli_killed_mid_cell(make_mgr):
    mgr = make_mgr()
    ws = workspace(mgr, "gone")
    p = subprocess.Popen([KM, "exec", "--session", "gone", "--lang", "python", "-c",
                          cell("cli")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=mgr.env)
    try:
        wait_began(ws, "cli")
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert_ran_to_its_end(mgr, "gone", ws, "cli")


# ------------------------------------------------------------------ the gateway's WebSockets


def gateway(mgr):
    """(base URL, token) of the gateway the daemon of mgr serves."""
    def info():
        try:
            return json.loads((mgr.home / "http.json").read_text())
        except (OSError, ValueError):
            return None
    i = kutil.poll_until(info, lambda v: v is not None, deadline=60, msg="http.json written")
    return i["url"].rstrip("/"), (mgr.home / "http-token").read_text().strip()


def test_api_websocket_closed_mid_cell(make_mgr):
    websocket = pytest.importorskip("websocket")
    mgr = make_mgr({"http": "127.0.0.1:0"})
    ws = workspace(mgr, "gone")
    url, token = gateway(mgr)
    conn = websocket.create_connection(url.replace("http", "ws", 1) + "/api/kernelmgr/ws",
                                       header=[f"Authorization: token {token}"], timeout=60)
    try:
        conn.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "exec",
                              "params": {"session": "gone", "lang": "python", "stream": True,
                                         "code": cell("apiws")}}))
        wait_began(ws, "apiws")
    finally:
        conn.close()
    assert_ran_to_its_end(mgr, "gone", ws, "apiws")


def test_kernel_websocket_closed_mid_cell(make_mgr):
    """A Jupyter frontend's cell (the kernel's channels) runs on in its
    kernel when the WebSocket closes: it is not interrupted."""
    websocket = pytest.importorskip("websocket")
    import urllib.request
    import uuid
    mgr = make_mgr({"http": "127.0.0.1:0"})
    ws = workspace(mgr, "gone")
    url, token = gateway(mgr)
    r = urllib.request.Request(url + "/api/kernels",
                               headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(r, timeout=60) as resp:
        kernels = json.loads(resp.read())
    kid = [k for k in kernels if k["kernelmgr"]["session"] == "gone"
           and k["kernelmgr"]["language"] == "python"][0]["id"]
    conn = websocket.create_connection(url.replace("http", "ws", 1) +
                                       f"/api/kernels/{kid}/channels",
                                       header=[f"Authorization: token {token}"], timeout=60)
    try:
        conn.send(json.dumps({
            "header": {"msg_id": uuid.uuid4().hex, "msg_type": "execute_request",
                       "session": "ws", "username": "test", "date": "2026-12-01T00:00:00Z",
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": cell("kws"), "silent": False, "store_history": True,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        wait_began(ws, "kws")
    finally:
        conn.close()
    kutil.poll_until(lambda: (ws / "kws.done").exists(), bool, deadline=120,
                     msg="kws.done to appear in the workspace")
    rc, res, p = mgr.exec("gone", "print(w + 1)", "--lang", "python")
    assert rc == 0 and res[0]["stdout"] == "2\n", (p.stdout, p.stderr)
    assert "KeyboardInterrupt" not in json.dumps(res)
