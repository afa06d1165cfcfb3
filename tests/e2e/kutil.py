"""Shared helpers for end-to-end tests: start our kernel binaries and drive
them with the real jupyter_client (Debian's python3-jupyter-client)."""
import os
import queue
import signal
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


class Kernel:
    """A kernel process plus a connected BlockingKernelClient."""

    def __init__(self, lang, workdir, args=(), transport="tcp", key=None, env=None,
                 start_timeout=30):
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
        write_connection_file(self.cf, transport=transport, **kw)
        self.log = open(self.workdir / "kernel.log", "wb")
        cmd = [binary("kernel-" + lang), "-f", self.cf, "--workspace", str(self.workspace),
               *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        self.kc = BlockingKernelClient(connection_file=self.cf)
        self.kc.load_connection_file()
        self.kc.start_channels()
        try:
            self.kc.wait_for_ready(timeout=start_timeout)
        except Exception:
            self.close()
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
                    m = self.kc.get_shell_msg(timeout=0.01)
                    if m["parent_header"].get("msg_id") == msg_id:
                        reply = m
                except queue.Empty:
                    pass
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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


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
