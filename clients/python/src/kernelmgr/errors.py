"""Errors of the kernelmgr client.

A request the daemon refuses raises the subclass of KernelmgrError that
matches its JSON-RPC error code (docs/API.md "Validation and errors"),
carrying the daemon's ``code``, ``km_code`` and ``message`` unchanged.
A block that fails (an exception, a timeout) is not an error: it is an
Execution with ``error`` set.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Type


class KernelmgrError(Exception):
    """Base of every error this package raises.

    ``code`` is the JSON-RPC error code (None when the daemon was never
    reached), ``km_code`` the daemon's own code (``data.km_code``, also the
    CLI's exit status), ``message`` the daemon's message.
    """

    def __init__(self, message: str, code: Optional[int] = None,
                 km_code: Optional[int] = None, data: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.km_code = km_code
        self.data = data or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"


class DaemonUnavailableError(KernelmgrError):
    """No daemon answers on the socket and none could be started, or the
    connection broke (km_code 5, like the CLI's exit status)."""


class ProtocolError(KernelmgrError):
    """The daemon sent something this client cannot read (a bug)."""


class InvalidParamsError(KernelmgrError):
    """-32602: a field was refused (unknown, missing, mistyped, out of
    range, above the operator's ceiling); the message names it."""


class UsageError(KernelmgrError):
    """-32002: the operation refused its input (a bad session name, a path
    outside the workspace, code over code_max ...)."""


class SessionNotFoundError(KernelmgrError):
    """-32003: no such session (or it was closed while the request waited)."""


class KernelStartError(KernelmgrError):
    """-32004: a kernel could not be started."""


class DaemonBusyError(KernelmgrError):
    """-32005: the daemon is busy (its request queue is full)."""


class InternalError(KernelmgrError):
    """-32006: the daemon's internal error (I/O, out of memory, a damaged
    session.json)."""


class MethodNotFoundError(KernelmgrError):
    """-32601: the daemon does not know the method (an older daemon)."""


class InvalidRequestError(KernelmgrError):
    """-32700 / -32600: the daemon could not parse the request (a bug)."""


class SessionClosedError(KernelmgrError):
    """This Session object was closed: open a new one."""


_BY_CODE: Dict[int, Type[KernelmgrError]] = {
    -32700: InvalidRequestError,
    -32600: InvalidRequestError,
    -32601: MethodNotFoundError,
    -32602: InvalidParamsError,
    -32002: UsageError,
    -32003: SessionNotFoundError,
    -32004: KernelStartError,
    -32005: DaemonBusyError,
    -32006: InternalError,
}


def from_rpc(err: Any) -> KernelmgrError:
    """The exception for a JSON-RPC error object."""
    if not isinstance(err, dict):
        return ProtocolError(f"the daemon sent an error that is not an object: {err!r}")
    code = err.get("code")
    msg = err.get("message")
    raw_data = err.get("data")
    data: Dict[str, Any] = raw_data if isinstance(raw_data, dict) else {}
    kc = data.get("km_code")
    km = kc if isinstance(kc, int) else None
    icode = code if isinstance(code, int) else None
    cls: Type[KernelmgrError] = _BY_CODE.get(icode, KernelmgrError) if icode is not None \
        else KernelmgrError
    return cls(msg if isinstance(msg, str) else "the daemon reported an error", icode, km, data)
