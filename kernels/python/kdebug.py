"""kernelmgr's Jupyter debugger: the worker side of debug_request.

Loaded by driver.py only when the first debug request arrives (nothing of it,
nor of debugpy, is imported before). Requests come as JSON lines on the
worker's debug request pipe, {"id": N, "request": <DAP request>}, read by a
thread of their own (never the main thread, which a cell stopped at a
breakpoint holds); answers go back on the debug event pipe as {"id": N,
"reply": <DAP response>} and DAP events as {"event": <DAP event>}
(kernels/WORKER_PROTOCOL.md "Debug pipes").

The backend is debugpy: debugpy.listen() on the sandbox's own loopback (its
adapter is a process inside the sandbox; no host port is opened), and this
module is its DAP client over that TCP connection, as ipykernel's
debugger is. What the Jupyter protocol adds to DAP is answered here:
dumpCell, debugInfo, source (cells), inspectVariables, richInspectVariables,
modules, copyToGlobals, configurationDone; stackTrace and variables are
filtered so that no frame or name of the kernel's own shows.

Cells are compiled under the file name the frontend computes (Murmur2 of
the code with HASH_SEED, CELL_DIR as prefix, ".py"): every cell, from the
first one on, dumped or not, and whether or not a debugger was initialized
then (the driver's _cell_filename; cell_file once this module is loaded).
`source` answers for a cell run before the debugger from linecache, where
the driver registers every cell's code.
"""

import json
import os
import socket
import sys
import threading
import _thread

HASH_SEED = None  # the driver's _CELL_HASH_SEED (set by serve)
_drv = None  # the driver module (set by serve)
_dbg = None  # the one Debugger
_rich = {}  # token -> (data, metadata) of richInspectVariables while stopped
_MAX_CELLS = 10000  # cell sources remembered for `source`
_ADAPTER_TIMEOUT = 60.0  # seconds a forwarded request may take


CELL_DIR = None  # the driver's _cell_dir() (set by serve)


def cell_file(code):
    """The file name a cell of this code compiles under (the driver's
    _cell_path), remembered for `source`."""
    path = _drv._cell_path(code)
    d = _dbg
    if d is not None:
        d.remember(path, code)
    return path


def is_cell_file(path):
    return bool(CELL_DIR) and isinstance(path, str) and path.startswith(CELL_DIR + os.sep)


def cell_starts():
    """Called by the driver (main thread) before each cell while a debugger
    was ever initialized: the thread is traced while a client is attached,
    and not at all otherwise (a disconnected debugger costs nothing)."""
    d = _dbg
    if d is None:
        return
    if d.attached:
        try:
            import debugpy

            debugpy.trace_this_thread(True)
        except Exception as e:
            d.log("trace_this_thread failed: %r" % (e,))
    elif d.listening:
        sys.settrace(None)


def after_interrupt():
    """Called by the driver (main thread) when a cell ended with
    KeyboardInterrupt: an interrupt that came while the cell was stopped
    left debugpy's state of the thread "suspended" (it was raised in its
    wait loop), which would stop the next cell at its first line, silently.
    The thread runs: say so."""
    try:
        from _pydevd_bundle.pydevd_constants import STATE_RUN

        info = getattr(threading.current_thread(), "additional_info", None)
        if info is not None and info.pydev_state != STATE_RUN:
            info.pydev_state = STATE_RUN
            info.pydev_step_cmd = -1
            info.pydev_original_step_cmd = -1
            info.pydev_step_stop = None
    except Exception as e:
        if _dbg is not None:
            _dbg.log("after_interrupt: %r" % (e,))


def is_debugger_file(path):
    """Frames of debugpy itself (an interrupt raised in its trace function)."""
    return isinstance(path, str) and ("_pydevd_bundle" in path or "/debugpy/" in path
                                      or path.endswith("pydevd.py"))


def rich_store(token, value):
    """Evaluated in a stopped frame by richInspectVariables."""
    try:
        _rich[token] = _drv._format(value)
    except Exception as e:
        _rich[token] = ({"text/plain": "<%s: %s>" % (type(e).__name__, e)}, {})


# ---------------------------------------------------------------- variables

_HIDDEN = {
    "__name__", "__doc__", "__package__", "__loader__", "__spec__", "__annotations__",
    "__builtins__", "__builtin__", "__display__", "get_ipython", "debugpy", "exit", "quit",
    "In", "Out", "_oh", "_dh", "_ih", "_", "__", "___", "__kernelmgr_driver__",
}


def accept_variable(name):
    if name in _HIDDEN:
        return False
    if len(name) > 1 and name[0] == "_" and name[1:2].isdigit():
        return False
    return not name.startswith("_i")


def _short_repr(value, limit=1000):
    try:
        r = repr(value)
    except Exception as e:
        r = "<repr() failed: %s: %s>" % (type(e).__name__, e)
    return r if len(r) <= limit else r[:limit] + "..."


class _Explorer:
    """Variables of the user namespace while no thread is stopped
    (inspectVariables, then variables with its references)."""

    MAX_CHILDREN = 1000

    def __init__(self):
        self.refs = {}
        self.next = 1

    def ref(self, value):
        if isinstance(value, (int, float, complex, str, bytes, bool, type(None))):
            return 0
        if not (isinstance(value, (dict, list, tuple, set, frozenset))
                or hasattr(value, "__dict__")):
            return 0
        r = self.next
        self.next += 1
        self.refs[r] = value
        return r

    def var(self, name, value, evaluate_name=None):
        return {"name": name, "value": _short_repr(value), "type": type(value).__name__,
                "evaluateName": evaluate_name or name, "variablesReference": self.ref(value)}

    def top(self, ns):
        items = list(ns.items())
        return [self.var(k, v) for k, v in items if isinstance(k, str) and accept_variable(k)]

    def children(self, ref):
        value = self.refs.get(ref)
        if value is None:
            return None
        out = []
        try:
            if isinstance(value, dict):
                for k, v in list(value.items())[:self.MAX_CHILDREN]:
                    out.append(self.var(_short_repr(k, 100), v))
            elif isinstance(value, (list, tuple)):
                for i, v in enumerate(list(value)[:self.MAX_CHILDREN]):
                    out.append(self.var(str(i), v))
            elif isinstance(value, (set, frozenset)):
                for i, v in enumerate(list(value)[:self.MAX_CHILDREN]):
                    out.append(self.var(str(i), v))
            else:
                for k, v in list(vars(value).items())[:self.MAX_CHILDREN]:
                    out.append(self.var(str(k), v))
        except Exception:
            pass
        return out


# ---------------------------------------------------------------- the client


def _response(request, success=True, body=None, message=None):
    r = {"type": "response", "seq": 0, "request_seq": request.get("seq", 0),
         "success": bool(success), "command": request.get("command", "")}
    r["body"] = body if body is not None else {}
    if message is not None:
        r["message"] = message
    return r


class Debugger:
    def __init__(self, evt_fd):
        self.evt_fd = evt_fd
        self.out_lock = threading.Lock()
        self.listening = False  # debugpy.listen() was called in this process
        self.addr = None
        self.sock = None
        self.attached = False
        self.started = False  # initialize succeeded, no disconnect since
        self.send_lock = threading.Lock()
        self.cond = threading.Condition()
        self.responses = {}  # internal seq -> response
        self.seq = 0
        self.initialized = threading.Event()
        self.breakpoints = {}  # source path -> breakpoints (debugInfo)
        self.stopped = set()  # DAP thread ids stopped now
        self.cells = {}  # cell file -> code
        self.explorer = _Explorer()
        self.rich_token = 0
        here = os.path.dirname(os.path.abspath(__file__))
        self.own_files = {os.path.abspath(_drv._DRIVER_FILE), os.path.abspath(__file__),
                          os.path.join(here, "ksnap.py")}

    # -- output

    def write(self, obj):
        line = json.dumps(obj, default=repr, ensure_ascii=False, allow_nan=False)
        data = (line + "\n").encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()
        with self.out_lock:
            view = memoryview(data)
            while view:
                n = _drv._os_write(self.evt_fd, view)
                view = view[n:]

    def event(self, ev):
        self.write({"event": ev})

    def log(self, text):
        try:
            _drv._log("kdebug: %s" % text)
        except Exception:
            pass

    def remember(self, path, code):
        if path not in self.cells and len(self.cells) >= _MAX_CELLS:
            self.cells.pop(next(iter(self.cells)))
        self.cells[path] = code

    # -- the adapter

    def start(self):
        """debugpy listening on loopback and a connection to its adapter."""
        global CELL_DIR
        if not self.listening:
            # cells are compiled from memory; pydevd's frozen-modules note
            # would only land in the user's stderr
            os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
            import debugpy

            host, port = debugpy.listen(("127.0.0.1", 0))
            debugpy.trace_this_thread(False)
            self.addr = (host, port)
            self.listening = True
        if self.sock is None:
            self.sock = socket.create_connection(self.addr, timeout=30)
            self.sock.settimeout(None)
            self.initialized.clear()
            t = threading.Thread(target=self.read_adapter, args=(self.sock,), daemon=True,
                                 name="kernelmgr-debug-adapter")
            t.pydev_do_not_trace = True
            t.is_pydev_daemon_thread = True
            t.start()

    def stop(self):
        sock, self.sock = self.sock, None
        self.attached = False
        self.started = False
        self.breakpoints = {}
        self.stopped = set()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        with self.cond:
            self.cond.notify_all()

    def read_adapter(self, sock):
        me = threading.current_thread()
        me.pydev_do_not_trace = True
        me.is_pydev_daemon_thread = True
        buf = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            buf += chunk
            while True:
                sep = buf.find(b"\r\n\r\n")
                if sep < 0:
                    break
                length = None
                for line in buf[:sep].split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if length is None or len(buf) < sep + 4 + length:
                    break
                body, buf = buf[sep + 4:sep + 4 + length], buf[sep + 4 + length:]
                try:
                    msg = json.loads(body.decode("utf-8"))
                except ValueError:
                    continue
                self.from_adapter(msg)
        if sock is self.sock:  # the adapter went away
            self.sock = None
            self.attached = False
        with self.cond:
            self.cond.notify_all()

    def from_adapter(self, msg):
        kind = msg.get("type")
        if kind == "response":
            with self.cond:
                self.responses[msg.get("request_seq")] = msg
                self.cond.notify_all()
            return
        if kind != "event":
            return
        name = msg.get("event")
        body = msg.get("body") or {}
        if name == "initialized":
            self.initialized.set()
        elif name == "stopped":
            if body.get("threadId") is not None:
                self.stopped.add(body["threadId"])
        elif name == "continued":
            if body.get("allThreadsContinued", True):
                self.stopped = set()
            else:
                self.stopped.discard(body.get("threadId"))
        self.event(msg)

    def send(self, msg):
        """Sends msg to the adapter under a fresh seq; returns that seq."""
        sock = self.sock
        if sock is None:
            raise ConnectionError("the debugger is not connected")
        with self.send_lock:
            self.seq += 1
            seq = self.seq
            data = json.dumps(dict(msg, seq=seq), default=repr).encode("utf-8")
            sock.sendall(b"Content-Length: %d\r\n\r\n" % len(data) + data)
        return seq

    def wait(self, seq, timeout=_ADAPTER_TIMEOUT):
        import time

        end = time.monotonic() + timeout
        with self.cond:
            while seq not in self.responses:
                left = end - time.monotonic()
                if left <= 0 or self.sock is None:
                    raise TimeoutError("the debug adapter did not answer within %g s" % timeout
                                       if left <= 0 else "the debug adapter went away")
                self.cond.wait(left)
            return self.responses.pop(seq)

    def forward(self, request):
        reply = self.wait(self.send(request))
        reply["request_seq"] = request.get("seq", 0)
        return reply

    def resume_all(self):
        tid = next(iter(self.stopped), None)
        if tid is None:
            return
        try:
            self.send({"type": "request", "command": "continue",
                       "arguments": {"threadId": tid}})
        except Exception as e:
            self.log("resume failed: %r" % (e,))

    # -- requests

    def handle(self, request):
        cmd = request.get("command")
        local = getattr(self, "req_" + str(cmd), None) if isinstance(cmd, str) else None
        if local is not None:
            return local(request)
        if not self.started:
            return _response(request, False, message="the debugger is not started (send "
                                                     "initialize first)")
        return self.forward(request)

    def req_initialize(self, request):
        if not self.started:
            try:
                self.start()
            except Exception as e:
                return _response(request, False, message="cannot start debugpy: %s: %s"
                                 % (type(e).__name__, e))
            self.started = True
        return self.forward(request)

    def req_attach(self, request):
        if not self.started:
            return _response(request, False, message="send initialize first")
        args = dict(request.get("arguments") or {})
        host, port = self.addr
        args["connect"] = {"host": host, "port": port}
        args.setdefault("justMyCode", True)
        rules = list(args.get("rules") or [])
        for f in sorted(self.own_files):
            rules.append({"path": f, "include": False})
        args["rules"] = rules
        req = dict(request, arguments=args)
        seq = self.send(req)
        if not self.initialized.wait(_ADAPTER_TIMEOUT):
            return _response(request, False, message="debugpy sent no 'initialized' event")
        self.wait(self.send({"type": "request", "command": "configurationDone"}))
        reply = self.wait(seq)
        reply["request_seq"] = request.get("seq", 0)
        self.attached = bool(reply.get("success"))
        return reply

    def req_configurationDone(self, request):
        return _response(request)  # sent by attach already, as ipykernel does

    def req_disconnect(self, request):
        if not self.started:
            return _response(request)
        try:
            reply = self.forward(request)
        except Exception as e:
            reply = _response(request, message=str(e))
        self.stop()
        return reply

    def req_debugInfo(self, request):
        return _response(request, body={
            "isStarted": self.started,
            "hashMethod": "Murmur2",
            "hashSeed": HASH_SEED,
            "tmpFilePrefix": CELL_DIR + os.sep,
            "tmpFileSuffix": ".py",
            "breakpoints": [{"source": k, "breakpoints": v} for k, v in self.breakpoints.items()],
            "stoppedThreads": sorted(self.stopped),
            "richRendering": True,
            "exceptionPaths": ["Python Exceptions"],
        })

    def req_dumpCell(self, request):
        code = (request.get("arguments") or {}).get("code")
        if not isinstance(code, str):
            return _response(request, False, message="dumpCell: 'code' must be a string")
        path = cell_file(code)
        self.remember(path, code)
        try:
            self.write_cell(path, code)
        except OSError as e:
            return _response(request, False, message="dumpCell: %s" % e)
        return _response(request, body={"sourcePath": path})

    @staticmethod
    def write_cell(path, code):
        os.makedirs(CELL_DIR, mode=0o700, exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(code)
        os.replace(tmp, path)

    def cell_code(self, path):
        """The code of a cell this kernel ran, by its file name, or None."""
        if path in self.cells:
            return self.cells[path]
        if is_cell_file(path) and path in _drv._CELL_NAMES:
            # a cell run before the debugger: the driver put it in linecache
            import linecache

            lines = linecache.getlines(path)
            if lines:
                return "".join(lines)
        return None

    def req_source(self, request):
        args = request.get("arguments") or {}
        path = (args.get("source") or {}).get("path")
        code = self.cell_code(path)
        if code is not None:
            return _response(request, body={"content": code})
        if isinstance(path, str) and os.path.isfile(path):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    return _response(request, body={"content": f.read()})
            except OSError:
                pass
        if self.started and args.get("sourceReference"):
            return self.forward(request)
        return _response(request, False, message="source unavailable")

    def req_setBreakpoints(self, request):
        if not self.started:
            return _response(request, False, message="send initialize first")
        args = request.get("arguments") or {}
        path = (args.get("source") or {}).get("path")
        if isinstance(path, str):
            self.breakpoints[path] = args.get("breakpoints", [])
            code = self.cell_code(path) if not os.path.exists(path) else None
            if code is not None:
                # a cell never dumped: debugpy binds breakpoints in files only
                try:
                    self.write_cell(path, code)
                except OSError as e:
                    self.log("setBreakpoints: writing %s: %s" % (path, e))
        return self.forward(request)

    def req_stackTrace(self, request):
        if not self.started:
            return _response(request, False, message="send initialize first")
        reply = self.forward(request)
        frames = (reply.get("body") or {}).get("stackFrames")
        if isinstance(frames, list):
            def path_of(fr):
                return ((fr.get("source") or {}).get("path")) or ""

            last_cell = max((i for i, fr in enumerate(frames) if is_cell_file(path_of(fr))),
                            default=None)
            if last_cell is not None:
                frames = frames[:last_cell + 1]
            frames = [fr for fr in frames
                      if os.path.abspath(path_of(fr) or "<>") not in self.own_files
                      and path_of(fr) != "<string>"]
            reply["body"]["stackFrames"] = frames
            reply["body"]["totalFrames"] = len(frames)
        return reply

    def req_variables(self, request):
        args = request.get("arguments") or {}
        if not self.stopped or not self.started:
            children = self.explorer.children(args.get("variablesReference"))
            if children is None and self.started:
                return self.filter_vars(self.forward(request))
            return _response(request, body={"variables": children or []})
        return self.filter_vars(self.forward(request))

    @staticmethod
    def filter_vars(reply):
        body = reply.get("body") or {}
        if isinstance(body.get("variables"), list):
            body["variables"] = [v for v in body["variables"]
                                 if accept_variable(str(v.get("name", "")))]
        return reply

    def req_inspectVariables(self, request):
        self.explorer = _Explorer()
        return _response(request, body={"variables": self.explorer.top(_drv._ns)})

    def req_richInspectVariables(self, request):
        args = request.get("arguments") or {}
        name = args.get("variableName")
        if not isinstance(name, str) or not name.isidentifier():
            ok = name in ("special variables", "function variables")
            return _response(request, ok, body={"data": {}, "metadata": {}})
        data, md = {}, {}
        frame = args.get("frameId")
        if self.stopped and frame is not None and self.started:
            self.rich_token += 1
            token = self.rich_token
            expr = "__kernelmgr_driver__._kdebug().rich_store(%d, %s)" % (token, name)
            reply = self.forward({"type": "request", "command": "evaluate",
                                  "arguments": {"expression": expr, "frameId": frame,
                                                "context": "clipboard"}})
            got = _rich.pop(token, None)
            if not reply.get("success") or got is None:
                return _response(request, False, body={"data": {}, "metadata": {}},
                                 message=reply.get("message") or "cannot evaluate %s" % name)
            data, md = got
        else:
            if name not in _drv._ns:
                return _response(request, False, body={"data": {}, "metadata": {}},
                                 message="name %r is not defined" % name)
            data, md = _drv._format(_drv._ns[name])
        return _response(request, body={"data": data,
                                        "metadata": {k: v for k, v in md.items() if k in data}})

    def req_copyToGlobals(self, request):
        if not self.started:
            return _response(request, False, message="send initialize first")
        args = request.get("arguments") or {}
        dst, src = args.get("dstVariableName"), args.get("srcVariableName")
        if not (isinstance(dst, str) and dst.isidentifier() and isinstance(src, str)):
            return _response(request, False, message="copyToGlobals: bad variable names")
        reply = self.forward({"type": "request", "command": "setExpression",
                              "arguments": {"expression": "globals()[%r]" % dst, "value": src,
                                            "frameId": args.get("srcFrameId")}})
        reply["command"] = "copyToGlobals"
        return reply

    def req_modules(self, request):
        args = request.get("arguments") or {}
        modules = list(sys.modules.values())
        start = args.get("startModule", 0) or 0
        count = args.get("moduleCount", 0) or len(modules)
        mods = []
        for i, module in enumerate(modules[start:start + count], start):
            origin = getattr(getattr(module, "__spec__", None), "origin", None)
            if isinstance(origin, str) and origin.endswith(".py"):
                mods.append({"id": i, "name": module.__name__, "path": origin})
        return _response(request, body={"modules": mods, "totalModules": len(modules)})


def _fix_main_thread(main_tid):
    """threading, imported first by this (debug) thread, took it for the
    main thread; debugpy must see the thread that runs cells as the main
    one (it ends its session when no non-daemon thread is left)."""
    mt = threading._main_thread
    if mt.ident == main_tid or not main_tid:
        return
    with threading._active_limbo_lock:
        if threading._active.get(mt.ident) is mt:
            del threading._active[mt.ident]
        mt._ident = main_tid
        threading._active[main_tid] = mt


def serve(driver, req_fd, evt_fd, pending=b""):
    """The debug thread's loop: one request at a time, answered in order."""
    global _drv, _dbg, CELL_DIR, HASH_SEED
    _drv = driver
    _fix_main_thread(driver._S.main_tid)
    CELL_DIR, HASH_SEED = driver._cell_dir(), driver._CELL_HASH_SEED
    me = threading.current_thread()
    me.pydev_do_not_trace = True
    me.is_pydev_daemon_thread = True
    _dbg = Debugger(evt_fd)
    buf = pending
    while True:
        while b"\n" not in buf:
            chunk = os.read(req_fd, 65536)
            if not chunk:
                return
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        try:
            msg = json.loads(line.decode("utf-8", "replace"))
            rid, request = msg["id"], msg["request"]
        except (ValueError, KeyError, TypeError):
            _dbg.log("malformed debug request ignored")
            continue
        try:
            reply = _dbg.handle(request if isinstance(request, dict) else {})
        except Exception as e:
            reply = _response(request if isinstance(request, dict) else {}, False,
                              message="%s: %s" % (type(e).__name__, e))
        _dbg.write({"id": rid, "reply": reply})
