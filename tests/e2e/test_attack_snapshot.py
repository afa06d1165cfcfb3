"""Attacks on snapshots. Everything a snapshot holds was written by sandboxed
code, and sandboxed code can replace the very function that writes it
(the driver is a module it can reach), so these tests do exactly that: the
"kernel" plants symlinks to host files, FIFOs, huge sparse files, a flood of
lost names, and pickles that run code when loaded. Each attack must fail —
the host copies only bounded regular files, never follows a link, never
opens a FIFO, never unpickles — AND the service must go on working."""
import json
import os
import stat
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="build/kernel-python and build/kernel-bash not built")

STRICT = {"sandbox": "strict"}

# Replaces the driver's snapshot handler with one that writes what an
# attacker wants into the staging directory and says "ok".
EVIL_SAVE = r'''
import builtins, os
drv = builtins.__kernelmgr_driver__
def evil(action, path, max_bytes):
    if action == "save":
        os.symlink("/etc/shadow", os.path.join(path, "ns.pkl"))
        os.symlink(TARGET, os.path.join(path, "state.json"))
        os.mkfifo(os.path.join(path, "fifo"))
        os.mkdir(os.path.join(path, "sub"))
        with open(os.path.join(path, "sub", "inner"), "w") as f:
            f.write("x")
        with open(os.path.join(path, "plain"), "w") as f:
            f.write("plain bytes")
        if HUGE:
            with open(os.path.join(path, "huge"), "w") as f:
                f.truncate(HUGE)
        lost = [{"name": "n%d" % i + "x" * 5000, "type": "t" * 5000, "reason": "r"}
                for i in range(2000)]
        drv._emit({"type": "snapshot_reply", "status": "ok", "lost": lost,
                   "execution_count": 2**62, "names": 1})
    else:
        drv._emit({"type": "snapshot_reply", "status": "ok", "lost": [], "execution_count": -5})
drv._snapshot = evil
'''


def py(mgr, session, code):
    rc, res, p = mgr.exec(session, code, "--lang", "python")
    assert res, p.stderr
    return res[-1]


def store_entries(mgr, session):
    root = mgr.home / "sessions" / session / "snapshots"
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            out.append(Path(dirpath) / n)
    return out


def service_works(mgr):
    r = py(mgr, "bystander-%s" % uuid.uuid4().hex[:6], "print(6 * 7)")
    assert r["status"] == "ok" and r["stdout"] == "42\n", r


@pytest.mark.parametrize("huge", [0, 900 << 20])
def test_planted_links_fifos_and_huge_files_are_never_followed(make_mgr, huge):
    mgr = make_mgr(STRICT)
    assert py(mgr, "victim", "secret = 'victim'")["status"] == "ok"
    target = str(mgr.home / "sessions" / "victim" / "session.json")
    code = EVIL_SAVE.replace("TARGET", repr(target)).replace("HUGE", str(huge))
    r = py(mgr, "evil", code)
    assert r["status"] == "ok", r
    p = mgr.run("snapshot", "evil", "--tag", "t", "--json", timeout=300)
    entries = store_entries(mgr, "evil")
    for e in entries:
        st = os.lstat(e)
        assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), e  # no link, no FIFO
        assert not stat.S_ISREG(st.st_mode) or st.st_size < (256 << 20), e
    assert not any(b"root:" in e.read_bytes() for e in entries if e.is_file() and
                   not e.is_symlink() and e.stat().st_size < 1 << 20)
    if huge:
        # a sparse 900 MiB file (under the sandbox's file size limit) passes snapshot_max: refused by name, nothing stored
        assert p.returncode != 0 and "snapshot_max=268435456" in p.stderr, p.stderr
        assert not any(e.name == "t" for e in entries), entries
    else:
        assert p.returncode == 0, p.stderr
        man = json.loads(p.stdout)
        files = man["kernels"]["python"]["files"]
        # only the regular file at the top was copied: not the links, the
        # FIFO or the subdirectory
        assert set(files) == {"plain"}, files
        lost = man["kernels"]["python"]["lost"]
        assert len(lost) == 1000 and all(len(x["name"]) <= 200 for x in lost)
        # the victim's session.json is where it was, unread by the attacker's snapshot
        assert json.loads(Path(target).read_text())["name"] == "victim"
        # restoring it: the kernel (still the attacker's function) gets only
        # regular files, and the execution count it claims is not taken
        p = mgr.run("restore", "evil", "--tag", "t", "--json", timeout=300)
        assert p.returncode == 0, p.stderr
        r = py(mgr, "evil", "1")
        assert r["status"] == "ok", r
    # the attacker's session and every other still work
    assert py(mgr, "victim", "secret")["result"]["text/plain"] == "'victim'"
    service_works(mgr)


def test_a_pickle_that_runs_code_on_load_runs_it_in_the_sandbox_only(make_mgr):
    mgr = make_mgr(STRICT)
    marker = "/tmp/km-snapshot-pwned-%s" % uuid.uuid4().hex
    code = f'''
import os
class Bomb:
    def __reduce__(self):
        return (os.system, ("touch {marker}; echo pwned > /proc/1/comm 2>/dev/null",))
b = Bomb()
ok = 1
'''
    assert py(mgr, "pk", code)["status"] == "ok"
    p = mgr.run("snapshot", "pk", "--tag", "t", "--json")
    assert p.returncode == 0, p.stderr
    # the host stored bytes; loading happens in the sandbox when restored
    p = mgr.run("restore", "pk", "--tag", "t", "--json")
    assert p.returncode == 0, p.stderr
    assert not os.path.exists(marker), "the pickle ran on the host"
    r = py(mgr, "pk", f"import os\nprint(os.path.exists({marker!r}), ok)")
    # it ran inside the sandbox (its private /tmp), and the session works
    assert r["status"] == "ok" and r["stdout"].endswith("1\n"), r
    assert not os.path.exists(marker)
    service_works(mgr)


def test_a_fork_shares_no_writable_file_with_its_source(make_mgr):
    mgr = make_mgr(STRICT)
    code = ("import os\nos.makedirs('d/e', exist_ok=True)\n"
            "open('d/e/f.bin', 'wb').write(os.urandom(1 << 20))\n"
            "open('top.txt', 'w').write('t')\nos.symlink('/etc/passwd', 'link')\nv = 1")
    assert py(mgr, "orig", code)["status"] == "ok"
    p = mgr.run("fork", "orig", "copy", "--json")
    assert p.returncode == 0, p.stderr
    src = Path(json.loads(mgr.run("sessions", "--json").stdout)[0]["workspace"]).parent
    ws_src = mgr.home / "sessions" / "orig" / "workspace"
    ws_dst = Path(json.loads(p.stdout)["workspace"])
    src_inodes = {os.lstat(Path(d) / n).st_ino for d, ds, fs in os.walk(ws_src) for n in fs}
    for d, ds, fs in os.walk(ws_dst):
        for n in fs:
            st = os.lstat(Path(d) / n)
            assert st.st_ino not in src_inodes, (d, n)
            assert stat.S_ISLNK(st.st_mode) or st.st_nlink == 1, (d, n)
    # the symlink was copied as a link (its text), never followed
    assert os.readlink(ws_dst / "link") == "/etc/passwd"
    for e in store_entries(mgr, "copy"):
        st = os.lstat(e)
        assert stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode) or st.st_nlink == 1, e
    # writing in the fork changes nothing in the source
    r = py(mgr, "copy", "open('d/e/f.bin', 'wb').write(b'fork')\nv = 2")
    assert r["status"] == "ok", r
    assert (ws_src / "d/e/f.bin").stat().st_size == 1 << 20
    assert py(mgr, "orig", "v")["result"]["text/plain"] == "1"
    assert src.exists()
    service_works(mgr)


class UserMgr(mgrutil.Mgr):
    """A KERNELMGR_HOME owned by user (as root: nobody too), its CLI and
    daemon running as that user."""

    def __init__(self, user, config):
        super().__init__(config)
        self.user = user
        if user == "nobody":
            for p in (self.home, self.home / "config.json"):
                os.chown(p, sbxutil.NOBODY, sbxutil.NOBODY)
        self.env["HOME"] = str(self.home)
        self.bin = sbxutil.kernelmgr_for(user)

    def run(self, *args, input=None, timeout=120, check_json=True):
        import subprocess
        prefix = sbxutil.SETPRIV if self.user == "nobody" else []
        return subprocess.run([*prefix, self.bin, *args], input=input, capture_output=True,
                              text=True, env=self.env, timeout=timeout)


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_planted_links_as_each_user(user):
    """The daemon as root and as nobody: what the sandbox plants is never
    followed, and the store holds only files of the daemon's own user."""
    if user == "nobody" and not sbxutil.IS_ROOT:
        pytest.skip("the nobody variant needs root to switch users")
    mgr = UserMgr(user, STRICT)
    try:
        assert py(mgr, "victim", "secret = 'victim'")["status"] == "ok"
        target = str(mgr.home / "sessions" / "victim" / "session.json")
        code = EVIL_SAVE.replace("TARGET", repr(target)).replace("HUGE", "0")
        assert py(mgr, "evil", code)["status"] == "ok"
        p = mgr.run("snapshot", "evil", "--tag", "t", "--json", timeout=300)
        assert p.returncode == 0, p.stderr
        assert set(json.loads(p.stdout)["kernels"]["python"]["files"]) == {"plain"}
        uid = sbxutil.NOBODY if user == "nobody" else os.geteuid()
        for e in store_entries(mgr, "evil"):
            st = os.lstat(e)
            assert stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode), e
            assert st.st_uid == uid and not (st.st_mode & 0o077), (e, oct(st.st_mode))
        assert py(mgr, "victim", "secret")["result"]["text/plain"] == "'victim'"
        service_works(mgr)
    finally:
        mgr.close()
