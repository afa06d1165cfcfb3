"""kernels/python/driver.py on its own: the worker side of
kernels/WORKER_PROTOCOL.md spoken directly over pipes (no kernel server), so
framing, ordering and interrupt robustness are checked at the source."""
import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from test_debugger import murmur2  # the frontend's hash, independent of the driver's

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "kernels" / "python" / "driver.py"
PYTHON = os.environ.get("KM_TEST_DRIVER_PYTHON", "/usr/bin/python3")


class Driver:
    """driver.py under PYTHON with stdout/stderr/request/event pipes."""

    def __init__(self, tmp_path, python=PYTHON, env=None):
        req_r, self.req_w = os.pipe()
        self.evt_r, evt_w = os.pipe()
        e = dict(os.environ)
        e.pop("MPLBACKEND", None)
        e.update(env or {})
        e["KERNELMGR_REQ_FD"] = str(req_r)
        e["KERNELMGR_EVT_FD"] = str(evt_w)
        self.proc = subprocess.Popen(
            [python, "-u", str(DRIVER)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(req_r, evt_w), env=e, cwd=str(tmp_path),
            start_new_session=True)
        os.close(req_r)
        os.close(evt_w)
        self.buf = b""
        self.out = {"stdout": b"", "stderr": b""}
        assert self.event(10)["type"] == "ready"

    def send(self, *fields):
        os.write(self.req_w, b"".join(f.encode() + b"\0" for f in fields))

    def _pump(self, timeout):
        fds = {self.evt_r: None, self.proc.stdout.fileno(): "stdout",
               self.proc.stderr.fileno(): "stderr"}
        r, _, _ = select.select(list(fds), [], [], timeout)
        got_event = False
        for fd in r:
            data = os.read(fd, 1 << 16)
            if fds[fd] is None:
                if not data:
                    raise EOFError("driver closed its event pipe")
                self.buf += data
                got_event = True
            else:
                self.out[fds[fd]] += data
        return got_event

    def event(self, timeout=20):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no event; stdout=%r stderr=%r" % (self.out["stdout"][-500:],
                                                                    self.out["stderr"][-2000:]))
            self._pump(left)
        line, self.buf = self.buf.split(b"\n", 1)
        ev = json.loads(line)
        # Like the kernel server: once the event is handled, answer its sync
        # (WORKER_PROTOCOL.md, "Ordering"); the driver waits for it.
        if ev.pop("sync", False) is True:
            self.send("sync")
        return ev

    def until(self, types, timeout=30):
        evs = []
        while True:
            ev = self.event(timeout)
            evs.append(ev)
            if ev["type"] in types:
                return evs

    def execute(self, code, allow_stdin=False, silent=False, count=1, timeout=30):
        self.out = {"stdout": b"", "stderr": b""}
        self.send("execute", code, "1" if silent else "0", "1", "1" if allow_stdin else "0",
                  str(count))
        evs = self.until(("done",), timeout)
        # Output written before "done" is in the pipes by now: drain it.
        while self._pump(0.05) or select.select([self.proc.stdout, self.proc.stderr], [], [], 0)[0]:
            pass
        return evs

    def close(self):
        os.close(self.req_w)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.evt_r)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture(params=["off", "on"])
def drv(request, tmp_path):
    """The driver with the `ipython` option off (the default: the stdlib
    path) and on (KERNELMGR_IPYTHON=1: every cell through IPython's shell,
    as ipykernel); .ipython says which. Where the two differ, the test says
    what each does."""
    on = request.param == "on"
    d = Driver(tmp_path, env={"KERNELMGR_IPYTHON": "1"} if on else None)
    d.ipython = on
    yield d
    d.close()


def types_of(evs):
    return [e["type"] for e in evs]


def plain(text):
    """text without ANSI colours (IPython's tracebacks and inspector, as
    ipykernel sends them, are coloured)."""
    if isinstance(text, list):
        text = "\n".join(text)
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def cell_in(n):
    """IPython 8's name for cell n in tracebacks ("Cell In [7]" up to 8.5,
    "Cell In[7]" later)."""
    return r"Cell In ?\[%d\]" % n


def test_last_expression_and_namespace(drv):
    evs = drv.execute("x = 40\nx + 2")
    assert types_of(evs) == ["execute_result", "done"]
    assert evs[0]["data"]["text/plain"] == "42"
    assert evs[1] == {"type": "done", "status": "ok", "exit_code": 0}
    evs = drv.execute("x;")
    assert types_of(evs) == ["done"]
    evs = drv.execute("y = x * 2  # no result")
    assert types_of(evs) == ["done"]
    evs = drv.execute("y # comment\n")
    assert evs[0]["data"]["text/plain"] == "80"
    evs = drv.execute("_ + 1")
    assert evs[0]["data"]["text/plain"] == "81"
    evs = drv.execute("import __main__; __main__.y, __name__")
    assert evs[0]["data"]["text/plain"] == "(80, '__main__')"
    evs = drv.execute("None")
    assert types_of(evs) == ["done"]
    evs = drv.execute("1", silent=True)
    assert types_of(evs) == ["done"]


def test_stdout_stderr_order_and_fd_level(drv):
    evs = drv.execute(
        "import os, sys\nprint('a')\nos.system('echo b')\nprint('c', end='')\n"
        "os.write(1, b'd\\n')\nprint('e', file=sys.stderr)\nos.system('echo f >&2');")
    assert types_of(evs) == ["done"]
    assert drv.out["stdout"] == b"a\nb\ncd\n"
    assert drv.out["stderr"] == b"e\nf\n"


def test_error_traceback_user_frames_only(drv):
    evs = drv.execute("def f(a):\n    return 1 / a\n\nf(0)", count=7)
    err = evs[0]
    assert err["type"] == "error"
    assert err["ename"] == "ZeroDivisionError"
    assert err["evalue"] == "division by zero"
    if drv.ipython:
        tb = plain(err["traceback"])
        assert "driver.py" not in tb and "kipython" not in tb
        # IPython's traceback, as ipykernel sends it: cells named "Cell In[N]"
        assert re.search(r"ZeroDivisionError +Traceback \(most recent call last\)", tb)
        assert re.search(cell_in(7) + r", line 4\n", tb), tb
        assert re.search(cell_in(7) + r", line 2, in f\(a\)", tb), tb
        assert "----> 2     return 1 / a" in tb
    else:
        tb = "\n".join(err["traceback"])
        assert "driver.py" not in tb
        assert '"<cell-7>", line 4' in tb and '"<cell-7>", line 2, in f' in tb
        assert "return 1 / a" in tb
        assert "\x1b[" not in tb
    assert evs[-1] == {"type": "done", "status": "error", "exit_code": 1}


def test_cells_compile_under_the_debugger_file_name_tracebacks_say_cell_n(drv):
    # no debugger: still the name a debugger frontend computes (Murmur2 of
    # the code), and the traceback shows each frame's own cell
    code = "def f(a):\n    return 1 / a\n"
    evs = drv.execute(code, count=2)
    assert evs[-1]["status"] == "ok", evs
    evs = drv.execute("print(f.__code__.co_filename)", count=3)
    name = drv.out["stdout"].decode().strip()
    assert re.fullmatch(r"/\S*/kernelmgr-cells-\d+/\d+\.py", name), name
    assert name.endswith("/%d.py" % murmur2(code, 0xC70F6907)), name
    evs = drv.execute("x = 1\nf(0)", count=4)
    if drv.ipython:
        # IPython's names, as ipykernel's tracebacks (the same file names)
        tb = plain(evs[0]["traceback"])
        assert re.search(cell_in(4) + r", line 2\n", tb), tb
        assert re.search(cell_in(2) + r", line 2, in f\(a\)", tb), tb
    else:
        tb = "\n".join(evs[0]["traceback"])
        assert '"<cell-4>", line 2' in tb and '"<cell-2>", line 2, in f' in tb, tb
    assert "return 1 / a" in tb and "kernelmgr-cells" not in tb, tb


def test_syntax_error_points_at_line(drv):
    evs = drv.execute("x = 1\ny = (1 +\n", count=3)
    err = evs[0]
    assert err["ename"] == "SyntaxError"
    tb = plain(err["traceback"])
    name = cell_in(3) if drv.ipython else '"<cell-3>"'
    assert re.search(name + ", line 2", tb) and "driver.py" not in tb, tb
    assert "^" in tb
    evs = drv.execute("x = = 2", count=4)
    tb = plain(evs[0]["traceback"])
    assert "x = = 2" in tb and "^" in tb and "line 1" in tb


def test_sys_exit(drv):
    evs = drv.execute("import sys\nsys.exit(3)")
    assert evs[0]["ename"] == "SystemExit"
    assert evs[-1] == {"type": "done", "status": "error", "exit_code": 3}
    evs = drv.execute("import sys\nprint('x')\nsys.exit(0)\nprint('not here')")
    assert types_of(evs) == ["done"] and evs[-1]["status"] == "ok"
    assert drv.out["stdout"] == b"x\n"


def test_rich_display(drv):
    code = '''
class R:
    def _repr_html_(self): return "<b>hi</b>"
    def _repr_markdown_(self): return "**hi**"
    def _repr_svg_(self): return "<svg></svg>"
    def _repr_png_(self): return b"\\x89PNG"
    def _repr_jpeg_(self): return b"\\xff\\xd8"
    def _repr_latex_(self): return "$x$"
    def _repr_json_(self): return {"a": 1}
    def __repr__(self): return "R()"
class M:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": "M!", "application/x-custom": "c"}, {"application/x-custom": {"k": 1}}
class Broken:
    def _repr_html_(self): raise ValueError("nope")
R()
'''
    evs = drv.execute(code)
    data = evs[0]["data"]
    assert data == {"text/html": "<b>hi</b>", "text/markdown": "**hi**",
                    "image/svg+xml": "<svg></svg>", "image/png": "iVBORw==",
                    "image/jpeg": "/9g=", "text/latex": "$x$", "application/json": {"a": 1},
                    "text/plain": "R()"}
    evs = drv.execute("M()")
    assert evs[0]["data"] == {"text/plain": "M!", "application/x-custom": "c"}
    assert evs[0]["metadata"] == {"application/x-custom": {"k": 1}}
    evs = drv.execute("Broken()")
    if drv.ipython:
        # as IPython's formatters do: the failing one's traceback, then the rest
        assert types_of(evs) == ["error", "execute_result", "done"], evs
        assert evs[0]["ename"] == "ValueError" and evs[0]["evalue"] == "nope"
        assert evs[1]["data"]["text/plain"].startswith("<__main__.Broken")
        assert evs[-1]["status"] == "ok"
    else:
        assert evs[0]["type"] == "execute_result"
        assert evs[0]["data"]["text/plain"].startswith("<__main__.Broken")
        assert b"ValueError: nope" in drv.out["stderr"]
    evs = drv.execute("R")  # a class shows as a class, not through its methods
    assert list(evs[0]["data"]) == ["text/plain"]


def test_display_update_and_clear(drv):
    if drv.ipython:  # IPython's own clear_output (the builtin is kept too)
        drv.execute("from IPython.display import clear_output")
    evs = drv.execute("h = display(R() if False else 'one', display_id='d1')\n"
                      "h.update('two')\ndisplay(1, 2)\nclear_output(wait=True)\n"
                      "print(type(h).__name__)\n"
                      "display({'text/plain': 'raw'}, raw=True)")
    assert types_of(evs) == ["display_data"] * 4 + ["clear_output", "display_data", "done"]
    assert evs[0]["data"] == {"text/plain": "'one'"}
    assert evs[0]["transient"] == {"display_id": "d1"} and evs[0]["update"] is False
    assert evs[1]["data"] == {"text/plain": "'two'"} and evs[1]["update"] is True
    assert evs[1]["transient"] == {"display_id": "d1"}
    assert [e["data"]["text/plain"] for e in evs[2:4]] == ["1", "2"]
    assert evs[4]["wait"] is True
    assert evs[5]["data"] == {"text/plain": "raw"}
    assert drv.out["stdout"] == b"DisplayHandle\n"


def test_ipython_display_routed(drv):
    evs = drv.execute("from IPython.display import display as d, HTML\nd(HTML('<i>x</i>'))")
    assert types_of(evs) == ["display_data", "done"]
    assert evs[0]["data"]["text/html"] == "<i>x</i>"


def test_pandas_and_matplotlib(drv):
    code = ("import pandas as pd\nimport matplotlib.pyplot as plt\n"
            "df = pd.DataFrame({'a': [1, 2], 'b': [3, 4]})\n"
            "plt.plot([1, 2, 3])\nplt.show()\nplt.figure(); plt.plot([3, 2])\ndf")
    evs = drv.execute(code, timeout=60)
    assert types_of(evs) == ["display_data", "execute_result", "display_data", "done"]
    assert evs[0]["data"]["image/png"].startswith("iVBORw0KGgo")
    assert "<table" in evs[1]["data"]["text/html"]
    assert "a  b" in evs[1]["data"]["text/plain"]
    assert evs[2]["data"]["image/png"].startswith("iVBORw0KGgo")
    assert evs[2]["data"]["text/plain"].startswith("<Figure size")
    assert b"non-GUI" not in drv.out["stderr"]
    evs = drv.execute("import os\nprint(plt.get_fignums(), os.environ['MPLBACKEND'])")
    assert types_of(evs) == ["done"]
    # with IPython, ipykernel's default backend
    assert drv.out["stdout"] == (b"[] module://matplotlib_inline.backend_inline\n" if drv.ipython
                                 else b"[] Agg\n")
    evs = drv.execute("fig, ax = plt.subplots(); fig")
    assert evs[0]["type"] == "execute_result" and "image/png" in evs[0]["data"]
    # the same figure is also flushed at cell end (as IPython's inline backend does)
    assert types_of(evs) == ["execute_result", "display_data", "done"]


def test_no_heavy_imports_at_start(tmp_path):
    # the `ipython` option off (the default): not even IPython, importable here
    d = Driver(tmp_path)
    try:
        evs = d.execute("import sys\nsorted(m for m in ('matplotlib', 'pandas', 'numpy', 'jedi',"
                        " 'IPython') if m in sys.modules)")
        assert evs[0]["data"]["text/plain"] == "[]"
    finally:
        d.close()
    # on: IPython loads at start with what it imports itself (jedi, asyncio),
    # as ipykernel's start does; nothing else
    d = Driver(tmp_path, env={"KERNELMGR_IPYTHON": "1"})
    try:
        evs = d.execute("import sys, os\n(sorted(m for m in ('matplotlib', 'pandas', 'numpy')"
                        " if m in sys.modules), 'IPython' in sys.modules, "
                        "'KERNELMGR_IPYTHON' in os.environ)")
        assert evs[0]["data"]["text/plain"] == "([], True, False)"
    finally:
        d.close()


def test_input_and_getpass(drv):
    drv.send("execute", "a = input('name? ')\nimport getpass\nb = getpass.getpass()\na, b",
             "0", "1", "1", "1")
    ev = drv.event()
    assert ev == {"type": "input_request", "prompt": "name? ", "password": False}
    drv.send("input_reply", "ann")
    ev = drv.event()
    assert ev == {"type": "input_request", "prompt": "Password: ", "password": True}
    drv.send("input_reply", "s3cret")
    evs = drv.until(("done",))
    assert evs[0]["data"]["text/plain"] == "('ann', 's3cret')"
    evs = drv.execute("input('x')")
    assert evs[0]["ename"] == "StdinNotImplementedError"
    assert "allow_stdin is false" in evs[0]["evalue"]
    drv.send("execute", "input()", "0", "1", "1", "1")
    assert drv.event()["type"] == "input_request"
    drv.send("input_cancel")
    evs = drv.until(("done",))
    assert evs[0]["ename"] == "KeyboardInterrupt"


def test_interrupt_keeps_state(drv):
    drv.execute("z = 5")
    drv.send("execute", "import time\nprint('go', flush=True)\ntime.sleep(30)", "0", "1", "0",
             "2")
    deadline = time.monotonic() + 10
    while b"go" not in drv.out["stdout"] and time.monotonic() < deadline:
        drv._pump(0.1)
    os.killpg(drv.proc.pid, signal.SIGINT)
    evs = drv.until(("done",))
    assert evs[0]["type"] == "error" and evs[0]["ename"] == "KeyboardInterrupt"
    tb = plain(evs[0]["traceback"])
    assert "driver.py" not in tb and "kipython" not in tb, tb
    if drv.ipython:
        assert "time.sleep(30)" in tb, tb
    assert evs[-1]["status"] == "error"
    # interrupts between cells are ignored; the namespace survives
    for _ in range(5):
        os.killpg(drv.proc.pid, signal.SIGINT)
        time.sleep(0.02)
    evs = drv.execute("z")
    assert evs[0]["data"]["text/plain"] == "5"
    assert drv.proc.poll() is None


def test_interrupt_storm_while_emitting(drv):
    """SIGINTs while the driver writes events must never corrupt a line."""
    drv.send("execute", "for i in range(3000):\n    display(i)", "0", "1", "0", "1")
    evs = []
    while True:
        try:
            os.killpg(drv.proc.pid, signal.SIGINT)
        except ProcessLookupError:
            break
        drv._pump(0.001)
        while b"\n" in drv.buf:  # parsed (and synced) as they come
            evs.append(drv.event())  # every line parses as JSON
        if evs and evs[-1]["type"] == "done":
            break
    if not evs or evs[-1]["type"] != "done":
        evs += drv.until(("done",))
    assert evs[-1]["type"] == "done"
    evs = drv.execute("'alive'")
    assert evs[0]["data"]["text/plain"] == "'alive'"


def test_complete(drv):
    drv.execute("import os\nmy_variable = 1\nclass K:\n    attr_one = 1\n    attr_two = 2\nk = K()")
    drv.send("complete", "my_va", "5")
    ev = drv.event()
    assert ev["type"] == "complete_reply"
    assert "my_variable" in ev["matches"]
    assert ev["cursor_start"] == 0 and ev["cursor_end"] == 5
    drv.send("complete", "x = k.attr_", "11")
    ev = drv.event()
    assert set(ev["matches"]) >= {"attr_one", "attr_two"}
    assert ev["cursor_start"] == 6 and ev["cursor_end"] == 11
    drv.send("complete", "print(os.pa", "11")
    ev = drv.event()
    assert "path" in ev["matches"] or "os.path" in ev["matches"]


def test_complete_fallback_rlcompleter(tmp_path):
    # -I: no user site, PYTHON* ignored; jedi import blocked by a module shim
    (tmp_path / "nojedi").mkdir()
    (tmp_path / "nojedi" / "jedi.py").write_text("raise ImportError('blocked for the test')\n")
    d = Driver(tmp_path, env={"PYTHONPATH": str(tmp_path / "nojedi")})
    try:
        d.execute("class K:\n    attr_one = 1\nk = K()\nmy_variable = 2")
        d.send("complete", "k.attr_o", "8")
        ev = d.event()
        assert ev["matches"] == ["attr_one"]
        assert ev["cursor_end"] == 8 and ev["cursor_start"] == 2
        d.send("complete", "1 + my_v", "8")
        ev = d.event()
        assert ev["matches"] == ["my_variable"] and ev["cursor_start"] == 4
    finally:
        d.close()


def test_inspect(drv):
    drv.execute("def f(a, b=2):\n    '''Adds things.'''\n    return a + b\nn = 5")
    drv.send("inspect", "f", "1", "0")
    ev = drv.event()
    assert ev["found"] is True
    t = plain(ev["data"]["text/plain"])
    assert "Signature: f(a, b=2)" in t and "Adds things." in t
    drv.send("inspect", "f(1, ", "5", "1")
    ev = drv.event()
    assert ev["found"] is True and "return a + b" in plain(ev["data"]["text/plain"])
    drv.send("inspect", "nosuchname", "3", "0")
    assert drv.event() == {"type": "inspect_reply", "found": False, "data": {}, "metadata": {}}
    drv.send("inspect", "os.path.join", "8", "0")
    assert drv.event()["found"] is False  # os not imported in the namespace
    drv.send("inspect", "len", "2", "0")
    ev = drv.event()
    assert ev["found"] and "Return the number of items" in ev["data"]["text/plain"]


@pytest.mark.parametrize("code,status,indent", [
    ("x = 1", "complete", None),
    ("for i in range(3):", "incomplete", "    "),
    ("def f():\n    if x:", "incomplete", "        "),
    ("if x:\n    y = 1", "incomplete", "    "),
    ("if x:\n    y = 1\n", "complete", None),
    ("x = (1,", "incomplete", ""),
    ("x = = 1", "invalid", None),
    ("", "complete", None),
])
def test_is_complete(drv, code, status, indent):
    drv.send("is_complete", code)
    ev = drv.event()
    assert ev["type"] == "is_complete_reply" and ev["status"] == status
    if indent is not None:
        assert ev["indent"] == indent


def test_top_level_await(drv):
    evs = drv.execute("import asyncio\nawait asyncio.sleep(0)\nasync def g(): return 9\nawait g()")
    assert evs[0]["data"]["text/plain"] == "9"


def test_unknown_request_and_stray_input_reply(drv):
    drv.send("input_reply", "late")
    drv.send("input_cancel")
    evs = drv.execute("1 + 1")
    assert evs[0]["data"]["text/plain"] == "2"


def test_workspace_on_sys_path(drv, tmp_path):
    (tmp_path / "mymod.py").write_text("VALUE = 'ws'\n")
    evs = drv.execute("import mymod, sys\nmymod.VALUE, sys.argv")
    assert evs[0]["data"]["text/plain"] == "('ws', [''])"
    evs = drv.execute("import driver")
    assert evs[0]["ename"] == "ModuleNotFoundError"


def test_shell_and_magics(drv, tmp_path):
    evs = drv.execute("!echo from shell\n%matplotlib inline\nx = 1\n%pwd")
    assert types_of(evs) == ["execute_result", "done"], evs
    assert evs[0]["data"]["text/plain"] == repr(str(tmp_path))
    # with IPython on a pty, as ipykernel runs it: CRLF
    assert drv.out["stdout"] == (b"from shell\r\n" if drv.ipython else b"from shell\n")
    evs = drv.execute("if True:\n    !exit 3\n_exit_code")
    assert evs[0]["data"]["text/plain"] == "3"
    # IPython is importable here: its magics run (without IPython
    # see test_py_ipython.py::test_no_ipython_named_errors)
    evs = drv.execute("%timeit -n1 -r1 1")
    assert types_of(evs) == ["done"] and b"per loop" in drv.out["stdout"]
    # valid Python is never rewritten
    evs = drv.execute("a = 5\nb = 2\na %b")
    assert evs[0]["data"]["text/plain"] == "1"
    evs = drv.execute("x = (1 +\n!echo no)")
    assert evs[0]["ename"] == "SyntaxError"


def test_late_sigint_of_an_announced_interrupt_is_ignored(drv):
    """The kernel announces each SIGINT with an `interrupt` request. When the
    announcement ended an input wait and the signal itself arrives only in
    the next cell (the sandbox's init forwards asynchronously), that cell
    must not be interrupted."""
    drv.send("execute", "input()", "0", "1", "1", "1")
    assert drv.event()["type"] == "input_request"
    drv.send("interrupt", "1")  # the announcement; its SIGINT is "in flight"
    drv.send("input_cancel")
    evs = drv.until(("done",))
    assert evs[0]["ename"] == "KeyboardInterrupt"
    drv.send("execute", "import time\nprint('go', flush=True)\ntime.sleep(1)\nprint('end')",
             "0", "1", "0", "2")
    deadline = time.monotonic() + 10
    while b"go" not in drv.out["stdout"] and time.monotonic() < deadline:
        drv._pump(0.1)
    os.killpg(drv.proc.pid, signal.SIGINT)  # the late one
    evs = drv.until(("done",))
    assert evs[-1] == {"type": "done", "status": "ok", "exit_code": 0}, evs
    # an announced interrupt still works, and so does an unannounced one
    drv.send("execute", "import time\nprint('go', flush=True)\ntime.sleep(30)", "0", "1", "0",
             "3")
    drv.out["stdout"] = b""
    deadline = time.monotonic() + 10
    while b"go" not in drv.out["stdout"] and time.monotonic() < deadline:
        drv._pump(0.1)
    drv.send("interrupt", "2")
    os.killpg(drv.proc.pid, signal.SIGINT)
    evs = drv.until(("done",))
    assert evs[0]["ename"] == "KeyboardInterrupt"
    evs = drv.execute("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\n"
                      "time.sleep(5)")
    assert evs[0]["ename"] == "KeyboardInterrupt"


def test_execute_ext_user_expressions(drv):
    drv.execute("a = 2")
    drv.send("execute_ext", "b = a + 1", "0", "1", "0", "2",
             json.dumps({"user_expressions": {"s": "a + b", "e": "nope"}}))
    evs = drv.until(("done",))
    ue = evs[-1]["user_expressions"]
    assert ue["s"] == {"status": "ok", "data": {"text/plain": "5"}, "metadata": {}}
    assert ue["e"]["status"] == "error" and ue["e"]["ename"] == "NameError"
