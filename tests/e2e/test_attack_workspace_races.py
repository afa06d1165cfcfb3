"""Host-side symlink and rename races, through the real
manager (build/kernelmgr, its daemon and a real Python kernel), as the
invoking user and as nobody.

Sandboxed code swaps a directory of its workspace with a symlink to a
host-only directory — renameat2(RENAME_EXCHANGE) in a loop, from a background
process started by a cell — while the test asks the host side to read the
workspace: `kernelmgr files`, the change report of `exec`, `kernelmgr
export`, the MCP tools read_file / list_files, and `kernelmgr close` (the
workspace's removal). The host directory holds a file only its owner may
read whose first bytes would sniff as PNG, a symlink whose text is a token,
and marker files. The attack failed when none of the host's bytes, its MIME
type or its link text appears in any output, symlink targets are only the
text of links the cell made, no marker was deleted or changed, and the
session still runs code afterwards. All waits poll with a deadline.
"""
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
from sbxutil import IS_ROOT, NOBODY, SETPRIV, USERS  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"),
                                reason="build/kernel-python not built")

PNG = b"\x89PNG\r\n\x1a\n"
ROUNDS = 25          # host-side reads per reader while the race runs
CLOSES = 8           # sessions closed while their workspace is being swapped
SWAP_SECONDS = 120   # the swapper's own bound, should the test die
NEST = 12            # extra directory/symlink pairs swapped
PAIRS = ["a", "al", "p", "pl", "n", "nl"] + [x for i in range(NEST) for x in (f"n{i}", f"n{i}l")]

SWAPPER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pairs = [(a.encode(), b.encode()) for a, b in zip(sys.argv[1::2], sys.argv[2::2])]
end = time.monotonic() + %d
n = 0
while os.path.exists('.swap-on') and time.monotonic() < end:
    for a, b in pairs:
        libc.renameat2(-100, a, -100, b, 2)   # AT_FDCWD, RENAME_EXCHANGE
    n += 1
""" % SWAP_SECONDS


def _kernelmgr_for_nobody():
    """build/kernelmgr with its kernels and share/ beside it (it finds them
    there), copied where nobody can execute them."""
    d = Path(tempfile.mkdtemp(prefix="km-race-bin-"))
    os.chmod(d, 0o755)
    for b in ("kernelmgr", "kernel-bash", "kernel-python", "kernelmgr-sandbox"):
        shutil.copy2(kutil.BUILD / b, d / b)
    shutil.copytree(kutil.BUILD / "share", d / "share")
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            os.chmod(p, 0o755 if os.path.isdir(p) or os.access(p, os.X_OK) else 0o644)
    return d


class RaceMgr(mgrutil.Mgr):
    """mgrutil.Mgr run as the invoker or, through setpriv, as nobody."""

    def __init__(self, user):
        super().__init__()
        self.user = user
        self.prefix, self.km, self.bindir = [], mgrutil.KM, None
        self.uid = os.geteuid()
        if user == "nobody":
            self.bindir = _kernelmgr_for_nobody()
            self.prefix, self.km, self.uid = SETPRIV, str(self.bindir / "kernelmgr"), NOBODY
            for root, dirs, files in os.walk(self.home):
                for n in [root, *(os.path.join(root, x) for x in dirs + files)]:
                    os.chown(n, NOBODY, NOBODY)

    def run(self, *args, input=None, timeout=120, check_json=True):
        return subprocess.run([*self.prefix, self.km, *args], input=input, capture_output=True,
                              text=True, env=self.env, timeout=timeout)

    def close(self):
        super().close()
        if self.bindir:
            shutil.rmtree(self.bindir, ignore_errors=True)


class Host:
    """A host-only directory the workspace must never reach: owned by the
    manager's user, mode 0700, with a 0600 secret, a symlink and markers."""

    def __init__(self, uid):
        self.base = Path(tempfile.mkdtemp(prefix="km-race-host-", dir="/tmp"))
        os.chmod(self.base, 0o755)
        self.token = os.urandom(6).hex()
        self.dir = self.base / "hostonly"
        self.dir.mkdir(mode=0o700)
        self.secret_bytes = PNG + b"HOSTSECRET-" + self.token.encode() + b"\n"
        (self.dir / "secret").write_bytes(self.secret_bytes)
        os.chmod(self.dir / "secret", 0o600)
        os.symlink("HOSTLINK-" + self.token, self.dir / "0")
        self.markers = {}
        for i in range(4):
            p = self.dir / f"marker{i}"
            p.write_text(f"keep {i} {self.token}\n")
            self.markers[p] = p.read_bytes()
        (self.dir / "d").mkdir()
        (self.dir / "d" / "marker-deep").write_text("deep")
        self.markers[self.dir / "d" / "marker-deep"] = b"deep"
        for root, dirs, files in os.walk(self.dir):
            for n in [root, *(os.path.join(root, x) for x in dirs + files)]:
                os.lchown(n, uid, uid)

    def forbidden(self):
        """Strings that would show the host directory leaked."""
        return ["HOSTSECRET", self.token, "HOSTLINK", "image/png", "marker"]

    def assert_untouched(self):
        assert (self.dir / "secret").read_bytes() == self.secret_bytes
        assert os.readlink(self.dir / "0") == "HOSTLINK-" + self.token
        for p, content in self.markers.items():
            assert p.read_bytes() == content, f"{p} was changed or deleted"
        assert sorted(os.listdir(self.dir)) == ["0", "d", "marker0", "marker1", "marker2",
                                                "marker3", "secret"]

    def close(self):
        shutil.rmtree(self.base, ignore_errors=True)


def attacker_cell(host_dir):
    """Python for a cell: builds the swap pairs in the workspace and starts
    the swapper in the background (it outlives the cell)."""
    return f"""
import os, subprocess, sys
for d in ('a', 'p', 'n/deep'):
    os.makedirs(d, exist_ok=True)
open('a/secret', 'w').write('just text\\n')
for link, text in (('a/0', 'LINKTEXT'), ('p/0', 'LINKTEXT'), ('n/deep/up', {str(host_dir)!r}),
                   ('al', {str(host_dir)!r}), ('pl', '/proc/self/fd'), ('nl', {str(host_dir)!r}),
                   ('rootlink', '/')):
    if not os.path.lexists(link):
        os.symlink(text, link)
for i in range({NEST}):  # more pairs, more chances for a path-based walk to cross
    os.makedirs(f'n{{i}}/x', exist_ok=True)
    for j in range(8):
        open(f'n{{i}}/x/f{{j}}', 'w').close()
    if not os.path.lexists(f'n{{i}}l'):
        os.symlink({str(host_dir)!r}, f'n{{i}}l')
open('.swap-on', 'w').close()
subprocess.Popen([sys.executable, '-c', {SWAPPER!r}, *{PAIRS!r}],
                 start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('STAGED')
"""


ALLOWED_TARGETS = {"LINKTEXT", "/proc/self/fd", "/"}


def check_targets(entries, host):
    for e in entries:
        if "target" in e:
            assert e["target"] in ALLOWED_TARGETS | {str(host.dir)}, e
        # the walk never entered the host directory through a swapped link
        # (the real directories move between "a" and "al": both are fine)
        assert "marker" not in e["path"], e
        assert e.get("mime") != "image/png", e


def wait_swapping(ws, deadline=30):
    """Until ws/a has been seen both as a directory and as a symlink."""
    seen = set()
    end = time.monotonic() + deadline
    while time.monotonic() < end and len(seen) < 2:
        try:
            seen.add(os.path.islink(ws / "a"))
        except OSError:
            pass
    assert len(seen) == 2, "the swapper never ran"


class Mcp:
    """`kernelmgr mcp` on pipes, as the manager's user."""

    def __init__(self, m):
        self.p = subprocess.Popen([*m.prefix, m.km, "mcp"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=m.env)
        self.n = 0
        init = self.ask("initialize", {"protocolVersion": "2025-03-26", "capabilities": {},
                                       "clientInfo": {"name": "race", "version": "0"}})
        assert "result" in init, init
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")
        self.p.stdin.flush()

    def ask(self, method, params, timeout=60):
        self.n += 1
        self.send({"jsonrpc": "2.0", "id": self.n, "method": method, "params": params})
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            r, _, _ = select.select([self.p.stdout], [], [], max(left, 0))
            assert r, f"no answer to {method} within {timeout} s"
            line = self.p.stdout.readline()
            assert line, "the MCP server closed stdout"
            msg = json.loads(line)
            if msg.get("id") == self.n:
                return msg

    def tool(self, name, args):
        return self.ask("tools/call", {"name": name, "arguments": args})

    def close(self):
        self.p.stdin.close()
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.p.stdout.close()
        self.p.stderr.close()


@pytest.fixture(params=USERS)
def race(request):
    if request.param == "nobody" and not IS_ROOT:
        pytest.skip("the nobody variant needs root to switch users")
    m = RaceMgr(request.param)
    host = Host(m.uid)
    yield m, host
    m.close()
    host.close()


def workspace_of(m, session):
    p = m.run("files", session, "--json")
    assert p.returncode == 0, p.stderr
    return Path(json.loads(p.stdout)["workspace"])


def test_readers_never_follow_a_swapped_link(race):
    m, host = race
    rc, res, p = m.exec("race", attacker_cell(host.dir), "--lang", "python")
    assert rc == 0 and "STAGED" in res[0]["stdout"], (p.stdout, p.stderr)
    ws = workspace_of(m, "race")
    wait_swapping(ws)
    outputs = []
    mcp = Mcp(m)
    try:
        for i in range(ROUNDS):
            p = m.run("files", "race", "--json")
            assert p.returncode == 0, p.stderr
            listing = json.loads(p.stdout)
            check_targets(listing["files"], host)
            outputs.append(p.stdout)
            # the change report of an execution sniffs what changed (the
            # swapped names come and go: a/secret, al/secret, p/0, pl/0...)
            rc, res, p = m.exec("race", f"open('top.txt', 'w').write('round {i}')",
                                "--lang", "python")
            assert rc == 0, p.stderr
            check_targets(res[0]["files"], host)
            outputs.append(p.stdout)
            for path in ("a/secret", "al/secret", "a/0", "pl/0", "rootlink/etc/passwd"):
                r = mcp.tool("read_file", {"session": "race", "path": path})
                assert "result" in r, r
                outputs.append(json.dumps(r))
            r = mcp.tool("list_files", {"session": "race"})
            outputs.append(json.dumps(r))
            sc = r.get("result", {}).get("structuredContent") or {}
            check_targets(sc.get("files", []), host)
        nb = m.home / "race.ipynb"  # the manager's user can write there
        p = m.run("export", "race", "-o", str(nb))
        assert p.returncode == 0, p.stderr
        outputs += [p.stdout, nb.read_text()]
    finally:
        mcp.close()
    blob = "\n".join(outputs)
    for bad in host.forbidden():
        assert bad not in blob, f"{bad!r} leaked into a host-side report"
    host.assert_untouched()
    # still a working session, the race still on
    rc, res, p = m.exec("race", "print('alive', 6 * 7)", "--lang", "python")
    assert rc == 0 and res[0]["stdout"] == "alive 42\n", p.stderr
    assert m.run("close", "race").returncode == 0
    host.assert_untouched()


def test_close_while_swapping_deletes_nothing_outside(race):
    m, host = race
    for i in range(CLOSES):
        name = f"close{i}"
        rc, res, p = m.exec(name, attacker_cell(host.dir), "--lang", "python")
        assert rc == 0 and "STAGED" in res[0]["stdout"], (p.stdout, p.stderr)
        ws = workspace_of(m, name)
        wait_swapping(ws)
        # A plain process as the manager's user keeps swapping even after the
        # sandbox is gone (a strict sandbox dies with its kernel at close):
        # the removal itself races with it.
        harness = subprocess.Popen([*m.prefix, "/usr/bin/python3", "-c", SWAPPER, *PAIRS], cwd=ws, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            p = m.run("close", name)
            assert p.returncode == 0, p.stderr
        finally:
            harness.kill()
            harness.wait()
            harness.stderr.close()
        host.assert_untouched()
        assert not ws.exists(), f"{ws} was not removed"
    rc, res, p = m.exec("after", "print('alive')", "--lang", "python")
    assert rc == 0 and res[0]["stdout"] == "alive\n", p.stderr
    host.assert_untouched()
