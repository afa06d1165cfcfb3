"""How a strict sandbox starts (cold start): the steps taken off
its critical path change nothing a process can observe. The cgroup v1
grace-period warm-up (sbx_cgwarm.c) moves only a short-lived thread of the
caller into the cgroup it is already in; the idmapped workspace's
throwaway user-namespace creator is reaped by the monitor, not left as a
zombie. Behaviour only: nothing here asserts on a time."""
import time
from pathlib import Path

import pytest

import kutil
import sbxutil

V1_CTRLS = ("memory", "pids", "cpuacct")


@pytest.fixture(params=sbxutil.USERS)
def sbx(request):
    s = sbxutil.Sandboxes(request.param)
    yield s
    s.close()


def v1_cgroups(pid, tid=None):
    """{controller: path} of pid's (or its thread tid's) v1 hierarchies
    among V1_CTRLS."""
    f = Path(f"/proc/{pid}/task/{tid}/cgroup" if tid else f"/proc/{pid}/cgroup")
    out = {}
    for line in f.read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            if c in V1_CTRLS:
                out[c] = path
    return out


def kernel_pid(k):
    """The kernel server's own pid (setpriv execs it in place)."""
    return k.proc.pid


def monitor_of(kpid):
    """The sandbox's monitor: the kernel server's child whose child is the
    sandbox's init."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for c in kutil.children_of(kpid):
            for g in kutil.children_of(c):
                try:
                    if Path(f"/proc/{g}/comm").read_text().strip() == "sandbox-init":
                        return c
                except OSError:
                    continue
        time.sleep(0.05)
    raise AssertionError(f"no monitor under {kpid}: {kutil.descendants(kpid)}")


def zombies_of(pid):
    """Children of pid that are zombies (exited, never reaped)."""
    out = []
    for c in kutil.children_of(pid):
        try:
            st = Path(f"/proc/{c}/stat").read_text()
        except OSError:
            continue
        if st.rsplit(")", 1)[1].split()[0] == "Z":
            out.append(c)
    return out


@pytest.mark.parametrize("lang", ["bash", "python"])
def test_server_stays_in_its_cgroups_and_worker_is_in_the_sandboxes(sbx, lang):
    """Every thread of the kernel server is still in the caller's cgroups
    after its sandbox started (the warm-up moved nothing of it), and the
    worker is in the sandbox's own cgroups (the attach still happened)."""
    k = sbx.kernel(lang)
    _, r = k.execute("echo up" if lang == "bash" else "print('up')")
    assert "up" in kutil.stream_text(r["iopub"]), r
    kpid = kernel_pid(k)
    mine = v1_cgroups("self")
    if not mine:
        pytest.skip("no cgroup v1 hierarchy (memory, pids, cpuacct) here")
    for tid in sorted(int(t.name) for t in Path(f"/proc/{kpid}/task").iterdir()):
        try:
            got = v1_cgroups(kpid, tid)
        except OSError:
            continue  # a thread that just ended (the warm-up's)
        assert got == mine, (tid, got, mine)
    worker = kutil.worker_pid(kpid)
    wcg = v1_cgroups(worker)
    if sbxutil.IS_ROOT and sbx.user == "invoker":
        assert any("kernelmgr-sandbox-" in p for p in wcg.values()), wcg
    k.assert_alive()


def test_idmap_creator_is_reaped(sbx):
    """A root caller's sandbox makes a throwaway user namespace (and a
    process to create it) for the idmapped workspace. The monitor no longer
    waits for it on the way; its wait loop reaps it: no zombie is left, and
    init is its only child."""
    if not (sbxutil.IS_ROOT and sbx.user == "invoker"):
        pytest.skip("the idmapped workspace is a root caller's")
    k = sbx.kernel("bash")
    _, r = k.execute("echo up")
    assert "up" in kutil.stream_text(r["iopub"]), r
    mon = monitor_of(kernel_pid(k))
    deadline = time.monotonic() + 10
    while True:
        left = zombies_of(mon)
        kids = kutil.children_of(mon)
        if not left and len(kids) == 1:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"monitor {mon}: children {kids}, zombies {left}")
        time.sleep(0.05)
    assert Path(f"/proc/{kids[0]}/comm").read_text().strip() == "sandbox-init"
    k.assert_alive()
