"""The daemon under load and slow clients.

Real daemon, real kernels, real sockets: 100 sessions created at once all
succeed; the kernel cap holds under 40 concurrent starts; 3000 idle
connections cost no threads; a burst of 1000 connects is not refused; a
stopped client does not hold its session; the daemon's memory returns after
a 1 GiB output."""
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apiutil  # noqa: E402
import mgrutil  # noqa: E402


def poll(pred, deadline, msg):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {deadline} s waiting for {msg}")


class Daemon:
    """A KERNELMGR_HOME with a daemon started by `kernelmgr serve`."""

    def __init__(self, config=None, python=True):
        self.m = mgrutil.Mgr(config)
        if not python:
            cfg = json.loads((self.m.home / "config.json").read_text())
            cfg.pop("python", None)
            (self.m.home / "config.json").write_text(json.dumps(cfg))
        self.home = self.m.home
        self.sock = str(self.home / "kernelmgr.sock")
        self.log = open(self.home / "serve.log", "w")
        self.proc = subprocess.Popen([mgrutil.KM, "serve"], env=self.m.env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        poll(lambda: os.path.exists(self.sock) or self.proc.poll() is not None, 60,
             "the daemon socket")
        assert self.proc.poll() is None, self.log_text()
        self.pid = self.proc.pid

    def log_text(self):
        return (self.home / "serve.log").read_text(errors="replace")

    def connect(self, timeout=120):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        s.connect(self.sock)
        return s

    def ask(self, req, timeout=120):
        """One API request; returns (its result, or the error response; the
        events' params)."""
        s = self.connect(timeout)
        try:
            f = s.makefile("rw")
            f.write(json.dumps(req) + "\n")
            f.flush()
            events = []
            while True:
                line = f.readline()
                assert line, "the daemon closed the connection"
                o = json.loads(line)
                if not apiutil.is_response(o):
                    events.append(o["params"])
                    continue
                return apiutil.unwrap(o), events
        finally:
            s.close()

    def status(self, key):
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise AssertionError(key)

    def kernels(self, servers_only=True):
        """Live kernel servers of this home (their connection file is in it):
        the daemon's children (a helper a kernel forks carries its command
        line too, and dies a moment after it); servers_only=False: any
        process with such a command line."""
        n = 0
        home = str(self.home)
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
                st = (d / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if st[0] == "Z" or (servers_only and int(st[1]) != self.pid):
                continue
            if cmd and os.path.basename(cmd[0].decode(errors="replace")).startswith("kernel-") \
                    and any(home in a.decode(errors="replace") for a in cmd[1:]):
                n += 1
        return n

    def close(self):
        try:
            self.ask(apiutil.request("shutdown"), timeout=30)
        except (OSError, AssertionError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        poll(lambda: self.kernels(servers_only=False) == 0, 30, "the kernels to stop")
        self.m.close()


@pytest.fixture
def daemon_factory():
    made = []

    def make(**kw):
        d = Daemon(**kw)
        made.append(d)
        return d

    yield make
    for d in made:
        d.close()


def auto_max_kernels():
    """The default max_kernels (config.c), a safety cap beside the memory
    budget: min(1024, RLIMIT_NOFILE's hard limit / 24), >= 2 (the daemon
    inherits the hard limit)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1024 if hard == resource.RLIM_INFINITY else max(2, min(1024, hard // 24))


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < n:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {n}")
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def concurrent_execs(d, reqs, timeout=300):
    """Sends every request on its own connection at once; returns
    [(reply, seconds)] in order."""
    out = [None] * len(reqs)
    gate = threading.Barrier(len(reqs))

    def one(i):
        gate.wait()
        t0 = time.monotonic()
        try:
            rep, _ = d.ask(reqs[i], timeout=timeout)
        except Exception as e:  # noqa: BLE001 - reported by the assertion
            rep = {"error": {"message": repr(e)}}
        out[i] = (rep, time.monotonic() - t0)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out


def assert_all_ok(out):
    bad = [(i, r) for i, (r, _) in enumerate(out)
           if "error" in r or r.get("failed")
           or any(b.get("status") != "ok" for b in r.get("results", []))]
    assert not bad, f"{len(bad)} of {len(out)} failed, e.g. {json.dumps(bad[:3])[:3000]}"


# ------------------------------------------------------------------ admission

def test_100_concurrent_sessions_all_succeed(daemon_factory):
    """100 sessions created at once (bash and Python, ipc, the interpreter
    detected, not configured) all get their result: starts queue for the
    cap instead of failing, and the Python probe runs once, not 100 times."""
    d = daemon_factory(config={"transport": "ipc"}, python=False)
    reqs = []
    for i in range(100):
        if i % 2:
            reqs.append(apiutil.request("exec", {"session": f"b{i}", "lang": "bash",
                         "code": f"echo bash-{i}", "timeout": 300}))
        else:
            reqs.append(apiutil.request("exec", {"session": f"p{i}", "lang": "python",
                         "code": f"print('py-%d' % {i})", "timeout": 300}))
    out = concurrent_execs(d, reqs)
    assert_all_ok(out)
    for i, (r, _) in enumerate(out):
        text = json.dumps(r["results"])
        assert (f"bash-{i}" if i % 2 else f"py-{i}") in text, r
    times = sorted(t for _, t in out)
    print(f"100 sessions: p50 {times[49]:.1f} s, max {times[-1]:.1f} s")
    # never more kernels than the cap, and the daemon still answers
    rep, _ = d.ask(apiutil.request("ping"))
    assert "error" not in rep and rep["pool"]["live_kernels"] <= auto_max_kernels(), rep
    assert d.kernels() <= auto_max_kernels()
    rep, _ = d.ask(apiutil.request("exec", {"session": "p0", "lang": "python", "code": "print(6*7)"}))
    assert "error" not in rep and "42" in json.dumps(rep["results"]), rep


def test_kernel_cap_holds_under_40_concurrent_starts(daemon_factory):
    d = daemon_factory(config={"max_kernels": 8})
    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], d.kernels())
            time.sleep(0.01)

    w = threading.Thread(target=watch)
    w.start()
    try:
        reqs = [apiutil.request("exec", {"session": f"c{i}", "lang": "bash",
                 "code": "sleep 0.3; echo done", "timeout": 300}) for i in range(40)]
        out = concurrent_execs(d, reqs)
    finally:
        stop.set()
        w.join()
    assert_all_ok(out)
    assert 0 < peak[0] <= 8, f"{peak[0]} kernels ran at once with max_kernels=8"
    assert d.kernels() <= 8
    rep, _ = d.ask(apiutil.request("ping"))
    assert rep["pool"]["live_kernels"] <= 8, rep


# ------------------------------------------------------------------ connections

def test_3000_idle_connections_cost_no_threads(daemon_factory):
    raise_nofile(8192)
    d = daemon_factory()
    rep, _ = d.ask(apiutil.request("exec", {"session": "w", "lang": "bash", "code": "echo warm"}))
    assert "error" not in rep, rep
    base = d.status("Threads")
    conns = []
    try:
        for _ in range(3000):
            conns.append(d.connect())
        # the daemon has accepted them all: a request behind them is answered
        rep, _ = d.ask(apiutil.request("exec", {"session": "w", "lang": "bash", "code": "echo still-here"}))
        assert "error" not in rep and "still-here" in json.dumps(rep["results"]), rep
        threads = d.status("Threads")
        assert threads <= base + 4 and threads < 100, (base, threads)
        # an idle connection still works
        f = conns[1234].makefile("rw")
        f.write(json.dumps(apiutil.request("ping", None, id=7)) + "\n")
        f.flush()
        o = json.loads(f.readline())
        assert "result" in o and o["id"] == 7
    finally:
        for s in conns:
            s.close()
    poll(lambda: len(os.listdir(f"/proc/{d.pid}/fd")) < 200, 30, "connections to be closed")


def test_burst_of_1000_connects_is_not_refused(daemon_factory):
    raise_nofile(4096)
    d = daemon_factory()
    socks, refused = [], 0
    try:
        for _ in range(1000):
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            rc = s.connect_ex(d.sock)
            if rc not in (0,):
                refused += 1
                s.close()
                continue
            socks.append(s)
        assert refused == 0, f"{refused} of 1000 connects refused"
        for i, s in enumerate(socks):
            s.setblocking(True)
            s.settimeout(60)
            s.sendall(json.dumps(apiutil.request("ping", None, id=i)).encode() + b"\n")
        for i, s in enumerate(socks):
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(65536)
                assert chunk, f"connection {i} closed"
                buf += chunk
            o = json.loads(buf)
            assert "result" in o and o["id"] == i
    finally:
        for s in socks:
            s.close()


# ------------------------------------------------------------------ slow clients

def stopped_streaming_client(d, session, size):
    """A `kernelmgr exec` streaming a big output, stopped (SIGSTOP) once the
    output flows: it never reads again."""
    cli = subprocess.Popen([mgrutil.KM, "exec", "--session", session, "--lang", "bash",
                            "--timeout", "120", "-c",
                            f"yes 0123456789abcdefghijklmnopqrstuvwxyz | head -c {size}; "
                            "echo end > finished.txt"],
                           env=d.m.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    poll(lambda: len(cli.stdout.read(65536) or b"") > 0, 60, "the first output")
    os.kill(cli.pid, signal.SIGSTOP)
    return cli


def reap(cli):
    os.kill(cli.pid, signal.SIGCONT)
    cli.kill()
    cli.wait()
    cli.stdout.close()


@pytest.mark.flood
def test_stopped_client_is_dropped_and_its_cell_completes(daemon_factory):
    d = daemon_factory(config={"client_timeout": 3})
    rep, _ = d.ask(apiutil.request("exec", {"session": "slow", "lang": "bash", "code": "echo up"}))
    assert "error" not in rep, rep
    ws = Path(rep["results"][0].get("workspace") or
              next(s["workspace"] for s in d.ask(apiutil.request("sessions.list"))[0]["sessions"]
                   if s["name"] == "slow"))
    cli = stopped_streaming_client(d, "slow", "200M")
    try:
        # dropped after client_timeout without progress, and logged
        poll(lambda: "dropped a client connection" in d.log_text(), 40, "the drop log line")
        # the cell was not cancelled: it ran to its end
        poll(lambda: (ws / "finished.txt").exists(), 60, "the cell to complete")
        rep, _ = d.ask(apiutil.request("exec", {"session": "slow", "lang": "bash",
                        "code": "cat finished.txt"}), timeout=60)
        assert "error" not in rep and "end" in json.dumps(rep["results"]), rep
    finally:
        reap(cli)


def test_stopped_client_does_not_hold_its_session(daemon_factory):
    d = daemon_factory()
    rep, _ = d.ask(apiutil.request("exec", {"session": "slow", "lang": "bash", "code": "X=kept; echo up"}))
    assert "error" not in rep, rep
    cli = stopped_streaming_client(d, "slow", "4G")
    try:
        t0 = time.monotonic()
        # interrupt, another client's exec and close on that session go through
        rep, _ = d.ask(apiutil.request("interrupt", {"session": "slow"}), timeout=20)
        assert "error" not in rep, rep
        assert time.monotonic() - t0 < 10
        rep, _ = d.ask(apiutil.request("exec", {"session": "slow", "lang": "bash",
                        "code": "echo again-$X"}), timeout=60)
        assert "error" not in rep and "again-kept" in json.dumps(rep["results"]), rep
        # other sessions were never affected
        rep, _ = d.ask(apiutil.request("exec", {"session": "other", "lang": "bash", "code": "echo free"}),
                       timeout=60)
        assert "error" not in rep and "free" in json.dumps(rep["results"]), rep
        rep, _ = d.ask(apiutil.request("close", {"session": "slow"}), timeout=30)
        assert "error" not in rep, rep
        assert time.monotonic() - t0 < 60
    finally:
        reap(cli)
    rep, _ = d.ask(apiutil.request("sessions.list"))
    assert "slow" not in [s["name"] for s in rep["sessions"]]


# ------------------------------------------------------------------ memory

# 1 GiB takes 40-60 s on a busy 2-core machine (kernel, daemon and client
# each burn a core on it): the test uses 384 MiB unless told otherwise, half
# again the 256 MiB its peak must stay under (a daemon that held the whole
# burst fails it), and `make bench` measures the full 1 GiB.
BURST = os.environ.get("KM_TEST_BURST", "384M")


@pytest.mark.flood
def test_rss_returns_after_big_output(daemon_factory, tmp_path):
    d = daemon_factory()
    rep, _ = d.ask(apiutil.request("exec", {"session": "big", "lang": "bash", "code": "echo warm"}))
    assert "error" not in rep, rep
    before = d.status("VmRSS")
    peak = [before]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:
                peak[0] = max(peak[0], d.status("VmRSS"))
            except (OSError, AssertionError):
                pass
            time.sleep(0.05)

    w = threading.Thread(target=watch)
    w.start()
    try:
        with open(tmp_path / "out", "wb") as out:
            p = subprocess.run([mgrutil.KM, "exec", "--session", "big", "--lang", "bash",
                                "--timeout", "300", "-c",
                                f"yes | head -c {BURST}; echo; echo finished"],
                               env=d.m.env, stdout=out, stderr=subprocess.PIPE, timeout=300)
    finally:
        stop.set()
        w.join()
    assert p.returncode == 0, p.stderr[-2000:]
    size = (tmp_path / "out").stat().st_size
    with open(tmp_path / "out", "rb") as f:
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
    # every byte was streamed (nothing dropped for a client that reads)
    assert b"\nfinished\n" in tail and b"not sent to this client" not in tail, tail[-500:]
    assert size >= int(BURST[:-1]) << {"K": 10, "M": 20, "G": 30}[BURST[-1]]
    poll(lambda: d.status("VmRSS") - before < 64 * 1024, 30,
         f"the daemon's RSS to return near {before} kB (now {d.status('VmRSS')} kB)")
    print(f"daemon RSS before {before} kB, peak {peak[0]} kB, after {d.status('VmRSS')} kB")
    # the peak itself is bounded too (the IOPub queue and client buffers are)
    assert peak[0] - before < 256 * 1024, (before, peak[0])
    rep, _ = d.ask(apiutil.request("exec", {"session": "big", "lang": "bash", "code": "echo after"}))
    assert "error" not in rep and "after" in json.dumps(rep["results"]), rep
