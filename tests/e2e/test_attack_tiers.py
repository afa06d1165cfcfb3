"""Every party gets exactly its trust (docs/SECURITY.md "Tiers and
ceilings"): the model behind MCP and a remote HTTP client ask the daemon for
what their tier may not have — resources above the operator's
configuration, host paths (an allowlist file, an interpreter, a workspace),
fields never heard of, more trust — and are refused by name; the host is
untouched; the session and the service still answer; the socket's owner
still gets all of it.

MCP through the real SDK client (tests/node/mcp_client.mjs), HTTP through
the real gateway (POST /api/kernelmgr and the WebSocket), the owner through
the daemon's socket. The tier check itself runs as root and as nobody (the
daemon and its client under setpriv). No fixed sleeps."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import apiutil  # noqa: E402
import kutil  # noqa: E402
import mgrutil  # noqa: E402
import sbxutil  # noqa: E402
from kutil import poll_until  # noqa: E402
from test_mcp import call, ok_result, sdk, text_of  # noqa: E402

import websocket  # noqa: E402  (Debian python3-websocket, in make deps)

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"), reason="no kernel-python")

# the operator's ceilings in every test here
CEILINGS = {"memory": "256M", "cpus": 1, "cpu_time": 30}


def sock_call(home, method, params=None, tier=None, **init):
    """One request on a fresh connection to the daemon of home, after an
    initialize that lowers it to tier when given; the response."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(120)
    s.connect(str(Path(home) / "kernelmgr.sock"))
    f = s.makefile("rw")
    try:
        def one(m, p):
            f.write(apiutil.line(m, p))
            f.flush()
            for line in f:
                msg = json.loads(line)
                if apiutil.is_response(msg):
                    return msg
            raise AssertionError("the daemon closed the connection")
        if tier:
            r = one("initialize", {"tier": tier, **init})
            assert "result" in r, r
        return one(method, params or {})
    finally:
        f.close()
        s.close()


def session_names(home):
    r = sock_call(home, "sessions.list")
    return {x["name"] for x in r["result"]["sessions"]}


def saved_options(home, session):
    return json.loads((Path(home) / "sessions" / session / "session.json").read_text())["options"]


def refused(resp, *words):
    assert "error" in resp, resp
    msg = resp["error"]["message"]
    assert resp["error"]["code"] == -32602, resp
    for w in words:
        assert w in msg, (w, msg)
    return msg


# ---------------------------------------------------------------- MCP


@pytest.fixture
def mcp_mgr(make_mgr):
    return make_mgr(dict(CEILINGS))


@pytest.mark.parametrize("field,too_much,allowed", [
    ("memory", "64G", "128M"),
    ("cpus", 8, 0.5),
    ("cpu_time", 100000, 10),
])
def test_mcp_cannot_raise_a_ceiling(mcp_mgr, field, too_much, allowed):
    """The model asks code_exec for more than the operator configured: refused
    naming the field, its value and the limit; the session is not created
    with it; the same session works with an allowed value."""
    out = sdk(mcp_mgr, [
        call("code_exec", {"code": "print('pwned')", "language": "python", "session": "m",
                           field: too_much}),
        call("code_exec", {"code": "print(6 * 7)", "language": "python", "session": "m",
                           field: allowed}),
    ])
    r = ok_result(out["steps"][0])
    t = text_of(r)
    assert r["isError"] is True and f'field "{field}"' in t and "exceeds the operator's limit" \
        in t and "pwned" not in t, t
    r = ok_result(out["steps"][1])
    assert r["isError"] is False and "42" in text_of(r), text_of(r)
    # created once, with the allowed value, never the refused one
    opts = saved_options(mcp_mgr.home, "m")
    want = (128 << 20) if field == "memory" else allowed
    assert opts[field] == want, opts


def test_mcp_cannot_name_a_host_path(mcp_mgr):
    """python and workspace are not offered to the model (unknown argument),
    an allowlist neither; the daemon refuses them from an mcp connection
    even when the MCP server's operator opted into the relaxing options."""
    out = sdk(mcp_mgr, [
        call("code_exec", {"code": "1", "session": "p", "python": "/usr/bin/python3"}),
        call("code_exec", {"code": "1", "session": "p", "workspace": "/etc"}),
        call("install_packages", {"session": "p", "manager": "pip", "packages": ["x"],
                                  "allowlist": "/etc/shadow"}),
        call("code_exec", {"code": "print('still here')", "language": "python",
                           "session": "p"}),
    ], server_args=["--allow-unsafe-session-options"])
    for i in range(3):
        r = ok_result(out["steps"][i])
        assert r["isError"] is True and "unknown argument" in text_of(r), text_of(r)
        assert "root:" not in text_of(r)
    r = ok_result(out["steps"][3])
    assert r["isError"] is False and "still here" in text_of(r), text_of(r)
    assert saved_options(mcp_mgr.home, "p").get("python") in (None, ""), \
        saved_options(mcp_mgr.home, "p")
    # at the daemon: an mcp connection, opted in, still never names one
    for params, field in ((({"session": "q", "python": "/usr/bin/python3"}), "python"),
                          (({"session": "q", "workspace": "/etc"}), "workspace")):
        refused(sock_call(mcp_mgr.home, "session.create", params, tier="mcp",
                          allow_unsafe_session_options=True),
                f'field "{field}" is not available to MCP clients')
    refused(sock_call(mcp_mgr.home, "packages.install",
                      {"session": "q", "manager": "pip", "packages": ["x"],
                       "allowlist": "/etc/shadow"}, tier="mcp"),
            'field "allowlist" is not available to MCP clients')
    assert "q" not in session_names(mcp_mgr.home)


def test_mcp_operator_allowlist_reaches_the_daemon(mcp_mgr, tmp_path):
    """The MCP server's own --allowlist (the operator's) is fixed on its
    connection at initialize: the install reads that file, not one the
    model could name."""
    al = tmp_path / "operator-allowlist.json"
    al.write_text(json.dumps({"pip": {"index_url": "https://pypi.org/simple/",
                                      "packages": {"only-this-one": ""}}}))
    out = sdk(mcp_mgr, [call("install_packages", {"session": "i", "manager": "pip",
                                                  "packages": ["not-listed"]})],
              server_args=["--allowlist", str(al)])
    r = ok_result(out["steps"][0])
    t = text_of(r)
    assert r["isError"] is True and "not-listed" in t and "allowlist" in t, t


# ---------------------------------------------------------------- HTTP


class Gw:
    """A daemon serving the gateway, with the operator's ceilings."""

    def __init__(self, make_mgr, **cfg):
        self.m = make_mgr({"http": "127.0.0.1:0", "output_cap": "1K", **CEILINGS, **cfg})
        rc, res, p = self.m.exec("agent", "x = 41")
        assert rc == 0, p.stderr
        info = poll_until(self._info, lambda v: v is not None, 30, "http.json written")
        self.url = info["url"].rstrip("/")
        self.token = (self.m.home / "http-token").read_text().strip()

    def _info(self):
        try:
            return json.loads((self.m.home / "http.json").read_text())
        except (OSError, ValueError):
            return None

    def rpc(self, method, params=None):
        body = json.dumps(apiutil.request(method, params)).encode()
        r = urllib.request.Request(self.url + "/api/kernelmgr", data=body, method="POST",
                                   headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(r, timeout=120) as resp:
            assert resp.status == 200
            return json.loads(resp.read())

    def still_works(self):
        r = self.rpc("exec", {"session": "agent", "code": "print(x + 1)"})
        assert r["result"]["results"][0]["stdout"] == "42\n", r


@pytest.fixture
def gw(make_mgr):
    return Gw(make_mgr)


def test_http_cannot_name_an_allowlist(gw, tmp_path):
    """packages.install with a host path as the allowlist: /etc/shadow, or a
    list the client wrote into its own workspace to get around the
    operator's policy. Refused by name before anything opens it."""
    home = gw.m.home
    ws = sock_call(home, "session.create", {"session": "agent"})["result"]["workspace"]
    r = gw.rpc("files.write", {"session": "agent", "path": "mine.json", "content": json.dumps(
        {"pip": {"index_url": "http://127.0.0.1:1/simple/", "packages": {"evil": ""}}})})
    assert "result" in r, r
    for path in ("/etc/shadow", str(Path(ws) / "mine.json")):
        r = gw.rpc("packages.install", {"session": "agent", "manager": "pip",
                                        "packages": ["evil"], "allowlist": path})
        msg = refused(r, 'field "allowlist" is not available to HTTP clients')
        assert "root" not in msg and "expected near" not in msg, msg
    # nothing was installed for the session
    assert not (home / "packages" / "agent" / "python" / "evil").exists()
    gw.still_works()


@pytest.mark.parametrize("params,words", [
    ({"memory": "64G"}, ['field "memory": 64G exceeds the operator\'s limit 256M']),
    ({"memory": 1 << 40}, ['field "memory"', "exceeds the operator's limit 256M"]),
    ({"cpus": 64}, ['field "cpus": 64 exceeds the operator\'s limit 1']),
    ({"cpu_time": 1e6}, ['field "cpu_time"', "exceeds the operator's limit 30"]),
    ({"python": "/usr/bin/python3"}, ['field "python" is not available to HTTP clients']),
    ({"workspace": "/etc"}, ['field "workspace" is not available to HTTP clients']),
    ({"sandbox": "none"}, ['field "sandbox": "none" is not available to HTTP clients']),
    ({"network": "on"}, ['field "network": "on" is not available to HTTP clients']),
    ({"frobnicate": 1}, ['unknown field "frobnicate"']),
])
def test_http_session_options_stay_under_the_ceiling(gw, params, words):
    """Over HTTP, on every method that takes session options: refused by
    name (and value), no session made, the service answers."""
    if params.get("sandbox") == "none" and mgrutil.SANDBOX == "none":
        pytest.skip("the operator's configuration here is sandbox none: not a relaxation")
    for method, base in (("exec", {"session": "h1", "code": "print('pwned')"}),
                         ("session.create", {"session": "h2"}),
                         ("files.write", {"session": "h3", "path": "a", "content": "x",
                                          "create": True}),
                         ("session.import", {"session": "h4", "data": "", "offset": 0,
                                             "final": True})):
        msg = refused(gw.rpc(method, {**base, **params}), *words)
        assert "pwned" not in msg
    assert not {"h1", "h2", "h3", "h4"} & session_names(gw.m.home)
    # the same request within the ceiling works
    r = gw.rpc("exec", {"session": "h1", "code": "print(6 * 7)", "memory": "128M",
                        "cpus": 0.5, "cpu_time": 10})
    assert r["result"]["results"][0]["stdout"] == "42\n", r
    assert saved_options(gw.m.home, "h1")["memory"] == 128 << 20
    gw.still_works()


def test_http_cannot_raise_its_tier_or_reach_owner_methods(gw):
    msg = refused(gw.rpc("initialize", {"tier": "owner"}), "may only lower its tier")
    assert "http" in msg
    refused(gw.rpc("initialize", {"allowlist": "/etc/shadow"}),
            'field "allowlist" is not available to HTTP clients')
    refused(gw.rpc("initialize", {"allow_unsafe_session_options": True}),
            'field "allow_unsafe_session_options" is not available to HTTP clients')
    refused(gw.rpc("shutdown"), "shutdown is not available to HTTP clients")
    refused(gw.rpc("connection_file", {"session": "agent"}), "not available to HTTP clients")
    refused(gw.rpc("http.start", {"listen": "0.0.0.0:0"}),
            "http.start is not available to HTTP clients")
    assert sock_call(gw.m.home, "ping")["result"]["pid"] == gw.m.daemon_pid()
    gw.still_works()


def test_http_replies_carry_no_host_path(gw):
    """ping/initialize, session.create, exec (and its spill file),
    sessions.list, files.list: no home, no workspace, no connection file."""
    home = str(gw.m.home)
    replies = [gw.rpc("ping"), gw.rpc("initialize", {"tier": "http"}),
               gw.rpc("session.create", {"session": "agent"}),
               gw.rpc("exec", {"session": "agent", "code": "print('y' * 5000)"}),
               gw.rpc("sessions.list"), gw.rpc("files.list", {"session": "agent"}),
               gw.rpc("close", {"session": "nosuch"})]
    for r in replies:
        assert home not in json.dumps(r), r
        assert '"workspace"' not in json.dumps(r) and "connection_file" not in json.dumps(r), r
    assert replies[0]["result"]["tier"] == "http" and "home" not in replies[0]["result"]
    trunc = replies[3]["result"]["results"][0]["truncated"]["stdout"]
    assert trunc["spill"] and "/" not in trunc["spill"], trunc
    # the owner still sees them
    own = sock_call(home, "ping")["result"]
    assert own["home"] == home and own["tier"] == "owner"
    assert sock_call(home, "sessions.list")["result"]["sessions"][0]["workspace"]
    gw.still_works()


def test_http_websocket_is_the_http_tier_too(gw):
    """The streaming connection (gwapi_conn) declares http like the one-shot
    one: a ceiling is refused there, and a streamed exec within it works."""
    ws = websocket.create_connection(gw.url.replace("http", "ws", 1) + "/api/kernelmgr/ws",
                                     header=[f"Authorization: token {gw.token}"], timeout=60)
    try:
        ws.send(json.dumps(apiutil.request("exec", {"session": "w", "code": "1",
                                                    "memory": "64G"}, id=1)))
        r = json.loads(ws.recv())
        refused(r, 'field "memory": 64G exceeds the operator\'s limit 256M')
        ws.send(json.dumps(apiutil.request("exec", {"session": "w", "stream": True,
                                                    "code": "print(7 * 6)"}, id=2)))
        while True:
            m = json.loads(ws.recv())
            if m.get("id") == 2:
                break
            assert str(gw.m.home) not in json.dumps(m), m
        assert m["result"]["results"][0]["stdout"] == "42\n", m
        assert "workspace" not in m["result"], m
    finally:
        ws.close()
    gw.still_works()


def test_http_opt_in_still_relaxes_as_documented(make_mgr):
    """http_allow_unsafe_session_options keeps allowing what it always did
    (sandbox none, a python, a workspace), not more: the resource ceilings
    stay."""
    g = Gw(make_mgr, http_allow_unsafe_session_options=True)
    wsdir = tempfile.mkdtemp(prefix="kmtw", dir="/tmp")
    try:
        r = g.rpc("session.create", {"session": "u", "python": "/usr/bin/python3",
                                     "workspace": wsdir})
        assert "result" in r and r["result"]["created"], r
        refused(g.rpc("session.create", {"session": "u2", "memory": "64G"}),
                "exceeds the operator's limit 256M")
    finally:
        g.rpc("close", {"session": "u", "keep": True})
        shutil.rmtree(wsdir, ignore_errors=True)
    g.still_works()


# ---------------------------------------------------------------- owner


def test_owner_keeps_everything(gw, tmp_path):
    """Through the socket, undeclared (the owner): the same requests work —
    memory above the configuration, a python, an allowlist of its own."""
    home = gw.m.home
    r = sock_call(home, "session.create", {"session": "big", "memory": "64G", "cpus": 8,
                                           "cpu_time": 100000, "python": "/usr/bin/python3"})
    assert "result" in r, r
    opts = saved_options(home, "big")
    assert opts["memory"] == 64 << 30 and opts["cpus"] == 8, opts
    al = tmp_path / "owner-allowlist.json"
    al.write_text(json.dumps({"pip": {"index_url": "https://pypi.org/simple/",
                                      "packages": {"only-this-one": ""}}}))
    r = sock_call(home, "packages.install", {"session": "big", "manager": "pip",
                                             "packages": ["not-listed"], "allowlist": str(al)})
    assert r["error"]["code"] == -32002 and "not-listed" in r["error"]["message"], r
    assert sock_call(home, "connection_file", {"session": "agent"})["result"]["connection_file"]
    gw.still_works()


# ---------------------------------------------------------------- as nobody

CLIENT = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(120); s.connect(sys.argv[1])
f = s.makefile("rw")
out = []
for line in sys.stdin:
    f.write(line); f.flush()
    for got in f:
        m = json.loads(got)
        if "method" not in m:
            out.append(m); break
print(json.dumps(out))
"""


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_tier_check_as_each_user(user):
    """The daemon and its client as root and as nobody: a connection lowered
    to http is refused the ceiling and the host path, and works within."""
    if user == "nobody" and not sbxutil.IS_ROOT:
        pytest.skip("the nobody variant needs root to switch users")
    home = Path(tempfile.mkdtemp(prefix="kmtt", dir="/tmp"))
    km, prefix = kutil.binary("kernelmgr"), []
    env = dict(os.environ, KERNELMGR_HOME=str(home))
    (home / "config.json").write_text(json.dumps({**CEILINGS, "sandbox": mgrutil.SANDBOX,
                                                  "python": "/usr/bin/python3"}))
    if user == "nobody":
        km = sbxutil.nobody_binary("kernelmgr")
        prefix = sbxutil.SETPRIV
        env["HOME"] = str(home)
        env["PATH"] = "/usr/bin:/bin"
        os.chmod(home, 0o700)
        for root, dirs, files in os.walk(home):
            for n in dirs + files + [""]:
                os.chown(os.path.join(root, n), sbxutil.NOBODY, sbxutil.NOBODY)
    try:
        p = subprocess.run([*prefix, km, "exec", "--session", "s", "-c", "print(1)", "--json"],
                           capture_output=True, text=True, env=env, timeout=180)
        assert p.returncode == 0, p.stderr
        lines = [apiutil.line("initialize", {"tier": "http"}),
                 apiutil.line("exec", {"session": "n", "code": "1", "memory": "64G"}),
                 apiutil.line("packages.install", {"session": "n", "manager": "pip",
                                                   "packages": ["x"],
                                                   "allowlist": "/etc/shadow"}),
                 apiutil.line("exec", {"session": "n", "code": "print(6 * 7)",
                                       "memory": "200M"})]
        c = subprocess.run([*prefix, "/usr/bin/python3", "-c", CLIENT,
                            str(home / "kernelmgr.sock")], input="".join(lines),
                           capture_output=True, text=True, env=env, timeout=180)
        assert c.returncode == 0, c.stderr
        init, mem, allow, ok = json.loads(c.stdout)
        assert init["result"]["tier"] == "http", init
        refused(mem, "exceeds the operator's limit 256M")
        msg = refused(allow, 'field "allowlist" is not available to HTTP clients')
        assert "root" not in msg
        assert ok["result"]["results"][0]["stdout"] == "42\n", ok
    finally:
        subprocess.run([*prefix, km, "serve", "--stop"], env=env, capture_output=True,
                       timeout=60)
        shutil.rmtree(home, ignore_errors=True)
