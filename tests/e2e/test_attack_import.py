"""A session archive (session.import) is hostile input: archives with "..",
absolute paths, symbolic and hard links, devices and FIFOs, extended
headers, entries outside the layout, a huge declared size, too many
entries, an upload past import_max_bytes or out of order, more uploads at
once than the daemon takes, and a manifest naming files
outside the archive or a language that is not one — each refused with a
clear error, no session made, nothing written outside (nor left in the
store), and the daemon still imports a sound archive afterwards (also by
the CLI's `session export` / `session import`), whose next
exec restores the Python and Bash variables and the files. One daemon
(strict sandbox) for the module. Also: the MCP tier may neither export nor
import."""
import base64
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
from test_api import Conn  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="build/kernel-python and build/kernel-bash not built")

MAX_BYTES = 512 * 1024
MAX_ENTRIES = 40


@pytest.fixture(scope="module")
def daemon():
    m = mgrutil.Mgr({"sandbox": "strict", "import_max_bytes": MAX_BYTES,
                     "import_max_entries": MAX_ENTRIES})
    p = subprocess.Popen([mgrutil.KM, "serve"], env=m.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    end = time.monotonic() + 30
    while not (m.home / "kernelmgr.sock").exists():
        assert p.poll() is None and time.monotonic() < end, "the daemon did not come up"
        time.sleep(0.05)
    c = Conn(m)
    try:
        assert c.ok("exec", {"session": "src", "lang": "python",
                             "code": "import os\nx = 41\nopen('notes.txt', 'w').write('kept')\n"
                                     "os.makedirs('pdir')\nos.chdir('pdir')\n"
                                     "os.environ['MOVED_ENV'] = 'kept'\n"
                                     "del os.environ['MPLBACKEND']"})
        assert c.ok("exec", {"session": "src", "lang": "bash",
                             "code": "word=moved; mkdir -p sub && echo deep > sub/f; cd sub; "
                                     "export WORD_ENV=yes; unset PAGER"})
        r = c.ok("session.export", {"session": "src"})
        data = base64.b64decode(r["data"])
        while not r["eof"]:
            r = c.ok("session.export", {"session": "src", "archive": r["archive"],
                                        "offset": len(data)})
            data += base64.b64decode(r["data"])
        yield m, c, data
    finally:
        c.close()
        m.close()
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def members(data):
    """(TarInfo, bytes) of every entry of the sound archive."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        for ti in t.getmembers():
            out.append((ti, t.extractfile(ti).read() if ti.isfile() else None))
    return out


def build(entries, fmt=tarfile.USTAR_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as t:
        for ti, content in entries:
            t.addfile(ti, io.BytesIO(content) if content is not None else None)
    return buf.getvalue()


def info(name, content=b"", type=tarfile.REGTYPE, **kw):
    ti = tarfile.TarInfo(name)
    ti.type = type
    ti.size = len(content) if type == tarfile.REGTYPE else 0
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti, content if type == tarfile.REGTYPE else None


def send(c, name, data, chunk=200 * 1024):
    """session.import of data in chunks; the last reply (or error)."""
    off = 0
    while True:
        part = data[off:off + chunk]
        final = off + len(part) >= len(data)
        rep, _ = c.call("session.import", {"session": name, "offset": off, "final": final,
                                           "data": base64.b64encode(part).decode()})
        if "error" in rep or final:
            return rep
        off += len(part)


def refused(daemon, name, data, *words):
    m, c, _ = daemon
    rep = send(c, name, data)
    assert "error" in rep, rep
    msg = rep["error"]["message"]
    for w in words:
        assert w in msg, (w, msg)
    # nothing made, nothing left behind
    assert name not in {s["name"] for s in c.ok("sessions.list")["sessions"]}
    assert not (m.home / "sessions" / name).exists()
    imports = m.home / "imports"
    assert not imports.exists() or not list(imports.iterdir()), list(imports.iterdir())
    return msg


def with_extra(data, *extra, fmt=tarfile.USTAR_FORMAT):
    return build(members(data) + list(extra), fmt)


def test_dotdot_and_absolute_paths_refused(daemon, tmp_path):
    _, _, good = daemon
    target = tmp_path / "escaped"
    rel = os.path.relpath(target, "/")
    depth = "../" * 12
    refused(daemon, "a1", with_extra(good, info("workspace/" + depth + rel, b"x")),
            '".." component')
    refused(daemon, "a2", with_extra(good, info("snapshot/python/../../../x", b"x")), '".."')
    refused(daemon, "a3", with_extra(good, info("/" + rel, b"x")), "absolute path")
    refused(daemon, "a4", with_extra(good, info("workspace//x", b"x")), "empty path component")
    refused(daemon, "a5", with_extra(good, info("evil.txt", b"x")),
            "not part of a session archive")
    assert not target.exists()


def test_links_devices_fifos_refused(daemon, tmp_path):
    _, _, good = daemon
    refused(daemon, "b1", with_extra(good, info("workspace/l", type=tarfile.SYMTYPE,
                                                linkname=str(tmp_path))), "symbolic link")
    refused(daemon, "b2", with_extra(good, info("workspace/h", type=tarfile.LNKTYPE,
                                                linkname="workspace/notes.txt")), "hard link")
    refused(daemon, "b3", with_extra(good, info("workspace/dev", type=tarfile.CHRTYPE,
                                                devmajor=1, devminor=3)), "a device")
    refused(daemon, "b4", with_extra(good, info("workspace/blk", type=tarfile.BLKTYPE,
                                                devmajor=8, devminor=0)), "a device")
    refused(daemon, "b5", with_extra(good, info("workspace/fifo", type=tarfile.FIFOTYPE)),
            "a FIFO")
    # a long name takes an extended header: not read at all
    refused(daemon, "b6", with_extra(good, info("workspace/" + "d/" * 60 + "f" * 120, b"x"),
                                     fmt=tarfile.PAX_FORMAT), "extended")


def huge_header(name, size):
    """One ustar header declaring size bytes (octal, 11 digits), checksummed."""
    ti = tarfile.TarInfo(name)
    ti.size = 0
    h = bytearray(ti.tobuf(format=tarfile.USTAR_FORMAT))
    h[124:136] = b"%011o\0" % size
    h[148:156] = b" " * 8
    h[148:155] = b"%06o\0" % sum(h)
    return bytes(h)


def test_huge_declared_size_and_too_many_entries_refused(daemon):
    _, _, good = daemon
    body = good[:-1024]  # without its end-of-archive blocks
    big = body + huge_header("workspace/big", 0o77777777777) + b"\0" * 2048
    refused(daemon, "c1", big, "declares", "import_max_bytes")
    # declared within the bound but the archive ends before the data
    short = body + huge_header("workspace/short", 100000) + b"\0" * 1024
    refused(daemon, "c2", short, "ends before")
    many = with_extra(good, *[info(f"workspace/d{i}", type=tarfile.DIRTYPE)
                              for i in range(MAX_ENTRIES)])
    refused(daemon, "c3", many, "import_max_entries")
    # the upload itself past import_max_bytes: refused while it comes in
    blob = with_extra(good, info("workspace/blob", os.urandom(MAX_BYTES)))
    refused(daemon, "c4", blob, "import_max_bytes")
    # a damaged header
    bad = bytearray(good)
    bad[0] ^= 0x20
    refused(daemon, "c5", bytes(bad), "checksum")


def test_manifest_naming_files_outside_refused(daemon):
    _, _, good = daemon
    ms = members(good)
    man = json.loads(next(c for ti, c in ms if ti.name == "snapshot/manifest.json"))

    def with_manifest(mod):
        m2 = json.loads(json.dumps(man))
        mod(m2)
        text = json.dumps(m2).encode()
        out = []
        for ti, c in ms:
            if ti.name == "snapshot/manifest.json":
                ti = tarfile.TarInfo(ti.name)
                ti.size = len(text)
                c = text
            out.append((ti, c))
        return build(out)

    refused(daemon, "d1", with_manifest(
        lambda m: m["kernels"]["python"]["files"].update({"../../../etc/passwd": 1})),
        "names the file", "nothing outside")
    refused(daemon, "d2", with_manifest(
        lambda m: m["kernels"]["python"]["files"].update({"absent.pkl": 1})), "names the file")
    refused(daemon, "d3", with_manifest(
        lambda m: m["kernels"].update({"../evil": {"files": {}}})), "not a language")
    refused(daemon, "d4", with_manifest(lambda m: m.update({"version": 2})),
            "not a kernelmgr snapshot manifest")
    no_header = build([(ti, c) for ti, c in ms if ti.name != "kernelmgr-session.json"])
    refused(daemon, "d5", no_header, "kernelmgr-session.json")


def test_uploads_bounded_in_number_and_order(daemon):
    m, c, good = daemon
    chunk = base64.b64encode(good[:512]).decode()
    for i in range(8):
        c.ok("session.import", {"session": f"u{i}", "offset": 0, "data": chunk})
    e = c.error("session.import", {"session": "u8", "offset": 0, "data": chunk})
    assert "8 session imports are in progress" in e["message"], e
    # a chunk at another offset than the bytes received is refused, naming it
    e = c.error("session.import", {"session": "u0", "offset": 100, "data": chunk})
    assert "next chunk is at offset 512" in e["message"], e
    e = c.error("session.import", {"session": "nope", "offset": 512, "data": chunk})
    assert "no upload" in e["message"], e
    # the idle uploads are the test's to drop (the daemon drops them after 600 s idle)
    for f in (m.home / "imports").iterdir():
        f.unlink()
    assert not any(f"u{i}" in {s["name"] for s in c.ok("sessions.list")["sessions"]}
                   for i in range(9))


def test_mcp_tier_may_not_move_sessions(daemon):
    m, _, _ = daemon
    c = Conn(m)
    try:
        assert c.ok("initialize", {"tier": "mcp"})["tier"] == "mcp"
        for method, params in (("session.export", {"session": "src"}),
                               ("session.import", {"session": "z", "data": "", "offset": 0})):
            e = c.error(method, params)
            assert "not available to" in e["message"], e
    finally:
        c.close()


def test_cli_session_export_and_import(daemon, tmp_path):
    """`kernelmgr session export NAME FILE` / `session import FILE NAME`:
    the same archive through the CLI, the file written only when complete."""
    m, c, _ = daemon
    f = tmp_path / "src.tar"
    p = m.run("session", "export", "src", str(f))
    assert p.returncode == 0 and "exported session src" in p.stdout, (p.stdout, p.stderr)
    assert "bash, python" in p.stdout and f.stat().st_size > 0, p.stdout
    assert [x.name for x in tmp_path.iterdir()] == ["src.tar"]  # no temporary left
    p = m.run("session", "import", str(f), "clicopy")
    assert p.returncode == 0 and "imported session clicopy" in p.stdout, (p.stdout, p.stderr)
    out = c.ok("exec", {"session": "clicopy", "lang": "python", "code": "print(x)"})["results"][0]
    assert out["stdout"] == "41\n", out
    # the same name again: refused, said on stderr, exit status 2
    p = m.run("session", "import", str(f), "clicopy")
    assert p.returncode == 2 and "exists" in p.stderr, (p.returncode, p.stderr)
    # no NAME: the one it was exported with, which exists here
    p = m.run("session", "import", str(f))
    assert p.returncode == 2 and 'session "src" exists' in p.stderr, p.stderr
    c.ok("close", {"session": "clicopy"})


def test_sound_archive_still_imports_and_restores(daemon):
    """After every refusal above: the daemon imports the sound archive, and
    the next exec has every variable and file; an import over an existing
    session is refused."""
    m, c, good = daemon
    rep = send(c, "moved", good, chunk=4096)
    assert "result" in rep, rep
    r = rep["result"]
    assert r["from"]["session"] == "src" and set(r["kernels"]) == {"python", "bash"}, r
    out = c.ok("exec", {"session": "moved", "lang": "python",
                        "code": "print(x + 1, open('../notes.txt').read(), os.getcwd())"}
               )["results"][0]
    assert out["stdout"] == f"42 kept {r['workspace']}/pdir\n", out  # its own workspace
    assert out["kernel"]["restored"]["tag"] == "imported", out["kernel"]
    # the cells' changes to the environment come back; what the start was
    # given (the package directories, which name the session) is the new one
    out = c.ok("exec", {"session": "moved", "lang": "python", "code":
                        "import sys\nprint(os.environ['MOVED_ENV'], 'MPLBACKEND' in os.environ)\n"
                        "print(os.environ['PYTHONPATH'])\nprint([p for p in sys.path "
                        "if '/packages/' in p])"})["results"][0]
    kept, pypath, pkgs = out["stdout"].splitlines()
    assert kept == "kept False", out
    assert "/packages/moved/" in pypath and "/packages/src/" not in pypath, out
    assert "/packages/src/" not in pkgs and "/packages/moved/" in pkgs, out
    # Bash comes back in the same directory of its new workspace
    out = c.ok("exec", {"session": "moved", "lang": "bash",
                        "code": "echo $word; cat f; echo ${PWD#$(dirname $PWD)/}"})["results"][0]
    assert out["stdout"] == "moved\ndeep\nsub\n", out
    assert out["kernel"]["state_preserved"] is True, out["kernel"]
    out = c.ok("exec", {"session": "moved", "lang": "bash", "code":
                        "echo $WORD_ENV ${PAGER-unset}; echo $NODE_PATH; echo $PATH"}
               )["results"][0]
    kept, node_path, path = out["stdout"].splitlines()
    assert kept == "yes unset", out
    for p in (node_path, path):
        assert "/packages/moved/" in p and "/packages/src/" not in p, out
    assert "/moved/" in c.ok("exec", {"session": "moved", "lang": "bash",
                                      "code": "pwd"})["results"][0]["stdout"]
    e = c.error("session.import", {"session": "moved", "offset": 0, "final": True,
                                   "data": base64.b64encode(good).decode()})
    assert "exists" in e["message"], e
    # the source is untouched and still works
    out = c.ok("exec", {"session": "src", "lang": "python", "code": "print(x)"})["results"][0]
    assert out["stdout"] == "41\n", out
