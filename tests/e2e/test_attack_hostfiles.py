"""Host files the manager opens for a client, through the real manager
(build/kernelmgr, its daemon, real kernels, real pip in the install sandbox),
as the invoking user and as nobody where the attack applies.

`kernelmgr install --allowlist PATH` makes the daemon (often root) open a
path the client chose. Sandboxed code plants what it names in its
workspace: a FIFO (a blocking open would hang every daemon worker, and with
them every session's exec and `serve --stop`) or a symbolic link to
/etc/shadow; the client names host files it cannot read itself. The attack
failed when each is refused at once, no byte of the file appears in any
output, the planted file is as it was, and the daemon still serves other
sessions and stops when asked.

The install proxy reaches only what the operator's allowlist names: a
redirect to an unlisted loopback server is refused, and so is a listed name
that resolves only to this host's own addresses; the servers behind them
hear nothing. All waits poll with a deadline."""
import concurrent.futures
import http.server
import json
import os
import socket
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
from sbxutil import IS_ROOT, USERS, host_addresses  # noqa: E402
from test_attack_workspace_races import RaceMgr  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"),
                                reason="build/kernel-python not built")

# more concurrent requests than the daemon has workers (32 long ones)
FLOOD = 40


@pytest.fixture(params=USERS)
def hm(request):
    if request.param == "nobody" and not IS_ROOT:
        pytest.skip("the nobody variant needs root to switch users")
    m = RaceMgr(request.param)
    yield m
    m.close()


def cell(m, session, code):
    rc, res, p = m.exec(session, code, "--lang", "python")
    assert rc == 0 and res, (p.stdout, p.stderr)
    return res[0]


def workspace_of(m, session):
    p = m.run("files", session, "--json")
    assert p.returncode == 0, p.stderr
    return Path(json.loads(p.stdout)["workspace"])


def install(m, allowlist, session="victim", pkg="tinypkg", timeout=60):
    return m.run("install", "--session", session, "--allowlist", str(allowlist), pkg,
                 timeout=timeout)


def assert_serves(m, session="other"):
    """Another session runs code: no daemon worker is stuck."""
    r = cell(m, session, "print(6 * 7)")
    assert r["status"] == "ok" and r["stdout"] == "42\n", r


def assert_stops(m):
    pid = m.daemon_pid()
    assert pid
    p = m.run("serve", "--stop", timeout=30)
    assert p.returncode == 0, p.stderr
    kutil.poll_until(lambda: kutil.alive(pid), lambda a: not a, deadline=30,
                     msg="the daemon's exit")


# ------------------------------------------------------------------ a FIFO


def test_fifo_in_the_workspace_is_refused_at_once(hm):
    r = cell(hm, "attacker", "import os\nos.mkfifo('allow.json')\nprint('PLANTED')")
    assert "PLANTED" in r["stdout"], r
    fifo = workspace_of(hm, "attacker") / "allow.json"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)

    # one request, then more at once than the daemon has workers: each
    # answers (a blocked open() would never return; the timeout would fire)
    t0 = time.monotonic()
    p = install(hm, fifo, timeout=30)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "is not a regular file" in p.stderr and "nothing is installable" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 20
    with concurrent.futures.ThreadPoolExecutor(FLOOD) as ex:
        outs = list(ex.map(lambda i: install(hm, fifo, session=f"v{i}", timeout=60),
                           range(FLOOD)))
    for p in outs:
        assert p.returncode == 2 and "is not a regular file" in p.stderr, p.stderr

    # the host is untouched, the daemon serves other sessions and stops
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert_serves(hm)
    assert_serves(hm, "attacker")
    assert_stops(hm)


# ------------------------------------------------------------------ secrets


def shadow_fields():
    """What of /etc/shadow would show it leaked: "root:" and, where the test
    can read the file, every password hash in it."""
    fields = ["root:"]
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            parts = line.split(":")
            fields += [parts[1]] if len(parts) > 1 and len(parts[1]) >= 8 else []
    except OSError:
        pass
    return fields


def assert_no_leak(p, forbidden):
    for text in (p.stdout, p.stderr):
        for f in forbidden:
            assert f not in text, f"{f!r} leaked: {text!r}"


@pytest.mark.skipif(not os.path.exists("/etc/shadow"), reason="no /etc/shadow")
def test_symlink_to_shadow_and_host_secrets_are_never_quoted(hm):
    r = cell(hm, "attacker", "import os\nos.symlink('/etc/shadow', 'allow.json')\n"
                             "print('PLANTED')")
    assert "PLANTED" in r["stdout"], r
    link = workspace_of(hm, "attacker") / "allow.json"
    forbidden = shadow_fields()
    before = os.stat("/etc/shadow")

    # the link the sandbox made: refused, not followed
    p = install(hm, link)
    assert p.returncode == 2 and "is a symbolic link" in p.stderr, p.stderr
    assert_no_leak(p, forbidden)
    assert os.readlink(link) == "/etc/shadow"

    # the file itself: a root daemon reads it and says only where it is not
    # JSON; nobody's cannot read it
    p = install(hm, "/etc/shadow")
    assert p.returncode == 2, p.stderr
    assert ("not valid JSON at line 1, column" in p.stderr if hm.uid == 0
            else "Permission denied" in p.stderr), p.stderr
    assert_no_leak(p, forbidden)

    # a host-only JSON file (0600 in a 0700 directory of the daemon's
    # user): its keys, names and URL never reach the client
    token = os.urandom(6).hex()
    d = Path(tempfile.mkdtemp(prefix="km-hostfiles-", dir="/tmp"))
    try:
        secret = d / "secret.json"
        secret.write_text(json.dumps({f"SECRETKEY-{token}": {"index_url": f"http://x/{token}"}}))
        pipfile = d / "pip.json"
        pipfile.write_text(json.dumps({"pip": {"index_url": f"http://u:{token}@x/",
                                               "packages": [f"SECRET {token}"]}}))
        for f in (secret, pipfile, d):
            os.chown(f, hm.uid, hm.uid)
            os.chmod(f, 0o700 if f == d else 0o600)
        for f, why in ((secret, "key 1 of the top-level object is unknown"),
                       (pipfile, "pip.index_url: credentials in the URL are not supported")):
            p = install(hm, f)
            assert p.returncode == 2 and why in p.stderr, p.stderr
            assert_no_leak(p, [token, "SECRET"])
    finally:
        for f in d.iterdir():
            f.unlink()
        d.rmdir()

    after = os.stat("/etc/shadow")
    assert (after.st_mode, after.st_size, after.st_mtime_ns) == \
        (before.st_mode, before.st_size, before.st_mtime_ns)
    assert_serves(hm)
    assert_stops(hm)


# ------------------------------------------------------------------ the proxy


class Recorder:
    """An HTTP server recording every request; GETs are redirected to
    redirect_to (a base URL) when set, else answered 404."""

    def __init__(self, host="127.0.0.1", redirect_to=None):
        self.requests = []
        rec = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                rec.requests.append(self.path)
                if rec.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", rec.redirect_to + self.path)
                else:
                    self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, fmt, *args):
                pass

        self.redirect_to = redirect_to
        self.srv = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.port = self.srv.server_address[1]
        self.th = threading.Thread(target=self.srv.serve_forever, daemon=True)
        self.th.start()

    def close(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def mgr():
    m = mgrutil.Mgr()
    yield m
    m.close()


def pip_allowlist(m, index_url):
    path = m.home / "allowlist.json"
    path.write_text(json.dumps({"pip": {"index_url": index_url, "packages": ["tinypkg"]}}))
    return path


def installs_disabled(p):
    return "installs are disabled in this build" in p.stderr


def test_redirect_to_unlisted_loopback_is_refused(mgr):
    far = Recorder()
    index = Recorder(redirect_to=f"http://127.0.0.1:{far.port}")
    try:
        al = pip_allowlist(mgr, f"http://127.0.0.1:{index.port}/simple/")
        p = install(mgr, al, timeout=300)
        if installs_disabled(p):
            pytest.skip("installs are disabled in this build")
        assert p.returncode != 0, p.stdout
        # pip asked the listed index, followed its redirect through the
        # proxy, and the proxy refused the unlisted loopback server
        assert index.requests, p.stderr
        assert f"the install proxy refused: http://127.0.0.1:{far.port}/" in p.stderr, p.stderr
        assert far.requests == []
        assert "nothing was installed" in p.stderr
        assert not any((mgr.home / "packages" / "victim" / "python").iterdir())
    finally:
        index.close()
        far.close()
    assert_serves(mgr)


def host_only_name():
    """This host's own name when it resolves, and only to addresses of this
    host (as a rebinding DNS answer would); else None."""
    name = socket.gethostname()
    if not name or any(not (c.isalnum() or c in "-.") for c in name):
        return None
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
    except OSError:
        return None
    own = set(host_addresses())
    return name if addrs and all(a.startswith("127.") or a == "::1" or a in own
                                 for a in addrs) else None


def test_listed_name_resolving_to_this_host_is_refused(mgr):
    name = host_only_name()
    if not name:
        pytest.skip("this host's name does not resolve to its own addresses")
    index = Recorder(host="0.0.0.0")
    try:
        # https: pip goes through CONNECT for it (and ignores plain http to
        # a host it does not trust); the proxy refuses before any TLS
        al = pip_allowlist(mgr, f"https://{name}:{index.port}/simple/")
        p = install(mgr, al, timeout=300)
        if installs_disabled(p):
            pytest.skip("installs are disabled in this build")
        assert p.returncode != 0, p.stdout
        assert "refused by policy" in p.stderr, p.stderr
        assert f"{name}:{index.port}" in p.stderr, p.stderr
        assert index.requests == []
    finally:
        index.close()
    assert_serves(mgr)
