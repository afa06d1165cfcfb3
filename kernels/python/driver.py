"""kernelmgr Python worker driver.

Runs user code for the kernel server (kernels/server/) and speaks the worker
side of kernels/WORKER_PROTOCOL.md: NUL-separated requests on fd 3, one JSON
event per line on fd 4; stdout/stderr are plain fds the server captures.

Constraints that shape this file:
  * stdlib only, any CPython >= 3.8, so it runs under whatever interpreter or
    venv the user has;
  * start fast: the kernel is "ready" after importing little more than the
    interpreter itself does plus the driver's own standard-library modules
    (about 10 ms; asyncio and jedi load on first use), and matplotlib/pandas
    are never imported unless user code did; IPython (when importable) only
    on the first cell that needs it (see "IPython (lazy)" below), or at
    start with the `ipython` option on (see "IPython path");
  * the workspace is sandbox-written: a json.py, re.py or types.py there
    shadows the standard library for user code (as in any Python started in
    that directory) but never for the driver, which imports its modules
    before the workspace goes on sys.path, and later ones with it hidden
    (_driver_import) — or, when user code took that name from the workspace
    first, as a private copy of the real module;
  * nothing of the driver shows in user-facing tracebacks, and a SIGINT that
    lands between cells or while an event is half written cannot kill or
    desynchronise the driver.
"""

import os
import sys


def _cwd():
    try:
        return os.getcwd()
    except OSError:
        return None


def _from_workspace(mod, cwd):
    """Whether module mod was loaded from a file under cwd (the workspace)."""
    f = getattr(mod, "__file__", None)
    if not f or cwd is None:
        return False
    try:
        return os.path.abspath(f).startswith(cwd.rstrip("/") + "/")
    except (TypeError, ValueError):
        return True


# Private copies of modules user code shadowed from the workspace before the
# driver first needed them (_driver_import): name -> module, never in
# sys.modules.
_driver_private = {}


def _driver_import(name):
    """Imports module `name` (and whatever it imports) for the driver itself,
    never from the workspace: while it loads, sys.path lacks "", "." and the
    cwd (an empty PYTHONPATH entry means that). Returns the module. When user
    code already imported a workspace file of that name (a traceback.py or
    base64.py of its own, as plain Python lets it), the driver gets a private
    copy of the real one instead and user code keeps its own."""
    cwd = _cwd()
    mod = sys.modules.get(name)
    if mod is not None:
        if not _from_workspace(mod, cwd):
            return mod
        return _driver_private_copy(name, mod, cwd)
    saved = list(sys.path)
    kept, removed = _driver_path(saved, cwd)
    if not removed:
        __import__(name)
        return sys.modules[name]
    sys.path[:] = kept
    try:
        __import__(name)
        return sys.modules[name]
    finally:
        if sys.path == kept:
            sys.path[:] = saved
        else:  # changed meanwhile (by the import, or a thread of user code)
            for i, p in removed:
                sys.path.insert(i, p)


def _driver_path(path, cwd):
    """path without its workspace entries ("", "." and cwd): (the rest,
    [(index, entry) removed])."""
    removed, kept = [], []
    for i, p in enumerate(path):
        try:
            here = p in ("", ".") or (cwd is not None and os.path.abspath(p) == cwd)
        except (OSError, TypeError, ValueError):
            here = True
        (removed if here else kept).append((i, p))
    return [p for _, p in kept], removed


def _driver_private_copy(name, shadow, cwd):
    """The real module `name` loaded privately (not into sys.modules), for a
    name user code took from the workspace; the shadow when there is no other
    (a top-level module only: the driver imports no dotted name that way)."""
    priv = _driver_private.get(name)
    if priv is not None:
        return priv
    import importlib.machinery
    import importlib.util

    paths = _driver_path(list(sys.path), cwd)[0]
    spec = importlib.machinery.PathFinder.find_spec(name, paths) if "." not in name else None
    if spec is None or spec.loader is None:
        return shadow
    priv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(priv)
    _driver_private[name] = priv
    return priv


# The standard-library modules the driver needs to start and run a first
# simple cell, imported now: _setup() puts the workspace first on sys.path
# afterwards. The functions below still say `import x` where they use x;
# that finds the module loaded here. The others (base64, codeop, inspect,
# pprint, shlex, subprocess, traceback, uuid: about 8 ms of a start) load
# on first use through _driver_import, with the workspace hidden. Of ast the
# driver needs only what the C module _ast has (ast.py loads if user code
# or IPython wants it).
for _name in ("_thread", "_ast", "builtins", "faulthandler", "io", "json", "keyword",
              "linecache", "re", "select", "signal", "time", "tokenize", "types",
              "warnings"):
    try:
        _driver_import(_name)
    except ImportError:
        pass  # the function that needs it reports that
del _name

_DRIVER_FILE = __file__
_SELF = sys.modules[__name__]
_REQ_FD = int(os.environ.pop("KERNELMGR_REQ_FD", "3"))
_EVT_FD = int(os.environ.pop("KERNELMGR_EVT_FD", "4"))
# The debug pipes (WORKER_PROTOCOL.md "Debug pipes"): -1 when the server gave none.
_DBG_REQ_FD = int(os.environ.pop("KERNELMGR_DBG_REQ_FD", "-1"))
_DBG_EVT_FD = int(os.environ.pop("KERNELMGR_DBG_EVT_FD", "-1"))

# Number of fields following each request type (WORKER_PROTOCOL.md).
_REQ_FIELDS = {
    "execute": 5,
    "execute_ext": 6,  # execute + options (JSON): we declare "execute_options"
    "complete": 2,
    "inspect": 3,
    "is_complete": 1,
    "input_reply": 1,
    "input_cancel": 0,
    "interrupt": 1,  # generation; announces a SIGINT (we declare "interrupt")
    "sync": 0,
    "snapshot": 3,  # action, directory, max bytes (we declare "snapshot"; ksnap.py)
}
_FEATURES = ["interrupt", "execute_options", "snapshot"]


_TERMINATING = ("done", "complete_reply", "inspect_reply", "is_complete_reply", "snapshot_reply")


class _State:
    answered = False  # the current request's terminating event was sent
    user = False  # True while user code runs: SIGINT then raises
    waiting = False  # an input wait reads the request pipe itself
    in_sigint = False
    owed = 0  # announced interrupts whose SIGINT has not arrived yet
    wait_sigs = 0  # SIGINTs received during an input wait, not yet matched
    main_pid = 0  # the driver's pid: a forked child must not become a driver
    main_tid = 0  # the thread that reads requests (only it waits for a sync)
    sync_debt = 0  # syncs still to come for waits an interrupt cut short
    allow_stdin = False
    silent = False
    store_history = True
    count = 0


_S = _State()
_BASE_MODULES = set()  # sys.modules when user code could first run (ksnap.py)
# os.environ and sys.path at that moment: what this start was given (the
# session's package directories, its home...). A snapshot keeps only the
# cells' changes to them, so that a restore (after a move, another layout)
# keeps what the new start was given.
_BASE_ENV = {}
_BASE_PATH = []
_json = None
_lock = None


def _j():
    global _json
    if _json is None:
        import json

        _json = json
    return _json


# ---------------------------------------------------------------- signals


def _on_sigint(signum, frame):
    # The kernel announces each SIGINT with an `interrupt` request
    # (WORKER_PROTOCOL.md). A signal whose announcement was already taken
    # (by an input wait, or between cells) arrives late - the sandbox's init
    # forwards asynchronously - and must not interrupt the next cell; one
    # that was never announced (os.kill of our own pid, interrupt_main) is a
    # real interrupt. Between cells every SIGINT is dropped; an input wait
    # reads the announcement itself.
    if _S.in_sigint:
        return
    if _S.waiting:
        _S.wait_sigs += 1
        return
    if not _S.user:
        if _S.owed > 0:
            _S.owed -= 1
        return
    _S.in_sigint = True
    try:
        found = _take_interrupts()
    finally:
        _S.in_sigint = False
    if not found and _S.owed > 0:
        _S.owed -= 1
        return
    raise KeyboardInterrupt


def _take_interrupts():
    """Reads the requests already waiting in the pipe (only while no other
    read of it is in progress); True when one is an `interrupt`. Late
    answers (input_reply/input_cancel/sync) of a cut-short wait are dropped."""
    import select

    found = False
    try:
        while (_requests.fields or b"\0" in _requests.buf
               or select.select([_REQ_FD], [], [], 0)[0]):
            kind, _fields = _requests.request()
            if kind == "interrupt":
                if found:
                    _S.owed += 1  # two announcements, one signal so far
                found = True
            elif kind == "sync":
                _stray_sync()
            elif kind not in ("input_reply", "input_cancel"):
                _log("driver: %s request during a cell ignored" % kind)
    except (OSError, EOFError, ValueError):
        pass
    return found


# ---------------------------------------------------------------- events


def _flush_std():
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if s is not None:
                s.flush()
        except Exception:
            pass


# ---------------------------------------------------------------- output buffering
#
# stdout is block-buffered (one write() per 8 KiB instead of one per print:
# the difference between 400 000 system calls and 200 for 200 000 lines).
# What it must not change is what the user sees:
#   * output still streams while a cell runs: a flusher thread flushes every
#     _FLUSH_INTERVAL seconds while user code runs;
#   * every event (display, result, input request, done) flushes first;
#   * fd-level writers -- os.write(1|2), os.system, subprocesses, exec,
#     fork, os._exit -- flush first, so they cannot overtake buffered prints;
#   * stderr is unbuffered and flushes stdout before each write, so the two
#     pipes receive text in the order a terminal would have shown it.
# Output of C code that writes to fd 1 directly can still come before
# Python output buffered at the same moment (by at most one interval).

_FLUSH_INTERVAL = 0.05
_OUT = None  # the block-buffered sys.stdout set up by _setup_output()
_fork_lock = None  # held by the flusher while it flushes; taken around fork()
_gate = None  # released while user code runs; the flusher waits on it


def _flush_out():
    out = _OUT
    if out is not None:
        try:
            out.flush()
        except Exception:
            pass


def _flusher():
    import time

    while True:
        _gate.acquire()
        _gate.release()
        time.sleep(_FLUSH_INTERVAL)
        _fork_lock.acquire()
        try:
            _flush_out()
        finally:
            _fork_lock.release()


def _output_running(on):
    """Starts (on) or stops the periodic flush around user code."""
    if _gate is None:
        return
    if on:
        if _gate.locked():
            _gate.release()
    elif not _gate.locked():
        _gate.acquire()


def _wrap_flushing(fn):
    def wrapper(*args, **kwargs):
        _flush_std()
        return fn(*args, **kwargs)

    wrapper.__name__ = getattr(fn, "__name__", "wrapper")
    wrapper.__qualname__ = getattr(fn, "__qualname__", wrapper.__name__)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.__wrapped__ = fn
    return wrapper


_os_write = os.write


def _write_fd(fd, data):
    if fd == 1 or fd == 2:
        _flush_std()
    return _os_write(fd, data)


_write_fd.__doc__ = os.write.__doc__


def _patch_subprocess(mod):
    popen = getattr(mod, "Popen", None)
    child = getattr(popen, "_execute_child", None)
    if child is not None:
        popen._execute_child = _wrap_flushing(child)


def _setup_output():
    global _OUT, _fork_lock, _gate
    import io

    out = sys.stdout
    try:
        out.reconfigure(encoding="utf-8", errors="backslashreplace", line_buffering=False,
                        write_through=False)
    except Exception:
        pass
    _OUT = out

    class _StderrIO(io.TextIOWrapper):
        def write(self, s):
            _flush_out()
            n = io.TextIOWrapper.write(self, s)
            self.flush()
            return n

    try:
        err = _StderrIO(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                        errors="backslashreplace", line_buffering=True, write_through=True)
        err.mode = "w"
        try:
            sys.stderr.flush()
        except Exception:
            pass
        sys.stderr = sys.__stderr__ = err
    except Exception:
        pass

    os.write = _write_fd
    for name in ("system", "execv", "execve", "posix_spawn", "posix_spawnp", "_exit",
                 "forkpty"):
        fn = getattr(os, name, None)
        if fn is not None:
            setattr(os, name, _wrap_flushing(fn))
    if "subprocess" in sys.modules:
        _patch_subprocess(sys.modules["subprocess"])

    import _thread

    _fork_lock = _thread.allocate_lock()
    _gate = _thread.allocate_lock()
    _gate.acquire()
    if hasattr(os, "register_at_fork"):
        # The flusher must not hold a buffer lock across fork(): the child
        # would inherit it locked and hang on its first print.
        os.register_at_fork(before=_before_fork, after_in_parent=_fork_lock.release,
                            after_in_child=_after_fork_child)
    _thread.start_new_thread(_flusher, ())


def _before_fork():
    _flush_std()
    _fork_lock.acquire()


def _after_fork_child():
    global _fork_lock, _gate
    import _thread

    # The child has no flusher thread; its locks start fresh. A forked child
    # (multiprocessing) flushes at exit, like any Python.
    _fork_lock = _thread.allocate_lock()
    _gate = None


def _default(o):
    # Last resort for values a formatter returned that json cannot encode.
    if isinstance(o, (bytes, bytearray)):
        base64 = _driver_import("base64")

        return base64.b64encode(bytes(o)).decode("ascii")
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return repr(o)


# Output events: the driver waits for the kernel's `sync` after each one, so
# that nothing it writes later can be published before it (the kernel drains
# the pipes after reading an event, which orders what came before).
_ORDERED = ("display_data", "clear_output", "execute_result", "error", "stream")


def _stray_sync():
    if _S.sync_debt > 0:
        _S.sync_debt -= 1


def _wait_sync():
    """Reads requests until the kernel's `sync` for the event just written.
    An `interrupt` ends the wait (its sync still comes: owed, skipped later)
    and raises KeyboardInterrupt in user code."""
    _S.waiting = True
    _S.wait_sigs = 0
    interrupted = False
    try:
        while True:
            kind, fields = _requests.request()
            if kind == "sync":
                if _S.sync_debt > 0:
                    _S.sync_debt -= 1
                    continue
                return
            if kind == "interrupt":
                if _S.wait_sigs:
                    _S.wait_sigs -= 1  # its signal came first
                else:
                    _S.owed += 1
                _S.sync_debt += 1
                interrupted = True
                break
            if kind not in ("input_reply", "input_cancel"):
                _log("driver: %s request while waiting for sync ignored" % kind)
    finally:
        _S.waiting = False
        _S.owed = max(0, _S.owed - _S.wait_sigs)
        _S.wait_sigs = 0
    if interrupted and _S.user:
        raise KeyboardInterrupt


def _emit(ev):
    """Writes one event line; the output written before it is flushed first.
    An output event from the thread that reads requests waits for the
    kernel's sync, so later output cannot overtake it."""
    _flush_std()
    sync = (
        ev["type"] in _ORDERED
        and not _S.waiting
        and not _S.answered
        and os.getpid() == _S.main_pid
        and _thread_ident() == _S.main_tid
    )
    if sync:
        ev["sync"] = True
    if ev["type"] in _TERMINATING:
        _S.answered = True
    line = _j().dumps(ev, default=_default, ensure_ascii=False, allow_nan=False)
    data = (line + "\n").encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()
    # SIGINT is blocked while the line is written so that a KeyboardInterrupt
    # can only surface after a whole line, never in the middle of one.
    import signal

    blocked = False
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        blocked = True
    except (AttributeError, OSError, ValueError):
        pass
    try:
        if _lock is not None:
            _lock.acquire()
        try:
            view = memoryview(data)
            while view:
                n = _os_write(_EVT_FD, view)
                view = view[n:]
        finally:
            if _lock is not None:
                _lock.release()
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if sync:
        _wait_sync()


def _thread_ident():
    try:
        import _thread

        return _thread.get_ident()
    except ImportError:
        return 0


def _log(message):
    try:
        _emit({"type": "log", "message": str(message)})
    except Exception:
        pass


# ---------------------------------------------------------------- requests


class _Requests:
    """Reader of NUL-terminated fields from the request fd."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""
        self.fields = []

    def field(self):
        while not self.fields:
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
            if b"\0" in chunk:
                parts = self.buf.split(b"\0")
                self.buf = parts.pop()
                self.fields.extend(p.decode("utf-8", "replace") for p in parts)
        return self.fields.pop(0)

    def request(self):
        kind = self.field()
        n = _REQ_FIELDS.get(kind)
        if n is None:
            _log("driver: unknown request type %r ignored" % kind)
            return kind, []
        return kind, [self.field() for _ in range(n)]


_requests = _Requests(_REQ_FD)


# ---------------------------------------------------------------- stdin


class StdinNotImplementedError(NotImplementedError):
    """input() was called in an execution that cannot answer it."""


def _read_input(prompt, password):
    if not _S.allow_stdin:
        what = "getpass()" if password else "input()"
        raise StdinNotImplementedError(
            "%s: this execution has no stdin (allow_stdin is false)" % what
        )
    _emit({"type": "input_request", "prompt": str(prompt), "password": bool(password)})
    # The wait ends on what the pipe says, whenever the SIGINT itself comes:
    # the kernel announces every interrupt here (and cancels the input).
    _S.waiting = True
    _S.wait_sigs = 0
    try:
        while True:
            kind, fields = _requests.request()
            if kind == "input_reply":
                return fields[0]
            if kind == "input_cancel":
                raise KeyboardInterrupt("input request cancelled")
            if kind == "interrupt":
                if _S.wait_sigs:
                    _S.wait_sigs -= 1  # its signal came first
                else:
                    _S.owed += 1
                raise KeyboardInterrupt
            if kind == "sync":
                _stray_sync()
            else:
                _log("driver: %s request while waiting for input ignored" % kind)
    finally:
        _S.waiting = False
        # Other signals during the wait: late ones of interrupts taken before.
        _S.owed = max(0, _S.owed - _S.wait_sigs)
        _S.wait_sigs = 0


def _input(prompt=""):
    return _read_input(prompt, False)


def _getpass(prompt="Password: ", stream=None):
    return _read_input(prompt, True)


# ---------------------------------------------------------------- display

_MIME_METHODS = (
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("image/svg+xml", "_repr_svg_"),
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
    ("application/javascript", "_repr_javascript_"),
    ("application/pdf", "_repr_pdf_"),
)
_BINARY_MIME = ("image/png", "image/jpeg", "application/pdf")


def _formatter_failed(obj, method):
    sys.stderr.write(
        "kernelmgr: %s.%s() failed, representation skipped:\n%s"
        % (type(obj).__name__, method, _format_exc_text(*sys.exc_info()))
    )


def _encode_mime(mime, value):
    if mime in _BINARY_MIME and isinstance(value, (bytes, bytearray)):
        base64 = _driver_import("base64")

        return base64.b64encode(bytes(value)).decode("ascii")
    if mime == "application/json" and isinstance(value, str):
        return _j().loads(value)
    return value


_REPR_TYPES = (int, str, bytes, bool, complex, type(None))


def _pretty_is_repr(obj, depth=0):
    """True when IPython's pretty printer would print obj exactly as
    "\n".join(repr(obj).splitlines()), so IPython need not be loaded: plain
    scalars, short lists/tuples/dicts of them, and objects whose class
    defines __repr__ (before any class IPython has a printer for)."""
    t = type(obj)
    if t in _REPR_TYPES or (t is float and _IP.shell is None):
        return True
    if t in (list, tuple, dict):
        if depth > 2 or len(obj) > 20:
            return False
        items = [x for kv in obj.items() for x in kv] if t is dict else obj
        return all(_pretty_is_repr(x, depth + 1) for x in items)
    try:
        mro = t.__mro__
    except AttributeError:
        return False
    for cls in mro:
        d = getattr(cls, "__dict__", {})
        if cls.__module__ in ("builtins", "collections", "re", "types", "datetime"):
            return False  # IPython has its own printers there
        if "_repr_pretty_" in d:
            return False
        if "__repr__" in d:
            return callable(d["__repr__"])
    return False


def _native_pretty(obj):
    """Without IPython: IPython's forms for classes, functions and
    defaultdict, else repr() (pprint past 79 columns)."""
    import types

    if isinstance(obj, type):
        mod, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", obj.__name__)
        return name if mod in (None, "builtins", "exceptions") else "%s.%s" % (mod, name)
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType)):
        inspect = _driver_import("inspect")

        name = getattr(obj, "__qualname__", None) or obj.__name__
        mod = getattr(obj, "__module__", None)
        if mod and mod not in ("__builtin__", "builtins", "exceptions"):
            name = "%s.%s" % (mod, name)
        try:
            name += str(inspect.signature(obj))
        except (ValueError, TypeError):
            pass
        return "<function %s>" % name
    coll = sys.modules.get("collections")
    if coll is not None and type(obj) is coll.defaultdict:
        return "defaultdict(%s, %s)" % (_native_pretty(obj.default_factory),
                                        _native_pretty(dict(obj)))
    if type(obj) in (list, tuple, dict) and len(obj) <= 100:
        if type(obj) is dict:
            parts = ["%s: %s" % (_native_pretty(k), _native_pretty(v)) for k, v in obj.items()]
            text = "{%s}" % ", ".join(parts)
        else:
            parts = [_native_pretty(x) for x in obj]
            tail = "," if type(obj) is tuple and len(parts) == 1 else ""
            text = ("(%s%s)" if type(obj) is tuple else "[%s%s]") % (", ".join(parts), tail)
        if len(text) <= 79 and "\n" not in text:
            return text
    r = repr(obj)
    if len(r) > 79 and type(obj) in (dict, list, tuple, set, frozenset):
        try:
            pprint = _driver_import("pprint")

            return pprint.pformat(obj, width=79, sort_dicts=False)
        except Exception:
            pass
    return r


def _text_plain(obj):
    """text/plain as IPython's PlainTextFormatter makes it: IPython's pretty
    printer (loaded on the first value that needs it), or the equivalent
    without IPython."""
    try:
        if _pretty_is_repr(obj):
            r = repr(obj)
            if type(obj) not in (list, tuple, dict) or (len(r) <= 79 and "\n" not in r):
                return "\n".join(r.splitlines())
        if _IP.shell is not None:
            r = _IP.shell.display_formatter.formatters["text/plain"](obj)
            if isinstance(r, str):
                return r
        elif _IP.pretty is not None or _ipython_importable():
            if _IP.pretty is None:
                _IP.pretty = _ipython_import("IPython.lib.pretty")
            return _IP.pretty.pretty(obj, max_width=79, max_seq_length=1000)
        return _native_pretty(obj)
    except Exception as e:
        try:
            return repr(obj)
        except Exception:
            return "<%s object: repr() failed: %s: %s>" % (type(obj).__name__,
                                                          type(e).__name__, e)


def _print_figure(fig, fmt, bbox_inches="tight", **kwargs):
    """IPython's pylabtools.print_figure: bytes (str for svg), None for an
    empty figure; the figure's own dpi (not savefig.dpi), doubled for
    'retina'."""
    import io

    if not fig.axes and not fig.lines:
        return None
    dpi = fig.dpi
    if fmt == "retina":
        dpi = dpi * 2
        fmt = "png"
    kw = {"format": fmt, "facecolor": fig.get_facecolor(), "edgecolor": fig.get_edgecolor(),
          "dpi": dpi, "bbox_inches": bbox_inches}
    kw.update(kwargs)
    buf = io.BytesIO()
    if fig.canvas is None:
        from matplotlib.backend_bases import FigureCanvasBase

        FigureCanvasBase(fig)
    fig.canvas.print_figure(buf, **kw)
    data = buf.getvalue()
    return data.decode("utf-8") if fmt == "svg" else data


def _figure_bundle(fig):
    """(data, metadata) of a figure in the InlineBackend's formats (png by
    default; `%config InlineBackend.figure_format = 'retina'` gives a 2x PNG
    with width/height metadata), as matplotlib_inline does. data is empty
    for a figure without axes."""
    import struct

    ib = _IP.inline
    formats = set(ib.figure_formats) if ib is not None else {"png"}
    kw = dict(ib.print_figure_kwargs) if ib is not None else {"bbox_inches": "tight"}
    data, md = {}, {}
    if formats & {"retina", "png2x"}:
        png = _print_figure(fig, "retina", **kw)
        if png is not None:
            i = png.index(b"IHDR")
            w, h = struct.unpack(">ii", png[i + 4:i + 12])
            data["image/png"] = _encode_mime("image/png", png)
            md["image/png"] = {"width": w // 2, "height": h // 2}
    elif "png" in formats:
        png = _print_figure(fig, "png", **kw)
        if png is not None:
            data["image/png"] = _encode_mime("image/png", png)
    for fmt, mime in (("jpeg", "image/jpeg"), ("jpg", "image/jpeg"), ("svg", "image/svg+xml"),
                      ("pdf", "application/pdf")):
        if fmt in formats and mime not in data:
            v = _print_figure(fig, fmt, **kw)
            if v is not None:
                data[mime] = _encode_mime(mime, v)
    return data, md


def _figure_metadata(fig):
    """matplotlib_inline's _fetch_figure_metadata: needs_background for a
    transparent figure whose tick labels are all light or all dark."""
    try:
        from matplotlib import colors

        if colors.to_rgba(fig.get_facecolor())[3] < 0.5:
            labels = [lab.get_color() for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
                      for lab in axis.get_ticklabels()]
            if labels:
                light = colors.to_rgba_array(labels)[:, :3].dot((0.299, 0.587, 0.114)) > 0.5
                if (light == light[0]).all():
                    return {"needs_background": "dark" if light[0] else "light"}
    except Exception:
        pass
    return {}


def _is_mpl_figure(obj):
    mod = sys.modules.get("matplotlib.figure")
    return mod is not None and isinstance(obj, getattr(mod, "Figure", ()))


def _format(obj, include=None, exclude=None):
    """(data, metadata) mime bundle for obj, like IPython's DisplayFormatter."""
    data, md = {}, {}

    def want(mime):
        return (include is None or mime in include) and not (exclude and mime in exclude)

    if not isinstance(obj, type):
        meth = getattr(obj, "_repr_mimebundle_", None)
        if callable(meth):
            try:
                r = meth(include=include, exclude=exclude)
            except Exception:
                _formatter_failed(obj, "_repr_mimebundle_")
                r = None
            if isinstance(r, tuple) and len(r) == 2:
                r, m = r
                if isinstance(m, dict):
                    md.update(m)
            if isinstance(r, dict):
                for mime, value in r.items():
                    if want(mime):
                        data[mime] = _encode_mime(mime, value)
        for mime, name in _MIME_METHODS:
            if mime in data or not want(mime):
                continue
            meth = getattr(obj, name, None)
            if not callable(meth):
                continue
            try:
                value = meth()
            except Exception:
                _formatter_failed(obj, name)
                continue
            if isinstance(value, tuple) and len(value) == 2:
                value, m = value
                if isinstance(m, dict):
                    md[mime] = m
            if value is None:
                continue
            try:
                data[mime] = _encode_mime(mime, value)
            except Exception:
                _formatter_failed(obj, name)
        if "image/png" not in data and want("image/png") and _is_mpl_figure(obj):
            try:
                fd, fmd = _figure_bundle(obj)
            except Exception:
                _formatter_failed(obj, "savefig")
            else:
                for mime, value in fd.items():
                    if want(mime) and mime not in data:
                        data[mime] = value
                        if mime in fmd:
                            md[mime] = fmd[mime]
    if "text/plain" not in data:
        data["text/plain"] = _text_plain(obj)
    return data, md


def _new_display_id():
    uuid = _driver_import("uuid")

    return uuid.uuid4().hex


class DisplayHandle:
    """Returned by display(..., display_id=...): update() replaces the output."""

    def __init__(self, display_id=None):
        self.display_id = display_id or _new_display_id()

    def __repr__(self):
        return "<DisplayHandle display_id=%s>" % self.display_id

    def display(self, obj, **kwargs):
        display(obj, display_id=self.display_id, **kwargs)

    def update(self, obj, **kwargs):
        display(obj, display_id=self.display_id, update=True, **kwargs)


def publish_display_data(data, metadata=None, transient=None, update=False):
    shell = _IP.shell
    if shell is not None and shell.display_pub is not _IP.pub:
        # swapped by IPython's capture_output (%%capture): it collects.
        shell.display_pub.publish(data, metadata, transient=transient, update=update)
        return
    _publish(data, metadata, transient, update)


def _publish(data, metadata=None, transient=None, update=False):
    ev = {
        "type": "display_data",
        "data": data,
        "metadata": metadata or {},
        "update": bool(update),
    }
    if transient:
        ev["transient"] = transient
    _emit(ev)


def display(
    *objs,
    include=None,
    exclude=None,
    metadata=None,
    transient=None,
    display_id=None,
    raw=False,
    clear=False,
    update=False,
    **kwargs
):
    """Shows each object with its richest representations (like IPython's)."""
    if display_id is True:
        display_id = _new_display_id()
    if update and not display_id:
        raise TypeError("display(update=True) needs a display_id")
    if clear:
        clear_output(wait=True)
    transient = dict(transient or {})
    if display_id:
        transient["display_id"] = display_id
    for obj in objs:
        if raw:
            data, md = dict(obj), {}
        else:
            data, md = _format(obj, include, exclude)
        if metadata:
            md.update(metadata)
        publish_display_data(data, md, transient, update)
    if display_id:
        return DisplayHandle(display_id)
    return None


def update_display(obj, *, display_id, **kwargs):
    """Updates the output shown with display_id."""
    kwargs["update"] = True
    display(obj, display_id=display_id, **kwargs)


def clear_output(wait=False):
    """Clears this cell's output (now, or when new output arrives if wait)."""
    shell = _IP.shell
    if shell is not None and shell.display_pub is not _IP.pub:
        shell.display_pub.clear_output(wait)
        return
    _emit({"type": "clear_output", "wait": bool(wait)})


# ---------------------------------------------------------------- matplotlib


def _flush_figures():
    """Sends every open pyplot figure as image/png, then closes them all."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        nums = list(plt.get_fignums())
    except Exception:
        return
    try:
        for num in nums:
            fig = plt.figure(num)
            try:
                data, md = _figure_bundle(fig)
            except Exception:
                _formatter_failed(fig, "savefig")
                continue
            data["text/plain"] = _text_plain(fig)
            md.update(_figure_metadata(fig))
            publish_display_data(data, md)
    finally:
        try:
            plt.close("all")
        except Exception:
            pass


def _show(*args, **kwargs):
    _flush_figures()


def _patch_pyplot(mod):
    mod.show = _show


def _patch_getpass(mod):
    mod.getpass = _getpass


def _patch_ipython_display(mod):
    # IPython.display.display() without a running IPython shell only prints
    # repr(); route it (and its friends) to this kernel's display instead.
    for name, fn in (
        ("display", display),
        ("clear_output", clear_output),
        ("update_display", update_display),
        ("publish_display_data", publish_display_data),
    ):
        # vars(), not hasattr(): IPython.core.display answers these names
        # through a module __getattr__ that warns (DeprecationWarning).
        if name in vars(mod):
            setattr(mod, name, fn)


_POST_IMPORT = {
    "subprocess": _patch_subprocess,
    "matplotlib.pyplot": _patch_pyplot,
    "getpass": _patch_getpass,
    "IPython.core.display_functions": _patch_ipython_display,
    "IPython.core.display": _patch_ipython_display,
    "IPython.display": _patch_ipython_display,
}


class _HookLoader:
    def __init__(self, loader, hook):
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            self._hook(module)
        except Exception as e:
            _log("driver: post-import hook for %s failed: %r" % (module.__name__, e))

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _PostImportFinder:
    """Meta path finder that patches a few modules right after they load."""

    def __init__(self):
        self.busy = set()

    def find_spec(self, name, path=None, target=None):
        hook = _POST_IMPORT.get(name)
        if hook is None or name in self.busy:
            return None
        self.busy.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy.discard(name)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookLoader(spec.loader, hook)
        return spec


# ---------------------------------------------------------------- IPython path
#
# With the `ipython` option on (KERNELMGR_IPYTHON=1, set by kernel-python's
# --ipython on) and IPython importable in the kernel's interpreter, every
# cell runs through IPython's own InteractiveShell, as ipykernel runs it
# (kipython.py, beside this file, loaded by path). preload() imports it and
# defines the shell's classes (nothing there depends on the kernel: a zygote
# may call it before fork); post_fork() makes the shell in the worker. With
# the option off (the default: a cold start does not pay IPython's import),
# or without IPython, the rest of this file runs cells itself ("IPython
# (lazy)" below); on without IPython, the first cell says so on stderr.


class _KIP:
    mod = None  # kipython, once preloaded
    shell_class = None
    premade = None  # (KShell, its user module) a zygote made before forking
    shell = None  # the KShell, once made (from then on every cell goes to it)
    inline = False  # matplotlib_inline is the backend: it sends the figures
    failed = None  # why IPython could not be used (logged after "ready")
    note = None  # the same for the first cell's stderr, when the option asked for it
    later = None  # a note for the log, once "ready" is said
    premade_used = False  # the shell is the zygote's (kipython.finish made it this worker's)


def _ipython_wanted():
    return os.environ.get("KERNELMGR_IPYTHON") == "1"


def _kipython_unusable(why):
    _KIP.failed = "driver: ipython is on, but IPython is not usable: %s" % (why,)
    _KIP.note = ("[python] ipython is on, but IPython is not usable by %s (%s): cells run on "
                 "the stdlib path.\n" % (sys.executable, why))


def _findable(name):
    """Whether a top-level module can be imported (found, not imported),
    never from the workspace."""
    try:
        import _frozen_importlib_external as fie

        cwd = _cwd()
        return fie.PathFinder.find_spec(name, _driver_path(list(sys.path), cwd)[0]) is not None
    except Exception:
        return False


def _kipython_preload(for_zygote=False):
    if _KIP.mod is not None or _KIP.failed or not _ipython_wanted():
        return
    if not _findable("IPython"):
        _kipython_unusable("it is not importable")
        return
    try:
        import importlib.util

        f = os.path.join(os.path.dirname(os.path.abspath(_DRIVER_FILE)), "kipython.py")
        spec = importlib.util.spec_from_file_location("_kernelmgr_kipython", f)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _KIP.shell_class = mod.preload(_SELF)
        _KIP.mod = mod
        if for_zygote:
            _KIP.premade = mod.premake(_SELF, _KIP.shell_class)
    except Exception as e:
        # said in the log once the worker is ready (nothing comes before "ready")
        _IP.error = _IP.error or "%s: %s" % (type(e).__name__, e)
        _kipython_unusable("importing it failed: %s" % (_IP.error,))


def _kipython_start():
    """Makes the IPython shell (after _setup, in the worker)."""
    if _KIP.mod is None:
        return
    import builtins

    try:
        pre, _KIP.premade = _KIP.premade, None
        shell = None
        if pre is not None and sys.modules.get("__main__") is pre[1]:
            try:
                shell = _KIP.mod.finish(_SELF, pre[0])
                _KIP.premade_used = True
            except Exception as e:
                _KIP.later = ("driver: the zygote's IPython shell could not be used (one "
                              "made here instead): %s: %s" % (type(e).__name__, e))
                _KIP.shell_class.clear_instance()
        if shell is None:
            shell = _KIP.mod.make_shell(_SELF, _KIP.shell_class, sys.modules["__main__"])
    except Exception as e:
        _IP.error = "%s: %s" % (type(e).__name__, e)
        _kipython_unusable("its shell could not be made: %s" % (_IP.error,))
        _KIP.mod = None
        return
    _KIP.shell = _IP.shell = shell
    _IP.pub = shell.display_pub
    hm = shell.history_manager
    _H.In, _H.Out = hm.input_hist_parsed, hm.output_hist
    builtins.get_ipython = shell.get_ipython
    # clear_output and update_display stay builtins (ipykernel has none: a
    # superset), now IPython's own.
    try:
        ipd = _ipython_import("IPython.display")
        builtins.clear_output = ipd.clear_output
        builtins.update_display = ipd.update_display
    except ImportError:
        pass
    # IPython displays (and its display module needs no rerouting);
    # matplotlib_inline, when it is the backend, sends the figures.
    _KIP.inline = os.environ.get("MPLBACKEND", "").endswith("matplotlib_inline.backend_inline")
    if not _KIP.inline:
        _POST_IMPORT["matplotlib.pyplot"] = _patch_pyplot


def _execute_ipython(code, count, opts):
    exprs = opts.get("user_expressions")
    exprs = exprs if isinstance(exprs, dict) and exprs else None
    status, exit_code, ue, payload = "error", 1, None, []
    try:
        try:
            _output_running(True)
            status, exit_code, ue, payload = _KIP.mod.execute(code, _S.silent, _S.store_history,
                                                              count, exprs)
        finally:
            _S.user = False
            _output_running(False)
            _flush_std()
    except BaseException as e:
        if os.getpid() == _S.main_pid:
            _report_error(type(e), e, e.__traceback__)
    if os.getpid() != _S.main_pid:
        _flush_std()
        os._exit(0 if status == "ok" else 1)
    if not _KIP.inline:
        try:
            _flush_figures()
        except BaseException as e:
            _log("driver: flushing figures failed: %r" % (e,))
    done = {"type": "done", "status": status, "exit_code": exit_code}
    if ue is not None:
        done["user_expressions"] = ue
    if payload:
        done["payload"] = payload
    _emit(done)
    if _KIP.mod.exit_requested():
        _flush_std()
        os._exit(0)


# ---------------------------------------------------------------- IPython (lazy)
#
# IPython is never imported at start, nor for a cell that is valid Python.
# The first cell that needs it (a magic, `!`, `?`, get_ipython(), a value
# whose text/plain form IPython's pretty printer decides) loads it: an
# InteractiveShell whose user namespace is this driver's __main__, used for
# its input transformer, magics, system/getoutput, inspector and
# PlainTextFormatter. Cells still run, display and fail through this driver.
# Without IPython, IPython-only constructs raise IPythonRequiredError.


class IPythonRequiredError(Exception):
    """An IPython-only construct was used and IPython is not importable in
    this kernel's interpreter."""


class _IP:
    shell = None  # the InteractiveShell, once made
    error = None  # why IPython could not be loaded, once tried
    pretty = None  # IPython.lib.pretty, once imported
    pub = None  # the shell's own display publisher (routed to ours)
    inline = None  # the InlineBackend configurable (figure formats)
    shell_error = False  # the shell showed a traceback during this cell
    exit_requested = False  # exit()/quit() was called: end the worker after the cell


def _no_ipython(what):
    return IPythonRequiredError(
        "%s needs IPython, which is not importable in this kernel's Python (%s: %s); "
        "install it there (pip install ipython) or write the cell as plain Python"
        % (what, sys.executable, _IP.error or "not installed"))


def _ipython_import(name):
    """Imports an IPython module for the driver (never from the workspace);
    a failure is remembered and raised as ImportError from then on."""
    if _IP.error is not None:
        raise ImportError(_IP.error)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _driver_import(name)
    except Exception as e:
        _IP.error = "%s: %s" % (type(e).__name__, e)
        raise ImportError(_IP.error)


def _ipython_importable():
    if _IP.shell is not None or _IP.pretty is not None:
        return True
    try:
        _ipython_import("IPython")
        return True
    except ImportError:
        return False


def _shell_get(what="this construct"):
    """The driver's InteractiveShell (made on first use); raises
    IPythonRequiredError naming `what` without IPython."""
    if _IP.shell is not None:
        return _IP.shell
    try:
        ish = _ipython_import("IPython.core.interactiveshell")
        tconfig = _driver_import("traitlets.config")
    except ImportError:
        raise _no_ipython(what) from None
    import builtins

    cfg = tconfig.Config()
    cfg.HistoryManager.enabled = False
    cfg.HistoryManager.hist_file = ":memory:"
    cfg.InteractiveShell.colors = "NoColor"
    main = sys.modules["__main__"]
    saved = {k: _ns[k] for k in ("In", "Out", "_ih", "_oh", "exit", "quit") if k in _ns}
    saved_builtins = {k: getattr(builtins, k) for k in ("display", "exit", "quit")
                      if hasattr(builtins, k)}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shell = ish.InteractiveShell.instance(config=cfg, user_module=main)
    # Ours stay: display, the In/Out history already kept, exit().
    for k, v in saved_builtins.items():
        setattr(builtins, k, v)
    hm = shell.history_manager
    hm.input_hist_parsed[:] = saved.get("In", [""])
    hm.input_hist_raw[:] = list(hm.input_hist_parsed)
    hm.output_hist.clear()
    hm.output_hist.update(saved.get("Out", {}))
    for k in ("In", "_ih"):
        _ns[k] = hm.input_hist_parsed
    for k in ("Out", "_oh"):
        _ns[k] = hm.output_hist
    for k in ("exit", "quit"):
        _ns[k] = _EXITER
        shell.user_ns_hidden[k] = _EXITER
    _H.In, _H.Out = hm.input_hist_parsed, hm.output_hist
    shell.ask_exit = _ask_exit
    # `!cmd` runs with the cell's own stdout/stderr (a pty-less sandbox has
    # no pexpect), as IPython's system_raw does.
    shell.system = shell.system_raw
    shell.kernel = None  # a Jupyter kernel, as hasattr(ip, "kernel") asks
    # Cells the shell runs itself (%%capture's body, run_cell()) show their
    # result as execute_result, as in ipykernel, not as an "Out[N]:" line on
    # stdout: sys.displayhook is ours from now on, and the shell's trap
    # counts as entered (as during an ipykernel cell), so that it keeps
    # whatever hook is set - %%capture's own, while it captures.
    sys.displayhook = _displayhook
    shell.display_trap.hook = _displayhook
    shell.display_trap._nested_level = 1
    shell._showtraceback = _shell_showtraceback
    shell.set_hook("show_in_pager", _show_in_pager, 99)
    pub = shell.display_pub
    pub.publish = _shell_publish
    pub.clear_output = clear_output
    _IP.pub = pub
    _IP.inline = _make_inline_backend(shell, tconfig)
    shell.register_magic_function(_matplotlib_magic, "line", "matplotlib")
    _IP.shell = shell
    return shell


def _shell_publish(data, metadata=None, source=None, *, transient=None, update=False, **kw):
    _publish(data, metadata, transient, update)


def _shell_showtraceback(etype, evalue, stb):
    """A traceback the shell shows itself (%run, %timeit, event callbacks):
    reported like any error of the cell, which then fails."""
    _IP.shell_error = True
    _report_error(etype, evalue, getattr(evalue, "__traceback__", None))


def _show_in_pager(self, data, start=0, screen_lines=0, pager_cmd=None):
    """`obj?` and other paged text: a display_data in the cell (ipykernel
    sends it as a "page" payload, which notebooks show as output too)."""
    if isinstance(data, dict):
        bundle = dict(data)
    else:
        bundle = {"text/plain": str(data)}
    bundle = {k: v for k, v in bundle.items() if k in ("text/plain", "text/html")}
    publish_display_data(bundle)


def _ask_exit():
    _IP.exit_requested = True


class _Exiter:
    """exit() / quit(): like ipykernel, the cell finishes, then the kernel
    ends (the server reports it and starts a fresh worker);
    exit(keep_kernel=True) does nothing."""

    def __repr__(self):
        return "Type exit() to end this kernel (its namespace is lost)."

    __str__ = __repr__

    def __call__(self, keep_kernel=False):
        if not keep_kernel:
            _IP.exit_requested = True


_EXITER = _Exiter()


class _ShellProbe:
    """What get_ipython() gives a library (not a cell) before IPython is
    loaded: enough for the probes libraries make at import (pandas:
    hasattr(ip, "kernel") -> "a Jupyter kernel", as with ipykernel), without
    loading IPython; any other use loads the shell and goes to it."""

    kernel = None

    def __getattr__(self, name):
        try:
            shell = _shell_get("get_ipython()")
        except IPythonRequiredError as e:
            raise AttributeError("%s (%s)" % (name, e)) from None
        return getattr(shell, name)

    def __repr__(self):
        return "<get_ipython() of kernelmgr: IPython not loaded yet>"


def _get_ipython():
    """get_ipython(): the driver's InteractiveShell, made on first call from
    a cell; a library calling it first gets a _ShellProbe."""
    if _IP.shell is None:
        try:
            caller = sys._getframe(1).f_code.co_filename
        except (AttributeError, ValueError):
            caller = ""
        if caller not in _CELL_NAMES:
            return _ShellProbe()
    try:
        return _shell_get("get_ipython()")
    except IPythonRequiredError as e:
        raise NameError("name 'get_ipython' is not defined (%s)" % e) from None


_get_ipython.__name__ = "get_ipython"
_get_ipython.__qualname__ = "get_ipython"


def _make_inline_backend(shell, tconfig):
    """An `InlineBackend` configurable, so that `%config InlineBackend.figure_format
    = 'retina'` works as in ipykernel (without importing matplotlib_inline,
    which imports matplotlib)."""
    try:
        traitlets = _driver_import("traitlets")

        class InlineBackend(tconfig.SingletonConfigurable):
            figure_formats = traitlets.Set({"png"}).tag(config=True)
            figure_format = traitlets.Unicode().tag(config=True)
            print_figure_kwargs = traitlets.Dict({"bbox_inches": "tight"}).tag(config=True)
            close_figures = traitlets.Bool(True).tag(config=True)
            rc = traitlets.Dict({}).tag(config=True)

            @traitlets.observe("figure_format")
            def _figure_format_changed(self, change):
                if change["new"]:
                    self.figure_formats = {change["new"]}

        cfg = InlineBackend.instance(parent=shell)
        shell.configurables.append(cfg)
        return cfg
    except Exception as e:
        _log("driver: InlineBackend configurable unavailable: %r" % (e,))
        return None


def _matplotlib_magic(line=""):
    """%matplotlib [inline]: figures are always sent inline; another backend
    goes to IPython's magic."""
    if line.strip() in ("", "inline"):
        return None
    magics = _IP.shell.magics_manager.registry.get("PylabMagics")
    if magics is None:
        raise IPythonRequiredError("%%matplotlib %s is not supported" % line.strip())
    return magics.matplotlib(line)


def _shell_events(event, *args):
    shell = _IP.shell
    if shell is None:
        return
    shell.events.trigger(event, *args)


# ---------------------------------------------------------------- In / Out


class _H:
    In = None  # ['', cell 1, cell 2, ...] as in IPython (In[0] is '')
    Out = None  # {count: value}


def _store_input(count, raw, parsed):
    if not _S.store_history or _H.In is None:
        return
    hist = _H.In
    while len(hist) < count:
        hist.append("")
    if len(hist) == count:
        hist.append(parsed)
    else:
        hist[count] = parsed
    ns = _ns
    ns["_iii"] = ns.get("_ii", "")
    ns["_ii"] = ns.get("_i", "")
    ns["_i"] = raw
    ns["_i%d" % count] = raw
    if _IP.shell is not None:
        raw_hist = _IP.shell.history_manager.input_hist_raw
        while len(raw_hist) < count:
            raw_hist.append("")
        if len(raw_hist) == count:
            raw_hist.append(raw)
        else:
            raw_hist[count] = raw


# ---------------------------------------------------------------- IPython syntax without IPython
#
# Without IPython, only what the driver always did natively works: `!cmd`
# (without variable expansion) and %pip/%conda/%uv/%cd/%pwd/%matplotlib
# inline. Everything else IPython-only raises IPythonRequiredError where it
# stands. Lines are found by a scan that knows strings, comments, brackets
# and continuations, so a `!`/`%` line inside a string is never touched.


def _statement_lines(code):
    """Indices of the physical lines of code that start a statement: not
    inside a string, brackets or a backslash continuation."""
    starts = []
    depth = 0
    in_str = None
    cont = False
    for i, line in enumerate(code.split("\n")):
        if in_str is None and depth == 0 and not cont:
            starts.append(i)
            if line.lstrip()[:1] in ("!", "%", "?"):
                continue  # not Python: the rest of the line is the magic's
        cont = False
        j, n = 0, len(line)
        while j < n:
            c = line[j]
            if in_str is not None:
                if c == "\\":
                    j += 2
                    continue
                if line.startswith(in_str, j):
                    j += len(in_str)
                    in_str = None
                    continue
                j += 1
                continue
            if c == "#":
                break
            if c in "\"'":
                q = line[j:j + 3] if line[j:j + 3] in ('"""', "'''") else c
                in_str = q
                j += len(q)
                continue
            if c in "([{":
                depth += 1
            elif c in ")]}":
                depth = max(0, depth - 1)
            elif c == "\\" and j == n - 1:
                cont = True
            j += 1
        if in_str in ('"', "'"):
            if line.endswith("\\"):
                continue
            in_str = None  # unterminated: a SyntaxError later, not our concern
    return starts


_NATIVE_MAGICS = ("pip", "conda", "uv", "cd", "pwd", "matplotlib")


def _fallback_transform(code):
    """Rewrites IPython syntax at statement starts into driver calls, one
    line for one line (line numbers hold); None when there is none."""
    import re

    lines = code.split("\n")
    changed = False
    for i in _statement_lines(code):
        line = lines[i]
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        call = None
        m = re.match(r"^([A-Za-z_][\w.]*)\s*=\s*(!!?|%)(.*)$", stripped)
        if stripped.startswith("!"):
            call = "_shell(%r)" % stripped[1:].lstrip("!")
        elif stripped.startswith("%") and not stripped.startswith("%%"):
            call = "_magic(%r)" % stripped[1:]
        elif m:
            call = "_ipython_only(%r)" % ("`%s`" % stripped)
        elif stripped.startswith("?") or (stripped.endswith("?") and "#" not in stripped):
            call = "_ipython_only(%r)" % ("help syntax `%s`" % stripped)
        if call is not None:
            lines[i] = "%s__kernelmgr_driver__.%s" % (indent, call)
            changed = True
    return "\n".join(lines) if changed else None


def _ipython_only(what):
    raise _no_ipython(what)


def _shell(cmd):
    """`!cmd` without IPython: runs cmd with /bin/sh; output goes to the
    cell's fds. Variable expansion ({x}, $x) needs IPython."""
    import re

    if re.search(r"\{[^}]", cmd) or any(
            name in _ns for name in re.findall(r"\$([A-Za-z_]\w*)", cmd)):
        raise _no_ipython("variable expansion in `!%s`" % cmd)
    _flush_std()
    status = os.system(cmd)
    _ns["_exit_code"] = os.waitstatus_to_exitcode(status) if hasattr(
        os, "waitstatus_to_exitcode") else status >> 8


def _magic(line):
    """The magics the driver runs without IPython."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("pip", "conda", "uv"):
        shlex = _driver_import("shlex")

        if name == "pip":
            cmd = "%s -m pip %s" % (shlex.quote(sys.executable), arg)
        else:
            cmd = "%s %s" % (name, arg)
        _flush_std()
        status = os.system(cmd)
        _ns["_exit_code"] = status >> 8
    elif name == "cd":
        os.chdir(os.path.expanduser(arg or "~"))
        print(os.getcwd())
    elif name == "pwd":
        return os.getcwd()
    elif name == "matplotlib" and arg in ("", "inline"):
        pass  # figures are always sent inline
    else:
        raise _no_ipython("line magic %%%s" % line.strip())
    return None


# ---------------------------------------------------------------- errors


def _user_tb_exception(etype, value, tb):
    traceback = _driver_import("traceback")

    te = traceback.TracebackException(etype, value, tb, compact=True) if sys.version_info >= (
        3,
        10,
    ) else traceback.TracebackException(etype, value, tb)
    seen = set()
    stack = [te]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        t.stack[:] = [f for f in t.stack if f.filename != _DRIVER_FILE]
        for f in t.stack:
            if f.filename in _CELL_NAMES:
                f.line  # its source line, read under the file's name
                f.filename = _CELL_NAMES[f.filename]
        shown = getattr(t, "filename", None)  # a SyntaxError's
        if isinstance(shown, str) and shown in _CELL_NAMES:
            t.filename = _CELL_NAMES[shown]
        if _DBG.mod is not None:  # an interrupt raised inside debugpy's trace function
            kept = []
            for f in t.stack:
                if _DBG.mod.is_debugger_file(f.filename):
                    continue
                if kept and (kept[-1].filename, kept[-1].lineno, kept[-1].name) == (
                        f.filename, f.lineno, f.name):
                    continue
                kept.append(f)
            t.stack[:] = kept
        for nxt in (t.__cause__, t.__context__):
            if nxt is not None:
                stack.append(nxt)
        for nxt in getattr(t, "exceptions", None) or ():
            stack.append(nxt)
    return te


def _format_exc_text(etype, value, tb):
    try:
        return "".join(_user_tb_exception(etype, value, tb).format())
    except Exception:
        return "%s: %s\n" % (etype.__name__, value)


def _report_error(etype, value, tb):
    try:
        chunks = list(_user_tb_exception(etype, value, tb).format())
    except Exception:
        chunks = ["%s: %s" % (etype.__name__, value)]
    traceback_lines = [c[:-1] if c.endswith("\n") else c for c in chunks]
    try:
        shown = getattr(value, "filename", None) if isinstance(value, SyntaxError) else None
        shown = _CELL_NAMES.get(shown) if isinstance(shown, str) else None
        if shown is not None:  # "invalid syntax (<cell-N>, line L)", not the file's hash
            value.filename, shown = shown, value.filename
            try:
                evalue = str(value)
            finally:
                value.filename = shown
        else:
            evalue = str(value)
    except Exception:
        evalue = "<str() failed>"
    _emit(
        {
            "type": "error",
            "ename": getattr(etype, "__name__", str(etype)),
            "evalue": evalue,
            "traceback": traceback_lines,
        }
    )


# ---------------------------------------------------------------- execute

_ns = None


_CELL_HASH_SEED = 0xC70F6907  # debugInfo's hashSeed (kdebug answers with it)
_CELL_DIR = []  # [the cell directory], fixed at the first cell
_CELL_NAMES = {}  # cell file -> "<cell-N>" of the last cell of that code: what tracebacks show


def _murmur2(data, seed):
    """MurmurHash2 (32-bit, x86) of the UTF-8 bytes of data, as JupyterLab
    and ipykernel compute a cell's file name."""
    m = 0x5BD1E995
    b = data.encode("utf-8", "surrogatepass")
    n = len(b)
    h = (seed ^ n) & 0xFFFFFFFF
    r = n & ~3
    if sys.byteorder == "little":
        words = memoryview(b)[:r].cast("I")
    else:
        words = [int.from_bytes(b[i:i + 4], "little") for i in range(0, r, 4)]
    for k in words:
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        h = ((h * m) & 0xFFFFFFFF) ^ ((k * m) & 0xFFFFFFFF)
    if n & 3:
        h ^= int.from_bytes(b[r:], "little")
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def _cell_dir():
    """debugInfo's tmpFilePrefix without its trailing separator."""
    if not _CELL_DIR:
        _CELL_DIR.append(os.path.join(os.environ.get("TMPDIR") or "/tmp",
                                      "kernelmgr-cells-%d" % os.getuid()))
    return _CELL_DIR[0]


def _cell_path(code):
    return "%s%s%d.py" % (_cell_dir(), os.sep, _murmur2(code, _CELL_HASH_SEED))


def _cell_filename(count, code):
    """The file a cell compiles under: the name a debugger frontend computes
    for its code (Murmur2, as ipykernel names every cell), from the first
    cell on, so that a breakpoint set later in a function this cell defined
    binds. Tracebacks show it as <cell-N> (_user_tb_exception)."""
    if _DBG.mod is not None:
        path = _DBG.mod.cell_file(code)  # also remembered for `source`
    else:
        path = _cell_path(code)
    _CELL_NAMES[path] = "<cell-%d>" % count
    return path


def _register_source(filename, code):
    import linecache

    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)


def _ends_with_semicolon(code):
    """IPython's rule: a trailing ';' (ignoring comments) hides the result."""
    import io
    import tokenize

    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type in (
                tokenize.COMMENT,
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            ):
                continue
            last = tok
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


def _displayhook(value):
    if value is None:
        return
    import builtins

    ns = _ns
    ns["___"] = ns.get("__", "")
    ns["__"] = ns.get("_", "")
    ns["_"] = value
    builtins._ = value
    if _H.Out is not None and _S.store_history:
        _H.Out[_S.count] = value
        ns["_%d" % _S.count] = value
    data, md = _format(value)
    _emit({"type": "execute_result", "data": data, "metadata": md})


class _ScriptError(Exception):
    pass


_SCRIPT_MAGICS = {"bash": "bash", "sh": "sh"}


def _cell_magic(code):
    """(name, options, body) when code is an IPython cell magic (`%%name` on
    its first line), else None."""
    first, sep, body = code.lstrip("\n").partition("\n")
    if not first.startswith("%%"):
        return None
    words = first[2:].split()
    if not words:
        return None
    return words[0], words[1:], body


def _run_script_magic(name, options, body):
    """%%bash / %%sh, like IPython's script magics: the body runs in a new
    shell process whose output goes straight to the cell's stdout/stderr; a
    non-zero exit status raises CalledProcessError (unless
    --no-raise-error)."""
    subprocess = _driver_import("subprocess")

    raise_error = True
    for o in options:
        if o == "--no-raise-error":
            raise_error = False
        else:
            raise _ScriptError("%%%%%s: unsupported option %s (this kernel supports "
                               "--no-raise-error)" % (name, o))
    _flush_std()
    p = subprocess.Popen([_SCRIPT_MAGICS[name], "-c", body])
    _S.user = True
    try:
        rc = p.wait()
    except KeyboardInterrupt:
        # The shell got the SIGINT too (same process group); make sure it ends.
        try:
            p.wait(1)
        except BaseException:
            p.kill()
            p.wait()
        raise
    finally:
        _S.user = False
    if rc != 0 and raise_error:
        e = subprocess.CalledProcessError(rc, body)
        e.__kernelmgr_exit_code__ = rc if rc > 0 else 128 - rc
        raise e


def _transform_ipython(code, magic, error):
    """Python source for a cell with IPython syntax: IPython's own
    TransformerManager (by tokens) when IPython is importable, else the
    driver's fallback. Cells without IPython syntax re-raise `error`."""
    looks = magic is not None or _fallback_transform(code) is not None
    if not looks:
        raise error
    try:
        shell = _shell_get("IPython syntax")
    except IPythonRequiredError:
        if magic is not None:
            raise _no_ipython("cell magic %%%%%s" % magic[0]) from None
        return _fallback_transform(code)
    return shell.transform_cell(code)


def _run_code(code, count):
    """Compiles and runs one cell; exceptions propagate to the caller."""
    import _ast as ast

    raw = code
    filename = _cell_filename(count, code)
    _register_source(filename, code)
    magic = _cell_magic(code)
    if magic is not None and magic[0] in _SCRIPT_MAGICS:
        _store_input(count, raw, raw)
        name, options, body = magic
        _run_script_magic(name, options, body)
        return
    flags = getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
    tree = None
    if magic is None:
        try:
            tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
        except SyntaxError as e:
            error = e
    else:
        error = None
    if tree is None:
        code = _transform_ipython(code, magic, error)
        tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | flags, dont_inherit=True)
    _store_input(count, raw, code)
    info = None
    if _IP.shell is not None:
        ish = sys.modules["IPython.core.interactiveshell"]
        info = ish.ExecutionInfo(raw, _S.store_history, _S.silent, True, None)
        _shell_events("pre_execute")
        _shell_events("pre_run_cell", info)
    try:
        _run_tree(tree, code, filename, flags)
    finally:
        if info is not None and _IP.shell is not None:
            _shell_events("post_execute")
            _shell_events("post_run_cell", ish.ExecutionResult(info))


def _run_tree(tree, code, filename, flags):
    import _ast as ast

    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not _ends_with_semicolon(code):
        last = ast.Expression(tree.body.pop().value)
    codes = []
    if tree.body:
        codes.append(("exec", compile(tree, filename, "exec", flags, dont_inherit=True)))
    if last is not None:
        codes.append(("eval", compile(last, filename, "eval", flags, dont_inherit=True)))
    if _DBG.mod is not None:
        _DBG.mod.cell_starts()
    for mode, co in codes:
        _S.user = True
        try:
            if co.co_flags & 0x80:  # CO_COROUTINE: top-level await
                value = _run_async(co)
            else:
                value = eval(co, _ns)
        finally:
            _S.user = False
        if mode == "eval" and not _S.silent:
            _displayhook(value)


def _run_async(co):
    asyncio = _driver_import("asyncio")  # 20 ms: not at start

    try:
        loop = asyncio.get_event_loop()
    except RuntimeError:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    if loop.is_closed():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    return loop.run_until_complete(eval(co, _ns))


def _user_expressions(exprs):
    """Evaluates each expression in the user's namespace after the cell, as
    ipykernel does: {name: {status, data, metadata}} or an error entry."""
    out = {}
    for name, expr in exprs.items():
        try:
            _S.user = True
            try:
                value = eval(compile(str(expr), "<user_expression>", "eval"), _ns)
            finally:
                _S.user = False
            data, md = _format(value)
            out[name] = {"status": "ok", "data": data, "metadata": md}
        except BaseException as e:
            try:
                tb = _format_exc_text(type(e), e, e.__traceback__).rstrip("\n").split("\n")
            except Exception:
                tb = []
            out[name] = {"status": "error", "ename": type(e).__name__, "evalue": str(e),
                         "traceback": tb}
    return out


def _parse_options(options):
    if not options:
        return {}
    try:
        o = _j().loads(options)
    except ValueError:
        _log("driver: bad execute options ignored")
        return {}
    return o if isinstance(o, dict) else {}


def _execute(code, silent, store_history, allow_stdin, count, options=""):
    _S.silent = silent == "1"
    _S.allow_stdin = allow_stdin == "1"
    _S.store_history = store_history == "1" and not _S.silent
    _IP.shell_error = False
    opts = _parse_options(options)
    try:
        count = int(count)
    except ValueError:
        count = _S.count + 1
    _S.count = count
    if _KIP.shell is not None:
        _execute_ipython(code, count, opts)
        return
    status, exit_code = "ok", 0
    try:
        try:
            _output_running(True)
            if _KIP.note and not _S.silent:  # once: ipython on, IPython not usable
                note, _KIP.note = _KIP.note, None
                sys.stderr.write(note)
            _run_code(code, count)
        finally:
            _S.user = False
            _output_running(False)
            _flush_std()
    except SystemExit as e:
        # sys.exit(0) ends the cell successfully; another code is an error
        # whose exit_code the caller sees.
        code_ = e.code
        if code_ is None or code_ == 0:
            pass
        else:
            status = "error"
            exit_code = code_ if isinstance(code_, int) else 1
            _report_error(type(e), e, e.__traceback__)
    except BaseException as e:
        status, exit_code = "error", getattr(e, "__kernelmgr_exit_code__", 1)
        if os.getpid() == _S.main_pid:
            if _is_usage_error(e):
                # As IPython shows a UsageError: one line on stderr, no traceback.
                sys.stderr.write("UsageError: %s\n" % (e,))
            else:
                _report_error(type(e), e, e.__traceback__)
                _post_mortem(e)
            if _DBG.mod is not None and isinstance(e, KeyboardInterrupt):
                _DBG.mod.after_interrupt()
    finally:
        _S.user = False
    if _IP.shell_error and status == "ok":
        status, exit_code = "error", 1
    if os.getpid() != _S.main_pid:
        # A child forked by the cell (os.fork() without exec) came back here:
        # it must not report the cell or read the parent's requests.
        _flush_std()
        os._exit(0 if status == "ok" else 1)
    try:
        _flush_figures()
    except BaseException as e:
        _log("driver: flushing figures failed: %r" % (e,))
    done = {"type": "done", "status": status, "exit_code": exit_code}
    exprs = opts.get("user_expressions")
    if isinstance(exprs, dict) and exprs:
        # ipykernel evaluates them only after a successful cell.
        done["user_expressions"] = _user_expressions(exprs) if status == "ok" else {}
    if _IP.exit_requested:
        done["payload"] = [{"source": "ask_exit", "keepkernel": False}]
    _emit(done)
    if _IP.exit_requested:
        # exit()/quit(), as in ipykernel: the kernel ends after the cell; the
        # server reports it and starts a fresh worker.
        _flush_std()
        os._exit(0)


def _post_mortem(e):
    """Keeps the error for %debug (sys.last_*, its traceback starting one
    driver frame above the cell's, which IPython's debugger skips) and runs
    the post-mortem debugger over stdin at once under %pdb."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None and (
            tb.tb_next.tb_frame.f_code.co_filename == _DRIVER_FILE):
        tb = tb.tb_next
    sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = e
    shell = _IP.shell
    if shell is not None and shell.call_pdb and not isinstance(e, KeyboardInterrupt):
        _S.user = True
        try:
            shell.debugger(force=True)
        except BaseException as pm:
            _log("driver: post-mortem debugger ended: %r" % (pm,))
        finally:
            _S.user = False


def _is_usage_error(e):
    mod = sys.modules.get("IPython.core.error")
    return mod is not None and isinstance(e, getattr(mod, "UsageError", ()))


# ---------------------------------------------------------------- complete



def _token_before(text):
    """Dotted identifier ending at the end of text."""
    i = len(text)
    while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_."):
        i -= 1
    return text[i:]


def _complete_jedi(code, cursor):
    try:
        jedi = _driver_import("jedi")  # a jedi.py in the workspace is not it
    except Exception:
        return None
    before = code[:cursor]
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1)
    try:
        comps = jedi.Interpreter(code, [_ns]).complete(line, column)
    except Exception as e:
        _log("driver: jedi completion failed: %r" % (e,))
        return None
    matches, types = [], []
    start = cursor
    for c in comps:
        prefix_len = len(c.name) - len(c.complete)
        start = cursor - prefix_len
        break
    for c in comps:
        prefix_len = len(c.name) - len(c.complete)
        if cursor - prefix_len != start:
            continue
        matches.append(c.name)
        types.append({"start": start, "end": cursor, "text": c.name, "type": c.type,
                      "signature": ""})
    return matches, start, {"_jupyter_types_experimental": types}


def _complete_rl(code, cursor):
    import builtins
    import keyword

    # not at start: it imports readline, which may touch the terminal
    rlcompleter = _driver_import("rlcompleter")

    token = _token_before(code[:cursor])
    start = cursor - len(token)
    if not token:
        return [], cursor, {}
    completer = rlcompleter.Completer(_ns)
    matches = []
    if "." in token:
        try:
            matches = completer.attr_matches(token)
        except Exception:
            matches = []
    else:
        seen = set()
        for word in keyword.kwlist + list(_ns) + list(vars(builtins)):
            if word.startswith(token) and word not in seen:
                seen.add(word)
                matches.append(word)
    # Like jedi: matches replace only the part after the last dot.
    cut = token.rfind(".") + 1
    start += cut
    out = []
    for m in matches:
        m = m.rstrip("(")[cut:]
        if m not in out:
            out.append(m)
    if "." not in token:
        out.sort(key=lambda w: (w.startswith("_"), w))
    return out, start, {}


def _complete(code, cursor):
    try:
        cursor = int(cursor)
    except ValueError:
        cursor = len(code)
    cursor = max(0, min(cursor, len(code)))
    end = cursor
    r = None
    if _wants_ipython_completer(code, cursor) and _ipython_importable():
        try:
            r, end = _complete_ipython(code, cursor)
        except Exception as e:
            _log("driver: IPython completion failed: %r" % (e,))
            r, end = None, cursor
    if r is None:
        r = _complete_jedi(code, cursor)
    if r is None or not r[0]:
        r = _complete_rl(code, cursor)
    matches, start, md = r
    _emit(
        {
            "type": "complete_reply",
            "matches": matches,
            "cursor_start": start,
            "cursor_end": end,
            "metadata": md,
        }
    )


def _wants_ipython_completer(code, cursor):
    """IPython's completer once the shell exists (as ipykernel); before,
    only where it knows more than jedi: magics (`%tim`) and dict/DataFrame
    keys (`df['`)."""
    import re

    if _IP.shell is not None:
        return True
    before = code[:cursor]
    line = before[before.rfind("\n") + 1:]
    return bool(re.match(r"\s*%", line) or re.search(r"\[\s*['\"][^'\"\]]*$", line))


def _complete_ipython(code, cursor):
    """((matches, start, metadata), end) from IPython's completer, as
    ipykernel's do_complete makes them."""
    import re

    shell = _shell_get("IPython completion")
    completer_mod = sys.modules["IPython.core.completer"]
    with completer_mod.provisionalcompleter():
        comps = list(completer_mod.rectify_completions(
            code, shell.Completer.completions(code, cursor)))
    before = code[:cursor]
    if re.search(r"\[\s*['\"][^'\"\]]*$", before[before.rfind("\n") + 1:]):
        # Inside a subscript string only keys make sense (IPython 8 also
        # offers every magic there).
        comps = [c for c in comps if not c.text.startswith("%")] or comps
    types = [{"start": c.start, "end": c.end, "text": c.text, "type": c.type,
              "signature": c.signature} for c in comps]
    if comps:
        start, end = comps[0].start, comps[0].end
    else:
        start = end = cursor
    return ([c.text for c in comps], start, {"_jupyter_types_experimental": types}), end


# ---------------------------------------------------------------- inspect


def _name_at(code, cursor):
    """The dotted name under the cursor, or the callee of an open call."""
    i = cursor
    n = len(code)
    while i < n and (code[i].isalnum() or code[i] == "_"):
        i += 1
    token = _token_before(code[:i]).strip(".")
    if token and not token[0].isdigit():
        return token
    depth = 0
    j = cursor - 1
    while j >= 0:
        ch = code[j]
        if ch == ")":
            depth += 1
        elif ch == "(":
            if depth == 0:
                return _token_before(code[:j]).strip(".")
            depth -= 1
        j -= 1
    return ""


def _resolve(name):
    import builtins

    parts = name.split(".")
    if parts[0] in _ns:
        obj = _ns[parts[0]]
    elif hasattr(builtins, parts[0]):
        obj = getattr(builtins, parts[0])
    else:
        raise LookupError(name)
    for p in parts[1:]:
        obj = getattr(obj, p)
    return obj


def _inspect_text(name, obj, detail):
    inspect = _driver_import("inspect")

    lines = []
    try:
        sig = str(inspect.signature(obj)) if callable(obj) else None
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        lines.append("Signature: %s%s" % (name.split(".")[-1], sig))
    if not callable(obj) or isinstance(obj, (int, float, str, bytes, list, dict, tuple, set)):
        text = _text_plain(obj)
        if len(text) > 200:
            text = text[:200] + "..."
        lines.append("String form: %s" % text)
        if hasattr(obj, "__len__"):
            try:
                lines.append("Length: %d" % len(obj))
            except Exception:
                pass
    doc = inspect.getdoc(obj)
    source = None
    if detail >= 1:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError):
            source = None
    if source is not None:
        lines.append("Source:\n" + source.rstrip("\n"))
    elif doc:
        lines.append("Docstring:\n" + doc)
    else:
        lines.append("Docstring: <no docstring>")
    try:
        f = inspect.getsourcefile(obj) or inspect.getfile(obj)
        lines.append("File: %s" % f)
    except (TypeError, OSError):
        pass
    lines.append("Type: %s" % type(obj).__name__)
    return "\n".join(lines)


def _inspect(code, cursor, detail):
    try:
        cursor = max(0, min(int(cursor), len(code)))
    except ValueError:
        cursor = len(code)
    try:
        detail = int(detail)
    except ValueError:
        detail = 0
    ev = {"type": "inspect_reply", "found": False, "data": {}, "metadata": {}}
    if _KIP.shell is not None:  # as ipykernel's do_inspect
        try:
            found, data, md = _KIP.mod.inspect(code, cursor, detail)
            ev.update(found=found, data=data, metadata=md)
        except Exception as e:
            _log("driver: inspect failed: %r" % (e,))
        _emit(ev)
        return
    name = _name_at(code, cursor)
    if name:
        try:
            obj = _resolve(name)
        except Exception:
            pass
        else:
            try:
                ev["data"] = {"text/plain": _inspect_text(name, obj, detail)}
                ev["found"] = True
            except Exception as e:
                _log("driver: inspect of %s failed: %r" % (name, e))
    _emit(ev)


# ---------------------------------------------------------------- is_complete


def _is_complete(code):
    if _KIP.shell is not None:  # as ipykernel's do_is_complete
        try:
            _emit(_KIP.mod.is_complete(code))
            return
        except Exception as e:
            _log("driver: check_complete failed: %r" % (e,))
    _emit(_is_complete_reply(code))


def _is_complete_reply(code):
    """is_complete for a cell: IPython syntax (%magic, !cmd, obj?) is judged
    by IPython's TransformerManager when IPython is importable, else on the
    driver's own rewrite of it; plain Python by codeop."""
    ev = {"type": "is_complete_reply", "status": "complete"}
    if not code.strip():
        return ev
    try:
        compile(code, "<input>", "exec", dont_inherit=True)
        return _is_complete_python(code)
    except (SyntaxError, OverflowError, ValueError):
        pass
    if code.lstrip("\n").startswith("%%") or _fallback_transform(code) is not None:
        if _ipython_importable():
            try:
                tm = _ipython_import("IPython.core.inputtransformer2")
                status, indent = tm.TransformerManager().check_complete(code)
                ev = {"type": "is_complete_reply", "status": status}
                if status == "incomplete":
                    ev["indent"] = " " * (indent or 0)
                return ev
            except Exception as e:
                _log("driver: IPython check_complete failed: %r" % (e,))
        if code.lstrip("\n").startswith("%%"):  # IPython's rule for cell magics
            if code.split("\n")[-1].strip():
                return {"type": "is_complete_reply", "status": "incomplete", "indent": ""}
            return ev
        code = _fallback_transform(code)
    return _is_complete_python(code)


def _is_complete_python(code):
    codeop = _driver_import("codeop")

    ev = {"type": "is_complete_reply", "status": "complete"}
    lines = code.split("\n")
    last_line = lines[-1]
    nonblank = [ln for ln in lines if ln.strip()]
    last_nonblank = nonblank[-1] if nonblank else ""
    indent = last_nonblank[: len(last_nonblank) - len(last_nonblank.lstrip())]
    try:
        compile(code, "<input>", "exec", dont_inherit=True)
        compiled = True
    except (SyntaxError, OverflowError, ValueError):
        compiled = False
    if compiled:
        # Still inside an indented block: a console keeps reading until an
        # empty line closes it.
        if last_line.strip() and last_line[:1] in (" ", "\t") and "\n" in code:
            ev = {"type": "is_complete_reply", "status": "incomplete", "indent": indent}
        return ev
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = codeop.compile_command(code, "<input>", "exec")
    except (SyntaxError, OverflowError, ValueError):
        ev = {"type": "is_complete_reply", "status": "invalid"}
    else:
        if r is None:
            if last_nonblank.rstrip().endswith(":"):
                indent += "    "
            ev = {"type": "is_complete_reply", "status": "incomplete", "indent": indent}
    return ev


# ---------------------------------------------------------------- main


def _setup():
    global _ns, _lock
    import builtins
    import signal
    import types

    # sys.path[0] is this file's directory; user code should see its
    # workspace (the cwd) there instead, as in IPython.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(
        os.path.abspath(_DRIVER_FILE)
    ):
        sys.path[0] = ""
    sys.argv = [""]
    os.environ.setdefault("MPLBACKEND", "Agg")
    # Inside the sandbox the home directory is not writable: caches that
    # libraries keep there (matplotlib, fontconfig, jedi) go to /tmp instead
    # of failing loudly on every import.
    if not os.access(os.path.expanduser("~"), os.W_OK):
        tmp = os.environ.get("TMPDIR", "/tmp")
        uid = os.getuid()
        os.environ.setdefault("XDG_CACHE_HOME", os.path.join(tmp, "kernelmgr-cache-%d" % uid))
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(tmp, "kernelmgr-mpl-%d" % uid))
        os.environ.setdefault("IPYTHONDIR", os.path.join(tmp, "kernelmgr-ipython-%d" % uid))
    _setup_output()
    try:
        import _thread

        _lock = _thread.allocate_lock()
    except ImportError:
        _lock = None

    # the zygote's IPython shell's user module when it made one (see
    # _kipython_start), else a new one
    main = _KIP.premade[1] if _KIP.premade is not None else types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    _ns = main.__dict__
    builtins.input = _input
    builtins.__kernelmgr_driver__ = _SELF
    builtins.display = display
    builtins.clear_output = clear_output
    builtins.update_display = update_display
    builtins.get_ipython = _get_ipython
    builtins.exit = builtins.quit = _EXITER
    _H.In, _H.Out = [""], {}
    _ns["In"] = _ns["_ih"] = _H.In
    _ns["Out"] = _ns["_oh"] = _H.Out
    sys.meta_path.insert(0, _PostImportFinder())
    for name, hook in _POST_IMPORT.items():
        if name in sys.modules:
            hook(sys.modules[name])
    signal.signal(signal.SIGINT, _on_sigint)
    _BASE_MODULES.update(sys.modules)  # a snapshot re-imports the others
    _BASE_ENV.update(os.environ)
    _BASE_PATH.extend(sys.path)
    try:
        import faulthandler

        faulthandler.enable()
    except Exception:
        pass


class _DBG:
    mod = None  # kdebug, once the first debug request came


def _kdebug():
    return _DBG.mod


def _debugpy_findable():
    """Whether debugpy can be imported here (found, not imported)."""
    try:
        import _frozen_importlib_external as fie

        return fie.PathFinder.find_spec("debugpy") is not None
    except Exception:
        return False


def _debug_reader():
    """The debug pipe's thread: blocked in read() until the first debug
    request, which loads kdebug.py (beside this file) and hands it the pipe."""
    try:
        first = os.read(_DBG_REQ_FD, 65536)
        if not first:
            return
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(_DRIVER_FILE)), "kdebug.py")
        spec = importlib.util.spec_from_file_location("__kernelmgr_kdebug__", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod._drv, mod.CELL_DIR, mod.HASH_SEED = _SELF, _cell_dir(), _CELL_HASH_SEED
        _DBG.mod = mod
        mod.serve(_SELF, _DBG_REQ_FD, _DBG_EVT_FD, first)
    except BaseException as e:
        _log("driver: the debug thread ended: %r" % (e,))


def _dispatch(kind, fields):
    if kind in ("execute", "execute_ext"):
        _execute(*fields)
    elif kind == "interrupt":
        _S.owed += 1
    elif kind == "complete":
        _complete(*fields)
    elif kind == "inspect":
        _inspect(*fields)
    elif kind == "is_complete":
        _is_complete(*fields)
    elif kind == "snapshot":
        _snapshot(*fields)
    # input_reply / input_cancel outside an input request: a late answer to
    # a request that an interrupt already ended; an interrupt announced when
    # its cell had already ended; sync. Dropped.


def _snapshot(action, path, max_bytes):
    """The worker protocol's snapshot request: ksnap.py (beside this file,
    loaded by path, never from the workspace) saves or loads the state."""
    import importlib.util

    mod = _driver_private.get("ksnap")
    if mod is None:
        f = os.path.join(os.path.dirname(os.path.abspath(_DRIVER_FILE)), "ksnap.py")
        spec = importlib.util.spec_from_file_location("_kernelmgr_ksnap", f)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _driver_private["ksnap"] = mod
    if action == "save":
        ev = mod.save(path, max_bytes, _ns, _H.In, _H.Out, _S.count, _BASE_MODULES,
                      base_env=_BASE_ENV, base_path=_BASE_PATH)
    else:
        ev = mod.load(path, _ns, _H.In, _H.Out, _log)
        _S.count = ev.get("execution_count", 0) or _S.count
    _emit(ev)


_FALLBACK = {
    "execute": {"type": "done", "status": "error", "exit_code": 1},
    "complete": {"type": "complete_reply", "matches": [], "cursor_start": 0, "cursor_end": 0,
                 "metadata": {}},
    "inspect": {"type": "inspect_reply", "found": False, "data": {}, "metadata": {}},
    "is_complete": {"type": "is_complete_reply", "status": "unknown"},
    "snapshot": {"type": "snapshot_reply", "status": "error", "ename": "SnapshotFailed",
                 "evalue": "the driver failed (see the kernel log)", "lost": []},
}


def preload(for_zygote=False):
    """What a worker needs that does not depend on its kernel: IPython
    imported and the shell's classes defined (kipython.py), the tokenizer
    warm. A zygote calls it once (for_zygote) and forks workers from it; a
    cold start calls it, then post_fork(). A zygote also makes the IPython
    shell (kipython.premake: no thread, no file left open, no code of the
    session's); post_fork() then redoes in the worker what of it is the
    worker's (environment, profile directory, stdio, builtins, __main__).
    A cold start makes the shell in post_fork()."""
    _kipython_preload(for_zygote)
    try:
        import io
        import tokenize

        list(tokenize.generate_tokens(io.StringIO("x = 1  # warm\n").readline))
    except Exception:
        pass


def post_fork():
    """The worker's own start (after preload(), in the process that serves
    the kernel): PRNGs reseeded (a zygote's children must not share a
    sequence), the output, namespace and signal setup, the IPython shell.
    The request/event fds are the ones this module read at import."""
    for name in ("random", "numpy.random"):
        mod = sys.modules.get(name)
        if mod is not None:
            try:
                mod.seed()
            except Exception:
                pass
    if _KIP.mod is not None:
        # IPython displays (its display module needs no rerouting) and
        # matplotlib_inline, when it becomes the backend, sends the figures
        # (_kipython_start puts the pyplot patch back otherwise).
        for name in ("IPython.core.display_functions", "IPython.core.display", "IPython.display",
                     "matplotlib.pyplot"):
            _POST_IMPORT.pop(name, None)
    os.environ.pop("KERNELMGR_IPYTHON", None)  # the kernel's, not the code's
    _setup()
    _S.main_pid = os.getpid()
    _S.main_tid = _thread_ident()
    _kipython_start()


def main():
    preload()
    post_fork()
    _serve()


def _serve():
    """Says "ready" (with the features) and answers requests until the
    request pipe closes."""
    features = list(_FEATURES)
    if _DBG_REQ_FD >= 0 and _DBG_EVT_FD >= 0 and _debugpy_findable():
        features.append("debugger")
        import _thread

        _thread.start_new_thread(_debug_reader, ())
    _os_write(_EVT_FD, ('{"type":"ready","features":%s}\n' % _j().dumps(features)).encode())
    for note in (_KIP.failed, _KIP.later):
        if note:
            _log(note)
    while True:
        try:
            kind, fields = _requests.request()
        except EOFError:
            break
        except KeyboardInterrupt:
            continue
        if kind == "sync":  # the late sync of a wait an interrupt cut short
            _stray_sync()
            continue
        _S.answered = False
        try:
            _dispatch(kind, fields)
        except BaseException as e:
            # Only reached when the driver itself failed (or an interrupt hit
            # a tiny window outside user code): answer anyway so the server is
            # never left waiting.
            if isinstance(e, SystemExit):
                raise
            try:
                _log("driver: %s request failed: %r" % (kind, e))
                fb = _FALLBACK.get(kind)
                if fb is not None and not _S.answered:
                    if kind == "execute":
                        _report_error(type(e), e, e.__traceback__)
                    _emit(fb)
            except BaseException:
                pass
    _flush_std()


if __name__ == "__main__":
    main()
