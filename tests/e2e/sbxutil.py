"""Helpers for the sandbox tests (test_sandbox_*.py).

Every attack runs twice when it can: through tests/tools/sandbox_run.c (the
sandbox module alone, built here from sandbox/*.c) and through a real
kernel started with `--sandbox strict` (skipped, with the reason, while
build/kernel-<lang> does not exist). Both run as the invoking user and, when
that is root, also as nobody via setpriv: the `user` parameter.
"""
import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import kutil

ROOT = kutil.ROOT
NOBODY = 65534
IS_ROOT = os.geteuid() == 0
USERS = ["invoker", "nobody"]
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
PY = "/usr/bin/python3"
MARK_SAFE = "SAFE"
MARK_PWNED = "PWNED"

_tool_lock = threading.Lock()
_tool_path = None


def build_tool():
    """Compiles build/sandbox-run from the sandbox sources (no dependency on
    the rest of the tree, which may be mid-edit). Returns its path."""
    global _tool_path
    with _tool_lock:
        if _tool_path:
            return _tool_path
        env_tool = os.environ.get("SANDBOX_RUN")
        if env_tool:
            _tool_path = env_tool
            return env_tool
        out = kutil.BUILD / "sandbox-run"
        # xdist workers are processes: each builds under a name of its own
        tmp = "%s.tmp.%d" % (out, os.getpid())
        out.parent.mkdir(parents=True, exist_ok=True)
        srcs = sorted(str(p) for p in (ROOT / "sandbox").glob("*.c"))
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson", "libseccomp"],
                               capture_output=True, text=True, check=True).stdout.split()
        cmd = ["gcc", "-std=gnu11", "-D_GNU_SOURCE", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
               "-Wno-unused-parameter", "-I", str(ROOT), "-o", tmp,
               str(ROOT / "tests/tools/sandbox_run.c"), *srcs, *flags]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            pytest.fail("building sandbox-run failed:\n" + r.stderr)
        os.replace(tmp, out)
        _tool_path = str(out)
        return _tool_path


class Run:
    """Result of one sandboxed command."""

    def __init__(self, rc, out, err):
        self.rc, self.out, self.err = rc, out, err

    def __repr__(self):
        return f"Run(rc={self.rc}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


class Sandboxes:
    """Per-test state: a scratch directory that nobody can use too, the
    workspace, and runners for the tool and the kernels."""

    def __init__(self, user):
        if user == "nobody" and not IS_ROOT:
            pytest.skip("the nobody variant needs root to switch users (the invoker "
                        "variant already runs unprivileged)")
        self.user = user
        self.base = Path(tempfile.mkdtemp(prefix="kmsbx-", dir="/tmp"))
        os.chmod(self.base, 0o755)
        tool = build_tool()
        # A copy the unprivileged user can execute wherever the tree lives.
        self.tool = str(self.base / "sandbox-run")
        shutil.copy2(tool, self.tool)
        os.chmod(self.tool, 0o755)
        self.ws = self.base / "ws"
        self.ws.mkdir()
        if user == "nobody":
            os.chown(self.ws, NOBODY, NOBODY)
        self.kernels = []
        self.procs = []

    @property
    def prefix(self):
        return SETPRIV if self.user == "nobody" else []

    def expected_uid(self):
        """Host uid that files written by the sandbox get: the workspace's
        owner (a root caller's sandbox writes through an idmapped mount; an
        unprivileged caller's runs as the caller, who owns the workspace)."""
        return self.ws.stat().st_uid

    def run(self, code, lang="bash", opts=(), timeout=60, stdin=subprocess.DEVNULL,
            pass_fds=(), env=None):
        """Runs code with bash -c or python3 -c through sandbox-run."""
        argv = ["/bin/bash", "-c", code] if lang == "bash" else [PY, "-c", code]
        cmd = [*self.prefix, self.tool, "--workspace", str(self.ws), *opts, "--", *argv]
        e = dict(os.environ if env is None else env)
        e.setdefault("HOME", "/tmp")
        try:
            p = subprocess.run(cmd, stdin=stdin, capture_output=True, timeout=timeout,
                               pass_fds=pass_fds, env=e)
        except subprocess.TimeoutExpired as ex:
            pytest.fail(f"sandbox-run hung: {ex}")
        return Run(p.returncode, p.stdout.decode(errors="replace"),
                   p.stderr.decode(errors="replace"))

    # ---- kernels -------------------------------------------------------
    @staticmethod
    def kernel_missing(lang):
        """Reason to skip the kernel half, or None."""
        b = Path(kutil.binary("kernel-" + lang))
        if not b.exists():
            return f"{b} is not built yet (kernel server pending)"
        try:
            h = subprocess.run([str(b), "--help"], capture_output=True, text=True, timeout=10)
        except Exception as ex:  # noqa: BLE001
            return f"{b} --help failed: {ex}"
        if "--sandbox" not in h.stdout + h.stderr:
            return f"{b} does not accept --sandbox yet"
        return None

    def kernel(self, lang, args=()):
        """A kernel with --sandbox strict, as self.user; closed at teardown."""
        why = self.kernel_missing(lang)
        if why:
            pytest.skip(why)
        k = SandboxKernel(lang, self.base / f"k{len(self.kernels)}", self.ws,
                          ["--sandbox", "strict", *args], self.prefix)
        self.kernels.append(k)
        return k

    def kernel_run(self, lang, code, args=(), timeout=60):
        """Runs code in a fresh sandboxed kernel, then proves the kernel still
        answers. Returns (stdout+stderr+error text, kernel)."""
        k = self.kernel(lang, args)
        _, r = k.execute(code, timeout=timeout)
        text = kutil.stream_text(r["iopub"], "stdout") + kutil.stream_text(r["iopub"], "stderr")
        for m in kutil.of_type(r["iopub"], "error"):
            text += "\n" + m["content"]["ename"] + ": " + m["content"]["evalue"]
        k.assert_alive()
        return text, k

    def close(self):
        for k in self.kernels:
            k.close()
        shutil.rmtree(self.base, ignore_errors=True)


_nobody_dir = None


def nobody_binary(name):
    """Path of a copy of build/<name> (with build/share beside it, where the
    kernels look for their support files) that nobody can execute wherever
    the tree lives: a CI checkout under /root (mode 0700) is not."""
    global _nobody_dir
    with _tool_lock:
        if _nobody_dir is None:
            d = Path(tempfile.mkdtemp(prefix="km-nobody-bin-"))
            os.chmod(d, 0o755)
            # every binary a nobody test runs, copied once per process here
            # (copying one again while another test executes it: ETXTBSY)
            for b in ("kernel-bash", "kernel-python", "kernelmgr", "kernelmgr-gateway",
                      "kernelmgr-sandbox"):
                if (kutil.BUILD / b).exists():
                    shutil.copy2(kutil.BUILD / b, d / b)
            shutil.copytree(kutil.BUILD / "share", d / "share")
            for root, dirs, files in os.walk(d):
                for n in dirs + files:
                    p = os.path.join(root, n)
                    os.chmod(p, 0o755 if os.path.isdir(p) or os.access(p, os.X_OK) else 0o644)
            atexit.register(shutil.rmtree, d, True)
            _nobody_dir = d
    return str(_nobody_dir / name)


def kernelmgr_for(user):
    """build/kernelmgr, or for nobody its copy beside nobody's kernel copies
    (with kernelmgr-gateway, which `serve --http` execs)."""
    if user != "nobody":
        return kutil.binary("kernelmgr")
    return nobody_binary("kernelmgr")


class SandboxKernel(kutil.Kernel):
    """kutil.Kernel with a command prefix (setpriv) and a given workspace."""

    def __init__(self, lang, workdir, workspace, args, prefix):
        from jupyter_client import BlockingKernelClient
        from jupyter_client.connect import write_connection_file
        self.lang = lang
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workspace = Path(workspace)
        self.cf = str(self.workdir / "kernel.json")
        write_connection_file(self.cf, transport="tcp")
        if prefix:
            os.chown(self.workdir, NOBODY, NOBODY)
            os.chown(self.cf, NOBODY, NOBODY)
        self.log = open(self.workdir / "kernel.log", "wb")
        exe = nobody_binary("kernel-" + lang) if prefix else kutil.binary("kernel-" + lang)
        cmd = [*prefix, exe, "-f", self.cf, "--workspace",
               str(self.workspace), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.kc = BlockingKernelClient(connection_file=self.cf)
        self.kc.load_connection_file()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=60)
        except Exception:
            self.close()
            raise

    def assert_alive(self):
        code = "print(6 * 7)" if self.lang == "python" else "echo $((6 * 7))"
        _, r = self.execute(code, timeout=60)
        assert r["reply"]["content"]["status"] == "ok", r
        assert "42" in kutil.stream_text(r["iopub"]), (r, self.log_text())


def assert_safe(text, what=""):
    assert MARK_PWNED not in text, f"attack succeeded {what}: {text}"
    assert MARK_SAFE in text, f"attack did not report {what}: {text}"


class Listener:
    """A TCP listener on the host that records whether anything connected."""

    def __init__(self, host="127.0.0.1"):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        self._stop = False
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()

    def _loop(self):
        while not self._stop:
            try:
                c, a = self.sock.accept()
                self.accepted.append(a)
                c.close()
            except OSError:
                pass

    def close(self):
        self._stop = True
        self.t.join(2)
        self.sock.close()


def host_addresses():
    """The host's own non-loopback IPv4 addresses."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    addrs = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            a = parts[parts.index("inet") + 1].split("/")[0]
            if not a.startswith("127."):
                addrs.append(a)
    return addrs


def wait_gone(pattern, timeout=10):
    """True when no host process's command line contains pattern."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
        if r.returncode != 0:
            return True
        time.sleep(0.1)
    return False


def host_status_ids(pid):
    """(real, effective, saved, fs) uids of a host process, from the host's
    /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return tuple(int(v) for v in line.split()[1:5])
    raise AssertionError(f"no Uid line for {pid}")


def wait_pid_of(pattern, timeout=20, running=lambda: True):
    """The pid of the one host process whose command line contains pattern;
    gives up early once running() is false (what would start it ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and running():
        r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
        pids = [int(p) for p in r.stdout.split()]
        if pids:
            return pids[0]
        time.sleep(0.05)
    raise AssertionError(f"no host process matches {pattern!r}")


def kill_pattern(pattern):
    r = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    for pid in r.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
