"""The daemon's API (docs/API.md): JSON-RPC 2.0 lines on its unix socket.
Strict validation (every refusal names the field), every method, streamed
events, error codes, and close racing files.write / packages.install."""
import base64
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apiutil  # noqa: E402
import mgrutil  # noqa: E402

needs_kernels = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="needs both kernels")


class Conn:
    """One connection to the daemon; requests answered in order."""

    def __init__(self, mgr, timeout=120):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.settimeout(timeout)
        self.s.connect(str(mgr.home / "kernelmgr.sock"))
        self.f = self.s.makefile("rw")

    def send_line(self, text):
        self.f.write(text + "\n")
        self.f.flush()

    def read(self):
        line = self.f.readline()
        assert line, "the daemon closed the connection"
        return json.loads(line)

    def call(self, method, params=None, id=None):
        """(response, [event notifications])"""
        req = apiutil.request(method, params, id)
        self.send_line(json.dumps(req))
        events = []
        while True:
            o = self.read()
            if apiutil.is_response(o):
                assert o["jsonrpc"] == "2.0" and o["id"] == req["id"], (req, o)
                return o, events
            assert o["method"] == "event" and o["params"]["request_id"] == req["id"], o
            events.append(o["params"])

    def ok(self, method, params=None):
        rep, _ = self.call(method, params)
        assert "result" in rep, (method, params, rep)
        return rep["result"]

    def error(self, method, params=None):
        rep, _ = self.call(method, params)
        assert "error" in rep and "result" not in rep, (method, params, rep)
        return rep["error"]

    def close(self):
        self.s.close()


@pytest.fixture
def api(make_mgr):
    mgr = make_mgr()
    p = subprocess.Popen([mgrutil.KM, "serve"], env=mgr.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    end = time.monotonic() + 30
    while not (mgr.home / "kernelmgr.sock").exists():
        assert p.poll() is None and time.monotonic() < end, "the daemon did not come up"
        time.sleep(0.05)
    c = Conn(mgr)
    yield mgr, c
    c.close()
    mgr.run("serve", "--stop", timeout=60)
    p.wait(60)


def test_strict_validation_names_the_field(api):
    mgr, c = api
    # unknown field: named, with the expected ones
    e = c.error("close", {"session": "x", "kep": True})
    assert e["code"] == -32602 and e["data"]["km_code"] == 2, e
    assert 'unknown field "kep"' in e["message"] and "session, keep" in e["message"], e
    # wrong type
    e = c.error("close", {"session": 5})
    assert e["code"] == -32602
    assert 'field "session": expected a string, got an integer' in e["message"], e
    e = c.error("exec", {"session": "s", "code": "1", "timeout": "10"})
    assert 'field "timeout": expected a number, got a string' in e["message"], e
    e = c.error("files.read", {"session": "s", "path": "a", "offset": 1.5})
    assert 'field "offset": expected an integer' in e["message"], e
    # missing field
    e = c.error("exec", {"session": "s"})
    assert 'missing field "code"' in e["message"], e
    e = c.error("files.write", {"session": "s", "path": "a"})
    assert 'missing field "content"' in e["message"], e
    # values: named too
    for params, want in [
            ({"session": "s", "network": "maybe"}, 'field "network"'),
            ({"session": "s", "memory": "1K"}, 'field "memory"'),
            ({"session": "s", "cpus": -1}, 'field "cpus"'),
            ({"session": "s", "cpu_time": 0.0 - 1}, 'field "cpu_time"'),
            ({"session": "s", "sandbox": "loose"}, 'field "sandbox"'),
            ({"session": "s", "python": "python3"}, 'field "python"'),
            ({"session": "s", "env": {"1X": "a"}}, "invalid variable name")]:
        e = c.error("session.create", params)
        assert e["code"] == -32602 and want in e["message"], (params, e)
    # methods without params refuse any
    e = c.error("ping", {"verbose": True})
    assert 'unknown field "verbose"' in e["message"], e
    # nothing was created by the refusals
    assert c.ok("sessions.list")["sessions"] == []
    # the CPU limits are session options like memory (kept in session.json)
    r = c.ok("session.create", {"session": "cpu", "cpus": 0.5, "cpu_time": 30})
    opts = json.loads((mgr.home / "sessions" / "cpu" / "session.json").read_text())["options"]
    assert r["created"] is True and opts["cpus"] == 0.5 and opts["cpu_time"] == 30, opts


def test_protocol_errors_and_notifications(api):
    mgr, c = api
    c.send_line("{not json")
    o = c.read()
    assert o["id"] is None and o["error"]["code"] == -32700, o
    c.send_line("[1, 2]")
    assert "batches" in c.read()["error"]["message"]
    c.send_line('{"jsonrpc": "1.0", "id": 3, "method": "ping"}')
    o = c.read()
    assert o["id"] == 3 and o["error"]["code"] == -32600, o
    c.send_line('{"jsonrpc": "2.0", "id": 4, "method": "ping", "params": [1]}')
    assert c.read()["error"]["code"] == -32602
    e = c.error("no.such.method")
    assert e["code"] == -32601 and "no.such.method" in e["message"], e
    # a notification (no id) is never answered: the next line answers the ping
    c.send_line('{"jsonrpc": "2.0", "method": "ping"}')
    c.send_line('{"jsonrpc": "2.0", "method": "close", "params": {"session": 5}}')
    rep, _ = c.call("ping", id="after")
    assert rep["id"] == "after" and rep["result"]["api_version"] == 1
    # the server range carries the KM_E* code
    e = c.error("close", {"session": "ghost"})
    assert e == {"code": -32003, "message": 'no session named "ghost"', "data": {"km_code": 3}}


def test_initialize_and_ping_name_the_version(api):
    mgr, c = api
    r = c.ok("initialize", {"api_version": 1, "client": "test"})
    assert r["api_version"] == 1 and r["server"] == "kernelmgr"
    assert {"session.create", "exec", "interrupt", "restart", "close", "sessions.list",
            "files.list", "files.read", "files.write", "export", "packages.install",
            "connection_file", "ping", "shutdown"} <= set(r["methods"])
    e = c.error("initialize", {"api_version": 99})
    assert "api_version 99" in e["message"] and "api_version 1" in e["message"], e
    p = c.ok("ping")
    assert p["api_version"] == 1 and p["pid"] > 0 and Path(p["home"]) == mgr.home


@needs_kernels
def test_every_method(api, tmp_path):
    mgr, c = api
    # session.create with options, no kernel started
    r = c.ok("session.create", {"session": "s1", "memory": "1G", "network": "off",
                                "env": {"GREETING": "hello"}})
    assert r["created"] is True and Path(r["workspace"]).is_dir(), r
    ws = Path(r["workspace"])
    assert c.ok("sessions.list")["sessions"][0]["kernels"] == {"python": None, "bash": None}
    # the limits it runs under: its own options, else the configuration's
    c.ok("session.create", {"session": "s0", "cpus": 0.5, "cpu_time": 30})
    lims = {x["name"]: x["limits"] for x in c.ok("sessions.list")["sessions"]}
    assert lims["s1"]["memory"] == 1 << 30 and lims["s1"]["network"] == "off", lims
    assert lims["s1"]["cpus"] is None and lims["s1"]["cpu_time"] is None, lims
    assert lims["s0"]["cpus"] == 0.5 and lims["s0"]["cpu_time"] == 30, lims
    # no memory option anywhere: null, the sandbox's own default (2 GiB)
    assert lims["s0"]["memory"] is None and lims["s0"]["sandbox"] == mgrutil.SANDBOX, lims
    c.ok("close", {"session": "s0"})
    # again with other options: kept, and a warning says so
    r = c.ok("session.create", {"session": "s1", "memory": "2G"})
    assert r["created"] is False and "memory" in " ".join(r["warnings"]), r
    # files: write (text, base64, into a new directory), read, list
    w = c.ok("files.write", {"session": "s1", "path": "d/in.txt", "content": "héllo\n"})
    assert w == {"path": "d/in.txt", "size": 7, "created": True, "session": "s1"}, w
    blob = bytes(range(256))
    c.ok("files.write", {"session": "s1", "path": "bin.dat", "encoding": "base64",
                         "content": base64.b64encode(blob).decode()})
    assert (ws / "bin.dat").read_bytes() == blob
    c.ok("files.write", {"session": "s1", "path": "d/in.txt", "content": "more\n",
                         "append": True})
    rd = c.ok("files.read", {"session": "s1", "path": "d/in.txt"})
    assert rd["content"] == "héllo\nmore\n" and rd["encoding"] == "utf-8" and rd["eof"], rd
    rd = c.ok("files.read", {"session": "s1", "path": "bin.dat", "offset": 250, "length": 4})
    assert base64.b64decode(rd["content"]) == blob[250:254] and not rd["eof"], rd
    lst = c.ok("files.list", {"session": "s1", "path": "d"})
    assert [f["path"] for f in lst["files"]] == ["d/in.txt"], lst
    assert {f["path"] for f in c.ok("files.list", {"session": "s1"})["files"]} >= {
        "d/in.txt", "bin.dat"}
    for bad in ("../x", "/etc/passwd"):
        e = c.error("files.read", {"session": "s1", "path": bad})
        assert e["data"]["km_code"] == 2, e
    # an encoding the direction does not take: refused naming the field and
    # the ones it takes, before anything is done (no session s9 is made)
    e = c.error("files.read", {"session": "s1", "path": "bin.dat", "encoding": "latin1"})
    assert e["code"] == -32602 and e["message"] == (
        'files.read: field "encoding": must be "auto", "text" or "base64" (got "latin1")'), e
    e = c.error("files.write", {"session": "s9", "path": "a", "content": "x",
                                "encoding": "auto", "create": True})
    assert e["code"] == -32602 and e["message"] == (
        'files.write: field "encoding": must be "text" or "base64" (got "auto")'), e
    assert "s9" not in {s["name"] for s in c.ok("sessions.list")["sessions"]}
    assert c.error("files.write", {"session": "nosuch", "path": "a", "content": ""})[
        "code"] == -32003
    # files.write with create makes the session
    r = c.ok("files.write", {"session": "s2", "path": "a.txt", "content": "x", "create": True})
    assert r["created"] is True
    # exec, streamed: notifications with the request id, then the response
    rep, events = c.call("exec", {"session": "s1", "lang": "bash", "stream": True,
                                  "code": 'echo "$GREETING"; cat d/in.txt; echo err >&2'})
    r = rep["result"]
    assert r["failed"] is False and r["results"][0]["stdout"] == "hello\nhéllo\nmore\n", r
    assert Path(r["workspace"]) == ws
    kinds = [e["event"] for e in events]
    assert "stream" in kinds and kinds[-1] == "result", kinds
    assert "".join(e["text"] for e in events if e["event"] == "stream"
                   and e["name"] == "stdout") == "hello\nhéllo\nmore\n"
    # without stream: no events
    rep, events = c.call("exec", {"session": "s1", "lang": "python", "code": "x = 41"})
    assert events == [] and rep["result"]["results"][0]["status"] == "ok"
    # a failing block: a result, not an error
    r = c.ok("exec", {"session": "s1", "lang": "python", "code": "1/0"})
    assert r["failed"] is True and r["results"][0]["error"]["name"] == "ZeroDivisionError"
    # interrupt a running cell from a second connection
    c2 = Conn(mgr)
    holder = {}
    t = threading.Thread(target=lambda: holder.update(r=c2.call("exec", {
        "session": "s1", "lang": "python", "code": "import time\nopen('go','w')\n"
        "time.sleep(60)"})[0]))
    t.start()
    end = time.monotonic() + 60
    while not (ws / "go").exists():
        assert time.monotonic() < end, "the cell never started"
        time.sleep(0.05)
    assert c.ok("interrupt", {"session": "s1"}) == {"session": "s1"}
    t.join(60)
    c2.close()
    assert holder["r"]["result"]["results"][0]["error"]["name"] == "KeyboardInterrupt", holder
    assert c.ok("exec", {"session": "s1", "lang": "python", "code": "x + 1"})[
        "results"][0]["result"]["text/plain"] == "42"
    # connection_file, restart (state cleared, files kept), export
    cf = c.ok("connection_file", {"session": "s1", "lang": "python"})["connection_file"]
    assert json.loads(Path(cf).read_text())["transport"] in ("ipc", "tcp")
    c.ok("restart", {"session": "s1"})
    r = c.ok("exec", {"session": "s1", "lang": "python", "code": "'x' in globals()"})
    assert r["results"][0]["result"]["text/plain"] == "False"
    assert (ws / "bin.dat").exists()
    nb = c.ok("export", {"session": "s1"})["notebook"]
    assert nb["nbformat"] == 4 and len(nb["cells"]) >= 3
    # packages.install: refused before anything runs without an allowlist
    e = c.error("packages.install", {"session": "s1", "manager": "pip",
                                     "packages": ["tinypkg"]})
    assert "allowlist" in e["message"] and "nothing was installed" in e["message"], e
    e = c.error("packages.install", {"session": "s1", "manager": "cargo", "packages": ["x"]})
    assert e["data"]["km_code"] == 2 and "manager" in e["message"], e
    # close (kept, then removed)
    assert c.ok("close", {"session": "s2", "keep": True}) == {"session": "s2", "kept": True}
    c.ok("close", {"session": "s1"})
    assert not ws.exists()
    assert [s["name"] for s in c.ok("sessions.list")["sessions"]] == []
    # shutdown answers, then the daemon goes
    assert c.ok("shutdown") == {}
    end = time.monotonic() + 60
    while (mgr.home / "kernelmgr.sock").exists():
        assert time.monotonic() < end, "the daemon did not stop"
        time.sleep(0.05)


@needs_kernels
def test_close_racing_files_write(api):
    """files.write holds the session's lock: a close racing writes either
    waits for a write or makes it fail cleanly (no such session); nothing is
    left in a removed workspace and the daemon goes on."""
    mgr, c = api
    for rnd in range(5):
        name = f"race{rnd}"
        ws = Path(c.ok("session.create", {"session": name})["workspace"])
        results, stop = [], threading.Event()

        def writer(i):
            w = Conn(mgr)
            try:
                n = 0
                while not stop.is_set() and n < 200:
                    rep, _ = w.call("files.write", {"session": name, "path": f"w{i}/f{n}.txt",
                                                    "content": "x" * 1000})
                    results.append(rep)
                    n += 1
                    if "error" in rep:
                        break
            finally:
                w.close()

        ts = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
        for t in ts:
            t.start()
        end = time.monotonic() + 30
        while len(results) < 10:
            assert time.monotonic() < end
            time.sleep(0.01)
        closer = Conn(mgr)
        assert "result" in closer.call("close", {"session": name})[0]
        closer.close()
        stop.set()
        for t in ts:
            t.join(60)
        errors = [r["error"] for r in results if "error" in r]
        assert all(e["code"] == -32003 for e in errors), errors
        assert not ws.exists(), f"{ws} was left behind"
        assert c.ok("ping")["api_version"] == 1
    assert c.ok("sessions.list")["sessions"] == []


@needs_kernels
def test_close_racing_packages_install(api):
    """An install into a live session holds its lock: close waits for it and
    removes the packages it installed; an install that comes after the close
    installs for the name (the next session of that name sees it)."""
    from test_install import Index, allowlist_file
    mgr, c = api
    index = Index(mgr.home / "index")
    try:
        al = allowlist_file(mgr, index)
        for rnd in range(2):
            name = f"pk{rnd}"
            c.ok("session.create", {"session": name})
            out = {}
            gate = threading.Barrier(2)

            def install():
                k = Conn(mgr, timeout=600)
                gate.wait()
                out["install"] = (k.call("packages.install", {
                    "session": name, "manager": "pip", "packages": ["tinypkg"],
                    "allowlist": al})[0], time.monotonic())
                k.close()

            def close():
                k = Conn(mgr, timeout=600)
                gate.wait()
                out["close"] = (k.call("close", {"session": name})[0], time.monotonic())
                k.close()

            ts = [threading.Thread(target=install), threading.Thread(target=close)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(600)
            (inst, t_inst), (cl, t_cl) = out["install"], out["close"]
            assert "result" in cl, cl
            assert "result" in inst or inst["error"]["code"] == -32003, inst
            pkgdir = mgr.home / "packages" / name
            assert name not in [s["name"] for s in c.ok("sessions.list")["sessions"]]
            if "result" in inst and t_inst > t_cl and pkgdir.exists():
                # installed for the name after the close: a new session sees it
                r = c.ok("exec", {"session": name, "lang": "python",
                                  "code": "import tinypkg; print(tinypkg.VALUE)"})
                assert r["results"][0]["stdout"] == "42\n", r
                c.ok("close", {"session": name})
            assert not pkgdir.exists(), f"{pkgdir} outlived its session"
            assert c.ok("ping")["api_version"] == 1
    finally:
        index.close()
