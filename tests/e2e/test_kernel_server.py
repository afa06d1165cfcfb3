"""The generic kernel server (kernels/server/), exercised through the Bash
kernel: signing and replay protection, channels served while code runs,
history, shutdown, transports, command line."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import zmq
from jupyter_client.session import Session

import kutil
from kutil import stream_text

SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")
KERNEL = kutil.binary("kernel-bash")


@pytest.fixture
def bash(kernel_factory):
    def make(*args, **kw):
        kw.setdefault("key", os.urandom(16).hex().encode())  # signed, like real clients
        return kernel_factory("bash", args=("--sandbox", SANDBOX, *args), **kw)
    return make


def run(k, code, **kw):
    _, r = k.execute(code, **kw)
    return r["reply"], r["iopub"]


def descendants(pid):
    """Host pids of every process below pid (works across pid namespaces)."""
    children = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------- authentication

def test_forged_message_is_ignored(bash):
    k = bash()
    marker = k.workspace / "forged.txt"
    forger = Session(key=b"not-the-key", username="mallory")
    s = kutil.raw_socket(k, "shell")
    try:
        forger.send(s, "execute_request", {"code": f"touch {marker}", "silent": False,
                                           "store_history": True, "user_expressions": {},
                                           "allow_stdin": False, "stop_on_error": True})
        # unsigned, too
        Session(key=b"").send(s, "execute_request", {"code": f"touch {marker}"})
        assert kutil.recv_reply(k, s, timeout=1.5) is None
    finally:
        s.close()
    assert not marker.exists()
    assert "signature" in k.log_text()
    reply, iopub = run(k, "echo still-fine")
    assert stream_text(iopub) == "still-fine\n"
    assert reply["content"]["execution_count"] == 1


def test_replayed_message_is_ignored(bash):
    k = bash()
    out = k.workspace / "count.txt"
    s = kutil.raw_socket(k, "shell")
    try:
        msg = k.kc.session.msg("execute_request", {
            "code": f"echo once >> {out}", "silent": False, "store_history": True,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True})
        frames = k.kc.session.serialize(msg)
        s.send_multipart(frames)
        first = kutil.recv_reply(k, s, timeout=10)
        assert first is not None and first["content"]["status"] == "ok"
        s.send_multipart(frames)  # the very same bytes again
        assert kutil.recv_reply(k, s, timeout=1.5) is None
    finally:
        s.close()
    assert out.read_text() == "once\n"
    assert "replay" in k.log_text().lower()
    reply, _ = run(k, "true")
    assert reply["content"]["status"] == "ok"


def test_malformed_frames_are_ignored(bash):
    k = bash()
    s = kutil.raw_socket(k, "shell")
    try:
        s.send_multipart([b"garbage"])
        s.send_multipart([b"<IDS|MSG>", b"0" * 64, b"{", b"{}", b"{}", b"{}"])
        s.send_multipart([b"<IDS|MSG>"])
        assert kutil.recv_reply(k, s, timeout=1) is None
    finally:
        s.close()
    reply, iopub = run(k, "echo ok")
    assert stream_text(iopub) == "ok\n"


# ---------------------------------------------------------------- served while busy

def test_channels_answer_while_code_runs(bash):
    k = bash()
    msg_id = k.kc.execute("sleep 60; echo not-reached")
    # heartbeat
    assert kutil.hb_ping(k, timeout=10)
    # kernel_info on control and on shell (answered by the server itself)
    rep = kutil.control_request(k, "kernel_info_request", timeout=10)
    assert rep["msg_type"] == "kernel_info_reply"
    info_id = k.kc.kernel_info()
    m = k.kc.get_shell_msg(timeout=10)
    assert m["parent_header"]["msg_id"] == info_id
    assert m["msg_type"] == "kernel_info_reply"
    rep = kutil.control_request(k, "comm_info_request", timeout=10)
    assert rep["content"] == {"status": "ok", "comms": {}}
    # all of that happened while the cell was running: it is still running
    rep = kutil.control_request(k, "interrupt_request", timeout=10)
    r = k.collect(msg_id, 20)
    assert r["reply"]["content"]["ename"] == "KeyboardInterrupt"


def test_requests_queue_behind_a_running_cell(bash):
    k = bash()
    ids = [k.kc.execute("sleep 0.5; v=1"), k.kc.execute("echo v=$v")]
    c_id = k.kc.complete("ech", 3)
    r0 = k.collect(ids[0])
    r1 = k.collect(ids[1])
    assert stream_text(r1["iopub"]) == "v=1\n"
    assert r0["reply"]["content"]["execution_count"] == 1
    assert r1["reply"]["content"]["execution_count"] == 2
    m = k.kc.get_shell_msg(timeout=10)
    assert m["parent_header"]["msg_id"] == c_id and "echo" in m["content"]["matches"]


def test_unknown_message_type_is_ignored(bash):
    k = bash()
    s = kutil.raw_socket(k, "shell")
    try:
        k.kc.session.send(s, "frobnicate_request", {})
        k.kc.session.send(s, "comm_open", {"comm_id": "x", "target_name": "t", "data": {}})
        assert kutil.recv_reply(k, s, timeout=1) is None
    finally:
        s.close()
    assert "frobnicate_request" in k.log_text()
    reply, _ = run(k, "true")
    assert reply["content"]["status"] == "ok"


# ---------------------------------------------------------------- history

def test_history(bash, tmp_path):
    k = bash()
    for code in ["echo alpha", "x=1", "echo beta"]:
        run(k, code)
    run(k, "echo not-stored", store_history=False)
    k.kc.history(hist_access_type="tail", n=2, output=False, raw=True)
    m = k.kc.get_shell_msg(timeout=10)
    assert m["content"]["status"] == "ok"
    assert [h[1:] for h in m["content"]["history"]] == [[2, "x=1"], [3, "echo beta"]]
    session = m["content"]["history"][0][0]
    k.kc.history(hist_access_type="search", pattern="echo*", output=False, raw=True)
    m = k.kc.get_shell_msg(timeout=10)
    assert [h[2] for h in m["content"]["history"]] == ["echo alpha", "echo beta"]
    k.kc.history(hist_access_type="range", session=0, start=2, stop=4, output=True, raw=True)
    m = k.kc.get_shell_msg(timeout=10)
    assert m["content"]["history"] == [[session, 2, ["x=1", None]],
                                       [session, 3, ["echo beta", None]]]
    # kept in a file beside the connection file, seen by the next kernel
    hist_file = Path(k.cf + ".history.jsonl")
    lines = [json.loads(x) for x in hist_file.read_text().splitlines()]
    assert [x["input"] for x in lines] == ["echo alpha", "x=1", "echo beta"]
    assert oct(hist_file.stat().st_mode & 0o777) == "0o600"
    k.close()
    k2 = kutil.Kernel("bash", k.workdir, args=("--sandbox", SANDBOX), key=b"another-key")
    try:
        k2.kc.history(hist_access_type="range", session=-1, start=1, stop=0, raw=True,
                      output=False)
        m = k2.kc.get_shell_msg(timeout=10)
        assert [h[2] for h in m["content"]["history"]] == ["echo alpha", "x=1", "echo beta"]
        assert m["content"]["history"][0][0] == session
    finally:
        k2.close()


# ---------------------------------------------------------------- shutdown, transports

def test_shutdown_request_on_control(bash):
    k = bash()
    run(k, "sleep 1000 & echo started")
    workers = descendants(k.proc.pid)
    assert workers  # the worker (and its sandbox) and the background sleep
    rep = kutil.control_request(k, "shutdown_request", {"restart": False})
    assert rep["msg_type"] == "shutdown_reply"
    assert rep["content"] == {"status": "ok", "restart": False}
    assert k.proc.wait(10) == 0
    time.sleep(0.2)
    assert [p for p in workers if pid_alive(p)] == []


def test_sigterm_clean_shutdown_ipc(bash):
    k = bash(transport="ipc")
    reply, iopub = run(k, "echo over-ipc")
    assert stream_text(iopub) == "over-ipc\n"
    workers = descendants(k.proc.pid)
    assert workers
    ipc_files = list(k.workdir.glob("k-*"))
    assert len(ipc_files) == 5
    k.proc.send_signal(signal.SIGTERM)
    assert k.proc.wait(10) == 0
    time.sleep(0.2)
    assert [p for p in workers if pid_alive(p)] == []
    assert list(k.workdir.glob("k-*")) == []


def test_background_job_output_after_cell(bash):
    k = bash()
    reply, iopub = run(k, "(sleep 0.3; echo late) & echo now")
    assert stream_text(iopub) == "now\n"
    # the late output is published (attributed to the last request), not lost
    deadline = time.monotonic() + 10
    late = ""
    while time.monotonic() < deadline and "late" not in late:
        try:
            m = k.kc.get_iopub_msg(timeout=0.5)
        except Exception:
            continue
        if m["msg_type"] == "stream":
            late += m["content"]["text"]
    assert late == "late\n"


# ---------------------------------------------------------------- command line

def cli(*args, timeout=10):
    return subprocess.run([KERNEL, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_cli_help_and_version():
    r = cli("--help")
    assert r.returncode == 0
    for opt in ["-f", "--workspace", "--sandbox", "--memory", "--network",
                "--interrupt-grace", "--bash"]:
        assert opt in r.stdout
    r = cli("--version")
    assert r.returncode == 0 and "kernel-bash" in r.stdout and "5.3" in r.stdout


def test_cli_errors(tmp_path):
    r = cli("--frobnicate")
    assert r.returncode == 2 and "unknown option '--frobnicate'" in r.stderr
    r = cli()
    assert r.returncode == 2 and "CONNECTION_FILE" in r.stderr
    r = cli("-f", str(tmp_path / "missing.json"), "--sandbox", "none")
    assert r.returncode == 1 and "missing.json" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = cli("-f", str(bad), "--sandbox", "none")
    assert r.returncode == 1 and "bad.json" in r.stderr
    bad.write_text(json.dumps({"transport": "tcp", "ip": "127.0.0.1"}))
    r = cli("-f", str(bad), "--sandbox", "none")
    assert r.returncode == 1 and "bad.json" in r.stderr
    r = cli("-f", str(bad), "--sandbox", "loose")
    assert r.returncode == 2 and "--sandbox" in r.stderr
    r = cli("-f", str(bad), "--memory", "lots")
    assert r.returncode == 2 and "--memory" in r.stderr
    r = cli("-f", str(bad), "--interrupt-grace")
    assert r.returncode == 2
    good = tmp_path / "good.json"
    from jupyter_client.connect import write_connection_file
    write_connection_file(str(good))
    r = cli("-f", str(good), "--sandbox", "none", "--workspace", str(tmp_path / "nope"))
    assert r.returncode == 1 and "nope" in r.stderr


def test_option_equals_form_and_limits(bash):
    k = bash("--interrupt-grace=2", "--memory=1G", "--procs=128", "--open-files=256",
             "--file-size=10M", "--network=off", "--tmp-size=64M")
    reply, iopub = run(k, "ulimit -n; ulimit -f")
    assert stream_text(iopub).split() == ["256", str(10 * 1024)]
