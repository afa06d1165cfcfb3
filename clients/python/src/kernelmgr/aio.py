"""The asyncio client: AsyncSession (the same API as Session, awaited),
over asyncio.open_unix_connection."""
from __future__ import annotations

import asyncio
import inspect
import select
import time
from types import TracebackType
from typing import IO, Any, Dict, List, Optional, Type, Union

from . import _common as C
from . import _transport as T
from .errors import DaemonUnavailableError, KernelmgrError, ProtocolError, SessionClosedError
from .models import Execution, FileInfo


class _AsyncConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.broken = False

    async def call(self, method: str, params: Dict[str, Any],
                   on_event: Optional[T.EventHandler] = None) -> Dict[str, Any]:
        msg_id = next(T._ids)
        out = T.Outcome(msg_id, on_event)
        try:
            self.writer.write(T.encode(msg_id, method, params))
            await self.writer.drain()
            while True:
                try:
                    line = await self.reader.readline()
                except (OSError, ValueError) as e:  # ValueError: a line over the limit
                    raise DaemonUnavailableError(f"lost the daemon: {e}", km_code=5) from e
                if not line.endswith(b"\n"):
                    raise DaemonUnavailableError(
                        "the daemon closed the connection without a response (did it stop? "
                        "see daemon.log in the kernelmgr home)", km_code=5)
                res = out.feed(T.decode(line))
                if res is not None:
                    return res
                if isinstance(on_event, _Dispatch):
                    await on_event.flush()
        except KernelmgrError as e:
            if isinstance(e, (DaemonUnavailableError, ProtocolError)):
                self.broken = True
            raise
        except OSError as e:
            self.broken = True
            raise DaemonUnavailableError(f"cannot talk to the daemon: {e}", km_code=5) from e
        except BaseException:
            self.broken = True  # cancelled, or a callback raised: the answer is unread
            raise

    def idle_ok(self) -> bool:
        """As Connection.idle_ok: nothing may be readable on an idle
        connection (EOF: the daemon stopped or restarted)."""
        if self.reader.at_eof() or self.writer.is_closing():
            return False
        sock = self.writer.get_extra_info("socket")
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError, AttributeError):
            return False
        return not readable

    def close(self) -> None:
        self.writer.close()


class _Dispatch:
    """exec events to (sync or async) callbacks, awaited in order."""

    def __init__(self, ev: C.ExecEvents) -> None:
        self.ev = ev

    def __call__(self, e: Dict[str, Any]) -> None:
        self.ev(e)

    async def flush(self) -> None:
        for fn, arg in self.ev.take():
            r = fn(arg)
            if inspect.isawaitable(r):
                await r


class _AsyncClient:
    def __init__(self, home: Optional[str], kernelmgr: Optional[str], autostart: bool,
                 config: Optional[str]) -> None:
        self.home = T.resolve_home(home)
        self.path = T.socket_path(self.home)
        self.kernelmgr = kernelmgr
        self.autostart = autostart
        self.config = config
        self._idle: List[_AsyncConnection] = []
        self._start_lock = asyncio.Lock()
        self.closed = False

    async def _connect(self) -> Optional[_AsyncConnection]:
        try:
            r, w = await asyncio.open_unix_connection(self.path, limit=T.MAX_LINE + 1)
        except (FileNotFoundError, ConnectionRefusedError):
            return None
        except OSError as e:
            raise DaemonUnavailableError(f"cannot connect to {self.path}: {e}", km_code=5) from e
        return _AsyncConnection(r, w)

    async def _open(self) -> _AsyncConnection:
        T.check_home(self.home)
        c = await self._connect()
        if c is None and self.autostart:
            async with self._start_lock:
                c = await self._connect()
                if c is None:
                    T.spawn_daemon(T.find_binary(self.kernelmgr), self.home, self.config)
                    deadline = time.monotonic() + T.START_TIMEOUT
                    while c is None and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                        c = await self._connect()
                    if c is None:
                        raise DaemonUnavailableError(
                            f"the daemon did not come up within {T.START_TIMEOUT:.0f} s (see "
                            f"{self.home}/daemon.log)", km_code=5)
        if c is None:
            raise DaemonUnavailableError(f"no daemon is running for {self.home}", km_code=5)
        try:
            await c.call("initialize", T.hello())
        except BaseException:
            c.close()
            raise
        return c

    async def call(self, method: str, params: Dict[str, Any],
                   on_event: Optional[T.EventHandler] = None) -> Dict[str, Any]:
        conn = None
        while self._idle and conn is None:
            conn = self._idle.pop()
            if not conn.idle_ok():
                conn.close()  # the daemon stopped or restarted meanwhile
                conn = None
        if conn is None:
            conn = await self._open()
        try:
            return await conn.call(method, params, on_event)
        finally:
            if conn.broken or self.closed:
                conn.close()
            else:
                self._idle.append(conn)

    def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()


class AsyncFiles:
    """``session.files`` of an AsyncSession: as Files, awaited."""

    def __init__(self, session: "AsyncSession") -> None:
        self._s = session

    async def read(self, path: str) -> bytes:
        out = bytearray()
        await self.read_to(path, out)
        return bytes(out)

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def read_to(self, path: str, sink: Union[bytearray, IO[bytes]]) -> int:
        off, size = 0, -1
        while True:
            res = await self._s._call("files.read", C.read_params(self._s.name, path, off))
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

    async def write(self, path: str, data: C.Data) -> int:
        raw = C.as_bytes(data)
        done = 0
        for req in C.write_chunks(self._s.name, path, raw):
            try:
                await self._s._call("files.write", req)
            except KernelmgrError as e:
                if done:
                    e.message += C.partial_note(path, done, len(raw))
                    e.args = (e.message,)
                raise
            done = min(len(raw), done + C.WRITE_CHUNK)
        return len(raw)

    async def list(self, path: Optional[str] = None) -> List[FileInfo]:
        p: Dict[str, Any] = {"session": self._s.name}
        if path is not None:
            p["path"] = path
        return C.list_result(await self._s._call("files.list", p))

    async def remove(self, path: str) -> None:
        await self._s._call("files.remove", {"session": self._s.name, "path": path})


class AsyncSession:
    """Session over asyncio. ``async with AsyncSession(name, **options) as
    s`` (or ``s = await AsyncSession.create(...)``), then ``await
    s.run(...)``, ``await s.files.read(...)`` ... Callbacks may be plain
    functions or coroutine functions (awaited in order). Options and
    keywords as Session's."""

    def __init__(self, name: Optional[str] = None, **options: Any) -> None:
        kw = {k: options.pop(k) for k in C.CLIENT_KEYS if k in options}
        self.name: str = C.session_name(name)
        self.lang: Optional[str] = kw.get("lang")
        self.timeout: Optional[float] = kw.get("timeout")
        self._kw = kw
        self._options = options
        self._client: Optional[_AsyncClient] = None
        self._closed = False
        self.files = AsyncFiles(self)
        self.workspace: Optional[str] = None
        self.created = False
        self.warnings: List[str] = []

    @classmethod
    async def create(cls, name: Optional[str] = None, **options: Any) -> "AsyncSession":
        s = cls(name, **options)
        await s.start()
        return s

    async def start(self) -> "AsyncSession":
        """Connects (starting the daemon when needed) and creates the
        session; run() and the others call it when it was not."""
        if self._client is None:
            kw = self._kw
            client = _AsyncClient(kw.get("home"), kw.get("kernelmgr"), kw.get("autostart", True),
                                  kw.get("config"))
            info = await client.call("session.create", C.create_params(self.name, self._options))
            self._client = client
            self.workspace = info.get("workspace")
            self.created = bool(info.get("created"))
            self.warnings = [str(w) for w in info.get("warnings") or []]
        return self

    @property
    def home(self) -> str:
        return T.resolve_home(self._kw.get("home"))

    async def _call(self, method: str, params: Dict[str, Any],
                    on_event: Any = None) -> Dict[str, Any]:
        if self._closed:
            raise SessionClosedError(f"session \"{self.name}\" was closed by this client", km_code=3)
        await self.start()
        assert self._client is not None
        return await self._client.call(method, params, on_event)

    async def run(self, code: str, lang: Optional[str] = None, timeout: Optional[float] = None,
                  on_stdout: Optional[C.TextCallback] = None,
                  on_stderr: Optional[C.TextCallback] = None,
                  on_result: Optional[C.ResultCallback] = None,
                  continue_on_error: bool = False) -> Execution:
        """As Session.run. Cancelling the task interrupts the cell."""
        ev = C.ExecEvents(on_stdout, on_stderr, on_result)
        d = _Dispatch(ev)
        params = C.exec_params(self.name, code, lang or self.lang,
                               timeout if timeout is not None else self.timeout,
                               continue_on_error)
        try:
            reply = await self._call("exec", params, d)
        except asyncio.CancelledError:
            await asyncio.shield(self.interrupt())
            raise
        await d.flush()
        return ev.execution(reply)

    run_code = run

    async def interrupt(self) -> None:
        await self._call("interrupt", {"session": self.name})

    async def restart(self) -> None:
        await self._call("restart", {"session": self.name})

    async def export(self, kernel_name: Optional[str] = None) -> Dict[str, Any]:
        """As Session.export."""
        p: Dict[str, Any] = {"session": self.name}
        if kernel_name is not None:
            p["kernel_name"] = kernel_name
        nb = (await self._call("export", p)).get("notebook")
        return nb if isinstance(nb, dict) else {}

    @staticmethod
    async def list(home: Optional[str] = None) -> List[Dict[str, Any]]:
        """As Session.list."""
        client = _AsyncClient(home, None, False, None)
        try:
            res = await client.call("sessions.list", {})
        except DaemonUnavailableError:
            return []
        finally:
            client.close()
        return [x for x in res.get("sessions") or [] if isinstance(x, dict)]

    async def close(self, keep: bool = False) -> None:
        if self._closed:
            return
        try:
            if self._client is not None:
                params: Dict[str, Any] = {"session": self.name}
                if keep:
                    params["keep"] = True
                await self._client.call("close", params)
        finally:
            self._closed = True
            if self._client is not None:
                self._client.close()

    kill = close

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> "AsyncSession":
        return await self.start()

    async def __aexit__(self, et: Optional[Type[BaseException]], ev: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.close()
