"""Kernel start as users see it: KernelManager.start_kernel + wait_for_ready
(what nbclient, jupyter console and Notebook do), the IOPub welcome of
Jupyter's kernel-subscription proposal (JEP 65), and the cached pyenv shim
probe. Behaviour only: nothing here asserts on a time."""
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import zmq
from jupyter_client import BlockingKernelClient, KernelManager
from jupyter_client.connect import write_connection_file
from jupyter_client.session import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402

SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")
SYS_PY = "/usr/bin/python3"


def spec_dir(tmp_path, lang):
    """A kernelspec for our kernel under a private JUPYTER_PATH."""
    d = tmp_path / "share" / "jupyter" / "kernels" / f"km-{lang}"
    d.mkdir(parents=True)
    argv = [kutil.binary("kernel-" + lang), "-f", "{connection_file}", "--sandbox", SANDBOX]
    if lang == "python":
        argv += ["--python", SYS_PY]
    (d / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": lang,
                                               "language": lang}))
    return str(tmp_path / "share" / "jupyter")


@pytest.mark.parametrize("lang", ["bash", "python"])
def test_wait_for_ready_needs_no_second_kernel_info(lang, tmp_path, monkeypatch):
    """jupyter_client's wait_for_ready starts over (a new kernel_info_request
    and another second) when no IOPub message follows the kernel_info_reply
    within 0.2 s: the slow joiner. The welcome makes the first one enough."""
    monkeypatch.setenv("JUPYTER_PATH", spec_dir(tmp_path, lang))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "rt"))
    km = KernelManager(kernel_name=f"km-{lang}")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    events = []
    try:
        kc.start_channels()
        orig_info = kc.kernel_info
        orig_shell, orig_iopub = kc.shell_channel.get_msg, kc.iopub_channel.get_msg

        def kernel_info(*a, **kw):
            events.append(("request", None))
            return orig_info(*a, **kw)

        async def shell_get(*a, **kw):
            msg = await orig_shell(*a, **kw)
            events.append(("shell", msg["msg_type"]))
            return msg

        async def iopub_get(*a, **kw):
            msg = await orig_iopub(*a, **kw)
            events.append(("iopub", msg))
            return msg

        kc.kernel_info = kernel_info
        kc.shell_channel.get_msg = shell_get
        kc.iopub_channel.get_msg = iopub_get
        kc.wait_for_ready(timeout=60)
        first_reply = events.index(("shell", "kernel_info_reply"))
        assert ("request", None) not in events[first_reply:], events
        welcomes = [m for kind, m in events if kind == "iopub"
                    and m["msg_type"] == "iopub_welcome"]
        assert welcomes, [m["msg_type"] for kind, m in events if kind == "iopub"]
        w = welcomes[0]
        assert w["content"] == {"subscription": ""}
        assert w["parent_header"] == {}
        assert w["header"]["msg_type"] == "iopub_welcome"
        # and the kernel works
        kc.kernel_info = orig_info
        kc.shell_channel.get_msg, kc.iopub_channel.get_msg = orig_shell, orig_iopub
        reply = kc.execute_interactive("echo hi" if lang == "bash" else "print('hi')",
                                       timeout=60, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_history_files_go_with_the_connection_files_jupyter_removes(tmp_path, monkeypatch):
    """A Jupyter client makes a connection file per kernel in its runtime
    directory and removes it after the kernel ends; the kernel's history file
    beside it must not pile up there (one per kernel ever started). A kernel
    that ends removes the ones whose connection file is gone; a live
    kernel's, and a file that is not a history of ours, stay."""
    monkeypatch.setenv("JUPYTER_PATH", spec_dir(tmp_path, "bash"))
    rt = tmp_path / "rt"
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(rt))
    rt.mkdir()
    foreign = rt / "notes.json.history.jsonl"  # someone else's file of that name
    foreign.write_text("my notes\n")

    def one_kernel():
        km = KernelManager(kernel_name="km-bash")
        # where jupyter_server's MultiKernelManager puts it (a KernelManager
        # alone would take a temporary file in /tmp)
        km.connection_file = str(rt / f"kernel-{uuid.uuid4()}.json")
        km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        try:
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            reply = kc.execute_interactive("echo hi", timeout=60, output_hook=lambda m: None)
            assert reply["content"]["status"] == "ok"
            hist = Path(km.connection_file + ".history.jsonl")
            assert hist.exists()
        finally:
            kc.stop_channels()
            km.shutdown_kernel()  # a shutdown_request, as a frontend ends a kernel
        assert not os.path.exists(km.connection_file)
        return hist

    first = one_kernel()
    assert first.exists()  # its end came before jupyter_client removed its file
    second = one_kernel()
    assert not first.exists(), sorted(p.name for p in rt.iterdir())
    assert second.exists() and foreign.read_text() == "my notes\n"
    histories = [p.name for p in rt.iterdir() if p.name.endswith(".history.jsonl")]
    assert sorted(histories) == sorted([second.name, foreign.name])


def recv_msg(sock, session, timeout_ms=10000):
    """The next message on a SUB socket: (topic frame, parsed message)."""
    assert sock.poll(timeout_ms), "no IOPub message"
    frames = sock.recv_multipart()
    idents, rest = session.feed_identities(frames)
    return idents, session.deserialize(rest)


def welcome_of(sock, session, topic, timeout_ms=10000):
    """The welcome for this subscription (a subscriber to "" sees everyone's)."""
    while True:
        idents, m = recv_msg(sock, session, timeout_ms)
        if m["msg_type"] == "iopub_welcome" and m["content"]["subscription"] == topic.decode():
            return idents, m


def test_every_subscriber_gets_a_welcome_for_its_topic(kernel_factory):
    k = kernel_factory("bash", args=["--sandbox", SANDBOX])
    info = json.loads(Path(k.cf).read_text())
    sessions = {}  # one per subscriber: each sees the same signed messages

    def session_of(sock):
        return sessions.setdefault(id(sock), Session(key=info["key"].encode(),
                                                     signature_scheme=info["signature_scheme"]))

    ctx = zmq.Context.instance()
    url = f"tcp://{info['ip']}:{info['iopub_port']}"
    subs = []
    try:
        for topic in (b"", b"kernel.", b"zz-not-a-kernel-topic"):
            s = ctx.socket(zmq.SUB)
            s.linger = 0
            s.connect(url)
            s.setsockopt(zmq.SUBSCRIBE, topic)
            subs.append((topic, s))
        for topic, s in subs:
            idents, m = welcome_of(s, session_of(s), topic)  # signed: deserialize checks it
            assert m["content"] == {"subscription": topic.decode()}
            assert m["parent_header"] == {}
            assert idents and idents[0].startswith(topic)
        # a topic that is not UTF-8 gets no welcome, and breaks nothing
        bad = ctx.socket(zmq.SUB)
        bad.linger = 0
        bad.connect(url)
        bad.setsockopt(zmq.SUBSCRIBE, b"\xff\xfe")
        subs.append((b"\xff\xfe", bad))
        # subscription spam: bounded (no welcome while messages queue up)
        spam = ctx.socket(zmq.SUB)
        spam.linger = 0
        spam.connect(url)
        for i in range(3000):
            spam.setsockopt(zmq.SUBSCRIBE, b"t%d" % i)
            spam.setsockopt(zmq.UNSUBSCRIBE, b"t%d" % i)
        subs.append((b"spam", spam))
        reply = k.kc.execute_interactive("echo still-here", timeout=60,
                                         output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok"
        assert k.proc.poll() is None
        # the first subscriber (everything) saw the execution's output
        seen = []
        s = subs[0][1]
        while s.poll(2000):
            _, m = recv_msg(s, session_of(s))
            seen.append(m)
            if m["msg_type"] == "stream" and "still-here" in m["content"]["text"]:
                break
        assert any(m["msg_type"] == "stream" for m in seen)
    finally:
        for _, s in subs:
            s.close()


# ------------------------------------------------------------------ pyenv shim

SHIM = """#!/usr/bin/env bash
set -e
[ -n "$PYENV_DEBUG" ] && set -x

program="${0##*/}"

export PYENV_ROOT="%(root)s"
exec "%(root)s/libexec/pyenv" exec "$program" "$@"
"""

# A stand-in for pyenv: counts its runs, then runs the real python.
FAKE_PYENV = """#!/bin/sh
echo run >> "%(count)s"
[ "$1" = exec ] || exit 2
shift 2
exec %(python)s "$@"
"""


def fake_pyenv(tmp_path):
    root = tmp_path / "pyenv"
    (root / "libexec").mkdir(parents=True)
    (root / "shims").mkdir()
    (root / "versions").mkdir()
    count = tmp_path / "pyenv-runs"
    (root / "libexec" / "pyenv").write_text(FAKE_PYENV % {"count": count, "python": SYS_PY})
    (root / "shims" / "python3").write_text(SHIM % {"root": root})
    for f in ("libexec/pyenv", "shims/python3"):
        (root / f).chmod(0o755)
    (root / "version").write_text("system\n")
    return root, count


def runs(count):
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_pyenv_shim_probe_is_cached(kernel_factory, tmp_path):
    root, count = fake_pyenv(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "KERNELMGR_PYTHON", "PYENV_VERSION")}
    env.update(PATH=f"{root / 'shims'}:/usr/bin:/bin", XDG_CACHE_HOME=str(cache),
               PYENV_ROOT=str(root))

    def start():
        k = kernel_factory("python", args=["--sandbox", SANDBOX], env=env)
        k.kc.kernel_info()
        ki = k.kc.get_shell_msg(timeout=30)["content"]
        assert ki["interpreter"]["source"] == "PATH"
        assert "/shims/" not in ki["interpreter"]["path"]
        reply = k.kc.execute_interactive("import sys; print(sys.version)", timeout=60,
                                         output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok"
        k.close()

    start()
    assert runs(count) == 1
    start()
    assert runs(count) == 1, "the second start ran the shim again"
    # pyenv's global version file changes: probed again
    (root / "version").write_text("system\n\n")
    start()
    assert runs(count) == 2
    start()
    assert runs(count) == 2
    # another PYENV_VERSION: another answer, probed again
    env["PYENV_VERSION"] = "system"
    start()
    assert runs(count) == 3
    # the shim rewritten (pyenv rehash): probed again
    shim = root / "shims" / "python3"
    shim.write_text(shim.read_text() + "\n")
    start()
    assert runs(count) == 4
    # a cache entry tampered with (names another interpreter): not trusted
    for f in cache.rglob("pyshim-*"):
        text = f.read_text()
        f.write_text(text.replace(SYS_PY, "/bin/sh"))
    start()
    assert runs(count) == 5


GATED_PYTHON = """#!/bin/sh
# an interpreter whose probe waits at a gate the test opens
echo probing >> '%(mark)s'
read line < '%(gate)s'
exec %(python)s "$@"
"""


def test_sockets_accept_connects_before_the_interpreter_is_found(tmp_path):
    """Every socket of the connection file is bound before the backend looks
    for its interpreter: a client that connects right after the spawn (as
    jupyter_client does) is accepted, not refused and left to retry after
    ZeroMQ's reconnect interval. Order of events, no timing: the probe is
    held at a gate while the test connects to every port and sends a
    kernel_info_request, which is answered once the gate opens."""
    gate, mark = tmp_path / "gate", tmp_path / "probing"
    os.mkfifo(gate)
    py = tmp_path / "bin" / "python3"
    py.parent.mkdir()
    py.write_text(GATED_PYTHON % {"mark": mark, "gate": gate, "python": SYS_PY})
    py.chmod(0o755)
    cache = tmp_path / "cache"  # a cached probe would not reach the gate
    cache.mkdir(mode=0o700)
    ws = tmp_path / "ws"
    ws.mkdir()
    cf = str(tmp_path / "kernel.json")
    write_connection_file(cf, transport="tcp", key=os.urandom(32).hex().encode())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "KERNELMGR_PYTHON")}
    env["XDG_CACHE_HOME"] = str(cache)
    log = open(tmp_path / "kernel.log", "wb")
    proc = subprocess.Popen([kutil.binary("kernel-python"), "-f", cf, "--workspace", str(ws),
                             "--sandbox", SANDBOX, "--python", str(py)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env)
    kc = None
    opened = False
    try:
        deadline = time.monotonic() + 60
        while not mark.exists():
            assert proc.poll() is None, (tmp_path / "kernel.log").read_text()
            assert time.monotonic() < deadline, "the interpreter probe never ran"
            time.sleep(0.01)
        # the kernel is inside its interpreter probe: no worker yet
        info = json.loads(Path(cf).read_text())
        for ch in ("shell", "iopub", "stdin", "control", "hb"):
            with socket.create_connection((info["ip"], info[f"{ch}_port"]), timeout=10):
                pass
        kc = BlockingKernelClient(connection_file=cf)
        kc.load_connection_file()
        kc.start_channels()
        msg_id = kc.kernel_info()
        with open(gate, "w") as g:
            g.write("go\n")
        opened = True
        while True:
            m = kc.get_shell_msg(timeout=60)
            if m["parent_header"].get("msg_id") == msg_id:
                break
        assert m["msg_type"] == "kernel_info_reply"
        assert m["content"]["language_info"]["name"] == "python"
        reply = kc.execute_interactive("print(6 * 7)", timeout=60, output_hook=lambda m: None)
        assert reply["content"]["status"] == "ok"
    finally:
        if not opened:  # let a kernel stuck at the gate go
            fd = os.open(gate, os.O_RDWR | os.O_NONBLOCK)
            os.write(fd, b"go\n")
            os.close(fd)
        if kc is not None:
            kc.stop_channels()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
