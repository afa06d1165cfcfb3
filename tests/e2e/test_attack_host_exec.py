"""Host-side execution of workspace content.

Sandboxed code writes the workspace. Nothing outside the sandbox may execute,
import or load what it wrote: not the interpreter detection of kernel-python
(a workspace .venv/bin/python, a planted json.py or python3 on an empty PATH
entry, a library on an empty LD_LIBRARY_PATH entry), not the kernel servers
the manager starts (cwd, environment), and a forged pyvenv.cfg must not make
a host directory visible in the sandbox.

Every attack plants a program that would create a marker file in a host
directory the sandbox cannot see (a fresh /tmp/... directory, writable by the
attacker's uid so the attack would succeed if run), then makes the host start
a kernel. Each test asserts the marker is absent, the error (if any) is clear,
and the session or kernel still runs code. Run as the invoking user and, as
root, also as nobody; through the manager (build/kernelmgr) and through the
kernel binary.
"""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import kutil
import sbxutil
from sbxutil import IS_ROOT, NOBODY, SETPRIV, USERS

SYS_PY = "/usr/bin/python3"
PY_REAL = os.path.realpath(SYS_PY)

pytestmark = pytest.mark.skipif(
    sbxutil.Sandboxes.kernel_missing("python") is not None,
    reason=str(sbxutil.Sandboxes.kernel_missing("python")))


# ---------------------------------------------------------------- helpers

class Marker:
    """A host directory the attack would write into (writable by the
    attacker's uid) and the path of the marker file."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="h1-host-"))
        os.chmod(self.dir, 0o777)
        self.path = self.dir / "pwned"

    def script(self, then=SYS_PY):
        """A shell script that creates the marker, then runs `then`."""
        return "#!/bin/sh\ntouch '%s'\nexec %s \"$@\"\n" % (self.path, then)

    def py(self):
        """Python code that creates the marker (silently failing where the
        marker's directory does not exist: inside the sandbox)."""
        return ("try:\n    open(%r, 'w').write('x')\nexcept OSError:\n    pass\n"
                % str(self.path))

    def json_py(self):
        """A json.py that creates the marker, then behaves as the real json
        (so the sandboxed worker, which may import it too, keeps working)."""
        return (self.py() + "import os as _os\n"
                "__path__ = [_os.path.join(_os.path.dirname(_os.__file__), 'json')]\n"
                "__package__ = 'json'\n"
                "exec(compile(open(_os.path.join(__path__[0], '__init__.py')).read(),"
                " __path__[0], 'exec'))\n")

    def assert_absent(self, what):
        assert not self.path.exists(), "HOST CODE EXECUTION via %s: %s exists" % (what, self.path)

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


_so_cache = {}


def marker_so(marker, workdir):
    """A real shared library whose constructor creates the marker."""
    src = Path(workdir) / "evil.c"
    src.write_text('#include <fcntl.h>\n#include <unistd.h>\n'
                   '__attribute__((constructor)) static void pwn(void)\n'
                   '{ int fd = open("%s", O_WRONLY | O_CREAT, 0644); if (fd >= 0) close(fd); }\n'
                   % marker.path)
    out = Path(workdir) / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True,
                   timeout=120)
    return out.read_bytes()


# Libraries the host processes load: python (the probe) and kernel-python.
PLANTED_LIBS = ["libz.so.1", "libexpat.so.1", "libjansson.so.4", "libzmq.so.5"]


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


class MgrAs:
    """build/kernelmgr with a private KERNELMGR_HOME, as the invoker or as
    nobody (setpriv; binaries copied where nobody can run them), strict
    sandbox, Python found by detection (no configured python)."""

    def __init__(self, user, extra_env=None, cwd=None, config=None):
        if user == "nobody" and not IS_ROOT:
            pytest.skip("the nobody variant needs root to switch users")
        self.user = user
        self.home = Path(tempfile.mkdtemp(prefix="kmh", dir="/tmp"))
        cfg = {"sandbox": "strict", "python": None}
        cfg.update(config or {})
        (self.home / "config.json").write_text(json.dumps(cfg))
        self.env = dict(os.environ, KERNELMGR_HOME=str(self.home))
        for k in ("VIRTUAL_ENV", "KERNELMGR_PYTHON", "PYTHONPATH"):
            self.env.pop(k, None)
        self.env.update(extra_env or {})
        self.cwd = cwd or "/"
        self.prefix = []
        self.km = kutil.binary("kernelmgr")
        if user == "nobody":
            self.km = sbxutil.nobody_binary("kernelmgr")
            self.prefix = SETPRIV
            self.env["HOME"] = str(self.home)
            self.env.pop("XDG_CACHE_HOME", None)
            self.env.pop("XDG_STATE_HOME", None)
            # nobody cannot use root's pyenv: the system python on PATH
            self.env["PATH"] = ":".join(
                p for p in self.env.get("PATH", "/usr/bin:/bin").split(":")
                if not p.startswith("/root")) or "/usr/bin:/bin"
            for root, dirs, files in os.walk(self.home):
                for n in dirs + files + [""]:
                    os.chown(os.path.join(root, n), NOBODY, NOBODY)

    def run(self, *args, timeout=180):
        return subprocess.run([*self.prefix, self.km, *args], capture_output=True, text=True,
                              env=self.env, timeout=timeout, cwd=self.cwd)

    def exec(self, session, code, timeout=180):
        p = self.run("exec", "--session", session, "-c", code, "--json", timeout=timeout)
        res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return p, res

    def workspace(self, session):
        p, res = self.exec(session, "import os; print(os.getcwd())")
        assert res and res[0]["status"] == "ok", (p.stdout, p.stderr)
        return Path(res[0]["stdout"].strip())

    def log(self, session):
        logs = list((self.home / "sessions" / session).glob("python*.log"))
        return "\n".join(p.read_text(errors="replace") for p in logs)

    def assert_runs(self, session):
        p, res = self.exec(session, "print(6 * 7)")
        assert res and res[-1]["status"] == "ok" and res[-1]["stdout"] == "42\n", \
            (p.stdout, p.stderr, self.log(session))

    def close(self):
        try:
            self.run("serve", "--stop", timeout=60)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture
def marker():
    m = Marker()
    yield m
    m.close()


@pytest.fixture
def mgr_factory():
    made = []

    def make(user, **kw):
        if not strict_available():
            pytest.skip("the strict sandbox is not available on this host")
        m = MgrAs(user, **kw)
        made.append(m)
        return m

    yield make
    for m in made:
        m.cwd = "/"
        m.close()


def plant_code(files):
    """Python code (run in the sandbox) that writes files {relpath: (bytes,
    mode) or str} into the cwd (the workspace), links for ("->", target)."""
    lines = ["import os, base64"]
    for rel, spec in files.items():
        lines.append("os.makedirs(os.path.dirname(%r) or '.', exist_ok=True)" % rel)
        lines.append("os.path.lexists(%r) and os.unlink(%r)" % (rel, rel))
        if isinstance(spec, tuple) and spec[0] == "->":
            lines.append("os.symlink(%r, %r)" % (spec[1], rel))
            continue
        data, mode = spec if isinstance(spec, tuple) else (spec.encode(), 0o644)
        lines.append("open(%r, 'wb').write(base64.b64decode(%r))"
                     % (rel, base64.b64encode(data).decode()))
        lines.append("os.chmod(%r, 0o%o)" % (rel, mode))
    return "\n".join(lines)


# ------------------------------------------- (a) workspace .venv/bin/python

@pytest.mark.parametrize("user", USERS)
def test_venv_script_never_runs_on_host(mgr_factory, marker, user):
    m = mgr_factory(user)
    ws = m.workspace("s")
    # A cell plants .venv/bin/python (a script creating the host marker), no
    # pyvenv.cfg, and the kernel is restarted: the host must not run it.
    p, res = m.exec("s", plant_code({".venv/bin/python": (marker.script().encode(), 0o755)}))
    assert res[0]["status"] == "ok", res
    r = m.run("restart", "s", "--json")
    marker.assert_absent("restart with a planted .venv/bin/python")
    assert r.returncode != 0
    log = m.log("s")
    assert "workspace venv %s/.venv is unusable: pyvenv.cfg: missing" % ws in log, log
    assert "fix or remove it" in log
    # the user removes the broken venv; the session runs code again
    shutil.rmtree(ws / ".venv")
    m.assert_runs("s")
    marker.assert_absent("session after removing the venv")

    # With a valid pyvenv.cfg the venv is accepted: the script runs, but only
    # inside the sandbox (it leaves a file in the workspace as proof; its
    # touch of the host marker path cannot reach the host).
    script = ("#!/bin/sh\ntouch \"$(dirname \"$0\")/../../ran-in-sandbox\"\ntouch '%s'\n"
              "exec %s \"$@\"\n" % (marker.path, SYS_PY))
    p, res = m.exec("s", plant_code({".venv/bin/python": (script.encode(), 0o755),
                                     ".venv/pyvenv.cfg": "home = /usr/bin\n"}))
    assert res[0]["status"] == "ok", res
    r = m.run("restart", "s", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr, m.log("s"))
    p, res = m.exec("s", "import os; print(os.environ.get('VIRTUAL_ENV')); print(6 * 7)")
    assert res[0]["status"] == "ok", "%s\n%s" % (res, m.log("s"))
    assert res[0]["stdout"] == "%s/.venv\n42\n" % ws, res
    assert (ws / "ran-in-sandbox").exists()
    marker.assert_absent("the accepted workspace venv's script")


def test_run_next_block_plants_venv(mgr_factory, marker):
    """`run` without a warm pool: a bash block plants the venv; the python
    kernel starts for the next block (detection then): the planted script
    runs, but only in the sandbox."""
    m = mgr_factory("invoker", config={"pool": 0})
    b64 = base64.b64encode(marker.script().encode()).decode()
    md = ("```bash\nmkdir -p .venv/bin\necho %s | base64 -d > .venv/bin/python\n"
          "chmod 755 .venv/bin/python\necho 'home = /usr/bin' > .venv/pyvenv.cfg\n"
          "echo planted\n```\n\n"
          "```python\nimport os\nprint(os.environ.get('VIRTUAL_ENV', '').endswith('/.venv'))\n"
          "print(6 * 7)\n```\n" % b64)
    src = m.home / "blocks.md"
    src.write_text(md)
    r = m.run("run", str(src), "--json", "--continue-on-error")
    res = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    marker.assert_absent("a run whose bash block planted .venv/bin/python")
    assert len(res) == 2, (r.stdout, r.stderr)
    assert res[0]["stdout"] == "planted\n", res[0]
    assert res[1]["status"] == "ok" and res[1]["stdout"] == "True\n42\n", res[1]


# -------------------------------- through the kernel binary (no manager)

class KernelAs(kutil.Kernel):
    """kernel-python with --sandbox strict, a given workspace, environment,
    cwd and user."""

    def __init__(self, workdir, workspace, user, env, cwd, args=()):
        from jupyter_client import BlockingKernelClient
        from jupyter_client.connect import write_connection_file
        self.lang = "python"
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workspace = Path(workspace)
        self.cf = str(self.workdir / "kernel.json")
        write_connection_file(self.cf, transport="tcp")
        prefix = []
        exe = kutil.binary("kernel-python")
        if user == "nobody":
            prefix = SETPRIV
            exe = sbxutil.nobody_binary("kernel-python")
            os.chown(self.workdir, NOBODY, NOBODY)
            os.chown(self.cf, NOBODY, NOBODY)
        self.log = open(self.workdir / "kernel.log", "wb")
        self.proc = subprocess.Popen([*prefix, exe, "-f", self.cf, "--workspace",
                                      str(self.workspace), "--sandbox", "strict", *args],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env, cwd=cwd)
        self.kc = BlockingKernelClient(connection_file=self.cf)
        self.kc.load_connection_file()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except Exception:
            self.close()
            raise

    def info(self):
        self.kc.kernel_info()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = self.kc.get_shell_msg(timeout=30)
            if msg["msg_type"] == "kernel_info_reply":
                return msg["content"]
        raise AssertionError("no kernel_info_reply")

    def assert_alive(self):
        _, r = self.execute("print(6 * 7)", timeout=60)
        assert r["reply"]["content"]["status"] == "ok", (r["reply"]["content"], r["iopub"])
        assert "42" in kutil.stream_text(r["iopub"]), (r, self.log_text())


@pytest.fixture
def sbx(request):
    s = sbxutil.Sandboxes(request.param)
    yield s
    s.close()


def base_env(user, base):
    env = dict(os.environ)
    for k in ("VIRTUAL_ENV", "KERNELMGR_PYTHON", "PYTHONPATH", "PYTHONHOME"):
        env.pop(k, None)
    # an empty probe cache: the probe really runs
    cache = tempfile.mkdtemp(prefix="h1-cache-", dir=str(base))
    os.chmod(cache, 0o777)
    env["XDG_CACHE_HOME"] = cache
    if user == "nobody":
        env["PATH"] = "/usr/bin:/bin"
        env["HOME"] = "/tmp"
    return env


def chown_tree(path, user):
    if user != "nobody":
        return
    for root, dirs, files in os.walk(path):
        os.chown(root, NOBODY, NOBODY)
        for n in dirs + files:
            os.lchown(os.path.join(root, n), NOBODY, NOBODY)


@pytest.mark.parametrize("sbx", USERS, indirect=True)
def test_probe_ignores_planted_modules_and_path_entries(sbx, marker):
    """(b)+(c) json.py, sitecustomize.py, encodings/ and a python3 script in
    the workspace; the kernel started with cwd = workspace, PATH with an
    empty and a relative entry, PYTHONSTARTUP in the workspace: none of it
    runs on the host, and the interpreter is the host's. (PYTHONPATH is
    covered by tests/unit/test_pydetect.c: here it would also reach the
    sandboxed worker.)"""
    ws = sbx.ws
    (ws / "json.py").write_text(marker.json_py())
    for name in ("sitecustomize.py", "usercustomize.py"):
        (ws / name).write_text(marker.py())
    (ws / "python3").write_text(marker.script())
    (ws / "python3").chmod(0o755)
    (ws / "bin").mkdir()
    shutil.copy2(ws / "python3", ws / "bin" / "python3")
    chown_tree(ws, sbx.user)
    env = base_env(sbx.user, sbx.base)
    env["PATH"] = ":bin:.:" + env.get("PATH", "/usr/bin:/bin")
    env["PYTHONSTARTUP"] = str(ws / "json.py")
    k = KernelAs(sbx.base / "k", ws, sbx.user, env, cwd=str(ws))
    sbx.kernels.append(k)
    marker.assert_absent("interpreter detection with planted modules/PATH")
    interp = k.info()["interpreter"]
    assert not interp["path"].startswith(str(ws)), interp
    assert not interp["executable"].startswith(str(ws)), interp
    k.assert_alive()
    marker.assert_absent("interpreter detection with planted modules/PATH")


@pytest.mark.parametrize("sbx", USERS, indirect=True)
def test_probe_ignores_ld_library_path_empty_entry(sbx, marker):
    """(c) a real library planted in the workspace under the names python
    and kernel-python load; LD_LIBRARY_PATH with empty entries: the probe
    runs without LD_* and not in the workspace."""
    so = marker_so(marker, sbx.base)
    for name in PLANTED_LIBS:
        (sbx.ws / name).write_bytes(so)
    chown_tree(sbx.ws, sbx.user)
    env = base_env(sbx.user, sbx.base)
    env["PATH"] = "/usr/bin:/bin"  # the system python, which links libz/libexpat
    env["LD_LIBRARY_PATH"] = ":" + str(sbx.ws / "nonexistent") + ":"
    # The caller's own cwd is "/": what kernel-python starts must not load
    # from the workspace (the old probe ran there with the caller's env).
    try:
        k = KernelAs(sbx.base / "k", sbx.ws, sbx.user, env, cwd="/")
    finally:
        marker.assert_absent("LD_LIBRARY_PATH empty entry during detection")
    sbx.kernels.append(k)
    k.assert_alive()
    marker.assert_absent("LD_LIBRARY_PATH empty entry during detection")


@pytest.mark.parametrize("user", USERS)
def test_manager_kernels_never_start_in_workspace(mgr_factory, marker, user, tmp_path):
    """(c) through the manager: LD_LIBRARY_PATH and PATH with empty entries
    in the manager's environment; a cell plants libraries and python3 in the
    workspace; kernels restart: nothing planted is loaded or run on the
    host (kernel servers start in the run directory with those entries
    removed)."""
    so = marker_so(marker, tmp_path)
    neutral = Path(tempfile.mkdtemp(prefix="h1-cwd-"))
    os.chmod(neutral, 0o755)
    try:
        m = mgr_factory(user, cwd=str(neutral),
                        extra_env={"LD_LIBRARY_PATH": "::",
                                   "PATH": ":" + os.environ.get("PATH", "/usr/bin:/bin")})
        if user == "nobody":
            m.env["PATH"] = ":/usr/bin:/bin"
        ws = m.workspace("s")
        files = {name: (so, 0o755) for name in PLANTED_LIBS}
        files["python3"] = (marker.script().encode(), 0o755)
        p, res = m.exec("s", plant_code(files))
        assert res[0]["status"] == "ok", res
        r = m.run("restart", "s", "--json")
        marker.assert_absent("a library/python3 planted in the workspace (manager)")
        assert r.returncode == 0, (r.stdout, r.stderr, m.log("s"))
        m.assert_runs("s")
        marker.assert_absent("a library/python3 planted in the workspace (manager)")
        # the kernel server (the daemon's child) does not run in the
        # workspace, and its PATH/LD_LIBRARY_PATH have no relative entry
        daemon = (m.home / "daemon.pid").read_text().strip()
        out = [d.name for d in Path("/proc").iterdir() if d.name.isdigit()
               and _ppid(d.name) == daemon]
        assert out, "no kernel server found"
        for pid in out:
            try:
                cwd = os.readlink("/proc/%s/cwd" % pid)
            except OSError:
                continue
            assert not cwd.startswith(str(ws)), "kernel server %s runs in %s" % (pid, cwd)
            environ = Path("/proc/%s/environ" % pid).read_bytes().split(b"\0")
            for e in environ:
                if e.startswith(b"LD_LIBRARY_PATH=") or e.startswith(b"PATH="):
                    val = e.split(b"=", 1)[1]
                    assert all(x.startswith(b"/") for x in val.split(b":")), e
    finally:
        shutil.rmtree(neutral, ignore_errors=True)


def _ppid(pid):
    try:
        stat = Path("/proc/%s/stat" % pid).read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[1]


# ----------------------------------------------- (d) forged pyvenv.cfg home

@pytest.mark.parametrize("user", USERS)
def test_forged_pyvenv_home_exposes_nothing(mgr_factory, marker, user):
    secret_dir = Path(tempfile.mkdtemp(prefix="h1-secret-"))
    os.chmod(secret_dir, 0o755)
    (secret_dir / "secret.txt").write_text("TOPSECRET")
    os.chmod(secret_dir / "secret.txt", 0o644)
    try:
        m = mgr_factory(user)
        ws = m.workspace("s")
        # (1) home = a host directory without a python: a clear error
        p, res = m.exec("s", plant_code({".venv/pyvenv.cfg": "home = %s\n" % secret_dir,
                                         ".venv/bin/python": ("->", SYS_PY)}))
        assert res[0]["status"] == "ok", res
        r = m.run("restart", "s", "--json")
        assert r.returncode != 0
        log = m.log("s")
        assert "workspace venv %s/.venv is unusable: no base interpreter" % ws in log, log
        assert str(secret_dir) in log
        shutil.rmtree(ws / ".venv")
        m.assert_runs("s")

        # (2) the host directory holds a real python (a copy): the venv is
        # accepted (its base is probed on the host as a trusted binary), but
        # the directory itself is not bound into the sandbox.
        shutil.copy2(PY_REAL, secret_dir / "python3")
        os.chmod(secret_dir / "python3", 0o755)
        p, res = m.exec("s", plant_code({".venv/pyvenv.cfg": "home = %s\n" % secret_dir,
                                         ".venv/bin/python": ("->", SYS_PY)}))
        r = m.run("restart", "s", "--json")
        assert r.returncode == 0, (r.stdout, r.stderr, m.log("s"))
        p, res = m.exec("s", "import os\nprint(os.path.exists(%r), os.path.exists(%r))"
                        % (str(secret_dir), str(secret_dir / "secret.txt")))
        assert res[0]["status"] == "ok", (res, m.log("s"))
        assert res[0]["stdout"] == "False False\n", res
        # (3) home = /root or /etc, bin/python pointing at a host file: a
        # clear error, nothing bound. (Written from the host side, as the
        # sandbox could: after a failed start there is no kernel to run a cell.)
        for home in ("/root", "/etc"):
            shutil.rmtree(ws / ".venv")
            (ws / ".venv" / "bin").mkdir(parents=True)
            (ws / ".venv" / "pyvenv.cfg").write_text("home = %s\n" % home)
            os.symlink("/etc/shadow", ws / ".venv" / "bin" / "python")
            chown_tree(ws / ".venv", user)
            m.run("restart", "s", "--json")
            p, res = m.exec("s", "print(1)")
            assert res and res[0]["status"] == "error", (p.stdout, m.log("s"))
            assert "did not start" in json.dumps(res[0]["error"])
            assert "workspace venv %s/.venv is unusable: no base interpreter" % ws in m.log("s")
        # (4) a forged probe reply: bin/python answers a probe with
        # prefix = the secret directory (so a host-side probe would bind it)
        # and behaves as python otherwise. Never run on the host; in the
        # sandbox it runs as the worker, and the directory stays invisible.
        forged = json.dumps({"executable": "", "version": "3.11.0", "prefix": str(secret_dir),
                             "base_prefix": str(secret_dir)})
        script = ("#!/bin/sh\ncase \"$*\" in *json*) echo '%s'; exit 0;; esac\n"
                  "exec %s \"$@\"\n" % (forged, SYS_PY))
        shutil.rmtree(ws / ".venv")
        (ws / ".venv" / "bin").mkdir(parents=True)
        (ws / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (ws / ".venv" / "bin" / "python").write_text(script)
        (ws / ".venv" / "bin" / "python").chmod(0o755)
        chown_tree(ws / ".venv", user)
        m.run("restart", "s", "--json")
        p, res = m.exec("s", "import os\nprint(os.path.exists(%r), os.path.exists(%r))"
                        % (str(secret_dir), str(secret_dir / "secret.txt")))
        assert res[0]["status"] == "ok", (res, m.log("s"))
        assert res[0]["stdout"] == "False False\n", res

        shutil.rmtree(ws / ".venv")
        m.run("restart", "s", "--json")
        m.assert_runs("s")
        p, res = m.exec("s", "import os\nprint(os.path.exists('/etc/shadow'))")
        assert res[0]["stdout"] == "False\n", res
        marker.assert_absent("forged pyvenv.cfg")
    finally:
        shutil.rmtree(secret_dir, ignore_errors=True)


# -------------------------------------------------- (e) a real venv works

@pytest.mark.parametrize("user", USERS)
def test_real_workspace_venv_still_works(mgr_factory, user):
    m = mgr_factory(user)
    ws = m.workspace("s")
    subprocess.run([SYS_PY, "-m", "venv", "--without-pip", str(ws / ".venv")], check=True,
                   timeout=120)
    chown_tree(ws / ".venv", user)
    r = m.run("restart", "s", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr, m.log("s"))
    p, res = m.exec("s", "import sys\nprint(sys.prefix)\nprint(sys.prefix != sys.base_prefix)")
    assert res[0]["status"] == "ok", (res, m.log("s"))
    assert res[0]["stdout"] == "%s/.venv\nTrue\n" % ws, res


@pytest.mark.parametrize("sbx", USERS, indirect=True)
def test_real_workspace_venv_kernel_info(sbx):
    subprocess.run([SYS_PY, "-m", "venv", "--without-pip", str(sbx.ws / ".venv")], check=True,
                   timeout=120)
    chown_tree(sbx.ws, sbx.user)
    k = KernelAs(sbx.base / "k", sbx.ws, sbx.user, base_env(sbx.user, sbx.base), cwd="/")
    sbx.kernels.append(k)
    interp = k.info()["interpreter"]
    assert interp["venv"] is True and interp["source"] == ".venv", interp
    assert interp["path"] == str(sbx.ws / ".venv" / "bin" / "python")
    assert interp["prefix"] == str(sbx.ws / ".venv")
    assert interp["executable"] == PY_REAL
    k.assert_alive()
