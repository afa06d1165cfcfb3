"""kernelmgr end to end: the real binary, the real kernels, the daemon, the
real jupyter_client / nbformat / nbclient."""
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402
from mgrutil import Mgr  # noqa: E402

needs_python = pytest.mark.skipif(not mgrutil.have_kernel("python"),
                                  reason="build/kernel-python not built")
needs_bash = pytest.mark.skipif(not mgrutil.have_kernel("bash"),
                                reason="build/kernel-bash not built")


@pytest.fixture
def mgr():
    m = Mgr()
    yield m
    m.close()


# ------------------------------------------------------------------ run / exit codes

@needs_python
def test_run_python_result_json(mgr):
    rc, res, p = mgr.results("run", "--lang", "python", "-c", "x = 6 * 7\nprint('hi')\nx")
    assert rc == 0, p.stderr
    (r,) = res
    for key in ("session", "language", "status", "execution_count", "exit_code", "stdout",
                "stderr", "result", "displays", "error", "files", "truncated", "duration_ms",
                "kernel"):
        assert key in r
    assert r["language"] == "python" and r["status"] == "ok" and r["exit_code"] == 0
    assert r["stdout"] == "hi\n"
    assert r["result"]["text/plain"] == "42"
    assert r["kernel"] == {"restarted": False, "state_preserved": True, "reason": None}


@needs_python
def test_structured_error_and_exit_status(mgr):
    rc, res, _ = mgr.results("run", "-c", "def f():\n    return 1/0\nf()")
    assert rc == 1
    (r,) = res
    assert r["status"] == "error" and r["exit_code"] == 1
    assert r["error"]["name"] == "ZeroDivisionError"
    assert "division by zero" in r["error"]["value"]
    assert any("f()" in line for line in r["error"]["traceback"])
    assert not any("\x1b[" in line for line in r["error"]["traceback"])
    # readable rendering shows the traceback
    p = mgr.run("run", "-c", "1/0")
    assert p.returncode == 1 and "ZeroDivisionError" in p.stdout


@needs_python
def test_help_page_is_a_display(mgr):
    # `obj?` with ipython on: IPython's help comes as the reply's "page"
    # payload (as from ipykernel); the result shows it as a display, without
    # colours. Off (the default), the stdlib path shows it as a display itself.
    for opt in ("on", "off"):
        rc, res, p = mgr.results("run", "--ipython", opt, "--lang", "python", "-c", "len?")
        assert rc == 0, p.stderr
        (r,) = res
        [d] = r["displays"]
        assert "Return the number of items" in d["text/plain"], (opt, d)
        assert "\x1b[" not in d["text/plain"], (opt, d)


@needs_python
def test_ipython_option_session_and_config(mgr):
    """The `ipython` option: off by default (IPython, importable here, is
    not imported by plain cells); the session option `--ipython on` runs
    every cell through IPython's shell (automagic, `_i` history, %timeit as
    ipykernel); the configuration's `"ipython": true` does for every new
    session; a session keeps its own."""
    rc, res, p = mgr.exec("dflt", "import sys\n'IPython' in sys.modules", "--lang", "python")
    assert rc == 0 and res[0]["result"]["text/plain"] == "False", (p.stderr, res)
    rc, res, p = mgr.exec("ipy", "x = 6 * 7", "--lang", "python", "--ipython", "on")
    assert rc == 0, p.stderr
    rc, res, p = mgr.exec("ipy", "import sys\n('IPython' in sys.modules, "
                                 "type(get_ipython()).__name__, _i)", "--lang", "python")
    assert res[0]["result"]["text/plain"] == "(True, 'KShell', 'x = 6 * 7')", res
    rc, res, p = mgr.exec("ipy", "pwd", "--lang", "python")  # automagic
    assert rc == 0 and res[0]["result"]["text/plain"].startswith("'/"), res
    rc, res, p = mgr.exec("ipy", "%timeit -n1 -r1 x", "--lang", "python")
    assert rc == 0 and "per loop" in res[0]["stdout"], res
    # an existing session keeps its own: the other value is reported, not applied
    rc, res, p = mgr.exec("ipy", "1", "--lang", "python", "--ipython", "off")
    assert any("--ipython" in w for w in res[0].get("warnings", [])), res
    rc, res, p = mgr.exec("dflt", "import sys\n'IPython' in sys.modules", "--lang", "python")
    assert res[0]["result"]["text/plain"] == "False", res
    p = mgr.run("exec", "--session", "bad", "--ipython", "maybe", "-c", "1")
    assert p.returncode == 2 and "--ipython must be on or off" in p.stderr, p.stderr


@needs_python
def test_ipython_config_key():
    m = Mgr({"ipython": True})
    try:
        rc, res, p = m.results("run", "--lang", "python", "-c",
                               "import sys\n'IPython' in sys.modules, _ih[-1]")
        assert rc == 0 and res[0]["result"]["text/plain"].startswith("(True, "), (p.stderr, res)
        rc, res, p = m.results("run", "--ipython", "off", "--lang", "python", "-c",
                               "import sys\n'IPython' in sys.modules")
        assert rc == 0 and res[0]["result"]["text/plain"] == "False", (p.stderr, res)
    finally:
        m.close()


def test_bad_cli_usage(mgr):
    for args in (["frobnicate"], ["run"], ["run", "--lang", "cobol", "-c", "1"],
                 ["run", "--timeout", "-3", "-c", "1"], ["exec", "-c", "1"],
                 ["run", "--memory", "lots", "-c", "1"], ["run", "--bogus"],
                 ["exec", "--session", "../evil", "-c", "1"], ["close"]):
        p = mgr.run(*args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stderr.startswith("kernelmgr: "), (args, p.stderr)
    p = mgr.run("close", "nosuchsession")
    assert p.returncode == 3 and "no session" in p.stderr


@pytest.mark.parametrize("cfg,needle", [
    ('{"timeout": "soon"}', "timeout"),
    ('{"memroy": "1G"}', "memroy: unknown key"),
    ('{"languages": ["python", "cobol"]}', "languages"),
    ('{"network": "maybe"}', "network"),
    ('{"sandbox": "loose"}', "sandbox"),
    ('[1, 2]', "object"),
    ('{"timeout": 5,', "invalid JSON"),
])
def test_bad_config_refused(mgr, cfg, needle):
    (mgr.home / "config.json").write_text(cfg)
    p = mgr.run("run", "-c", "1")
    assert p.returncode == 2
    assert "invalid configuration" in p.stderr and needle in p.stderr, p.stderr
    # --config names a file explicitly; a missing one is an error too
    p = mgr.run("run", "--config", str(mgr.home / "nope.json"), "-c", "1")
    assert p.returncode == 2 and "nope.json" in p.stderr


@needs_python
def test_language_not_allowed(mgr):
    cfg = json.loads((mgr.home / "config.json").read_text())
    cfg["languages"] = ["python"]
    (mgr.home / "config.json").write_text(json.dumps(cfg))
    rc, res, _ = mgr.results("run", "--lang", "bash", "-c", "echo hi")
    assert rc == 1 and res[0]["error"]["name"] == "LanguageNotAllowed"


# ------------------------------------------------------------------ markdown routing

QUICK_MD = """# Analysis

Some prose with `inline code`.

```python
import csv
with open("data.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\\n")
    w.writerow(["n", "sq"])
    for i in range(5):
        w.writerow([i, i * i])
print("wrote")
```

```text
this is not code
```

```bash
wc -l data.csv
X=from_bash
```

```console
$ echo "$X" && tail -n 1 data.csv
4,16
```

```py
print(open("data.csv").read().splitlines()[-1])
```
"""


@needs_python
@needs_bash
def test_markdown_routing_shared_workspace(mgr):
    rc, res, p = mgr.results("run", "-", input=QUICK_MD)
    assert rc == 0, p.stderr + p.stdout
    assert [r["language"] for r in res] == ["python", "bash", "bash", "python"]
    assert res[0]["stdout"] == "wrote\n"
    assert any(f["path"] == "data.csv" and f["change"] == "created" and f["mime"] == "text/csv"
               for f in res[0]["files"])
    assert res[1]["stdout"].strip() == "6 data.csv"
    assert res[2]["stdout"] == "from_bash\n4,16\n"   # prompt stripped, output line dropped
    assert res[3]["stdout"] == "4,16\n"


@needs_python
@needs_bash
def test_first_failure_stops_unless_continue(mgr):
    md = "```bash\nfalse\n```\n\n```python\nprint('after')\n```\n"
    rc, res, p = mgr.results("run", "-", input=md)
    assert rc == 1 and len(res) == 1
    assert res[0]["status"] == "error" and res[0]["exit_code"] == 1
    rc, res, p = mgr.results("run", "--continue-on-error", "-", input=md)
    assert rc == 1 and len(res) == 2 and res[1]["stdout"] == "after\n"


# ------------------------------------------------------------------ persistent sessions

@needs_python
def test_python_state_persists_across_cli_calls(mgr):
    rc, res, p = mgr.exec("s1", "import math\nv = math.sqrt(81)")
    assert rc == 0, p.stderr
    rc, res, _ = mgr.exec("s1", "v + 1")
    assert res[0]["result"]["text/plain"] == "10.0"
    rc, res, _ = mgr.exec("other", "'v' in dir()")
    assert res[0]["result"]["text/plain"] == "False"
    p = mgr.run("sessions", "--json")
    names = {s["name"] for s in json.loads(p.stdout)}
    assert {"s1", "other"} <= names
    # restart: state cleared, workspace kept
    mgr.exec("s1", "open('keep.txt', 'w').write('x')")
    assert mgr.run("restart", "s1").returncode == 0
    rc, res, _ = mgr.exec("s1", "import os\nprint('v' in dir(), os.path.exists('keep.txt'))")
    assert res[0]["stdout"] == "False True\n"
    # close removes the workspace
    ws = json.loads(mgr.run("files", "s1", "--json").stdout)["workspace"]
    assert Path(ws, "keep.txt").exists()
    assert mgr.run("close", "s1").returncode == 0
    assert not Path(ws).exists()
    assert mgr.run("files", "s1").returncode == 3


@needs_bash
def test_bash_state_persists_and_exit_code(mgr):
    rc, res, p = mgr.exec("b", "export GREETING=hello; cd /; mkdir -p /tmp/x; cd - >/dev/null",
                          "--lang", "bash")
    assert rc == 0, p.stderr + p.stdout
    rc, res, _ = mgr.exec("b", "echo $GREETING; (exit 3)", "--lang", "bash")
    assert res[0]["stdout"] == "hello\n"
    assert res[0]["exit_code"] == 3 and res[0]["status"] == "error" and rc == 1


# ------------------------------------------------------------------ limits

@needs_python
def test_timeout_sleeping_loop_keeps_state(mgr):
    mgr.exec("t", "keep = 'yes'")
    rc, res, p = mgr.exec("t", "import time\nprint('started', flush=True)\n"
                               "while True:\n    time.sleep(0.05)", "--timeout", "1.5")
    assert rc == 1
    r = res[0]
    assert r["status"] == "timeout" and r["exit_code"] == 124
    assert "started" in r["stdout"]                     # output before the timeout is kept
    assert r["kernel"]["restarted"] is False and r["kernel"]["state_preserved"] is True
    rc, res, _ = mgr.exec("t", "keep")
    assert res[0]["result"]["text/plain"] == "'yes'"


@needs_python
def test_timeout_sigint_ignoring_loop_state_lost():
    m = Mgr({"interrupt_grace": 1})
    try:
        m.exec("t", "keep = 'yes'")
        rc, res, p = m.exec("t", "import signal, time\n"
                                 "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                 "print('stubborn', flush=True)\n"
                                 "while True:\n    time.sleep(0.05)", "--timeout", "1",
                            timeout=60)
        assert rc == 1
        r = res[0]
        assert r["status"] == "killed", r
        assert r["kernel"]["state_preserved"] is False
        assert r["kernel"]["reason"]
        assert "stubborn" in r["stdout"]
        rc, res, _ = m.exec("t", "'keep' in dir()")
        assert res[0]["status"] == "ok"
        assert res[0]["result"]["text/plain"] == "False"
    finally:
        m.close()


@needs_python
def test_output_flood_capped_with_complete_spill(mgr):
    code = "import sys\nfor i in range(200000):\n    sys.stdout.write('line %06d\\n' % i)\n"
    rc, res, p = mgr.results("run", "-c", code)
    assert rc == 0, p.stderr
    r = res[0]
    t = r["truncated"]["stdout"]
    assert t["total_bytes"] == 200000 * 12
    assert t["kept_bytes"] <= 64 * 1024
    assert len(r["stdout"].encode()) < 64 * 1024 + 512
    assert r["stdout"].startswith("line 000000\n")
    assert r["stdout"].endswith("line 199999\n")
    assert "bytes omitted" in r["stdout"]
    spill = Path(t["spill"]).read_text()
    assert spill == "".join("line %06d\n" % i for i in range(200000))


@needs_python
def test_invalid_utf8_is_sanitised(mgr):
    rc, res, p = mgr.results("run", "-c",
                             "import os\nos.write(1, b'ok \\xff\\xfe bad\\n')\n"
                             "os.write(2, b'\\xc3\\x28\\n')")
    assert rc == 0, p.stderr
    r = res[0]
    assert r["stdout"].startswith("ok ") and "bad" in r["stdout"]
    assert "\ufffd" in r["stdout"]
    json.dumps(r)  # valid JSON all the way


# ------------------------------------------------------------------ files

@needs_python
def test_file_reporting_symlink_not_followed(mgr):
    code = ("import os\nos.makedirs('out', exist_ok=True)\n"
            "open('out/a.txt', 'w').write('hello')\n"
            "os.symlink('/etc/passwd', 'pw')\n"
            "os.mkfifo('fifo')\n"
            "open('gone.txt', 'w').write('x')\n")
    rc, res, p = mgr.exec("f", code)
    assert rc == 0, p.stderr
    files = {f["path"]: f for f in res[0]["files"]}
    assert files["out/a.txt"]["change"] == "created" and files["out/a.txt"]["size"] == 5
    assert files["out/a.txt"]["mime"] == "text/plain"
    pw = files["pw"]
    assert pw["mime"] == "inode/symlink" and pw["target"] == "/etc/passwd"
    assert pw["size"] == len("/etc/passwd")  # the link, not /etc/passwd's size
    assert files["fifo"]["mime"] == "inode/fifo"
    rc, res, _ = mgr.exec("f", "import os\nos.remove('gone.txt')\n"
                               "open('out/a.txt', 'a').write(' world')")
    changes = {f["path"]: f["change"] for f in res[0]["files"]}
    assert changes == {"gone.txt": "deleted", "out/a.txt": "modified"}
    listing = json.loads(mgr.run("files", "f", "--json").stdout)
    assert {"out/a.txt", "pw", "fifo"} <= {f["path"] for f in listing["files"]}


@needs_python
def test_huge_tree_bounded(mgr):
    rc, res, _ = mgr.exec("h", "import os\nos.makedirs('many')\n"
                               "for i in range(300):\n    open(f'many/{i:04d}', 'w').close()")
    r = res[0]
    assert len(r["files"]) == 100 and r["files_omitted"] == 200


@needs_python
def test_plot_saved_as_image_file(mgr):
    code = ("import matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3])\nplt.savefig('plot.png')\nplt.show()\n")
    rc, res, p = mgr.exec("img", code, timeout=120)
    assert rc == 0, p.stderr + json.dumps(res)
    r = res[0]
    assert any(f["path"] == "plot.png" and f["mime"] == "image/png" for f in r["files"])
    assert r["displays"] and "image/png" in r["displays"][0]
    assert r["images"] and r["images"][0]["mime"] == "image/png"
    for img in r["images"]:
        assert Path(img["path"]).read_bytes().startswith(b"\x89PNG")
    p = mgr.run("exec", "--session", "img", "-c", "plt.plot([3, 1]); plt.show()")
    assert "saved to" in p.stdout and ".png" in p.stdout


# ------------------------------------------------------------------ lifecycle

@needs_python
def test_auto_restart_after_kernel_killed(mgr):
    mgr.exec("k", "x = 1")
    info = json.loads(mgr.run("sessions", "--json").stdout)
    pid = [s for s in info if s["name"] == "k"][0]["kernels"]["python"]["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    rc, res, p = mgr.exec("k", "'x' in dir()")
    assert rc == 0, p.stderr
    r = res[0]
    assert r["result"]["text/plain"] == "False"
    assert r["kernel"]["restarted"] is True and r["kernel"]["state_preserved"] is False
    assert "died" in r["kernel"]["reason"]
    rc, res, _ = mgr.exec("k", "1")
    assert res[0]["kernel"]["restarted"] is False


@needs_python
def test_daemon_restart_keeps_workspace_and_state(mgr):
    mgr.exec("d", "open('note.txt', 'w').write('persist')\nx = 1")
    pid = mgr.daemon_pid()
    os.kill(pid, signal.SIGTERM)
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    rc, res, p = mgr.exec("d", "import os\nprint(open('note.txt').read(), 'x' in dir())")
    assert rc == 0, p.stderr
    assert mgr.daemon_pid() != pid
    r = res[0]
    # the stopping daemon snapshotted the session; the new one restored it
    # before running the cell (docs/LIFECYCLE.md "State model")
    assert r["stdout"] == "persist True\n"
    k = r["kernel"]
    assert k["restarted"] is True and k["state_preserved"] is True, k
    assert k["restored"]["from"] == "snapshot" and k["restored"]["lost"] == [], k


@needs_python
def test_attach_with_jupyter_client_sees_agent_variables(mgr):
    from jupyter_client import BlockingKernelClient
    mgr.exec("a", "agent_var = {'answer': 42}")
    p = mgr.run("connection-file", "a", "--lang", "python")
    assert p.returncode == 0, p.stderr
    cf = p.stdout.strip()
    assert (os.stat(cf).st_mode & 0o777) == 0o600
    kc = BlockingKernelClient(connection_file=cf)
    kc.load_connection_file()
    kc.start_channels()
    outs = []
    try:
        kc.wait_for_ready(timeout=30)
        reply = kc.execute_interactive("print(agent_var['answer']); human_var = 7",
                                       timeout=30, output_hook=outs.append)
    finally:
        kc.stop_channels()
    assert reply["content"]["status"] == "ok"
    assert any(m["msg_type"] == "stream" and m["content"]["text"] == "42\n" for m in outs)
    rc, res, _ = mgr.exec("a", "human_var * 6")
    assert res[0]["result"]["text/plain"] == "42"


@needs_python
def test_export_validates_and_reruns_with_nbclient(mgr, tmp_path):
    import nbclient
    import nbformat
    mgr.exec("e", "import matplotlib.pyplot as plt\nvals = [1, 4, 9]\nprint(sum(vals))\n"
                  "plt.plot(vals)\nplt.show()", timeout=120)
    mgr.exec("e", "vals[-1]")
    mgr.exec("e", "1/0")
    if mgrutil.have_kernel("bash"):
        mgr.exec("e", "echo from-bash > b.txt; cat b.txt", "--lang", "bash")
    out = tmp_path / "e.ipynb"
    p = mgr.run("export", "e", "-o", str(out))
    assert p.returncode == 0, p.stderr
    nb = nbformat.read(str(out), as_version=4)
    nbformat.validate(nb)
    langs = [c.metadata["kernelmgr"]["language"] for c in nb.cells]
    assert langs[:3] == ["python", "python", "python"]
    assert nb.cells[0].outputs[0]["text"] == "14\n"
    assert any(o["output_type"] == "error" and o["ename"] == "ZeroDivisionError"
               for o in nb.cells[2].outputs)
    if "bash" in langs:
        assert nb.cells[3].source.startswith("%%bash")
    # drop the failing cell and re-run everything with the stock ipykernel
    nb.cells = [c for c in nb.cells if "1/0" not in c.source]
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=60,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "9"


@needs_python
def test_concurrent_executions_in_ten_sessions(mgr):
    mgr.exec("warm", "1")  # the daemon is up before the burst

    def one(i):
        return mgr.exec(f"c{i}", f"import time\ntime.sleep(0.5)\nv = {i}\nv * 10", timeout=180)

    with ThreadPoolExecutor(10) as ex:
        outs = list(ex.map(one, range(10)))
    for i, (rc, res, p) in enumerate(outs):
        assert rc == 0, p.stderr
        assert res[0]["result"]["text/plain"] == str(i * 10)
    # executions in one session are serialised: both see the other's effect
    with ThreadPoolExecutor(2) as ex:
        a = ex.submit(mgr.exec, "c0", "import time\nn = globals().get('n', 0)\n"
                                      "time.sleep(0.3)\nn = n + 1")
        b = ex.submit(mgr.exec, "c0", "import time\nn = globals().get('n', 0)\n"
                                      "time.sleep(0.3)\nn = n + 1")
        a.result(), b.result()
    rc, res, _ = mgr.exec("c0", "n")
    assert res[0]["result"]["text/plain"] == "2"


def test_daemon_protocol_errors(mgr):
    """The socket answers malformed requests with errors and stays up."""
    import socket
    mgr.run("sessions")  # does not start a daemon
    assert not (mgr.home / "kernelmgr.sock").exists()
    p = subprocess.Popen([mgrutil.KM, "serve"], env=mgr.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if (mgr.home / "kernelmgr.sock").exists():
                break
            time.sleep(0.05)
        assert (os.stat(mgr.home / "kernelmgr.sock").st_mode & 0o777) == 0o600
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(mgr.home / "kernelmgr.sock"))
        f = s.makefile("rw")

        def ask(line):
            f.write(line + "\n")
            f.flush()
            return json.loads(f.readline())

        # JSON-RPC 2.0 (docs/API.md): standard errors, then the server range
        assert ask("not json")["error"]["code"] == -32700
        assert ask('{"jsonrpc": "2.0", "id": 1, "method": "nope"}')["error"]["code"] == -32601
        r = ask('{"jsonrpc": "2.0", "id": 2, "method": "exec", "params": {"session": "x"}}')
        assert r["error"]["code"] == -32602 and 'missing field "code"' in r["error"]["message"]
        assert ask('{"jsonrpc": "2.0", "id": 7, "method": "close", '
                   '"params": {"session": "ghost"}}') == {
            "jsonrpc": "2.0", "id": 7,
            "error": {"code": -32003, "message": 'no session named "ghost"',
                      "data": {"km_code": 3}}}
        r = ask('{"jsonrpc": "2.0", "method": "ping", "id": "p"}')
        assert r["id"] == "p" and r["result"]["api_version"] == 1
        s.close()
    finally:
        p.terminate()
        p.wait(20)
