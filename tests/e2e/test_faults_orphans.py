"""No orphans: every process kernelmgr starts dies with its owner
or is adopted and reaped by the next manager.

A `kernelmgr run` killed mid-cell by SIGTERM, SIGPIPE or SIGKILL, a daemon
killed with a warm pool, a kernel server killed: afterwards no kernel
server, sandbox or worker of it is left, no stale file is left in
KERNELMGR_HOME, and the next operation works. The real CLI, the real
daemon and the real kernels, as the invoking user and (as root) as nobody.

Nothing here measures time: waits are polls with generous deadlines."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apiutil  # noqa: E402
import kutil  # noqa: E402
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402



def poll(what, pred, deadline=60, msg="condition"):
    return kutil.poll_until(what, pred, deadline, msg, step=0.1)


ASK_PING = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}) + "\n")
f.flush()
print(json.dumps(json.loads(f.readline())["result"]))
"""


# home -> its run directory (kutil.run_dir: outside the home when that is
# not on tmpfs), for the process and file checks below
RUN_DIRS = {}


class KM:
    """A KERNELMGR_HOME owned by user; the CLI and daemon run as user."""

    def __init__(self, user):
        if user == "nobody" and not sbxutil.IS_ROOT:
            pytest.skip("the nobody variant needs root to switch users")
        self.user = user
        self.prefix = sbxutil.SETPRIV if user == "nobody" else []
        self.bin = sbxutil.kernelmgr_for(user)
        self.home = Path(tempfile.mkdtemp(prefix="kmorph", dir="/tmp"))
        cfg = {"sandbox": mgrutil.SANDBOX, "python": "/usr/bin/python3"}
        (self.home / "config.json").write_text(json.dumps(cfg))
        if user == "nobody":
            for p in (self.home, self.home / "config.json"):
                os.chown(p, sbxutil.NOBODY, sbxutil.NOBODY)
        self.env = dict(os.environ, KERNELMGR_HOME=str(self.home), HOME=str(self.home))
        self.run_dir = kutil.run_dir(self.home, uid=sbxutil.NOBODY if user == "nobody" else None,
                                     env=self.env)
        RUN_DIRS[str(self.home)] = str(self.run_dir)
        self.daemons = []

    def argv(self, *args):
        return [*self.prefix, self.bin, *args]

    def run(self, *args, timeout=120):
        return subprocess.run(self.argv(*args), capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    def results(self, *args, **kw):
        p = self.run(*args, "--json", **kw)
        res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return p.returncode, res, p

    def popen(self, *args, **kw):
        return subprocess.Popen(self.argv(*args), env=self.env, **kw)

    def serve(self, *args):
        p = self.popen("serve", *args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
        self.daemons.append(p)
        def serving():
            try:  # written once it listens (a killed daemon's socket file may remain)
                return int((self.home / "daemon.pid").read_text()) == p.pid
            except (OSError, ValueError):
                return False

        poll(lambda: serving() or p.poll() is not None, bool, 60, "daemon serving")
        assert p.poll() is None, p.stderr.read()
        return p

    def ask(self, method, params=None, timeout=60):
        """One API request on the daemon's socket; its result (or the error
        response). As root: any uid may not connect, so nobody's daemon is
        asked through a helper running as nobody instead."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(timeout)
        try:
            s.connect(str(self.home / "kernelmgr.sock"))
            f = s.makefile("rw")
            f.write(apiutil.line(method, params))
            f.flush()
            while True:
                line = f.readline()
                assert line, "daemon closed the connection"
                o = json.loads(line)
                if apiutil.is_response(o):
                    return apiutil.unwrap(o)
        finally:
            s.close()

    def pool_ready(self):
        """Ready warm-pool entries (the daemon answers its own uid only:
        nobody's is asked by a helper running as nobody)."""
        if self.user == "nobody":
            p = subprocess.run([*self.prefix, sys.executable, "-c", ASK_PING,
                                str(self.home / "kernelmgr.sock")], capture_output=True,
                               text=True, timeout=60)
            try:
                return json.loads(p.stdout)["pool"]["ready"]
            except (ValueError, KeyError):
                return 0
        try:
            return self.ask("ping")["pool"]["ready"]
        except (OSError, AssertionError, KeyError):
            return 0

    def close(self):
        for p in self.daemons:
            if p.poll() is None:
                try:
                    self.run("serve", "--stop", timeout=30)
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        # a process already on its way out (its memory gone: an empty
        # command line) is given the time to finish exiting on its own;
        # anything still there then was left behind
        leftovers = home_processes(self.home)
        if leftovers:
            try:
                poll(lambda: home_processes(self.home), lambda v: not v, 10, "leftovers exit")
            except AssertionError:
                pass
            leftovers = home_processes(self.home)
        for pid in leftovers:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        shutil.rmtree(self.home, ignore_errors=True)
        assert not leftovers, f"processes left behind: {describe(leftovers)}"


@pytest.fixture(params=sbxutil.USERS)
def km(request):
    for lang in ("bash", "python"):
        if not mgrutil.have_kernel(lang):
            pytest.fail(f"build/kernel-{lang} is missing")
    k = KM(request.param)
    yield k
    k.close()


# ------------------------------------------------------------------ processes

def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def home_processes(home, exclude=()):
    """Live processes that belong to kernelmgr in home: a command line that
    names a path in it (kernel servers: their connection file) or a cwd in
    it (kernel servers: the run directory; workers: the workspace)."""
    roots = [str(home)] + ([RUN_DIRS[str(home)]] if str(home) in RUN_DIRS else [])
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in exclude or int(d.name) == os.getpid():
            continue
        pid = int(d.name)
        try:
            cwd = os.readlink(d / "cwd")
        except OSError:
            cwd = ""
        cmd = _cmdline(pid)
        if any(r in cmd or cwd.startswith(r) for r in roots) and kutil.alive(pid):
            out.append(pid)
    return out


def describe(pids):
    return [(p, _cmdline(p)[:200]) for p in pids]


def _ppid(pid):
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def kernel_servers(home):
    """The kernel server processes (not their forked sandbox helpers, which
    keep the same command line): those whose parent is not one of them."""
    ks = [p for p in home_processes(home) if "/kernel-" in _cmdline(p).split(" ")[0]]
    return [p for p in ks if _ppid(p) not in ks]


def holders(home):
    """The session sandboxes' holders (kernelmgr-sandbox) of home, not their
    forked monitors."""
    hs = [p for p in home_processes(home) if "/kernelmgr-sandbox" in _cmdline(p).split(" ")[0]]
    return [p for p in hs if _ppid(p) not in hs]


def family(pids):
    """pids and all their descendants (sandbox, worker); a kernel's worker
    in its session's sandbox too (the holder's, not the kernel's child)."""
    out = set(pids)
    for p in pids:
        out.update(kutil.descendants(p))
        w = kutil.session_worker_pid(p)
        if w:
            out.add(w)
            out.update(kutil.descendants(w))
    return sorted(out)


def assert_all_gone(pids, what, deadline=30):
    left = kutil.wait_dead(pids, deadline)
    assert not left, f"{what}: still running after {deadline} s: {describe(left)}"


def run_files(home):
    """What is left in the run directory (connection files, sockets, pid
    files, owner locks): nothing once every manager has ended."""
    d = Path(RUN_DIRS.get(str(home), home / "run"))
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def session_dirs(home):
    d = home / "sessions"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def read_until(stream, marker, deadline=90):
    """Reads lines of a text pipe until one contains marker (a thread: the
    pipe has no timeout)."""
    got = []
    done = threading.Event()

    def reader():
        for line in stream:
            got.append(line)
            if marker in line:
                done.set()
                return
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(deadline) and got and marker in got[-1], f"no {marker!r} in {got!r}"


CELL_BASH = "echo started; sleep 300; echo NOT-REACHED"
CELL_PY = "print('started', flush=True)\nimport time\ntime.sleep(300)\nprint('NOT-REACHED')"


def start_run_mid_cell(km, lang):
    """A `kernelmgr run` whose cell is running; returns (process, kernel
    server pids with their sandbox and worker)."""
    p = km.popen("run", "--lang", lang, "-c", CELL_BASH if lang == "bash" else CELL_PY,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    read_until(p.stdout, "started")
    kernels = kernel_servers(km.home)
    assert kernels, "no kernel server of the run found"
    procs = family(kernels)
    assert len(procs) > len(kernels), f"no sandbox/worker under {describe(kernels)}"
    procs = sorted(set(procs) | set(family(holders(km.home))))
    (run_dir,) = [d for d in session_dirs(km.home) if d.startswith(f"run-{p.pid}-")]
    return p, procs, run_dir


def assert_next_run_works(km):
    rc, res, p = km.results("run", "--lang", "bash", "-c", "echo next-ok")
    assert rc == 0, p.stderr
    assert res and res[0]["status"] == "ok" and "next-ok" in res[0]["stdout"], res


# ------------------------------------------------------------------ run killed

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("lang", ["bash", "python"])
def test_run_terminated_mid_cell_tears_down(km, lang, sig):
    p, procs, sdir = start_run_mid_cell(km, lang)
    p.send_signal(sig)
    assert p.wait(60) == 128 + sig, p.stderr.read()
    # torn down by the run itself: kernels, sandbox and worker gone, the
    # session directory removed at once, nothing left in run/
    assert_all_gone(procs, f"run killed by {sig.name}")
    assert sdir not in session_dirs(km.home)
    assert run_files(km.home) == []
    assert home_processes(km.home) == []
    assert_next_run_works(km)
    assert session_dirs(km.home) == [] and run_files(km.home) == []


def test_run_sigpipe_mid_cell_tears_down(km):
    """`kernelmgr run ... | head -c1`: the reader goes away mid-cell."""
    code = "echo started; while :; do echo line; sleep 0.05; done"
    argv = " ".join(f"'{a}'" for a in km.argv("run", "--lang", "bash", "-c", code))
    sh = subprocess.Popen(["bash", "-c", f"{argv} | head -c1 >/dev/null; "
                           "echo rc=${PIPESTATUS[0]} >&2"], env=km.env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    _, err = sh.communicate(timeout=120)
    assert "rc=141" in err, err
    assert poll(lambda: home_processes(km.home), lambda v: v == [], 30, "no process left") == []
    assert session_dirs(km.home) == [] and run_files(km.home) == []
    assert_next_run_works(km)


@pytest.mark.parametrize("lang", ["bash", "python"])
def test_run_sigkill_mid_cell_lifeline_and_next_start(km, lang):
    p, procs, sdir = start_run_mid_cell(km, lang)
    p.kill()
    p.wait(30)
    # the lifeline: the kernels end with their owner, however it ended
    assert_all_gone(procs, "run killed by SIGKILL")
    # the session directory waits for the next manager start
    assert sdir in session_dirs(km.home)
    assert_next_run_works(km)
    assert sdir not in session_dirs(km.home)
    assert session_dirs(km.home) == [] and run_files(km.home) == []
    assert home_processes(km.home) == []


def _pidfd_getfd(pid, fd):
    """A copy of process pid's descriptor fd (pidfd_getfd(2): ptrace access,
    which the test has over its own child or as root)."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        r = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd (x86_64, arm64, ...)
        if r < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"pidfd_getfd({pid}, {fd}): {os.strerror(e)}")
        return r
    finally:
        os.close(pidfd)


def _owner_pipe_writers(run_pid, kernel_pid):
    """The run's descriptors that are the write end of the kernel's owner
    pipe (its --owner-fd N)."""
    argv = Path(f"/proc/{kernel_pid}/cmdline").read_bytes().split(b"\0")
    n = int(argv[argv.index(b"--owner-fd") + 1])
    pipe = os.readlink(f"/proc/{kernel_pid}/fd/{n}")
    return [int(fd.name) for fd in Path(f"/proc/{run_pid}/fd").iterdir()
            if os.readlink(fd) == pipe]


def test_orphan_kernel_without_lifeline_is_reaped_by_next_start(km):
    """A kernel whose owner died and that did not go by itself (a kernel that
    knows no lifeline, like a user's kernelspec) is killed by the next
    manager's start-up scan, found by its pid file.

    The lifeline is defeated by holding a copy of the owner pipe's write end,
    so the kernel sees no end-of-file when its owner dies. (Not by stopping
    the kernel: a stopped process group orphaned by its parent's death gets
    SIGHUP and SIGCONT from the kernel, and the kernel server ends on SIGHUP
    as it should.)"""
    p, procs, sdir = start_run_mid_cell(km, "bash")
    ks = kernel_servers(km.home)
    assert len(ks) == 1, describe(ks)
    writers = _owner_pipe_writers(p.pid, ks[0])
    assert writers, f"no owner pipe of {describe(ks)} in the run {p.pid}"
    held = [_pidfd_getfd(p.pid, fd) for fd in writers]
    try:
        p.kill()
        p.wait(30)
        assert all(kutil.alive(x) for x in ks), describe(procs)
        rc, res, nxt = km.results("run", "--lang", "bash", "-c", "echo next-ok")
        assert rc == 0 and res and "next-ok" in res[0]["stdout"], (nxt.stderr, res)
        # killed by the scan, not gone by itself
        assert f"killing kernel {ks[0]} " in nxt.stderr, nxt.stderr
        assert_all_gone(procs, "orphan after the next start")
    finally:
        for fd in held:
            os.close(fd)
    assert sdir not in session_dirs(km.home)
    assert session_dirs(km.home) == [] and run_files(km.home) == []


def test_reused_owner_pid_is_not_alive(km):
    """A pid file whose owner pid now belongs to another process (a pid
    reused) is an orphan all the same: the owner's start time differs."""
    run = km.run_dir
    run.mkdir(mode=0o700, exist_ok=True)
    # the owner: this test process (alive) with a start time that is not its own
    (run / "deadbeef0000-bash.pid").write_text(f"0 0 {os.getpid()} 1\n")
    (run / "deadbeef0000-bash.json").write_text("{}")
    if km.user == "nobody":
        for f in run.iterdir():
            os.chown(f, sbxutil.NOBODY, sbxutil.NOBODY)
        os.chown(run, sbxutil.NOBODY, sbxutil.NOBODY)
    assert_next_run_works(km)
    assert run_files(km.home) == []


# ------------------------------------------------------------------ daemon killed

def test_daemon_killed_with_pool_leaves_nothing(km):
    d = km.serve("--pool", "2")
    rc, res, p = km.results("exec", "--session", "keep", "--lang", "python", "-c",
                            "x = 41\nopen('kept.txt', 'w').write('kept')")
    assert rc == 0, p.stderr
    sj = json.loads((km.home / "sessions" / "keep" / "session.json").read_text())
    # a session taken from the pool keeps its pool entry (its workspace)
    handed_out = [Path(sj["pool_dir"]).name] if sj.get("pool_dir") else []
    poll(km.pool_ready, lambda n: n == 2, 120, "pool of 2 ready")
    kernels = kernel_servers(km.home)
    assert len(kernels) >= 3, describe(kernels)  # 2 pool entries + the session's python
    procs = family(kernels)
    pool_dirs = list((km.home / "pool").iterdir())
    assert len(pool_dirs) == 2 + len(handed_out)
    d.kill()
    d.wait(30)
    # every kernel of the daemon, pool ones included, ends by its lifeline
    assert_all_gone(procs, "daemon killed by SIGKILL")
    # the next daemon starts cleanly (no pool this time): nothing stale in run/
    d2 = km.serve()
    assert d2.poll() is None
    # the dead daemon's unused pool entries are gone; a handed-out one stays
    pool = km.home / "pool"
    assert (sorted(p.name for p in pool.iterdir()) if pool.exists() else []) == handed_out
    left = [f for f in run_files(km.home) if not f.startswith(f"owner-{d2.pid}.")]
    assert left == [], left
    # the session comes back, with a fresh kernel that says its state was lost
    rc, res, p = km.results("exec", "--session", "keep", "--lang", "python", "-c",
                            "print(open('kept.txt').read())\nprint(x + 1)")
    assert res and "kept" in res[0]["stdout"], res  # the workspace survived
    assert res and res[0]["kernel"]["restarted"] is True, res
    assert res[0]["kernel"]["state_preserved"] is False
    rc, res, p = km.results("exec", "--session", "keep", "--lang", "python", "-c",
                            "x = 1\nprint(x + 1)")
    assert rc == 0 and "2" in res[0]["stdout"], (res, p.stderr)
    km.run("close", "keep")
    # a daemon stopped normally stops its kernels
    kernels = family(kernel_servers(km.home))
    assert km.run("serve", "--stop", timeout=60).returncode == 0
    d2.wait(60)
    assert_all_gone(kernels, "daemon stopped")
    assert run_files(km.home) == []


def test_daemon_stopped_with_pool_stops_pool(km):
    d = km.serve("--pool", "2")
    poll(km.pool_ready, lambda n: n == 2, 120, "pool of 2 ready")
    procs = family(kernel_servers(km.home))
    assert procs
    assert km.run("serve", "--stop", timeout=60).returncode == 0
    d.wait(60)
    assert_all_gone(procs, "daemon stopped")
    assert not (km.home / "pool").exists() or not list((km.home / "pool").iterdir())
    assert run_files(km.home) == []


# ------------------------------------------------------------------ kernel killed

def test_kernel_server_killed_next_exec_restarts_honestly(km):
    km.serve()
    rc, res, p = km.results("exec", "--session", "k", "--lang", "python", "-c", "x = 1")
    assert rc == 0, p.stderr
    (kpid,) = kernel_servers(km.home)
    procs = family([kpid])
    os.kill(kpid, signal.SIGKILL)
    # its sandbox and worker go with it (their parent-death signals)
    assert_all_gone(procs, "kernel server killed")
    rc, res, p = km.results("exec", "--session", "k", "--lang", "python", "-c", "print(x)")
    r = res[0]
    assert r["kernel"]["restarted"] is True and r["kernel"]["state_preserved"] is False, r
    assert "died" in (r["kernel"]["reason"] or ""), r
    rc, res, p = km.results("exec", "--session", "k", "--lang", "python", "-c", "print(2)")
    assert rc == 0 and res[0]["stdout"].strip() == "2", res
    # the dead kernel's files went with it (the session sandbox's holder,
    # ID-sbx.pid, lives on with the session)
    names = run_files(km.home)
    assert len([n for n in names if n.endswith(".pid") and not n.endswith("-sbx.pid")]) == 1, \
        names
    assert km.run("close", "k").returncode == 0
