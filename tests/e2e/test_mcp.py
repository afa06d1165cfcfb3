"""`kernelmgr mcp` driven by the official MCP TypeScript SDK client
(tests/node/mcp_client.mjs: Client + StdioClientTransport), plus raw JSON-RPC
lines over pipes for what a well-behaved client never sends."""
import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import mgrutil

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "tests" / "node"
CLIENT = NODE_DIR / "mcp_client.mjs"

TOOLS = {"code_exec", "list_files", "read_file", "write_file", "list_sessions",
         "restart_session", "close_session", "install_packages", "snapshot_session",
         "fork_session"}


@pytest.fixture
def mgr():
    m = mgrutil.Mgr()
    yield m
    m.close()


def need_sdk():
    if not shutil.which("node"):
        pytest.fail("node is not installed (make deps)")
    if not (NODE_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
        pytest.fail("the MCP SDK is not installed in tests/node (make deps runs npm install)")


def need_kernel(lang):
    if not mgrutil.have_kernel(lang):
        pytest.fail(f"build/kernel-{lang} is missing")


def sdk(mgr, steps, server_args=(), timeout=180):
    """Runs the SDK client with steps; returns its JSON report."""
    need_sdk()
    p = subprocess.run(["node", str(CLIENT), mgrutil.KM, json.dumps(steps),
                        json.dumps(list(server_args))],
                       capture_output=True, text=True, env=mgr.env, timeout=timeout, cwd=NODE_DIR)
    assert p.stdout.strip(), f"no output from the client; stderr:\n{p.stderr[-3000:]}"
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert "fatal" not in out, out["fatal"] + "\n" + p.stderr[-3000:]
    out["stderr"] = p.stderr
    return out


def call(name, args, **kw):
    return {"op": "call", "name": name, "arguments": args, **kw}


def text_of(result):
    return "\n".join(c["text"] for c in result["content"] if c["type"] == "text")


def ok_result(step):
    assert step["ok"], step
    return step["result"]


# ------------------------------------------------------------------ handshake


def test_initialize_and_list_tools(mgr):
    out = sdk(mgr, [{"op": "list_tools"}, {"op": "ping"}])
    assert out["server"]["name"] == "kernelmgr"
    assert "code_exec" in out["instructions"]
    assert out["capabilities"]["tools"] is not None
    tools = {t["name"]: t for t in ok_result(out["steps"][0])["tools"]}
    assert set(tools) == TOOLS
    for t in tools.values():
        assert t["inputSchema"]["type"] == "object"
        assert len(t["description"]) > 40, t["name"]
    ce = tools["code_exec"]["inputSchema"]
    assert ce["required"] == ["code"]
    # no enum: the daemon knows its languages (a configured one too, lang.h)
    assert "enum" not in ce["properties"]["language"]
    assert all(w in ce["properties"]["language"]["description"]
               for w in ("python", "bash", "auto"))
    # the session options (applied when the call creates the session); no
    # host path (python, workspace): the model never names one
    assert set(ce["properties"]) == {"code", "language", "session", "timeout_s", "env",
                                     "network", "memory", "cpus", "cpu_time", "sandbox",
                                     "snapshot_max", "zygote", "ipython"}
    assert ce["properties"]["env"]["additionalProperties"] == {"type": "string"}
    assert tools["install_packages"]["inputSchema"]["properties"]["manager"]["enum"] == \
        ["pip", "npm"]
    assert out["steps"][1]["ok"]


# ------------------------------------------------------------------ code_exec


def test_code_exec_keeps_state_across_calls_and_connections(mgr):
    need_kernel("python")
    out = sdk(mgr, [
        call("code_exec", {"code": "x = 41\nimport math", "language": "python", "session": "st"}),
        call("code_exec", {"code": "print('x is', x + 1)\nmath.sqrt(16)", "session": "st"}),
    ])
    r1, r2 = (ok_result(s) for s in out["steps"])
    assert r1["isError"] is False
    assert r2["isError"] is False
    assert "x is 42" in text_of(r2)
    block = r2["structuredContent"]["blocks"][0]
    assert block["language"] == "python"
    assert block["stdout"] == "x is 42\n"
    assert block["result"]["text/plain"] == "4.0"
    assert r2["structuredContent"]["session"] == "st"
    # A second MCP connection (a new server process) sees the same session:
    # the state lives in the daemon.
    out = sdk(mgr, [call("code_exec", {"code": "x * 2", "session": "st",
                                       "language": "python"})])
    r3 = ok_result(out["steps"][0])
    assert r3["structuredContent"]["blocks"][0]["result"]["text/plain"] == "82"
    # Another session does not.
    out = sdk(mgr, [call("code_exec", {"code": "print('x' in globals())", "session": "other",
                                       "language": "python"})])
    assert "False" in text_of(ok_result(out["steps"][0]))


def test_code_exec_markdown_fences(mgr):
    need_kernel("python")
    need_kernel("bash")
    md = ("Some prose first.\n\n```python\nv = 6 * 7\nprint('py', v)\n```\n\n"
          "Then a shell step:\n\n```bash\necho \"sh $((40 + 2))\" > out.txt; cat out.txt\n```\n")
    out = sdk(mgr, [call("code_exec", {"code": md, "session": "md"})])
    r = ok_result(out["steps"][0])
    assert r["isError"] is False, text_of(r)
    blocks = r["structuredContent"]["blocks"]
    assert [b["language"] for b in blocks] == ["python", "bash"]
    assert blocks[0]["stdout"] == "py 42\n"
    assert blocks[1]["stdout"] == "sh 42\n"
    assert any(f["path"] == "out.txt" and f["change"] == "created" for f in blocks[1]["files"])
    t = text_of(r)
    assert "py 42" in t and "sh 42" in t and "out.txt" in t


def test_code_exec_error_sets_is_error(mgr):
    need_kernel("python")
    out = sdk(mgr, [
        call("code_exec", {"code": "def f():\n    return 1 / 0\nf()", "language": "python",
                           "session": "err"}),
        call("code_exec", {"code": "print('still alive')", "language": "python",
                           "session": "err"}),
        call("code_exec", {"code": "print(1)", "language": "cobol"}),
        call("code_exec", {"language": "python"}),
        call("no_such_tool", {}),
    ])
    r = ok_result(out["steps"][0])
    assert r["isError"] is True
    t = text_of(r)
    assert "ZeroDivisionError" in t and "traceback" in t
    b = r["structuredContent"]["blocks"][0]
    assert b["status"] == "error"
    assert b["error"]["name"] == "ZeroDivisionError"
    r2 = ok_result(out["steps"][1])
    assert r2["isError"] is False and "still alive" in text_of(r2)
    # Bad arguments: a tool error the model can read, not a protocol error.
    bad = ok_result(out["steps"][2])
    assert bad["isError"] is True and "language" in text_of(bad)
    bad = ok_result(out["steps"][3])
    assert bad["isError"] is True and "code" in text_of(bad)
    # An unknown tool is a protocol error (-32602).
    assert out["steps"][4]["ok"] is False and out["steps"][4]["code"] == -32602


def test_plot_is_image_content(mgr):
    need_kernel("python")
    code = ("import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 3, 2])\nplt.title('mcp')\nplt.show()\n")
    out = sdk(mgr, [call("code_exec", {"code": code, "language": "python", "session": "plot"})])
    r = ok_result(out["steps"][0])
    assert r["isError"] is False, text_of(r)
    images = [c for c in r["content"] if c["type"] == "image"]
    assert len(images) == 1, r["content"]
    assert images[0]["mimeType"] == "image/png"
    png = base64.b64decode(images[0]["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    # structuredContent keeps the display but not the base64 twice.
    disp = r["structuredContent"]["blocks"][0]["displays"][0]
    assert "image content" in disp["image/png"]


# ------------------------------------------------------------------ files


def test_file_tools_confined_to_workspace(mgr, tmp_path):
    need_kernel("python")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    blob = bytes(range(256)) * 4
    out = sdk(mgr, [
        call("write_file", {"session": "fs", "path": "data/in.txt", "content": "héllo\nworld\n"}),
        call("code_exec", {"code": "print(open('data/in.txt').read().upper(), end='')\n"
                                   "import os\n"
                                   f"os.symlink({str(secret)!r}, 'link.txt')\n"
                                   "os.symlink('/etc', 'etcdir')\n"
                                   "os.symlink('data', 'datalink')\n",
                           "session": "fs", "language": "python"}),
        call("read_file", {"session": "fs", "path": "data/in.txt"}),
        call("read_file", {"session": "fs", "path": "data/in.txt", "offset": 7, "length": 5}),
        call("write_file", {"session": "fs", "path": "bin.dat",
                            "content": base64.b64encode(blob).decode(), "encoding": "base64"}),
        call("read_file", {"session": "fs", "path": "bin.dat"}),
        call("list_files", {"session": "fs"}),
        # Escapes, every one refused:
        call("read_file", {"session": "fs", "path": "../session.json"}),
        call("read_file", {"session": "fs", "path": "data/../../x"}),
        call("read_file", {"session": "fs", "path": str(secret)}),
        call("read_file", {"session": "fs", "path": "link.txt"}),
        call("read_file", {"session": "fs", "path": "etcdir/passwd"}),
        call("read_file", {"session": "fs", "path": "datalink/in.txt"}),
        call("write_file", {"session": "fs", "path": "link.txt", "content": "pwned"}),
        call("write_file", {"session": "fs", "path": "etcdir/kernelmgr-test", "content": "x"}),
        call("write_file", {"session": "fs", "path": "../outside.txt", "content": "x"}),
        call("read_file", {"session": "nosuch", "path": "a"}),
        # an encoding the direction does not take: named with the ones it takes
        call("read_file", {"session": "fs", "path": "bin.dat", "encoding": "latin1"}),
        call("write_file", {"session": "fs", "path": "e.txt", "content": "x",
                            "encoding": "auto"}),
        call("list_files", {"session": "fs"}),
    ])
    s = out["steps"]
    assert not ok_result(s[0])["isError"], text_of(s[0]["result"])
    r = ok_result(s[1])
    assert r["isError"] is False, text_of(r)
    assert "HÉLLO\nWORLD" in text_of(r)
    rd = ok_result(s[2])["structuredContent"]
    assert rd["content"] == "héllo\nworld\n" and rd["encoding"] == "utf-8" and rd["eof"]
    part = ok_result(s[3])["structuredContent"]
    assert part["content"] == "world" and part["offset"] == 7 and not part["eof"]
    assert not ok_result(s[4])["isError"]
    rb = ok_result(s[5])["structuredContent"]
    assert rb["encoding"] == "base64" and base64.b64decode(rb["content"]) == blob
    listed = {f["path"] for f in ok_result(s[6])["structuredContent"]["files"]}
    assert {"data/in.txt", "bin.dat"} <= listed
    for i in range(7, 16):
        res = ok_result(s[i])
        assert res["isError"] is True, (i, text_of(res))
    assert "'..'" in text_of(s[7]["result"])
    assert "absolute" in text_of(s[9]["result"])
    assert "symbolic link" in text_of(s[10]["result"])
    assert "symbolic link" in text_of(s[11]["result"])
    assert secret.read_text() == "host secret"
    assert not Path("/etc/kernelmgr-test").exists()
    assert ok_result(s[16])["isError"] is True and "no session" in text_of(s[16]["result"])
    for i, says in ((17, '`encoding` must be "auto", "text" or "base64" (got "latin1")'),
                    (18, '`encoding` must be "text" or "base64" (got "auto")')):
        res = ok_result(s[i])
        assert res["isError"] is True and text_of(res) == says, (i, text_of(res))
    assert "e.txt" not in {f["path"] for f in ok_result(s[19])["structuredContent"]["files"]}


# ------------------------------------------------------------------ long cells


def test_progress_notifications_on_long_cell(mgr):
    need_kernel("python")
    code = "import time\nfor i in range(4):\n    print('step', i, flush=True)\n    time.sleep(1)\n"
    out = sdk(mgr, [call("code_exec", {"code": code, "language": "python", "session": "pr"},
                         progress=True)])
    st = out["steps"][0]
    r = ok_result(st)
    assert r["isError"] is False
    prog = st["progress"]
    assert len(prog) >= 3, prog
    values = [p["progress"] for p in prog]
    assert values == sorted(values) and len(set(values)) == len(values)
    assert any("step" in (p.get("message") or "") for p in prog), prog


def test_cancellation_interrupts_execution(mgr):
    need_kernel("python")
    code = ("import time\nfor i in range(600):\n    print('tick', i, flush=True)\n"
            "    time.sleep(0.1)\nfinished = True\n")
    out = sdk(mgr, [
        call("code_exec", {"code": "finished = False", "language": "python", "session": "cx"}),
        call("code_exec", {"code": code, "language": "python", "session": "cx"},
             cancel_after_ms=2500),
        call("code_exec", {"code": "print('after', finished, i)", "language": "python",
                           "session": "cx"}, timeout_ms=60000),
    ])
    s = out["steps"]
    assert s[1]["ok"] is False and "cancel" in s[1]["error"]
    r = ok_result(s[2])
    # The loop (60 s if left alone) was interrupted: the next cell ran, and
    # the variable set after the loop was never set; i stopped early.
    t = text_of(r)
    assert "after False" in t, t
    stopped_at = int(t.split("after False")[1].split()[0])
    assert stopped_at < 590
    assert "cancelled" in out["stderr"]


# ------------------------------------------------------------------ raw JSON-RPC


class Raw:
    """The server on plain pipes: one line in, lines out."""

    def __init__(self, mgr):
        self.p = subprocess.Popen([mgrutil.KM, "mcp"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=mgr.env)

    def send(self, data):
        if isinstance(data, (dict, list)):
            data = json.dumps(data)
        if isinstance(data, str):
            data = data.encode()
        self.p.stdin.write(data + b"\n")
        self.p.stdin.flush()

    def recv(self, timeout=10):
        import select
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "no answer within the time limit"
        line = self.p.stdout.readline()
        assert line, "the server closed stdout: " + self.p.stderr.read().decode()
        return json.loads(line)

    def ask(self, data, timeout=10):
        self.send(data)
        return self.recv(timeout)

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(10)
        finally:
            if self.p.poll() is None:
                self.p.kill()
        err = self.p.stderr.read().decode()
        self.p.stdout.close()
        self.p.stderr.close()
        return err


def rpc(id_, method, params=None):
    m = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        m["params"] = params
    return m


def test_malformed_lines_get_error_codes_and_server_stays_up(mgr):
    s = Raw(mgr)
    try:
        cases = [
            (b"this is not json", None, -32700),
            (b'{"jsonrpc": "2.0", "id": 1, "method": "ping"', None, -32700),
            (b'{"jsonrpc":"2.0","id":2,"method":"\xff\xfe"}', None, -32700),
            ("[]", None, -32600),
            ('[{"jsonrpc":"2.0","id":3,"method":"ping"}]', None, -32600),
            ("42", None, -32600),
            ({"jsonrpc": "2.0", "id": 4}, 4, -32600),
            ({"jsonrpc": "1.0", "id": 5, "method": "ping"}, 5, -32600),
            ({"id": 6, "method": "ping"}, 6, -32600),
            ({"jsonrpc": "2.0", "id": 7, "method": 12}, 7, -32600),
            ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}, None, -32600),
            ({"jsonrpc": "2.0", "id": 8, "method": "no/such/method"}, 8, -32601),
            ({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": [1, 2]}, 9, -32602),
            (rpc(10, "tools/call", {"arguments": {}}), 10, -32602),
            (rpc(11, "tools/call", {"name": "nope", "arguments": {}}), 11, -32602),
            (rpc(12, "tools/call", {"name": "code_exec", "arguments": "x"}), 12, -32602),
            (rpc(13, "initialize", {"capabilities": {}}), 13, -32602),
        ]
        for line, want_id, code in cases:
            ans = s.ask(line)
            assert ans.get("jsonrpc") == "2.0", ans
            assert ans["id"] == want_id, (line, ans)
            assert ans["error"]["code"] == code, (line, ans)
            assert ans["error"]["message"], ans
        # Notifications are never answered, known or not; an empty line is
        # nothing. The next answer is the ping's.
        s.send({"jsonrpc": "2.0", "method": "notifications/whatever", "params": {}})
        s.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": 999}})
        s.send(b"")
        assert s.ask(rpc("p1", "ping")) == {"jsonrpc": "2.0", "id": "p1", "result": {}}
        # Still a working server: the handshake and tools/list go through.
        init = s.ask(rpc(20, "initialize", {"protocolVersion": "2025-03-26", "capabilities": {},
                                            "clientInfo": {"name": "raw", "version": "0"}}))
        assert init["result"]["protocolVersion"] == "2025-03-26"
        s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        tl = s.ask(rpc(21, "tools/list", {}))
        assert {t["name"] for t in tl["result"]["tools"]} == TOOLS
        assert "resultType" not in tl["result"]
    finally:
        err = s.close()
    assert s.p.returncode == 0, err


def test_version_negotiation_legacy(mgr):
    s = Raw(mgr)
    try:
        for asked, got in [("2024-11-05", "2024-11-05"), ("2025-03-26", "2025-03-26"),
                           ("2025-06-18", "2025-06-18"), ("2025-11-25", "2025-11-25"),
                           ("2099-01-01", "2025-11-25"), ("2026-07-28", "2025-11-25")]:
            r = s.ask(rpc(1, "initialize", {"protocolVersion": asked, "capabilities": {},
                                            "clientInfo": {"name": "v", "version": "0"}}))
            assert r["result"]["protocolVersion"] == got, (asked, r)
            assert r["result"]["serverInfo"]["name"] == "kernelmgr"
            assert "tools" in r["result"]["capabilities"]
    finally:
        s.close()


MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
          "io.modelcontextprotocol/clientCapabilities": {},
          "io.modelcontextprotocol/clientInfo": {"name": "modern", "version": "0"}}


def test_stateless_2026_07_28(mgr):
    need_kernel("python")
    s = Raw(mgr)
    try:
        # No initialize at all: server/discover first, as a dual-era client does.
        d = s.ask(rpc(1, "server/discover", {"_meta": MODERN}))["result"]
        assert d["resultType"] == "complete"
        assert "2026-07-28" in d["supportedVersions"]
        assert "2025-11-25" in d["supportedVersions"]
        assert "tools" in d["capabilities"]
        assert d["serverInfo"]["name"] == "kernelmgr"
        tl = s.ask(rpc(2, "tools/list", {"_meta": MODERN}))["result"]
        assert tl["resultType"] == "complete"
        assert {t["name"] for t in tl["tools"]} == TOOLS
        r = s.ask(rpc(3, "tools/call", {"_meta": MODERN, "name": "code_exec",
                                        "arguments": {"code": "6 * 7", "language": "python",
                                                      "session": "modern"}}), timeout=120)
        assert r["result"]["resultType"] == "complete"
        assert r["result"]["structuredContent"]["blocks"][0]["result"]["text/plain"] == "42"
        # An unknown version: UnsupportedProtocolVersionError with the list.
        bad = dict(MODERN, **{"io.modelcontextprotocol/protocolVersion": "2030-01-01"})
        e = s.ask(rpc(4, "tools/list", {"_meta": bad}))["error"]
        assert e["code"] == -32022
        assert e["data"]["requested"] == "2030-01-01"
        assert "2026-07-28" in e["data"]["supported"]
        # The version without the capabilities it requires: invalid params.
        e = s.ask(rpc(5, "tools/list", {"_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28"}}))["error"]
        assert e["code"] == -32602
        e = s.ask(rpc(6, "tools/list", {"_meta": {
            "io.modelcontextprotocol/protocolVersion": 2026}}))["error"]
        assert e["code"] == -32602
        # Each request stands alone: a legacy request on the same pipe still works.
        assert "resultType" not in s.ask(rpc(7, "tools/list"))["result"]
    finally:
        s.close()


def test_server_exits_cleanly_at_eof_and_keeps_stdout_clean(mgr):
    p = subprocess.run([mgrutil.KM, "mcp"], input=json.dumps(rpc(1, "ping")) + "\n",
                       capture_output=True, text=True, env=mgr.env, timeout=30)
    assert p.returncode == 0
    lines = p.stdout.splitlines()
    assert [json.loads(x) for x in lines] == [{"jsonrpc": "2.0", "id": 1, "result": {}}]
    assert "kernelmgr mcp" in p.stderr
    p = subprocess.run([mgrutil.KM, "mcp", "--bogus"], capture_output=True, text=True,
                       env=mgr.env, timeout=30)
    assert p.returncode == 2 and p.stdout == ""


def test_large_plot_becomes_resource_link(mgr):
    """An image over the inline cap is not inlined: a resource_link to the
    file the manager saved stands for it, or at least a note says so."""
    need_kernel("python")
    code = ("import random\nimport matplotlib\nmatplotlib.use('Agg')\n"
            "import matplotlib.pyplot as plt\nrandom.seed(1)\n"
            "img = [[(random.random(), random.random(), random.random()) for _ in range(700)]"
            " for _ in range(700)]\n"
            "plt.figure(figsize=(9, 9), dpi=120)\nplt.imshow(img)\nplt.show()\n")
    out = sdk(mgr, [call("code_exec", {"code": code, "language": "python", "session": "big"},
                         timeout_ms=170000)])
    r = ok_result(out["steps"][0])
    assert r["isError"] is False, text_of(r)
    assert not [c for c in r["content"] if c["type"] == "image"]
    assert "too large to show inline" in text_of(r)
    links = [c for c in r["content"] if c["type"] == "resource_link"]
    assert len(links) == 1, r["content"]
    assert links[0]["uri"].startswith("file:///") and links[0]["mimeType"] == "image/png"
    path = links[0]["uri"][len("file://"):]
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_session_tools(mgr):
    need_kernel("python")
    out = sdk(mgr, [
        call("code_exec", {"code": "y = 5", "language": "python", "session": "life"}),
        call("write_file", {"session": "life", "path": "keep.txt", "content": "kept"}),
        call("list_sessions", {}),
        call("restart_session", {"session": "life"}),
        call("code_exec", {"code": "print('y' in globals(), open('keep.txt').read())",
                           "language": "python", "session": "life"}),
        call("close_session", {"session": "life"}),
        call("list_sessions", {}),
        call("read_file", {"session": "life", "path": "keep.txt"}),
        call("restart_session", {"session": "never-was"}),
        call("close_session", {"session": "../x"}),
    ])
    s = out["steps"]
    names = [x["name"] for x in ok_result(s[2])["structuredContent"]["sessions"]]
    assert "life" in names and "life" in text_of(s[2]["result"])
    ws = [x for x in ok_result(s[2])["structuredContent"]["sessions"]
          if x["name"] == "life"][0]["workspace"]
    assert ok_result(s[3])["isError"] is False
    # Restart: variables gone, files kept.
    assert "False kept" in text_of(ok_result(s[4]))
    assert ok_result(s[5])["isError"] is False
    assert "life" not in [x["name"] for x in ok_result(s[6])["structuredContent"]["sessions"]]
    assert not Path(ws).exists()
    assert ok_result(s[7])["isError"] is True
    assert ok_result(s[8])["isError"] is True
    r = ok_result(s[9])
    assert r["isError"] is True and "invalid session name" in text_of(r)


def test_session_options_through_mcp(mgr):
    """code_exec and write_file take the session options where they create
    the session (the daemon applies and validates them); those that relax
    the sandbox need the operator's --allow-unsafe-session-options."""
    need_kernel("bash")
    out = sdk(mgr, [
        call("code_exec", {"code": "echo made", "language": "bash", "session": "opt",
                           "memory": "256M", "env": {"OPT": "1"}}),
        call("code_exec", {"code": "echo again", "language": "bash", "session": "opt",
                           "memory": "512M"}),
        call("write_file", {"session": "wopt", "path": "a.txt", "content": "x",
                            "memory": "300M"}),
        call("code_exec", {"code": "echo no", "language": "bash", "session": "net",
                           "network": "on"}),
        call("code_exec", {"code": "echo no", "language": "bash", "session": "nos",
                           "sandbox": "none"}),
        call("code_exec", {"code": "echo no", "language": "bash", "session": "bad",
                           "memory": "1K"}),
        call("list_sessions", {}),
    ])
    s = out["steps"]
    assert ok_result(s[0])["isError"] is False, text_of(s[0]["result"])
    # an existing session keeps its options, and says so
    r = ok_result(s[1])
    assert r["isError"] is False and "memory" in text_of(r) and "ignored" in text_of(r), \
        text_of(r)
    assert ok_result(s[2])["isError"] is False, text_of(s[2]["result"])
    for i in (3, 4):
        r = ok_result(s[i])
        assert r["isError"] is True and "--allow-unsafe-session-options" in text_of(r), \
            text_of(r)
    r = ok_result(s[5])
    assert r["isError"] is True and 'field "memory"' in text_of(r), text_of(r)
    names = {x["name"] for x in ok_result(s[6])["structuredContent"]["sessions"]}
    assert {"opt", "wopt"} <= names and not names & {"net", "nos", "bad"}, names
    # the session's own record has the memory it was created with
    saved = json.loads((mgr.home / "sessions" / "opt" / "session.json").read_text())
    assert saved["options"]["memory"] == 256 << 20, saved
    # the operator may allow the relaxing ones
    out = sdk(mgr, [call("code_exec", {"code": "echo yes", "language": "bash",
                                       "session": "net", "network": "on"})],
              server_args=["--allow-unsafe-session-options"])
    r = ok_result(out["steps"][0])
    if os.geteuid() != 0 and r["isError"] and "slirp4netns failed" in text_of(r):
        # let through, and refused by the sandbox itself: this host cannot
        # give an unprivileged caller networking (test_sandbox_attacks.py,
        # test_network_on_cannot_reach_host), and the result says why
        assert "--allow-unsafe-session-options" not in text_of(r), text_of(r)
    else:
        assert r["isError"] is False and "yes" in text_of(r), text_of(r)


def test_snapshot_and_fork_tools(mgr):
    need_kernel("python")
    out = sdk(mgr, [
        call("code_exec", {"code": "v = [1]", "language": "python", "session": "base"}),
        call("snapshot_session", {"session": "base", "tag": "one"}),
        call("code_exec", {"code": "v.append(2)", "language": "python", "session": "base"}),
        call("fork_session", {"session": "base", "new_session": "alt", "tag": "one"}),
        call("code_exec", {"code": "print(v)", "language": "python", "session": "alt"}),
        call("snapshot_session", {"session": "base", "tag": "one", "restore": True}),
        call("code_exec", {"code": "print(v)", "language": "python", "session": "base"}),
        call("fork_session", {"session": "base", "new_session": "alt"}),
        call("snapshot_session", {"session": "base", "tag": "../x"}),
    ])
    s = out["steps"]
    assert ok_result(s[1])["structuredContent"]["tag"] == "one"
    assert "snapshot one of session base taken" in text_of(s[1]["result"])
    assert ok_result(s[3])["structuredContent"]["session"] == "alt"
    assert ok_result(s[4])["structuredContent"]["blocks"][0]["stdout"] == "[1]\n"
    assert "restored" in text_of(s[5]["result"])
    assert ok_result(s[6])["structuredContent"]["blocks"][0]["stdout"] == "[1]\n"
    for bad in (s[7], s[8]):
        r = bad.get("result") or {}
        assert r.get("isError") is True or "error" in bad, bad
