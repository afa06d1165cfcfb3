"""The home is trusted state, and its state files are never silently lost.

KERNELMGR_HOME holds what the manager believes: config.json names the
interpreter it probes on the host, session.json names the workspace close
removes. A home (or a directory in it) that another user owns or can write
is refused by every command before anything in it is read; a session.json
naming a workspace outside the home that the manager did not make never
gets that directory removed; a damaged session.json is said, kept aside and
repaired on request, never replaced by a fresh session with other options.

Each attack asserts that it failed, that the host is untouched and that the
service still works afterwards. The real CLI, daemon and kernels, as the
invoking user and (as root) as nobody. Waits are polls with deadlines."""
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402


NOBODY = sbxutil.NOBODY
EUSAGE = 2
EINTERNAL = 6
needs_root = pytest.mark.skipif(not sbxutil.IS_ROOT, reason="needs root to make another "
                                "user's home (the unprivileged case is the nobody variant)")

# every command that touches the home: each must refuse a home that is not ours
COMMANDS = [
    ["exec", "--session", "victim", "-c", "echo hi"],
    ["run", "-c", "echo hi"],
    ["sessions"],
    ["sessions", "--repair", "victim"],
    ["close", "victim"],
    ["files", "victim"],
    ["export", "victim"],
    ["restart", "victim"],
    ["interrupt", "victim"],
    ["connection-file", "victim"],
    ["install", "--session", "victim", "six"],
    ["doctor"],
    ["serve", "--stop"],
]


def owners(root):
    """{path: uid} of everything below root (links not followed)."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            out[p] = os.lstat(p).st_uid
    return out


class Planted:
    """A home holding an attacker's state: config.json whose "python" is a
    script that leaves a marker when run, and sessions/victim/session.json
    that names a directory of the victim as its own workspace."""

    def __init__(self):
        self.base = Path(tempfile.mkdtemp(prefix="kmah", dir="/tmp"))
        os.chmod(self.base, 0o755)
        self.home = self.base / "home"
        self.home.mkdir(mode=0o700)
        self.marker = self.base / "marker" / "PWNED"
        self.marker.parent.mkdir()
        os.chmod(self.marker.parent, 0o777)
        self.script = self.base / "python"
        self.script.write_text(f"#!/bin/sh\ntouch {self.marker}\nexec /usr/bin/python3 \"$@\"\n")
        os.chmod(self.script, 0o755)
        # the victim's directory: must survive every close
        self.victim = Path(tempfile.mkdtemp(prefix="kmvictim", dir="/tmp"))
        (self.victim / "precious.txt").write_text("keep me\n")
        (self.home / "config.json").write_text(json.dumps(
            {"python": str(self.script), "sandbox": mgrutil.SANDBOX}))
        sdir = self.home / "sessions" / "victim"
        sdir.mkdir(parents=True)
        (sdir / "session.json").write_text(json.dumps(
            {"name": "victim", "workspace": str(self.victim), "own_workspace": True,
             "pool_dir": "", "created": 1, "from_pool": False, "options": {}, "kernels": {}}))

    def chown(self, uid):
        for p in [self.home, *self.home.rglob("*")]:
            os.lchown(p, uid, uid)
        os.chown(self.script, uid, uid)

    def env(self):
        return dict(os.environ, KERNELMGR_HOME=str(self.home), HOME=str(self.base))

    def run(self, args, prefix=(), binary=mgrutil.KM):
        return subprocess.run([*prefix, binary, *args], capture_output=True, text=True,
                              env=self.env(), timeout=120, stdin=subprocess.DEVNULL)

    def snapshot(self):
        self.before = owners(self.home)

    def assert_untouched(self):
        assert not self.marker.exists(), "the planted config.json's python ran"
        assert (self.victim / "precious.txt").read_text() == "keep me\n"
        # nothing was created, removed or taken over in the refused home
        assert owners(self.home) == self.before

    def close(self):
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.victim, ignore_errors=True)


@pytest.fixture
def planted():
    p = Planted()
    yield p
    p.close()


def assert_refused(p, path, *reasons):
    assert p.returncode == EUSAGE, p
    assert str(path) in p.stderr, p.stderr
    assert "the kernelmgr home is trusted state" in p.stderr, p.stderr
    for r in reasons:
        assert r in p.stderr, p.stderr


def assert_service_works(make_mgr):
    """A home of one's own still works (a fresh daemon, a kernel, a close)."""
    mgr = make_mgr()
    rc, res, p = mgr.exec("ok", "echo works", "--lang", "bash")
    assert rc == 0 and res[-1]["stdout"] == "works\n", p.stderr
    assert mgr.run("close", "ok").returncode == 0


@needs_root
def test_home_of_another_user_is_refused_by_every_command(planted, make_mgr):
    """root with a home nobody made first (/tmp/km): every command refuses,
    the planted python never runs, the planted workspace is never removed."""
    planted.chown(NOBODY)
    planted.snapshot()
    for args in COMMANDS:
        p = planted.run(args)
        assert_refused(p, planted.home, "is owned by another user", "owner uid 65534",
                       "KERNELMGR_HOME")
    planted.assert_untouched()
    assert_service_works(make_mgr)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_home_writable_by_others_is_refused(planted, make_mgr, mode):
    """A home of ours that group or others can write: anyone could have
    planted its state. Refused by every command, naming its mode."""
    os.chmod(planted.home, mode)
    planted.snapshot()
    for args in COMMANDS:
        p = planted.run(args)
        assert_refused(p, planted.home, "is writable by group or others",
                       f"mode {mode:04o}")
    planted.assert_untouched()
    # fixed (and the planted state removed): the same home works
    os.chmod(planted.home, 0o700)
    (planted.home / "config.json").write_text(json.dumps({"sandbox": mgrutil.SANDBOX}))
    shutil.rmtree(planted.home / "sessions")
    p = planted.run(["exec", "--session", "mine", "-c", "echo fixed", "--lang", "bash"])
    try:
        assert p.returncode == 0 and p.stdout == "fixed\n", p
    finally:
        planted.run(["serve", "--stop"])
    assert_service_works(make_mgr)


@needs_root
@pytest.mark.parametrize("sub", ["sessions", "run", "outputs", "packages", "pool"])
def test_squatted_directory_in_the_home_is_refused(planted, make_mgr, sub):
    """The home is ours but a directory in it is another user's (made there
    first): refused, not adopted, naming that directory."""
    d = planted.home / sub
    d.mkdir(exist_ok=True)
    os.chown(d, NOBODY, NOBODY)
    for args in (["exec", "--session", "victim", "-c", "echo hi"], ["close", "victim"],
                 ["run", "-c", "echo hi"]):
        assert_refused(planted.run(args), d, "is owned by another user")
    assert not planted.marker.exists()
    assert (planted.victim / "precious.txt").exists()
    assert_service_works(make_mgr)


@pytest.mark.parametrize("sub", ["sessions", "run"])
def test_world_writable_directory_in_the_home_is_refused(planted, make_mgr, sub):
    d = planted.home / sub
    d.mkdir(exist_ok=True)
    os.chmod(d, 0o777)
    assert_refused(planted.run(["exec", "--session", "victim", "-c", "echo hi"]), d,
                   "is writable by group or others")
    assert not planted.marker.exists()
    assert (planted.victim / "precious.txt").exists()
    assert_service_works(make_mgr)


@needs_root
def test_nobody_refuses_a_home_root_owns(planted, make_mgr):
    """The other direction: nobody pointed at root's home."""
    os.chmod(planted.home, 0o755)
    os.chmod(planted.home / "sessions", 0o755)
    planted.snapshot()
    binary = sbxutil.kernelmgr_for("nobody")
    for args in (["exec", "--session", "victim", "-c", "echo hi"], ["sessions"],
                 ["close", "victim"], ["run", "-c", "echo hi"]):
        p = planted.run(args, prefix=sbxutil.SETPRIV, binary=binary)
        assert_refused(p, planted.home, "is owned by another user", "owner uid 0",
                       f"uid {NOBODY}")
    planted.assert_untouched()
    assert_service_works(make_mgr)


def stop_daemon(mgr):
    pid = mgr.daemon_pid()
    assert mgr.run("serve", "--stop").returncode == 0
    if pid:
        kutil.poll_until(lambda: os.path.exists(f"/proc/{pid}"), lambda alive: not alive,
                         60, "the daemon exited")


def session_json(mgr, name):
    return json.loads((mgr.home / "sessions" / name / "session.json").read_text())


def test_outside_workspace_is_kept_on_close(make_mgr):
    """A session.json naming a workspace outside the home as its own (and
    no proof the manager made it): close removes the session, keeps the
    directory and says so."""
    mgr = make_mgr()
    outside = Path(tempfile.mkdtemp(prefix="kmoutside", dir="/tmp"))
    try:
        (outside / "precious.txt").write_text("keep me\n")
        for name in ("s", "t"):
            rc, _, p = mgr.exec(name, "echo hi", "--lang", "bash")
            assert rc == 0, p.stderr
        stop_daemon(mgr)
        own_ws = session_json(mgr, "s")["workspace"]
        for name, extra in (("s", {}),
                            # the device and inode of another directory: not this one
                            ("t", {k: session_json(mgr, "s")[k]
                                   for k in ("workspace_dev", "workspace_ino")})):
            o = session_json(mgr, name)
            o.pop("workspace_dev", None)
            o.pop("workspace_ino", None)
            o.update(workspace=str(outside), own_workspace=True, **extra)
            (mgr.home / "sessions" / name / "session.json").write_text(json.dumps(o))
        for name in ("s", "t"):
            p = mgr.run("close", name)
            assert p.returncode == 0, p.stderr
            assert f"its workspace {outside} was not removed (kept)" in p.stderr, p.stderr
            assert (outside / "precious.txt").read_text() == "keep me\n"
            assert not (mgr.home / "sessions" / name).exists()
        # the API says it too
        rc, _, p = mgr.exec("u", "echo hi", "--lang", "bash")
        assert rc == 0 and not os.path.exists(own_ws)
        rc, res, p = mgr.exec("u", "pwd", "--lang", "bash")
        assert rc == 0 and res[-1]["stdout"].strip().startswith(str(mgr.home)), p.stderr
        p = mgr.run("close", "u")
        assert p.returncode == 0 and "not removed" not in p.stderr, p.stderr
    finally:
        shutil.rmtree(outside, ignore_errors=True)


DAMAGE = {
    "garbage": b"SECRET-TEXT not json {{{",
    "truncated": None,  # the first half of the real file
    "empty": b"",
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_session_json_is_kept_said_and_repaired(make_mgr, kind):
    """A damaged session.json: a clear error naming the file and why (not
    its text), the file kept aside, the session not recreated silently,
    another session unaffected, and `sessions --repair` says what it did."""
    mgr = make_mgr()
    rc, _, p = mgr.exec("s", "echo data > kept.txt", "--lang", "bash", "--memory", "300M")
    assert rc == 0, p.stderr
    rc, _, p = mgr.exec("other", "echo mine > other.txt", "--lang", "bash", "--memory", "400M")
    assert rc == 0, p.stderr
    stop_daemon(mgr)
    sj = mgr.home / "sessions" / "s" / "session.json"
    real = sj.read_bytes()
    bad = DAMAGE[kind] if DAMAGE[kind] is not None else real[:len(real) // 2]
    sj.write_bytes(bad)
    for _ in range(2):  # said again, never recreated with the defaults
        rc, res, p = mgr.exec("s", "cat kept.txt", "--lang", "bash")
        assert rc == EINTERNAL and [r["error"]["code"] for r in res] == [EINTERNAL], p
        assert 'session "s" is damaged' in p.stderr, p.stderr
        assert "session.json" in p.stderr and "--repair s" in p.stderr, p.stderr
        reason = {"garbage": "is not valid JSON", "truncated": "ends early",
                  "empty": "is empty"}[kind]
        assert reason in p.stderr, p.stderr
        assert "SECRET" not in p.stderr
        assert not sj.exists()
    aside = sorted(sj.parent.glob("session.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == bad
    # the other session: its options and files as they were
    rc, res, p = mgr.exec("other", "cat other.txt", "--lang", "bash")
    assert rc == 0 and res[-1]["stdout"] == "mine\n", p.stderr
    assert session_json(mgr, "other")["options"]["memory"] == 400 << 20
    # the repair says what it did; the workspace and its files are kept
    p = mgr.run("sessions", "--repair", "s")
    assert p.returncode == 0, p.stderr
    assert "recreated with the configuration's defaults" in p.stderr, p.stderr
    assert "kept with its files" in p.stderr and str(aside[0]) in p.stderr, p.stderr
    rc, res, p = mgr.exec("s", "cat kept.txt", "--lang", "bash")
    assert rc == 0 and res[-1]["stdout"] == "data\n", p.stderr
    assert aside[0].read_bytes() == bad  # never overwritten
    p = mgr.run("sessions", "--repair", "s", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["action"] == "none", p
    assert mgr.run("sessions", "--repair", "nosuch").returncode == 3


def test_damaged_file_of_a_running_session_is_rewritten(make_mgr):
    """While the daemon holds the session, a repair rewrites session.json
    from the session's own options: nothing of it is lost."""
    mgr = make_mgr()
    rc, _, p = mgr.exec("s", "x=41", "--lang", "bash", "--memory", "300M")
    assert rc == 0, p.stderr
    sj = mgr.home / "sessions" / "s" / "session.json"
    sj.write_text("{")
    p = mgr.run("sessions", "--repair", "s", "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["action"] == "rewritten" and "running session" in rep["message"]
    assert Path(rep["set_aside"]).read_text() == "{"
    assert session_json(mgr, "s")["options"]["memory"] == 300 << 20
    rc, res, p = mgr.exec("s", "echo $((x+1))", "--lang", "bash")
    assert rc == 0 and res[-1]["stdout"] == "42\n", p.stderr
    assert stat.S_IMODE(sj.stat().st_mode) == 0o600


def test_mcp_server_refuses_a_home_writable_by_others(planted, make_mgr):
    """The MCP server (which parses its own arguments) reaches the home only
    through the daemon's client: that refuses it too, and the agent is told."""
    os.chmod(planted.home, 0o777)
    planted.snapshot()
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}}
    req = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"_meta": meta, "name": "code_exec",
                      "arguments": {"code": "echo hi", "language": "bash",
                                    "session": "victim"}}}
    # stdin stays open until the reply: end of input cancels a call in flight
    p = subprocess.Popen([mgrutil.KM, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=planted.env())
    try:
        p.stdin.write(json.dumps(req) + "\n")
        p.stdin.flush()
        r, _, _ = select.select([p.stdout], [], [], 120)
        assert r, "no reply within 120 s"
        reply = json.loads(p.stdout.readline())
    finally:
        p.stdin.close()
        p.wait(30)
        p.stdout.close()
        p.stderr.close()
    text = json.dumps(reply)
    assert "the kernelmgr home is trusted state" in text and str(planted.home) in text, text
    assert "writable by group or others" in text
    assert reply.get("error") or reply["result"].get("isError"), text
    planted.assert_untouched()
    assert_service_works(make_mgr)
