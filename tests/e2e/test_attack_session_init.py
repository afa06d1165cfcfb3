"""Attacks on a session's one sandbox (sandbox/sbx_session.c): its init as a
target from inside, its holder's socket as a target from the host, and
another session's sandbox over loopback.

Each attack runs as the invoking user and, when that is root, with the
daemon (and so the holder and the sandbox) running as nobody; each asserts
that the attack failed and that both kernels of the session still work."""
import os
import socket
import struct
import subprocess

import pytest

import sbxutil
from test_session_machine import MachineMgr, free_port

MAGIC = 0x6B6D7362
HDR = "<IIIiIIIII"  # magic, type, id, a, argc, envc, roc, zargc, zmax (sbx_sess_hdr)


@pytest.fixture(params=sbxutil.USERS)
def mgr(request):
    m = MachineMgr(request.param)
    yield m
    m.close()


def assert_session_works(mgr, name="a"):
    assert "42" in mgr.ok(name, "echo $((6 * 7))", "bash")
    assert "42" in mgr.ok(name, "print(6 * 7)", "python")


def holder_socket(mgr):
    socks = sorted(mgr.run_dir.glob("*.sbx"))
    assert len(socks) == 1, socks
    return str(socks[0])


def test_init_has_no_more_rights_than_the_code(mgr):
    """PID 1 of the session is the code's peer: same uid, no capabilities,
    no_new_privs, seccomp; a worker started through it is as confined."""
    mgr.ok("a", "pass", "python")
    out = mgr.ok("a", "grep -E '^(Uid|CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/1/status; "
                      "echo ---; grep -E '^(Uid|CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' "
                      "/proc/self/status", "bash")
    init, me = out.split("---")
    for part in (init, me):
        assert "NoNewPrivs:\t1" in part and "Seccomp:\t2" in part, out
        for cap in ("CapEff", "CapPrm", "CapBnd"):
            assert f"{cap}:\t0000000000000000" in part, out
    assert init.split("Uid:")[1].split()[0] == me.split("Uid:")[1].split()[0], out
    out = mgr.ok("a", "import os\nprint(open('/proc/self/status').read())", "python")
    assert "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out and "CapEff:\t0000000000000000" in out
    assert_session_works(mgr)


STEAL_INIT_FDS = r'''
import ctypes, os, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
got = []
for n in range(0, 64):
    try:
        fd = os.open(f"/proc/1/fd/{n}", os.O_RDWR)
        got.append(("open", n)); os.close(fd)
    except OSError:
        pass
try:
    os.listdir("/proc/1/fd")
    listed = True
except OSError:
    listed = False
pidfd = libc.syscall(434, 1, 0)  # pidfd_open(1)
if pidfd >= 0:
    for n in range(0, 64):
        if libc.syscall(438, pidfd, n, 0) >= 0:  # pidfd_getfd
            got.append(("getfd", n))
ptrace = libc.syscall(101, 16, 1, 0, 0)  # PTRACE_ATTACH to init
print("PWNED" if got or ptrace == 0 else "SAFE", got, listed, ptrace)
'''


def test_init_fds_cannot_be_taken(mgr):
    """The control socket to the holder is init's alone: not by /proc, not
    by pidfd_getfd, not by ptrace."""
    mgr.ok("a", "true", "bash")
    out = mgr.ok("a", STEAL_INIT_FDS, "python")
    sbxutil.assert_safe(out, "taking init's fds")
    assert_session_works(mgr)


def test_signals_to_init_change_nothing(mgr):
    mgr.ok("a", "x=kept", "bash")
    mgr.ok("a", "y = 7", "python")
    out = mgr.ok("a", "for s in TERM INT HUP QUIT USR1 USR2 CHLD STOP KILL CONT; do "
                      "kill -s $s 1 2>/dev/null; done; kill -0 1 && echo INIT-ALIVE", "bash")
    assert "INIT-ALIVE" in out, out
    out = mgr.ok("a", "import os, signal\nfor s in (signal.SIGTERM, signal.SIGKILL, signal.SIGSTOP):\n"
                      "    os.kill(1, s)\nprint('y =', y)", "python")
    assert "y = 7" in out, out
    assert "kept" in mgr.ok("a", "echo $x", "bash")
    assert_session_works(mgr)


def test_holder_socket_is_not_in_the_sandbox(mgr):
    """The sandbox cannot reach its holder: the socket's path does not
    exist inside, nor does any host process."""
    mgr.ok("a", "true", "bash")
    path = holder_socket(mgr)
    code = ("import socket\ns = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
            f"try:\n    s.connect({path!r}); print('PWNED')\n"
            "except OSError as e:\n    print('SAFE', e)\n")
    out = mgr.ok("a", code, "python")
    sbxutil.assert_safe(out, "connecting to the holder")
    out = mgr.ok("a", "ps -e -o comm= | sort -u | tr '\\n' ' '", "bash")
    assert "kernelmgr" not in out and "kernel-bash" not in out, out
    assert_session_works(mgr)


def _msg(mtype, strings=(), a=0, argc=None, envc=0, roc=0, magic=MAGIC, zargc=0, zmax=0):
    payload = b"".join(s.encode() + b"\0" for s in strings)
    if argc is None:
        argc = len(strings) - envc - roc - zargc
    return struct.pack(HDR, magic, ord(mtype), 0, a, argc, envc, roc, zargc, zmax) + payload


ATTACKER = r'''
import os, socket, struct, sys, array
path = sys.argv[1]
msgs = [bytes.fromhex(h) for h in sys.argv[2:]]
replies = []
for m in msgs:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    s.settimeout(30)
    try:
        s.sendmsg([m], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2] * 5))])
        data, anc, flags, _ = s.recvmsg(4096, socket.CMSG_SPACE(64))
        for lvl, typ, raw in anc:  # a worker's pidfd would mean it obeyed
            if typ == socket.SCM_RIGHTS and len(raw) >= 4:
                replies.append("FD")
        replies.append(chr(struct.unpack("<I", data[4:8])[0]) if len(data) >= 8 else "EOF")
        replies.append(data[HDR_SIZE:].split(b"\0")[0].decode(errors="replace"))
    except (OSError, socket.timeout) as e:
        replies.append("ERR " + str(e))
    s.close()
print("|".join(replies))
'''.replace("HDR_SIZE", str(struct.calcsize(HDR)))


def test_garbage_to_the_holder(mgr):
    """Malformed requests from a process of the manager's own user are
    refused with a reason; nothing starts, and the session goes on."""
    mgr.ok("a", "true", "bash")
    path = holder_socket(mgr)
    bad = [
        b"\x00" * 3,                                             # short
        struct.pack(HDR, 0x11111111, ord("S"), 0, 0, 1, 0, 0, 0, 0) + b"/bin/true\0",  # magic
        _msg("S", ["relative/true"]),                            # argv[0] not absolute
        _msg("S", ["/bin/true"], argc=0),                       # no argv
        _msg("S", ["/bin/true", "NOEQUALS"], envc=1),            # env without '='
        _msg("S", ["/bin/true", "/etc"], roc=1),                 # a path the sandbox lacks
        _msg("S", ["/bin/true"], argc=5),                        # counts lie
        _msg("S", ["/bin/true" + "x" * 10], argc=1)[:-1],        # unterminated
        _msg("K", [], a=9),                                      # not a request
        _msg("S", ["/bin/true", "rel/zygote"], zargc=1, zmax=2),  # zygote not absolute
        _msg("S", ["/bin/true", "/bin/true"], zargc=1, zmax=0),  # zygote of no forks
    ]
    r = subprocess.run([*mgr.prefix, "/usr/bin/python3", "-c", ATTACKER, path,
                        *(m.hex() for m in bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    parts = r.stdout.strip().split("|")
    assert "FD" not in parts, parts
    assert "O" not in parts[0::2], parts
    assert any("/etc" in p for p in parts), parts  # the missing path is named
    assert any("malformed" in p for p in parts), parts
    assert_session_works(mgr)


def test_other_users_are_not_served(mgr):
    if not sbxutil.IS_ROOT:
        pytest.skip("needs root to act as another user")
    mgr.ok("a", "true", "bash")
    path = holder_socket(mgr)
    # the holder's user is root (invoker) or nobody: the attacker is the other
    other = ["setpriv", "--reuid=65533", "--regid=65533", "--clear-groups"]
    r = subprocess.run([*other, "/usr/bin/python3", "-c",
                        "import socket,sys\ns=socket.socket(socket.AF_UNIX,socket.SOCK_SEQPACKET)\n"
                        "try:\n s.connect(sys.argv[1]); s.settimeout(10)\n"
                        " s.send(b'x'*40); d=s.recv(100); print('PWNED' if d else 'SAFE eof')\n"
                        "except OSError as e: print('SAFE', e)\n", path],
                       capture_output=True, text=True, timeout=60)
    sbxutil.assert_safe(r.stdout + r.stderr, "another user at the holder")
    assert_session_works(mgr)


def test_another_sessions_sandbox_over_loopback(mgr):
    port = free_port()
    mgr.ok("a", f"mkdir -p /tmp/s; echo SECRET > /tmp/s/f; (cd /tmp/s && exec python3 -m "
                f"http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 &)", "bash")
    # the server is up in session a
    out = mgr.ok("a", f"for i in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null "
                      f"&& break; sleep 0.05; done; echo UP", "bash")
    assert "UP" in out
    code = ("import socket\nres = []\n"
            f"for fam, addr in ((socket.AF_INET, ('127.0.0.1', {port})), "
            f"(socket.AF_INET6, ('::1', {port})), (socket.AF_INET, ('127.0.0.2', {port}))):\n"
            "    try:\n        s = socket.socket(fam); s.settimeout(5); s.connect(addr)\n"
            "        res.append('PWNED')\n    except OSError as e:\n        res.append('refused')\n"
            "print('SAFE' if 'PWNED' not in res else 'PWNED', res)")
    out = mgr.ok("b", code, "python")
    sbxutil.assert_safe(out, "reaching another session's server")
    assert_session_works(mgr, "a")
    assert_session_works(mgr, "b")
