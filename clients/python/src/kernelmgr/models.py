"""What a run returns: Execution, Result (a MIME bundle), ExecutionError,
FileChange, Logs; and FileInfo of a listing. Built from the daemon's
result objects (docs/CLI.md "The result"); every object keeps the daemon's
JSON in ``raw`` for fields this client does not name."""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class ExecutionError:
    """The error of a failed block: ``name`` (``ZeroDivisionError``,
    ``KeyboardInterrupt``, ``Timeout``, ``KernelKilled`` ...), ``value`` and
    ``traceback`` (a list of lines, as Jupyter sends them)."""

    name: str
    value: str
    traceback: List[str]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, e: Dict[str, Any]) -> "ExecutionError":
        tb = e.get("traceback")
        return cls(str(e.get("name", "")), str(e.get("value", "")),
                   [str(x) for x in tb] if isinstance(tb, list) else [], e)

    def __str__(self) -> str:
        return f"{self.name}: {self.value}"


@dataclass
class Result:
    """One rich output of a block: a MIME bundle (``data``: MIME type to
    value, e.g. ``{"text/plain": "42"}``). ``is_main_result`` is true for
    the value of the cell's last expression (Jupyter's execute_result),
    false for a display (a plot, ``display(...)``). Images are base64 text,
    as in Jupyter and E2B: ``png`` is the base64, ``png_bytes()`` the
    decoded bytes."""

    data: Dict[str, Any]
    is_main_result: bool = False

    def _str(self, mime: str) -> Optional[str]:
        v = self.data.get(mime)
        return v if isinstance(v, str) else None

    @property
    def text(self) -> Optional[str]:
        """The text/plain representation, or None."""
        return self._str("text/plain")

    @property
    def html(self) -> Optional[str]:
        """The text/html representation, or None."""
        return self._str("text/html")

    @property
    def markdown(self) -> Optional[str]:
        """The text/markdown representation, or None."""
        return self._str("text/markdown")

    @property
    def svg(self) -> Optional[str]:
        """The image/svg+xml representation, or None."""
        return self._str("image/svg+xml")

    @property
    def png(self) -> Optional[str]:
        """The image/png representation, or None."""
        return self._str("image/png")

    @property
    def jpeg(self) -> Optional[str]:
        """The image/jpeg representation, or None."""
        return self._str("image/jpeg")

    @property
    def pdf(self) -> Optional[str]:
        """The application/pdf representation, or None."""
        return self._str("application/pdf")

    @property
    def latex(self) -> Optional[str]:
        """The text/latex representation, or None."""
        return self._str("text/latex")

    @property
    def javascript(self) -> Optional[str]:
        """The application/javascript representation, or None."""
        return self._str("application/javascript")

    @property
    def json(self) -> Any:
        """The application/json representation (parsed), or None."""
        return self.data.get("application/json")

    def png_bytes(self) -> Optional[bytes]:
        """The PNG image decoded, or None."""
        return base64.b64decode(self.png) if self.png else None

    def formats(self) -> List[str]:
        """The MIME types this result carries."""
        return list(self.data)

    def __getitem__(self, mime: str) -> Any:
        return self.data[mime]

    def __contains__(self, mime: object) -> bool:
        return mime in self.data


@dataclass
class FileChange:
    """A workspace entry a block created, modified or deleted."""

    path: str
    change: str  # "created" | "modified" | "deleted"
    size: Optional[int] = None
    mime: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, f: Dict[str, Any]) -> "FileChange":
        size = f.get("size")
        mime = f.get("mime")
        return cls(str(f.get("path", "")), str(f.get("change", "")),
                   size if isinstance(size, int) else None,
                   mime if isinstance(mime, str) else None, f)


@dataclass
class FileInfo:
    """An entry of ``files.list()``: ``type`` is ``file``, ``dir``,
    ``symlink`` ... (symbolic links are reported with their ``target``,
    never followed)."""

    path: str
    size: int
    type: str
    mime: Optional[str] = None
    target: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, f: Dict[str, Any]) -> "FileInfo":
        size = f.get("size")
        mime = f.get("mime")
        target = f.get("target")
        return cls(str(f.get("path", "")), size if isinstance(size, int) else 0,
                   str(f.get("type", "")), mime if isinstance(mime, str) else None,
                   target if isinstance(target, str) else None, f)


@dataclass
class Logs:
    """The text as it streamed, chunk by chunk (E2B's ``execution.logs``)."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


def block_results(block: Dict[str, Any]) -> List[Result]:
    """The rich outputs of one block result, displays first, in order."""
    out = [Result(d) for d in block.get("displays") or [] if isinstance(d, dict)]
    if isinstance(block.get("result"), dict) and block["result"]:
        out.append(Result(block["result"], is_main_result=True))
    return out


@dataclass
class Execution:
    """The outcome of ``Session.run``: one or more blocks (one unless the
    code is Markdown with several fenced blocks), merged.

    * ``stdout``, ``stderr``: the blocks' text, concatenated (capped per
      stream by the daemon's ``output_cap``, with a marker naming the
      complete output's file; ``logs`` holds what streamed).
    * ``results``: the rich outputs (``Result``), in order.
    * ``error``: the first failing block's, or None.
    * ``files``: the workspace changes of all blocks.
    * ``exit_code``: the last block's (Python 0 or 1, Bash the last
      command's status, 124 timeout, 137 killed).
    * ``status``: ``ok``, or the first failing block's ``error`` |
      ``timeout`` | ``killed``.
    * ``blocks``: the daemon's result objects, unchanged.
    """

    stdout: str = ""
    stderr: str = ""
    results: List[Result] = field(default_factory=list)
    error: Optional[ExecutionError] = None
    files: List[FileChange] = field(default_factory=list)
    exit_code: Optional[int] = None
    status: str = "ok"
    execution_count: Optional[int] = None
    logs: Logs = field(default_factory=Logs)
    warnings: List[str] = field(default_factory=list)
    skipped: int = 0
    blocks: List[Dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def text(self) -> Optional[str]:
        """The text/plain of the main result (the last expression), or None."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.error is None

    @property
    def kernel(self) -> Dict[str, Any]:
        """The last block's kernel report: ``restarted``,
        ``state_preserved`` and ``reason`` (why state was lost)."""
        k = self.blocks[-1].get("kernel") if self.blocks else None
        return k if isinstance(k, dict) else {}

    @classmethod
    def from_reply(cls, reply: Dict[str, Any], logs: Logs) -> "Execution":
        blocks = [b for b in reply.get("results") or [] if isinstance(b, dict)]
        ex = cls(logs=logs, blocks=blocks)
        ex.stdout = "".join(str(b.get("stdout") or "") for b in blocks)
        ex.stderr = "".join(str(b.get("stderr") or "") for b in blocks)
        for b in blocks:
            ex.results.extend(block_results(b))
            ex.files.extend(FileChange.from_json(f) for f in b.get("files") or []
                            if isinstance(f, dict))
            if ex.error is None and isinstance(b.get("error"), dict):
                ex.error = ExecutionError.from_json(b["error"])
            if ex.status == "ok" and b.get("status") not in (None, "ok"):
                ex.status = str(b["status"])
        if blocks:
            last = blocks[-1]
            ex.exit_code = last.get("exit_code") if isinstance(last.get("exit_code"), int) \
                else None
            ec = last.get("execution_count")
            ex.execution_count = ec if isinstance(ec, int) else None
        if ex.error is not None and ex.status == "ok":
            ex.status = "error"
        if reply.get("failed") and ex.status == "ok":
            ex.status = "error"
        ex.warnings = [str(w) for w in reply.get("warnings") or []]
        sk = reply.get("skipped")
        ex.skipped = sk if isinstance(sk, int) else 0
        return ex
