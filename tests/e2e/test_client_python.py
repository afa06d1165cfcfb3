"""The Python client (clients/python, imported as `kernelmgr`) against the
real daemon in a home of its own, and `kernelmgr files get|put|ls|rm`.

The daemon of the module's home is started by the client itself (its
auto-start, with the explicit binary path), so that path is tested by
every test here."""
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import kutil
import mgrutil

sys.path.insert(0, str(kutil.ROOT / "clients" / "python" / "src"))
import kernelmgr  # noqa: E402
from kernelmgr import AsyncSession, Session  # noqa: E402

KM = mgrutil.KM


@pytest.fixture(scope="module")
def home():
    m = mgrutil.Mgr()
    yield m
    m.close()


def session(home, name=None, **kw):
    return Session(name, home=str(home.home), kernelmgr=KM, **kw)


def run_cli(home, *args, input=None, cwd=None):
    # cwd: where a `files get` without -o writes (default: the home, removed after)
    return subprocess.run([KM, *args], input=input, capture_output=True, env=home.env,
                          timeout=120, cwd=str(cwd or home.home))


# ------------------------------------------------------------------ runs


def test_run_python_and_bash(home):
    with session(home) as s:
        ex = s.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n6 * 7",
                   lang="python")
        assert (ex.status, ex.exit_code, ex.error) == ("ok", 0, None), ex
        assert ex.stdout == "out\n" and ex.stderr == "err\n", ex
        assert ex.text == "42" and ex.results[0].is_main_result, ex.results
        assert ex.logs.stdout == ["out\n"] and ex.logs.stderr == ["err\n"], ex.logs
        ex = s.run("echo from-bash; ls /nonexistent-km", lang="bash")
        assert ex.stdout == "from-bash\n" and "nonexistent-km" in ex.stderr, ex
        assert ex.exit_code == 2 and ex.status == "error", ex
        # state persists across runs, and both languages share the workspace
        s.run("open('shared.txt', 'w').write('hello')", lang="python")
        assert s.run("cat shared.txt", lang="bash").stdout == "hello"
        # the session's default language
    with session(home, lang="bash") as b:
        assert b.run("echo $((6*7))").stdout == "42\n"


def test_streaming_callbacks_in_order_while_the_cell_runs(home):
    with session(home) as s:
        go = Path(s.workspace) / "go"
        seen = []

        def on_stdout(text):
            seen.append(("stdout", text))
            if text.startswith("first"):
                go.touch()  # the cell waits for this: it can only come from a live stream

        code = ("import os, sys, time\n"
                "print('first', flush=True)\n"
                "while not os.path.exists('go'):\n"
                "    time.sleep(0.01)\n"
                "print('oops', file=sys.stderr, flush=True)\n"
                "print('second', flush=True)\n"
                "'done'")
        ex = s.run(code, lang="python", timeout=60, on_stdout=on_stdout,
                   on_stderr=lambda t: seen.append(("stderr", t)),
                   on_result=lambda r: seen.append(("result", r.text)))
        assert ex.status == "ok", ex
        kinds = [k for k, _ in seen]
        assert kinds[-1] == "result" and seen[-1][1] == "'done'", seen
        assert "".join(t for k, t in seen if k == "stdout") == "first\nsecond\n", seen
        # (stdout and stderr are separate streams: no order between them)
        assert [t for k, t in seen if k == "stderr"] == ["oops\n"], seen
        assert ex.stdout == "first\nsecond\n" and ex.stderr == "oops\n", ex


def test_error_fields(home):
    with session(home) as s:
        ex = s.run("def f():\n    return 1 / 0\nf()", lang="python")
        assert ex.status == "error" and ex.exit_code == 1, ex
        e = ex.error
        assert e.name == "ZeroDivisionError" and e.value == "division by zero", e
        assert isinstance(e.traceback, list) and any("f()" in line for line in e.traceback), e
        assert str(e) == "ZeroDivisionError: division by zero"
        # the session works on
        assert s.run("1 + 1", lang="python").text == "2"


def test_rich_results_and_png(home):
    with session(home) as s:
        ex = s.run("from IPython.display import display, HTML\n"
                   "display(HTML('<b>x</b>'))\n"
                   "import base64\n"
                   "class P:\n"
                   "    def _repr_png_(self):\n"
                   "        return base64.b64decode("
                   "'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n"
                   "P()", lang="python")
        assert ex.status == "ok", ex
        assert ex.results[0].html == "<b>x</b>" and not ex.results[0].is_main_result
        main = ex.results[-1]
        assert main.is_main_result and main.png and main.png_bytes()[:4] == b"\x89PNG", main


def test_interrupt_from_another_thread(home):
    with session(home) as s:
        s.run("x = 5", lang="python")
        threads = []

        def on_stdout(text):
            if "spinning" in text:
                t = threading.Thread(target=s.interrupt)
                t.start()
                threads.append(t)

        ex = s.run("print('spinning', flush=True)\nwhile True:\n    pass", lang="python",
                   timeout=120, on_stdout=on_stdout)
        for t in threads:
            t.join(30)
        assert ex.error is not None and ex.error.name == "KeyboardInterrupt", ex
        assert ex.status == "error", ex
        again = s.run("x + 1", lang="python")
        assert again.text == "6" and again.kernel.get("state_preserved") is True, again


def test_restart_loses_state_keeps_files(home):
    with session(home) as s:
        s.run("y = 1\nopen('kept.txt', 'w').write('k')", lang="python")
        s.restart()
        ex = s.run("y", lang="python")
        assert ex.error is not None and ex.error.name == "NameError", ex
        assert s.files.read("kept.txt") == b"k"


def test_files_round_trip_5mb_binary(home):
    data = os.urandom(5 << 20)
    with session(home) as s:
        assert s.files.write("data/blob.bin", data) == len(data)
        assert s.files.read("data/blob.bin") == data
        info = [f for f in s.files.list() if f.path == "data/blob.bin"]
        assert info and info[0].size == len(data) and info[0].type == "file", info
        ex = s.run("import hashlib\nhashlib.sha256(open('data/blob.bin','rb').read()).hexdigest()",
                   lang="python")
        assert ex.text == repr(hashlib.sha256(data).hexdigest()), ex
        # text, empty, below a directory, a file object
        s.files.write("t.txt", "héllo\n")
        assert s.files.read_text("t.txt") == "héllo\n"
        s.files.write("empty", b"")
        assert s.files.read("empty") == b""
        assert [f.path for f in s.files.list("data")] == ["data/blob.bin"]
        s.files.remove("data/blob.bin")
        assert not s.files.exists("data/blob.bin") and s.files.exists("t.txt")
        with pytest.raises(kernelmgr.UsageError) as ei:
            s.files.read("data/blob.bin")
        assert "no such file" in ei.value.message and ei.value.km_code == 2
        with pytest.raises(kernelmgr.KernelmgrError) as ei:
            s.files.write("../escape", b"x")
        assert ".." in ei.value.message
        with pytest.raises(kernelmgr.UsageError) as ei:
            s.files.remove("data/x/y")
        assert "no such file" in ei.value.message


def test_options_errors_are_typed(home):
    cases = [({"memory": "1K"}, 'field "memory"'),
             ({"frobnicate": 1}, 'unknown field "frobnicate"'),
             ({"network": "maybe"}, 'field "network"'),
             ({"cpus": "two"}, 'field "cpus"')]
    for opts, want in cases:
        with pytest.raises(kernelmgr.InvalidParamsError) as ei:
            session(home, **opts)
        e = ei.value
        assert e.code == -32602 and e.km_code == 2 and want in e.message, (opts, e)
    with session(home, memory="512M", env={"GREETING": "hi"}) as s:
        assert s.run("echo $GREETING", lang="bash").stdout == "hi\n"
        with pytest.raises(kernelmgr.InvalidParamsError) as ei:
            s.run("1", lang="cobol")
        assert "cobol" in ei.value.message
    with pytest.raises(kernelmgr.KernelmgrError) as ei:
        session(home, "bad/name")
    assert "bad/name" in ei.value.message


def test_context_manager_closes(home):
    with session(home) as s:
        name, ws = s.name, Path(s.workspace)
        s.run("40 + 2", lang="python")
        assert ws.is_dir()
        assert name in [x["name"] for x in Session.list(str(home.home))]
        nb = s.export()
        assert nb["nbformat"] == 4 and "40 + 2" in json.dumps(nb["cells"]), nb
    assert s.closed and not ws.exists()
    assert name not in [x["name"] for x in Session.list(str(home.home))]
    p = run_cli(home, "sessions", "--json")
    assert name.encode() not in p.stdout, p.stdout
    with pytest.raises(kernelmgr.SessionClosedError):
        s.run("1")
    s.close()  # twice is harmless


# ------------------------------------------------------------------ asyncio


def test_async_session(home):
    async def main():
        chunks = []

        async def on_stdout(text):
            chunks.append(text)

        async with AsyncSession(home=str(home.home), kernelmgr=KM) as s:
            ex = await s.run("print('a')\n2 ** 10", lang="python", on_stdout=on_stdout)
            assert ex.text == "1024" and chunks == ["a\n"], (ex, chunks)
            ex = await s.run("echo b; false", lang="bash")
            assert ex.stdout == "b\n" and ex.exit_code == 1, ex
            blob = os.urandom(3 << 20)
            await s.files.write("a.bin", blob)
            assert await s.files.read("a.bin") == blob
            await s.files.remove("a.bin")
            assert [f.path for f in await s.files.list()] == []

            started = asyncio.Event()
            task = asyncio.ensure_future(s.run(
                "print('spin', flush=True)\nwhile True:\n    pass", lang="python", timeout=120,
                on_stdout=lambda t: started.set()))
            await asyncio.wait_for(started.wait(), 60)
            await s.interrupt()
            ex = await asyncio.wait_for(task, 60)
            assert ex.error is not None and ex.error.name == "KeyboardInterrupt", ex
            assert (await s.run("3", lang="python")).text == "3"
            assert s.name in [x["name"] for x in await AsyncSession.list(str(home.home))]
            assert (await s.export())["nbformat"] == 4
            with pytest.raises(kernelmgr.InvalidParamsError):
                await AsyncSession.create(home=str(home.home), kernelmgr=KM, memory="1K")
        assert s.closed

    asyncio.run(main())


# ------------------------------------------------------------------ finding the daemon


def test_autostart_binary_resolution(make_mgr, monkeypatch):
    m = make_mgr()
    assert Session.list(str(m.home)) == []  # no daemon: none started for a listing
    assert not (m.home / "kernelmgr.sock").exists()
    with pytest.raises(kernelmgr.DaemonUnavailableError) as ei:
        Session(home=str(m.home), autostart=False)
    assert "no daemon is running" in ei.value.message
    with pytest.raises(kernelmgr.DaemonUnavailableError) as ei:
        Session(home=str(m.home), kernelmgr="/nonexistent/kernelmgr")
    assert "/nonexistent/kernelmgr" in ei.value.message
    # $KERNELMGR_HOME and $KERNELMGR_BIN, as the CLI resolves the home
    monkeypatch.setenv("KERNELMGR_HOME", str(m.home))
    monkeypatch.setenv("KERNELMGR_BIN", KM)
    with Session() as s:
        assert s.home == str(m.home) and s.run("1 + 2", lang="python").text == "3"
    assert m.daemon_pid() is not None


def test_home_not_ours_alone_is_refused(make_mgr):
    m = make_mgr()
    os.chmod(m.home, 0o777)
    try:
        with pytest.raises(kernelmgr.KernelmgrError) as ei:
            Session(home=str(m.home), kernelmgr=KM)
        assert "writable by group or others" in ei.value.message
    finally:
        os.chmod(m.home, 0o700)


def test_pip_install_offline_into_a_venv(home, tmp_path):
    venv = tmp_path / "venv"
    # Debian's pip into the venv (--python): a venv's own pip is the same
    # pip, and seeding one costs the test half a minute. The build is
    # pip's isolated one, with no index: the backend is the tree's.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    p = subprocess.run(["/usr/bin/python3", "-m", "pip", "--python", str(venv / "bin" / "python"),
                        "install", "--no-index", "--no-cache-dir",
                        str(kutil.ROOT / "clients" / "python")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "kernelmgr" / "py.typed").exists()
    record = next(site.glob("kernelmgr-*.dist-info")) / "RECORD"
    assert "kernelmgr/session.py,sha256=" in record.read_text()
    code = ("import kernelmgr, sys\n"
            "assert kernelmgr.__file__.startswith(sys.prefix), kernelmgr.__file__\n"
            f"with kernelmgr.Session(home={str(home.home)!r}, kernelmgr={KM!r}) as s:\n"
            "    print(s.run('21 * 2', lang='python').text)\n")
    p = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path))
    assert p.returncode == 0 and p.stdout == "42\n", p.stdout + p.stderr


def test_agent_loop_example(home):
    env = dict(home.env, KERNELMGR_BIN=KM)
    p = subprocess.run([sys.executable, str(kutil.ROOT / "examples" / "agent_loop.py")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert lines[1]["stdout"] == "5\n6\n9\n" and lines[2]["result"] == "3.875", lines
    assert lines[3]["error"].startswith("NameError"), lines
    assert [f["path"] for f in lines[4]] == ["nums.txt"], lines


# ------------------------------------------------------------------ the CLI


def test_cli_files_get_put_round_trip(home, tmp_path):
    with session(home, "clifiles") as s:
        src = tmp_path / "in.bin"
        # a put sends 4 MiB per call: two calls exactly (the empty read after
        # them sends nothing), two with one byte in the second, and one
        for size in (8 << 20, (4 << 20) + 1):
            big = os.urandom(size)
            src.write_bytes(big)
            p = run_cli(home, "files", "put", "clifiles", str(src), "big.bin")
            assert p.returncode == 0 and f"({size} bytes".encode() in p.stdout, p
            assert s.files.read("big.bin") == big
        blob = os.urandom((3 << 20) + 12345)  # more than one chunk of a get
        src.write_bytes(blob)
        p = run_cli(home, "files", "put", "clifiles", str(src), "sub/in.bin")
        assert p.returncode == 0 and b"3158073 bytes" in p.stdout, p
        assert s.files.read("sub/in.bin") == blob
        out = tmp_path / "out.bin"
        p = run_cli(home, "files", "get", "clifiles", "sub/in.bin", "-o", str(out))
        assert p.returncode == 0, p
        assert out.read_bytes() == blob
        # into a directory: the file's own name; -o -: stdout
        p = run_cli(home, "files", "get", "clifiles", "sub/in.bin", "-o", str(tmp_path))
        assert p.returncode == 0 and (tmp_path / "in.bin").read_bytes() == blob, p
        p = run_cli(home, "files", "put", "clifiles", "-", "note.txt", input=b"\x00\xffnote")
        assert p.returncode == 0, p
        p = run_cli(home, "files", "get", "clifiles", "note.txt", "-o", "-")
        assert p.returncode == 0 and p.stdout == b"\x00\xffnote", p
        here = tmp_path / "here"
        here.mkdir()
        p = run_cli(home, "files", "get", "clifiles", "note.txt", "--json", cwd=here)
        assert p.returncode == 0 and json.loads(p.stdout)["size"] == 6, p
        assert [x.name for x in here.iterdir()] == ["note.txt"], p
        p = run_cli(home, "files", "ls", "clifiles", "sub", "--json")
        assert [f["path"] for f in json.loads(p.stdout)["files"]] == ["sub/in.bin"], p
        p = run_cli(home, "files", "rm", "clifiles", "note.txt")
        assert p.returncode == 0 and not s.files.exists("note.txt"), p
        # `files NAME` still lists
        p = run_cli(home, "files", "clifiles")
        assert p.returncode == 0 and b"sub/in.bin" in p.stdout, p


def test_cli_files_errors(home, tmp_path):
    with session(home, "clierr"):
        cases = [
            (("files", "get", "clierr", "missing.bin", "-o", str(tmp_path / "m")), 2,
             'cannot read missing.bin from session "clierr": \'missing.bin\': no such file'),
            (("files", "get", "nosuch", "x"), 3, 'no session named "nosuch"'),
            (("files", "put", "clierr", str(tmp_path / "absent")), 2,
             f"cannot read {tmp_path}/absent: No such file or directory"),
            (("files", "put", "clierr", str(tmp_path)), 2, "it is a directory"),
            (("files", "put", "clierr", "-"), 2, "give the workspace PATH"),
            (("files", "get", "clierr"), 2, "usage: kernelmgr files get NAME PATH"),
            (("files", "get", "clierr", "../etc/passwd"), 2, "paths stay inside the workspace"),
            (("files", "rm", "clierr", "missing"), 2, "cannot remove missing"),
        ]
        for args, status, want in cases:
            p = run_cli(home, *args)
            assert p.returncode == status and want.encode() in p.stderr, (args, p)
        # a local file that cannot be written: nothing is left behind
        run_cli(home, "files", "put", "clierr", "-", "f.txt", input=b"data")
        p = run_cli(home, "files", "get", "clierr", "f.txt", "-o", str(tmp_path / "no" / "f"))
        assert p.returncode == 7 and b"cannot write" in p.stderr, p
        ro = tmp_path / "ro"
        ro.mkdir()
        (ro / "f.txt").write_bytes(b"old")
        p = run_cli(home, "files", "get", "clierr", "missing", "-o", str(ro / "f.txt"))
        assert p.returncode == 2 and (ro / "f.txt").read_bytes() == b"old", p
        assert [x.name for x in ro.iterdir()] == ["f.txt"]  # no partial file
        p = run_cli(home, "files", "get", "clierr", "missing", "--json")
        assert json.loads(p.stdout)["error"]["code"] == 2, p


def test_build_backend_wheel_and_sdist(tmp_path):
    """The in-tree PEP 517 backend: a wheel whose RECORD matches its files,
    byte-identical when built twice, and an sdist that builds the same
    wheel again."""
    import base64
    import tarfile
    import zipfile
    src = kutil.ROOT / "clients" / "python"
    hook = ("import sys; sys.path.insert(0, '_build'); import kmbuild; "
            "print(getattr(kmbuild, sys.argv[1])(sys.argv[2]))")

    def build(where, kind, out):
        p = subprocess.run([sys.executable, "-c", hook, kind, str(out)], cwd=str(where),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return out / p.stdout.strip()

    w1 = build(src, "build_wheel", tmp_path / "w1")
    w2 = build(src, "build_wheel", tmp_path / "w2")
    assert w1.name == "kernelmgr-0.1.0-py3-none-any.whl"
    assert w1.read_bytes() == w2.read_bytes()
    with zipfile.ZipFile(w1) as z:
        names = z.namelist()
        record = z.read("kernelmgr-0.1.0.dist-info/RECORD").decode()
        rows = [line.split(",") for line in record.splitlines()]
        assert sorted(r[0] for r in rows) == sorted(names)
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = z.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + want and int(size) == len(data), name
        meta = z.read("kernelmgr-0.1.0.dist-info/METADATA").decode()
        assert "Name: kernelmgr\nVersion: 0.1.0\n" in meta
        assert "Tag: py3-none-any" in z.read("kernelmgr-0.1.0.dist-info/WHEEL").decode()
        assert "kernelmgr/py.typed" in names and not any("__pycache__" in n for n in names)
    sd = build(src, "build_sdist", tmp_path / "sd")
    with tarfile.open(sd) as t:
        t.extractall(tmp_path / "x")
    tree = tmp_path / "x" / "kernelmgr-0.1.0"
    assert (tree / "PKG-INFO").read_text().startswith("Metadata-Version: 2.1\nName: kernelmgr")
    w3 = build(tree, "build_wheel", tmp_path / "w3")
    assert w3.read_bytes() == w1.read_bytes()


def test_a_restarted_daemon_is_reconnected(make_mgr):
    """Pooled connections to a daemon that stopped are not reused: the next
    call starts a new daemon, and the session is back (files kept)."""
    m = make_mgr()

    async def arun(s):
        return (await s.run("6 * 7", lang="python")).text

    with Session("back", home=str(m.home), kernelmgr=KM) as s:
        s.files.write("kept.txt", b"k")
        assert s.run("1", lang="python").text == "1"
        a = AsyncSession("back", home=str(m.home), kernelmgr=KM)
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(arun(a)) == "42"
            assert m.run("serve", "--stop", timeout=60).returncode == 0
            ex = s.run("2", lang="python")
            assert ex.text == "2" and s.files.read("kept.txt") == b"k", ex
            assert loop.run_until_complete(arun(a)) == "42"
            loop.run_until_complete(a.close(keep=True))
        finally:
            loop.close()


def test_daemon_start_waits_for_a_stopping_daemon(make_mgr):
    """A daemon started (by a client's auto-start) while the last one still
    stops its kernels — its lock held, its socket already gone — waits for
    the lock and serves, rather than exiting "a daemon already serves"."""
    import fcntl
    import time
    m = make_mgr()
    lock = os.open(str(m.home / "daemon.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the stopping daemon
    p = subprocess.Popen([KM, "serve"], env=m.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        # it is waiting once it has slept a few times in its lock loop
        end = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < end:
            try:
                with open(f"/proc/{p.pid}/status") as f:
                    sw = [int(x.split()[1]) for x in f if x.startswith("voluntary_ctxt")]
            except OSError:
                sw = [0]
            if sw and sw[0] >= 5 and not (m.home / "kernelmgr.sock").exists():
                break
            time.sleep(0.02)
        assert p.poll() is None, p.stderr.read()
        fcntl.flock(lock, fcntl.LOCK_UN)
        end = time.monotonic() + 60
        while not (m.home / "kernelmgr.sock").exists():
            assert p.poll() is None and time.monotonic() < end, "the daemon did not come up"
            time.sleep(0.05)
        with Session(home=str(m.home), autostart=False) as s:
            assert s.run("7", lang="python").text == "7"
    finally:
        os.close(lock)
        m.run("serve", "--stop", timeout=60)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_ctrl_c_in_run_interrupts_the_cell(home):
    """KeyboardInterrupt in the thread waiting in run() (Ctrl-C) interrupts
    the cell and is re-raised; the session keeps its state."""
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(kutil.ROOT / "clients" / "python" / "src")!r})
import kernelmgr
with kernelmgr.Session(home={str(home.home)!r}, kernelmgr={KM!r}) as s:
    s.run("z = 9", lang="python")
    def on_stdout(text):
        if "spinning" in text:
            os.kill(os.getpid(), signal.SIGINT)
    try:
        s.run("print('spinning', flush=True)\\nwhile True:\\n    pass", lang="python",
              timeout=120, on_stdout=on_stdout)
        print("not interrupted")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    print(s.run("z", lang="python").text)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and p.stdout == "KeyboardInterrupt\n9\n", p.stdout + p.stderr
