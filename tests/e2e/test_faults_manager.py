"""Fault injection, manager side: a result never claims what is not true.

Each test runs the real CLI and daemon (mgrutil.Mgr) and checks the honest
result, that the next operation works, and that nothing is left behind
(temp files, processes of a finished run).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mgrutil import KM, have_kernel  # noqa: E402
import apiutil  # noqa: E402
import kutil  # noqa: E402

pytestmark = pytest.mark.skipif(not (have_kernel("python") and have_kernel("bash")),
                                reason="kernels not built")

ROOT = Path(__file__).resolve().parents[2]


def poll(cond, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def one(mgr, session, code, *args, **kw):
    rc, res, p = mgr.exec(session, code, *args, **kw)
    assert len(res) == 1, (rc, p.stdout, p.stderr)
    return res[0]


def assert_state(mgr, session, var, value):
    """The session still works and kept its state."""
    r = one(mgr, session, f"print({var})", "--lang", "python")
    assert r["status"] == "ok", r
    assert r["stdout"].strip() == str(value)
    assert r["kernel"]["restarted"] is False and r["kernel"]["state_preserved"] is True


def leftovers(mgr):
    """Temp files of the manager's own writes anywhere under its home."""
    return [str(p) for p in mgr.home.rglob("*")
            if re.search(r"\.tmp(\.|$)", p.name) and "workspace" not in p.parts]


def procs_of(home):
    """Processes whose command line names this home (kernels of a run)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(home) in cmd and "pytest" not in cmd:
            out.append((int(d.name), cmd[:200]))
    return out


def no_run_left(mgr):
    poll(lambda: not procs_of(mgr.run_dir) and not procs_of(mgr.home / "sessions"),
         what="the run's kernels to exit")
    assert not list((mgr.home / "sessions").glob("run-*"))


def history(mgr, session):
    path = mgr.home / "sessions" / session / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_error_member(r):
    """error is null, or exactly name/value/traceback (+ the documented extras)."""
    e = r["error"]
    if r["status"] == "ok":
        assert e is None, r
        return
    assert isinstance(e, dict), r
    assert {"name", "value", "traceback"} <= set(e), e
    assert set(e) <= {"name", "value", "traceback", "timeout", "value_omitted_bytes"}, e
    assert isinstance(e["name"], str) and e["name"]
    assert isinstance(e["value"], str)
    assert isinstance(e["traceback"], list)
    assert all(isinstance(t, str) for t in e["traceback"]), e


# ------------------------------------------------------------------ 1. output write errors


def test_run_and_exec_to_a_full_device_exit_7(make_mgr):
    mgr = make_mgr()
    with open("/dev/full", "w") as full:
        p = subprocess.run([KM, "run", "--lang", "python", "-c", "print(1)"], stdout=full,
                           stderr=subprocess.PIPE, text=True, env=mgr.env, timeout=120)
    assert p.returncode == 7, p.stderr
    assert "kernelmgr: cannot write the output: No space left on device" in p.stderr
    no_run_left(mgr)
    # --json too, and exec through the daemon
    assert one(mgr, "s", "x = 41")["status"] == "ok"
    with open("/dev/full", "w") as full:
        p = subprocess.run([KM, "exec", "--session", "s", "--json", "-c", "print(x)"],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=mgr.env,
                           timeout=120)
    assert p.returncode == 7, p.stderr
    assert "cannot write the output: No space left on device" in p.stderr
    # other commands' output is checked as well
    with open("/dev/full", "w") as full:
        p = subprocess.run([KM, "export", "s", "-o", "-"], stdout=full, stderr=subprocess.PIPE,
                           text=True, env=mgr.env, timeout=60)
    assert p.returncode == 7 and "No space left on device" in p.stderr
    assert_state(mgr, "s", "x", 41)
    assert not leftovers(mgr)


def test_run_into_a_closed_pipe_is_not_a_success(make_mgr):
    mgr = make_mgr()
    t0 = time.monotonic()
    p = subprocess.run(f"'{KM}' run --lang bash -c 'yes' | head -c 10 >/dev/null; "
                       "echo ${PIPESTATUS[0]} >&2", shell=True, executable="/bin/bash",
                       stderr=subprocess.PIPE, text=True, env=mgr.env, timeout=120)
    status = int(p.stderr.strip().splitlines()[-1])
    assert status != 0, p.stderr
    assert status in (7, 128 + signal.SIGPIPE), p.stderr
    assert "cannot write the output: Broken pipe" in p.stderr
    assert time.monotonic() - t0 < 60, "the endless cell was not stopped"
    no_run_left(mgr)
    # exec: the cell is interrupted (nobody reads it) and the session goes on
    assert one(mgr, "s", "y = 7")["status"] == "ok"
    p = subprocess.run(f"'{KM}' exec --session s --lang python -c "
                       "'import sys\nwhile True: sys.stdout.write(\"z\" * 4096)' "
                       "| head -c 10 >/dev/null; echo ${PIPESTATUS[0]} >&2", shell=True,
                       executable="/bin/bash", stderr=subprocess.PIPE, text=True, env=mgr.env,
                       timeout=120)
    assert int(p.stderr.strip().splitlines()[-1]) == 7, p.stderr
    assert "cannot write the output: Broken pipe" in p.stderr
    assert_state(mgr, "s", "y", 7)
    assert not leftovers(mgr)


# ------------------------------------------------------------------ 2./3. code checks


BAD_UTF8 = b"print('ok')\n# caf\xe9\n"  # latin-1: byte 17 is invalid


def test_invalid_utf8_and_nul_are_refused_before_the_kernel(make_mgr, tmp_path):
    mgr = make_mgr()
    bad = tmp_path / "bad.py"
    bad.write_bytes(BAD_UTF8)
    p = mgr.run("run", str(bad))
    assert p.returncode == 2, p.stderr
    assert "code is not valid UTF-8 (byte 17)" in p.stderr
    no_run_left(mgr)
    assert one(mgr, "s", "x = 41")["status"] == "ok"
    n_hist = len(history(mgr, "s"))
    p = mgr.run("exec", "--session", "s", str(bad))
    assert p.returncode == 2 and "code is not valid UTF-8 (byte 17)" in p.stderr, p.stderr
    assert "ioctl" not in p.stderr
    p = subprocess.run([KM, "exec", "--session", "s", "-"], input=b"print(1)\0", env=mgr.env,
                       capture_output=True, timeout=60)
    assert p.returncode == 2 and b"code contains a NUL byte (byte 8)" in p.stderr, p.stderr
    # nothing reached the session: same state, same history
    assert len(history(mgr, "s")) == n_hist
    assert_state(mgr, "s", "x", 41)
    assert not leftovers(mgr)


def daemon_ask(mgr, method, params):
    """One API request; its response (result or error)."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(mgr.home / "kernelmgr.sock"))
    f = s.makefile("rw")
    f.write(apiutil.line(method, params))
    f.flush()
    while True:
        line = f.readline()
        assert line, "the daemon closed the connection"
        o = json.loads(line)
        if apiutil.is_response(o):
            s.close()
            return o


def test_code_max_is_one_check_for_run_exec_and_the_daemon(make_mgr, tmp_path):
    mgr = make_mgr({"code_max": "4K"})
    code = "x = 1\n" + "#" * 5000 + "\n"
    p = mgr.run("run", "--lang", "python", "-c", code)
    assert p.returncode == 2 and "code is 5007 bytes, more than code_max (4 KiB)" in p.stderr
    no_run_left(mgr)
    assert one(mgr, "s", "x = 41")["status"] == "ok"
    (tmp_path / "big.py").write_text(code)
    p = mgr.run("exec", "--session", "s", str(tmp_path / "big.py"))
    assert p.returncode == 2 and "code is 5007 bytes, more than code_max (4 KiB)" in p.stderr
    # a client that skips the CLI's check meets the daemon's (MCP goes this way too)
    rep = daemon_ask(mgr, "exec", {"session": "s", "code": code})
    # KM_EUSAGE (2) in the server range: -32002, data.km_code 2
    assert rep["error"]["code"] == -32002 and rep["error"]["data"]["km_code"] == 2, rep
    assert "more than code_max (4 KiB)" in rep["error"]["message"]
    assert_state(mgr, "s", "x", 41)


def test_50_mb_of_code_is_refused_quickly_with_the_default_limit(make_mgr, tmp_path):
    mgr = make_mgr()
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (50 << 20))
    assert one(mgr, "s", "x = 41")["status"] == "ok"
    t0 = time.monotonic()
    p = mgr.run("exec", "--session", "s", str(big))
    assert p.returncode == 2, p.stderr
    assert "code is 52428800 bytes, more than code_max (16 MiB)" in p.stderr
    assert time.monotonic() - t0 < 30
    p = mgr.run("run", "-", input=open(big).read())
    assert p.returncode == 2 and "52428800 bytes" in p.stderr
    assert_state(mgr, "s", "x", 41)


# ------------------------------------------------------------------ 4. json_pack and error keys


def pack_arity(fmt):
    """Arguments a jansson pack format consumes (keys included)."""
    n, i, stack = 0, 0, []
    key_next = []
    while i < len(fmt):
        c = fmt[i]
        if c in " \t\n,:":
            i += 1
            continue
        if c in "{[":
            stack.append(c)
            key_next.append(c == "{")
            i += 1
            continue
        if c in "}]":
            stack.pop()
            key_next.pop()
            i += 1
            if key_next and stack[-1] == "{":
                key_next[-1] = True
            continue
        if stack and stack[-1] == "{" and key_next[-1]:
            assert c == "s", f"bad key in {fmt!r}"
            n += 1
            i += 1
            if i < len(fmt) and fmt[i] in "#%":
                n, i = n + 1, i + 1
            key_next[-1] = False
            continue
        if c == "s":
            n, i = n + 1, i + 1
            if i < len(fmt) and fmt[i] in "#%":
                n, i = n + 1, i + 1
            while i < len(fmt) and fmt[i] == "+":
                n, i = n + 1, i + 1
                if i < len(fmt) and fmt[i] in "#%":
                    n, i = n + 1, i + 1
        elif c in "biIfoO":
            n, i = n + 1, i + 1
        elif c == "n":
            i += 1
        else:
            raise AssertionError(f"unknown {c!r} in {fmt!r}")
        if i < len(fmt) and fmt[i] in "?*":
            i += 1
        if stack and stack[-1] == "{":
            key_next[-1] = True
    return n


def call_args(src, start):
    depth, args, cur, j = 0, [], "", start
    while j < len(src):
        c = src[j]
        if c in "([{":
            depth += 1
            if depth > 1:
                cur += c
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return args
            cur += c
        elif c in "\"'":
            k = j + 1
            while src[k] != c:
                k += 2 if src[k] == "\\" else 1
            cur += src[j:k + 1]
            j = k
        elif c == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
        j += 1
    raise AssertionError("unterminated call")


def test_every_json_pack_format_matches_its_arguments():
    """A format that consumes more varargs than given is undefined behaviour
    (it once made an error object with a "KernelKilled": [] key)."""
    bad, seen = [], 0
    for sub in ("kernelmgr", "kernels", "protocol"):
        for f in sorted((ROOT / sub).rglob("*.c")):
            src = f.read_text()
            for m in re.finditer(r"\bjson_pack(_ex)?\s*\(", src):
                args = call_args(src, m.end() - 1)
                if m.group(1):
                    args = args[2:]
                strs = re.findall(r'"((?:[^"\\]|\\.)*)"', args[0])
                line = src.count("\n", 0, m.start()) + 1
                if not strs or re.sub(r'"((?:[^"\\]|\\.)*)"', "", args[0]).strip():
                    bad.append(f"{f}:{line}: format is not a literal")
                    continue
                fmt = "".join(strs)
                seen += 1
                if pack_arity(fmt) != len(args) - 1:
                    bad.append(f"{f}:{line}: {fmt!r} takes {pack_arity(fmt)} arguments, "
                               f"{len(args) - 1} given")
    assert seen > 50
    assert not bad, "\n".join(bad)


def test_each_error_result_kind_has_exactly_name_value_traceback(make_mgr, tmp_path):
    fake_py = tmp_path / "notpython"
    fake_py.write_text("#!/bin/sh\nexit 3\n")
    fake_py.chmod(0o755)
    mgr = make_mgr({"interrupt_grace": 1, "languages": ["python", "bash"]})
    kinds = {}
    kinds["exception"] = one(mgr, "s", "1/0", "--lang", "python")
    assert kinds["exception"]["error"]["name"] == "ZeroDivisionError"
    kinds["bash"] = one(mgr, "s", "false", "--lang", "bash")
    kinds["timeout"] = one(mgr, "s", "import time\ntime.sleep(30)", "--lang", "python",
                           "--timeout", "1")
    assert kinds["timeout"]["status"] == "timeout"
    # a cell that ignores the interrupt: killed, state lost
    kinds["killed"] = one(mgr, "s", "import signal, time\n"
                          "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                          "while True: time.sleep(0.1)", "--lang", "python", "--timeout", "1",
                          timeout=120)
    assert kinds["killed"]["status"] == "killed", kinds["killed"]
    # the worker dies under the cell (whatever the sandbox level: it kills
    # itself; its parent is the sandbox's init under strict)
    kinds["died"] = one(mgr, "s2", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"
                        "import time; time.sleep(10)", "--lang", "python", timeout=120)
    assert kinds["died"]["status"] in ("killed", "error"), kinds["died"]
    # the kernel server dies under the cell (killed from outside)
    one(mgr, "s3", "1", "--lang", "python")
    cell = subprocess.Popen([KM, "exec", "--session", "s3", "--lang", "python", "--json", "-c",
                             "import time\nprint('started', flush=True)\ntime.sleep(60)"],
                            env=mgr.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    server = None
    while server is None:
        assert time.monotonic() < deadline and cell.poll() is None
        for q in kutil.descendants(mgr.daemon_pid()):
            try:
                argv = Path(f"/proc/{q}/cmdline").read_bytes().split(b"\0")
                # with its worker: its child, or in the session's sandbox
                if argv[0].endswith(b"/kernel-python") and b"s3" in b" ".join(argv) and \
                        (Path(f"/proc/{q}/task/{q}/children").read_text().strip() or
                         kutil.session_worker_pid(q)):
                    busy = any("started" in l for l in (mgr.home / "sessions" / "s3" /
                                                         "history.jsonl").read_text().splitlines())
                    if busy:
                        server = q
                        break
            except OSError:
                pass
        time.sleep(0.05)
    os.kill(server, signal.SIGKILL)
    out, err = cell.communicate(timeout=120)
    kinds["server_died"] = json.loads(out.strip().splitlines()[-1])
    assert kinds["server_died"]["status"] in ("killed", "error"), kinds["server_died"]
    # a kernel that cannot start
    bad = make_mgr({"python": str(fake_py), "start_timeout": 10})
    kinds["start"] = one(bad, "s", "1", "--lang", "python", timeout=120)
    assert kinds["start"]["error"]["name"] == "KernelStartError", kinds["start"]
    # a language the configuration does not allow
    only_py = make_mgr({"languages": ["python"]})
    kinds["lang"] = one(only_py, "s", "echo hi", "--lang", "bash")
    assert kinds["lang"]["error"]["name"] == "LanguageNotAllowed"
    for kind, r in kinds.items():
        assert r["status"] != "ok", (kind, r)
        check_error_member(r)
        assert "KernelKilled" not in r["error"] and "Timeout" not in r["error"], (kind, r)
    assert kinds["timeout"]["error"]["timeout"] is True
    # after all of it, the sessions work
    assert one(mgr, "s", "print(2)", "--lang", "python")["status"] == "ok"
    assert one(mgr, "s2", "print(2)", "--lang", "python")["status"] == "ok"


# ------------------------------------------------------------------ 5. history and export


def test_torn_history_record_is_recovered_and_export_is_never_silent(make_mgr):
    mgr = make_mgr()
    for i in range(3):
        assert one(mgr, "s", f"print({i})", "--lang", "python")["status"] == "ok"
    hist = mgr.home / "sessions" / "s" / "history.jsonl"
    n = len(hist.read_text().splitlines())
    # a torn last record (a crash, a full disk): the next append recovers it
    with open(hist, "a") as f:
        f.write('{"language": "python", "code": "tor')
    assert one(mgr, "s", "print(3)", "--lang", "python")["status"] == "ok"
    recs = history(mgr, "s")  # every line parses: nothing glued
    assert len(recs) == n + 2, "a complete record was lost in the recovery"
    # a corrupt line in the middle: export says so, and marks the place
    lines = hist.read_text().splitlines(keepends=True)
    lines.insert(2, '{"language": "python", "co\n')
    hist.write_text("".join(lines))
    out = mgr.home / "s.ipynb"
    p = mgr.run("export", "s", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "export: skipped 1 unreadable history record (line 3)" in p.stderr
    nb = json.loads(out.read_text())
    cells = nb["cells"]
    assert [c["cell_type"] for c in cells].count("code") == 4
    md = [c for c in cells if c["cell_type"] == "markdown"]
    assert len(md) == 1 and "line 3 could not be read" in "".join(md[0]["source"])
    assert cells.index(md[0]) == 1  # where the record was
    assert nb["metadata"]["kernelmgr"]["unreadable_records"] == [3]
    assert one(mgr, "s", "print(4)", "--lang", "python")["status"] == "ok"
    assert not leftovers(mgr)


def test_cell_running_when_the_daemon_died_is_in_the_export(make_mgr):
    mgr = make_mgr()
    assert one(mgr, "s", "x = 1", "--lang", "python")["status"] == "ok"
    client = subprocess.Popen([KM, "exec", "--session", "s", "--lang", "python", "-c",
                               "import time\nprint('partial', flush=True)\ntime.sleep(60)"],
                              env=mgr.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        poll(lambda: any(r.get("event") == "started" and "partial" in r["code"]
                         for r in history(mgr, "s")), what="the started record")
        os.kill(mgr.daemon_pid(), signal.SIGKILL)
        client.wait(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode != 0
    # the next operation works (a fresh daemon, a fresh kernel that says so)
    r = one(mgr, "s", "print('after')", "--lang", "python")
    assert r["status"] == "ok" and r["stdout"] == "after\n"
    assert r["kernel"]["state_preserved"] is False
    out = mgr.home / "s.ipynb"
    p = mgr.run("export", "s", "-o", str(out))
    assert p.returncode == 0, p.stderr
    cells = json.loads(out.read_text())["cells"]
    assert len(cells) == 3
    died = cells[1]
    assert "partial" in "".join(died["source"])
    assert died["metadata"]["kernelmgr"]["status"] == "unknown"
    assert died["outputs"][0]["output_type"] == "error"
    assert died["outputs"][0]["evalue"] == \
        "the daemon stopped while this cell ran; its output is unknown"
    assert "".join(cells[2]["outputs"][0]["text"]) == "after\n"
    assert not leftovers(mgr)


# ------------------------------------------------------------------ 7. failed creation


def test_failed_session_creation_leaves_nothing_behind(make_mgr):
    mgr = make_mgr()
    p = mgr.run("exec", "--session", "p", "--python", "/nonexistent/python3", "-c", "1")
    assert p.returncode == 2 and "--python /nonexistent/python3: no such file" in p.stderr
    assert not (mgr.home / "sessions" / "p").exists()
    # session.json cannot be written (here: a directory is in the way)
    sdir = mgr.home / "sessions" / "q"
    (sdir / "session.json").mkdir(parents=True)
    p = mgr.run("exec", "--session", "q", "-c", "1")
    assert p.returncode == 6, p.stderr
    assert "cannot create session \"q\"" in p.stderr and "session.json" in p.stderr
    assert sorted(x.name for x in sdir.iterdir()) == ["session.json"]  # no workspace, no tmp
    assert not leftovers(mgr)
    assert "q" not in mgr.run("sessions").stdout
    (sdir / "session.json").rmdir()
    r = one(mgr, "q", "print(1)", "--lang", "python")
    assert r["status"] == "ok" and r["stdout"] == "1\n"
    assert one(mgr, "p", "print(2)", "--lang", "python")["status"] == "ok"
    assert not leftovers(mgr)


# ------------------------------------------------------------------ 8. a killed client's cell


def test_exec_waiting_for_a_killed_clients_cell_says_so(make_mgr):
    mgr = make_mgr()
    assert one(mgr, "s", "x = 1", "--lang", "python")["status"] == "ok"
    client = subprocess.Popen([KM, "exec", "--session", "s", "--lang", "python", "-c",
                               "import time\nprint('a', flush=True)\ntime.sleep(4)\n"
                               "x = 2\nprint('b')"],
                              env=mgr.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert client.stdout.readline() == b"a\n"
    client.kill()
    client.wait()
    rc, res, p = mgr.exec("s", "print(x)", "--lang", "python")
    assert rc == 0, p.stderr
    # the killed client's cell ran to its end: its state and its history are there
    assert res[0]["stdout"] == "2\n"
    assert "waiting for a cell started by another" in p.stderr, p.stderr
    w = res[0]["waited"]
    assert w["seconds"] > 0.5
    assert re.match(r"waited \d+\.\d s for a cell started by another (client|request)",
                    w["message"]), w
    done = [r for r in history(mgr, "s") if r.get("event") == "finished"]
    assert any(o.get("text") == "a\nb\n" for r in done for o in r["outputs"]), done
    # no wait, no note
    rc, res, p = mgr.exec("s", "print(3)", "--lang", "python")
    assert rc == 0 and "waited" not in res[0] and "waiting" not in p.stderr


def test_code_max_applies_to_mcp_code_exec(make_mgr):
    mgr = make_mgr({"code_max": "4K"})
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "0"}}
    p = subprocess.Popen([KM, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=mgr.env)

    def call(id_, code):
        msg = {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
               "params": {"_meta": meta, "name": "code_exec",
                          "arguments": {"code": code, "language": "python", "session": "m"}}}
        p.stdin.write(json.dumps(msg).encode() + b"\n")
        p.stdin.flush()
        return json.loads(p.stdout.readline())["result"]

    try:
        assert call(1, "x = 41")["isError"] is False
        r = call(2, "x = 0\n" + "#" * 5000)
        assert r["isError"] is True
        assert "code is 5006 bytes, more than code_max (4 KiB)" in r["content"][0]["text"]
        r = call(3, "print(x)")
        assert r["isError"] is False and "41" in r["content"][0]["text"]
    finally:
        p.stdin.close()
        p.wait(30)
        p.stdout.close()
        p.stderr.close()
