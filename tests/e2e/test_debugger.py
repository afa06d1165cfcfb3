"""The Jupyter debug protocol (debug_request on control, debug_event on
IOPub) driven with the real jupyter_client as JupyterLab's debugger drives
it: initialize, attach, configurationDone, debugInfo, dumpCell,
setBreakpoints, a cell run to its breakpoint, stackTrace / scopes /
variables / evaluate, stepIn into a function of another cell, next, stepOut,
continue, rich inspection, exception breakpoints, the kernel answering while
a cell is stopped, an interrupt of a stopped cell, disconnect.

The same test functions run against our Python kernel (strict sandbox) and
against Debian's ipykernel as the reference; where ipykernel 6.17 differs
the test asserts what both do and says so. Post-mortem %debug and
breakpoint() over stdin, and a session an agent uses debugged through the
gateway's kernel WebSocket, are at the end. No fixed sleeps."""
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402

from jupyter_client import BlockingKernelClient  # noqa: E402

SYS_PYTHON = "/usr/bin/python3"
# strict unless a run asks for the functional tests without the sandbox
SANDBOX = os.environ.get("KM_TEST_SANDBOX", "strict")
PY_ARGS = ("--python", SYS_PYTHON, "--sandbox", SANDBOX)


def have(module, python=SYS_PYTHON):
    return subprocess.run([python, "-c", "import " + module], capture_output=True).returncode == 0


HAVE_DEBUGPY = have("debugpy")
HAVE_IPYKERNEL = have("ipykernel_launcher") and HAVE_DEBUGPY

pytestmark = pytest.mark.skipif(not HAVE_DEBUGPY, reason="python3-debugpy is not installed")


class IPyKernel(kutil.Kernel):
    """Debian's ipykernel, started as Jupyter starts it: the reference."""

    def __init__(self, workdir):
        self.lang = "ipykernel"
        self.workdir = Path(workdir)
        self.workspace = self.workdir / "ws"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.cf = str(self.workdir / "kernel.json")
        # ports 0: ipykernel binds ports of its own choosing and writes them
        # into the file (ports picked here and closed again could be taken by
        # another test's process before ipykernel binds them)
        ports = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
        Path(self.cf).write_text(json.dumps(dict(
            {p: 0 for p in ports}, ip="127.0.0.1", transport="tcp", key=os.urandom(16).hex(),
            signature_scheme="hmac-sha256", kernel_name="")))
        self.log = open(self.workdir / "kernel.log", "wb")
        env = dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1")
        self.proc = subprocess.Popen([SYS_PYTHON, "-m", "ipykernel_launcher", "-f", self.cf],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=self.workspace, env=env)

        def bound():
            if self.proc.poll() is not None:
                raise RuntimeError(f"ipykernel exited {self.proc.returncode}: {self.log_text()}")
            try:
                info = json.loads(Path(self.cf).read_text())
            except (ValueError, FileNotFoundError):
                # being rewritten: jupyter_core's secure_write removes the
                # file first, then writes it anew
                return False
            return all(info.get(p) for p in ports)

        try:
            # a bound on a hang (ipykernel with debugpy starts in about a
            # second; beside the sanitized tier and the builds it took > 60 s)
            kutil.poll_until(bound, bool, 180, "ipykernel's ports in its connection file")
        except Exception:
            self.proc.kill()
            self.proc.wait()
            self.log.close()
            raise
        self.kc = BlockingKernelClient(connection_file=self.cf)
        self.kc.load_connection_file()
        self.kc.start_channels()
        try:
            kutil.wait_ready(self.kc, self.proc, 60, self.log_text)
        except Exception:
            self.close()
            raise


def kernel_of(param, kernel_factory, tmp_path):
    """The kernel a fixture's param names (a generator for the fixture):
    ours on the stdlib path, ours with the `ipython` option on (every cell
    through IPython's shell, compiled as ipykernel's XCachingCompiler does),
    or ipykernel from Debian."""
    if param == "ipykernel":
        if not HAVE_IPYKERNEL:
            pytest.skip("python3-ipykernel is not installed")
        k = IPyKernel(tmp_path / "ipk")
        yield k
        k.close()
    elif param == "kernelmgr-ipython":
        yield kernel_factory("python", args=[*PY_ARGS, "--ipython", "on"])
    else:
        yield kernel_factory("python", args=PY_ARGS)


@pytest.fixture(params=["kernelmgr", "ipykernel"])
def kernel(request, kernel_factory, tmp_path):
    yield from kernel_of(request.param, kernel_factory, tmp_path)


@pytest.fixture(params=["kernelmgr", "kernelmgr-ipython", "ipykernel"])
def kernel_both(request, kernel_factory, tmp_path):
    """Ours on both paths, and ipykernel."""
    yield from kernel_of(request.param, kernel_factory, tmp_path)


class Dap:
    """A debugger frontend over jupyter_client: requests on control, events
    and every other IOPub message kept in order."""

    def __init__(self, k):
        self.k = k
        self.kc = k.kc
        self.seq = 0
        self.iopub = []  # every IOPub message seen
        self.events = []  # debug_event contents not yet taken

    def pump(self, timeout=0.05):
        try:
            m = self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return False
        self.iopub.append(m)
        if m["msg_type"] == "debug_event":
            self.events.append(m["content"])
        return True

    def req(self, command, arguments=None, timeout=60):
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command,
                   "arguments": arguments or {}}
        msg = self.kc.session.msg("debug_request", content)
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0)
            try:
                r = self.kc.get_control_msg(timeout=0.05)
            except queue.Empty:
                continue
            if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert r["msg_type"] == "debug_reply"
                rep = r["content"]
                # ipykernel 6.17 answers richInspectVariables of a stopped
                # frame with its evaluate response's command
                # (ipykernel 6.17's modules reply is a bare body)
                assert rep.get("command", command) in (command, "evaluate"), rep
                return rep
        raise TimeoutError(f"no debug_reply to {command}")

    def ok(self, command, arguments=None, timeout=60):
        rep = self.req(command, arguments, timeout)
        assert rep["success"], rep
        return rep.get("body") or {}

    def event(self, name, timeout=60, pred=lambda e: True):
        deadline = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e.get("event") == name and pred(e):
                    del self.events[i]
                    return e
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {name} event; have {[e.get('event') for e in self.events]}")
            self.pump()

    def execute(self, code, **kw):
        return self.kc.execute(code, **kw)

    def finish(self, msg_id, timeout=60):
        """The execute_reply of msg_id (and its idle on IOPub): reply content
        and the cell's stdout text."""
        deadline = time.monotonic() + timeout
        reply = None
        while True:
            idle = any(m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                       and m["content"]["execution_state"] == "idle" for m in self.iopub)
            if reply is not None and idle:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"cell {msg_id} did not finish: reply={reply}")
            if reply is None:
                try:
                    m = self.kc.get_shell_msg(timeout=0)
                    if m["parent_header"].get("msg_id") == msg_id:
                        reply = m["content"]
                except queue.Empty:
                    pass
            self.pump()
        out = "".join(m["content"]["text"] for m in self.iopub
                      if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream"
                      and m["content"]["name"] == "stdout")
        return reply, out

    def start(self):
        """What JupyterLab sends when its debugger is switched on."""
        body = self.ok("initialize", {
            "clientID": "test", "clientName": "pytest", "adapterID": "python",
            "pathFormat": "path", "linesStartAt1": True, "columnsStartAt1": True,
            "supportsVariableType": True, "supportsVariablePaging": True,
            "supportsRunInTerminalRequest": True, "locale": "en-us"})
        assert body.get("supportsConfigurationDoneRequest"), body
        self.ok("attach", {})
        self.ok("configurationDone")
        info = self.ok("debugInfo")
        assert info["isStarted"] is True
        assert info["hashMethod"].lower() == "murmur2"
        assert isinstance(info["hashSeed"], int)
        assert info["tmpFileSuffix"] == ".py"
        assert info["tmpFilePrefix"].endswith(os.sep)
        return info

    def dump(self, code):
        return self.ok("dumpCell", {"code": code})["sourcePath"]

    def stopped(self, reason=None, timeout=60):
        e = self.event("stopped", timeout,
                       lambda e: reason is None or e["body"].get("reason") == reason)
        return e["body"]["threadId"]

    def stack(self, thread):
        frames = self.ok("stackTrace", {"threadId": thread})["stackFrames"]
        assert frames
        return frames

    def local_vars(self, frame_id):
        scopes = self.ok("scopes", {"frameId": frame_id})["scopes"]
        ref = scopes[0]["variablesReference"]
        return {v["name"]: v for v in self.ok("variables", {"variablesReference": ref})["variables"]}


def murmur2(data, seed):
    """Independent of the kernel's: the frontend's hash of a cell."""
    b = data.encode()
    m, h = 0x5BD1E995, seed ^ len(b)
    n = len(b) & ~3
    for i in range(0, n, 4):
        k = int.from_bytes(b[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = b[n:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


CELL_A = "def double(x):\n    y = x * 2\n    return y\n"
CELL_B = "a = 10\nb = double(a)\nprint('b is', b)\n"


def kernel_own(path):
    return any(s in (path or "") for s in ("driver.py", "kdebug.py", "/ipykernel/", "<string>"))


def test_breakpoint_step_inspect_continue(kernel):
    d = Dap(kernel)
    info = d.start()
    # the frontend's file name for a cell, and the kernel's, agree
    path_a = d.dump(CELL_A)
    assert path_a == "%s%d%s" % (info["tmpFilePrefix"], murmur2(CELL_A, info["hashSeed"]),
                                 info["tmpFileSuffix"])
    r, _ = d.finish(d.execute(CELL_A))
    assert r["status"] == "ok", r
    path_b = d.dump(CELL_B)
    bps = d.ok("setBreakpoints", {"source": {"path": path_b}, "breakpoints": [{"line": 2}],
                                  "sourceModified": False})["breakpoints"]
    assert bps and bps[0]["verified"], bps
    assert d.ok("debugInfo")["breakpoints"] == [{"source": path_b, "breakpoints": [{"line": 2}]}]
    assert d.ok("source", {"source": {"path": path_b}})["content"] == CELL_B

    cell = d.execute(CELL_B)
    thread = d.stopped("breakpoint")
    frames = d.stack(thread)
    top = frames[0]
    assert (top["source"]["path"], top["line"]) == (path_b, 2), top
    assert not [f for f in frames if kernel_own(f.get("source", {}).get("path"))], frames
    assert thread in d.ok("debugInfo")["stoppedThreads"]
    v = d.local_vars(top["id"])
    assert v["a"]["value"] == "10" and v["a"]["type"] == "int", v["a"]
    assert not {"__builtins__", "__kernelmgr_driver__", "In", "Out"} & set(v), sorted(v)
    assert d.ok("evaluate", {"expression": "a + 1", "frameId": top["id"],
                             "context": "repl"})["result"] == "11"
    rich = d.ok("richInspectVariables", {"variableName": "a", "frameId": top["id"]})
    assert rich["data"]["text/plain"] == "10", rich

    # into the function another cell defined
    d.ok("stepIn", {"threadId": thread})
    thread = d.stopped("step")
    top = d.stack(thread)[0]
    assert (top["name"], top["source"]["path"], top["line"]) == ("double", path_a, 2), top
    assert d.local_vars(top["id"])["x"]["value"] == "10"
    d.ok("next", {"threadId": thread})
    thread = d.stopped("step")
    top = d.stack(thread)[0]
    assert (top["source"]["path"], top["line"]) == (path_a, 3), top
    assert d.local_vars(top["id"])["y"]["value"] == "20"
    d.ok("stepOut", {"threadId": thread})
    thread = d.stopped("step")
    top = d.stack(thread)[0]
    assert top["source"]["path"] == path_b and top["line"] == 2, top

    d.ok("continue", {"threadId": thread})
    r, out = d.finish(cell)
    assert r["status"] == "ok", r
    assert out == "b is 20\n"

    # not stopped: the variables panel reads the namespace
    top_vars = {v["name"]: v for v in d.ok("inspectVariables")["variables"]}
    # (ipykernel 6.17 lists functions in a "function variables" group)
    assert top_vars["b"]["value"] == "20" and top_vars["a"]["value"] == "10"
    if kernel.lang != "ipykernel":
        # ipykernel 6.17 keeps the threads of the last stop as stopped and
        # never answers this one (it evaluates in a frame that is gone)
        rich = d.ok("richInspectVariables", {"variableName": "b"})
        assert rich["data"]["text/plain"] == "20"
    mods = d.req("modules", {})
    mods = mods.get("body", mods)
    assert mods["totalModules"] > 0 and all("path" in m for m in mods["modules"])
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})


CELL_EARLY = "def triple(x):\n    z = x * 3\n    return z\n"
CELL_CALL = "t = triple(5)\nprint('t is', t)\n"


def test_breakpoint_in_a_cell_run_before_the_debugger(kernel_both):
    """A function defined by a cell run before any debug_request, never
    dumped: its cell was compiled under the name the frontend computes
    (ipykernel names every cell so), so a breakpoint set in it once the
    debugger is on stops when a later cell calls it."""
    kernel = kernel_both
    d = Dap(kernel)
    r, _ = d.finish(d.execute(CELL_EARLY))
    assert r["status"] == "ok", r
    info = d.start()
    path = "%s%d%s" % (info["tmpFilePrefix"], murmur2(CELL_EARLY, info["hashSeed"]),
                       info["tmpFileSuffix"])
    if kernel.lang == "ipykernel":
        # ipykernel 6.17 answers `source`, and debugpy binds a breakpoint,
        # only for a dumped cell's file (JupyterLab dumps a cell before it
        # sets breakpoints in it); ours need no dump
        assert d.dump(CELL_EARLY) == path
    assert d.ok("source", {"source": {"path": path}})["content"] == CELL_EARLY
    bps = d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 2}],
                                  "sourceModified": False})["breakpoints"]
    assert bps and bps[0]["verified"], bps

    cell = d.execute(CELL_CALL)
    thread = d.stopped("breakpoint")
    frames = d.stack(thread)
    top = frames[0]
    assert (top["name"], top["source"]["path"], top["line"]) == ("triple", path, 2), top
    assert d.local_vars(top["id"])["x"]["value"] == "5"
    call_path = "%s%d%s" % (info["tmpFilePrefix"], murmur2(CELL_CALL, info["hashSeed"]),
                            info["tmpFileSuffix"])
    assert [(f["source"]["path"], f["line"]) for f in frames[1:]] == [(call_path, 1)], frames
    assert d.ok("source", {"source": {"path": top["source"]["path"]}})["content"] == CELL_EARLY
    d.ok("continue", {"threadId": thread})
    r, out = d.finish(cell)
    assert r["status"] == "ok", r
    assert out == "t is 15\n"
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})


def test_exception_breakpoint(kernel):
    d = Dap(kernel)
    d.start()
    d.ok("setExceptionBreakpoints", {"filters": ["raised"]})
    code = "try:\n    raise ValueError('boom')\nexcept ValueError:\n    caught = True\n"
    path = d.dump(code)
    cell = d.execute(code)
    thread = d.stopped("exception")
    top = d.stack(thread)[0]
    assert (top["source"]["path"], top["line"]) == (path, 2), top
    exc = d.req("exceptionInfo", {"threadId": thread})
    if exc["success"]:
        assert "ValueError" in exc["body"]["exceptionId"]
    d.ok("continue", {"threadId": thread})
    r, _ = d.finish(cell)
    assert r["status"] == "ok", r
    d.ok("setExceptionBreakpoints", {"filters": []})
    r, _ = d.finish(d.execute("try:\n    1/0\nexcept ZeroDivisionError:\n    pass\n"))
    assert r["status"] == "ok"
    assert not [e for e in d.events if e.get("event") == "stopped"]
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})


def test_pause_and_copy_to_globals(kernel):
    d = Dap(kernel)
    d.start()
    cell = d.execute("import sys, time\ndef spin():\n    n = 0\n    print('spinning')\n"
                     "    sys.stdout.flush()\n    while n >= 0:\n"
                     "        n += 1\n        time.sleep(0.001)\n        if n > 100000:\n"
                     "            return n\nspin()\n")
    # the cell runs in spin(): pause stops it wherever it is
    deadline = time.monotonic() + 30
    while not any(m["msg_type"] == "stream" and "spinning" in m["content"]["text"]
                  for m in d.iopub):
        assert time.monotonic() < deadline, "spin() never started"
        d.pump()
    threads = d.ok("threads")["threads"]
    main = [t for t in threads if t["name"] == "MainThread"] or threads
    d.ok("pause", {"threadId": main[0]["id"]})
    thread = d.stopped("pause")
    frames = d.stack(thread)
    assert frames[0]["name"] in ("spin", "sleep"), frames[0]
    spin = [f for f in frames if f["name"] == "spin"][0]
    if kernel.lang != "ipykernel":  # (no copyToGlobals in ipykernel 6.17)
        d.ok("copyToGlobals", {"srcVariableName": "n", "dstVariableName": "n_at_pause",
                               "srcFrameId": spin["id"]})
    # an interrupt ends the paused cell
    assert control(d, "interrupt_request")["content"].get("status", "ok") == "ok"
    r, _ = d.finish(cell)
    assert r["status"] == "error" and r["ename"] == "KeyboardInterrupt", r
    if kernel.lang != "ipykernel":
        r, out = d.finish(d.execute("print(n_at_pause > 0)"))
        assert (r["status"], out) == ("ok", "True\n"), (r, out)
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})


def control(d, msg_type, content=None, timeout=30):
    msg = d.kc.session.msg(msg_type, content or {})
    d.kc.control_channel.send(msg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d.pump(0)
        try:
            r = d.kc.get_control_msg(timeout=0.05)
        except queue.Empty:
            continue
        if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return r
    raise TimeoutError(f"no reply to {msg_type}")


def test_kernel_answers_while_stopped_and_interrupt_ends_the_cell(kernel):
    d = Dap(kernel)
    d.start()
    code = "import time\nstarted = True\nprint('never')\n"
    path = d.dump(code)
    d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 3}]})
    cell = d.execute(code)
    thread = d.stopped("breakpoint")
    assert kutil.hb_ping(kernel)
    ki = control(d, "kernel_info_request")
    assert ki["content"]["status"] == "ok"
    # (ipykernel 6.17's kernel_info on control has no "debugger" key)
    assert ki["content"].get("debugger", True) is True
    assert d.stack(thread)[0]["line"] == 3  # further debug requests still answered
    # still running for everyone else: a second cell waits behind it
    later = d.execute("print('after')")
    # (ipykernel 6.17 answers an empty interrupt_reply on control)
    assert control(d, "interrupt_request")["content"].get("status", "ok") == "ok"
    r, out = d.finish(cell)
    assert r["status"] == "error" and r["ename"] == "KeyboardInterrupt", r
    assert "never" not in out
    if kernel.lang != "ipykernel":  # (ipykernel 6.17 shows debugpy's frames)
        assert not [ln for ln in r["traceback"] if "pydevd" in ln or "driver.py" in ln], r
    # the cell queued behind it was aborted (stop_on_error) or ran: the kernel works
    d.finish(later)
    r, out = after_error(kernel, lambda: d.finish(d.execute("print(started)")),
                         lambda got: got[0]["status"])
    assert r["status"] == "ok" and out == "True\n", (r, out)
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})


def test_debugger_still_stops_after_an_interrupt(kernel_factory):
    """(ipykernel 6.17: the thread stays "suspended" in debugpy after such an
    interrupt and the next cell hangs at its first line; ours runs on.)"""
    d = Dap(kernel_factory("python", args=PY_ARGS))
    d.start()
    code = "import time\nstarted = True\nprint('never')\n"
    path = d.dump(code)
    d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 3}]})
    cell = d.execute(code)
    d.stopped("breakpoint")
    assert control(d, "interrupt_request")["content"]["status"] == "ok"
    r, _ = d.finish(cell)
    assert r["ename"] == "KeyboardInterrupt"
    again = d.execute(code)
    thread = d.stopped("breakpoint")
    d.ok("continue", {"threadId": thread})
    r, out = d.finish(again)
    assert (r["status"], out) == ("ok", "never\n"), (r, out)
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})


def test_disconnect_leaves_a_normal_kernel(kernel):
    d = Dap(kernel)
    d.start()
    code = "z = 1\nz += 1\n"
    path = d.dump(code)
    d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 2}]})
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})
    r, _ = d.finish(d.execute(code))
    assert r["status"] == "ok", r
    r, out = d.finish(d.execute("print(z)"))
    assert (r["status"], out) == ("ok", "2\n")
    assert not [e for e in d.events if e.get("event") == "stopped"]
    # and a debugger can come back
    d.start()
    d.ok("disconnect", {"restart": False, "terminateDebuggee": False})


def answer_stdin(lines):
    """A stdin handler that answers each input_request with the next line."""
    todo = list(lines)
    prompts = []

    def handler(kc, m):
        if m["msg_type"] == "input_request":
            prompts.append(m["content"]["prompt"])
            kc.input(todo.pop(0) if todo else "c")
    handler.prompts = prompts
    return handler


def test_breakpoint_builtin_over_stdin(kernel):
    h = answer_stdin(["p secret * 2", "c"])
    _, res = kernel.execute("secret = 21\nbreakpoint()\nprint('done')", allow_stdin=True,
                            stdin_handler=h, timeout=60)
    assert res["reply"]["content"]["status"] == "ok", res["reply"]["content"]
    out = kutil.stream_text(res["iopub"])
    assert "done" in out
    if kernel.lang == "ipykernel":
        # ipykernel 6.17 with debugpy installed: breakpoint() without an
        # attached frontend does not stop (debugpy's hook); ours is pdb
        return
    assert "42" in out, (out, h.prompts)
    assert h.prompts and "Pdb" in h.prompts[0], h.prompts


def after_error(kernel, send, status):
    """send() after a cell that failed: ipykernel ends its stop_on_error
    abort with a callback of its event loop, so a request it reads before
    that callback ran (a loaded machine) is aborted too, though nothing
    failed; sent again, it runs. The kernelmgr kernel is held to its first
    answer. Returns what the last send() returned."""
    got = send()
    deadline = time.monotonic() + 30
    while kernel.lang == "ipykernel" and status(got) == "aborted" and time.monotonic() < deadline:
        got = send()
    return got


def test_post_mortem_debug_magic_over_stdin(kernel):
    _, res = kernel.execute("def f(v):\n    w = v + 1\n    raise RuntimeError(w)\nf(41)")
    assert res["reply"]["content"]["status"] == "error"
    handlers = []

    def debug():
        handlers.append(answer_stdin(["p w", "q"]))
        return kernel.execute("%debug", allow_stdin=True, stdin_handler=handlers[-1],
                              timeout=60)[1]

    res = after_error(kernel, debug, lambda got: got["reply"]["content"]["status"])
    h = handlers[-1]
    out = kutil.stream_text(res["iopub"])
    assert "42" in out, (out, res["reply"]["content"])
    assert h.prompts, "no input_request"


def test_pdb_magic_runs_the_post_mortem_debugger_at_once(kernel):
    _, res = kernel.execute("%pdb on")
    assert res["reply"]["content"]["status"] == "ok", res["reply"]["content"]
    h = answer_stdin(["p v * 3", "q"])
    _, res = kernel.execute("def g(v):\n    raise KeyError(v)\ng(14)", allow_stdin=True,
                            stdin_handler=h, timeout=60)
    assert res["reply"]["content"]["status"] == "error"
    assert "42" in kutil.stream_text(res["iopub"]), res["iopub"]
    assert h.prompts


def test_kernel_info_says_debugger(kernel_factory, tmp_path):
    k = kernel_factory("python", args=PY_ARGS)
    # known once the worker has said it is ready (it checks that debugpy is
    # importable without importing it)
    info = kutil.poll_until(lambda: kutil.control_request(k, "kernel_info_request")["content"],
                            lambda i: i["kernelmgr"]["worker_ready"], 30, "worker ready")
    assert info["debugger"] is True


def kernelspec_metadata(tmp_path, python):
    import mgrutil
    prefix = tmp_path / ("prefix-" + Path(python).parent.parent.name)
    p = subprocess.run([mgrutil.KM, "kernelspec", "install", "--prefix", str(prefix),
                        "--python", python, "--json"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    spec = prefix / "share" / "jupyter" / "kernels" / "kernelmgr-python" / "kernel.json"
    bash = prefix / "share" / "jupyter" / "kernels" / "kernelmgr-bash" / "kernel.json"
    return (json.loads(spec.read_text())["metadata"],
            json.loads(bash.read_text())["metadata"] if bash.exists() else {})


def test_kernelspec_says_debugger(tmp_path):
    py, sh = kernelspec_metadata(tmp_path, SYS_PYTHON)
    assert py.get("debugger") is True, py
    assert "debugger" not in sh, sh  # the bash kernel has none


def test_without_debugpy_no_debugger_and_a_clear_refusal(kernel_factory, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([SYS_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert "debugger" not in kernelspec_metadata(tmp_path, str(venv / "bin" / "python"))[0]
    k = kernel_factory("python", args=("--python", str(venv / "bin" / "python"), "--sandbox",
                                       SANDBOX))
    info = kutil.poll_until(lambda: kutil.control_request(k, "kernel_info_request")["content"],
                            lambda i: i["kernelmgr"]["worker_ready"], 30, "worker ready")
    assert info["debugger"] is False
    d = Dap(k)
    rep = d.req("initialize", {"adapterID": "python"})
    assert rep["success"] is False and "debugpy" in rep["message"], rep
    r, out = d.finish(d.execute("print(1)"))
    assert (r["status"], out) == ("ok", "1\n")


# ------------------------------------------------------------ through the gateway


class WsDap:
    """A debugger frontend over the gateway's kernel WebSocket (as JupyterLab
    talks to a gateway): every message seen kept in order."""

    def __init__(self, ws):
        self.ws = ws
        self.seen = []
        self.seq = 0

    def send(self, msg_type, content, channel):
        import test_gateway as tg
        m = tg.msg(msg_type, content, channel)
        self.ws.send(json.dumps(m))
        return m["header"]["msg_id"]

    def wait(self, pred, what, deadline=60):
        end = time.monotonic() + deadline
        while True:
            for i, r in enumerate(self.seen):
                if pred(r):
                    return self.seen.pop(i)
            assert time.monotonic() < end, f"no {what}; seen {[r['header']['msg_type'] for r in self.seen]}"
            self.seen.append(json.loads(self.ws.recv()))

    def ok(self, command, arguments=None):
        self.seq += 1
        mid = self.send("debug_request", {"type": "request", "seq": self.seq, "command": command,
                                          "arguments": arguments or {}}, "control")
        r = self.wait(lambda r: r["parent_header"].get("msg_id") == mid
                      and r["header"]["msg_type"] == "debug_reply", f"debug_reply to {command}")
        assert r["channel"] == "control" and r["content"]["success"], r
        return r["content"].get("body") or {}

    def event(self, name):
        return self.wait(lambda r: r["header"]["msg_type"] == "debug_event"
                         and r["content"].get("event") == name, f"{name} event")["content"]


def test_debug_an_agents_session_through_the_gateway(make_mgr):
    import threading

    import mgrutil
    import test_gateway as tg
    if not mgrutil.have_kernel("python"):
        pytest.skip("no kernel-python")
    gw = tg.GW(make_mgr)  # the agent's session "agent" runs x = 41
    st, specs = gw.req("GET", "/api/kernelspecs")
    assert st == 200, specs
    langs = {n: v["spec"] for n, v in specs["kernelspecs"].items()}
    assert all(v["metadata"].get("debugger") is True for v in langs.values()
               if v["language"] == "python"), langs
    assert not any(v["metadata"].get("debugger") for v in langs.values()
                   if v["language"] == "bash"), langs
    k = gw.kernel_of("agent")
    ws = gw.ws(k["id"])
    try:
        info = tg.wait_ready(ws)
        assert info["debugger"] is True, info
        d = WsDap(ws)
        d.ok("initialize", {"adapterID": "python", "pathFormat": "path", "linesStartAt1": True,
                            "columnsStartAt1": True})
        d.ok("attach", {})
        d.ok("configurationDone")
        names = {v["name"]: v for v in d.ok("inspectVariables")["variables"]}
        assert names["x"]["value"] == "41"  # the agent's namespace
        code = "y = x + 1\nprint('y is', y)\n"
        path = d.ok("dumpCell", {"code": code})["sourcePath"]
        d.ok("setBreakpoints", {"source": {"path": path}, "breakpoints": [{"line": 2}]})
        # the agent runs that cell; it stops at the breakpoint
        done = {}
        t = threading.Thread(target=lambda: done.update(r=gw.m.exec("agent", code)))
        t.start()
        thread = d.event("stopped")["body"]["threadId"]
        top = d.ok("stackTrace", {"threadId": thread})["stackFrames"][0]
        assert (top["source"]["path"], top["line"]) == (path, 2), top
        scope = d.ok("scopes", {"frameId": top["id"]})["scopes"][0]
        vs = {v["name"]: v["value"] for v in
              d.ok("variables", {"variablesReference": scope["variablesReference"]})["variables"]}
        assert vs["y"] == "42", vs
        assert t.is_alive()  # the agent's exec is still running
        d.ok("continue", {"threadId": thread})
        t.join(60)
        rc, res, p = done["r"]
        assert rc == 0 and res[0]["stdout"] == "y is 42\n", (p.stderr, res)
        # stopped and left there: the agent's timeout still applies, the
        # cell ends interrupted and the session works on
        t = threading.Thread(target=lambda: done.update(r=gw.m.exec("agent", code,
                                                                      "--timeout", "3")))
        t.start()
        d.event("stopped")
        t.join(90)
        rc, res, p = done["r"]
        assert res[0]["status"] == "timeout", (p.stderr, res)
        d.ok("disconnect", {"restart": False, "terminateDebuggee": False})
        tg.agent_works(gw, "print(y)", "42")
    finally:
        ws.close()
