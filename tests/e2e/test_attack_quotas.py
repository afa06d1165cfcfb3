"""Attacks on the kernel's per-user quotas and the seccomp
additions of class 7.

The kernel charges per-user objects (inotify instances, queued signals, POSIX
message queue bytes, ...) of a sandbox to the uid that created its user
namespace as well; a sandbox without ceilings could exhaust them for the
caller on the host (root included) or for its other sandboxes. Each attack
here takes as much as it can, as the invoking user and as nobody, through
sandbox-run and through a kernel started with --sandbox strict, and while the
sandbox still holds it, a host process of the same caller must still get the
same resource; afterwards the session still works."""
import os
import platform
import select
import subprocess
import time

import pytest

import kutil
import sbxutil
from sbxutil import PY

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="syscall numbers in these tests are x86_64's")

# sandbox_config_defaults() (sandbox/sandbox.c): what a kernel gets.
DEFAULT_INOTIFY = 16
DEFAULT_SIGPENDING = 1024
DEFAULT_MSGQUEUE = 128 << 10

VIAS = ["tool", "kernel"]


@pytest.fixture(params=sbxutil.USERS)
def sbx(request):
    s = sbxutil.Sandboxes(request.param)
    yield s
    s.close()


@pytest.fixture(params=VIAS)
def via(request):
    return request.param


# ---- taking a quota and holding it ------------------------------------------

PRELUDE = r'''
import ctypes, errno, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
HOLD = []
'''

INOTIFY = PRELUDE + r'''
n = 0
while n < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    HOLD.append(fd)
    n += 1
print("HELD inotify", n, errno.errorcode.get(ctypes.get_errno()), flush=True)
'''

# One instance, a watch on every directory it finds (inode watches: distinct).
WATCHES = PRELUDE + r'''
fd = libc.inotify_init1(0)
HOLD.append(fd)
w, e = 0, 0
for top in ("/usr", "/etc"):
    for d, _, _ in os.walk(top):
        if libc.inotify_add_watch(fd, d.encode(), 0x100) < 0:
            e = ctypes.get_errno()
            break
        w += 1
    if e:
        break
print("HELD watches", w, errno.errorcode.get(e), flush=True)
'''

# Real-time signals queued to a child that blocks them (a process of its own:
# a kernel's other threads would take a signal aimed at the whole process).
SIGQUEUE = PRELUDE + r'''
class sigval(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
sig = signal.SIGRTMIN + 2
hold_r, hold_w = os.pipe()
ready_r, ready_w = os.pipe()
child = os.fork()
if child == 0:
    signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    os.write(ready_w, b"x")
    os.close(hold_w)
    os.read(hold_r, 1)   # until the holder lets go
    os._exit(0)
os.close(hold_r)
os.read(ready_r, 1)
HOLD.append(hold_w)
n = 0
while n < 200000:
    if libc.sigqueue(child, sig, sigval(n)) < 0:
        break
    n += 1
print("HELD sigqueue", n, errno.errorcode.get(ctypes.get_errno()), flush=True)
'''

MQUEUE = PRELUDE + r'''
class mq_attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                ("pad", ctypes.c_long * 4)]
rt = ctypes.CDLL("librt.so.1", use_errno=True)
n = 0
while n < 1000:
    a = mq_attr(0, 10, 8192, 0)
    q = rt.mq_open(("/kmq%d" % n).encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a))
    if q < 0:
        break
    HOLD.append(q)
    n += 1
print("HELD mqueue", n, errno.errorcode.get(ctypes.get_errno()), flush=True)
'''

# sandbox-run: hold until the test closes stdin.
TOOL_TAIL = "\nprint('READY', flush=True)\nsys.stdin.read()\nprint('RELEASED', flush=True)\n"


class Holder:
    """Code that takes a quota and keeps it, through sandbox-run (until
    release) or in a sandboxed kernel (its globals keep it)."""

    def __init__(self, sbx, via, code, opts=(), timeout=90):
        self.sbx, self.via, self.kernel, self.proc = sbx, via, None, None
        deadline = time.monotonic() + timeout
        if via == "kernel":
            self.kernel = sbx.kernel("python", ["--python", PY])
            _, r = self.kernel.execute(code, timeout=timeout)
            self.text = kutil.stream_text(r["iopub"], "stdout") + \
                kutil.stream_text(r["iopub"], "stderr")
            for m in kutil.of_type(r["iopub"], "error"):
                self.text += "\n" + m["content"]["ename"] + ": " + m["content"]["evalue"]
            return
        cmd = [*sbx.prefix, sbx.tool, "--workspace", str(sbx.ws), *opts, "--",
               PY, "-c", code + TOOL_TAIL]
        env = dict(os.environ)
        env.setdefault("HOME", "/tmp")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)
        self.text = ""
        while "READY\n" not in self.text:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                pytest.fail(f"the sandbox did not report in time: {self.text!r}")
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.proc.stdout.fileno(), 4096).decode(errors="replace")
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")
                self.proc.wait(10)
                pytest.fail(f"the sandbox ended early (rc {self.proc.returncode}): "
                            f"{self.text!r} {err!r}")
            self.text += chunk

    def count(self, what):
        line = next(ln for ln in self.text.splitlines() if ln.startswith("HELD " + what))
        _, _, n, err = line.split()
        return int(n), err

    def release(self):
        """Lets the holder go and proves the session still works."""
        if self.kernel:
            self.kernel.assert_alive()
            return
        out, err = self.proc.communicate(b"", timeout=60)
        assert "RELEASED" in out.decode(), (out, err)
        assert self.proc.returncode == 0, (out, err)


HOST_CHECK = r'''
import ctypes, errno, os, signal
libc = ctypes.CDLL(None, use_errno=True)
res = {}
fd = libc.inotify_init1(0)
res["inotify_init1"] = True if fd >= 0 else errno.errorcode.get(ctypes.get_errno())
if fd >= 0:
    w = libc.inotify_add_watch(fd, b"/", 0x100)
    res["inotify_add_watch"] = True if w >= 0 else errno.errorcode.get(ctypes.get_errno())
    os.close(fd)
tid = ctypes.c_void_p()
r = libc.timer_create(1, None, ctypes.byref(tid))   # CLOCK_MONOTONIC, SIGALRM
res["timer_create"] = True if r == 0 else errno.errorcode.get(ctypes.get_errno())
if r == 0:
    libc.timer_delete(tid)
class sigval(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
sig = signal.SIGRTMIN + 3
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
ok = sum(libc.sigqueue(os.getpid(), sig, sigval(i)) == 0 for i in range(16))
res["sigqueue"] = True if ok == 16 else (ok, errno.errorcode.get(ctypes.get_errno()))
class mq_attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long),
                ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long),
                ("pad", ctypes.c_long * 4)]
rt = ctypes.CDLL("librt.so.1", use_errno=True)
name = ("/kmsbx-host-%d" % os.getpid()).encode()
a = mq_attr(0, 10, 8192, 0)
q = rt.mq_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600, ctypes.byref(a))
res["mq_open"] = True if q >= 0 else errno.errorcode.get(ctypes.get_errno())
if q >= 0:
    os.close(q)
    rt.mq_unlink(name)
print("HOSTOK" if all(v is True for v in res.values()) else "HOSTFAIL", res)
'''


def assert_host_untouched(sbx):
    """A host process of the same caller (root, or nobody) still gets every
    per-user resource the sandboxes hold."""
    r = subprocess.run([*sbx.prefix, PY, "-c", HOST_CHECK], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert "HOSTOK" in r.stdout, (r.stdout, r.stderr)


# ---- (a) inotify -------------------------------------------------------------

def test_inotify_instances_bounded(sbx, via):
    assert_host_untouched(sbx)  # a baseline: the host check itself works here
    ceiling = 24 if via == "tool" else DEFAULT_INOTIFY
    h = Holder(sbx, via, INOTIFY, ["--inotify", str(ceiling)])
    try:
        n, err = h.count("inotify")
        if via == "tool":
            assert n == ceiling, h.text  # python itself holds none
        else:
            assert 0 < n <= ceiling, h.text
        assert err == "EMFILE", h.text
        # while the sandbox holds every instance it can
        assert_host_untouched(sbx)
    finally:
        h.release()
    assert_host_untouched(sbx)


def test_inotify_watches_bounded(sbx):
    # The namespace's max_inotify_watches stops them.
    h = Holder(sbx, "tool", WATCHES, ["--inotify-watches", "300"])
    try:
        w, err = h.count("watches")
        assert w == 300 and err == "ENOSPC", h.text
        assert_host_untouched(sbx)
    finally:
        h.release()


def test_root_caller_charges_the_sandbox_uid(sbx):
    """A root caller's sandbox creates its user namespace as its own host uid:
    even with a ceiling above the host's limit, what it takes is counted
    against that uid, never against host root."""
    if not sbxutil.IS_ROOT or sbx.user != "invoker":
        pytest.skip("only a root caller's sandbox runs as a host uid of its own")
    host_max = int(open("/proc/sys/user/max_inotify_instances").read())
    h = Holder(sbx, "tool", INOTIFY, ["--inotify", str(host_max * 4)])
    try:
        n, err = h.count("inotify")
        assert n <= host_max, h.text  # stopped by the host limit of its own uid
        assert_host_untouched(sbx)
    finally:
        h.release()


# ---- (b) queued signals and timers ---------------------------------------------

def test_queued_signals_bounded(sbx, via):
    ceiling = 300 if via == "tool" else DEFAULT_SIGPENDING
    h = Holder(sbx, via, SIGQUEUE, ["--sigpending", str(ceiling)])
    try:
        n, err = h.count("sigqueue")
        assert err == "EAGAIN", h.text
        if via == "tool":
            assert n == ceiling, h.text
        else:
            assert 0 < n <= ceiling, h.text
        assert_host_untouched(sbx)
    finally:
        h.release()
    assert_host_untouched(sbx)


def test_timers_bounded(sbx):
    # Every POSIX timer holds a preallocated signal: the same ceiling.
    code = PRELUDE + r'''
n = 0
while n < 100000:
    tid = ctypes.c_void_p()
    if libc.timer_create(1, None, ctypes.byref(tid)) != 0:
        break
    n += 1
print("HELD timers", n, errno.errorcode.get(ctypes.get_errno()), flush=True)
'''
    h = Holder(sbx, "tool", code, ["--sigpending", "200"])
    try:
        n, err = h.count("timers")
        assert n <= 200 and err == "EAGAIN", h.text
        assert_host_untouched(sbx)
    finally:
        h.release()


# ---- (c) POSIX message queues ---------------------------------------------------

def test_message_queues_bounded(sbx, via):
    limit = 200 << 10 if via == "tool" else DEFAULT_MSGQUEUE
    h = Holder(sbx, via, MQUEUE, ["--msgqueue", str(limit)])
    try:
        n, err = h.count("mqueue")
        # Each queue (10 x 8 KiB) is charged ~81 KiB. Landlock keeps the
        # sandbox off the mqueue filesystem entirely where it is enforced
        # (EACCES); elsewhere RLIMIT_MSGQUEUE stops it (EMFILE).
        assert n * 10 * 8192 <= limit, h.text
        assert err in ("EMFILE", "EACCES", "EPERM"), h.text
        assert_host_untouched(sbx)
    finally:
        h.release()


# ---- (d) seccomp: modify_ldt, memfd_secret and the newer calls -----------------

SECCOMP = r'''
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
desc = (ctypes.c_uint32 * 4)(1, 0, 0xfffff, 0x51)   # a valid user_desc: entry 1
calls = {
    "modify_ldt(read)": (154, 0, ctypes.addressof(desc), 16, errno.EPERM),
    "modify_ldt(write)": (154, 1, ctypes.addressof(desc), 16, errno.EPERM),
    "memfd_secret": (447, 0, errno.EPERM),
    "process_madvise": (440, -1, 0, 0, 0, 0, errno.EPERM),
    "process_mrelease": (448, -1, 0, errno.EPERM),
    "set_mempolicy_home_node": (450, 0, 4096, 0, 0, errno.EPERM),
    "lsm_get_self_attr": (459, 100, 0, 0, 0, errno.EPERM),
    "lsm_set_self_attr": (460, 100, 0, 0, 0, errno.EPERM),
    "lsm_list_modules": (461, 0, 0, 0, errno.EPERM),
    "open_tree_attr": (467, -100, b"/tmp", 1, 0, 0, errno.EPERM),
    "sysfs": (139, 3, errno.EPERM), "ustat": (136, 0, 0, errno.EPERM),
    "_sysctl": (156, 0, errno.EPERM),
    "statmount": (457, 0, 0, 0, 0, errno.ENOSYS),
    "listmount": (458, 0, 0, 0, 0, errno.ENOSYS),
}
bad = []
for name, (nr, *a) in calls.items():
    want = a.pop()
    args = [ctypes.c_char_p(x) if isinstance(x, bytes) else ctypes.c_long(x) for x in a]
    r = libc.syscall(ctypes.c_long(nr), *args)
    e = ctypes.get_errno()
    print(name, r, errno.errorcode.get(e))
    if r >= 0 or e != want:
        bad.append(name)
# still allowed: the worker may restrict itself further with Landlock
abi = libc.syscall(ctypes.c_long(444), 0, 0, ctypes.c_long(1))
print("landlock abi", abi)
print("PWNED" if bad else "SAFE", bad)
'''


def test_seccomp_new_denials(sbx, via):
    if via == "tool":
        r = sbx.run(SECCOMP, "python")
        out = r.out + r.err
        assert r.rc == 0, r
    else:
        out, _ = sbx.kernel_run("python", SECCOMP, ["--python", PY])
    sbxutil.assert_safe(out)


def test_namespace_quotas_zero_inside(sbx, via):
    code = r'''
import os
vals, wrote = {}, []
for n in sorted(os.listdir("/proc/sys/user")):
    vals[n] = open("/proc/sys/user/" + n).read().strip()
    try:
        open("/proc/sys/user/" + n, "w").write("100000\n")
        wrote.append(n)
    except OSError:
        pass
ns = {k: v for k, v in vals.items() if k.endswith("_namespaces")}
print("VALS", vals)
print("PWNED" if wrote or any(v != "0" for v in ns.values()) or
      vals.get("max_fanotify_groups", "0") != "0" else "SAFE", wrote)
'''
    if via == "tool":
        r = sbx.run(code, "python")
        out = r.out + r.err
    else:
        out, _ = sbx.kernel_run("python", code, ["--python", PY])
    sbxutil.assert_safe(out)
    assert f"'max_inotify_instances': '{DEFAULT_INOTIFY}'" in out, out


# ---- (e) several sandboxes at once -------------------------------------------

def test_two_sandboxes_at_their_ceilings(sbx, via):
    code = INOTIFY + SIGQUEUE.replace(PRELUDE, "")
    holders = []
    try:
        for _ in range(2):
            holders.append(Holder(sbx, via, code))
        for h in holders:
            n, err = h.count("inotify")
            assert 0 < n <= DEFAULT_INOTIFY and err == "EMFILE", h.text
            n, err = h.count("sigqueue")
            assert 0 < n <= DEFAULT_SIGPENDING and err == "EAGAIN", h.text
        assert_host_untouched(sbx)
    finally:
        for h in holders:
            h.release()
    assert_host_untouched(sbx)


def test_protections_name_the_quota_ceilings(sbx):
    r = subprocess.run([*sbx.prefix, sbx.tool, "--check"], capture_output=True, text=True,
                       timeout=60, cwd=str(sbx.ws))
    assert r.returncode == 0, r
    for name in ("userns-max-inotify-instances", "userns-max-inotify-watches",
                 "userns-no-fanotify", "userns-no-nested-namespaces", "rlimit-sigpending",
                 "rlimit-msgqueue", "rlimit-memlock"):
        assert f'"{name}"' in r.stdout, r.stdout
