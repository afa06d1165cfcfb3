"""One history and one queue for every front end: cells a Jupyter frontend
runs over a gateway kernel WebSocket reach the session's history (and so
`export`) like the CLI's and MCP's, in the order the kernel ran them; an
agent's exec that waits for such a cell says so (`waited`, "for":
"websocket"); a cell whose WebSocket client vanished still finishes in the
history. Real daemon, gateway, kernels, MCP server and WebSocket client; no
fixed sleeps (a cell that must run long waits for a file the test
creates)."""
import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
from kutil import poll_until as poll  # noqa: E402
from test_gateway import GW, execute, msg, wait_ready  # noqa: E402
from test_mgr_lifecycle import ask  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="no kernel-python")


@pytest.fixture
def gw(make_mgr):
    return GW(make_mgr)


def export(m, session="agent"):
    p = m.run("export", session, "-o", "-")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def cells(nb):
    """[(source, outputs text)] of the notebook's code cells."""
    out = []
    for c in nb["cells"]:
        if c["cell_type"] != "code":
            continue
        src = c["source"] if isinstance(c["source"], str) else "".join(c["source"])
        text = ""
        for o in c["outputs"]:
            if o["output_type"] == "stream":
                text += o["text"] if isinstance(o["text"], str) else "".join(o["text"])
            elif o["output_type"] == "error":
                text += f"{o['ename']}: {o['evalue']}"
            elif o["output_type"] == "execute_result":
                d = o["data"].get("text/plain", "")
                text += d if isinstance(d, str) else "".join(d)
        out.append((src, text))
    return out


def history(m, session="agent"):
    lines = []
    try:
        raw = (m.home / "sessions" / session / "history.jsonl").read_text()
    except OSError:
        return lines
    for line in raw.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            pass
    return lines


def workspace(m, session="agent"):
    p = m.run("sessions", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    ss = data["sessions"] if isinstance(data, dict) else data
    for s in ss:
        if s["name"] == session:
            return Path(s["workspace"])
    raise AssertionError(f"no session {session}: {data}")


class MCP:
    """The MCP server on plain pipes (JSON-RPC lines), its handshake done."""

    def __init__(self, m):
        self.p = subprocess.Popen([mgrutil.KM, "mcp"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=m.env)
        self.n = 0
        r = self.ask("initialize", {"protocolVersion": "2025-03-26", "capabilities": {},
                                    "clientInfo": {"name": "t", "version": "0"}})
        assert "result" in r, r
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, m):
        self.p.stdin.write(json.dumps(m).encode() + b"\n")
        self.p.stdin.flush()

    def ask(self, method, params, timeout=120):
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        end = time.monotonic() + timeout
        while True:
            r, _, _ = select.select([self.p.stdout], [], [], max(0, end - time.monotonic()))
            assert r, f"no answer to {method} in {timeout} s"
            line = self.p.stdout.readline()
            assert line, "the MCP server closed stdout: " + self.p.stderr.read().decode()
            a = json.loads(line)
            if a.get("id") == self.n:
                return a

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(30)
        finally:
            if self.p.poll() is None:
                self.p.kill()
        self.p.stdout.close()
        self.p.stderr.close()


def send_cell(ws, code):
    m = msg("execute_request", {"code": code, "silent": False, "store_history": True,
                                "user_expressions": {}, "allow_stdin": False,
                                "stop_on_error": True})
    ws.send(json.dumps(m))
    return m["header"]["msg_id"]


def wait_busy(ws, mid, deadline=60):
    """Reads the WebSocket until the kernel says it runs request mid."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        r = json.loads(ws.recv())
        if (r["channel"] == "iopub" and r["parent_header"].get("msg_id") == mid
                and r["header"]["msg_type"] == "execute_input"):
            return
    raise AssertionError("the kernel never started the WebSocket's cell")


def finish_all(ws, mids, deadline=60):
    """Reads the WebSocket until each request of mids has its reply and idle
    (they come on different channels, and one request's reply may come
    after the next one's output): {mid: (stdout text, reply content)}."""
    got = {mid: ["", None, False] for mid in mids}
    end = time.monotonic() + deadline
    while not all(g[1] and g[2] for g in got.values()):
        assert time.monotonic() < end, f"no reply and idle for the WebSocket's cells: {got}"
        m = json.loads(ws.recv())
        g = got.get(m["parent_header"].get("msg_id"))
        if g is None:
            continue
        t = m["header"]["msg_type"]
        if t == "stream":
            g[0] += m["content"]["text"]
        elif t == "status" and m["content"]["execution_state"] == "idle":
            g[2] = True
        elif t == "execute_reply":
            g[1] = m["content"]
    return {mid: (g[0], g[1]) for mid, g in got.items()}


def finish(ws, mid, deadline=60):
    """finish_all for one request: (stdout text, reply content)."""
    return finish_all(ws, [mid], deadline)[mid]


# Waits for a file of the workspace the test creates: a cell that runs as
# long as the test needs, with no fixed sleep on either side.
WAIT_FOR = ("import os, time\n"
            "while not os.path.exists({flag!r}):\n"
            "    time.sleep(0.02)\n"
            "print({say!r})")


def test_export_holds_cli_mcp_and_websocket_cells_in_order(gw):
    # cell 1 (CLI): GW's "x = 41"
    mcp = MCP(gw.m)
    try:
        r = mcp.ask("tools/call", {"name": "code_exec",
                                   "arguments": {"session": "agent", "code": "print('from-mcp')"}})
        assert "result" in r and not r["result"].get("isError"), r
    finally:
        mcp.close()
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"])
    try:
        wait_ready(ws)
        out, reply, _ = execute(ws, "print('from-ws', x)")
        assert reply["status"] == "ok" and "from-ws 41" in out, (out, reply)
        out, reply, _ = execute(ws, "raise ValueError('ws-boom')")
        assert reply["status"] == "error", reply
        # recorded without another exec coming: the manager follows the
        # kernel's IOPub while the session is idle
        poll(lambda: [h for h in history(gw.m) if h.get("event") == "finished"
                      and "ws-boom" in h.get("code", "")],
             bool, 30, "the WebSocket's failed cell in the history")
        rc, res, p = gw.m.exec("agent", "print('from-cli', x + 1)")
        assert rc == 0 and "from-cli 42" in res[0]["stdout"], (p.stderr, res)
        assert "waited" not in res[0], res[0]  # the kernel was free
        out, reply, _ = execute(ws, "y = 'after'; print('ws-again', y)")
        assert reply["status"] == "ok", reply
    finally:
        ws.close()

    want = [("x = 41", ""), ("print('from-mcp')", "from-mcp"),
            ("print('from-ws', x)", "from-ws 41"),
            ("raise ValueError('ws-boom')", "ValueError: ws-boom"),
            ("print('from-cli', x + 1)", "from-cli 42"),
            ("y = 'after'; print('ws-again', y)", "ws-again after")]

    def got():
        return cells(export(gw.m))

    cs = poll(got, lambda c: len(c) >= len(want), 30, "every cell exported")
    assert [c[0] for c in cs] == [w[0] for w in want], cs
    for (src, text), (_, expect) in zip(cs, want):
        assert expect in text, (src, text)
    # each cell once, started before finished, the WebSocket's named
    hs = history(gw.m)
    by_id = {}
    for h in hs:
        by_id.setdefault(h.get("id"), []).append(h.get("event"))
    assert all(ev == ["started", "finished"] for ev in by_id.values()), hs
    ws_cells = [h for h in hs if h.get("event") == "finished" and h.get("client") == "websocket"]
    assert len(ws_cells) == 3, hs
    clients = [c["metadata"]["kernelmgr"].get("client") for c in export(gw.m)["cells"]
               if c["cell_type"] == "code"]
    assert clients == [None, None, "websocket", "websocket", None, "websocket"], clients
    assert all(h["execution_count"] for h in ws_cells), ws_cells
    # the agent's session still works
    rc, res, p = gw.m.exec("agent", "print(y)")
    assert rc == 0 and "after" in res[0]["stdout"], (p.stderr, res)


def test_exec_waits_for_a_websocket_cell_and_says_so(gw):
    flag = workspace(gw.m) / "go"
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"])
    agent = None
    try:
        wait_ready(ws)
        code = WAIT_FOR.format(flag="go", say="ws-finished")
        mid = send_cell(ws, code)
        wait_busy(ws, mid)
        err = gw.m.home / "agent.err"
        with open(err, "w") as ef:
            agent = subprocess.Popen([mgrutil.KM, "exec", "--session", "agent", "-c",
                                      "print('agent-ran', x)", "--json"],
                                     stdout=subprocess.PIPE, stderr=ef, text=True, env=gw.m.env)
        # the exec is waiting (its notice says for whom), not queued unseen
        poll(lambda: err.read_text(), lambda t: "WebSocket" in t, 60,
             "the exec's notice that it waits for the WebSocket's cell")
        assert agent.poll() is None
        flag.write_text("")
        out, _ = agent.communicate(timeout=120)
        res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert agent.returncode == 0 and "agent-ran 41" in res[0]["stdout"], (out, err.read_text())
        w = res[0]["waited"]
        assert w["for"] == "websocket" and w["seconds"] > 0, w
        assert "WebSocket" in w["message"], w
    finally:
        if agent and agent.poll() is None:
            agent.kill()
        ws.close()
    srcs = [c[0] for c in cells(export(gw.m))]
    assert srcs.index(code) < srcs.index("print('agent-ran', x)"), srcs


def test_websocket_client_vanishes_mid_cell_its_cell_is_in_the_history(gw):
    flag = workspace(gw.m) / "go2"
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"])
    try:
        wait_ready(ws)
        code = WAIT_FOR.format(flag="go2", say="finished-alone")
        mid = send_cell(ws, code)
        wait_busy(ws, mid)
    finally:
        # gone without a close handshake
        ws.sock.shutdown(2)
        ws.sock.close()
    started = poll(lambda: [h for h in history(gw.m) if h.get("code") == code], bool, 30,
                   "the vanished client's cell started in the history")
    assert started[0]["event"] == "started" and started[0]["client"] == "websocket", started
    flag.write_text("")
    done = poll(lambda: [h for h in history(gw.m) if h.get("code") == code
                         and h.get("event") == "finished"], bool, 60,
                "the vanished client's cell finished in the history")
    assert done[0]["status"] == "ok", done
    assert any("finished-alone" in o.get("text", "") for o in done[0]["outputs"]), done
    nb = cells(export(gw.m))
    assert (code, "finished-alone\n") in nb, nb
    rc, res, p = gw.m.exec("agent", "print(x + 1)")
    assert rc == 0 and "42" in res[0]["stdout"] and "waited" not in res[0], (p.stderr, res)


def test_exec_that_waits_past_its_timeout_is_not_run_and_leaves_the_other_cell(gw):
    flag = workspace(gw.m) / "go3"
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"])
    try:
        wait_ready(ws)
        code = WAIT_FOR.format(flag="go3", say="ws-kept")
        mid = send_cell(ws, code)
        wait_busy(ws, mid)
        rc, res, p = gw.m.exec("agent", "print('never')", "--timeout", "1")
        assert rc == 1, (p.stderr, res)
        r = res[0]
        assert r["status"] == "timeout" and r["error"]["name"] == "Timeout", r
        assert "WebSocket" in r["error"]["value"] and "not run" in r["error"]["value"], r
        assert r["waited"]["for"] == "websocket" and r["waited"]["seconds"] >= 1, r
        assert "never" not in r["stdout"]
        # the WebSocket's cell was left running, not interrupted
        flag.write_text("")
        out, reply = finish(ws, mid)
        assert reply["status"] == "ok" and "ws-kept" in out, (reply, out)
    finally:
        ws.close()
    srcs = [c[0] for c in cells(export(gw.m))]
    assert "print('never')" not in srcs, srcs
    agent_ok = gw.m.exec("agent", "print(x + 1)")
    assert agent_ok[0] == 0 and "42" in agent_ok[1][0]["stdout"], agent_ok[2].stderr


def test_websocket_cells_of_a_session_from_the_warm_pool_reach_its_history(make_mgr):
    """A warm-pool entry's kernels become a named session's: their cells
    from a WebSocket go to that session's history, not the entry's."""
    gw = GW(make_mgr, pool=1)
    poll(lambda: ask(gw.m, "ping")["pool"], lambda p: p["ready"] == 1, 120, "the pool is ready")
    rc, res, p = gw.m.exec("warm", "w = 7")
    assert rc == 0, p.stderr
    ss = json.loads(gw.m.run("sessions", "--json").stdout)
    assert [s for s in ss if s["name"] == "warm"][0]["from_pool"] is True, ss
    ws = gw.ws(gw.kernel_of("warm")["id"])
    try:
        wait_ready(ws)
        out, reply, _ = execute(ws, "print('pooled', w * 6)")
        assert reply["status"] == "ok" and "pooled 42" in out, (out, reply)
    finally:
        ws.close()
    cs = poll(lambda: cells(export(gw.m, "warm")), lambda c: len(c) == 2, 30,
              "the WebSocket's cell in the pooled session's export")
    assert cs == [("w = 7", ""), ("print('pooled', w * 6)", "pooled 42\n")], cs


def test_kernel_running_a_websocket_cell_is_not_culled(make_mgr):
    """idle_timeout passes while a WebSocket's silent cell runs: its kernel
    is in use, not culled under it (a session idle for as long is)."""
    gw = GW(make_mgr, idle_timeout=2)
    flag = workspace(gw.m) / "go4"
    code = WAIT_FOR.format(flag="go4", say="not-culled")

    def start():
        # the agent's kernel may itself be culled before the cell starts on
        # a loaded machine: then again
        rc, _, p = gw.m.exec("agent", "pass")
        assert rc == 0, p.stderr
        k = gw.kernel_of("agent")
        if not k:
            return None
        try:
            ws = gw.ws(k["id"])
            wait_ready(ws, deadline=10)
            mid = send_cell(ws, code)
            wait_busy(ws, mid, deadline=10)
            return ws, mid
        except Exception:
            return None

    ws, mid = poll(start, bool, 120, "the WebSocket's cell started")
    try:
        pid = gw.kernel_of("agent")["kernelmgr"]["pid"]
        # a session used after the cell started, then idle: once it is
        # culled, the agent's kernel was due too had it been idle
        rc, _, p = gw.m.exec("other", "pass")
        assert rc == 0, p.stderr

        def other_python():
            ss = json.loads(gw.m.run("sessions", "--json").stdout)
            o = [s for s in ss if s["name"] == "other"][0]
            return (o.get("kernels") or {}).get("python")

        poll(other_python, lambda k: not k or not k.get("pid"), 60, "the idle session culled")
        k = gw.kernel_of("agent")
        assert k and k["kernelmgr"]["pid"] == pid, k
        flag.write_text("")
        out, reply = finish(ws, mid)
        assert reply["status"] == "ok" and "not-culled" in out, (reply, out)
    finally:
        ws.close()


def test_interrupt_ends_the_wait_not_the_websocket_cell(gw):
    flag = workspace(gw.m) / "go5"
    ws = gw.ws(gw.kernel_of("agent")["id"])
    agent = None
    try:
        wait_ready(ws)
        code = WAIT_FOR.format(flag="go5", say="still-mine")
        mid = send_cell(ws, code)
        wait_busy(ws, mid)
        err = gw.m.home / "agent5.err"
        with open(err, "w") as ef:
            agent = subprocess.Popen([mgrutil.KM, "exec", "--session", "agent", "-c",
                                      "print('agent-interrupted')", "--json"],
                                     stdout=subprocess.PIPE, stderr=ef, text=True, env=gw.m.env)
        poll(lambda: err.read_text(), lambda t: "WebSocket" in t, 60, "the exec waits")
        p = gw.m.run("interrupt", "agent")
        assert p.returncode == 0, p.stderr
        out, _ = agent.communicate(timeout=120)
        res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        r = res[0]
        assert r["status"] == "error" and r["error"]["name"] == "Interrupted", r
        assert r["waited"]["for"] == "websocket", r
        assert "agent-interrupted" not in r["stdout"]
        flag.write_text("")
        out, reply = finish(ws, mid)
        assert reply["status"] == "ok" and "still-mine" in out, (reply, out)
    finally:
        if agent and agent.poll() is None:
            agent.kill()
        ws.close()


def test_attached_jupyter_client_cells_are_in_the_history(gw):
    """jupyter_client on the connection file (as `jupyter console
    --existing`): its cells too, named "jupyter" (its msg_ids are longer
    than a UUID)."""
    from jupyter_client import BlockingKernelClient
    p = gw.m.run("connection-file", "agent", "--lang", "python")
    assert p.returncode == 0, p.stderr
    kc = BlockingKernelClient(connection_file=p.stdout.strip())
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive("print('console', x)", timeout=60,
                                       output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok", reply
    finally:
        kc.stop_channels()
    rc, res, p = gw.m.exec("agent", "print('agent', x + 1)")
    assert rc == 0 and "agent 42" in res[0]["stdout"] and "waited" not in res[0], (p.stderr, res)
    nb = export(gw.m)
    cs = cells(nb)
    assert cs == [("x = 41", ""), ("print('console', x)", "console 41\n"),
                  ("print('agent', x + 1)", "agent 42\n")], cs
    assert nb["cells"][1]["metadata"]["kernelmgr"]["client"] == "jupyter", nb["cells"][1]


def test_cells_a_frontend_queued_run_before_the_waiting_exec_in_history_order(gw):
    """A frontend sends two cells at once (both wait in the kernel's shell
    queue); an agent's exec arriving during the first waits for both, and
    the history has them in the order the kernel ran them."""
    flag = workspace(gw.m) / "go6"
    ws = gw.ws(gw.kernel_of("agent")["id"])
    agent = None
    try:
        wait_ready(ws)
        first = WAIT_FOR.format(flag="go6", say="first")
        a = send_cell(ws, first)
        b = send_cell(ws, "print('second')")
        wait_busy(ws, a)
        err = gw.m.home / "agent6.err"
        with open(err, "w") as ef:
            agent = subprocess.Popen([mgrutil.KM, "exec", "--session", "agent", "-c",
                                      "print('third')", "--json"],
                                     stdout=subprocess.PIPE, stderr=ef, text=True, env=gw.m.env)
        poll(lambda: err.read_text(), lambda t: "WebSocket" in t, 60, "the exec waits")
        flag.write_text("")
        out, _ = agent.communicate(timeout=120)
        res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert agent.returncode == 0 and res[0]["stdout"] == "third\n", (out, err.read_text())
        assert res[0]["waited"]["for"] == "websocket" and res[0]["waited"]["seconds"] > 0, res
        done = finish_all(ws, [a, b])
        for mid, say in ((a, "first"), (b, "second")):
            text, reply = done[mid]
            assert reply["status"] == "ok" and say in text, (say, reply, text)
    finally:
        if agent and agent.poll() is None:
            agent.kill()
        ws.close()
    cs = cells(export(gw.m))
    assert [c[0] for c in cs[-3:]] == [first, "print('second')", "print('third')"], cs
    assert [c[1] for c in cs[-3:]] == ["first\n", "second\n", "third\n"], cs
