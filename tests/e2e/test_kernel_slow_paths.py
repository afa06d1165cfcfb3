"""Regressions found by the benchmarks: a subscriber that stops
reading must not stall the kernel for everyone, and the per-cell CPU-time
query (a walk of /proc without cgroups) runs once per cell, not twice."""
import collections
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import zmq

import kutil

SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")


@pytest.mark.flood
def test_stuck_iopub_subscriber_does_not_stall_others(kernel_factory):
    k = kernel_factory("python", args=("--sandbox", SANDBOX))
    # A subscriber that connects, subscribes and then never reads: an idle
    # client that does not poll IOPub, or a suspended `jupyter console`.
    # Small buffers so that it fills up after little output.
    ctx = zmq.Context.instance()
    stuck = ctx.socket(zmq.SUB)
    stuck.setsockopt(zmq.LINGER, 0)
    stuck.setsockopt(zmq.RCVHWM, 1)
    stuck.setsockopt(zmq.RCVBUF, 4096)
    stuck.setsockopt(zmq.SUBSCRIBE, b"")
    stuck.connect(k.kc._make_url("iopub"))
    try:
        # The subscription is in place once the stuck socket has seen one
        # message (read just this one, then never again).
        deadline = time.monotonic() + 10
        while not stuck.poll(50):
            k.execute("pass", timeout=10)
            assert time.monotonic() < deadline, "the subscriber never got connected"
        stuck.recv_multipart()
        # Far more messages than the stuck subscriber's queue (1000 messages)
        # and the socket buffers can hold: many small display messages.
        n_cells, per_cell = 12, 1500
        for i in range(n_cells):
            _, r = k.execute(f"for j in range({per_cell}): display('c{i}-%d' % j)", timeout=60)
            assert r["reply"]["content"]["status"] == "ok"
            shown = [m["content"]["data"]["text/plain"] for m in kutil.of_type(r["iopub"],
                                                                               "display_data")]
            # The client that reads loses nothing, in order.
            assert shown == [repr(f"c{i}-{j}") for j in range(per_cell)]
        _, r = k.execute("print('still fine')", timeout=30)
        assert kutil.stream_text(r["iopub"]) == "still fine\n"
        assert "IOPub subscriber has not read anything" in k.log_text()
    finally:
        stuck.close()


def test_slow_reader_gets_everything(kernel_factory):
    """Back-pressure still holds for a client that reads slowly: a flood
    bigger than any queue arrives complete."""
    k = kernel_factory("bash", args=("--sandbox", SANDBOX))
    _, r = k.execute("seq 1 300000", timeout=60)
    assert r["reply"]["content"]["status"] == "ok"
    out = kutil.stream_text(r["iopub"])
    assert out == "".join(f"{i}\n" for i in range(1, 300001))
    assert "IOPub subscriber" not in k.log_text()


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_cpu_time_query_once_per_cell(tmp_path):
    """Without cgroups, sandbox_cpu_ns() walks /proc (the sandbox's tree); the server
    must ask once per cell boundary (the end of one cell is the start of the
    next), not at both ends."""
    trace = tmp_path / "strace.txt"
    wrapper = tmp_path / "kernel-bash"
    wrapper.write_text("#!/bin/sh\nexec strace -f -qq -e trace=openat -o %s %s \"$@\"\n"
                       % (trace, kutil.binary("kernel-bash")))
    wrapper.chmod(0o755)
    orig = kutil.binary
    kutil.binary = lambda name: str(wrapper) if name == "kernel-bash" else orig(name)
    try:
        k = kutil.Kernel("bash", tmp_path / "k", args=("--sandbox", "none"))
    finally:
        kutil.binary = orig
    try:
        k.execute("true", timeout=30)

        def proc_walks():
            # Without cgroups a query walks the sandbox's process tree from its
            # root, reading /proc/ROOT/stat once per query: the most-read stat
            # file counts the queries (older versions scanned all of /proc).
            text = trace.read_text(errors="replace")
            full = len(re.findall(r'openat\([^,]*, "/proc", [^)]*O_DIRECTORY', text))
            per_pid = collections.Counter(re.findall(r'openat\([^,]*, "/proc/(\d+)/stat"', text))
            return full + (max(per_pid.values()) if per_pid else 0)

        before = proc_walks()
        cells = 20
        for _ in range(cells):
            _, r = k.execute("x=1", timeout=30)
            md = r["reply"]["metadata"]
            assert r["reply"]["content"]["status"] == "ok"
            assert md.get("cpu_time_ms", 0) >= 0
        # a CPU-bound cell still gets its CPU time
        _, r = k.execute("i=0; while ((i < 200000)); do ((i++)); done", timeout=60)
        assert r["reply"]["metadata"]["cpu_time_ms"] > 50
        walks = proc_walks() - before
        assert walks >= 1, "the trace did not see the /proc walk at all"
        assert walks <= cells + 1 + 1, f"{walks} walks of /proc for {cells + 1} cells"
    finally:
        # k.proc is strace: SIGTERM makes it detach and leave the kernel
        # running. End the traced kernel itself (strace then exits with it),
        # then check that nothing of it is left.
        tree = kutil.descendants(k.proc.pid)
        for pid in tree:
            if Path(f"/proc/{pid}/comm").exists() and \
                    Path(f"/proc/{pid}/comm").read_text().strip() == "kernel-bash":
                os.kill(pid, signal.SIGTERM)
                break
        try:
            k.proc.wait(15)
        except subprocess.TimeoutExpired:
            pass
        k.close()
        assert kutil.wait_dead(tree) == [], "the traced kernel outlived the test"


# ---------------------------------------------------------------- python output buffering
# The driver block-buffers stdout (one write() per 8 KiB, not per print);
# these pin down what must not change for the user.

def test_python_output_streams_during_a_long_cell(kernel_factory):
    k = kernel_factory("python", args=("--sandbox", SANDBOX))
    _, r = k.execute("import time\nprint('first')\ntime.sleep(1)\nprint('second')", timeout=30)
    texts = [m["content"]["text"] for m in kutil.of_type(r["iopub"], "stream")]
    # 'first' was published while the cell slept, not held until its end
    assert texts == ["first\n", "second\n"]


def test_python_buffered_output_and_fd_writers(kernel_factory):
    k = kernel_factory("python", args=("--sandbox", SANDBOX))
    code = ("import os, subprocess, sys\n"
            "print('a', end='')\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    print('child')\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "print('b')\n"
            "subprocess.run(['echo', 'c'])\n"
            "print('d', end='')\n"
            "os.write(1, b'e\\n')\n"
            "print('f', end='')\n"
            "os.execv('/bin/sh', ['sh', '-c', 'echo g']) if os.fork() == 0 else os.wait()\n"
            "print('h')\n")
    _, r = k.execute(code, timeout=30)
    assert r["reply"]["content"]["status"] == "ok", r["reply"]["content"]
    # nothing lost, nothing doubled by fork, nothing overtaken
    assert kutil.stream_text(r["iopub"]) == "achild\nb\nc\nde\nfg\nh\n"


def test_python_stderr_is_not_held_back(kernel_factory):
    k = kernel_factory("python", args=("--sandbox", SANDBOX))
    _, r = k.execute("import sys, time\nsys.stderr.write('partial')\ntime.sleep(1)\n"
                     "print('x')", timeout=30)
    streams = [(m["content"]["name"], m["content"]["text"])
               for m in kutil.of_type(r["iopub"], "stream")]
    assert streams[0] == ("stderr", "partial")
    assert kutil.stream_text(r["iopub"]) == "x\n"
