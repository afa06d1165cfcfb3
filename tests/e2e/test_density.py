"""Density: kernels are admitted by the memory they really use (measured,
under `memory_budget`), `max_kernels` is a safety cap, and when either is
reached the least recently used session that is not running code gives way
as a whole, never the session that asked. The real daemon and kernels;
small numbers through the configuration keep it fast.

Nothing here measures time: waits are polls (kutil.poll_until)."""
import json
import resource
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apiutil  # noqa: E402
import kutil  # noqa: E402
import mgrutil  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="build/kernel-python and build/kernel-bash not built")


def ping(mgr):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    try:
        s.connect(str(mgr.home / "kernelmgr.sock"))
        f = s.makefile("rw")
        f.write(apiutil.line("ping"))
        f.flush()
        while True:
            o = json.loads(f.readline())
            if apiutil.is_response(o):
                return apiutil.unwrap(o)
    finally:
        s.close()


def live(mgr):
    """{session: [languages with a live kernel]}"""
    p = mgr.run("sessions", "--json", timeout=60)
    assert p.returncode == 0, p.stderr
    return {s["name"]: sorted(k for k, v in s["kernels"].items() if v)
            for s in json.loads(p.stdout)}


def py(mgr, session, code):
    rc, res, p = mgr.exec(session, code, "--lang", "python")
    assert res, p.stderr
    return res[-1]


def sh(mgr, session, code):
    rc, res, p = mgr.exec(session, code, "--lang", "bash")
    assert rc == 0, p.stderr
    return res[-1]


def value(r):
    return (r.get("result") or {}).get("text/plain")


def test_language_switching_keeps_the_sessions_own_kernels(make_mgr):
    """At the cap, a session switching between Python and Bash never loses
    its own other kernel: the least recently used idle session gives way."""
    mgr = make_mgr({"max_kernels": 4})
    for i in range(3):
        assert value(py(mgr, f"o{i}", f"o = {i}\no")) == str(i)
    assert value(py(mgr, "s", "v = 41\nsrv = 'running'\nv")) == "41"
    # the cap is reached (4 kernels): s's Bash kernel needs one
    for n in range(3):
        r = sh(mgr, "s", f"echo bash-{n}")
        assert r["stdout"] == f"bash-{n}\n" and not r["kernel"]["restarted"], r
        r = py(mgr, "s", "v += 1\n(v, srv)")
        assert r["status"] == "ok" and not r["kernel"]["restarted"], r
        assert value(r) == f"({42 + n}, 'running')"
    assert live(mgr)["s"] == ["bash", "python"]
    # exactly one other session made room: the least recently used one
    kernels = live(mgr)
    assert kernels["o0"] == [] and kernels["o1"] == ["python"] and kernels["o2"] == ["python"]
    # the evicted session's state was snapshotted first and comes back
    r = py(mgr, "o0", "o")
    assert value(r) == "0" and r["kernel"]["restarted"] is True, r
    assert r["kernel"]["restored"]["from"] == "snapshot", r
    reason = r["kernel"]["reason"]
    assert "evicted" in reason and "max_kernels=4" in reason and '"s"' in reason, reason


def test_language_switching_beside_8_idle_sessions_keeps_everything(make_mgr):
    """The default configuration with 8 idle sessions around (the case that
    used to wipe the switching session's Python state at every switch):
    switching between Python and Bash keeps both of the session's kernels,
    a server it started, and every other session's kernel."""
    mgr = make_mgr()
    for i in range(8):
        assert value(py(mgr, f"idle{i}", f"i = {i}\ni")) == str(i)
    start = ("import http.server, threading\n"
             "srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), "
             "http.server.SimpleHTTPRequestHandler)\n"
             "threading.Thread(target=srv.serve_forever, daemon=True).start()\n"
             "v = 0\nsrv.server_address[1]")
    port = value(py(mgr, "s", start))
    assert port and port.isdigit(), port
    for n in range(3):
        r = sh(mgr, "s", f"export B={n}; echo bash-$B")
        assert r["stdout"] == f"bash-{n}\n" and not r["kernel"]["restarted"], r
        r = py(mgr, "s", "v += 1\nv")
        assert value(r) == str(n + 1) and not r["kernel"]["restarted"], r
    # the server the Python kernel started is still up (reached from its own loopback)
    r = py(mgr, "s", "import urllib.request, os\nos.environ.pop('http_proxy', None)\n"
                     f"urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=30).status")
    assert value(r) == "200", r
    kernels = live(mgr)
    assert kernels["s"] == ["bash", "python"], kernels
    assert all(kernels[f"idle{i}"] == ["python"] for i in range(8)), kernels
    assert sh(mgr, "s", "echo $B")["stdout"] == "2\n"


def test_cap_evicts_the_lru_idle_session_and_the_asker_keeps_state(make_mgr):
    mgr = make_mgr({"max_kernels": 4})
    # a holds both kernels, b and c one each: the cap is reached
    assert value(py(mgr, "a", "a = 1\na")) == "1"
    assert sh(mgr, "a", "export A=1; echo $A")["stdout"] == "1\n"
    assert value(py(mgr, "b", "b = 2\nb")) == "2"
    assert value(py(mgr, "c", "c = 3\nc")) == "3"
    # d asks: a is the least recently used idle session and goes as a whole
    assert value(py(mgr, "d", "d = 4\nd")) == "4"
    kernels = live(mgr)
    assert kernels["a"] == [] and kernels["b"] == ["python"] and kernels["c"] == ["python"]
    # a's two kernels made room for two: d's Bash kernel takes the other
    assert sh(mgr, "d", "echo hi")["stdout"] == "hi\n"
    assert live(mgr)["b"] == ["python"]
    # e asks: b is now the least recently used idle session
    assert value(py(mgr, "e", "e = 5\ne")) == "5"
    kernels = live(mgr)
    assert kernels["b"] == [] and kernels["c"] == ["python"], kernels
    assert kernels["d"] == ["bash", "python"], kernels
    assert value(py(mgr, "c", "c")) == "3" and value(py(mgr, "d", "d")) == "4"
    # both of a's kernels say why their state was lost
    r = py(mgr, "a", "a")
    assert value(r) == "1" and r["kernel"]["restored"]["from"] == "snapshot", r
    assert "evicted" in r["kernel"]["reason"] and "max_kernels=4" in r["kernel"]["reason"]
    assert '"d"' in r["kernel"]["reason"]


def test_memory_budget_evicts_by_measured_use(make_mgr):
    """With a tiny budget, a session whose kernel really uses memory gives
    way to a new one; the daemon reports what it measured."""
    # snapshot_max below the blob: the evicted state cannot be kept, and
    # the result says so (a snapshot of it would bring the 120 MiB back)
    mgr = make_mgr({"memory_budget": "160M", "snapshot_max": "1M"})
    # 120 MiB written (not only reserved): measured, whatever the sandbox
    assert py(mgr, "big", "blob = b'x' * (120 << 20)\nlen(blob)")["status"] == "ok"
    # the measurement the next admission reads has seen the allocation
    kutil.poll_until(lambda: ping(mgr)["pool"]["kernels_memory"],
                     lambda used: used >= 100 << 20, 60, "the big kernel measured")
    assert ping(mgr)["pool"]["memory_budget"] == 160 << 20
    assert value(py(mgr, "small", "s = 7\ns")) == "7"
    kernels = live(mgr)
    assert kernels["big"] == [] and kernels["small"] == ["python"], kernels
    r = py(mgr, "big", "len(blob)")
    assert r["error"]["name"] == "NameError"
    reason = r["kernel"]["reason"]
    assert "state was lost" in reason and "restored" not in r["kernel"], r
    assert "evicted" in reason and "memory_budget=160 MiB" in reason and '"small"' in reason
    # idle kernels are small: the restarted one fits beside the other
    assert value(py(mgr, "small", "s")) == "7"
    assert kutil.poll_until(lambda: ping(mgr)["pool"]["kernels_memory"],
                            lambda used: 0 < used < 100 << 20, 60, "idle kernels measured")


def test_the_only_sessions_kernels_are_never_stopped_for_it(make_mgr):
    """A session alone at the cap gets an error at once naming the limit;
    its own kernel keeps its state."""
    mgr = make_mgr({"max_kernels": 1})
    assert value(py(mgr, "solo", "k = 5\nk")) == "5"
    rc, res, p = mgr.exec("solo", "echo no", "--lang", "bash")
    assert rc != 0
    err = res[-1]["error"]
    assert err["name"] == "KernelStartError" and "max_kernels=1" in err["value"], err
    assert "this session's own" in err["value"], err
    assert value(py(mgr, "solo", "k")) == "5"


def default_cap():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1024 if hard == resource.RLIM_INFINITY else max(2, min(1024, hard // 24))


@pytest.mark.flood
def test_60_sessions_one_after_another_all_keep_their_state(make_mgr):
    """With the default configuration, 60 sessions created one after
    another, then read back in the same order, have all kept their state
    (admission by measured use: idle kernels are a few MiB each)."""
    if default_cap() < 60:
        pytest.skip(f"RLIMIT_NOFILE gives a default max_kernels of {default_cap()} < 60")
    mgr = make_mgr()
    n = 60
    for i in range(n):
        assert value(py(mgr, f"s{i}", f"x = {i}\nx")) == str(i)
    for i in range(n):
        r = py(mgr, f"s{i}", "x")
        assert r["status"] == "ok" and value(r) == str(i), r
        assert not r["kernel"]["restarted"], r
    pool = ping(mgr)["pool"]
    assert pool["live_kernels"] == n and pool["max_kernels"] == default_cap(), pool
    assert pool["kernels_memory"] < pool["memory_budget"], pool
