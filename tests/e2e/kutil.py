"""Shared helpers for end-to-end tests: start our kernel binaries and drive
them with the real jupyter_client (Debian's python3-jupyter-client)."""
import os
import queue
import signal
import stat as stat_mod
import subprocess
import time
from pathlib import Path

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("BUILD", ROOT / "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD


def binary(name):
    """Absolute path of build/<name>."""
    return str(BUILD / name)


def _on_tmpfs(path):
    p = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    return p.returncode == 0 and p.stdout.strip() in ("tmpfs", "ramfs")


def run_dir(home, uid=None, env=None):
    """The run directory of a kernelmgr home (connection files, ipc sockets,
    pid files, owner locks), as klaunch_run_dir chooses it: a private
    kernelmgr-UID-DEV-INO directory in $XDG_RUNTIME_DIR (a tmpfs of the
    user's own), HOME/run when the home is on tmpfs, else one in
    /run/user/UID or /dev/shm, else HOME/run. It may not exist (yet, or any
    more: the last owner removes it when empty)."""
    home = Path(home)
    uid = os.geteuid() if uid is None else uid
    env = os.environ if env is None else env
    st = home.stat()
    name = f"kernelmgr-{uid}-{st.st_dev:x}-{st.st_ino:x}"

    def own_tmpfs(base):
        try:
            b = os.lstat(base)
        except OSError:
            return False
        return (stat_mod.S_ISDIR(b.st_mode) and b.st_uid == uid and not b.st_mode & 0o022
                and _on_tmpfs(base))

    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and xdg.startswith("/") and own_tmpfs(xdg):
        return Path(xdg) / name
    if _on_tmpfs(home):
        return home / "run"
    if own_tmpfs(f"/run/user/{uid}"):
        return Path(f"/run/user/{uid}") / name
    try:
        shm = os.lstat("/dev/shm")
        if shm.st_uid == 0 and shm.st_mode & 0o1000 and _on_tmpfs("/dev/shm"):
            return Path("/dev/shm") / name
    except OSError:
        pass
    return home / "run"


class Kernel:
    """A kernel process plus a connected BlockingKernelClient."""

    def __init__(self, lang, workdir, args=(), transport="tcp", key=None, env=None,
                 start_timeout=120):
        # start_timeout bounds a hang, not a start: a kernel starts in well
        # under a second, but under the sanitizers beside the parallel pass
        # and the background builds one has taken over 30 s
        self.lang = lang
        self.workdir = Path(workdir)
        self.workspace = self.workdir / "ws"
        self.workspace.mkdir(parents=True, exist_ok=True)
        self.cf = str(self.workdir / "kernel.json")
        kw = {}
        if transport == "ipc":
            kw["ip"] = str(self.workdir / "k")
        # Signed by default, like a real frontend: an empty key would switch
        # off signature checks and replay protection. key="" tests that mode.
        key = os.urandom(32).hex() if key is None else key
        kw["key"] = key.encode() if isinstance(key, str) else key
        cmd = [binary("kernel-" + lang), "-f", self.cf, "--workspace", str(self.workspace),
               *args]
        # jupyter_client picks free tcp ports and closes them; the kernel binds
        # them later, and on a machine starting many kernels at once another
        # process can take one in between (the connection file's protocol has
        # that window). Only that failure is started again, on fresh ports.
        for attempt in range(3):
            write_connection_file(self.cf, transport=transport, **kw)
            self.log = open(self.workdir / "kernel.log", "wb")
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env)
            self.kc = BlockingKernelClient(connection_file=self.cf)
            self.kc.load_connection_file()
            self.kc.start_channels()
            try:
                wait_ready(self.kc, self.proc, start_timeout, self.log_text)
                break
            except Exception:
                port_taken = (transport == "tcp" and self.proc.poll() is not None
                              and "Address already in use" in self.log_text())
                self.close()
                if not port_taken or attempt == 2:
                    raise

    def log_text(self):
        if not self.log.closed:
            self.log.flush()
        return (self.workdir / "kernel.log").read_text(errors="replace")

    def execute(self, code, timeout=30, allow_stdin=False, stdin_handler=None, **kw):
        """Runs code; returns (reply, [iopub messages of this request up to idle])."""
        msg_id = self.kc.execute(code, allow_stdin=allow_stdin, **kw)
        return msg_id, self.collect(msg_id, timeout, stdin_handler)

    def collect(self, msg_id, timeout=30, stdin_handler=None):
        deadline = time.monotonic() + timeout
        iopub = []
        reply = None
        idle = False
        while not (idle and reply is not None):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no idle/reply for {msg_id}: reply={reply!r} iopub={iopub!r}")
            if stdin_handler is not None:
                try:
                    m = self.kc.get_stdin_msg(timeout=0.01)
                    stdin_handler(self.kc, m)
                except queue.Empty:
                    pass
            if reply is None:
                try:
                    # no wait before our idle: IOPub is read at full speed
                    # (one message per turn) even when other clients flood
                    # it; after it, only the reply is missing
                    m = self.kc.get_shell_msg(timeout=min(0.05, max(left, 0.001)) if idle else 0)
                    if m["parent_header"].get("msg_id") == msg_id:
                        reply = m
                except queue.Empty:
                    pass
            if idle:
                # what IOPub has now belongs to later requests: leave it
                continue
            try:
                m = self.kc.get_iopub_msg(timeout=min(0.05, max(left, 0.001)))
            except queue.Empty:
                continue
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            iopub.append(m)
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                idle = True
        return {"reply": reply, "iopub": iopub}

    def close(self):
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        # What the kernel started (sandbox init, worker) must end with it;
        # remember it to check, and to make sure nothing outlives the test.
        tree = descendants(self.proc.pid) if self.proc.poll() is None else []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        left = kill_left(tree)
        self.log.close()
        # A kernel that exits must take its sandbox and worker with it.
        assert not left, f"processes of the kernel outlived it (killed now): {left}"


def wait_ready(kc, proc, timeout, log_text=lambda: ""):
    """Waits until the kernel answers kernel_info on shell. Unlike
    jupyter_client's wait_for_ready it never declares a kernel dead from its
    heartbeat (a kernel that starts slowly on a loaded machine answers late,
    and "Kernel died before replying to kernel_info" was then a false
    alarm): only the kernel process exiting or the deadline ends the wait."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the kernel exited with status {proc.returncode} before "
                               f"replying to kernel_info; log:\n{log_text()}")
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError(f"the kernel did not reply to kernel_info within {timeout} s; "
                               f"log:\n{log_text()}")
        msg_id = kc.kernel_info()
        end = time.monotonic() + min(1.0, left)
        while time.monotonic() < end:
            try:
                m = kc.get_shell_msg(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                break
            if m["msg_type"] == "kernel_info_reply" and \
                    m["parent_header"].get("msg_id") == msg_id:
                # IOPub is connected only once a message arrived on it (the
                # PUB/SUB slow joiner): without one, the first execution's
                # output could be lost; ask again, as jupyter_client does
                got = 0
                while True:
                    try:
                        kc.get_iopub_msg(timeout=0.2 if not got else 0.05)
                        got += 1
                    except queue.Empty:
                        break
                if got:
                    return
                break


def poll_until(what, pred, deadline=60, msg="condition", step=0.05):
    """Calls what() until pred(value) holds and returns that value; fails
    the test naming msg and the last value after deadline seconds."""
    end = time.monotonic() + deadline
    while True:
        v = what()
        if pred(v):
            return v
        assert time.monotonic() < end, f"{msg} never held; last value: {v!r}"
        time.sleep(step)


def children_of(pid):
    """Direct children of pid (from /proc/PID/task/*/children)."""
    out = []
    for t in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (t / "children").read_text().split()]
        except OSError:
            pass
    return out


def descendants(pid):
    """Every live descendant of pid, parents before children."""
    out, todo = [], [pid]
    while todo:
        for c in children_of(todo.pop(0)):
            out.append(c)
            todo.append(c)
    return out


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pids, timeout=10):
    """The pids still alive after up to timeout seconds (polling)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def kill_left(pids, timeout=10):
    """Waits for pids to end; SIGKILLs any left after timeout. Returns those
    that had to be killed."""
    left = wait_dead(pids, timeout)
    for p in left:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    return left


def worker_pid(kernel_pid, timeout=30):
    """The pid of the kernel's worker process (the deepest process of its
    tree that is not the sandbox's init), waiting for one to exist."""
    deadline = time.monotonic() + timeout
    while True:
        for p in reversed(descendants(kernel_pid)):
            try:
                comm = Path(f"/proc/{p}/comm").read_text().strip()
            except OSError:
                continue
            if comm not in ("sandbox-init", "kernel-bash", "kernel-python") and \
                    Path(f"/proc/{p}/stat").exists():
                # the worker is the child of init (strict) or of the kernel
                # (none); a cell's own children are deeper
                par = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
                pcomm = Path(f"/proc/{par}/comm").read_text().strip() if alive(par) else ""
                if pcomm in ("sandbox-init", "kernel-bash", "kernel-python"):
                    return p
        w = session_worker_pid(kernel_pid)
        if w:
            return w
        if time.monotonic() > deadline:
            raise AssertionError(f"no worker under {kernel_pid}: {descendants(kernel_pid)}")
        time.sleep(0.05)


def _pipe_inodes(pid, fds=None):
    out = set()
    try:
        names = fds if fds is not None else os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("pipe:"):
            out.add(link)
    return out


def session_worker_pid(kernel_pid):
    """The worker of a kernel started with --session-sandbox: not its
    descendant (the session sandbox's init forks it) but the child of a
    sandbox-init holding one of the kernel's pipes (its request pipe, which
    the Bash worker moves off fd 3)."""
    try:
        if b"--session-sandbox" not in Path(f"/proc/{kernel_pid}/cmdline").read_bytes():
            return None
    except OSError:
        return None
    mine = _pipe_inodes(kernel_pid)
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == kernel_pid:
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            par = int(stat.rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{par}/comm").read_text().strip() != "sandbox-init":
                continue
        except (OSError, ValueError, IndexError):
            continue
        if _pipe_inodes(d) & mine:
            return int(d)
    return None


def stream_text(iopub, name="stdout"):
    return "".join(m["content"]["text"] for m in iopub
                   if m["msg_type"] == "stream" and m["content"]["name"] == name)


def of_type(iopub, msg_type):
    return [m for m in iopub if m["msg_type"] == msg_type]


# ---------------------------------------------------------------- raw channel access
# (added with the kernel server tests; used by the Bash and Python kernel tests)

def raw_socket(kernel, channel, sock_type=None):
    """A fresh zmq socket connected to one of the kernel's channels (DEALER by
    default, REQ for "hb"). The caller closes it."""
    import zmq
    if sock_type is None:
        sock_type = zmq.REQ if channel == "hb" else zmq.DEALER
    s = zmq.Context.instance().socket(sock_type)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(kernel.kc._make_url(channel))
    return s


def recv_reply(kernel, sock, timeout=10):
    """Receives and deserializes one message from a raw DEALER socket, or None
    when nothing arrives within timeout seconds."""
    if not sock.poll(int(timeout * 1000)):
        return None
    _, frames = kernel.kc.session.feed_identities(sock.recv_multipart())
    return kernel.kc.session.deserialize(frames)


def control_request(kernel, msg_type, content=None, timeout=10):
    """Sends msg_type on the control channel through a fresh socket; returns
    the reply message (None on timeout)."""
    s = raw_socket(kernel, "control")
    try:
        kernel.kc.session.send(s, msg_type, content or {})
        return recv_reply(kernel, s, timeout)
    finally:
        s.close()


def hb_ping(kernel, timeout=5):
    """True when the heartbeat channel echoes a ping within timeout seconds."""
    s = raw_socket(kernel, "hb")
    try:
        s.send(b"ping")
        return bool(s.poll(int(timeout * 1000))) and s.recv() == b"ping"
    finally:
        s.close()
