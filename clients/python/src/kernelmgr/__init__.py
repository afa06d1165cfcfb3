"""kernelmgr: the Python client of the kernelmgr daemon (stdlib only).

    from kernelmgr import Session
    with Session(memory="1G") as s:
        ex = s.run("x = 6 * 7\\nx", lang="python")
        print(ex.text)                  # 42
        s.files.write("data.bin", b"\\0" * 10)
        print(s.files.read("data.bin"))

See docs/CLIENTS.md (the E2B mapping, AsyncSession, how the daemon is
found and started).
"""
from __future__ import annotations

__version__ = "0.1.0"

from .aio import AsyncFiles, AsyncSession
from .errors import (DaemonBusyError, DaemonUnavailableError, InternalError, InvalidParamsError,
                     InvalidRequestError, KernelmgrError, KernelStartError, MethodNotFoundError,
                     ProtocolError, SessionClosedError, SessionNotFoundError, UsageError)
from .models import Execution, ExecutionError, FileChange, FileInfo, Logs, Result
from .session import Files, Session

__all__ = [
    "AsyncFiles", "AsyncSession", "DaemonBusyError", "DaemonUnavailableError", "Execution",
    "ExecutionError", "FileChange", "FileInfo", "Files", "InternalError", "InvalidParamsError",
    "InvalidRequestError", "KernelStartError", "KernelmgrError", "Logs", "MethodNotFoundError",
    "ProtocolError", "Result", "Session", "SessionClosedError", "SessionNotFoundError",
    "UsageError", "__version__",
]
