"""Fault injection: the manager stalls (SIGSTOP, swap, a debugger) while a
cell runs. A cell that finished within its timeout by the kernel's clock is
reported as finished — never as a timeout because the manager woke up late —
and a kernel already idle for that cell is never interrupted. A cell that
really runs past its timeout is still a timeout.

The daemon is stopped and continued on conditions: the kernel's own IOPub
(a subscriber of the test's, on the session's connection file) says when it
took the cell up and when it went idle.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mgrutil import KM, have_kernel  # noqa: E402
import kutil  # noqa: E402

pytestmark = pytest.mark.skipif(not have_kernel("python"), reason="kernels not built")

CELL = 'import time; time.sleep(2); print("cell-done")'
TIMEOUT = 10


def one(mgr, session, code, *args):
    rc, res, p = mgr.exec(session, code, "--lang", "python", *args)
    assert len(res) == 1, (rc, p.stdout, p.stderr)
    return rc, res[0]


def interrupt_lines(mgr):
    """What the session's kernels logged about interrupts (the kernel server
    logs every one it receives, also "interrupt: nothing is running")."""
    out = []
    for log in mgr.home.rglob("*.log"):
        if log.name == "daemon.log":
            continue
        out += [ln for ln in log.read_text(errors="replace").splitlines() if "interrupt" in ln]
    return out


class IOPub:
    """A subscriber of the kernel's IOPub through its connection file."""

    def __init__(self, connection_file):
        from jupyter_client import BlockingKernelClient
        self.kc = BlockingKernelClient(connection_file=connection_file)
        self.kc.load_connection_file()
        self.kc.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
        # kernel_info until IOPub delivers: the subscription has reached the kernel
        self.kc.wait_for_ready(timeout=60)
        self.seen = []

    def wait(self, pred, timeout, what):
        deadline = time.monotonic() + timeout
        for m in self.seen:
            if pred(m):
                return m
        while time.monotonic() < deadline:
            try:
                m = self.kc.get_iopub_msg(timeout=0.2)
            except Exception:  # queue.Empty
                continue
            self.seen.append(m)
            if pred(m):
                return m
        raise AssertionError(f"the kernel's IOPub never showed {what}; saw "
                             f"{[x['msg_type'] for x in self.seen][-20:]}")

    def close(self):
        self.kc.stop_channels()


def start_session(mgr):
    rc, r = one(mgr, "st", "x = 41")
    assert rc == 0 and r["status"] == "ok", r
    p = mgr.run("connection-file", "st", "--lang", "python")
    assert p.returncode == 0, p.stderr
    cf = p.stdout.strip().splitlines()[-1]
    assert os.path.exists(cf), p.stdout
    pid = mgr.daemon_pid()
    assert pid and kutil.alive(pid)
    return cf, pid


def test_a_cell_finished_while_the_daemon_was_stopped_is_not_a_timeout(make_mgr):
    mgr = make_mgr()
    cf, daemon = start_session(mgr)
    sub = IOPub(cf)
    interrupts_before = interrupt_lines(mgr)
    stopped = False
    p = subprocess.Popen([KM, "exec", "--session", "st", "--lang", "python", "--json",
                          "--timeout", str(TIMEOUT), "-c", CELL],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mgr.env)
    try:
        t0 = time.monotonic()
        # the kernel took the cell up: stop the daemon while it sleeps
        started = sub.wait(lambda m: m["msg_type"] == "execute_input"
                           and "cell-done" in m["content"].get("code", ""),
                           60, "the cell's execute_input")
        os.kill(daemon, signal.SIGSTOP)
        stopped = True
        cell = started["parent_header"]["msg_id"]
        # the kernel finished the cell (its reply and idle now wait for the
        # stopped daemon) ...
        sub.wait(lambda m: m["msg_type"] == "status"
                 and m["parent_header"].get("msg_id") == cell
                 and m["content"]["execution_state"] == "idle",
                 60, "the cell's idle status")
        # ... and by the daemon's clock the deadline has passed
        kutil.poll_until(time.monotonic, lambda now: now - t0 > TIMEOUT + 1,
                         deadline=TIMEOUT + 30, msg="the daemon's deadline to pass")
        assert p.poll() is None, "the exec ended while the daemon was stopped"
        os.kill(daemon, signal.SIGCONT)
        stopped = False
        out, err = p.communicate(timeout=120)
    finally:
        if stopped:
            os.kill(daemon, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait()
        sub.close()
    res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(res) == 1, (out, err)
    r = res[0]
    assert p.returncode == 0, (r, err)
    assert r["status"] == "ok", r
    assert r["error"] is None, r
    assert r["exit_code"] == 0, r
    assert "cell-done" in r["stdout"], r
    # the kernel was not interrupted: it logged no interrupt, and the next
    # cell runs in the same state without a KeyboardInterrupt
    assert interrupt_lines(mgr) == interrupts_before
    rc, r2 = one(mgr, "st", "print(x + 1)")
    assert rc == 0 and r2["status"] == "ok", r2
    assert r2["stdout"] == "42\n", r2
    assert "KeyboardInterrupt" not in json.dumps(r2)
    assert r2["kernel"]["restarted"] is False and r2["kernel"]["state_preserved"] is True
    # and the session's history has the finished cell as it was
    hist = [json.loads(line) for line in
            (mgr.home / "sessions" / "st" / "history.jsonl").read_text().splitlines()]
    done = [h for h in hist if h.get("event") == "finished" and "cell-done" in json.dumps(h)]
    assert done and "Timeout" not in json.dumps(done[-1]), done


def test_a_cell_that_runs_past_its_timeout_is_still_a_timeout(make_mgr):
    mgr = make_mgr()
    start_session(mgr)
    rc, r = one(mgr, "st", 'import time\nprint("before", flush=True)\ntime.sleep(600)',
                "--timeout", "2")
    assert rc == 1, r
    assert r["status"] == "timeout", r
    assert r["error"]["timeout"] is True, r
    assert r["exit_code"] == 124, r
    assert r["stdout"] == "before\n", r
    # interrupted, state kept
    rc, r2 = one(mgr, "st", "print(x)")
    assert rc == 0 and r2["stdout"] == "41\n", r2
    assert r2["kernel"]["state_preserved"] is True


def test_a_stall_after_the_interrupt_does_not_kill_a_kernel_that_stopped(make_mgr):
    """The timeout's interrupt was sent and the cell stopped within the
    grace, but the daemon was stopped until the grace had passed: the
    result is the timeout with the state kept, not a kill and restart."""
    grace = 3
    mgr = make_mgr({"interrupt_grace": grace})
    cf, daemon = start_session(mgr)
    sub = IOPub(cf)
    code = ("import time\ntry:\n    time.sleep(600)\nexcept KeyboardInterrupt:\n"
            "    print('got interrupt', flush=True)\n    time.sleep(1)\n    raise\n")
    stopped = False
    p = subprocess.Popen([KM, "exec", "--session", "st", "--lang", "python", "--json",
                          "--timeout", "2", "-c", code],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=mgr.env)
    try:
        # the daemon interrupted the cell at its timeout: stop it there
        got = sub.wait(lambda m: m["msg_type"] == "stream"
                       and "got interrupt" in m["content"]["text"], 60, "the interrupt arrive")
        os.kill(daemon, signal.SIGSTOP)
        stopped = True
        t_int = time.monotonic()
        cell = got["parent_header"]["msg_id"]
        sub.wait(lambda m: m["msg_type"] == "status"
                 and m["parent_header"].get("msg_id") == cell
                 and m["content"]["execution_state"] == "idle", 60, "the cell's idle status")
        # by the daemon's clock, the interrupt's grace (and its margin) is over
        kutil.poll_until(time.monotonic, lambda now: now - t_int > grace + 4,
                         deadline=grace + 30, msg="the daemon's grace to pass")
        os.kill(daemon, signal.SIGCONT)
        stopped = False
        out, err = p.communicate(timeout=120)
    finally:
        if stopped:
            os.kill(daemon, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait()
        sub.close()
    res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(res) == 1, (out, err)
    r = res[0]
    assert r["status"] == "timeout", r
    assert r["kernel"]["state_preserved"] is True and r["kernel"]["restarted"] is False, r
    assert "got interrupt" in r["stdout"], r
    rc, r2 = one(mgr, "st", "print(x)")
    assert rc == 0 and r2["stdout"] == "41\n", r2
    assert r2["kernel"]["restarted"] is False and r2["kernel"]["state_preserved"] is True
