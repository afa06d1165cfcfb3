"""build/kernel-python end to end: the real jupyter_client, jupyter console and
nbclient against the kernel server + Python backend."""
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

import kutil
from kutil import of_type, stream_text
from test_python_driver import plain

# One switch for the sandbox level of every test here ("strict" once the
# sandbox lands everywhere).
KM_TEST_SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")
SANDBOX_ARGS = ["--sandbox", KM_TEST_SANDBOX]
SYS_PY = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(not os.path.exists(kutil.binary("kernel-python")),
                                reason="build/kernel-python not built")


@pytest.fixture
def py(kernel_factory):
    """A Python kernel on Debian's python3 (numpy, pandas, matplotlib, jedi)."""
    return kernel_factory("python", args=[*SANDBOX_ARGS, "--python", SYS_PY])


@pytest.fixture(params=["off", "on"])
def py2(request, kernel_factory):
    """The same on both paths: --ipython off (the default, the stdlib path)
    and on (every cell through IPython's shell, as ipykernel); .ipython
    says which."""
    k = kernel_factory("python", args=[*SANDBOX_ARGS, "--python", SYS_PY,
                                       "--ipython", request.param])
    k.ipython = request.param == "on"
    return k


def run(k, code, **kw):
    _, r = k.execute(code, **kw)
    return r["reply"]["content"], r["iopub"]


def results(iopub):
    return [m["content"] for m in of_type(iopub, "execute_result")]


def kernel_info(k):
    k.kc.kernel_info()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = k.kc.get_shell_msg(timeout=20)
        if m["msg_type"] == "kernel_info_reply":
            return m["content"]
    raise TimeoutError("no kernel_info_reply")


def test_kernel_info(py):
    ki = kernel_info(py)
    assert ki["protocol_version"] == "5.3"
    li = ki["language_info"]
    v = "%d.%d.%d" % tuple(json.loads(subprocess.check_output(
        [SYS_PY, "-c", "import sys, json; print(json.dumps(sys.version_info[:3]))"])))
    assert li["name"] == "python" and li["version"] == v
    assert li["mimetype"] == "text/x-python" and li["file_extension"] == ".py"
    assert li["pygments_lexer"] == "ipython3"
    assert li["codemirror_mode"] == {"name": "ipython", "version": 3}
    assert li["nbconvert_exporter"] == "python"
    assert ki["implementation"] == "kernelmgr" and ki["implementation_version"]
    assert ki["interpreter"]["path"] == SYS_PY and ki["interpreter"]["source"] == "--python"
    assert SYS_PY in ki["banner"]


def test_execute_result_streams_and_count(py):
    c, io = run(py, "x = 6\nprint('hello')\nx * 7")
    assert c["status"] == "ok"
    assert stream_text(io) == "hello\n"
    [res] = results(io)
    assert res["data"]["text/plain"] == "42"
    assert res["execution_count"] == c["execution_count"]
    c2, io = run(py, "x;")
    assert c2["execution_count"] == c["execution_count"] + 1
    assert results(io) == []
    c, io = run(py, "y = x + 1")
    assert results(io) == []
    c, io = run(py, "y")
    assert results(io)[0]["data"]["text/plain"] == "7"


def test_error_message(py2):
    py = py2
    c, io = run(py, "def f():\n    raise ValueError('bad value')\nf()")
    assert c["status"] == "error"
    assert c["ename"] == "ValueError" and c["evalue"] == "bad value"
    [err] = [m["content"] for m in of_type(io, "error")]
    assert err["ename"] == "ValueError"
    if py.ipython:
        # IPython's traceback, coloured, as ipykernel sends it
        assert "\x1b[" in "\n".join(err["traceback"])
        tb = plain(err["traceback"])
        assert "driver.py" not in tb and "----> 2     raise ValueError('bad value')" in tb, tb
    else:
        tb = "\n".join(err["traceback"])
        assert "driver.py" not in tb and "raise ValueError('bad value')" in tb
        assert "\x1b[" not in tb
    c, io = run(py, "for i in range(3)\n    pass")
    assert c["status"] == "error" and c["ename"] == "SyntaxError"
    tb = "\n".join(c["traceback"])
    assert "for i in range(3)" in tb and "^" in tb and "line 1" in tb
    # the kernel goes on
    c, io = run(py, "'ok'")
    assert results(io)[0]["data"]["text/plain"] == "'ok'"


def test_fd_level_output_in_order(py):
    code = ("import os, subprocess, sys\nprint('1')\nos.system('echo 2')\n"
            "subprocess.run(['echo', '3'])\nsys.stdout.write('4\\n')\n"
            "os.write(1, b'5\\n')\nprint('e1', file=sys.stderr)\nos.system('echo e2 >&2');")
    c, io = run(py, code)
    assert c["status"] == "ok"
    assert stream_text(io) == "1\n2\n3\n4\n5\n"
    assert stream_text(io, "stderr") == "e1\ne2\n"


def test_display_and_update(py):
    code = ("class H:\n    def _repr_html_(self): return '<b>h</b>'\n"
            "h = display(H(), display_id='d1')\nh.update('changed')\n"
            "display('x', 'y')\nclear_output()\n")
    c, io = run(py, code)
    assert c["status"] == "ok"
    dd = of_type(io, "display_data")
    assert dd[0]["content"]["data"]["text/html"] == "<b>h</b>"
    assert dd[0]["content"]["transient"] == {"display_id": "d1"}
    [up] = of_type(io, "update_display_data")
    assert up["content"]["data"] == {"text/plain": "'changed'"}
    assert up["content"]["transient"] == {"display_id": "d1"}
    assert [m["content"]["data"]["text/plain"] for m in dd[1:]] == ["'x'", "'y'"]
    assert len(of_type(io, "clear_output")) == 1


def test_pandas_and_matplotlib(py):
    code = ("import pandas as pd, matplotlib.pyplot as plt\n"
            "plt.plot([1, 4, 9])\n"
            "pd.DataFrame({'col_a': [1, 2]})")
    c, io = run(py, code, timeout=90)
    assert c["status"] == "ok"
    [res] = results(io)
    assert "<table" in res["data"]["text/html"] and "col_a" in res["data"]["text/plain"]
    [img] = [m["content"] for m in of_type(io, "display_data")]
    assert img["data"]["image/png"].startswith("iVBORw0KGgo")
    c, io = run(py, "len(plt.get_fignums())")
    assert results(io)[0]["data"]["text/plain"] == "0"  # closed after being sent


def test_input_and_no_stdin(py):
    def answer(kc, m):
        assert m["msg_type"] == "input_request"
        kc.input("secret" if m["content"]["password"] else "ann")

    c, io = run(py, "import getpass\nname = input('who? ')\npw = getpass.getpass()\n"
                    "(name, pw)", allow_stdin=True, stdin_handler=answer)
    assert c["status"] == "ok", c
    assert results(io)[0]["data"]["text/plain"] == "('ann', 'secret')"
    c, io = run(py, "input('x')", allow_stdin=False)
    assert c["status"] == "error"
    assert "allow_stdin is false" in c["evalue"]


def interrupt(k):
    msg = k.kc.session.msg("interrupt_request", {})
    k.kc.control_channel.send(msg)
    return k.kc.get_control_msg(timeout=20)


def wait_for_stream(k, text, timeout=20):
    """Reads iopub until stream output containing text arrived (or timeout);
    returns the stream text seen. Used to know a cell is really running
    before interrupting it."""
    deadline = time.monotonic() + timeout
    seen = ""
    while text not in seen and time.monotonic() < deadline:
        try:
            m = k.kc.get_iopub_msg(timeout=1)
        except Exception:
            continue
        if m["msg_type"] == "stream":
            seen += m["content"]["text"]
    return seen


def test_interrupt_keeps_state(py):
    run(py, "kept = 123")
    msg_id = py.kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    seen = wait_for_stream(py, "sleeping")
    assert "sleeping" in seen
    assert interrupt(py)["msg_type"] == "interrupt_reply"
    r = py.collect(msg_id, timeout=30)
    assert r["reply"]["content"]["status"] == "error"
    assert r["reply"]["content"]["ename"] == "KeyboardInterrupt"
    c, io = run(py, "kept")
    assert results(io)[0]["data"]["text/plain"] == "123"


def test_complete_inspect_is_complete(py2):
    py = py2
    run(py, "import os\nmy_long_name = 1")
    py.kc.complete("my_lo", 5)
    m = py.kc.get_shell_msg(timeout=30)
    assert m["msg_type"] == "complete_reply" and m["content"]["status"] == "ok"
    assert "my_long_name" in m["content"]["matches"]
    assert m["content"]["cursor_start"] == 0 and m["content"]["cursor_end"] == 5
    py.kc.complete("os.pat", 6)
    m = py.kc.get_shell_msg(timeout=30)
    assert "path" in m["content"]["matches"] and m["content"]["cursor_start"] == 3
    py.kc.inspect("os.path.join", 8, detail_level=0)
    m = py.kc.get_shell_msg(timeout=30)
    assert m["msg_type"] == "inspect_reply" and m["content"]["found"] is True
    if py.ipython:
        # the name at the cursor as IPython's token_at_cursor finds it (ipykernel)
        assert "module 'posixpath'" in plain(m["content"]["data"]["text/plain"])
        py.kc.inspect("os.path.join", 12, detail_level=0)
        m = py.kc.get_shell_msg(timeout=30)
        assert "Signature: os.path.join(a, *p)" in plain(m["content"]["data"]["text/plain"])
    else:
        assert "join" in m["content"]["data"]["text/plain"]
    py.kc.inspect("no_such_thing", 3)
    m = py.kc.get_shell_msg(timeout=30)
    assert m["content"]["found"] is False
    for code, status in (("x = 1", "complete"), ("if x:", "incomplete"), ("x = = 1", "invalid")):
        py.kc.is_complete(code)
        m = py.kc.get_shell_msg(timeout=30)
        assert m["msg_type"] == "is_complete_reply" and m["content"]["status"] == status
        if status == "incomplete":
            assert m["content"]["indent"] == "    "


def test_many_lines_of_output(py):
    c, io = run(py, "for i in range(100000):\n    print(i)", timeout=120)
    assert c["status"] == "ok"
    out = stream_text(io)
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == 100001
    assert lines[:3] == ["0", "1", "2"] and lines[-2] == "99999"
    assert lines == [str(i) for i in range(100000)] + [""]


@pytest.mark.parametrize("code", ["import ctypes\nctypes.string_at(0)", "import os\nos._exit(7)"])
def test_worker_death_recovered(py, code):
    run(py, "before = 1")
    c, io = run(py, code, timeout=60)
    assert c["status"] == "error"
    # a fresh worker answers; the state was lost with the old one
    deadline = time.monotonic() + 30
    while True:
        c, io = run(py, "'back'", timeout=60)
        if c["status"] == "ok" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert results(io)[0]["data"]["text/plain"] == "'back'"
    c, io = run(py, "before")
    assert c["status"] == "error" and c["ename"] == "NameError"


# ------------------------------------------------------------ detection


def make_venv(path):
    subprocess.run([SYS_PY, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    site = subprocess.check_output(
        [str(path / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip()
    pkg = Path(site) / "onlyinvenv"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("WHERE = 'venv'\n")


def test_workspace_venv_detected(kernel_factory, tmp_path):
    ws = tmp_path / "k0" / "ws"
    make_venv(ws / ".venv")
    env = dict(os.environ)
    env.pop("VIRTUAL_ENV", None)
    env.pop("KERNELMGR_PYTHON", None)
    k = kernel_factory("python", args=SANDBOX_ARGS, env=env)
    assert k.workspace == ws
    ki = kernel_info(k)
    assert ki["interpreter"]["path"] == str(ws / ".venv" / "bin" / "python")
    assert ki["interpreter"]["venv"] is True and ki["interpreter"]["source"] == ".venv"
    c, io = run(k, "import onlyinvenv, sys\nprint(onlyinvenv.WHERE, sys.prefix)")
    assert c["status"] == "ok", c
    assert stream_text(io) == "venv %s\n" % (ws / ".venv")
    c, io = run(k, "import numpy")
    assert c["status"] == "error" and c["ename"] in ("ModuleNotFoundError", "ImportError")
    # completion without jedi (not in the venv): rlcompleter over the namespace
    run(k, "class K:\n    attr_one = 1\nk = K()")
    k.kc.complete("k.att", 5)
    m = k.kc.get_shell_msg(timeout=30)
    assert m["content"]["matches"] == ["attr_one"] and m["content"]["cursor_start"] == 2
    # subprocesses find the venv's interpreter first
    c, io = run(k, "import subprocess\nprint(subprocess.check_output(['python', '-c', "
                   "'import sys; print(sys.prefix)'], text=True).strip())")
    assert stream_text(io).strip() == str(ws / ".venv")


def test_shim_resolved(kernel_factory, tmp_path):
    shim = tmp_path / "shims" / "python3"
    shim.parent.mkdir()
    shim.write_text("#!/bin/sh\n# pyenv-style shim\nexec %s \"$@\"\n" % SYS_PY)
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (shim.parent, env.get("PATH", "/usr/bin:/bin"))
    env.pop("VIRTUAL_ENV", None)
    env.pop("KERNELMGR_PYTHON", None)
    k = kernel_factory("python", args=SANDBOX_ARGS, env=env)
    ki = kernel_info(k)
    assert ki["interpreter"]["path"] == SYS_PY and ki["interpreter"]["source"] == "PATH"
    c, io = run(k, "import sys\nsys.executable")
    assert results(io)[0]["data"]["text/plain"] == repr(SYS_PY)


def test_env_python_and_real_pyenv(kernel_factory, tmp_path):
    pyenv_shim = "/root/.pyenv/shims/python3"
    target = SYS_PY
    if os.path.exists(pyenv_shim) and os.access(pyenv_shim, os.X_OK):
        target = pyenv_shim
    env = dict(os.environ, KERNELMGR_PYTHON=target)
    k = kernel_factory("python", args=SANDBOX_ARGS, env=env)
    ki = kernel_info(k)
    assert ki["interpreter"]["source"] == "$KERNELMGR_PYTHON"
    assert "/shims/" not in ki["interpreter"]["path"]
    c, io = run(k, "import sys\nsys.executable")
    assert results(io)[0]["data"]["text/plain"] == repr(ki["interpreter"]["path"])


def start_expect_failure(tmp_path, args, env=None):
    from jupyter_client.connect import write_connection_file

    cf = str(tmp_path / "fail.json")
    write_connection_file(cf)
    ws = tmp_path / "fws"
    ws.mkdir(exist_ok=True)
    p = subprocess.run([kutil.binary("kernel-python"), "-f", cf, "--workspace", str(ws),
                        *SANDBOX_ARGS, *args], capture_output=True, text=True, timeout=60,
                       env=env)
    return p.returncode, p.stdout + p.stderr


def test_old_python_refused(tmp_path):
    fake = tmp_path / "oldpy" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho '{\"executable\": \"%s\", \"version\": \"3.7.3\", "
                    "\"version_full\": \"3.7.3\", \"prefix\": \"/o\", \"base_prefix\": \"/o\"}'\n"
                    % fake)
    fake.chmod(0o755)
    rc, out = start_expect_failure(tmp_path, ["--python", str(fake)])
    assert rc == 1
    assert "python 3.7.3 at %s is too old: kernelmgr needs Python >= 3.8" % fake in out


def test_missing_python_refused(tmp_path):
    rc, out = start_expect_failure(tmp_path, ["--python", "/nonexistent/python3"])
    assert rc == 1
    assert "python not found at /nonexistent/python3" in out
    env = dict(os.environ, KERNELMGR_PYTHON="", PATH="/nonexistent", VIRTUAL_ENV="")
    rc, out = start_expect_failure(tmp_path, [], env=env)
    assert rc == 1
    assert "no Python interpreter found" in out


# ------------------------------------------------------------ Jupyter tools


def test_jupyter_console_existing(py):
    p = subprocess.run(
        [SYS_PY, "-m", "jupyter_console", "--existing", py.cf, "--simple-prompt",
         "--ZMQTerminalInteractiveShell.include_other_output=False"],
        input="print('from console', 6 * 7)\nconsole_var = 5\n", capture_output=True,
        text=True, timeout=90, env=dict(os.environ, JUPYTER_RUNTIME_DIR=str(py.workdir)))
    assert "from console 42" in p.stdout, (p.stdout, p.stderr)
    c, io = run(py, "console_var")
    assert results(io)[0]["data"]["text/plain"] == "5"


def test_nbclient_notebook(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    spec_dir = tmp_path / "jp" / "kernels" / "kmtest-python"
    spec_dir.mkdir(parents=True)
    ws = tmp_path / "nbws"
    ws.mkdir()
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [kutil.binary("kernel-python"), "-f", "{connection_file}", "--workspace",
                 str(ws), *SANDBOX_ARGS, "--python", SYS_PY],
        "display_name": "kernelmgr Python (test)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jp"))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import pandas as pd\n"
                                  "pd.DataFrame({'name': ['a', 'b'], 'n': [1, 2]})"),
        nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\n"
                                  "plt.plot([1, 2, 3], [3, 1, 2])\nplt.title('t');"),
        nbformat.v4.new_code_cell("print('done')"),
    ]
    NotebookClient(nb, kernel_name="kmtest-python", timeout=120,
                   resources={"metadata": {"path": str(ws)}}).execute()
    out0 = nb.cells[0].outputs
    assert out0[0]["output_type"] == "execute_result"
    assert "<table" in out0[0]["data"]["text/html"] and "name" in out0[0]["data"]["text/plain"]
    out1 = nb.cells[1].outputs
    assert [o["output_type"] for o in out1] == ["display_data"]
    assert out1[0]["data"]["image/png"].startswith("iVBORw0KGgo")
    assert nb.cells[2].outputs[0]["text"] == "done\n"


def pyenv_pythons():
    """(version tuple, path) of pyenv-installed CPythons on this host, if any."""
    import glob
    import re

    found = []
    for p in glob.glob(os.path.expanduser("~/.pyenv/versions/*/bin/python3")):
        m = re.search(r"/versions/(\d+)\.(\d+)\.(\d+)/", p)
        if m and os.access(p, os.X_OK):
            found.append((tuple(int(x) for x in m.groups()), p))
    return sorted(found)


def other_pythons():
    ok = [p for p in pyenv_pythons() if p[0] >= (3, 8, 0)]
    picks = [ok[0], ok[-1]] if ok else []
    return [pytest.param(p, id="%d.%d" % v[:2]) for v, p in dict((v, p) for v, p in picks).items()]


@pytest.mark.parametrize("python", other_pythons() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no pyenv Pythons on this host"))])
def test_other_interpreters(kernel_factory, python):
    """The oldest and newest supported CPython the host has (without numpy/jedi)."""
    k = kernel_factory("python", args=[*SANDBOX_ARGS, "--python", python])
    ki = kernel_info(k)
    assert ki["interpreter"]["path"] == python
    c, io = run(k, "import sys\nclass K:\n    attr = 1\nk = K()\nprint(sys.version_info[:2])\n"
                   "1 / 0")
    assert c["ename"] == "ZeroDivisionError"
    assert "driver.py" not in "\n".join(c["traceback"])
    c, io = run(k, "display(k, display_id=True)\nk.attr")
    assert results(io)[0]["data"]["text/plain"] == "1"
    k.kc.complete("k.at", 4)
    m = k.kc.get_shell_msg(timeout=30)
    assert m["content"]["matches"] == ["attr"]


def test_real_old_python_refused(tmp_path):
    old = [p for p in pyenv_pythons() if (3, 0, 0) <= p[0] < (3, 8, 0)]
    if not old:
        pytest.skip("no Python 3 older than 3.8 on this host")
    v, path = old[-1]
    rc, out = start_expect_failure(tmp_path, ["--python", path])
    assert rc == 1
    assert "python %d.%d.%d at %s is too old: kernelmgr needs Python >= 3.8" % (v + (path,)) in out


def test_cell_ignoring_sigint_is_restarted(kernel_factory):
    k = kernel_factory("python", args=[*SANDBOX_ARGS, "--python", SYS_PY,
                                       "--interrupt-grace", "1"])
    run(k, "lost = 1")
    msg_id = k.kc.execute("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                          "print('ignoring', flush=True)\ntime.sleep(120)")
    wait_for_stream(k, "ignoring")
    assert interrupt(k)["msg_type"] == "interrupt_reply"
    r = k.collect(msg_id, timeout=60)
    c = r["reply"]["content"]
    assert c["status"] == "error"
    assert "restart" in (c["ename"] + c["evalue"]).lower()
    c, io = run(k, "'fresh'")
    assert results(io)[0]["data"]["text/plain"] == "'fresh'"
    c, io = run(k, "lost")
    assert c["ename"] == "NameError"


# ---------------------------------------------------------------- user_expressions, %%bash

def test_user_expressions(py):
    run(py, "a = 6")
    msg_id = py.kc.execute("b = a * 7", user_expressions={
        "prod": "a * b", "html": "type('H', (), {'_repr_html_': lambda s: '<b>x</b>'})()",
        "bad": "1/0", "syntax": "a +"})
    r = py.collect(msg_id, 30)
    c = r["reply"]["content"]
    assert c["status"] == "ok", c
    ue = c["user_expressions"]
    assert ue["prod"] == {"status": "ok", "data": {"text/plain": "252"}, "metadata": {}}
    assert ue["html"]["status"] == "ok" and ue["html"]["data"]["text/html"] == "<b>x</b>"
    assert ue["bad"]["status"] == "error" and ue["bad"]["ename"] == "ZeroDivisionError"
    assert ue["syntax"]["status"] == "error" and ue["syntax"]["ename"] == "SyntaxError"
    # silent executions get them too (frontends poll state that way); none
    # after a failed cell, as with ipykernel
    msg_id = py.kc.execute("", silent=True, user_expressions={"b": "b"})
    c = py.collect(msg_id, 30)["reply"]["content"]
    assert c["user_expressions"]["b"]["data"]["text/plain"] == "42"
    msg_id = py.kc.execute("1/0", user_expressions={"b": "b"})
    c = py.collect(msg_id, 30)["reply"]["content"]
    assert c["status"] == "error" and c["user_expressions"] == {}
    # a plain execute still has an (empty) user_expressions
    c, _ = run(py, "pass")
    assert c["user_expressions"] == {}


def test_bash_cell_magic(py2):
    py = py2
    c, io = run(py, "%%bash\nx=from-bash\necho $x\necho err >&2\nprintf '%s\\n' \"$0\" > /dev/null")
    assert c["status"] == "ok", c
    assert stream_text(io) == "from-bash\n"
    assert stream_text(io, "stderr") == "err\n"
    # files carry over to Python; a failing script raises CalledProcessError
    c, io = run(py, "%%bash\necho data > f.txt\nexit 3")
    assert c["status"] == "error"
    assert c["ename"] == "CalledProcessError" and "exit status 3" in c["evalue"]
    assert "driver.py" not in "\n".join(c["traceback"])
    c, io = run(py, "open('f.txt').read()")
    assert results(io)[0]["data"]["text/plain"] == "'data\\n'"
    c, io = run(py, "%%sh --no-raise-error\necho via-sh; exit 1")
    assert c["status"] == "ok" and stream_text(io) == "via-sh\n"
    c, io = run(py, "%%bash --bogus\necho x")
    if py.ipython:
        # IPython's script magic passes an unknown option to bash, which fails
        assert c["status"] == "error" and c["ename"] == "CalledProcessError", c
        assert "exit status 2" in c["evalue"] and "--bogus" in stream_text(io, "stderr")
    else:
        assert c["status"] == "error" and "--bogus" in c["evalue"]
    # other cell magics are IPython's: an unknown one is IPython's
    # UsageError, shown on stderr as IPython does
    c, io = run(py, "%%nosuchmagic\n1")
    assert c["status"] == "error"
    assert "UsageError: Cell magic `%%nosuchmagic` not found." in stream_text(io, "stderr")
    # an interrupt stops the script, the kernel keeps its state
    run(py, "kept = 1")
    msg_id = py.kc.execute("%%bash\necho started; sleep 60; echo not-reached")
    wait_for_stream(py, "started")
    assert interrupt(py)["msg_type"] == "interrupt_reply"
    r = py.collect(msg_id, timeout=30)
    if py.ipython:
        # IPython's script magic catches the interrupt and ends the script (the
        # cell succeeds), as in ipykernel. What it prints is IPython's race, not
        # ours: the SIGINT reaches the whole process group, so bash may already
        # be gone when the magic signals it (ProcessLookupError, nothing
        # printed); otherwise it reports how the script ended, and a loaded
        # machine can overrun its 0.1 s waits for SIGINT and SIGTERM.
        assert r["reply"]["content"]["status"] == "ok", r
        out = stream_text(r["iopub"])
        ended = ("", "Process is interrupted.\n", "Process is terminated.\n", "Process is killed.\n")
        assert out in ended and "not-reached" not in out, r
    else:
        assert r["reply"]["content"]["ename"] == "KeyboardInterrupt"
    c, io = run(py, "kept")
    assert results(io)[0]["data"]["text/plain"] == "1"


def test_exported_notebook_with_bash_cells_reruns(tmp_path, monkeypatch):
    """A notebook as `kernelmgr export` writes it (Python cells, bash cells
    as %%bash) re-runs on kernelmgr-python through nbclient."""
    import json
    import nbclient
    import nbformat
    ks = tmp_path / "kernels" / "kernelmgr-python"
    ks.mkdir(parents=True)
    (ks / "kernel.json").write_text(json.dumps({
        "argv": [kutil.binary("kernel-python"), "-f", "{connection_file}", *SANDBOX_ARGS,
                 "--python", SYS_PY],
        "display_name": "kernelmgr Python", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("n = 3\nprint(n)"),
                nbformat.v4.new_code_cell("%%bash\necho from-bash > b.txt; cat b.txt"),
                nbformat.v4.new_code_cell("open('b.txt').read().strip() * n")]
    ws = tmp_path / "ws"
    ws.mkdir()
    nbclient.NotebookClient(nb, kernel_name="kernelmgr-python", timeout=60,
                            resources={"metadata": {"path": str(ws)}}).execute()
    assert nb.cells[1].outputs[0]["text"] == "from-bash\n"
    assert nb.cells[2].outputs[0]["data"]["text/plain"] == "'from-bashfrom-bashfrom-bash'"


def test_forked_child_does_not_answer_for_the_cell(py):
    # os.fork() without exec: the child finishes the cell's code too, and
    # used to report the cell (a second `done`, attributed to whatever ran
    # next) and read the parent's requests. It must just exit.
    c, io = run(py, "import os, time\npid = os.fork()\nif pid == 0:\n    time.sleep(0.3)\n"
                    "    raise ValueError('child')\nprint('parent')")
    assert c["status"] == "ok", c
    for i in range(5):
        msg_id = py.kc.execute("import time; time.sleep(0.2); print(6 * 7)")
        r = py.collect(msg_id, 30)
        c = r["reply"]["content"]
        assert c["status"] == "ok", (c, py.log_text())
        assert stream_text(r["iopub"]) == "42\n"
        assert not of_type(r["iopub"], "error")


@pytest.mark.parametrize("path", ["off", "on"])
def test_workspace_modules_do_not_shadow_the_driver(kernel_factory, tmp_path, path):
    # The workspace is the cwd of user code and "" on its sys.path, and
    # sandboxed code writes it: a json.py, re.py or types.py there used to be
    # imported by the driver itself (it set sys.path[0] = "" before importing
    # json) and broke the kernel. Planted before the start, and planted by a
    # cell for what the driver loads later (asyncio, rlcompleter, jedi).
    ws = tmp_path / "k0" / "ws"
    ws.mkdir(parents=True)
    for name in ("json", "re", "types"):
        (ws / (name + ".py")).write_text("raise RuntimeError('planted %s.py imported')\n" % name)
    k = kernel_factory("python", args=[*SANDBOX_ARGS, "--python", SYS_PY, "--ipython", path])
    assert k.workspace == ws
    c, io = run(k, "for n in ('asyncio', 'rlcompleter', 'jedi', 'pprint', 'uuid', 'inspect'):\n"
                   "    open(n + '.py', 'w').write('raise RuntimeError(%r)' % ('planted ' + n))\n"
                   "x = 6\nprint('hello')\nx * 7")
    assert c["status"] == "ok", c
    assert stream_text(io) == "hello\n"
    assert results(io)[0]["data"]["text/plain"] == "42"
    # display (JSON events, pprint of a long dict, a display id from uuid)
    c, io = run(k, "h = display({'k%d' % i: 'v' * 8 for i in range(9)}, display_id=True)\n"
                   "h.update('changed')")
    assert c["status"] == "ok", c
    [dd] = of_type(io, "display_data")
    assert "'k8': 'vvvvvvvv'" in dd["content"]["data"]["text/plain"]
    [up] = of_type(io, "update_display_data")
    assert up["content"]["data"] == {"text/plain": "'changed'"}
    # an error's traceback (traceback, linecache, tokenize, re)
    c, io = run(k, "def f():\n    raise ValueError('bad value')\nf()")
    assert c["status"] == "error" and c["ename"] == "ValueError", c
    [err] = [m["content"] for m in of_type(io, "error")]
    tb = plain(err["traceback"])
    assert "raise ValueError('bad value')" in tb and "planted" not in tb
    # top-level await (asyncio, loaded on first use)
    c, io = run(k, "async def g():\n    return 5\nawait g()")
    assert c["status"] == "ok", c
    assert results(io)[0]["data"]["text/plain"] == "5"
    # completion (jedi or rlcompleter, loaded on first use) and inspection
    run(k, "my_long_name = 1")
    k.kc.complete("my_lo", 5)
    m = k.kc.get_shell_msg(timeout=30)
    assert m["msg_type"] == "complete_reply" and m["content"]["status"] == "ok"
    assert "my_long_name" in m["content"]["matches"]
    k.kc.inspect("len", 3, detail_level=0)
    m = k.kc.get_shell_msg(timeout=30)
    assert m["msg_type"] == "inspect_reply" and m["content"]["found"] is True
    # user code still sees its workspace first, as in any Python
    c, io = run(k, "import sys\nsys.path[0]")
    assert results(io)[0]["data"]["text/plain"] == "''"
    c, io = run(k, "import newmod")
    assert c["status"] == "error" and c["ename"] == "ModuleNotFoundError"
    (ws / "newmod.py").write_text("VALUE = 'from the workspace'\n")
    c, io = run(k, "import importlib; importlib.invalidate_caches()\nimport newmod\nnewmod.VALUE")
    assert results(io)[0]["data"]["text/plain"] == "'from the workspace'"
    assert "planted" not in k.log_text()


def test_user_imports_of_workspace_modules_leave_the_driver_its_own(kernel_factory, tmp_path):
    # The driver loads traceback, pprint, uuid, base64, inspect on first use.
    # User code that imports a workspace file of one of those names first
    # gets its own module (as in plain Python); the driver then uses a
    # private copy of the real one, so errors, displays and inspection work.
    ws = tmp_path / "k0" / "ws"
    ws.mkdir(parents=True)
    k = kernel_factory("python", args=[*SANDBOX_ARGS, "--python", SYS_PY])
    assert k.workspace == ws
    names = ("traceback", "pprint", "uuid", "base64", "inspect")
    for n in names:
        (ws / (n + ".py")).write_text("SHADOW = %r\n" % n)
    c, io = run(k, "import importlib; importlib.invalidate_caches()\n"
                   "import traceback, pprint, uuid, base64, inspect\n"
                   "print([m.SHADOW for m in (traceback, pprint, uuid, base64, inspect)])")
    assert c["status"] == "ok", c
    assert stream_text(io) == str(list(names)) + "\n"
    c, io = run(k, "def f():\n    raise ValueError('bad value')\nf()")
    assert c["status"] == "error" and c["ename"] == "ValueError", c
    [err] = [m["content"] for m in of_type(io, "error")]
    assert "raise ValueError('bad value')" in "\n".join(err["traceback"]), err
    c, io = run(k, "h = display({'k%d' % i: 'v' * 8 for i in range(9)}, display_id=True)\n"
                   "h.update('changed')")
    assert c["status"] == "ok", c
    [dd] = of_type(io, "display_data")
    assert "'k8': 'vvvvvvvv'" in dd["content"]["data"]["text/plain"]
    k.kc.inspect("len", 3, detail_level=0)
    m = k.kc.get_shell_msg(timeout=30)
    assert m["msg_type"] == "inspect_reply" and m["content"]["found"] is True, m["content"]
    # user code keeps its own modules
    c, io = run(k, "print(traceback.SHADOW, pprint.SHADOW)")
    assert stream_text(io) == "traceback pprint\n", io


# ------------------------------------------------------------------ output order
# Streams, displays, clear_output, results and errors must reach IOPub in the
# order the cell produced them (WORKER_PROTOCOL.md, "Ordering").

def _sequence(iopub):
    """The cell's output as a list: non-stream messages as tuples, the stream
    text between two of them as ("stream", stdout text, stderr text)."""
    seq, out, err = [], [], []

    def cut():
        if out or err:
            seq.append(("stream", "".join(out), "".join(err)))
            out.clear()
            err.clear()

    for m in iopub:
        t, c = m["msg_type"], m["content"]
        if t == "stream":
            (out if c["name"] == "stdout" else err).append(c["text"])
            continue
        if t in ("status", "execute_input"):
            continue
        cut()
        if t in ("display_data", "update_display_data", "execute_result"):
            seq.append((t, c["data"].get("text/plain")))
        elif t == "clear_output":
            seq.append((t, c["wait"]))
        elif t == "error":
            seq.append((t, c["ename"], c["evalue"]))
        else:
            seq.append((t,))
    cut()
    return seq


ORDER_N = 50

ORDER_CELLS = {
    "clear_loop": (
        "for i in range(%d):\n    clear_output()\n    print('step', i)" % ORDER_N,
        [x for i in range(ORDER_N)
         for x in (("clear_output", False), ("stream", "step %d\n" % i, ""))]),
    "display_print": (
        "for i in range(%d):\n    display('d%%d' %% i)\n    print('p%%d' %% i)" % ORDER_N,
        [x for i in range(ORDER_N)
         for x in (("display_data", "'d%d'" % i), ("stream", "p%d\n" % i, ""))]),
    "mixed": (
        "import sys\n"
        "for i in range(%d):\n"
        "    print('a%%d' %% i)\n"
        "    sys.stderr.write('e%%d\\n' %% i)\n"
        "    display('d%%d' %% i, display_id='dd%%d' %% i)\n"
        "    print('b%%d' %% i, end='')\n"
        "    update_display('u%%d' %% i, display_id='dd%%d' %% i)\n"
        "    clear_output(wait=True)\n"
        "print('last')\n"
        "raise ValueError('end')" % ORDER_N,
        [x for i in range(ORDER_N)
         for x in (("stream", "a%d\n" % i, "e%d\n" % i), ("display_data", "'d%d'" % i),
                   ("stream", "b%d" % i, ""), ("update_display_data", "'u%d'" % i),
                   ("clear_output", True))]
        + [("stream", "last\n", ""), ("error", "ValueError", "end")]),
}


def _check_order(k, cells=20):
    bad = []
    for rnd in range(cells):
        for name, (code, expect) in ORDER_CELLS.items():
            _, iopub = run(k, code, timeout=120)
            got = _sequence(iopub)
            if got != expect:
                first = next((i for i, (a, b) in enumerate(zip(got, expect)) if a != b),
                             min(len(got), len(expect)))
                bad.append((rnd, name, first, got[first:first + 3], expect[first:first + 3]))
    assert not bad, f"{len(bad)} of {cells * len(ORDER_CELLS)} cells misordered: {bad[:5]}"


def test_output_order_exact(py):
    _check_order(py)
    # the kernel still works, and an interrupt-free cell after them is plain
    c, iopub = run(py, "print('ok')")
    assert c["status"] == "ok" and stream_text(iopub) == "ok\n"


@pytest.mark.serial  # keeps every core busy: alone, not on top of the parallel pass
def test_output_order_exact_under_load(py):
    hogs = [subprocess.Popen([SYS_PY, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        _check_order(py)
    finally:
        for h in hogs:
            h.kill()
        for h in hogs:
            h.wait(timeout=10)
    c, iopub = run(py, "print('ok')")
    assert c["status"] == "ok" and stream_text(iopub) == "ok\n"


def test_output_order_threads_and_subprocess(py):
    # fd-level writers that finished before an event come before it
    code = ("import subprocess, os\n"
            "for i in range(20):\n"
            "    subprocess.run(['echo', 's%d' % i])\n"
            "    os.write(1, b'w%d\\n' % i)\n"
            "    clear_output()\n")
    _, iopub = run(py, code, timeout=60)
    expect = [x for i in range(20) for x in (("stream", "s%d\nw%d\n" % (i, i), ""),
                                             ("clear_output", False))]
    assert _sequence(iopub) == expect


def test_nbclient_clear_output_keeps_last_step(tmp_path, monkeypatch):
    import nbformat
    nbclient = pytest.importorskip("nbclient")
    import mgrutil
    prefix = tmp_path / "prefix"
    p = subprocess.run([mgrutil.KM, "kernelspec", "install", "--prefix", str(prefix),
                        "--sandbox", KM_TEST_SANDBOX, "--python", SYS_PY, "--json"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    monkeypatch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
    for var, sub in (("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "rt"),
                     ("JUPYTER_CONFIG_DIR", "cfg")):
        monkeypatch.setenv(var, str(tmp_path / sub))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "kernelmgr-python", "display_name": "p",
                                 "language": "python"}
    loops = ["for i in range(5):\n    clear_output()\n    print('step', i)",
             "for i in range(5):\n    clear_output(wait=True)\n    print('step', i)"]
    nb.cells = [nbformat.v4.new_code_cell(src) for src in loops for _ in range(5)]
    client = nbclient.NotebookClient(nb, timeout=60, kernel_name="kernelmgr-python",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    for cell in nb.cells:
        outs = [(o["output_type"], o.get("name"), o.get("text")) for o in cell.outputs]
        assert outs == [("stream", "stdout", "step 4\n")], (cell.source, outs)
