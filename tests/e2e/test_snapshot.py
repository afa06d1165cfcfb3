"""Snapshots: a session's state (Python and Bash, saved by the kernels
themselves inside the strict sandbox) outlives its processes — daemon stop
and restart, idle cull, eviction, a SIGKILLed worker with periodic snapshots
— and can be taken, listed, restored and forked explicitly. The real daemon,
real kernels, real numpy/pandas/dill. Waits are polls, never fixed sleeps."""
import json
import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="build/kernel-python and build/kernel-bash not built")

STRICT = {"sandbox": "strict"}

PY_STATE = """
import os, socket
import numpy as np
import pandas as pd
arr = np.arange(12).reshape(3, 4)
df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
p = Point(3, 4)
sq = lambda v: v * v
x = 41
sk = socket.socket()
g = (i for i in range(3))
os.environ["SNAP_ENV"] = "kept"
"""
PY_CHECK = ("print(x + 1, int(arr.sum()), list(df['b']), p.norm2(), isinstance(p, Point), "
            "sq(5), os.environ['SNAP_ENV'], type(np).__name__)")
PY_EXPECT = "42 66 ['x', 'y', 'z'] 25 True 25 kept module\n"
SH_STATE = ("n=7; arr=(a 'b c'); declare -A m=([k]=v); export SH_ENV=yes; "
            "greet() { echo \"hi $1\"; }; alias ll='echo aliased'; shopt -s globstar")
SH_CHECK = "echo $((n + 1)) \"${arr[1]}\" ${m[k]} $SH_ENV; greet you; ll; shopt -q globstar && echo gs"
SH_EXPECT = "8 b c v yes\nhi you\naliased\ngs\n"


def py(mgr, session, code):
    rc, res, p = mgr.exec(session, code, "--lang", "python")
    assert res, p.stderr
    return res[-1]


def sh(mgr, session, code):
    rc, res, p = mgr.exec(session, code, "--lang", "bash")
    assert res, p.stderr
    return res[-1]


def sessions(mgr):
    p = mgr.run("sessions", "--json", timeout=60)
    assert p.returncode == 0, p.stderr
    return {s["name"]: s for s in json.loads(p.stdout)}


def set_state(mgr, name):
    r = py(mgr, name, PY_STATE)
    assert r["status"] == "ok", r
    r = sh(mgr, name, SH_STATE)
    assert r["status"] == "ok", r


def check_restored(mgr, name, why):
    r = py(mgr, name, PY_CHECK)
    assert r["status"] == "ok" and r["stdout"] == PY_EXPECT, r
    k = r["kernel"]
    assert k["restarted"] is True and why in k["reason"], k
    assert k["restored"]["from"] == "snapshot" and k["restored"]["at"], k
    # the socket and the generator could not be saved: named, not dropped
    assert sorted(k["restored"]["lost"]) == ["g", "sk"], k
    assert k["state_preserved"] is False, k
    r = sh(mgr, name, SH_CHECK)
    assert r["status"] == "ok" and r["stdout"] == SH_EXPECT, r
    assert r["kernel"]["restored"]["lost"] == [] and r["kernel"]["state_preserved"] is True, r


def test_state_survives_serve_stop_and_restart(make_mgr):
    mgr = make_mgr(STRICT)
    set_state(mgr, "s")
    p = mgr.run("serve", "--stop", timeout=300)
    assert p.returncode == 0, p.stderr
    check_restored(mgr, "s", "manager restarted")
    # and the next cell is an ordinary one again
    r = py(mgr, "s", "x")
    assert r["result"]["text/plain"] == "41" and r["kernel"]["restarted"] is False, r


def test_state_survives_an_idle_cull(make_mgr):
    mgr = make_mgr(dict(STRICT, idle_timeout=2))
    set_state(mgr, "c")
    kutil.poll_until(lambda: sessions(mgr)["c"]["kernels"],
                     lambda k: k["python"] is None and k["bash"] is None, 120, "the cull")
    check_restored(mgr, "c", "culled")


def test_kernels_culled_one_after_the_other_both_come_back(make_mgr):
    """The automatic snapshot is one per session: the second cull (Bash)
    must carry the first one's Python state over, not replace it."""
    mgr = make_mgr(dict(STRICT, idle_timeout=2))
    assert py(mgr, "o", "first = 'python'")["status"] == "ok"
    kutil.poll_until(lambda: sessions(mgr)["o"]["kernels"], lambda k: k["python"] is None,
                     120, "the python cull")
    assert sh(mgr, "o", "second=bash")["status"] == "ok"
    kutil.poll_until(lambda: sessions(mgr)["o"]["kernels"], lambda k: k["bash"] is None,
                     120, "the bash cull")
    r = py(mgr, "o", "print(first)")
    assert r["stdout"] == "python\n" and r["kernel"]["restored"]["tag"] == "auto", r
    r = sh(mgr, "o", "echo $second")
    assert r["stdout"] == "bash\n" and r["kernel"]["restored"]["tag"] == "auto", r


def test_state_survives_an_eviction(make_mgr):
    mgr = make_mgr(dict(STRICT, max_kernels=2))
    set_state(mgr, "a")
    # b needs a kernel: a (both kernels) is the least recently used idle session
    r = py(mgr, "b", "1 + 1")
    assert r["status"] == "ok", r
    kernels = sessions(mgr)["a"]["kernels"]
    assert kernels["python"] is None or kernels["bash"] is None, kernels
    r = py(mgr, "a", PY_CHECK)
    assert r["stdout"] == PY_EXPECT, r
    assert "evicted" in r["kernel"]["reason"] and r["kernel"]["restored"]["from"] == "snapshot"
    assert sorted(r["kernel"]["restored"]["lost"]) == ["g", "sk"], r


def test_worker_sigkill_restores_the_periodic_snapshot(make_mgr):
    mgr = make_mgr(dict(STRICT, snapshot_interval=0.001))
    r = py(mgr, "k", "v = {'a': [1, 2, 3]}\nimport numpy as np\nz = np.ones(5)")
    assert r["status"] == "ok", r
    # the periodic snapshot after it has this: it runs longer than the
    # interval of cell time (a bare append can take under 1 ms, and then no
    # snapshot is due yet)
    r = py(mgr, "k", "v['a'].append(4)\nimport time\ntime.sleep(0.01)")
    assert r["status"] == "ok", r
    kpid = sessions(mgr)["k"]["kernels"]["python"]["pid"]
    w = kutil.worker_pid(kpid)
    os.kill(w, signal.SIGKILL)
    kutil.poll_until(lambda: kutil.worker_pid(kpid), lambda n: n and n != w, 60, "a new worker")
    r = py(mgr, "k", "print(v['a'], float(z.sum()))")
    assert r["status"] == "ok" and r["stdout"] == "[1, 2, 3, 4] 5.0\n", r
    assert r["kernel"]["restarted"] is True and r["kernel"]["restored"]["tag"] == "auto", r
    assert r["kernel"]["state_preserved"] is True, r


def test_explicit_snapshot_list_and_restore(make_mgr):
    mgr = make_mgr(STRICT)
    r = py(mgr, "e", "x = 1\nopen('f.txt', 'w').write('one')")
    assert r["status"] == "ok", r
    p = mgr.run("snapshot", "e", "--tag", "first", "--json")
    assert p.returncode == 0, p.stderr
    man = json.loads(p.stdout)
    assert man["tag"] == "first" and man["kernels"]["python"]["bytes"] > 0, man
    assert man["workspace_copy"]["files"] >= 1, man
    r = py(mgr, "e", "x = 2\nopen('f.txt', 'w').write('two')")
    p = mgr.run("snapshots", "e", "--json")
    assert p.returncode == 0 and [s["tag"] for s in json.loads(p.stdout)["snapshots"]] == ["first"]
    p = mgr.run("restore", "e", "--tag", "first", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["kernels"]["python"]["restored"]["lost"] == []
    r = py(mgr, "e", "print(x, open('f.txt').read())")
    assert r["stdout"] == "1 one\n", r
    # a bad or unknown tag is refused by name; nothing changes
    p = mgr.run("restore", "e", "--tag", "../etc")
    assert p.returncode != 0 and "invalid snapshot tag" in p.stderr, p.stderr
    p = mgr.run("restore", "e", "--tag", "nope")
    assert p.returncode != 0 and 'no snapshot "nope"' in p.stderr, p.stderr
    assert py(mgr, "e", "x")["result"]["text/plain"] == "1"


def test_fork_is_independent(make_mgr):
    mgr = make_mgr(STRICT)
    r = py(mgr, "src", "data = [1, 2]\nopen('shared.txt', 'w').write('src')")
    assert r["status"] == "ok", r
    assert sh(mgr, "src", "b=src; mkdir -p sub; cd sub")["status"] == "ok"
    p = mgr.run("fork", "src", "dst", "--json")
    assert p.returncode == 0, p.stderr
    fork = json.loads(p.stdout)
    r = py(mgr, "dst", "data.append(3)\nopen('shared.txt', 'w').write('dst')\nprint(data)")
    assert r["stdout"] == "[1, 2, 3]\n" and r["kernel"]["restored"]["from"] == "snapshot", r
    # Bash is back in the same directory, of the fork's own workspace
    r = sh(mgr, "dst", "echo $b; b=dst; echo $b; pwd")
    assert r["kernel"]["state_preserved"] is True, r["kernel"]
    assert r["stdout"] == f"src\ndst\n{fork['workspace']}/sub\n", r
    r = py(mgr, "src", "print(data, open('shared.txt').read())")
    assert r["stdout"] == "[1, 2] src\n", r
    assert sh(mgr, "src", "echo $b")["stdout"] == "src\n"
    # no file is shared: other inodes, no hard links
    ws_src = Path(sessions(mgr)["src"]["workspace"])
    ws_dst = Path(fork["workspace"])
    a, b = (ws_src / "shared.txt").stat(), (ws_dst / "shared.txt").stat()
    assert a.st_ino != b.st_ino and a.st_nlink == 1 and b.st_nlink == 1
    # forking onto an existing session is refused
    p = mgr.run("fork", "src", "dst")
    assert p.returncode != 0 and "exists" in p.stderr, p.stderr


def test_fork_keeps_the_network_allow_list(make_mgr):
    """A fork has its source's network policy: an allow-list session's fork
    lists the same hosts (it had none: every host refused)."""
    mgr = make_mgr(STRICT)
    rc, res, p = mgr.exec("asrc", "echo up", "--lang", "bash",
                          "--network", "allow:example.com,pypi.org:443")
    assert rc == 0, p.stderr
    p = mgr.run("fork", "asrc", "adst", "--json")
    assert p.returncode == 0, p.stderr

    def network(name):
        o = json.loads((mgr.home / "sessions" / name / "session.json").read_text())
        return o["options"]["network"]

    assert network("adst") == network("asrc"), (network("asrc"), network("adst"))
    assert "example.com" in json.dumps(network("adst")), network("adst")


def test_oversize_snapshot_is_refused_by_name_and_the_session_goes_on(make_mgr):
    mgr = make_mgr(dict(STRICT, snapshot_max="64K"))
    r = py(mgr, "big", "blob = b'x' * 300000\nsmall = 5")
    assert r["status"] == "ok", r
    p = mgr.run("snapshot", "big", "--tag", "t")
    assert p.returncode != 0 and "snapshot_max=65536" in p.stderr, p.stderr
    p = mgr.run("snapshots", "big", "--json")
    assert json.loads(p.stdout)["snapshots"] == []
    r = py(mgr, "big", "print(len(blob), small)")
    assert r["stdout"] == "300000 5\n" and r["kernel"]["restarted"] is False, r


def test_a_sessions_own_snapshot_max_is_its_bound(make_mgr):
    mgr = make_mgr(STRICT)
    rc, res, p = mgr.exec("own", "blob = b'y' * 300000", "--snapshot-max", "64K")
    assert rc == 0, p.stderr
    p = mgr.run("snapshot", "own")
    assert p.returncode != 0 and "snapshot_max=65536" in p.stderr, p.stderr
    # another session has the configuration's bound
    assert py(mgr, "other", "blob = b'y' * 300000")["status"] == "ok"
    assert mgr.run("snapshot", "other").returncode == 0
    # kept across a daemon restart (session.json); the stop's own snapshot
    # was refused too, and the first result says the state was lost
    assert mgr.run("serve", "--stop", timeout=300).returncode == 0
    r = py(mgr, "own", "blob = b'y' * 300000\nprint(len(blob))")
    assert r["stdout"] == "300000\n" and r["kernel"]["state_preserved"] is False, r
    assert "restored" not in r["kernel"], r
    p = mgr.run("snapshot", "own")
    assert p.returncode != 0 and "snapshot_max=65536" in p.stderr, p.stderr


def test_corrupt_snapshot_gives_a_clear_error_and_loses_nothing(make_mgr):
    mgr = make_mgr(STRICT)
    r = py(mgr, "cor", "keep = 'me'\nother = 3")
    assert r["status"] == "ok", r
    assert mgr.run("snapshot", "cor", "--tag", "good").returncode == 0
    assert mgr.run("snapshot", "cor", "--tag", "bad").returncode == 0
    store = mgr.home / "sessions" / "cor" / "snapshots"
    (store / "bad" / "manifest.json").write_text("{ not json")
    p = mgr.run("restore", "cor", "--tag", "bad")
    assert p.returncode != 0 and "damaged" in p.stderr and "manifest.json" in p.stderr, p.stderr
    # a truncated namespace: the names it lost are listed, the rest loads
    ns = store / "good" / "python" / "ns.pkl"
    data = ns.read_bytes()
    ns.write_bytes(data[: len(data) - 5])
    p = mgr.run("restore", "cor", "--tag", "good", "--json")
    assert p.returncode == 0, p.stderr
    lost = json.loads(p.stdout)["kernels"]["python"]["restored"]["lost"]
    assert lost, p.stdout
    r = py(mgr, "cor", "print(keep)")
    assert r["stdout"] == "me\n", r
    # the listing names the damaged one, the other sessions are untouched
    snaps = {s["tag"]: s for s in json.loads(mgr.run("snapshots", "cor", "--json").stdout)
             ["snapshots"]}
    assert "error" in snaps["bad"] and "error" not in snaps["good"], snaps


def test_matplotlib_figures_come_back_or_are_named(make_mgr):
    """A matplotlib figure made in a cell (the kernel's own backend) is
    recreated by a restore, with its axes and lines; should the
    interpreter's matplotlib not pickle it, it is named in restored.lost
    with its type, never dropped silently."""
    mgr = make_mgr(STRICT)
    r = py(mgr, "m", "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\n"
           "ax.plot([1, 2, 3], [4, 1, 9])\nax.set_title('kept')\nplt.close(fig)\nn = 5")
    assert r["status"] == "ok", r
    p = mgr.run("snapshot", "m", "--tag", "fig", "--json")
    assert p.returncode == 0, p.stderr
    lost = {e["name"]: e for e in json.loads(p.stdout)["kernels"]["python"]["lost"]}
    r = py(mgr, "m", "del fig, ax\nn = 6")
    assert r["status"] == "ok", r
    p = mgr.run("restore", "m", "--tag", "fig", "--json")
    assert p.returncode == 0, p.stderr
    if "fig" in lost:
        assert lost["fig"].get("type") and lost["fig"].get("reason"), lost
        assert py(mgr, "m", "print(n)")["stdout"] == "5\n"
    else:
        r = py(mgr, "m", "print(n, fig.axes[0].get_title(), len(ax.lines), "
               "list(ax.lines[0].get_ydata()))")
        assert r["status"] == "ok" and r["stdout"] == "5 kept 1 [4, 1, 9]\n", r
