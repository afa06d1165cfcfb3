"""The sandbox must not break real work: the scientific stack,
subprocess, multiprocessing, pip, workspace files with sane ownership,
signals, exit statuses, limit messages, clear errors."""
import os
import queue
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kutil
import sbxutil
from sbxutil import PY


@pytest.fixture(params=sbxutil.USERS)
def sbx(request):
    s = sbxutil.Sandboxes(request.param)
    yield s
    s.close()


SCIENCE = r'''
import numpy as np, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
a = np.linalg.inv(np.array([[2.0, 0.0], [0.0, 4.0]]))
df = pd.DataFrame({"x": range(5), "y": [v * v for v in range(5)]})
fig, ax = plt.subplots()
ax.plot(df.x, df.y)
fig.savefig("plot.png")
df.to_csv("table.csv", index=False)
print("SUM", df.y.sum(), a[1][1])
'''


def test_scientific_stack(sbx):
    r = sbx.run(SCIENCE, "python", ["--ro", "/usr"], timeout=120)
    assert r.rc == 0, r
    assert "SUM 30 0.25" in r.out, r
    png = sbx.ws / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_uid == sbx.expected_uid()
    assert (sbx.ws / "table.csv").read_text().startswith("x,y")


def test_scientific_stack_in_kernel(sbx):
    text, _ = sbx.kernel_run("python", SCIENCE, ["--python", PY], timeout=120)
    assert "SUM 30 0.25" in text, text
    assert (sbx.ws / "plot.png").stat().st_uid == sbx.expected_uid()


def test_subprocess_and_multiprocessing(sbx):
    code = r'''
import multiprocessing as mp, subprocess
def sq(v):
    return v * v
if __name__ == "__main__":
    print("SUB", subprocess.run(["/bin/echo", "hi"], capture_output=True, text=True).stdout.strip())
    with mp.Pool(2) as p:
        print("POOL", sum(p.map(sq, range(10))))
    q = mp.Queue(); pr = mp.Process(target=q.put, args=(7,)); pr.start(); print("PROC", q.get()); pr.join()
'''
    (sbx.ws / "mpjob.py").write_text(code)
    if sbx.user == "nobody":
        os.chown(sbx.ws / "mpjob.py", sbxutil.NOBODY, sbxutil.NOBODY)
    r = sbx.run(f"{PY} mpjob.py", "bash", timeout=120)
    assert r.rc == 0, r
    assert "SUB hi" in r.out and "POOL 285" in r.out and "PROC 7" in r.out, r


def test_pip_version(sbx):
    r = sbx.run(f"{PY} -m pip --version", "bash", timeout=120)
    assert r.rc == 0, r
    assert r.out.startswith("pip "), r


def test_bash_tools_work(sbx):
    r = sbx.run("set -e; echo data > f.txt; grep -c data f.txt; sort < f.txt | wc -l; "
                "ls /tmp >/dev/null; echo x > /tmp/t && cat /tmp/t; "
                "echo y > /dev/shm/s && cat /dev/shm/s; date +%Y >/dev/null; "
                "whoami; hostname; echo err >&2", "bash")
    assert r.rc == 0, r
    assert r.out.split() == ["1", "1", "x", "y", r.out.split()[4], "sandbox"], r
    assert "err" in r.err


def hold(marker):
    """Sandboxed bash that ends as a process whose command line starts with
    marker and stays until the test creates `go` in the workspace: the
    host's view of it is read while it surely runs (a `sleep 1` there ended
    before a loaded host's pgrep saw it)."""
    return f"exec -a {marker} sh -c 'while [ ! -e go ]; do sleep 0.05; done'"


def worker_host_uids(sbx, marker, run):
    """Starts run() in a thread; the sandboxed code ends with hold(marker).
    Returns the host's view of the worker's uids and run()'s result."""
    import threading
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", run()), daemon=True)
    t.start()
    try:
        pid = sbxutil.wait_pid_of("^" + marker, timeout=120, running=t.is_alive)
        ids = sbxutil.host_status_ids(pid)
    finally:
        (sbx.ws / "go").touch()
        t.join(60)
    assert "r" in box, "the sandboxed command did not finish"
    return ids, box["r"]


@pytest.mark.skipif(not sbxutil.IS_ROOT, reason="needs root to chown the workspace")
def test_workspace_owner_is_the_sandbox_user(tmp_path):
    """A root caller's sandbox in alice's workspace is alice inside, writes
    files owned by alice, but runs on the host as its own unprivileged uid."""
    s = sbxutil.Sandboxes("invoker")
    try:
        os.chown(s.ws, 4321, 4321)
        os.chmod(s.ws, 0o750)
        marker = f"kmsbx-owner-{os.getpid()}-{time.monotonic_ns()}"
        ids, r = worker_host_uids(
            s, marker, lambda: s.run(f"id -u; id -g; echo x > made-here; mkdir d; " + hold(marker), "bash"))
        assert r.rc == 0, r
        assert r.out.split()[:2] == ["4321", "4321"], r
        st = (s.ws / "made-here").stat()
        assert (st.st_uid, st.st_gid) == (4321, 4321)
        assert (s.ws / "d").stat().st_uid == 4321
        assert 0 not in ids and 4321 not in ids, ids  # a dedicated uid, not alice's
        st = s.ws.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (4321, 4321, 0o750)
    finally:
        s.close()


@pytest.mark.skipif(not sbxutil.IS_ROOT, reason="root-owned workspaces need root")
def test_root_owned_workspace_stays_root_owned(tmp_path):
    """Files written in the workspace appear on the host with sane ownership:
    a root-owned workspace is never chowned; the sandbox writes it through an
    idmapped mount, so new files are root's on disk, while the worker never
    runs as root on the host."""
    s = sbxutil.Sandboxes("invoker")
    try:
        (s.ws / "sub").mkdir()
        before = s.ws.stat()
        assert before.st_uid == 0
        marker = f"kmsbx-rootws-{os.getpid()}-{time.monotonic_ns()}"
        ids, r = worker_host_uids(
            s, marker, lambda: s.run(f"id -u; echo x > f; echo y > sub/g; " + hold(marker), "bash"))
        assert r.rc == 0, r
        assert r.out.split()[0] == str(sbxutil.NOBODY), r  # nobody inside
        assert 0 not in ids, ids  # never root on the host
        for f in ("f", "sub/g"):
            st = (s.ws / f).stat()
            assert (st.st_uid, st.st_gid) == (0, 0), f
        after = s.ws.stat()
        assert (after.st_uid, after.st_gid, after.st_mode) == \
            (before.st_uid, before.st_gid, before.st_mode)
    finally:
        s.close()


def test_workspace_dir_unchanged_after_a_kernel(sbx):
    """The workspace directory's owner and mode are the same after a kernel
    ran (and wrote) in it."""
    os.chmod(sbx.ws, 0o751)
    before = sbx.ws.stat()
    text, _ = sbx.kernel_run("bash", "echo hi > from-kernel; id -u")
    after = sbx.ws.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == \
        (before.st_uid, before.st_gid, before.st_mode), text
    st = (sbx.ws / "from-kernel").stat()
    assert (st.st_uid, st.st_gid) == (before.st_uid, before.st_gid), text


@pytest.mark.skipif(not sbxutil.IS_ROOT, reason="mounting a test filesystem needs root")
def test_workspace_without_idmap_support(tmp_path):
    """ramfs cannot be idmapped: a root-owned workspace there is refused with
    a message naming the problem and the way out (never chowned); one owned
    by an unprivileged user still works, the sandbox running as that user."""
    s = sbxutil.Sandboxes("invoker")
    mnt = s.base / "ramfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "-o", "mode=0755", "kmsbx", str(mnt)], check=True,
                   timeout=30)
    try:
        r = subprocess.run([s.tool, "--workspace", str(mnt), "--", "/bin/true"],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 125, r
        assert "owned by root" in r.stderr and "idmapped" in r.stderr, r
        assert "--sandbox none" in r.stderr, r
        assert mnt.stat().st_uid == 0
        os.chown(mnt, 4321, 4321)
        r = subprocess.run([s.tool, "--workspace", str(mnt), "--", "/bin/bash", "-c",
                            "id -u; echo x > f"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0 and r.stdout.split()[0] == "4321", r
        assert (mnt / "f").stat().st_uid == 4321
    finally:
        subprocess.run(["umount", "-l", str(mnt)], timeout=30)
        s.close()


def test_exit_status_and_signals(sbx):
    assert sbx.run("exit 3").rc == 3
    assert sbx.run("kill -9 $$").rc == 128 + 9
    # SIGINT reaches the worker's process group through the sandbox's init
    cmd = [*sbx.prefix, sbx.tool, "--workspace", str(sbx.ws), "--", "/bin/bash", "-c",
           "trap 'echo GOT-INT; exit 7' INT; echo ready; while :; do sleep 0.1; done"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "GOT-INT" in out, (out, err)
    assert p.returncode == 7, (out, err)


BLOCKER = r"""/usr/bin/python3 -c '
import os, signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
open("ready", "w").close()
end = time.monotonic() + 60
while not os.path.exists("go") and time.monotonic() < end:
    time.sleep(0.05)
si = signal.sigtimedwait([signal.SIGINT], 30)
open("sender", "w").write(str(si.si_pid if si else None))
' %s"""


def sigint_pending(pid):
    """True when SIGINT is pending (blocked, queued) for host process pid."""
    bits = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("ShdPnd:", "SigPnd:")):
            bits |= int(line.split()[1], 16)
    return bool(bits & (1 << (signal.SIGINT - 1)))


def test_interrupt_is_delivered_before_the_reply(sbx):
    """sandbox_signal() delivers to the worker's process group itself: by the
    time the kernel answers interrupt_request, a process of the cell that
    blocks SIGINT already has it pending (a signal still on its way through
    the sandbox's init could instead hit the next cell), and it came from
    outside the sandbox (si_pid 0: the sender is in an ancestor pid
    namespace), not from the sandbox's init (si_pid 1), which forwards only
    when the worker's host pid is unknown."""
    k = sbx.kernel("bash")
    token = "kmblk" + os.urandom(6).hex()
    msg_id = k.kc.execute(BLOCKER % token + "\necho cell-done")
    deadline = time.monotonic() + 60
    while not (sbx.ws / "ready").exists():
        assert time.monotonic() < deadline and k.proc.poll() is None, k.log_text()
        time.sleep(0.05)
    pid = sbxutil.wait_pid_of(token)
    try:
        assert not sigint_pending(pid)
        rep = kutil.control_request(k, "interrupt_request", timeout=30)
        assert rep is not None and rep["content"]["status"] == "ok", rep
        assert sigint_pending(pid), Path(f"/proc/{pid}/status").read_text()
    finally:
        (sbx.ws / "go").touch()
    k.collect(msg_id, timeout=60)
    assert (sbx.ws / "sender").read_text() == "0", k.log_text()
    k.assert_alive()


def collect_both(k, ids, timeout):
    """Like Kernel.collect for several requests at once: {msg_id: {reply,
    iopub}} (collect() alone would drop the second request's messages)."""
    got = {i: {"reply": None, "iopub": [], "idle": False} for i in ids}
    deadline = time.monotonic() + timeout
    while not all(g["idle"] and g["reply"] for g in got.values()):
        assert time.monotonic() < deadline, (got, k.log_text())
        try:
            m = k.kc.get_shell_msg(timeout=0.01)
            if m["parent_header"].get("msg_id") in got:
                got[m["parent_header"]["msg_id"]]["reply"] = m
        except queue.Empty:
            pass
        try:
            m = k.kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            continue
        g = got.get(m["parent_header"].get("msg_id"))
        if g is not None:
            g["iopub"].append(m)
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                g["idle"] = True
    return got


def test_interrupt_never_reaches_the_next_cell(sbx):
    """Interrupting a cell and running the next one at once: the next cell's
    child processes never get the interrupt meant for the previous cell."""
    k = sbx.kernel("bash")
    for i in range(6):
        # stop_on_error off: the queued next cell must run, not be aborted.
        msg_id = k.kc.execute(f"echo started-{i}; sleep 30; echo not-reached",
                              stop_on_error=False)
        deadline = time.monotonic() + 60
        seen = ""
        while f"started-{i}" not in seen:
            left = deadline - time.monotonic()
            assert left > 0, (seen, k.log_text())
            try:
                m = k.kc.get_iopub_msg(timeout=min(left, 1))
            except queue.Empty:
                continue
            if m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "stream":
                seen += m["content"]["text"]
        rep = kutil.control_request(k, "interrupt_request", timeout=30)
        assert rep is not None and rep["content"]["status"] == "ok", rep
        # Queued right away, before the interrupted cell's reply.
        nxt = k.kc.execute(f"sleep 1; echo survived-{i} $?")
        got = collect_both(k, (msg_id, nxt), timeout=60)
        assert "not-reached" not in kutil.stream_text(got[msg_id]["iopub"]), got
        r = got[nxt]
        out = kutil.stream_text(r["iopub"])
        assert f"survived-{i} 0" in out, (r, k.log_text())
        assert r["reply"]["content"]["status"] == "ok", r


def test_file_size_limit_message(sbx):
    r = sbx.run("head -c 3000000 /dev/zero > big", "bash", ["--fsize", "1m"])
    assert r.rc == 128 + signal.SIGXFSZ, r
    assert "file size limit exceeded (limit 1 MiB)" in r.err, r
    assert (sbx.ws / "big").stat().st_size == 1 << 20


def test_open_files_limit(sbx):
    r = sbx.run("import os\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', 0))\n"
                "except OSError as e:\n    print('LIMIT', len(fds), e.errno)\n", "python",
                ["--nofile", "64"])
    assert r.rc == 0, r
    assert "LIMIT" in r.out and int(r.out.split()[1]) < 64 and r.out.split()[2] == "24", r


def test_cpu_time_is_measured(sbx):
    r = sbx.run("i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done", "bash")
    assert r.rc == 0, r
    ns = int(r.err.split("cpu_ns=")[1].split()[0])
    # cgroup cpuacct, or without cgroups the monitor's wait4() figure (the
    # tool reads it after the sandbox ended): the loop takes well over 10 ms
    assert ns > 10_000_000, r


def test_check_and_protections(sbx):
    r = subprocess.run([*sbx.prefix, sbx.tool, "--check"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r
    assert "check: ok" in r.stdout
    for p in ("user-namespace", "pid-namespace", "network-namespace", "seccomp",
              "no-new-privs", "capabilities-dropped", "network-off", "rlimit-nproc"):
        assert f'"{p}"' in r.stdout, r.stdout
    if sbxutil.IS_ROOT and sbx.user == "invoker":
        assert '"cgroup-v1-memory"' in r.stdout or '"cgroup-v2-memory"' in r.stdout, r.stdout


def test_clear_errors(sbx):
    r = sbx.run("true", "bash", ["--ro", "/nonexistent-kmsbx"])
    assert r.rc == 125 and "/nonexistent-kmsbx" in r.err and "No such file" in r.err, r
    r = subprocess.run([*sbx.prefix, sbx.tool, "--workspace", "/nonexistent-kmsbx-ws", "--",
                        "/bin/true"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 125 and "workspace /nonexistent-kmsbx-ws" in r.stderr, r
    r = subprocess.run([*sbx.prefix, sbx.tool, "--workspace", str(sbx.ws), "--", "true"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 125 and "not an absolute path" in r.stderr, r
    r = subprocess.run([*sbx.prefix, sbx.tool, "--workspace", str(sbx.ws), "--",
                        "/no/such/binary"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 125 and "exec /no/such/binary" in r.stderr, r


def test_level_none_still_runs(sbx):
    r = sbx.run("echo plain; pwd", "bash", ["--level", "none"])
    assert r.rc == 0 and r.out.split() == ["plain", str(sbx.ws)], r


def test_interpreter_prefix_in_ro_paths(sbx):
    """A Python outside /usr (pyenv, uv) works when its prefix is bound."""
    found = shutil.which("python3")
    if not found:
        pytest.skip("no python3 on PATH")
    real = subprocess.run([found, "-c", "import sys; print(sys.executable); print(sys.prefix)"],
                          capture_output=True, text=True, timeout=30)
    if real.returncode != 0:
        pytest.skip("python3 on PATH does not run")
    exe, prefix = real.stdout.split()
    exe = os.path.realpath(exe)
    if prefix.startswith("/usr"):
        pytest.skip("python3 on PATH is the system one")
    if sbx.user == "nobody" and subprocess.run(
            [*sbx.prefix, "/usr/bin/stat", prefix], capture_output=True).returncode != 0:
        pytest.skip(f"{exe} is not readable by nobody on the host")
    cmd = [*sbx.prefix, sbx.tool, "--workspace", str(sbx.ws), "--ro", prefix, "--", exe, "-c",
           "import sys, os; print(sys.version_info[0], os.getcwd())"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r
    assert r.stdout.split() == ["3", str(sbx.ws)], r


def test_python_traceback_paths_match_the_host(sbx):
    (sbx.ws / "boom.py").write_text("def f():\n    1/0\nf()\n")
    if sbx.user == "nobody":
        os.chown(sbx.ws / "boom.py", sbxutil.NOBODY, sbxutil.NOBODY)
    r = sbx.run(f"{PY} boom.py", "bash")
    assert r.rc == 1
    assert f'File "{sbx.ws}/boom.py", line 2' in r.err, r


def test_cell_cpu_time_in_reply_metadata(sbx):
    """Per-execution CPU time reaches reply metadata; for nobody (no cgroups)
    it comes from the sandbox's own process tree, children included."""
    k = sbx.kernel("bash")
    _, r = k.execute("i=0; while [ $i -lt 60000 ]; do i=$((i+1)); done; "
                     "( j=0; while [ $j -lt 60000 ]; do j=$((j+1)); done )", timeout=120)
    md = r["reply"]["metadata"]
    assert r["reply"]["content"]["status"] == "ok", r
    assert md.get("cpu_time_ms", 0) > 10, md  # two loops, well over 10 ms of CPU
    k.assert_alive()


@pytest.mark.skipif(not sbxutil.IS_ROOT, reason="mounting cgroup2 needs root")
def test_cgroup_v2_starts_init_inside_its_cgroup(sbx):
    """On a cgroup v2 host the sandbox's processes live in its own cgroup
    (created with clone3(CLONE_INTO_CGROUP)). This host may be v1: a private
    mount namespace with a cgroup2 mount on /sys/fs/cgroup stands in."""
    if sbx.user != "invoker":
        pytest.skip("cgroups are created by root callers only")
    script = f"""
set -e
mount -t cgroup2 none /sys/fs/cgroup
{sbx.tool} --workspace {sbx.ws} -- /bin/bash -c 'exec -a kmsbx-v2-worker sleep 1' &
for i in $(seq 100); do
  d=$(ls -d /sys/fs/cgroup/kernelmgr-sandbox-* 2>/dev/null | head -1)
  n=$(cat "$d/cgroup.procs" 2>/dev/null | wc -l)
  [ -n "$d" ] && [ "$n" -ge 2 ] && {{ echo "PROCS $n"; break; }}
  sleep 0.05
done
wait
ls -d /sys/fs/cgroup/kernelmgr-sandbox-* 2>/dev/null && echo LEFTOVER || true
"""
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "/bin/bash", "-c", script],
                       capture_output=True, text=True, timeout=60)
    if "mount" in r.stderr and r.returncode != 0 and "PROCS" not in r.stdout:
        pytest.skip(f"cannot mount cgroup2 here: {r.stderr}")
    assert r.returncode == 0, r
    # init and the worker at least, and the cgroup is removed at the end
    assert "PROCS" in r.stdout and int(r.stdout.split("PROCS")[1].split()[0]) >= 2, r
    assert "LEFTOVER" not in r.stdout, r


def _memory_cgroup_dir(pid):
    """The directory of pid's memory cgroup (cgroup v2 or v1), or None."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if v2 and ctrls == "":
            return Path("/sys/fs/cgroup" + path)
        if not v2 and "memory" in ctrls.split(","):
            return Path("/sys/fs/cgroup/memory" + path)
    return None


def test_stale_cgroup_of_a_reused_pid_does_not_cost_the_limits(sbx):
    """A kernel SIGKILLed without sandbox_destroy() leaves an empty cgroup
    named after its pid; a later process given the same pid (pids are
    reused) still gets its memory limit: the stale cgroup is collected, not
    collided with."""
    if not (sbxutil.IS_ROOT and sbx.user == "invoker"):
        pytest.skip("memory cgroups are created by root's sandboxes")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the later holder of the pid: waits until the stale cgroup exists
        os.close(w)
        os.read(r, 1)
        try:
            out = os.open(str(sbx.base / "check.out"), os.O_WRONLY | os.O_CREAT, 0o644)
            os.dup2(out, 1)
            os.execv(sbx.tool, [sbx.tool, "--check"])
        finally:
            os._exit(127)
    os.close(r)
    stale = None
    try:
        d = _memory_cgroup_dir(pid)
        if d is None or not os.access(d, os.W_OK):
            pytest.skip(f"no writable memory cgroup for the test ({d})")
        stale = d / f"kernelmgr-sandbox-{pid}-0"
        stale.mkdir()
        os.write(w, b"x")
    finally:
        os.close(w)
        _, status = os.waitpid(pid, 0)
    text = (sbx.base / "check.out").read_text()
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert '"cgroup-v1-memory"' in text or '"cgroup-v2-memory"' in text, text
    assert not stale.exists(), f"{stale} was not collected"
