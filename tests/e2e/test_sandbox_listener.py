"""The sandbox's loopback listener (sandbox_config.loopback_listen_port), the
one way out that package installers get: a socket listening on 127.0.0.1:PORT
inside the sandbox's otherwise empty network namespace, served from outside
(here by sandbox-run --loopback-listen, which answers "hello from outside").
Only that port leads outside; everything else about the network is as with
the network off (the sandbox's own loopback works, nothing else is
reachable). Runs as the invoker and, as root, as nobody."""
import platform

import pytest

import sbxutil
from sbxutil import assert_safe

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="the sandbox tests target x86_64")

PORT = 3128


@pytest.fixture(params=sbxutil.USERS)
def sbx(request):
    s = sbxutil.Sandboxes(request.param)
    yield s
    s.close()


PROBE = r'''
import errno, socket
def tryit(f):
    try:
        return "ok:" + repr(f())
    except OSError as e:
        return "err:" + errno.errorcode.get(e.errno, str(e.errno))
def conn(host, port):
    s = socket.socket(); s.settimeout(3); s.connect((host, port))
    d = s.recv(100); s.close(); return d.decode()
r = {}
r["listener"] = tryit(lambda: conn("127.0.0.1", PORT))
r["other_port"] = tryit(lambda: conn("127.0.0.1", HOSTPORT))
for h in HOSTS:
    r["host " + h] = tryit(lambda: conn(h, HOSTPORT))
r["udp"] = tryit(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
r["raw"] = tryit(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))
r["inet6"] = tryit(lambda: socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
r["sctp"] = tryit(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
def bind(port):
    s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen(); return "bound"
r["bind"] = tryit(lambda: bind(4000))
r["bind_listener_port"] = tryit(lambda: bind(PORT))
for k, v in r.items():
    print(k, "=", v)
'''


# Network off, with or without the listener: TCP and UDP sockets on the
# sandbox's own loopback; raw and SCTP sockets denied (seccomp); no route to
# any other address.
NETWORK_OFF = {"udp": "ok:", "raw": "err:EPERM", "inet6": "ok:", "sctp": "err:EPERM",
               "bind": "ok:'bound'"}


def probe(sbx, hostport, hosts, opts=()):
    code = (PROBE.replace("HOSTPORT", str(hostport)).replace("PORT", str(PORT))
            .replace("HOSTS", repr(hosts)))
    r = sbx.run(code, "python", list(opts))
    assert r.rc == 0, r
    return dict(line.split(" = ", 1) for line in r.out.splitlines() if " = " in line), r


def test_only_the_listener_is_reachable(sbx):
    lst = sbxutil.Listener("0.0.0.0")
    try:
        hosts = sbxutil.host_addresses()
        res, r = probe(sbx, lst.port, hosts, ["--loopback-listen", str(PORT)])
        assert res["listener"] == "ok:'hello from outside\\n'", r
        # Another port of lo is the sandbox's own, where nothing listens.
        assert res["other_port"] == "err:ECONNREFUSED", r
        for h in hosts:
            assert res["host " + h] == "err:ENETUNREACH", (h, r)
        # Nothing inside can take the listener's port.
        assert res["bind_listener_port"] == "err:EADDRINUSE", r
        for k, v in NETWORK_OFF.items():
            assert res[k].startswith(v), (k, r)
        assert lst.accepted == [], lst.accepted
    finally:
        lst.close()


def test_network_off_without_a_listener(sbx):
    """No listener: the same loopback-only network, and port PORT is free."""
    res, r = probe(sbx, 9, ["93.184.216.34"])
    assert res["listener"] == "err:ECONNREFUSED" and res["other_port"] == "err:ECONNREFUSED", r
    assert res["host 93.184.216.34"] == "err:ENETUNREACH", r
    assert res["bind_listener_port"] == "ok:'bound'", r
    for k, v in NETWORK_OFF.items():
        assert res[k].startswith(v), (k, r)


def test_listener_needs_network_off(sbx):
    r = sbx.run("true", "bash", ["--loopback-listen", str(PORT), "--network"])
    assert r.rc == 125 and "needs the network off" in r.err, r
    r = sbx.run("true", "bash", ["--loopback-listen", str(PORT), "--level", "none"])
    assert r.rc == 125 and "needs the strict sandbox" in r.err, r


def test_listener_is_not_inherited_by_the_worker(sbx):
    """Neither the worker nor its init holds the listening socket: only the
    caller can accept connections on it."""
    code = ("import os\n"
            "kinds = []\n"
            "for pid in ('self', '1'):\n"
            "    try:\n"
            "        fds = os.listdir('/proc/%s/fd' % pid)\n"
            "    except OSError as e:\n"
            "        kinds.append('unreadable %s: %s' % (pid, e)); continue\n"
            "    for f in fds:\n"
            "        try:\n"
            "            kinds.append(os.readlink('/proc/%s/fd/%s' % (pid, f)))\n"
            "        except OSError:\n"
            "            pass\n"
            "print('SAFE' if not any(k.startswith('socket:') for k in kinds) else 'PWNED', kinds)\n")
    r = sbx.run(code, "python", ["--loopback-listen", str(PORT)])
    assert_safe(r.out, str(r))
