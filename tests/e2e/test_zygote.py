"""Python kernels of a session sandbox forked by the session's zygote
(sandbox/sbx_zygote.c, kernels/python/kzygote.py): the session's first
Python kernel starts cold, every later one (a restart, another Python
kernel) is forked.

The real daemon, real kernels, the strict sandbox. A forked kernel is in the
session's one sandbox exactly as a cold one (the same namespaces, cgroup,
uid, no capabilities, no_new_privs, seccomp, rlimits; Bash sees it, /tmp is
shared), the zygote is replaced after `zygote_forks` forks and when the
files it was made from change, and `zygote: false` gives cold starts. One
daemon for the module; each test its own session (its own sandbox and so
its own zygote)."""
import json
import os

import pytest

import kutil
from test_session_machine import MachineMgr, wait_until

ZINFO = ("import builtins, json\n"
         "print(json.dumps(getattr(builtins.__kernelmgr_driver__, '_ZYGOTE', None)))")
# Everything that places a process in the sandbox, as the process sees it.
PY_PLACE = r'''
import os, json, resource
st = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print(json.dumps({
    "ns": {n: os.readlink("/proc/self/ns/" + n) for n in ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")},
    "cgroup": open("/proc/self/cgroup").read(),
    "uid": os.getuid(),
    "status": {k: st[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")},
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[1],
    "sid": os.getsid(0) == os.getpid(),
}))
'''
SH_PLACE = r'''
python3 -c '
import os, json, resource
st = dict(l.split(":", 1) for l in open("/proc/%d/status" % os.getppid()) if ":" in l)
p = os.getppid()
print(json.dumps({
    "ns": {n: os.readlink("/proc/%d/ns/%s" % (p, n)) for n in ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")},
    "cgroup": open("/proc/%d/cgroup" % p).read(),
    "uid": os.getuid(),
    "status": {k: st[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp")},
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[1],
    "fsize": resource.getrlimit(resource.RLIMIT_FSIZE)[1],
    "sid": os.getsid(p) == p,
}))'
'''
FIND_ZYGOTES = ("import os\n"
                "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and "
                "b'kzygote.py' in open('/proc/%s/cmdline' % p, 'rb').read()))")


@pytest.fixture(scope="module")
def mgr():
    m = MachineMgr("invoker", {"zygote_forks": 2})
    yield m
    m.close()


def zinfo(mgr, session):
    return json.loads(mgr.ok(session, ZINFO, "python"))


def new_worker(mgr, session):
    """Ends the session's Python worker; the next cell gets a new one."""
    r = mgr.one(session, "import os; os._exit(0)", "python")
    assert r["status"] != "ok", r
    return zinfo(mgr, session)


def zygotes(mgr, session):
    return json.loads(mgr.ok(session, FIND_ZYGOTES, "python"))


def forked(mgr, session):
    """The session's Python kernel, forked: the first starts cold (no
    zygote yet), the next is forked."""
    z = zinfo(mgr, session)
    if z is None:
        assert zygotes(mgr, session) == []
        z = new_worker(mgr, session)
    assert z and z["fork"] >= 1, z
    return z


def test_forked_kernel_is_in_the_session_sandbox(mgr):
    assert zinfo(mgr, "place") is None  # the first: cold
    z = new_worker(mgr, "place")
    assert z and z["fork"] == 1, z
    py = json.loads(mgr.ok("place", PY_PLACE, "python"))
    sh = json.loads(mgr.ok("place", SH_PLACE, "bash"))
    assert py == sh, (py, sh)
    assert py["status"]["CapEff"] == "0000000000000000" and py["status"]["NoNewPrivs"] == "1"
    assert py["status"]["Seccomp"] == "2" and py["sid"], py
    # one machine: Bash sees the kernel (as driver.py) and its zygote; /tmp shared
    out = mgr.ok("place", "echo from-bash > /tmp/zshared; ps -e -o pid=,ppid=,args=", "bash")
    kernels = [ln.split() for ln in out.splitlines() if ln.rstrip().endswith("driver.py")]
    assert kernels and all(k[1] == "1" for k in kernels), out  # re-parented to init
    assert "kzygote.py" in out, out
    assert mgr.ok("place", "print(open('/tmp/zshared').read().strip())", "python") == "from-bash\n"


def test_replaced_after_n_forks(mgr):
    first = forked(mgr, "nforks")
    second = new_worker(mgr, "nforks")
    assert second["zygote_pid"] == first["zygote_pid"] and second["fork"] == 2, (first, second)
    third = new_worker(mgr, "nforks")  # zygote_forks is 2: a fresh zygote
    assert third["zygote_pid"] != first["zygote_pid"] and third["fork"] == 1, (first, third)
    # the replaced one is gone: one zygote in the session
    wait_until(lambda: zygotes(mgr, "nforks") == [third["zygote_pid"]], what="one zygote")
    assert mgr.ok("nforks", "print(6 * 7)", "python") == "42\n"


def test_replaced_when_its_files_change(tmp_path):
    """The driver (or the interpreter) changed on disk since the zygote
    started: it asks to be replaced and the next kernel forks from a fresh
    one. A private copy of the build (the copy's driver is touched)."""
    m = MachineMgr("invoker", {"zygote_forks": 100})
    try:
        bindir = tmp_path / "bin"
        bindir.mkdir()
        import shutil
        for b in ("kernelmgr", "kernel-bash", "kernel-python", "kernelmgr-sandbox"):
            shutil.copy2(kutil.BUILD / b, bindir / b)
        shutil.copytree(kutil.BUILD / "share", bindir / "share")
        m.km = str(bindir / "kernelmgr")
        first = forked(m, "files")
        driver = bindir / "share" / "kernelmgr" / "python" / "driver.py"
        st = driver.stat()
        os.utime(driver, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        after = new_worker(m, "files")
        assert after["zygote_pid"] != first["zygote_pid"] and after["fork"] == 1, (first, after)
        assert m.ok("files", "print('still', 'fine')", "python") == "still fine\n"
    finally:
        m.close()


def test_session_option_zygote_off(mgr):
    """The session option (`--zygote off`, the API's "zygote": false) wins
    over the configuration's true, and is kept by the session."""
    r = mgr.one("sess-off", ZINFO, "python", "--zygote", "off")
    assert r["status"] == "ok" and r["stdout"] == "null\n", r
    assert new_worker(mgr, "sess-off") is None
    assert new_worker(mgr, "sess-off") is None
    assert zygotes(mgr, "sess-off") == []
    p = mgr.run("exec", "--session", "sess-bad", "--zygote", "maybe", "-c", "1")
    assert p.returncode == 2 and "--zygote must be on or off" in p.stderr, p.stderr


def test_zygote_false_starts_cold():
    m = MachineMgr("invoker", {"zygote": False})
    try:
        assert zinfo(m, "cold") is None
        assert zygotes(m, "cold") == []
        assert new_worker(m, "cold") is None
    finally:
        m.close()


IPY = "import sys\nprint('IPython' in sys.modules, type(get_ipython()).__name__)"


def test_ipython_on_zygote_preloads_it(mgr):
    """With the session option ipython on, the session's zygote preloads
    IPython (the driver's preload()): a later kernel forks with it loaded
    and runs every cell through IPython's shell; a session with it off has
    a zygote without IPython."""
    r = mgr.one("ipy-on", IPY, "python", "--ipython", "on")
    assert r["status"] == "ok" and r["stdout"] == "True KShell\n", r  # cold, IPython at start
    z = new_worker(mgr, "ipy-on")
    assert z and z["fork"] >= 1 and z["ipython"] is True, z
    assert mgr.ok("ipy-on", IPY, "python") == "True KShell\n"
    z2 = forked(mgr, "ipy-off")
    assert z2["ipython"] is False, z2
    assert mgr.ok("ipy-off", "import sys\nprint('IPython' in sys.modules)", "python") == "False\n"


SHELL_STATE = r'''
import builtins, json, os, random
ip = get_ipython()
zpid = builtins.__kernelmgr_driver__._ZYGOTE["zygote_pid"]
print(json.dumps({
    "zygote": builtins.__kernelmgr_driver__._ZYGOTE,
    "random": random.random(),
    "premade": builtins.__kernelmgr_driver__._KIP.premade_used,
    "planted": "planted" in ip.user_ns_hidden or "planted" in ip.magics_manager.magics["line"],
    "main": ip.user_module is __import__("sys").modules["__main__"] and ip.user_ns is globals(),
    "in": [c for c in In if c], "in_len": len(In) - ip.execution_count,
    "history_session": ip.history_manager.session_number,
    "ipython_dir": ip.ipython_dir, "home": ip.home_dir, "cwd": str(ip.history_manager.dir_hist[0]),
    "display": builtins.display.__module__,
    "zygote_threads": [l.split()[1] for l in open("/proc/%d/status" % zpid)
                       if l.startswith("Threads:")],
}))
'''
PLANT = ("ip = get_ipython()\nip.user_ns_hidden['planted'] = 1\n"
         "ip.magics_manager.register_alias('planted', 'time')\nIn.append('planted')\n")


def test_ipython_shell_made_by_the_zygote_is_each_workers_own(mgr):
    """With ipython on, the zygote makes the IPython shell before it forks
    (kipython.premake) and each worker redoes what is its own: two kernels
    forked by one zygote have their own PRNG state, a fresh history and
    namespace (their __main__ is the shell's user module), the worker's
    IPython directory, home and cwd, IPython's display as the builtin; what
    a cell changes in one kernel's shell is not in a kernel forked later;
    the zygote has no thread."""
    s = "ipy-own"
    assert mgr.ok(s, "print(1)", "python", "--ipython", "on") == "1\n"  # cold
    new_worker(mgr, s)
    a = json.loads(mgr.ok(s, SHELL_STATE, "python"))
    mgr.ok(s, PLANT, "python")
    new_worker(mgr, s)
    b = json.loads(mgr.ok(s, SHELL_STATE, "python"))
    for st in (a, b):
        assert st["zygote"] and st["zygote"]["ipython"] is True, st
        assert st["premade"] is True, st
        assert st["main"] is True and st["planted"] is False, st
        assert st["display"] == "IPython.core.display_functions", st
        assert st["zygote_threads"] == ["1"], st
        assert "zygote-ipython" not in st["ipython_dir"], st
        assert st["cwd"] == a["cwd"] and st["home"] == a["home"], st
    assert a["zygote"]["zygote_pid"] == b["zygote"]["zygote_pid"], (a, b)
    assert a["zygote"]["fork"] != b["zygote"]["fork"], (a, b)
    assert a["random"] != b["random"], (a, b)
    # a fresh history in each (the execution count is the session's): the
    # worker's two cells (new_worker's and this one) in In, padded to its number
    for st in (a, b):
        assert len(st["in"]) == 2 and not any("register_alias" in c for c in st["in"]), st
        assert st["in_len"] == 1 and st["history_session"] == a["history_session"], st
