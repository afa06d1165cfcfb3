"""Finding the daemon, starting it, and speaking JSON-RPC 2.0 to it (one
message per line on $KERNELMGR_HOME/kernelmgr.sock, docs/API.md).

The socket is found exactly as the CLI finds it (kmcfg_home in
kernelmgr/engine/config.c): $KERNELMGR_HOME, else
$XDG_STATE_HOME/kernelmgr, else ~/.local/state/kernelmgr, made absolute
against the current directory. When nothing answers there and autostart
is on, ``kernelmgr serve`` is started detached with that home (its output
appended to home/daemon.log), as the CLI's auto-start does: the binary is
the explicit path given, else $KERNELMGR_BIN, else ``kernelmgr`` on PATH.
"""
from __future__ import annotations

import errno
import itertools
import json
import os
import select
import shutil
import socket
import stat
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from .errors import DaemonUnavailableError, KernelmgrError, ProtocolError, from_rpc

API_VERSION = 1
MAX_LINE = 64 << 20          # the daemon's line limit (docs/API.md "Transport")
SUN_PATH_MAX = 107           # sizeof(sockaddr_un.sun_path) - 1 on Linux
START_TIMEOUT = 45.0         # as the CLI waits for a daemon it started

EventHandler = Callable[[Dict[str, Any]], None]


def resolve_home(home: Optional[str] = None) -> str:
    """The kernelmgr home the CLI would use (absolute)."""
    h = home or os.environ.get("KERNELMGR_HOME") or ""
    if not h:
        xdg = os.environ.get("XDG_STATE_HOME") or ""
        h = os.path.join(xdg, "kernelmgr") if xdg else os.path.join(
            os.environ.get("HOME") or "/tmp", ".local/state/kernelmgr")
    if not h.startswith("/"):
        h = os.path.join(os.getcwd(), h)
    return h


def socket_path(home: str) -> str:
    p = os.path.join(home, "kernelmgr.sock")
    if len(os.fsencode(p)) > SUN_PATH_MAX:
        raise DaemonUnavailableError(
            f"socket path {p} is longer than {SUN_PATH_MAX} bytes: use a shorter "
            "KERNELMGR_HOME", km_code=5)
    return p


def check_home(home: str) -> None:
    """Refuses a home that is not the user's alone, as the CLI does (a
    socket there may be anyone's daemon); an absent home is fine."""
    try:
        st = os.stat(home)
    except FileNotFoundError:
        return
    except OSError as e:
        raise KernelmgrError(f"the kernelmgr home: {home}: {e.strerror}", km_code=2) from e
    why = None
    if not stat.S_ISDIR(st.st_mode):
        why = "is not a directory"
    elif st.st_uid != os.geteuid():
        why = "is owned by another user"
    elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = "is writable by group or others"
    if why:
        raise KernelmgrError(
            f"the kernelmgr home is trusted state, and {home} {why} (owner uid {st.st_uid}, "
            f"mode {stat.S_IMODE(st.st_mode):04o}): it must be a directory owned by uid "
            f"{os.geteuid()} and not writable by group or others", km_code=2)


def find_binary(kernelmgr: Optional[str] = None) -> str:
    """The kernelmgr binary to auto-start: the explicit path, else
    $KERNELMGR_BIN, else ``kernelmgr`` on PATH."""
    for cand, what in ((kernelmgr, "the kernelmgr= argument"),
                       (os.environ.get("KERNELMGR_BIN"), "$KERNELMGR_BIN")):
        if cand:
            if os.path.isfile(cand) and os.access(cand, os.X_OK):
                return os.path.abspath(cand)
            raise DaemonUnavailableError(
                f"cannot start the daemon: {cand} ({what}) is not an executable file",
                km_code=5)
    found = shutil.which("kernelmgr")
    if not found:
        raise DaemonUnavailableError(
            "no daemon is running and none can be started: kernelmgr is not on PATH "
            "(give Session(kernelmgr=PATH) or set KERNELMGR_BIN)", km_code=5)
    return found


def spawn_daemon(binary: str, home: str, config: Optional[str] = None) -> None:
    """Starts ``kernelmgr serve`` detached (its own session, reparented to
    init: a shell in between exits at once), output to home/daemon.log."""
    os.makedirs(home, mode=0o700, exist_ok=True)
    log = os.open(os.path.join(home, "daemon.log"),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        args = ["serve"] + (["--config", os.path.abspath(config)] if config else [])
        env = dict(os.environ, KERNELMGR_HOME=home)
        subprocess.run(["/bin/sh", "-c", 'exec "$0" "$@" </dev/null &', binary, *args],
                       stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env,
                       start_new_session=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise DaemonUnavailableError(f"cannot start the daemon {binary}: {e}", km_code=5) from e
    finally:
        os.close(log)


def try_connect(path: str) -> Optional[socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return s
    except OSError as e:
        s.close()
        if e.errno in (errno.ENOENT, errno.ECONNREFUSED, errno.ENOTSOCK):
            return None
        raise DaemonUnavailableError(f"cannot connect to {path}: {e.strerror}",
                                     km_code=5) from e


def encode(msg_id: int, method: str, params: Dict[str, Any]) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params},
                       ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def decode(line: bytes) -> Dict[str, Any]:
    try:
        msg = json.loads(line)
    except ValueError as e:
        raise ProtocolError(f"the daemon sent a line that is not JSON: {e}") from e
    if not isinstance(msg, dict):
        raise ProtocolError("the daemon sent a JSON value that is not an object")
    return msg


class Outcome:
    """Reads the messages of one request: events to on_event, then its
    response (result or raised error)."""

    def __init__(self, msg_id: int, on_event: Optional[EventHandler]) -> None:
        self.msg_id = msg_id
        self.on_event = on_event
        self.pending: Optional[Dict[str, Any]] = None

    def feed(self, msg: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """None while the response has not come; else the result."""
        if "method" in msg:
            p = msg.get("params")
            if (msg.get("method") == "event" and isinstance(p, dict) and self.on_event
                    and p.get("request_id") in (None, self.msg_id)):
                self.on_event(p)
            return None
        if msg.get("id") not in (self.msg_id, None):
            return None
        if "error" in msg:
            raise from_rpc(msg["error"])
        res = msg.get("result")
        if not isinstance(res, dict):
            raise ProtocolError("the daemon sent a response without a result object")
        return res


_ids = itertools.count(1)


def hello() -> Dict[str, Any]:
    """initialize's params: pins the API version this client speaks."""
    from . import __version__
    return {"api_version": API_VERSION, "client": f"kernelmgr-python/{__version__}"}


class Connection:
    """One socket to the daemon; one request at a time (the API answers a
    connection's requests in order)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rfile = sock.makefile("rb")
        self.broken = False

    def call(self, method: str, params: Dict[str, Any],
             on_event: Optional[EventHandler] = None) -> Dict[str, Any]:
        msg_id = next(_ids)
        out = Outcome(msg_id, on_event)
        try:
            self.sock.sendall(encode(msg_id, method, params))
        except OSError as e:
            self.broken = True
            raise DaemonUnavailableError(f"cannot send to the daemon: {e}", km_code=5) from e
        try:
            while True:
                try:
                    line = self.rfile.readline(MAX_LINE + 1)
                except OSError as e:
                    raise DaemonUnavailableError(f"lost the daemon: {e}", km_code=5) from e
                if not line or not line.endswith(b"\n"):
                    raise DaemonUnavailableError(
                        "the daemon closed the connection without a response (did it stop? "
                        "see daemon.log in the kernelmgr home)", km_code=5)
                res = out.feed(decode(line))
                if res is not None:
                    return res
        except KernelmgrError as e:
            if not isinstance(e, (DaemonUnavailableError, ProtocolError)):
                raise  # the daemon's answer: the connection is fine
            self.broken = True
            raise
        except BaseException:
            # a callback raised, or Ctrl-C: the rest of the answer is unread
            self.broken = True
            raise

    def idle_ok(self) -> bool:
        """Whether an idle pooled connection may carry a request: nothing
        may be readable on it (EOF: the daemon stopped or restarted)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return False
        return not readable

    def close(self) -> None:
        try:
            self.rfile.close()
        finally:
            self.sock.close()


class Client:
    """The connections of one Session: a pool, so that interrupt() or a
    file call from another thread gets its own connection while run()
    streams on one."""

    def __init__(self, home: Optional[str] = None, kernelmgr: Optional[str] = None,
                 autostart: bool = True, config: Optional[str] = None) -> None:
        self.home = resolve_home(home)
        self.path = socket_path(self.home)
        self.kernelmgr = kernelmgr
        self.autostart = autostart
        self.config = config
        self._idle: List[Connection] = []
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self.closed = False

    def _open(self) -> Connection:
        check_home(self.home)
        s = try_connect(self.path)
        if s is None and self.autostart:
            with self._start_lock:
                s = try_connect(self.path)
                if s is None:
                    spawn_daemon(find_binary(self.kernelmgr), self.home, self.config)
                    deadline = time.monotonic() + START_TIMEOUT
                    while s is None and time.monotonic() < deadline:
                        time.sleep(0.05)
                        s = try_connect(self.path)
                    if s is None:
                        raise DaemonUnavailableError(
                            f"the daemon did not come up within {START_TIMEOUT:.0f} s (see "
                            f"{self.home}/daemon.log)", km_code=5)
        if s is None:
            raise DaemonUnavailableError(f"no daemon is running for {self.home}", km_code=5)
        conn = Connection(s)
        try:
            conn.call("initialize", hello())
        except BaseException:
            conn.close()
            raise
        return conn

    def call(self, method: str, params: Dict[str, Any],
             on_event: Optional[EventHandler] = None) -> Dict[str, Any]:
        conn = None
        with self._lock:
            while self._idle and conn is None:
                conn = self._idle.pop()
                if not conn.idle_ok():
                    conn.close()
                    conn = None
        if conn is None:
            conn = self._open()
        try:
            return conn.call(method, params, on_event)
        finally:
            if conn.broken:
                conn.close()
            else:
                with self._lock:
                    if self.closed:
                        conn.close()
                    else:
                        self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()
