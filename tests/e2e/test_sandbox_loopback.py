"""Network off is an empty network namespace with only lo, and inside it the
sandbox's own loopback works: local servers, test suites that bind
127.0.0.1, debuggers that listen on it. Nothing else is reachable, there is
no resolver, and a cell that failed because of that gets the network note
in its result (limits_hit) while its stderr and traceback stay as they are.
Runs in strict sandboxed kernels as the invoker and, as root, as nobody;
the attack side (raw, packet, other families) is in test_sandbox_attacks.py."""
import platform

import pytest

import kutil
import sbxutil
from sbxutil import PY

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="the sandbox tests target x86_64")

NOTE = ("network is off for this session (network=off): only 127.0.0.1 and ::1 inside the "
        "sandbox are reachable")


@pytest.fixture(params=sbxutil.USERS)
def sbx(request):
    s = sbxutil.Sandboxes(request.param)
    yield s
    s.close()


def run(k, code, timeout=60):
    """Executes code; returns (reply, stdout, stderr, error or None)."""
    _, r = k.execute(code, timeout=timeout)
    errs = kutil.of_type(r["iopub"], "error")
    return (r["reply"], kutil.stream_text(r["iopub"], "stdout"),
            kutil.stream_text(r["iopub"], "stderr"), errs[0]["content"] if errs else None)


def notes(reply):
    return reply["metadata"].get("limits_hit", [])


HTTP_SERVER = r'''
import http.server, socket, threading, urllib.request
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from " + self.server.server_address[0].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
class V6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
def serve(cls, host):
    srv = cls((host, 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    url = "http://%s:%d/" % ("[%s]" % host if ":" in host else host, port)
    try:
        print(urllib.request.urlopen(url, timeout=10).read().decode())
    finally:
        srv.shutdown(); srv.server_close()
serve(http.server.ThreadingHTTPServer, "127.0.0.1")
if socket.has_ipv6 and any(a[4][0] == "::1" for a in socket.getaddrinfo("::1", 0)):
    serve(V6, "::1")
else:
    print("no IPv6 here")
'''


def test_python_http_server_on_loopback(sbx):
    k = sbx.kernel("python", ["--python", PY])
    reply, out, err, e = run(k, HTTP_SERVER)
    assert reply["content"]["status"] == "ok", (reply, out, err, e)
    assert "hello from 127.0.0.1" in out, (out, err)
    assert "hello from ::1" in out or "no IPv6 here" in out, (out, err)
    assert NOTE not in notes(reply)
    k.assert_alive()


def test_ipv6_loopback_is_up_where_the_kernel_has_ipv6(sbx):
    """lo has ::1 as well as 127.0.0.1 when the host's kernel has IPv6."""
    k = sbx.kernel("python", ["--python", PY])
    reply, out, err, e = run(k, "import os\nprint('V6', os.path.exists('/proc/net/if_inet6'))\n"
                                "print(open('/proc/net/if_inet6').read() "
                                "if os.path.exists('/proc/net/if_inet6') else '')\n")
    assert reply["content"]["status"] == "ok", (reply, err, e)
    if "V6 True" in out:
        assert "00000000000000000000000000000001" in out and " lo" in out, out
    k.assert_alive()


def test_bash_http_server_over_dev_tcp(sbx):
    """A background python3 -m http.server in a Bash cell, fetched with bash's
    own /dev/tcp (polled until it listens), then stopped."""
    k = sbx.kernel("bash")
    code = (
        "cd \"$(mktemp -d)\" && echo served-file > index.html\n"
        "python3 -m http.server --bind 127.0.0.1 8765 >/dev/null 2>&1 &\n"
        "srv=$!\n"
        "for i in $(seq 200); do\n"
        "  if exec 3<>/dev/tcp/127.0.0.1/8765; then break; fi 2>/dev/null\n"
        "  sleep 0.05\n"
        "done\n"
        "printf 'GET /index.html HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' >&3\n"
        "cat <&3\n"
        "exec 3<&-\n"
        "kill $srv; wait $srv 2>/dev/null\n"
        "echo done\n")
    reply, out, err, e = run(k, code, timeout=90)
    assert reply["content"]["status"] == "ok", (reply, out, err, e)
    assert "200 OK" in out and "served-file" in out, (out, err)
    k.assert_alive()


def test_only_lo_and_no_route_but_loopback(sbx):
    k = sbx.kernel("bash")
    reply, out, err, e = run(k, "ip -o link | cut -d: -f2; "
                                "echo ROUTES; ip -4 route; ip -6 route; echo END")
    assert reply["content"]["status"] == "ok", (reply, err)
    assert out.split("ROUTES")[0].split() == ["lo"], (out, err)
    routes = out.split("ROUTES")[1].split("END")[0]
    for line in routes.strip().splitlines():
        assert line.startswith("::1 ") or "dev lo" in line, out
    p = sbx.kernel("python", ["--python", PY])
    reply, out, err, e = run(p, "import socket\nprint(socket.if_nameindex())")
    assert out.strip() == "[(1, 'lo')]", (out, err)
    p.assert_alive()
    k.assert_alive()


def test_dns_fails_fast_and_localhost_resolves(sbx):
    k = sbx.kernel("python", ["--python", PY])
    code = ("import os, socket, time\n"
            "print('RESOLV', os.path.exists('/etc/resolv.conf') and "
            "open('/etc/resolv.conf').read().strip())\n"
            "print('LOCAL', sorted({a[4][0] for a in socket.getaddrinfo('localhost', 80)}))\n"
            "t = time.monotonic()\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80); print('RESOLVED')\n"
            "except socket.gaierror as e:\n"
            "    print('GAIERROR', round(time.monotonic() - t, 3), e)\n")
    reply, out, err, e = run(k, code)
    assert reply["content"]["status"] == "ok", (reply, err, e)
    assert "RESOLV False" in out or "RESOLV \n" in out, out
    assert "'127.0.0.1'" in out.split("LOCAL")[1].splitlines()[0], out
    assert "GAIERROR" in out and "RESOLVED" not in out, out
    took = float(out.split("GAIERROR ")[1].split()[0])
    assert took < 2.0, out
    k.assert_alive()


def test_outside_address_fails_with_the_note(sbx):
    """urllib to a public address: ENETUNREACH (no route but loopback); the
    traceback is the program's own, the result carries the note."""
    k = sbx.kernel("python", ["--python", PY])
    reply, out, err, e = run(k, "import urllib.request\n"
                                "urllib.request.urlopen('http://93.184.216.34/', timeout=10)\n")
    assert reply["content"]["status"] == "error", reply
    assert e["ename"] == "URLError" and "Network is unreachable" in e["evalue"], e
    assert NOTE in notes(reply), reply["metadata"]
    assert NOTE not in "".join(e["traceback"]) + err
    # A name lookup fails the same way, and says so.
    reply, out, err, e = run(k, "import urllib.request\n"
                                "urllib.request.urlopen('http://example.com/', timeout=10)\n")
    assert e and "name resolution" in e["evalue"], e
    assert NOTE in notes(reply), reply["metadata"]
    k.assert_alive()


def test_bash_network_failures_get_the_note(sbx):
    k = sbx.kernel("bash")
    reply, out, err, e = run(k, "curl -sS --max-time 10 http://example.com/")
    assert "Could not resolve host" in err, (out, err)
    assert NOTE in notes(reply), reply["metadata"]
    reply, out, err, e = run(k, "curl -sS --max-time 10 http://93.184.216.34/")
    assert reply["metadata"].get("exit_code") not in (0, None), reply
    assert NOTE in notes(reply), (reply["metadata"], err)
    reply, out, err, e = run(k, "wget -q -T 10 -O /dev/null http://93.184.216.34/")
    assert NOTE in notes(reply), (reply["metadata"], err)
    k.assert_alive()


def test_no_note_when_the_network_is_not_why(sbx):
    """Only failures of the policy get the note: not a refused local port,
    not another error, not a cell that succeeded after trying."""
    k = sbx.kernel("python", ["--python", PY])
    reply, _, _, e = run(k, "import socket\nsocket.create_connection(('127.0.0.1', 9))\n")
    assert e and e["ename"] == "ConnectionRefusedError", e
    assert NOTE not in notes(reply), reply["metadata"]
    reply, _, _, e = run(k, "raise ValueError('not the network')")
    assert NOTE not in notes(reply), reply["metadata"]
    reply, out, _, e = run(k, "import socket\ntry:\n"
                              "    socket.create_connection(('93.184.216.34', 80), timeout=5)\n"
                              "except OSError as x:\n    print('caught', x.errno)\n")
    assert reply["content"]["status"] == "ok" and "caught" in out, (reply, out)
    assert NOTE not in notes(reply), reply["metadata"]
    k.assert_alive()


def test_manager_result_carries_the_note():
    """Through the manager (the invoker's strict sandbox): the note reaches
    the code_exec result's limits_hit; the error is the program's own, and
    the session works afterwards with its state."""
    import mgrutil
    if mgrutil.SANDBOX != "strict":
        pytest.skip("the network note is the strict sandbox's")
    m = mgrutil.Mgr()
    try:
        rc, res, p = m.exec("net", "x = 7")
        assert rc == 0, p.stderr
        rc, res, p = m.exec("net", "import urllib.request\n"
                                   "urllib.request.urlopen('http://93.184.216.34/', timeout=10)\n")
        assert res, p.stdout + p.stderr
        r = res[-1]
        assert r["limits_hit"] == [NOTE], r
        assert "Network is unreachable" in r["error"]["value"], r
        rc, res, p = m.exec("net", "print(x)")
        assert rc == 0 and res[-1]["stdout"] == "7\n", res
        assert "limits_hit" not in res[-1], res
    finally:
        m.close()


def test_mcp_text_carries_the_note():
    """The model-facing text of an MCP code_exec names the note too."""
    import json
    import select
    import subprocess
    import mgrutil
    if mgrutil.SANDBOX != "strict":
        pytest.skip("the network note is the strict sandbox's")
    m = mgrutil.Mgr()
    p = subprocess.Popen([mgrutil.KM, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=m.env)

    def ask(id_, method, params, timeout=120):
        p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method,
                                  "params": params}).encode() + b"\n")
        p.stdin.flush()
        r, _, _ = select.select([p.stdout], [], [], timeout)
        assert r, "no answer from kernelmgr mcp"
        return json.loads(p.stdout.readline())

    try:
        ask(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "t", "version": "0"}})
        p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        code = ("```bash\ncurl -sS --max-time 10 http://example.com/\n```\n"
                "```python\nprint('still here')\n```\n")
        ans = ask(2, "tools/call", {"name": "code_exec",
                                    "arguments": {"code": code, "session": "mcpnet"}})
        res = ans["result"]
        text = "\n".join(c["text"] for c in res["content"] if c["type"] == "text")
        assert "Could not resolve host" in text and "note: " + NOTE in text, text
        assert text.count(NOTE) == 1, text  # only the block that failed
    finally:
        p.stdin.close()
        p.wait(30)
        p.stdout.close()
        p.stderr.close()
        m.close()
