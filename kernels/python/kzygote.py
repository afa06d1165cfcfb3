"""kernelmgr Python zygote: forks the Python workers of one session sandbox.

The session's init (sandbox/sbx_zygote.c) starts this file as it starts a
worker (the same interpreter, boot and sandbox; fd 3 a SOCK_SEQPACKET
socket to init, fds 0-2 /dev/null, only the start-up part of the worker's
environment). It loads the driver (driver.py beside this file) without
running it, calls the driver's `preload(for_zygote=True)` when it has one
(with the `ipython` option on, KERNELMGR_IPYTHON=1 in its environment:
IPython, the shell's classes and the shell itself, kipython.py), imports the modules named in
KERNELMGR_ZYGOTE_PRELOAD (comma-separated, e.g. "numpy"), freezes the heap for the garbage
collector, says ready and waits. It never runs code of the session's: the
workspace is off sys.path while it imports, and it only forks. It makes
itself non-dumpable first, so the session's code (same uid) cannot reach
into it through /proc (memory, fds, environment); it can only signal it,
after which init starts a fresh one.

For each request ('F': the worker's environment and its fds) it forks a
child that forks the worker and exits, so that the worker's parent is init
(PID 1), and answers with the worker's pid. The worker takes its fds as
0..n-1 and closes every other, its own session (setsid), the request's
environment as os.environ, fresh seeds for every PRNG it has loaded
(random, numpy's global one; os.urandom needs none), and runs the driver's
main() as a cold start would, after the driver's `after_zygote_fork()` when
it has one. The hash secret (PYTHONHASHSEED, str/bytes hashes) is fixed at
interpreter start and cannot change: the workers of one zygote share it,
as they share its memory layout, until the zygote is replaced.

Answers 'Z' instead of forking once the interpreter, the driver, kipython.py
or this file changed on disk since it started (init then starts a fresh zygote). Messages
are sbx_sess_hdr (sandbox/sbx_internal.h) followed by NUL-terminated
strings; anything malformed ends the zygote (init then starts cold).
"""

import sys

_saved_path = list(sys.path)
sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import os  # noqa: E402

try:
    _cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if os.path.abspath(p) != _cwd]
except OSError:
    _cwd = None
import _socket  # noqa: E402
import _struct  # noqa: E402
import gc  # noqa: E402

_MAGIC = 0x6B6D7362
_HDR = _struct.Struct("=IIIiIIIII")  # magic type id a argc envc roc zargc zmax
_MAX_MSG = 352 << 10
_MAX_ENVC = 512
_MAX_FDS = 16
_SOCK_FD = 3
_HERE = os.path.dirname(os.path.abspath(__file__))
_DRIVER = os.path.join(_HERE, "driver.py")
_KIPYTHON = os.path.join(_HERE, "kipython.py")  # the driver's preload() may load it


def _stamp(path):
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return None


def _stamps():
    """What this zygote was made from, as it is on disk now."""
    files = (sys.executable, os.path.realpath(sys.executable), _DRIVER, _KIPYTHON,
             os.path.abspath(__file__))
    return tuple(_stamp(f) for f in files)


def _load_driver():
    """The driver as a module (not __main__: its main() is the workers')."""
    import _frozen_importlib_external as e

    p = sys.pycache_prefix, sys.dont_write_bytecode
    sys.pycache_prefix, sys.dont_write_bytecode = None, True
    try:
        loader = e.SourceFileLoader("kernelmgr_driver", _DRIVER)
        code = loader.get_code("kernelmgr_driver")
    finally:
        sys.pycache_prefix, sys.dont_write_bytecode = p
    mod = type(sys)("kernelmgr_driver")
    mod.__file__, mod.__loader__ = _DRIVER, loader
    sys.modules["kernelmgr_driver"] = mod
    exec(code, mod.__dict__)
    return mod


def _send(sock, kind, a=0, text=b""):
    sock.sendmsg([_HDR.pack(_MAGIC, ord(kind), 0, a, 0, 0, 0, 0, 0) + text])


def _recv(sock):
    """(header fields, payload, fds); None at end-of-file."""
    space = _socket.CMSG_SPACE(_MAX_FDS * 4)
    data, anc, flags, _ = sock.recvmsg(_HDR.size + _MAX_MSG, space)
    fds = []
    for level, kind, blob in anc:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            n = len(blob) - len(blob) % 4
            fds.extend(int.from_bytes(blob[i:i + 4], sys.byteorder) for i in range(0, n, 4))
    if not data and not fds:
        return None
    bad = flags & (_socket.MSG_TRUNC | _socket.MSG_CTRUNC) or len(data) < _HDR.size
    hdr = None if bad else _HDR.unpack_from(data)
    if hdr is None or hdr[0] != _MAGIC or len(fds) > _MAX_FDS:
        for f in fds:
            os.close(f)
        raise ValueError("malformed request")
    return hdr, data[_HDR.size:], fds


def _reseed():
    """Fresh seeds for the PRNGs this process has: none is shared with
    another worker of the zygote."""
    r = sys.modules.get("random")
    if r is not None:
        r.seed()
    npr = sys.modules.get("numpy.random")
    if npr is not None:
        try:
            npr.seed()
        except Exception:
            pass
    ssl = sys.modules.get("ssl")
    if ssl is not None:
        try:
            ssl.RAND_add(os.urandom(32), 32.0)
        except Exception:
            pass


def _retitle(ctypes):
    """The worker's command line says driver.py, as a cold start's does
    (ps, /proc/PID/cmdline), not this file: the last argument is rewritten
    in place (it is never longer)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            st = f.read()
        fields = st[st.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end
        old = ctypes.string_at(start, end - start)
        mine = os.path.abspath(__file__).encode() + b"\0"
        new = _DRIVER.encode() + b"\0"
        i = old.rfind(mine)
        if i >= 0 and i + len(mine) == len(old) and len(new) <= len(mine):
            ctypes.memmove(start + i, new + b"\0" * (len(mine) - len(new)), len(mine))
    except Exception:
        pass


def _dumpable(on):
    """prctl(PR_SET_DUMPABLE): the zygote is not, so the session's code
    (same uid, no capabilities) can neither read nor write its memory, fds
    or environment through /proc, nor attach to it; its workers are."""
    try:
        _ctypes.CDLL(None, use_errno=True).prctl(4, int(on), 0, 0, 0)
    except Exception:
        pass


def _worker(driver, env, fds, serial):
    """In the forked worker: becomes what a cold start is, then runs the
    driver's main(); returns when it does."""
    os.setsid()
    if _ctypes is not None:
        _dumpable(1)  # as a cold start: its own code may read its /proc files
        _retitle(_ctypes)
    tmp = [os.dup(f) for f in fds]  # above every target number
    for i, f in enumerate(tmp):
        os.dup2(f, i, inheritable=True)
    os.closerange(len(tmp), 1 << 20)
    os.environ.clear()
    for e in env:
        k, _, v = e.partition("=")
        if k:
            os.environ[k] = v
    sys.path[:] = _saved_path
    _reseed()
    driver._REQ_FD = int(os.environ.pop("KERNELMGR_REQ_FD", "3"))
    driver._EVT_FD = int(os.environ.pop("KERNELMGR_EVT_FD", "4"))
    driver._DBG_REQ_FD = int(os.environ.pop("KERNELMGR_DBG_REQ_FD", "-1"))
    driver._DBG_EVT_FD = int(os.environ.pop("KERNELMGR_DBG_EVT_FD", "-1"))
    driver._requests = driver._Requests(driver._REQ_FD)
    # what the zygote had loaded (the driver's preload(): IPython with the
    # `ipython` option on), as the worker starts
    driver._ZYGOTE = {"zygote_pid": _ZPID, "fork": serial, "ipython": "IPython" in sys.modules}
    hook = getattr(driver, "after_zygote_fork", None)
    if hook is not None:
        hook()
    driver.main()


_ZPID = os.getpid()
_in_worker = [False]
_ctypes = None


def _fork(sock, driver, env, fds, serial):
    """Forks the worker through a child that exits at once, so that its
    parent is init; returns the worker's pid (-1 on failure). In the worker
    it returns only by SystemExit, which unwinds to the top: the interpreter
    then ends as a cold start's does (atexit, flushes)."""
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                _in_worker[0] = True
                os.close(w)
                sock.close()
                _worker(driver, env, fds, serial)
                raise SystemExit(0)
            os.write(w, pid.to_bytes(4, sys.byteorder, signed=True))
        finally:
            if not _in_worker[0]:
                os._exit(0)
    os.close(w)
    os.waitpid(mid, 0)
    got = os.read(r, 4)
    os.close(r)
    return int.from_bytes(got, sys.byteorder, signed=True) if len(got) == 4 else -1


def main():
    global _ctypes
    try:
        import ctypes as _ctypes
    except Exception:  # no libffi: the workers' command line names this file
        _ctypes = None
    if _ctypes is not None:
        _dumpable(0)
    sock = _socket.socket(fileno=_SOCK_FD)
    driver = _load_driver()
    pre = getattr(driver, "preload", None)
    if pre is not None:
        pre(for_zygote=True)
    for name in os.environ.get("KERNELMGR_ZYGOTE_PRELOAD", "").split(","):
        name = name.strip()
        if name:
            try:
                __import__(name)
            except Exception:
                pass  # the workers import it themselves, and see why
    compile("x = 1\n", "<zygote>", "exec")
    gc.collect()
    gc.freeze()
    made = _stamps()
    _send(sock, "R", _ZPID)
    serial = 0
    while True:
        msg = _recv(sock)
        if msg is None:
            return
        hdr, payload, fds = msg
        kind, envc = hdr[1], hdr[5]
        strs = payload.split(b"\0")
        if kind != ord("F") or envc > _MAX_ENVC or len(strs) != envc + 1 or strs[-1]:
            for f in fds:
                os.close(f)
            raise ValueError("malformed request")
        if _stamps() != made:
            for f in fds:
                os.close(f)
            _send(sock, "Z")
            continue
        env = [s.decode("utf-8", "surrogateescape") for s in strs[:-1]]
        serial += 1
        pid = _fork(sock, driver, env, fds, serial)
        for f in fds:
            os.close(f)
        if pid > 1:
            _send(sock, "O", pid)
        else:
            _send(sock, "E", 0, b"fork failed\0")


if __name__ == "__main__":
    main()
