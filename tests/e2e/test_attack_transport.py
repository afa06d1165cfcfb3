"""Who can reach a kernel's ZeroMQ sockets.

ZeroMQ authenticates no peer (the HMAC key signs messages, it does not hide
them): whoever can connect to a kernel's IOPub reads everything it
publishes, code and output. So the manager's kernels use ipc sockets in a
0700 run directory by default; `transport: "tcp"` is refused unless the
operator accepts the exposure with `transport_tcp_exposed`, is then said at
every start, and binds 127.0.0.1 only; and the kernel server refuses a
connection file naming a non-loopback ip unless told otherwise.

Each attack asserts that it failed and that the service still works. The
attacker is another user (nobody, through setpriv), so those parts need
root; everything else runs unprivileged too. No fixed sleeps."""
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402
from jupyter_client.connect import write_connection_file  # noqa: E402
from kutil import poll_until  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="no kernel-python")

EXPOSURE = ("any local user can read every kernel's output on IOPub "
            "(ZeroMQ PUB has no authentication)")
TCP_ON = {"transport": "tcp", "transport_tcp_exposed": True}
PY = "/usr/bin/python3"

# Run by the attacker (or, as the control, by the kernels' own user): tries
# the connection file, a plain unix connect to the IOPub endpoint, then a
# ZeroMQ SUB on it, and counts what arrives until its stdin closes.
SUB_SCRIPT = r"""
import errno, os, socket, sys, zmq
cf, endpoint = sys.argv[1], sys.argv[2]
def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))
try:
    open(cf).read()
    print("CONNFILE readable", flush=True)
except OSError as e:
    print("CONNFILE", err(e), flush=True)
if endpoint.startswith("ipc://"):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(endpoint[6:])
        print("CONNECT ok", flush=True)
    except OSError as e:
        print("CONNECT", err(e), flush=True)
    s.close()
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.setsockopt(zmq.LINGER, 0)
sub.connect(endpoint)
print("READY", flush=True)
poller = zmq.Poller()
poller.register(sub, zmq.POLLIN)
poller.register(0, zmq.POLLIN)
n, data = 0, b""
while True:
    ev = dict(poller.poll(1000))
    if sub in ev:
        parts = sub.recv_multipart()
        n += 1
        data += b"".join(parts)
    if 0 in ev and not os.read(0, 100):
        break
print("RECEIVED", n, flush=True)
print("SECRET" if b"tcpsecret" + b"-7f3a" in data else "NOSECRET", flush=True)
"""


def session_kernel(mgr, session="s", lang="python"):
    """(kernel server pid, connection file path) of a live session kernel."""
    p = mgr.run("sessions", "--json")
    assert p.returncode == 0, p.stderr
    for s in json.loads(p.stdout):
        if s["name"] == session:
            k = s["kernels"][lang]
            return k["pid"], k["connection_file"]
    raise AssertionError(f"no session {session}: {p.stdout}")


def listening_tcp(pid):
    """[(address, port)] of the TCP sockets pid listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            t = os.readlink(fd)
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, state, inode = f[1], f[3], f[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = local.split(":")
            raw = bytes.fromhex(hexaddr)
            if table == "tcp":
                addr = ".".join(str(b) for b in raw[::-1])
            else:  # four little-endian 32-bit words
                words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
                addr = b"".join(words).hex()
            out.append((addr, int(hexport, 16)))
    return out


def works(mgr, session="s"):
    rc, res, p = mgr.exec(session, "print(6 * 7)", "--lang", "python")
    assert rc == 0 and res[-1]["stdout"] == "42\n", (p.stderr, res)


# ------------------------------------------------------------ the opt-in

@pytest.mark.parametrize("cfg", [{"transport": "tcp"},
                                 {"transport": "tcp", "transport_tcp_exposed": False}])
def test_tcp_without_opt_in_is_refused_naming_the_key(make_mgr, cfg):
    mgr = make_mgr(cfg)
    for cmd in (("exec", "--session", "s", "-c", "print(1)"), ("run", "-c", "print(1)"),
                ("serve",)):
        p = mgr.run(*cmd, timeout=60)
        assert p.returncode == 2, (cmd, p.returncode, p.stderr)
        assert "invalid configuration" in p.stderr, p.stderr
        assert '"transport_tcp_exposed": true' in p.stderr, p.stderr
        assert EXPOSURE in p.stderr, p.stderr
    # nothing was started: no daemon, no kernel
    assert not (mgr.home / "kernelmgr.sock").exists()
    assert not mgr.run_dir.exists()
    # the operator goes back to ipc: the service works
    (mgr.home / "config.json").write_text(json.dumps(
        {"sandbox": mgrutil.SANDBOX, "python": PY}))
    works(mgr)


def test_opt_in_must_be_a_boolean(make_mgr):
    mgr = make_mgr({"transport": "tcp", "transport_tcp_exposed": "yes"})
    p = mgr.run("exec", "--session", "s", "-c", "print(1)")
    assert p.returncode == 2 and "transport_tcp_exposed: must be true or false" in p.stderr, \
        p.stderr


def test_tcp_opt_in_warns_and_binds_loopback_only(make_mgr):
    mgr = make_mgr(TCP_ON)
    # the one-shot manager says it on its stderr
    p = mgr.run("run", "-c", "print(1)")
    assert p.returncode == 0, p.stderr
    assert f"kernelmgr: warning: tcp transport: {EXPOSURE}" in p.stderr, p.stderr
    # the daemon in its log, each kernel in its own
    works(mgr)
    log = (mgr.home / "daemon.log").read_text()
    assert f"warning: tcp transport: {EXPOSURE}" in log, log
    klog = (mgr.home / "sessions" / "s" / "python.log").read_text()
    assert f"warning: tcp transport on 127.0.0.1: {EXPOSURE}" in klog, klog
    rc, res, p = mgr.exec("s", "echo hi", "--lang", "bash")
    assert rc == 0 and res[-1]["stdout"] == "hi\n", (p.stderr, res)
    for lang in ("python", "bash"):
        pid, cf = session_kernel(mgr, lang=lang)
        conn = json.loads(Path(cf).read_text())
        assert conn["transport"] == "tcp" and conn["ip"] == "127.0.0.1", conn
        ports = {conn[k] for k in ("shell_port", "iopub_port", "stdin_port", "control_port",
                                   "hb_port")}
        socks = poll_until(lambda: listening_tcp(pid), lambda v: {p for _, p in v} >= ports, 30,
                           f"the {lang} kernel listening on its five ports")
        assert all(addr == "127.0.0.1" for addr, _ in socks), (lang, socks)
    # the daemon itself listens on no TCP port (no gateway configured)
    assert listening_tcp(mgr.daemon_pid()) == []
    works(mgr)


# ------------------------------------------------------------ ipc, another user

class Subscriber:
    """SUB_SCRIPT run as prefix says (setpriv for another user, [] for the
    kernels' own); its report lines as they come."""

    def __init__(self, prefix, cf, endpoint):
        self.p = subprocess.Popen([*prefix, PY, "-c", SUB_SCRIPT, cf, endpoint],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, bufsize=0, cwd="/")
        self.buf = b""

    def lines(self):
        return [x.strip() for x in self.buf.decode(errors="replace").splitlines()]

    def _read(self, deadline):
        left = deadline - time.monotonic()
        assert left > 0, f"subscriber: no answer in time: {self.lines()}"
        r, _, _ = select.select([self.p.stdout], [], [], left)
        chunk = os.read(self.p.stdout.fileno(), 65536) if r else b""
        self.buf += chunk
        return chunk or not r

    def wait_for(self, word, deadline=30):
        end = time.monotonic() + deadline
        while word not in self.lines():
            if not self._read(end):
                raise AssertionError(f"subscriber ended: {self.lines()} "
                                     f"{self.p.stderr.read().decode(errors='replace')}")

    def finish(self, deadline=30):
        """Closes its stdin; its whole report once it has ended."""
        self.p.stdin.close()
        end = time.monotonic() + deadline
        while self._read(end):
            pass
        assert self.p.wait(deadline) == 0, (self.lines(), self.p.stderr.read())
        return self.lines()

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


def _subscribe_during_cell(mgr, prefix):
    """Runs the subscriber (as prefix says) while a cell prints a secret
    for a while; returns its report lines."""
    works(mgr)
    _, cf = session_kernel(mgr)
    conn = json.loads(Path(cf).read_text())
    sub = Subscriber(prefix, cf, f"ipc://{conn['ip']}-{conn['iopub_port']}")
    try:
        sub.wait_for("READY")
        code = ("import time\n"
                "for i in range(30):\n"
                "    print('tcpsecret' + '-7f3a', i, flush=True)\n"
                "    time.sleep(0.05)\n")
        rc, res, p = mgr.exec("s", code, "--lang", "python")
        assert rc == 0 and "tcpsecret-7f3a 29" in res[-1]["stdout"], (p.stderr, res)
        return sub.finish()
    finally:
        sub.kill()


def test_ipc_control_the_kernels_own_user_reads_iopub(make_mgr):
    """The method works: the kernels' own user, who may, gets the output."""
    mgr = make_mgr()
    lines = _subscribe_during_cell(mgr, [])
    assert "CONNECT ok" in lines and "SECRET" in lines, lines
    works(mgr)


@pytest.mark.skipif(not sbxutil.IS_ROOT, reason="needs root to run the attacker as nobody")
def test_ipc_iopub_unreachable_by_another_user(make_mgr):
    mgr = make_mgr()
    # a home others may enter: the run directory alone must keep them out
    os.chmod(mgr.home, 0o755)
    works(mgr)
    _, cf = session_kernel(mgr)
    run_dir = Path(cf).parent
    st = run_dir.stat()
    assert st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0, oct(st.st_mode)
    assert Path(cf).stat().st_mode & 0o077 == 0
    lines = _subscribe_during_cell(mgr, sbxutil.SETPRIV)
    assert "CONNFILE EACCES" in lines, lines
    assert "CONNECT EACCES" in lines, lines
    assert "RECEIVED 0" in lines and "NOSECRET" in lines, lines
    works(mgr)


# ------------------------------------------------------------ the kernel server

@pytest.fixture
def open_dir():
    """A directory under /tmp every user may enter (the socket files alone
    must keep others out); removed at the end."""
    d = Path(tempfile.mkdtemp(prefix="kmipc", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_kernel_ipc_sockets_are_private_whatever_the_umask(open_dir):
    """A kernel started by hand (or by jupyter_client with --transport ipc)
    under umask 000 in a directory others can enter: its socket files are
    still its user's only, and another user cannot subscribe."""
    old = os.umask(0)
    try:
        k = kutil.Kernel("python", open_dir, args=("--sandbox", "none"), transport="ipc")
    finally:
        os.umask(old)
    try:
        conn = json.loads(Path(k.cf).read_text())
        for ch in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"):
            st = os.stat(f"{conn['ip']}-{conn[ch]}")
            assert stat.S_ISSOCK(st.st_mode) and st.st_mode & 0o077 == 0, (ch, oct(st.st_mode))
        if sbxutil.IS_ROOT:
            os.chmod(k.cf, 0o644)  # even the key given away: the socket stays closed
            sub = Subscriber(sbxutil.SETPRIV, k.cf, f"ipc://{conn['ip']}-{conn['iopub_port']}")
            try:
                sub.wait_for("READY")
                _, r = k.execute("for i in range(30): print('tcpsecret' + '-7f3a', i)")
                assert "tcpsecret-7f3a 29" in kutil.stream_text(r["iopub"], "stdout")
                lines = sub.finish()
            finally:
                sub.kill()
            assert "CONNFILE readable" in lines and "CONNECT EACCES" in lines, lines
            assert "RECEIVED 0" in lines and "NOSECRET" in lines, lines
        _, r = k.execute("print(6 * 7)")
        assert kutil.stream_text(r["iopub"], "stdout") == "42\n"
    finally:
        k.close()


@pytest.mark.parametrize("ip", ["0.0.0.0", "*", "lo", "localhost", "192.0.2.1", "::",
                                "128.0.0.1"])
def test_kernel_refuses_a_non_loopback_ip(tmp_path, ip):
    cf = tmp_path / "k.json"
    write_connection_file(str(cf), transport="tcp", ip=ip, key=uuid.uuid4().hex.encode(),
                          shell_port=1, iopub_port=2, stdin_port=3, control_port=4, hb_port=5)
    p = subprocess.run([kutil.binary("kernel-python"), "-f", str(cf), "--workspace",
                        str(tmp_path), "--sandbox", "none"], capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 1, (p.returncode, p.stderr)
    assert f'ip "{ip}" is not a loopback address' in p.stderr, p.stderr
    assert "--allow-non-loopback-ip" in p.stderr and "ZeroMQ PUB has no authentication" in \
        p.stderr, p.stderr


def _listening_kernel(tmp_path, ip, *flags):
    """Starts kernel-python on a tcp connection file for ip; returns
    (process, the addresses it listens on once all five ports are up)."""
    cf = tmp_path / "k.json"
    write_connection_file(str(cf), transport="tcp", ip=ip, key=uuid.uuid4().hex.encode())
    conn = json.loads(cf.read_text())
    want = {conn[k] for k in ("shell_port", "iopub_port", "stdin_port", "control_port",
                              "hb_port")}
    p = subprocess.Popen([kutil.binary("kernel-python"), "-f", str(cf), "--workspace",
                          str(tmp_path), "--sandbox", "none", *flags], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    socks = poll_until(lambda: listening_tcp(p.pid) if p.poll() is None else None,
                       lambda v: v is None or {pt for _, pt in v} >= want, 30,
                       "the kernel listening on its five ports")
    if socks is None:
        raise AssertionError(f"the kernel ended: {p.stderr.read()}")
    return p, {a for a, _ in socks}


def test_kernel_accepts_any_loopback_address(tmp_path):
    p, addrs = _listening_kernel(tmp_path, "127.1.2.3")
    try:
        assert addrs == {"127.1.2.3"}, addrs
    finally:
        p.terminate()
        p.wait(30)
    assert "warning: tcp transport on 127.1.2.3" in p.stderr.read()


def test_kernel_non_loopback_only_with_the_flag(tmp_path):
    p, addrs = _listening_kernel(tmp_path, "0.0.0.0", "--allow-non-loopback-ip")
    try:
        assert addrs == {"0.0.0.0"}, addrs
    finally:
        p.terminate()
        p.wait(30)
    err = p.stderr.read()
    assert f"warning: tcp transport on 0.0.0.0: {EXPOSURE}" in err, err
