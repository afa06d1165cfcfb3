"""What the sync and the async session share: the requests they build and
how an exec's events become callbacks and an Execution."""
from __future__ import annotations

import base64
import secrets
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from .errors import InvalidParamsError
from .models import Execution, FileInfo, Logs, Result, block_results

# files.read returns at most 1 MiB per call (docs/API.md "files.read"); a
# files.write is one JSON line of at most 64 MiB: 4 MiB of bytes is 5.4 MiB
# of base64, far below it.
READ_CHUNK = 1 << 20
WRITE_CHUNK = 4 << 20

# Session(...) keywords the client keeps; every other keyword is a session
# option for the daemon (it validates them: docs/API.md "Session options").
CLIENT_KEYS = ("home", "kernelmgr", "autostart", "config", "lang", "timeout")

TextCallback = Callable[[str], Any]
ResultCallback = Callable[[Result], Any]
Data = Union[bytes, bytearray, memoryview, str]


def session_name(name: Optional[str]) -> str:
    return name if name is not None else "py-" + secrets.token_hex(6)


def create_params(name: str, options: Dict[str, Any]) -> Dict[str, Any]:
    p: Dict[str, Any] = {"session": name}
    for k, v in options.items():
        if v is not None:  # an option left out is the daemon's default
            p[k] = v
    return p


def exec_params(name: str, code: str, lang: Optional[str], timeout: Optional[float],
                continue_on_error: bool) -> Dict[str, Any]:
    if not isinstance(code, str):
        raise InvalidParamsError(f"run: code must be a str, got {type(code).__name__}",
                                 -32602, 2)
    p: Dict[str, Any] = {"session": name, "code": code, "stream": True}
    if lang is not None:
        p["lang"] = lang
    if timeout is not None:
        p["timeout"] = timeout
    if continue_on_error:
        p["continue_on_error"] = True
    return p


class ExecEvents:
    """Turns exec events into callback calls (queued as (callback, arg)
    so that the async session may await them) and Logs."""

    def __init__(self, on_stdout: Optional[TextCallback], on_stderr: Optional[TextCallback],
                 on_result: Optional[ResultCallback]) -> None:
        self.on_stdout = on_stdout
        self.on_stderr = on_stderr
        self.on_result = on_result
        self.logs = Logs()
        self.calls: List[Tuple[Callable[[Any], Any], Any]] = []

    def __call__(self, ev: Dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "stream":
            text = ev.get("text")
            if not isinstance(text, str):
                return
            if ev.get("name") == "stderr":
                self.logs.stderr.append(text)
                if self.on_stderr:
                    self.calls.append((self.on_stderr, text))
            else:
                self.logs.stdout.append(text)
                if self.on_stdout:
                    self.calls.append((self.on_stdout, text))
        elif kind == "result" and self.on_result and isinstance(ev.get("result"), dict):
            for r in block_results(ev["result"]):
                self.calls.append((self.on_result, r))

    def take(self) -> List[Tuple[Callable[[Any], Any], Any]]:
        calls, self.calls = self.calls, []
        return calls

    def execution(self, reply: Dict[str, Any]) -> Execution:
        return Execution.from_reply(reply, self.logs)


def as_bytes(data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"files.write: data must be bytes or str, got {type(data).__name__}")


def write_chunks(name: str, path: str, data: bytes) -> Iterator[Dict[str, Any]]:
    """The files.write requests that write data to path, in order."""
    for off in range(0, max(len(data), 1), WRITE_CHUNK):
        yield {"session": name, "path": path, "encoding": "base64", "append": off > 0,
               "content": base64.b64encode(data[off:off + WRITE_CHUNK]).decode("ascii")}


def read_params(name: str, path: str, offset: int) -> Dict[str, Any]:
    return {"session": name, "path": path, "offset": offset, "length": READ_CHUNK,
            "encoding": "base64"}


def read_chunk(res: Dict[str, Any]) -> Tuple[bytes, bool, int]:
    """The bytes of a files.read result, whether it was the last, and the
    file's size then."""
    content = res.get("content") or ""
    raw = base64.b64decode(content) if res.get("encoding") == "base64" else \
        str(content).encode("utf-8")
    size = res.get("size")
    return raw, bool(res.get("eof")) or not raw, size if isinstance(size, int) else 0


def list_result(res: Dict[str, Any]) -> List[FileInfo]:
    return [FileInfo.from_json(f) for f in res.get("files") or [] if isinstance(f, dict)]


def partial_note(path: str, written: int, total: int) -> str:
    return f" ({path} holds the first {written} of {total} bytes)"
