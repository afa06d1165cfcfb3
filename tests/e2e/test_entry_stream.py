"""The entry points' output path: the daemon's "raw_text" stream
framing, and long outputs through `kernelmgr exec` and MCP arriving whole.
Real daemon, real kernels, no timing assertions."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apiutil  # noqa: E402
import mgrutil  # noqa: E402
from mgrutil import Mgr  # noqa: E402

needs_python = pytest.mark.skipif(not mgrutil.have_kernel("python"),
                                  reason="build/kernel-python not built")
needs_bash = pytest.mark.skipif(not mgrutil.have_kernel("bash"),
                                reason="build/kernel-bash not built")


@pytest.fixture
def mgr():
    m = Mgr()
    yield m
    m.close()


def daemon_exec(mgr, req, timeout=120):
    """One API request on a fresh daemon connection. Returns (events, reply):
    events as dicts (the notifications' params); a raw_text stream event gets
    its bytes as "raw"; reply is the response's result (or the error
    response)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(mgr.home / "kernelmgr.sock"))
    s.sendall(json.dumps(req).encode() + b"\n")
    buf = b""
    events = []

    def need(n):
        nonlocal buf
        while len(buf) < n:
            chunk = s.recv(1 << 16)
            assert chunk, "the daemon closed the connection mid-answer"
            buf += chunk

    try:
        while True:
            while b"\n" not in buf:
                chunk = s.recv(1 << 16)
                assert chunk, "the daemon closed the connection without a reply"
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            o = json.loads(line)
            if apiutil.is_response(o):
                return events, apiutil.unwrap(o)
            assert o["method"] == "event", o
            o = o["params"]
            if "text_bytes" in o:
                n = o["text_bytes"]
                assert "text" not in o
                need(n)
                o["raw"], buf = buf[:n], buf[n:]
            events.append(o)
    finally:
        s.close()


def start_daemon(mgr, lang):
    p = mgr.run("exec", "--session", "s", "--lang", lang, "-c",
                "true" if lang == "bash" else "1")
    assert p.returncode == 0, p.stderr


TRICKY = "é ✓ \U0001F600 tab\t \"quoted\" back\\slash \x1b[31mred\x1b[0m {\"event\":1}\n"


@needs_python
def test_raw_text_framing_carries_exact_bytes(mgr):
    start_daemon(mgr, "python")
    code = ("import sys\n"
            f"T = {TRICKY!r}\n"
            "for i in range(2000):\n"
            "    sys.stdout.write(str(i) + ' ' + T)\n"
            "sys.stderr.write('to stderr\\n')\n")
    expected = "".join(f"{i} {TRICKY}" for i in range(2000))
    events, reply = daemon_exec(mgr, apiutil.request("exec", {
        "session": "s", "code": code, "lang": "python", "stream": True, "raw_text": True}, id=7))
    assert "results" in reply, reply
    streams = [e for e in events if e["event"] == "stream"]
    assert streams and all("raw" in e and e["request_id"] == 7 for e in streams)
    out = b"".join(e["raw"] for e in streams if e["name"] == "stdout").decode("utf-8")
    err = b"".join(e["raw"] for e in streams if e["name"] == "stderr").decode("utf-8")
    assert out == expected
    assert err == "to stderr\n"
    # the result event and the final reply are still JSON with the texts
    assert [e["event"] for e in events].count("result") == 1
    (r,) = reply["results"]
    assert r["status"] == "ok" and r["stderr"] == "to stderr\n"
    # the final reply names the workspace (MCP uses it; no second request)
    assert Path(reply["workspace"]).is_dir()

    # a client that did not ask for raw_text gets JSON lines as before
    events, reply = daemon_exec(mgr, apiutil.request("exec", {
        "session": "s", "code": code, "lang": "python", "stream": True}))
    assert "results" in reply, reply
    streams = [e for e in events if e["event"] == "stream"]
    assert streams and not any("text_bytes" in e or "raw" in e for e in streams)
    assert "".join(e["text"] for e in streams if e["name"] == "stdout") == expected
    # raw_text without stream: no events at all
    events, reply = daemon_exec(mgr, apiutil.request("exec", {
        "session": "s", "code": "print(1)", "lang": "python", "raw_text": True}))
    assert events == [] and "results" in reply, reply
    assert reply["results"][0]["stdout"] == "1\n"


@needs_bash
def test_cli_long_output_arrives_whole(mgr):
    start_daemon(mgr, "bash")
    p = subprocess.run([mgrutil.KM, "exec", "--session", "s", "--lang", "bash", "-c",
                        "seq 400000; echo done >&2"], env=mgr.env, capture_output=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-500:]
    expected = "".join(f"{i}\n" for i in range(1, 400001)).encode()
    assert p.stdout.startswith(expected)
    # after the streamed output only the result's note about the cap follows
    rest = p.stdout[len(expected):].decode()
    assert all(line.startswith("[") for line in rest.splitlines()), rest[:300]
    assert "omitted" in rest or "complete output" in rest
    assert b"done\n" in p.stderr
    # the session still works afterwards
    rc, res, p = mgr.exec("s", "echo still here", "--lang", "bash")
    assert rc == 0 and res[0]["stdout"] == "still here\n"


@needs_bash
def test_cli_long_output_into_closed_pipe_still_exits_7(mgr):
    """The raw framing keeps the output-error handling: a reader that goes
    away gives exit status 7 and the cell is interrupted."""
    start_daemon(mgr, "bash")
    p = subprocess.run(f"'{mgrutil.KM}' exec --session s --lang bash -c 'yes | head -c 50M' "
                       "| head -c 10 >/dev/null; echo ${PIPESTATUS[0]}", shell=True,
                       executable="/bin/bash", env=mgr.env, capture_output=True, text=True,
                       timeout=300)
    assert p.stdout.strip() == "7", (p.stdout, p.stderr[-300:])
    assert "cannot write the output" in p.stderr
    rc, res, _ = mgr.exec("s", "echo ok", "--lang", "bash")
    assert rc == 0 and res[0]["stdout"] == "ok\n"


@needs_bash
def test_mcp_long_output_and_workspace(mgr):
    start_daemon(mgr, "bash")
    p = subprocess.Popen([mgrutil.KM, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=mgr.env)
    try:
        def rpc(i, method, params):
            p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": method,
                                       "params": params}) + "\n").encode())
            p.stdin.flush()
            while True:
                line = p.stdout.readline()
                assert line, "kernelmgr mcp closed its stdout"
                o = json.loads(line)
                if o.get("id") == i:
                    return o

        rpc(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "t", "version": "1"}})
        p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        p.stdin.flush()
        o = rpc(2, "tools/call", {"name": "code_exec", "arguments": {
            "session": "s", "language": "bash",
            "code": "seq 300000; echo made > out.txt; echo é"}})
        res = o["result"]
        assert not res.get("isError"), res
        sc = res["structuredContent"]
        (b,) = sc["blocks"]
        assert b["status"] == "ok"
        assert b["stdout"].startswith("1\n2\n3\n") and b["stdout"].endswith("é\n")
        assert b["truncated"]["stdout"]["total_bytes"] == \
            sum(len(f"{i}\n") for i in range(1, 300001)) + len("é\n".encode())
        assert [f["path"] for f in b["files"]] == ["out.txt"]
        # the file is named under the session's real workspace
        text = json.dumps(res)
        assert "out.txt" in text
    finally:
        p.stdin.close()
        p.wait(30)
