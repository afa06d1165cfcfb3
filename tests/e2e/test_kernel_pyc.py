"""The Python worker's precompiled driver: kernel-python runs
share/kernelmgr/python/driver.py through PYKERNEL_BOOT (kernels/python/
pykernel.h), which takes the driver's code from the checked-hash .pyc that
`make` writes into share/kernelmgr/python/__pycache__ when -- and only when --
CPython's own loader accepts it: the interpreter's magic number and the hash
of the current driver.py. Never from a place the sandbox can write
(PYTHONPYCACHEPREFIX, the workspace), and nothing is written.

Which code ran is visible from user code: `__kernelmgr_driver__` (a builtin)
is the driver's module, and the crafted .pyc files here define _PYC_MARK.
Each test works on a private copy of the share directory (KERNELMGR_SHARE),
started as the invoking user and, as root, as nobody."""
import importlib.util
import marshal
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import kutil
import sbxutil
from kutil import stream_text

KM_TEST_SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")
SYS_PY = "/usr/bin/python3"
SHARE = kutil.BUILD / "share" / "kernelmgr"
SHOW = "print(getattr(__kernelmgr_driver__, '_PYC_MARK', 'source'))"

pytestmark = [
    pytest.mark.skipif(not os.path.exists(kutil.binary("kernel-python")),
                       reason="build/kernel-python not built"),
    # The pyc files are checked against the interpreter running the tests:
    # the kernel's must be the same one.
    pytest.mark.skipif(os.path.realpath(sys.executable) != os.path.realpath(SYS_PY),
                       reason=f"run the tests with {SYS_PY}"),
]


def tag_pyc(driver):
    """Where CPython looks for driver's code (no PYTHONPYCACHEPREFIX)."""
    old = sys.pycache_prefix
    sys.pycache_prefix = None
    try:
        return Path(importlib.util.cache_from_source(str(driver)))
    finally:
        sys.pycache_prefix = old


def crafted_pyc(source, mark, magic=None):
    """A checked-hash .pyc whose header claims `source` (its hash) while its
    code is `source` plus `_PYC_MARK = mark`: accepted only by a loader
    that trusts the header, i.e. one that uses a valid cache."""
    marked = source.replace(b"import os\n", b"import os\n_PYC_MARK = " + repr(mark).encode() + b"\n", 1)
    assert marked != source
    code = compile(marked, "driver.py", "exec", dont_inherit=True)
    return ((magic or importlib.util.MAGIC_NUMBER) + (3).to_bytes(4, "little") +
            importlib.util.source_hash(source) + marshal.dumps(code))


@pytest.fixture
def share(monkeypatch):
    """A private copy of the build's share directory, readable by nobody,
    that the kernels started in this test use (KERNELMGR_SHARE)."""
    base = Path(tempfile.mkdtemp(prefix="km-pyc-", dir="/tmp"))
    os.chmod(base, 0o755)
    d = base / "share"
    shutil.copytree(SHARE, d)
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
    monkeypatch.setenv("KERNELMGR_SHARE", str(d))
    yield d
    shutil.rmtree(base, ignore_errors=True)


def workspace(share):
    """The workspace of the test's kernel, beside the share copy (a place
    nobody can reach, unlike pytest's tmp_path)."""
    ws = share.parent / "run" / "ws"
    ws.mkdir(parents=True, exist_ok=True)
    os.chmod(ws.parent, 0o755)
    return ws


def start(user, share, args=()):
    """A KM_TEST_SANDBOX python kernel on SYS_PY as user."""
    if user == "nobody" and not sbxutil.IS_ROOT:
        pytest.skip("the nobody variant needs root to switch users")
    ws = workspace(share)
    if user == "nobody":
        for root, dirs, files in os.walk(ws):
            for n in dirs + files:
                os.chown(os.path.join(root, n), sbxutil.NOBODY, sbxutil.NOBODY)
        os.chown(ws, sbxutil.NOBODY, sbxutil.NOBODY)
    return sbxutil.SandboxKernel("python", ws.parent / "k", ws,
                                 ["--sandbox", KM_TEST_SANDBOX, "--python", SYS_PY, *args],
                                 sbxutil.SETPRIV if user == "nobody" else [])


def shown(k, code=SHOW):
    _, r = k.execute(code, timeout=60)
    c = r["reply"]["content"]
    assert c["status"] == "ok", (c, k.log_text())
    return stream_text(r["iopub"]).strip()


def test_make_writes_a_checked_hash_pyc_of_the_driver():
    driver = SHARE / "python" / "driver.py"
    pyc = tag_pyc(driver)
    assert pyc.is_file(), f"make did not precompile the driver for {SYS_PY}: no {pyc}"
    head = pyc.read_bytes()[:16]
    assert head[:4] == importlib.util.MAGIC_NUMBER
    assert int.from_bytes(head[4:8], "little") == 3, "not checked-hash"
    assert head[8:16] == importlib.util.source_hash(driver.read_bytes()), "stale"
    assert driver.read_bytes() == (kutil.ROOT / "kernels/python/driver.py").read_bytes()


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_a_valid_pyc_is_used(share, user):
    driver = share / "python" / "driver.py"
    tag_pyc(driver).write_bytes(crafted_pyc(driver.read_bytes(), "pyc"))
    k = start(user, share)
    try:
        assert shown(k) == "pyc", k.log_text()
        # the driver still runs as __main__ would: its file, no trace of the boot
        assert shown(k, "print(__kernelmgr_driver__.__file__ == %r, __kernelmgr_driver__.__name__)"
                     % os.path.realpath(driver)) == "True __main__"
        assert shown(k, "import sys; print(sys.argv, 'e' in dir(__kernelmgr_driver__))") == \
            "[''] False"
    finally:
        k.close()


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_an_edited_driver_wins_over_its_old_pyc(share, user):
    driver = share / "python" / "driver.py"
    assert tag_pyc(driver).is_file()  # make's, valid for the unedited driver
    src = driver.read_bytes()
    driver.write_bytes(src.replace(b"import os\n", b"import os\n_PYC_MARK = 'edited'\n", 1))
    k = start(user, share)
    try:
        assert shown(k) == "edited", k.log_text()
    finally:
        k.close()


def test_a_pyc_of_another_interpreter_version_is_ignored(share):
    driver = share / "python" / "driver.py"
    magic = importlib.util.MAGIC_NUMBER
    other = (int.from_bytes(magic[:2], "little") - 10).to_bytes(2, "little") + magic[2:]
    tag_pyc(driver).write_bytes(crafted_pyc(driver.read_bytes(), "pyc", magic=other))
    k = start("invoker", share)
    try:
        assert shown(k) == "source", k.log_text()
    finally:
        k.close()


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_never_a_pyc_from_a_sandbox_writable_place(share, user):
    # PYTHONPYCACHEPREFIX in the code's environment names a workspace
    # directory holding a valid-looking cache of the driver, and the
    # workspace has a driver.py with its own cache: neither runs, and
    # the driver compiles from our source (its own cache removed here).
    driver = share / "python" / "driver.py"
    src = driver.read_bytes()
    shutil.rmtree(share / "python" / "__pycache__")
    ws = workspace(share)
    prefix = ws / "pfx"
    planted = prefix / os.path.realpath(driver.parent).lstrip("/") / tag_pyc(driver).name
    planted.parent.mkdir(parents=True)
    planted.write_bytes(crafted_pyc(src, "prefix"))
    (ws / "driver.py").write_bytes(src.replace(b"import os\n", b"import os\n_PYC_MARK = 'ws'\n", 1))
    (ws / "__pycache__").mkdir()
    tag_pyc(ws / "driver.py").write_bytes(crafted_pyc(src, "ws-pyc"))
    k = start(user, share, ["--env", f"PYTHONPYCACHEPREFIX={prefix}"])
    try:
        assert shown(k) == "source", k.log_text()
        # user code still gets the prefix it asked for
        assert shown(k, "import sys; print(sys.pycache_prefix, sys.dont_write_bytecode)") == \
            f"{prefix} False"
    finally:
        k.close()
    # and nothing was written next to our driver (read-only in the sandbox;
    # not written even where it could be)
    assert not (share / "python" / "__pycache__").exists()


# ---- the same issue's bash start: one exec, stderr moved by the shell itself


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_bash_starts_quietly_with_its_stderr(share, user):
    # kernel-bash starts `bash -i bootstrap.sh` with fd 2 on /dev/null and
    # its stderr pipe on fd 5 (quiet_start): the job-control warnings of an
    # interactive shell without a terminal go nowhere, cells' stderr works,
    # and fd 5 is not left open for user code.
    if user == "nobody" and not sbxutil.IS_ROOT:
        pytest.skip("the nobody variant needs root to switch users")
    ws = workspace(share)
    if user == "nobody":
        os.chown(ws, sbxutil.NOBODY, sbxutil.NOBODY)
    k = sbxutil.SandboxKernel("bash", ws.parent / "k", ws, ["--sandbox", KM_TEST_SANDBOX],
                              sbxutil.SETPRIV if user == "nobody" else [])
    try:
        _, r = k.execute("echo out; echo err >&2\n"
                         "[ -e /proc/$$/fd/5 ] && echo fd5-open || echo fd5-closed", timeout=60)
        assert r["reply"]["content"]["status"] == "ok", (r, k.log_text())
        streams = [m["content"] for m in r["iopub"] if m["msg_type"] == "stream"]
        err = "".join(s["text"] for s in streams if s["name"] == "stderr")
        out = "".join(s["text"] for s in streams if s["name"] == "stdout")
        assert err == "err\n", (streams, k.log_text())
        assert out == "out\nfd5-closed\n", streams
        assert "job control" not in k.log_text()
    finally:
        k.close()
