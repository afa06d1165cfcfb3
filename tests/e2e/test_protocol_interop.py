"""Interoperability of protocol/ (C) with jupyter_client's Session (Python).

The C side is driven through tests/tools/jp_tool.c, which this module compiles
with gcc from that file and the protocol/ sources (so it does not depend on
the rest of libkm.a). Frames cross the process boundary as hex strings.
"""
import json
import os
import shutil
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import zmq
from jupyter_client.session import Session

ROOT = Path(__file__).resolve().parents[2]
KEY = "5f1b0c6e-interop-test-key"


@pytest.fixture(scope="module")
def jp_tool(tmp_path_factory):
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "a C compiler is needed to build tests/tools/jp_tool.c"
    out = tmp_path_factory.mktemp("jp_tool") / "jp_tool"
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "libzmq", "libsodium", "jansson"],
        check=True, capture_output=True, text=True).stdout.split()
    # protocol/ and the one layer below it (common/)
    sources = sorted(str(p) for d in ("common", "protocol") for p in (ROOT / d).glob("*.c"))
    subprocess.run([cc, "-std=gnu11", "-D_GNU_SOURCE", "-O1", "-g", "-I", str(ROOT), "-I", str(ROOT / "protocol"),
                    "-o", str(out), str(ROOT / "tests/tools/jp_tool.c"), *sources, *flags],
                   check=True, timeout=180)
    return str(out)


def run_tool(tool, cmd, key, payload):
    p = subprocess.run([tool, cmd, key], input=json.dumps(payload), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def c_decode(tool, key, frames):
    return run_tool(tool, "decode", key, {"frames": [f.hex() for f in frames]})


def c_encode(tool, key, **msg):
    msg.setdefault("ids", [])
    msg["ids"] = [i.hex() for i in msg["ids"]]
    msg["buffers"] = [b.hex() for b in msg.get("buffers", [])]
    rc, out = run_tool(tool, "encode", key, msg)
    assert rc == 0, out
    return [bytes.fromhex(f) for f in out["frames"]]


def py_frames(session, msg_type, content, buffers=None, ident=None):
    """Frames exactly as Session.send puts them on the wire (serialize()
    leaves the buffers for send() to append)."""
    msg = session.msg(msg_type, content=content)
    return msg, session.serialize(msg, ident=ident) + list(buffers or [])


CONTENT = {"code": "print('héllo wörld ✓')\nx = {'a': [1, 2.5, None, True]}",
           "silent": False, "nul": "a\x00b", "nested": {"deep": [[{"k": "v"}]]}}


@pytest.mark.parametrize("buffers", [None, [b"\x00\x01\xffbinary", b"", b"x" * 100000]],
                         ids=["no-buffers", "buffers"])
def test_python_signs_c_verifies(jp_tool, buffers):
    s = Session(key=KEY.encode(), username="alice", session="py-session")
    msg, frames = py_frames(s, "execute_request", CONTENT, buffers, ident=[b"router-id"])
    rc, out = c_decode(jp_tool, KEY, frames)
    assert rc == 0, out
    assert out["header"]["msg_id"] == msg["header"]["msg_id"]
    assert out["header"]["msg_type"] == "execute_request"
    assert out["header"]["username"] == "alice"
    assert out["header"]["session"] == "py-session"
    assert out["content"] == CONTENT
    assert out["ids"] == [b"router-id".hex()]
    assert [bytes.fromhex(b) for b in out["buffers"]] == (buffers or [])


@pytest.mark.parametrize("buffers", [None, [b"\x00\x01\xffbinary", b"", b"y" * 100000]],
                         ids=["no-buffers", "buffers"])
def test_c_signs_python_verifies(jp_tool, buffers):
    parent = {"msg_id": "p-1", "msg_type": "execute_request", "session": "s",
              "username": "u", "date": "2024-01-02T03:04:05.123456Z", "version": "5.3"}
    frames = c_encode(jp_tool, KEY, msg_type="execute_reply", session="c-session",
                      username="bob", content=CONTENT, metadata={"m": 1},
                      parent_header=parent, ids=[b"peer"], buffers=buffers or [])
    s = Session(key=KEY.encode())
    idents, rest = s.feed_identities(frames)
    assert idents == [b"peer"]
    msg = s.deserialize(rest)
    h = msg["header"]
    assert h["msg_type"] == "execute_reply" and h["session"] == "c-session"
    assert h["username"] == "bob" and h["version"] == "5.3"
    assert len(h["msg_id"]) == 36 and h["msg_id"][14] == "4"
    # extract_dates turned the C timestamp into an aware datetime close to now.
    assert isinstance(h["date"], datetime), h["date"]
    assert abs((datetime.now(timezone.utc) - h["date"]).total_seconds()) < 120
    assert msg["parent_header"]["msg_id"] == "p-1"
    assert isinstance(msg["parent_header"]["date"], datetime)
    assert msg["metadata"] == {"m": 1}
    assert msg["content"] == CONTENT
    assert [bytes(b) for b in msg["buffers"]] == (buffers or [])


def test_tampered_python_message_rejected_by_c(jp_tool):
    s = Session(key=KEY.encode())
    _, frames = py_frames(s, "execute_request", {"code": "1"}, [b"buf"])
    d = frames.index(b"<IDS|MSG>")
    for idx, new in [(d + 5, b'{"code":"2"}'), (d + 2, frames[d + 2].replace(b"5.3", b"5.4"))]:
        bad = list(frames)
        bad[idx] = new
        rc, out = c_decode(jp_tool, KEY, bad)
        assert rc == 1 and out["name"] == "signature mismatch", out
    # Wrong key, wrong-length and uppercase signatures.
    rc, out = c_decode(jp_tool, "other-key", frames)
    assert rc == 1 and out["name"] == "signature mismatch"
    bad = list(frames)
    bad[d + 1] = frames[d + 1][:-2]
    rc, out = c_decode(jp_tool, KEY, bad)
    assert rc == 1 and out["name"] == "malformed signature"
    bad[d + 1] = frames[d + 1].upper()
    rc, out = c_decode(jp_tool, KEY, bad)
    assert rc == 1 and out["name"] == "malformed signature"
    # Buffers are not covered by the signature (as in jupyter_client).
    bad = list(frames)
    bad[-1] = b"other"
    rc, out = c_decode(jp_tool, KEY, bad)
    assert rc == 0 and out["buffers"] == [b"other".hex()]


def test_tampered_c_message_rejected_by_python(jp_tool):
    frames = c_encode(jp_tool, KEY, msg_type="status", session="c",
                      content={"execution_state": "idle"})
    d = frames.index(b"<IDS|MSG>")
    bad = list(frames)
    bad[d + 5] = b'{"execution_state":"busy"}'
    with pytest.raises(ValueError, match="Invalid Signature"):
        Session(key=KEY.encode()).deserialize(bad[d + 1:])
    with pytest.raises(ValueError, match="Invalid Signature"):
        Session(key=b"not-the-key").deserialize(frames[d + 1:])
    # Untouched, it verifies; a replay of it is refused by Python too.
    s = Session(key=KEY.encode())
    assert s.deserialize(frames[d + 1:])["content"] == {"execution_state": "idle"}
    with pytest.raises(ValueError, match="Duplicate Signature"):
        s.deserialize(frames[d + 1:])


def test_empty_key_means_unsigned_both_ways(jp_tool):
    s = Session(key=b"")
    _, frames = py_frames(s, "kernel_info_request", {}, None)
    assert frames[frames.index(b"<IDS|MSG>") + 1] == b""
    rc, out = c_decode(jp_tool, "", frames)
    assert rc == 0 and out["header"]["msg_type"] == "kernel_info_request"
    # A signing C side refuses the unsigned message.
    rc, out = c_decode(jp_tool, KEY, frames)
    assert rc == 1 and out["name"] == "malformed signature"

    frames = c_encode(jp_tool, "", msg_type="kernel_info_reply", content={"status": "ok"})
    d = frames.index(b"<IDS|MSG>")
    assert frames[d + 1] == b""
    assert s.deserialize(frames[d + 1:])["content"] == {"status": "ok"}


def test_over_zeromq_send_recv_replay_and_sync(jp_tool, tmp_path):
    """C's jp_session_recv/send on a ROUTER against pyzmq + Session on a DEALER:
    round trips with buffers, a tampered and a replayed message are rejected
    and fully drained (the next good message still round-trips)."""
    endpoint = f"ipc://{tmp_path}/jp-interop"
    proc = subprocess.Popen([jp_tool, "serve", KEY, endpoint, "5"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        assert json.loads(proc.stdout.readline())["status"] == "listening"
        sock.connect(endpoint)
        s = Session(key=KEY.encode(), session="zmq-session")

        def roundtrip(content, buffers=()):
            sent = s.send(sock, "echo_request", content=content, buffers=list(buffers))
            assert sock.poll(10000), "no reply from jp_tool"
            _, reply = s.recv(sock, mode=0)
            assert reply["header"]["msg_type"] == "echo_request_echo"
            assert reply["parent_header"]["msg_id"] == sent["header"]["msg_id"]
            assert reply["content"] == content
            assert [bytes(b) for b in reply["buffers"]] == list(buffers)
            seen = json.loads(proc.stdout.readline())
            assert seen["status"] == "ok" and seen["content"] == content
            return sent

        roundtrip({"n": 1}, [b"\x00" * 10, b"abc"])

        msg = s.msg("echo_request", content={"n": 2})
        frames = s.serialize(msg)
        sock.send_multipart(frames)                   # accepted
        assert sock.poll(10000)
        s.recv(sock, mode=0)
        assert json.loads(proc.stdout.readline())["status"] == "ok"
        sock.send_multipart(frames)                   # replayed: refused
        line = json.loads(proc.stdout.readline())
        assert line["status"] == "error" and line["name"] == "replayed message", line

        bad = list(s.serialize(s.msg("echo_request", content={"n": 3}), ))
        bad[-1] = b'{"n":4}'                          # tampered content
        sock.send_multipart(bad + [b"trailing buffer"])
        line = json.loads(proc.stdout.readline())
        assert line["status"] == "error" and line["name"] == "signature mismatch", line
        assert not sock.poll(200), "a rejected message must not be answered"

        roundtrip({"n": 5, "text": "still in sync ✓"})
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    finally:
        sock.close()
        ctx.term()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_conn(tool, *args):
    p = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_connection_file_c_writes_jupyter_client_reads(jp_tool, tmp_path, transport):
    from jupyter_client.connect import ConnectionFileMixin
    path = tmp_path / "kernel.json"
    ip = str(tmp_path / "kipc") if transport == "ipc" else ""
    rc, c = run_conn(jp_tool, "conn-init", str(path), transport, ip)
    assert rc == 0, c
    assert (path.stat().st_mode & 0o777) == 0o600
    info = json.loads(path.read_text())
    assert info["transport"] == transport and info["signature_scheme"] == "hmac-sha256"
    assert len(info["key"]) == 64 and int(info["key"], 16) >= 0
    # jupyter_client's own loader accepts it and computes the same endpoints.
    mixin = ConnectionFileMixin(connection_file=str(path))
    mixin.load_connection_file()
    assert mixin.session.key == info["key"].encode()
    assert mixin.transport == transport
    for ch in ("shell", "iopub", "stdin", "control", "hb"):
        assert mixin._make_url(ch) == c[ch]


def test_connection_file_jupyter_client_writes_c_reads(jp_tool, tmp_path):
    from jupyter_client.connect import write_connection_file
    path = tmp_path / "jc.json"
    fname, cfg = write_connection_file(str(path), transport="tcp", kernel_name="python3",
                                       key=b"a-key-from-python")
    rc, c = run_conn(jp_tool, "conn-read", fname)
    assert rc == 0, c
    assert c["key"] == "a-key-from-python"
    assert c["ports"] == [cfg["shell_port"], cfg["iopub_port"], cfg["stdin_port"],
                          cfg["control_port"], cfg["hb_port"]]
    assert c["kernel_name"] == "python3"
    assert c["shell"] == f"tcp://{cfg['ip']}:{cfg['shell_port']}"

    bad = json.loads(path.read_text())
    bad["signature_scheme"] = "hmac-sha512"
    path.write_text(json.dumps(bad))
    rc, out = run_conn(jp_tool, "conn-read", str(path))
    assert rc == 1 and out["name"] == "unsupported signature scheme"
    assert "hmac-sha512" in out["reason"]
