"""Attacks on a session's zygote (sandbox/sbx_zygote.c, kernels/python/kzygote.py).

As the invoking user and (when root) as nobody, the real daemon and kernels,
the strict sandbox. The session's code tries to reach into its zygote
(ptrace, /proc, its socket) and to kill it; a kernel forked after another's
cells tries to find their secret (a variable, an environment variable, an
open file); two forks compare their PRNGs. Each attack fails, and the
session (and another session) still works afterwards."""
import json

import pytest

import sbxutil
from test_session_machine import MachineMgr, wait_until
from test_zygote import FIND_ZYGOTES, ZINFO, forked


@pytest.fixture(scope="module", params=sbxutil.USERS)
def mgr(request):
    m = MachineMgr(request.param, {"zygote_forks": 64})
    yield m
    m.close()


def zinfo(mgr, session):
    return json.loads(mgr.ok(session, ZINFO, "python"))


def new_worker(mgr, session):
    r = mgr.one(session, "import os; os._exit(0)", "python")
    assert r["status"] != "ok", r
    return zinfo(mgr, session)


def assert_works(mgr, session):
    assert mgr.ok(session, "print(sum(range(10)))", "python") == "45\n"
    assert mgr.ok(session, "echo $((6*7))", "bash") == "42\n"


REACH = r'''
import ctypes, os, socket
z = %d
libc = ctypes.CDLL(None, use_errno=True)
out = []
# ptrace: attach and seize (seccomp says no)
for req in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE
    rc = libc.ptrace(req, z, 0, 0)
    out.append("ptrace %%x %%s" %% (req, "PWNED" if rc == 0 else "SAFE"))
# /proc: its memory, fds, environment and socket (it is not dumpable)
for what in ("mem", "environ", "fd/3", "maps", "auxv"):
    try:
        with open("/proc/%%d/%%s" %% (z, what), "rb") as f:
            f.read(64)
        out.append(what + " PWNED")
    except OSError as e:
        out.append(what + " SAFE " + str(e.errno))
try:
    os.listdir("/proc/%%d/fd" %% z)
    out.append("fdlist PWNED")
except OSError:
    out.append("fdlist SAFE")
# pidfd_getfd of its socket
try:
    pfd = os.pidfd_open(z)
    rc = libc.syscall(438, pfd, 3, 0)  # pidfd_getfd
    out.append("pidfd_getfd " + ("PWNED" if rc >= 0 else "SAFE"))
except OSError:
    out.append("pidfd_getfd SAFE")
print("\n".join(out))
'''


def test_session_cannot_reach_into_its_zygote(mgr):
    z = forked(mgr, "reach")["zygote_pid"]
    out = mgr.ok("reach", REACH % z, "python")
    assert "PWNED" not in out, out
    assert out.count("SAFE") == 9, out
    # the worker forked after the attempts is sound and forked by it
    after = new_worker(mgr, "reach")
    assert after["zygote_pid"] == z, after
    assert_works(mgr, "reach")


def test_killed_zygote_is_replaced(mgr):
    first = forked(mgr, "kill")
    # signals: the session may end its zygote (same uid); nothing breaks
    mgr.ok("kill", f"kill -STOP {first['zygote_pid']}; kill -9 {first['zygote_pid']}", "bash")
    wait_until(lambda: json.loads(mgr.ok("kill", FIND_ZYGOTES, "python")) == [],
               what="the killed zygote to go")
    after = new_worker(mgr, "kill")
    assert after and after["zygote_pid"] != first["zygote_pid"] and after["fork"] == 1, after
    assert_works(mgr, "kill")


SECRET = r'''
import os
SECRET_VAR = "s3cr3t-var"
os.environ["SECRET_ENV"] = "s3cr3t-env"
_f = open("/tmp/secret-file", "w+")
_f.write("s3cr3t-file")
_f.flush()
os.putenv("SECRET_PUT", "s3cr3t-put")
print("set", _f.fileno())
'''
LOOK = r'''
import os, sys
found = []
if "SECRET_VAR" in globals():
    found.append("var")
for k in ("SECRET_ENV", "SECRET_PUT"):
    if k in os.environ:
        found.append(k)
fds = sorted(int(f) for f in os.listdir("/proc/self/fd"))
for f in fds:
    try:
        if os.readlink("/proc/self/fd/%d" % f).endswith("secret-file"):
            found.append("fd")
    except OSError:
        pass
env = open("/proc/self/environ", "rb").read()
if b"s3cr3t" in env:
    found.append("environ")
print("FOUND" if found else "CLEAN", found, [f for f in fds if f > 6])
'''


def test_fork_inherits_no_secret(mgr):
    forked(mgr, "sec-a")
    out = mgr.ok("sec-a", SECRET, "python")
    assert out.startswith("set"), out
    # the same session's next kernel, forked after those cells
    new_worker(mgr, "sec-a")
    out = mgr.ok("sec-a", LOOK, "python")
    assert out.startswith("CLEAN"), out
    # another session's kernels, its first (cold) and later (forked) ones
    out = mgr.ok("sec-b", LOOK, "python")
    assert out.startswith("CLEAN"), out
    new_worker(mgr, "sec-b")
    out = mgr.ok("sec-b", LOOK + "\nprint(open('/tmp/secret-file').read()) "
                 "if os.path.exists('/tmp/secret-file') else print('no file')", "python")
    assert out.startswith("CLEAN") and "no file" in out, out
    assert_works(mgr, "sec-a")
    assert_works(mgr, "sec-b")


PRNG = ("import random, os, json\n"
        "print(json.dumps([random.random(), os.urandom(8).hex(), random.getrandbits(64)]))")


def test_forks_share_no_prng_state(mgr):
    forked(mgr, "rng-a")
    seen = [json.loads(mgr.ok("rng-a", PRNG, "python"))]
    for _ in range(2):
        new_worker(mgr, "rng-a")
        seen.append(json.loads(mgr.ok("rng-a", PRNG, "python")))
    seen.append(json.loads(mgr.ok("rng-b", PRNG, "python")))
    for i in range(3):
        vals = [s[i] for s in seen]
        assert len(set(vals)) == len(vals), seen
    assert_works(mgr, "rng-a")


NP_PRNG = ("import sys\n"
           "pre = sorted(m for m in ('random', 'numpy') if m in sys.modules)\n"
           "import json, random, numpy\n"
           "print(json.dumps([pre, random.random(), float(numpy.random.random())]))")


def test_preloaded_prngs_are_reseeded(mgr):
    """random and numpy imported by the zygote itself (the session's env
    names them to preload): every fork has its own state nonetheless."""
    r = mgr.one("rng-np", "import numpy", "python", "--env",
                "KERNELMGR_ZYGOTE_PRELOAD=random,numpy")
    if r["status"] != "ok":
        pytest.skip("numpy is not importable by the kernels' interpreter")
    seen = []
    for _ in range(3):
        z = new_worker(mgr, "rng-np")
        assert z, z
        seen.append(json.loads(mgr.ok("rng-np", NP_PRNG, "python")))
    assert all(s[0] == ["numpy", "random"] for s in seen), seen
    for i in (1, 2):
        vals = [s[i] for s in seen]
        assert len(set(vals)) == len(vals), seen
    assert_works(mgr, "rng-np")

