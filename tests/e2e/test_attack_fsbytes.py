"""The host's cost of a cell's file report and of files.list is bounded in
bytes (files_scan_bytes), not only in entries, and a report that did not see
everything says so and why (truncated.files) instead of listing a
"complete" workspace with holes in it.

Attacks through the real manager (daemon, strict sandbox, Python worker):
a cell plants a tree that is cheap on disk but expensive to hold as paths
(deep, long names, long link text), or hides files in a mode-000 directory.
Each asserts the bound held (the daemon's peak RSS, VmHWM, against the
configured budget — never a timing), the result names the limit or the
directory, and the session and another one still run code. Run as the
invoking user and, as root, also as nobody.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402
from sbxutil import IS_ROOT, NOBODY, SETPRIV, USERS  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"),
                                reason="build/kernel-python not built")

KiB = 1024
MiB = 1024 * KiB
BUDGET = 1 * MiB  # files_scan_bytes of these tests: small, yet past the ~520 KiB that the
# 63 directories of DEEP_LINKS cost as paths


def strict_available():
    home = tempfile.mkdtemp(prefix="kmd")
    try:
        r = subprocess.run([kutil.binary("kernelmgr"), "doctor", "--json"], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, KERNELMGR_HOME=home))
        return bool(json.loads(r.stdout)["sandbox"]["levels"]["strict"]["available"])
    except (ValueError, KeyError, TypeError):
        return False
    finally:
        shutil.rmtree(home, ignore_errors=True)


class Mgr:
    """build/kernelmgr with a private KERNELMGR_HOME and the strict sandbox,
    as the invoker or as nobody (setpriv; binaries copied where nobody can
    run them)."""

    def __init__(self, user, config):
        if user == "nobody" and not IS_ROOT:
            pytest.skip("the nobody variant needs root to switch users")
        self.user = user
        self.home = Path(tempfile.mkdtemp(prefix="kmb", dir="/tmp"))
        cfg = {"sandbox": "strict", "python": None}
        cfg.update(config)
        (self.home / "config.json").write_text(json.dumps(cfg))
        self.env = dict(os.environ, KERNELMGR_HOME=str(self.home))
        for k in ("VIRTUAL_ENV", "KERNELMGR_PYTHON", "PYTHONPATH"):
            self.env.pop(k, None)
        self.prefix = []
        self.km = kutil.binary("kernelmgr")
        if user == "nobody":
            self.km = sbxutil.nobody_binary("kernelmgr")
            self.prefix = SETPRIV
            self.env["HOME"] = str(self.home)
            self.env.pop("XDG_CACHE_HOME", None)
            self.env.pop("XDG_STATE_HOME", None)
            self.env["PATH"] = ":".join(
                p for p in self.env.get("PATH", "/usr/bin:/bin").split(":")
                if not p.startswith("/root")) or "/usr/bin:/bin"
            for root, dirs, files in os.walk(self.home):
                for n in dirs + files + [""]:
                    os.chown(os.path.join(root, n), NOBODY, NOBODY)

    def run(self, *args, timeout=300):
        return subprocess.run([*self.prefix, self.km, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, cwd="/")

    def exec(self, session, code):
        p = self.run("exec", "--session", session, "--lang", "python", "-c", code, "--json")
        res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        assert res, (p.stdout, p.stderr)
        return res[0]

    def files(self, session):
        p = self.run("files", session, "--json")
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def daemon_pid(self):
        return int((self.home / "daemon.pid").read_text())

    def assert_runs(self, session):
        r = self.exec(session, "print(6 * 7)")
        assert r["status"] == "ok" and r["stdout"] == "42\n", r

    def close(self):
        try:
            self.run("serve", "--stop", timeout=60)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def mgr_factory():
    made = []

    def make(user, config=None):
        if not strict_available():
            pytest.skip("the strict sandbox is not available on this host")
        m = Mgr(user, config or {})
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def vm(pid, key):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * KiB
    raise AssertionError(f"no {key} for {pid}")


# 63 levels of 255-byte names, then N symlinks of 250-byte names and
# 4000-byte text in the deepest one: ~4 KiB each on disk, ~20 KiB each as
# a path plus its text on the host.
DEEP_LINKS = """
import os
fd = os.open('.', os.O_RDONLY)
for i in range(63):
    n = ('d%02d' % i) + 'x' * 252
    os.mkdir(n, dir_fd=fd)
    nfd = os.open(n, os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = nfd
for i in range({n}):
    os.symlink('T' * 4000, ('%05d' % i) + 'y' * 250, dir_fd=fd)
print('planted')
"""


@pytest.mark.parametrize("user", USERS)
def test_deep_long_named_symlinks_stop_at_the_byte_budget(mgr_factory, user):
    m = mgr_factory(user, {"files_scan_bytes": BUDGET})
    m.assert_runs("s")
    pid = m.daemon_pid()
    base = vm(pid, "VmHWM")
    # 6000 links: ~120 MiB per walk held as paths before the byte budget
    r = m.exec("s", DEEP_LINKS.format(n=6000))
    assert r["status"] == "ok" and r["stdout"] == "planted\n", r
    why = r["truncated"]["files"]
    assert why["scan_limit"] == "files_scan_bytes: 1 MiB of paths and link text per walk", why
    assert why["reason"].startswith("not every file was walked: the walk stopped at "
                                    "files_scan_bytes: 1 MiB"), why
    assert r["files"], "what fits in the budget is still reported"
    assert len(json.dumps(r["files"])) <= BUDGET
    # the listing: the same budget, the same reason, and it is delivered
    listing = m.files("s")
    assert listing["incomplete"] is True
    assert listing["truncated"]["files"]["scan_limit"].startswith("files_scan_bytes: 1 MiB")
    assert 0 < len(listing["files"]) < 6000
    assert len(json.dumps(listing["files"])) <= 2 * BUDGET
    # two walks of the next exec (before and after) hold the same bound
    r = m.exec("s", "print(6 * 7)")
    assert r["status"] == "ok" and r["stdout"] == "42\n", r
    assert r["truncated"]["files"]["scan_limit"].startswith("files_scan_bytes"), r
    grown = vm(pid, "VmHWM") - base
    print(f"daemon VmHWM {base >> 20} MiB, peak growth {grown >> 20} MiB (budget {BUDGET >> 10} KiB)")
    # without the budget: ~120 MiB per walk, ~240 MiB for the exec after it
    assert grown < 16 * BUDGET + 16 * MiB, f"daemon grew by {grown >> 20} MiB"
    m.assert_runs("s")
    m.assert_runs("other")


LOCK = """
import os
os.makedirs('a/locked', exist_ok=True)
for i in range(3):
    open('a/locked/f%d.txt' % i, 'w').write('x')
open('a/seen.txt', 'w').write('y')
os.chmod('a/locked', {mode})
print('ok')
"""


def hidden_named(why):
    return "unreadable directory: a/locked" in (why or {}).get("not_walked", [])


@pytest.mark.parametrize("user", USERS)
def test_unreadable_directory_is_named_not_hidden(mgr_factory, user):
    m = mgr_factory(user)
    # seen first, readable: its files are created
    r = m.exec("s", LOCK.format(mode="0o755"))
    assert r["status"] == "ok", r
    assert {"a/locked/f0.txt", "a/seen.txt"} <= {f["path"] for f in r["files"]}, r
    assert "files" not in r["truncated"], r
    # then mode 000: a daemon that cannot read it (run as a user) must say so
    # rather than report the files deleted or list a "complete" workspace
    # without them; one that can (root) lists them
    r = m.exec("s", "import os\nos.chmod('a/locked', 0)\nprint('locked')")
    assert r["status"] == "ok", r
    paths = {f["path"]: f["change"] for f in r["files"]}
    assert "a/locked/f0.txt" not in paths, f"reported {paths}"
    listing = m.files("s")
    listed = {f["path"] for f in listing["files"]}
    why = listing.get("truncated", {}).get("files")
    if "a/locked/f0.txt" not in listed:
        assert listing["incomplete"] is True and hidden_named(why), listing
        assert hidden_named(r["truncated"].get("files")), r
    else:
        assert listing["incomplete"] is False and why is None, listing
    if user == "nobody":
        assert hidden_named(why), listing
        assert hidden_named(r["truncated"]["files"]), r
    assert "a/seen.txt" in listed
    # readable again (this cell's "before" walk may still name it): complete,
    # nothing lost, the sessions run
    r = m.exec("s", "import os\nos.chmod('a/locked', 0o755)\nprint('open')")
    assert r["status"] == "ok", r
    listing = m.files("s")
    assert listing["incomplete"] is False and "truncated" not in listing, listing
    assert "a/locked/f2.txt" in {f["path"] for f in listing["files"]}
    m.assert_runs("s")
    m.assert_runs("other")


DEEP = """
import os
p = '.'
for i in range(70):
    p = os.path.join(p, 'deep')
os.makedirs(p)
open(os.path.join(p, 'bottom.txt'), 'w').write('z')
print('deep')
"""


@pytest.mark.parametrize("user", USERS)
def test_too_deep_directory_is_named(mgr_factory, user):
    m = mgr_factory(user)
    r = m.exec("s", DEEP)
    assert r["status"] == "ok", r
    assert not any(f["path"].endswith("bottom.txt") for f in r["files"])
    notes = r["truncated"]["files"]["not_walked"]
    assert len(notes) == 1 and notes[0].startswith("too deep: deep/deep/"), notes
    assert notes[0].endswith("... (more than 64 levels)"), notes
    listing = m.files("s")
    assert listing["incomplete"] is True
    assert listing["truncated"]["files"]["not_walked"] == notes
    # the human listing says it too
    p = m.run("files", "s")
    assert p.returncode == 0 and "(incomplete: not every file was walked: too deep: deep/" \
        in p.stdout, p.stdout
    m.assert_runs("s")
