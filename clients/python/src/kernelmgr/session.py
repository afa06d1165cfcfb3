"""The synchronous client: Session and its Files."""
from __future__ import annotations

from types import TracebackType
from typing import IO, Any, Dict, List, Optional, Type, Union

from . import _common as C
from ._transport import Client
from .errors import DaemonUnavailableError, KernelmgrError, SessionClosedError
from .models import Execution, FileInfo


class Files:
    """The session's workspace (``session.files``). Paths are relative to
    the workspace; ``..``, absolute paths and symbolic links are refused by
    the daemon. Any size: the daemon's per-call limit (1 MiB per
    files.read) is handled here."""

    def __init__(self, session: "Session") -> None:
        self._s = session

    def read(self, path: str) -> bytes:
        """The file's bytes."""
        out = bytearray()
        self.read_to(path, out)
        return bytes(out)

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def read_to(self, path: str, sink: Union[bytearray, IO[bytes]]) -> int:
        """Streams the file into sink (a bytearray or a binary file);
        returns the number of bytes."""
        off, size = 0, -1
        while True:
            res = self._s._call("files.read", C.read_params(self._s.name, path, off))
            raw, last, now = C.read_chunk(res)
            if size < 0:  # the file as it was when the read began (a cell may append)
                size = now
            last = last or off + len(raw) >= size
            if isinstance(sink, bytearray):
                sink += raw
            else:
                sink.write(raw)
            off += len(raw)
            if last:
                return off

    def write(self, path: str, data: Union[C.Data, IO[bytes]]) -> int:
        """Writes (replaces) path with data: bytes, str (UTF-8) or a binary
        file object read to its end. Missing directories are created.
        Returns the size written."""
        if not isinstance(data, (bytes, bytearray, memoryview, str)):
            return self._write_stream(path, data)
        raw = C.as_bytes(data)
        done = 0
        for req in C.write_chunks(self._s.name, path, raw):
            try:
                self._s._call("files.write", req)
            except KernelmgrError as e:
                if done:
                    e.message += C.partial_note(path, done, len(raw))
                    e.args = (e.message,)
                raise
            done = min(len(raw), done + C.WRITE_CHUNK)
        return len(raw)

    def _write_stream(self, path: str, f: IO[bytes]) -> int:
        done, wrote = 0, False
        while True:
            chunk = bytes(f.read(C.WRITE_CHUNK) or b"")
            if chunk or not wrote:
                req = next(C.write_chunks(self._s.name, path, chunk))
                req["append"] = wrote
                try:
                    self._s._call("files.write", req)
                except KernelmgrError as e:
                    if done:
                        e.message += f" ({path} holds the first {done} bytes)"
                        e.args = (e.message,)
                    raise
                wrote = True
            done += len(chunk)
            if not chunk:
                return done

    def list(self, path: Optional[str] = None) -> List[FileInfo]:
        """The workspace's entries (below path when given)."""
        p: Dict[str, Any] = {"session": self._s.name}
        if path is not None:
            p["path"] = path
        return C.list_result(self._s._call("files.list", p))

    def remove(self, path: str) -> None:
        """Removes a file, a symbolic link (not what it points to) or an
        empty directory."""
        self._s._call("files.remove", {"session": self._s.name, "path": path})

    def exists(self, path: str) -> bool:
        parent, _, base = path.rstrip("/").rpartition("/")
        want = path.strip("/")
        return any(f.path == want for f in self.list(parent or None)) if base else True


class Session:
    """A kernelmgr session: persistent Python and Bash kernels sharing one
    workspace, run by the daemon (started when none runs).

    ``Session(name=None, **options)``: ``name`` is the session's name (a
    fresh ``py-...`` one when None; an existing session of that name is
    joined). Client keywords: ``lang`` and ``timeout`` (defaults for
    run()), ``home`` (else $KERNELMGR_HOME ...), ``kernelmgr`` (the binary
    to auto-start), ``autostart`` (default True), ``config`` (the daemon's
    config file when it is started). Every other keyword is a session
    option passed to the daemon as given — ``memory="512M"``, ``cpus=1``,
    ``cpu_time=10``, ``network="on"``, ``sandbox="strict"``,
    ``python="/usr/bin/python3"``, ``workspace="/abs/dir"``,
    ``env={"K": "v"}`` — and the daemon's refusal raises
    InvalidParamsError naming the field.
    """

    def __init__(self, name: Optional[str] = None, **options: Any) -> None:
        kw = {k: options.pop(k) for k in C.CLIENT_KEYS if k in options}
        self.name: str = C.session_name(name)
        self.lang: Optional[str] = kw.get("lang")
        self.timeout: Optional[float] = kw.get("timeout")
        self._client = Client(kw.get("home"), kw.get("kernelmgr"), kw.get("autostart", True),
                              kw.get("config"))
        self._closed = False
        self.files = Files(self)
        info = self._client.call("session.create", C.create_params(self.name, options))
        self.workspace: Optional[str] = info.get("workspace")
        self.created: bool = bool(info.get("created"))
        self.warnings: List[str] = [str(w) for w in info.get("warnings") or []]

    @property
    def home(self) -> str:
        return self._client.home

    def _call(self, method: str, params: Dict[str, Any], on_event: Any = None) -> Dict[str, Any]:
        if self._closed:
            raise SessionClosedError(f"session \"{self.name}\" was closed by this client", km_code=3)
        return self._client.call(method, params, on_event)

    def run(self, code: str, lang: Optional[str] = None, timeout: Optional[float] = None,
            on_stdout: Optional[C.TextCallback] = None,
            on_stderr: Optional[C.TextCallback] = None,
            on_result: Optional[C.ResultCallback] = None,
            continue_on_error: bool = False) -> Execution:
        """Runs code and returns its Execution (a failing block is an
        Execution with ``error``, not an exception). ``lang``: ``python``,
        ``bash``, a configured language, or ``auto`` (Markdown fences, a
        shebang, else a heuristic: the daemon's default); ``timeout``: per
        block, in seconds (the daemon's default 60). The callbacks are
        called in this thread as output arrives: on_stdout/on_stderr with
        each chunk of text, on_result with each Result of a block when the
        block ends. Ctrl-C (KeyboardInterrupt) while it waits interrupts
        the cell and is re-raised."""
        ev = C.ExecEvents(on_stdout, on_stderr, on_result)

        def on_event(e: Dict[str, Any]) -> None:
            ev(e)
            for fn, arg in ev.take():
                fn(arg)

        params = C.exec_params(self.name, code, lang or self.lang,
                               timeout if timeout is not None else self.timeout,
                               continue_on_error)
        try:
            reply = self._call("exec", params, on_event)
        except KeyboardInterrupt:
            try:
                self.interrupt()
            finally:
                raise
        return ev.execution(reply)

    # E2B's name for it
    run_code = run

    def interrupt(self) -> None:
        """Stops what runs in the session (state kept); safe to call from
        another thread while run() streams: the cell ends with
        KeyboardInterrupt."""
        self._call("interrupt", {"session": self.name})

    def restart(self) -> None:
        """Fresh kernels: every variable is lost, the workspace's files are
        kept. The next Execution's ``kernel`` says the state was not
        preserved."""
        self._call("restart", {"session": self.name})

    def export(self, kernel_name: Optional[str] = None) -> Dict[str, Any]:
        """The session's history as an nbformat 4 notebook (a dict: write
        it with json.dump to a .ipynb file)."""
        p: Dict[str, Any] = {"session": self.name}
        if kernel_name is not None:
            p["kernel_name"] = kernel_name
        nb = self._call("export", p).get("notebook")
        return nb if isinstance(nb, dict) else {}

    @staticmethod
    def list(home: Optional[str] = None) -> List[Dict[str, Any]]:
        """The daemon's sessions (the API's sessions.list entries: name,
        workspace, busy, kernels, limits ...); [] when no daemon runs."""
        client = Client(home, autostart=False)
        try:
            res = client.call("sessions.list", {})
        except DaemonUnavailableError:
            return []
        finally:
            client.close()
        return [x for x in res.get("sessions") or [] if isinstance(x, dict)]

    def close(self, keep: bool = False) -> None:
        """Stops the kernels and removes the session with its workspace
        (``keep=True``: the session directory and workspace stay). Closing
        twice is harmless."""
        if self._closed:
            return
        try:
            params: Dict[str, Any] = {"session": self.name}
            if keep:
                params["keep"] = True
            self._client.call("close", params)
        finally:
            self._closed = True
            self._client.close()

    # E2B's name for it
    kill = close

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(name={self.name!r}, home={self.home!r})"
