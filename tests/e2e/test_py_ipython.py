"""The Python kernel's IPython compatibility: magics,
`!`/`?` syntax, the pretty printer, the inline backend and the requests, on
both paths with IPython importable (Debian's python3): the `ipython` option
on (KERNELMGR_IPYTHON=1, kernel-python's --ipython on: every cell through
IPython's shell, as ipykernel) and off (the default: the stdlib path, IPython
loaded lazily, never for plain-Python cells); and without IPython (a venv
without system site packages)."""
import base64
import os
import re
import struct
import subprocess
import time

import pytest

import kutil
from kutil import of_type, stream_text
from test_python_driver import Driver, plain

SYS_PY = "/usr/bin/python3"
KM_TEST_SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")


def types_of(evs):
    return [e["type"] for e in evs]


def result(evs):
    r = [e for e in evs if e["type"] == "execute_result"]
    assert r, evs
    return r[0]["data"]["text/plain"]


def ok(d, code, **kw):
    evs = d.execute(code, **kw)
    assert evs[-1]["status"] == "ok", (code, evs, d.out)
    return evs


IPYTHON_ON = {"KERNELMGR_IPYTHON": "1"}


@pytest.fixture(params=["on", "off"])
def ipy(request, tmp_path):
    """IPython importable, the `ipython` option on and off: what both paths
    do alike."""
    d = Driver(tmp_path, python=SYS_PY, env=IPYTHON_ON if request.param == "on" else None)
    d.path = request.param
    yield d
    d.close()


@pytest.fixture
def ipy_on(tmp_path):
    """The IPython path: every cell through IPython's shell."""
    d = Driver(tmp_path, python=SYS_PY, env=IPYTHON_ON)
    yield d
    d.close()


@pytest.fixture
def lazy(tmp_path):
    """The stdlib path (the default) with IPython importable."""
    d = Driver(tmp_path, python=SYS_PY)
    yield d
    d.close()


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A venv without system site packages: IPython is not importable."""
    venv = tmp_path_factory.mktemp("noipy") / "venv"
    subprocess.run([SYS_PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    r = subprocess.run([py, "-c", "import IPython"], capture_output=True)
    assert r.returncode != 0, "IPython must not be importable in the bare venv"
    return py


@pytest.fixture
def bare(tmp_path, bare_python):
    d = Driver(tmp_path, python=bare_python)
    yield d
    d.close()


def ipython_loaded(d):
    return result(ok(d, "import sys as _s\n'IPython' in _s.modules")) == "True"


def test_every_cell_runs_through_ipython(ipy_on):
    ipy = ipy_on
    # IPython importable: loaded at start, and plain Python cells run
    # through its shell as in ipykernel (history, display hook, _i)
    assert ipython_loaded(ipy)
    ok(ipy, "x = [1, 2, {'a': (3, 'b')}]\nx", count=2)
    assert result(ok(ipy, "class R:\n    def __repr__(self): return 'R!'\nR()", count=3)) == "R!"
    assert result(ok(ipy, "_i == In[3] and _ii == In[2] and _i.endswith('R()'), _3",
                     count=4)) == "(True, R!)"
    assert result(ok(ipy, "import sys\nsys.displayhook.__class__.__name__, "
                          "get_ipython().__class__.__name__", count=5)) == (
        "('KDisplayHook', 'KShell')")
    ipy.execute("x = = 1")
    ipy.send("is_complete", "for i in range(3):")
    assert ipy.event()["status"] == "incomplete"
    ipy.send("complete", "pri", "3")
    assert "print" in ipy.event()["matches"]
    # the terminal shell (IPython.embed, prompt_toolkit) loads only when used
    assert result(ok(ipy, "'prompt_toolkit' in sys.modules", count=8)) == "False"
    assert result(ok(ipy, "from IPython.terminal.embed import InteractiveShellEmbed\n"
                          "import IPython.terminal.embed as e, IPython\n"
                          "(e.InteractiveShellEmbed.__name__, IPython.embed.__name__, "
                          "'prompt_toolkit' in sys.modules)", count=9)) == (
        "('InteractiveShellEmbed', 'embed', True)")
    # interactive-prompt text pasted into a cell is stripped, as IPython does
    assert result(ok(ipy, ">>> 1 + 2", count=6)) == "3"
    assert result(ok(ipy, "In [7]: 2 * 3", count=7)) == "6"


def test_plain_cells_do_not_import_ipython(lazy):
    # the option off (the default): IPython loads only for a cell that needs it
    ipy = lazy
    ok(ipy, "x = [1, 2, {'a': (3, 'b')}]\nx")
    ok(ipy, "class R:\n    def __repr__(self): return 'R!'\nR()")
    ok(ipy, "print('hi')\n1.5")
    ipy.execute("x = = 1")  # a SyntaxError without IPython syntax
    ipy.send("is_complete", "for i in range(3):")
    assert ipy.event()["status"] == "incomplete"
    ipy.send("complete", "pri", "3")
    assert "print" in ipy.event()["matches"]
    assert not ipython_loaded(ipy)
    # the first value IPython's printer decides loads it, once
    assert result(ok(ipy, "type(1)")) == "int"
    assert ipython_loaded(ipy)


def test_pretty_printer_is_ipythons(ipy, tmp_path):
    from IPython.lib.pretty import pretty

    code = ("from collections import defaultdict, Counter\n"
            "def f(a, b=2): pass\nclass K: pass\n"
            "long = list(range(40))\n"
            "type(1), f, K")
    assert result(ok(ipy, code)) == "(int, <function __main__.f(a, b=2)>, __main__.K)"
    assert result(ok(ipy, "len, defaultdict(int, a=1)")) == \
        "(<function len(obj, /)>, defaultdict(int, {'a': 1}))"
    assert result(ok(ipy, "long")) == pretty(list(range(40)))
    assert result(ok(ipy, "{3, 1, 2}")) == "{1, 2, 3}"
    assert result(ok(ipy, "Counter('aab')")) == "Counter({'a': 2, 'b': 1})"
    ok(ipy, "%precision 3")
    assert result(ok(ipy, "3.14159")) == "3.142"


def test_pretty_fallback_without_ipython(bare):
    code = ("from collections import defaultdict\n"
            "def f(a, b=2): pass\nclass K: pass\n"
            "type(1), f, K, defaultdict(int, a=1)")
    assert result(ok(bare, code)) == "(int, <function __main__.f(a, b=2)>, __main__.K, " \
                                     "defaultdict(int, {'a': 1}))"


def test_line_and_cell_magics(ipy, tmp_path):
    ok(ipy, "%timeit -n 2 -r 1 sum(range(5))")
    assert b"per loop (mean" in ipy.out["stdout"]
    evs = ok(ipy, "%time y = 6 * 7\ny")
    assert result(evs) == "42" and b"Wall time" in ipy.out["stdout"]
    evs = ok(ipy, "%%time\nz = 1\nz + 1")
    assert result(evs) == "2" and b"Wall time" in ipy.out["stdout"]
    ok(ipy, "%%timeit -n 1 -r 1\nsum(range(3))")
    assert b"per loop" in ipy.out["stdout"]
    ok(ipy, "%%writefile notes.txt\nline one\n")
    assert ipy.out["stdout"] == b"Writing notes.txt\n"
    assert (tmp_path / "notes.txt").read_text() == "line one\n"
    ok(ipy, "%%file -a notes.txt\nline two\n")
    assert (tmp_path / "notes.txt").read_text() == "line one\nline two\n"
    evs = ok(ipy, "%%capture cap\nprint('hidden')\ndisplay('shown later')\n41 + 1")
    assert types_of(evs) == ["done"] and ipy.out["stdout"] == b""
    assert result(ok(ipy, "cap.stdout, len(cap.outputs)")) == "('hidden\\n', 2)"
    evs = ok(ipy, "cap.show()")
    assert types_of(evs) == ["display_data", "display_data", "done"]
    assert ipy.out["stdout"] == b"hidden\n"
    evs = ok(ipy, "%%html\n<b>bold</b>")
    assert evs[0]["type"] == "display_data" and evs[0]["data"]["text/html"] == "<b>bold</b>\n"
    (tmp_path / "script.py").write_text("import sys\nran = sys.argv[1:]\nprint('ran')\n")
    ok(ipy, "%run script.py a b")
    assert ipy.out["stdout"] == b"ran\n"
    assert result(ok(ipy, "ran")) == "['a', 'b']"
    ok(ipy, "%env KM_TEST_VAR=v1")
    assert result(ok(ipy, "import os\nos.environ['KM_TEST_VAR']")) == "'v1'"
    ok(ipy, "%who")
    assert b"ran" in ipy.out["stdout"] and b"In" not in ipy.out["stdout"].split()
    ok(ipy, "%whos")
    assert b"Variable" in ipy.out["stdout"]
    ok(ipy, "%xmode Minimal")
    assert ipy.out["stdout"] == b"Exception reporting mode: Minimal\n"
    ok(ipy, "%config InlineBackend.figure_format = 'retina'")
    evs = ipy.execute("%load_ext no_such_extension_module")
    assert evs[-1]["status"] == "error"
    assert [e["ename"] for e in evs if e["type"] == "error"] == ["ModuleNotFoundError"]
    evs = ipy.execute("%no_such_magic")
    assert types_of(evs) == ["done"] and evs[-1]["status"] == "error"
    assert ipy.out["stderr"] == b"UsageError: Line magic function `%no_such_magic` not found.\n"
    evs = ipy.execute("%run no_such_script.py")
    assert evs[-1]["status"] == "error" and "no_such_script.py" in evs[0]["evalue"]


def test_autoreload(ipy, tmp_path):
    mod = tmp_path / "reloadme.py"
    mod.write_text("def value():\n    return 1\n")
    ok(ipy, "%load_ext autoreload\n%autoreload 2\nimport reloadme")
    assert result(ok(ipy, "reloadme.value()")) == "1"
    mod.write_text("def value():\n    return 2\n")
    st = mod.stat()
    os.utime(mod, (st.st_atime + 10, st.st_mtime + 10))
    assert result(ok(ipy, "reloadme.value()")) == "2"


def test_shell_escapes_help_and_history_stdlib_path(lazy):
    ipy = lazy
    ok(ipy, "x = 5\nname = 'km'\n!echo {x} $name {x * 2}")
    assert ipy.out["stdout"] == b"5 km 10\n"
    evs = ok(ipy, "files = !printf 'a\\nb\\n'\nfiles, files.n")
    assert result(evs) == "(['a', 'b'], 'a\\nb')"
    ok(ipy, "!exit 4")
    assert result(ok(ipy, "_exit_code")) == "4"
    # help is a display (the stdlib path has no page payload)
    for code in ("len?", "?len", "len??"):
        evs = ok(ipy, code)
        assert types_of(evs) == ["display_data", "done"], code
        assert "Return the number of items" in evs[0]["data"]["text/plain"]
    evs = ok(ipy, "def g():\n    'doc of g'\n    return 1\ng??")
    assert "return 1" in evs[0]["data"]["text/plain"]
    assert result(ok(ipy, "get_ipython().__class__.__name__")) == "'InteractiveShell'"
    ipy.execute("6 * 7", count=10)
    evs = ok(ipy, "In[10], Out[10], _10, _i10", count=11)
    assert result(evs) == "('6 * 7', 42, 42, '6 * 7')"


def test_shell_escapes_help_and_history(ipy_on):
    ipy = ipy_on
    ok(ipy, "x = 5\nname = 'km'\n!echo {x} $name {x * 2}")
    assert ipy.out["stdout"] == b"5 km 10\r\n"  # on a pty, as ipykernel
    evs = ok(ipy, "files = !printf 'a\\nb\\n'\nfiles, files.n")
    assert result(evs) == "(['a', 'b'], 'a\\nb')"
    ok(ipy, "!exit 4")
    assert result(ok(ipy, "_exit_code")) == "4"
    # help is a "page" payload of the reply, as in ipykernel
    for code in ("len?", "?len", "len??"):
        evs = ok(ipy, code)
        assert types_of(evs) == ["done"], code
        page = evs[-1]["payload"][0]
        assert page["source"] == "page" and page["start"] == 0
        assert "Return the number of items" in plain(page["data"]["text/plain"])
    evs = ok(ipy, "def g():\n    'doc of g'\n    return 1\ng??")
    assert "return 1" in plain(evs[-1]["payload"][0]["data"]["text/plain"])
    assert result(ok(ipy, "get_ipython().__class__.__name__")) == "'KShell'"
    evs = ok(ipy, "get_ipython().set_next_input('next')")
    assert evs[-1]["payload"] == [{"source": "set_next_input", "text": "next", "replace": False}]
    ipy.execute("6 * 7", count=10)
    evs = ok(ipy, "In[10], Out[10], _10, _i10", count=11)
    assert result(evs) == "('6 * 7', 42, 42, '6 * 7')"


def test_exit_ends_the_worker(ipy):
    ok(ipy, "exit(keep_kernel=True)\nstill = 1")
    ipy.send("execute", "exit()\nprint('cell finishes')", "0", "1", "0", "2")
    evs = ipy.until(("done",))
    assert evs[-1]["status"] == "ok"
    assert evs[-1]["payload"] == [{"source": "ask_exit", "keepkernel": False}]
    assert ipy.proc.wait(10) == 0
    assert ipy.out["stdout"] + ipy.proc.stdout.read() == b"cell finishes\n"


def test_ipython_on_without_ipython_falls_back_and_says_so_once(tmp_path, bare_python):
    """`ipython` on, IPython not importable: the stdlib path, and the first
    cell's stderr says so (once); the kernel log too."""
    d = Driver(tmp_path, python=bare_python, env=IPYTHON_ON)
    try:
        evs = ok(d, "1 + 1")
        assert result(evs) == "2"
        err = d.out["stderr"].decode()
        assert err.count("[python] ipython is on, but IPython is not usable by ") == 1, err
        assert "it is not importable): cells run on the stdlib path." in err, err
        assert any(e["type"] == "log" and "ipython is on, but IPython is not usable" in
                   e["message"] for e in evs), evs  # the kernel log's line
        d.out["stderr"] = b""
        assert result(ok(d, "import sys\n'IPython' in sys.modules, 'KERNELMGR_IPYTHON' in "
                            "__import__('os').environ")) == "(False, False)"
        assert d.out["stderr"] == b""
    finally:
        d.close()


def test_no_ipython_named_errors(bare):
    for code, what in [("%timeit 1", "line magic %timeit 1"),
                       ("%%time\n1", "cell magic %%time"),
                       ("%load_ext autoreload", "line magic %load_ext autoreload"),
                       ("%config InlineBackend.figure_format = 'retina'", "line magic %config"),
                       ("files = !ls", "`files = !ls`"),
                       ("x = 1\n!echo {x}", "variable expansion in `!echo {x}`"),
                       ("len?", "help syntax `len?`"),
                       ("?len", "help syntax `?len`")]:
        evs = bare.execute(code)
        errs = [e for e in evs if e["type"] == "error"]
        assert evs[-1]["status"] == "error" and len(errs) == 1, (code, evs)
        assert errs[0]["ename"] == "IPythonRequiredError", (code, errs)
        assert errs[0]["evalue"].startswith(what) and "needs IPython" in errs[0]["evalue"]
    evs = bare.execute("get_ipython()")
    assert evs[0]["ename"] == "NameError" and "needs IPython" in evs[0]["evalue"]
    # what the driver does itself still works
    ok(bare, "!echo from-shell\n%matplotlib inline\n%pwd")
    assert bare.out["stdout"] == b"from-shell\n"
    bare.send("is_complete", "%timeit x")
    assert bare.event()["status"] == "complete"
    bare.send("is_complete", "!ls")
    assert bare.event()["status"] == "complete"


@pytest.mark.parametrize("which", ["ipy_on", "lazy", "bare"])
def test_rewrites_never_touch_strings(request, which):
    d = request.getfixturevalue(which)
    code = 's = """\n!not a command\n%not_a_magic\n"""\nt = \'\'\'%x\n  !y\'\'\'\n%pwd\n(s, t)'
    evs = ok(d, code)
    assert result(evs) == "('\\n!not a command\\n%not_a_magic\\n', '%x\\n  !y')"
    # a SyntaxError in a cell with a magic names its own line
    evs = d.execute("%pwd\nx = 1\ny = = 2\n")
    err = [e for e in evs if e["type"] == "error"][0]
    assert err["ename"] == "SyntaxError" and "line 3" in err["evalue"], err
    assert "y = = 2" in "\n".join(err["traceback"])


def _png_size(b64):
    png = base64.b64decode(b64)
    i = png.index(b"IHDR")
    return struct.unpack(">ii", png[i + 4:i + 12])


def test_inline_backend_dpi_and_retina(ipy):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from IPython.core.pylabtools import print_figure, retina_figure

    # the reference: IPython's own print_figure / retina_figure
    with plt.style.context("classic"):
        fig = plt.figure()
        plt.plot([1, 2])
        ref = print_figure(fig, "png")
    plt.close("all")
    fig = plt.figure()
    plt.plot([1, 2])
    ref2, ref2_md = retina_figure(fig)
    plt.close("all")

    evs = ok(ipy, "import matplotlib.pyplot as plt\nplt.style.use('classic')\n"
                  "plt.plot([1, 2]); plt.show()", timeout=90)
    png = [e for e in evs if e["type"] == "display_data"][0]
    assert _png_size(png["data"]["image/png"]) == _png_size(base64.b64encode(ref))
    evs = ok(ipy, "%config InlineBackend.figure_format = 'retina'\nplt.style.use('default')\n"
                  "plt.plot([1, 2])")
    png = [e for e in evs if e["type"] == "display_data"][0]
    assert _png_size(png["data"]["image/png"]) == _png_size(base64.b64encode(ref2))
    assert png["metadata"]["image/png"] == ref2_md


def test_no_deprecation_warnings_from_the_driver(ipy):
    ok(ipy, "from IPython.display import Image, HTML, display, clear_output")
    assert ipy.out["stderr"] == b""
    ok(ipy, "import warnings\nwarnings.warn('careful')", count=3)
    # the cell's file, as a debugger frontend names it (ipykernel names a
    # temporary file the same way)
    assert re.match(rb"/\S*/kernelmgr-cells-\d+/\d+\.py:2: UserWarning: careful\n",
                    ipy.out["stderr"]), ipy.out["stderr"]


def test_completion_and_is_complete(ipy):
    for code in ("%timeit x", "!ls", "x = !ls", "len?"):
        ipy.send("is_complete", code)
        assert ipy.event()["status"] == "complete", code
    ipy.send("is_complete", "%%time\nx = 1")
    assert ipy.event()["status"] == "incomplete"
    ok(ipy, "import pandas as pd\ndf = pd.DataFrame({'alpha': [1], 'beta': [2]})", timeout=90)
    ipy.send("complete", "%tim", "4")
    ev = ipy.event()
    assert "%timeit" in ev["matches"] and "TimeoutError" not in ev["matches"]
    assert ev["cursor_start"] == 0 and ev["cursor_end"] == 4
    ipy.send("complete", "df['", "4")
    ev = ipy.event()
    assert ev["matches"] == ["alpha", "beta"] and ev["cursor_start"] == 4


@pytest.mark.skipif(not os.path.exists(kutil.binary("kernel-python")),
                    reason="build/kernel-python not built")
@pytest.mark.parametrize("path", ["on", "off"])
def test_ipython_features_in_the_sandboxed_kernel(kernel_factory, path):
    """The same through the kernel server in the sandbox (unwritable home):
    magics, `!` expansion, `?`, and exit() ending the worker; with
    --ipython on, as ipykernel (a pty for `!`, help as a page payload)."""
    k = kernel_factory("python", args=["--sandbox", KM_TEST_SANDBOX, "--python", SYS_PY,
                                       "--ipython", path])
    on = path == "on"

    def run(code):
        _, r = k.execute(code, timeout=60)
        return r["reply"]["content"], r["iopub"]

    c, io = run("x = 3\n!echo {x}\n%timeit -n1 -r1 1")
    assert c["status"] == "ok", c
    out = stream_text(io)
    assert out.startswith("3\r\n" if on else "3\n") and "per loop" in out, out
    c, io = run("len?")
    if on:
        assert c["status"] == "ok" and c["payload"][0]["source"] == "page", c
        assert "Return the number" in c["payload"][0]["data"]["text/plain"]
    else:
        assert c["status"] == "ok"
        text = of_type(io, "display_data")[0]["content"]["data"]["text/plain"]
        assert "Return the number" in text
    c, io = run("%%capture\nprint('x')")
    assert c["status"] == "ok" and stream_text(io) == ""
    c, io = run("kept = 1\nexit()")
    assert c["status"] == "ok"
    # the worker ends after the cell; a fresh one answers, without the state
    deadline = time.monotonic() + 30
    while True:
        c, io = run("'kept' in globals()")
        if c["status"] == "ok" or time.monotonic() > deadline:
            break
    assert c["status"] == "ok", c
    assert of_type(io, "execute_result")[0]["content"]["data"]["text/plain"] == "False"


def test_ipykernel_seams(ipy_on, tmp_path):
    """What an imitation of IPython missed, now IPython's own: automagic,
    for_type() printers over an object's own __repr__ (SymPy's
    init_printing), _ipython_display_, %%capture of inline figures,
    ipykernel's magics."""
    ipy = ipy_on
    assert result(ok(ipy, "pwd")) == repr(str(tmp_path))  # automagic
    evs = ok(ipy, "class V:\n    def __repr__(self): return 'own'\n"
                  "get_ipython().display_formatter.formatters['text/plain'].for_type(\n"
                  "    V, lambda o, p, cycle: p.text('printer'))\nV()")
    assert result(evs) == "printer"
    evs = ok(ipy, "class D:\n    def _ipython_display_(self):\n"
                  "        display({'text/plain': 'custom'}, raw=True)\nD()")
    assert types_of(evs) == ["display_data", "done"] and evs[0]["data"] == {
        "text/plain": "custom"}
    evs = ok(ipy, "%%capture cap\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()",
             timeout=90)
    assert types_of(evs) == ["done"], evs
    evs = ok(ipy, "[o.data.keys() for o in cap.outputs]")
    assert "image/png" in result(evs)
    evs = ok(ipy, "%autosave 0")
    assert types_of(evs) == ["display_data", "done"]
    assert evs[0]["data"]["application/javascript"] == (
        "IPython.notebook.set_autosave_interval(0)")
    assert ipy.out["stdout"] == b"Autosave disabled\n"
    (tmp_path / "notes.txt").write_text("some notes\n")
    evs = ok(ipy, "%less notes.txt")
    assert evs[-1]["payload"][0]["data"]["text/plain"] == "some notes\n"
    ok(ipy, "%connect_info")
    assert b"no connection file" in ipy.out["stdout"]
    # no GUI event loop in a sandbox: said (IPython's %gui logs the error)
    ok(ipy, "%gui qt")
    assert b"GUI event loop 'qt' is not available" in ipy.out["stderr"]
