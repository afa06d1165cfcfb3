"""A session is one machine: every kernel of a strict session runs in the
session's one sandbox (kernelmgr-sandbox, sandbox/sbx_session.c).

Real kernels, the real daemon, the strict sandbox, as the invoking user and
(when that is root) as nobody: one network namespace (a server started from
Bash is reachable from Python and the reverse), one /tmp, one process list,
one cgroup whose memory limit is the session's; another session sees none
of it; killing one kernel's worker leaves the other kernel and its
background processes running; closing the session leaves no process."""
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import kutil
import mgrutil
import sbxutil

NOBODY = sbxutil.NOBODY
BINS = ("kernelmgr", "kernel-bash", "kernel-python", "kernelmgr-sandbox")


def _bindir_for_nobody():
    d = Path(tempfile.mkdtemp(prefix="km-machine-bin-"))
    os.chmod(d, 0o755)
    for b in BINS:
        shutil.copy2(kutil.BUILD / b, d / b)
    shutil.copytree(kutil.BUILD / "share", d / "share")
    for root, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(root, n)
            os.chmod(p, 0o755 if os.path.isdir(p) or os.access(p, os.X_OK) else 0o644)
    return d


class MachineMgr(mgrutil.Mgr):
    """A daemon with session sandboxes, as the invoker or (setpriv) nobody."""

    def __init__(self, user, config=None):
        if user == "nobody" and not sbxutil.IS_ROOT:
            pytest.skip("the nobody variant needs root to switch users")
        for b in BINS:
            if not (kutil.BUILD / b).exists():
                pytest.skip(f"build/{b} is not built")
        cfg = {"sandbox": "strict", "session_sandbox": True}
        cfg.update(config or {})
        super().__init__(cfg)
        self.user = user
        self.prefix, self.km, self.bindir = [], mgrutil.KM, None
        if user == "nobody":
            self.bindir = _bindir_for_nobody()
            self.prefix, self.km = sbxutil.SETPRIV, str(self.bindir / "kernelmgr")
            for root, dirs, files in os.walk(self.home):
                for n in [root, *(os.path.join(root, x) for x in dirs + files)]:
                    os.chown(n, NOBODY, NOBODY)
            os.chown(self.home, NOBODY, NOBODY)

    def run(self, *args, input=None, timeout=120, check_json=True):
        return subprocess.run([*self.prefix, self.km, *args], input=input, capture_output=True,
                              text=True, env=self.env, timeout=timeout)

    def one(self, session, code, lang, *args, timeout=120):
        rc, res, p = self.exec(session, code, "--lang", lang, *args, timeout=timeout)
        assert res, (rc, p.stdout, p.stderr)
        return res[-1]

    def ok(self, session, code, lang, *args):
        r = self.one(session, code, lang, *args)
        assert r["status"] == "ok", r
        return r["stdout"]

    def close(self):
        super().close()
        if self.bindir:
            shutil.rmtree(self.bindir, ignore_errors=True)


@pytest.fixture(params=sbxutil.USERS)
def mgr(request):
    m = MachineMgr(request.param)
    yield m
    m.close()


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# A loopback server from Bash, polled from Python (the server needs a
# moment to listen: a deadline, never a fixed sleep).
PY_FETCH = r'''
import time, urllib.request
deadline = time.monotonic() + 30
while True:
    try:
        print("GOT", urllib.request.urlopen("http://127.0.0.1:%d/%s", timeout=5).read().decode().strip())
        break
    except OSError as e:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
'''

BASH_FETCH = r'''
for i in $(seq 600); do
  if exec 3<>/dev/tcp/127.0.0.1/%d 2>/dev/null; then break; fi
  sleep 0.05
done
printf 'GET /%s HTTP/1.0\r\n\r\n' >&3
grep -a MARK <&3
exec 3<&-
'''


def wait_until(pred, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def procs_with(token):
    """Host pids whose command line contains token (zombies have none)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if token.encode() in cmd:
            out.append(int(d))
    return out


def test_one_network_tmp_and_process_list(mgr):
    port = free_port()
    mgr.ok("m", f"echo MARK-file > /tmp/shared.txt; mkdir -p /tmp/www; echo MARK-bash > /tmp/www/b; "
                f"(cd /tmp/www && exec python3 -m http.server {port} --bind 127.0.0.1 "
                f">/dev/null 2>&1 &)", "bash")
    out = mgr.ok("m", PY_FETCH % (port, "b") + "\nprint(open('/tmp/shared.txt').read())",
                 "python")
    assert "GOT MARK-bash" in out and "MARK-file" in out, out
    # the other way: a Python server reached through Bash's /dev/tcp
    port2 = free_port()
    mgr.ok("m", "import http.server, threading, os\n"
                "os.makedirs('/tmp/pywww', exist_ok=True)\n"
                "open('/tmp/pywww/p', 'w').write('MARK-python\\n')\n"
                "h = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory='/tmp/pywww', **k)\n"
                "srv = http.server.ThreadingHTTPServer(('127.0.0.1', %d), h)\n"
                "threading.Thread(target=srv.serve_forever, daemon=True).start()\n"
                "print('serving')" % port2, "python")
    out = mgr.ok("m", BASH_FETCH % (port2, "p"), "bash")
    assert "MARK-python" in out, out
    # one process list: Bash sees the Python worker, the init is PID 1
    out = mgr.ok("m", "ps -e -o pid=,args=", "bash")
    assert out.split()[0] == "1", out
    assert "driver.py" in out, out
    assert f"http.server {port}" in out, out
    # only lo, no DNS
    out = mgr.ok("m", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
                      "getent hosts example.com || echo NO-DNS", "bash")
    assert out.split() == ["lo", "NO-DNS"], out
    # another session: none of it
    out = mgr.ok("s2", f"ls /tmp; ps -e -o args=; "
                       f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo REACHED || "
                       f"echo REFUSED", "bash")
    assert "shared.txt" not in out and "http.server" not in out, out
    assert "REFUSED" in out and "REACHED" not in out, out
    out = mgr.ok("m", "echo still", "bash")
    assert "still" in out


def test_restart_of_one_kernel_keeps_the_other(mgr):
    port = free_port()
    tok = f"{port}"
    mgr.ok("k", f"mkdir -p /tmp/w; echo MARK-up > /tmp/w/u; (cd /tmp/w && exec python3 -m "
                f"http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &); x=kept", "bash")
    mgr.ok("k", "y = 41", "python")
    # the Python worker dies (and is restarted by its kernel server)
    r = mgr.one("k", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "python")
    assert r["status"] != "ok", r
    r = mgr.one("k", PY_FETCH % (port, "u") + "\nprint('y' in globals())", "python")
    assert r["status"] == "ok" and "GOT MARK-up" in r["stdout"], r
    assert r["stdout"].strip().endswith("False"), r  # a fresh Python, honestly
    out = mgr.ok("k", "echo $x", "bash")
    assert "kept" in out, out  # Bash's state and its server survived
    assert procs_with(f"http.server {tok}")
    # closing the session ends the sandbox: no process of it is left
    p = mgr.run("close", "k")
    assert p.returncode == 0, p.stderr
    wait_until(lambda: not procs_with(f"http.server {tok}"), what="the sandbox to end")
    ws = str(mgr.home / "sessions" / "k" / "workspace")
    wait_until(lambda: not procs_with(ws), what="the session's holder and kernels to end")


def test_memory_limit_is_the_sessions(mgr):
    mgr.ok("o", "x=kept; sleep 600 >/dev/null 2>&1 & echo started", "bash", "--memory", "192M")
    r = mgr.one("o", "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1",
                "python")
    assert r["status"] != "ok", r
    text = str(r)
    if r["error"] and r["error"]["name"] == "MemoryError":
        # no memory cgroup for this caller (nobody without delegation): the
        # limit is RLIMIT_DATA, per process, and the allocation just fails
        assert mgr.user == "nobody" or not os.path.exists("/sys/fs/cgroup/memory"), r
    else:
        assert "out of memory" in text and "192 MiB" in text, r
    # the other kernel was kept, its state and background job with it
    out = mgr.ok("o", "echo $x; jobs -r | wc -l", "bash")
    assert "kept" in out, out
    out = mgr.ok("o", "print(6 * 7)", "python")
    assert "42" in out


# ---- an egress allow-list: the session's one proxy, served by its holder ----

class _Hello:
    """An HTTP server on the host's 127.0.0.1 (the allowed host), counting
    the requests it answered."""

    def __init__(self):
        import http.server
        import threading
        outer = self
        self.hits = 0

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                outer.hits += 1
                body = b"hello from the host"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture(scope="module")
def hello():
    h = _Hello()
    yield h
    h.close()


@pytest.fixture(scope="module", params=sbxutil.USERS)
def allow_mgr(request, hello):
    """One daemon for the allow-list and the warm-pool tests: its pool's
    entries get the configured list too."""
    m = MachineMgr(request.param, {"network": {"allow": [f"127.0.0.1:{hello.port}"]},
                                   "pool": 1})
    # the daemon fills the pool once it runs (stopped by m.close())
    m.serve = subprocess.Popen([*m.prefix, m.km, "serve"], env=m.env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield m
    m.close()
    m.serve.wait(timeout=60)


PING = r'''
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}) + "\n")
f.flush()
while True:
    m = json.loads(f.readline())
    if "method" not in m:
        print(json.dumps(m["result"]["pool"]))
        break
'''


def pool_ready(m):
    """Waits until the daemon's warm pool has its entry (asked as the
    daemon's own user: it answers only that uid)."""
    sock = str(m.home / "kernelmgr.sock")

    def ready():
        p = subprocess.run([*m.prefix, sbxutil.PY, "-c", PING, sock], capture_output=True,
                           text=True, timeout=60)
        return p.returncode == 0 and json.loads(p.stdout).get("ready") == 1
    wait_until(ready, timeout=60, what="the warm pool's entry")


def _ppid(pid):
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


# Through the environment's proxy (urllib reads HTTP_PROXY), or straight to
# the sandbox's own loopback (no proxy handler).
PY_GET = r'''
import urllib.request, urllib.error
def get(url, direct=False):
    op = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if direct else []))
    try:
        return op.open(url, timeout=30).read().decode().strip()
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read().decode()}"
'''


def direct_fetch(port, path):
    """PY_FETCH without the proxy (the list names 127.0.0.1, so no_proxy
    does not cover it): the sandbox's own loopback, straight."""
    return PY_GET + (
        "import time\nd = time.monotonic() + 30\n"
        "while True:\n"
        "    try:\n"
        f"        print('GOT', get('http://127.0.0.1:{port}/{path}', direct=True)); break\n"
        "    except OSError:\n"
        "        if time.monotonic() > d: raise\n"
        "        time.sleep(0.05)\n")


def test_an_allow_list_session_is_one_machine_with_one_proxy(allow_mgr, hello):
    m, port = allow_mgr, free_port()
    pool_ready(m)  # (the session may be the pool's entry: the same either way)
    m.ok("a", f"echo MARK-file > /tmp/shared.txt; mkdir -p /tmp/www; echo MARK-bash > /tmp/www/b; "
              f"(cd /tmp/www && exec python3 -m http.server {port} --bind 127.0.0.1 "
              f">/dev/null 2>&1 &)", "bash")
    # the session's one holder serves the list; no kernel runs a sandbox of its own
    ws = os.path.realpath(m.home / "sessions" / "a" / "workspace")
    sbx = [p for p in procs_with(ws) if "kernelmgr-sandbox" in
           Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    # (its monitor and the sandbox's init are its forks: same command line)
    holders = [p for p in sbx if _ppid(p) not in sbx]
    assert len(holders) == 1, sbx
    assert f"allow:127.0.0.1:{hello.port}" in Path(f"/proc/{holders[0]}/cmdline").read_text()
    # Python reaches Bash's server on the shared loopback, reads Bash's /tmp
    out = m.ok("a", direct_fetch(port, "b") + "print(open('/tmp/shared.txt').read())\n",
               "python")
    assert "GOT MARK-bash" in out and "MARK-file" in out, out
    out = m.ok("a", "ps -e -o pid=,args=", "bash")
    assert out.split()[0] == "1" and "driver.py" in out and f"http.server {port}" in out, out
    # the allowed host, through the one proxy, from both kernels
    before = hello.hits
    out = m.ok("a", PY_GET + f"print('PY', get('http://127.0.0.1:{hello.port}/'))", "python")
    assert "PY hello from the host" in out, out
    out = m.ok("a", f"echo SH $(curl -sS http://127.0.0.1:{hello.port}/)", "bash")
    assert "SH hello from the host" in out, out
    assert hello.hits == before + 2
    # another host: the named 403, from both; a cell failing on it gets the note
    out = m.ok("a", PY_GET + "print(get('http://example.com/'))", "python")
    assert out.startswith("403 kernelmgr: network policy allow-list: host example.com:80 is not "
                          f"allowed (allowed: 127.0.0.1:{hello.port})"), out
    r = m.one("a", "curl -sSf http://example.org/", "bash")
    assert r["exit_code"] != 0 and "403" in r["stderr"], r
    assert "example.org:80 is not allowed" in " ".join(r.get("limits_hit") or []), r
    # the refusals are logged once, by the holder, in the session's sandbox.log
    log = "".join(p.read_text(errors="replace") for p in m.home.rglob("sandbox.log"))
    assert "kernelmgr egress: refused GET http://example.com/" in log, log[-2000:]
    assert "still" in m.ok("a", "echo still", "bash")


# ---- a warm-pool session: its pre-started kernels share one sandbox ----

def test_a_warm_pool_session_is_one_machine(allow_mgr):
    m = allow_mgr
    pool_ready(m)
    port = free_port()
    m.ok("w", f"echo MARK-pool > /tmp/p.txt; mkdir -p /tmp/www; echo MARK-bash > /tmp/www/b; "
              f"(cd /tmp/www && exec python3 -m http.server {port} --bind 127.0.0.1 "
              f">/dev/null 2>&1 &)", "bash")
    out = m.ok("w", direct_fetch(port, "b") + "print(open('/tmp/p.txt').read())\n", "python")
    assert "GOT MARK-bash" in out and "MARK-pool" in out, out
    r = subprocess.run([*m.prefix, m.km, "sessions", "--json"], capture_output=True, text=True,
                       env=m.env, timeout=60)
    (s,) = [x for x in json.loads(r.stdout) if x["name"] == "w"]
    assert s["from_pool"] is True, s
    # a kernel started after the hand-out joins the same sandbox: it names
    # the package directory by the path the sandbox bound as a pool entry
    r = m.one("w", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "python")
    assert r["status"] != "ok", r
    out = m.ok("w", direct_fetch(port, "b") + "import sys\n"
                    "print([p for p in sys.path if p.endswith('/python')][:1])\n", "python")
    assert "GOT MARK-bash" in out and "/pool/" in out, out
