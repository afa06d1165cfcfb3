"""`kernelmgr serve --http` on a home whose daemon already runs.

The usual order: an agent's `kernelmgr exec` starts the daemon, later a
person wants to open the agent's session in Jupyter and runs `serve
--http`. The running daemon then starts serving HTTP itself (the API's
http.start), with the agent's sessions and kernels as they are; a daemon
that cannot (the plain binary, kernelmgr-gateway missing) makes `serve
--http` fail naming how to restart — never an exit 0 without serving.
No fixed sleeps."""
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apiutil  # noqa: E402
import kutil  # noqa: E402
import mgrutil  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="no kernel-python")


def http(url, token, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    r = urllib.request.Request(url.rstrip("/") + path, data=data,
                               headers={"Authorization": f"token {token}"},
                               method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(r, timeout=120) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def api_call(home, method, params):
    """One request on the daemon's socket: its response."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    s.connect(str(Path(home) / "kernelmgr.sock"))
    f = s.makefile("rw")
    try:
        f.write(apiutil.line(method, params))
        f.flush()
        return json.loads(f.readline())
    finally:
        f.close()
        s.close()


def agent_session(mgr):
    rc, res, p = mgr.exec("agent", "x = 41", "--lang", "python")
    assert rc == 0, p.stderr
    pid = mgr.daemon_pid()
    assert pid
    return pid


def agent_works(mgr):
    rc, res, p = mgr.exec("agent", "print(x + 1)", "--lang", "python")
    assert rc == 0 and res[-1]["stdout"] == "42\n", (p.stderr, res)


def test_serve_http_on_a_running_daemon_serves_its_sessions(make_mgr):
    mgr = make_mgr()
    pid = agent_session(mgr)
    # the daemon an exec started can serve HTTP later: it is kernelmgr-gateway
    assert os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "kernelmgr-gateway"
    assert not (mgr.home / "http.json").exists()
    p = mgr.run("serve", "--http", "127.0.0.1:0", timeout=60)
    assert p.returncode == 0, p.stderr
    info = json.loads((mgr.home / "http.json").read_text())
    assert info["pid"] == pid, info  # the same daemon, not a new one
    assert f"(pid {pid}) now serves the Jupyter gateway at {info['url']}" in p.stderr, p.stderr
    token = (mgr.home / "http-token").read_text().strip()
    st, specs = http(info["url"], token, "/api/kernelspecs")
    assert st == 200 and "kernelmgr-python--agent" in specs["kernelspecs"], (st, specs)
    st, kernels = http(info["url"], token, "/api/kernels")
    assert st == 200 and any(k["kernelmgr"]["session"] == "agent" for k in kernels), kernels
    # the agent's live state, through HTTP and through the CLI
    st, rep = http(info["url"], token, "/api/kernelmgr",
                   apiutil.request("exec", {"session": "agent", "code": "print(x + 1)",
                                            "lang": "python"}))
    assert st == 200 and rep["result"]["results"][0]["stdout"] == "42\n", (st, rep)
    agent_works(mgr)
    # asked again for what it serves: says so, exit 0; elsewhere: refused
    p = mgr.run("serve", "--http", f"127.0.0.1:{info['port']}", timeout=60)
    assert p.returncode == 0 and f"already serves the Jupyter gateway at {info['url']}" in \
        p.stderr, p.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        other = s.getsockname()[1]
    p = mgr.run("serve", "--http", f"127.0.0.1:{other}", timeout=60)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert f"already serves HTTP at {info['url']}" in p.stderr and "serve --stop" in p.stderr
    assert mgr.daemon_pid() == pid
    agent_works(mgr)


def test_http_start_validates_its_params(make_mgr):
    mgr = make_mgr()
    agent_session(mgr)
    for params, want in (({}, 'missing field "listen"'),
                         ({"listen": 8889, "x": 1}, "listen"),
                         ({"listen": "127.0.0.1:0", "tls_cert": "c.pem", "tls_key": "k.pem"},
                          "must be absolute paths"),
                         ({"listen": "127.0.0.1:0", "tls_cert": "/nonexistent/c.pem"},
                          "TLS needs both")):
        r = api_call(mgr.home, "http.start", params)
        assert "error" in r and want in r["error"]["message"], (params, r)
    r = api_call(mgr.home, "http.start", {"listen": "0.0.0.0:0"})
    assert "error" in r and "insecure" in r["error"]["message"].lower(), r
    assert not (mgr.home / "http.json").exists()
    r = api_call(mgr.home, "http.start", {"listen": "127.0.0.1:0"})
    assert r["result"]["started"] is True and r["result"]["url"].startswith("http://127.0.0.1:")
    r2 = api_call(mgr.home, "http.start", {"listen": "127.0.0.1:0"})
    assert r2["result"]["started"] is False and r2["result"]["url"] == r["result"]["url"]
    agent_works(mgr)


def test_serve_http_on_a_gateway_less_daemon_fails_naming_the_fix(make_mgr, tmp_path):
    """A daemon of a kernelmgr copied without kernelmgr-gateway beside it
    cannot serve HTTP: `serve --http` exits non-zero saying how, and the
    agent's session is untouched."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy2(mgrutil.KM, bindir / "kernelmgr")
    mgr = make_mgr()
    env = dict(mgr.env, KERNELMGR_KERNEL_DIR=str(kutil.BUILD))

    def run(km, *args):
        return subprocess.run([km, *args], capture_output=True, text=True, env=env, timeout=120)

    p = run(str(bindir / "kernelmgr"), "exec", "--session", "agent", "--lang", "python",
            "-c", "x = 41")
    assert p.returncode == 0, p.stderr
    pid = mgr.daemon_pid()
    assert os.readlink(f"/proc/{pid}/exe") == str(bindir / "kernelmgr")
    assert "this daemon cannot serve HTTP later" in (mgr.home / "daemon.log").read_text()
    # through a kernelmgr that has its gateway: the daemon itself cannot
    p = run(mgrutil.KM, "serve", "--http", "127.0.0.1:0")
    assert p.returncode != 0, p.stderr
    assert f"this daemon (pid {pid}) cannot serve HTTP" in p.stderr, p.stderr
    assert "kernelmgr serve --stop" in p.stderr and "kernelmgr serve --http 127.0.0.1:0" in \
        p.stderr, p.stderr
    # through the copy: it cannot even try
    p = run(str(bindir / "kernelmgr"), "serve", "--http", "127.0.0.1:0")
    assert p.returncode != 0 and f"serving HTTP needs {bindir}/kernelmgr-gateway" in p.stderr, \
        p.stderr
    assert not (mgr.home / "http.json").exists()
    assert mgr.daemon_pid() == pid
    p = run(str(bindir / "kernelmgr"), "exec", "--session", "agent", "--lang", "python",
            "-c", "print(x + 1)")
    assert p.returncode == 0 and p.stdout == "42\n", (p.stdout, p.stderr)
