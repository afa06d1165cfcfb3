"""The Bash kernel under real Jupyter front ends: `jupyter console --existing`
and nbclient running a notebook through a kernelspec."""
import json
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

import kutil

SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")


def jupyter_env(tmp_path, **extra):
    env = dict(os.environ)
    env.update(JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_DATA_DIR=str(tmp_path / "data"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"), IPYTHONDIR=str(tmp_path / "ipy"))
    env.update(extra)
    return env


def test_jupyter_console_existing(kernel_factory, tmp_path):
    k = kernel_factory("bash", args=("--sandbox", SANDBOX), key=b"console-key")
    p = subprocess.run(
        [sys.executable, "-m", "jupyter_console", "--existing", k.cf, "--simple-prompt",
         "--ZMQTerminalInteractiveShell.include_other_output=False"],
        input="echo console-$((6*7)); greet() { echo hi-$1; }\ngreet there\n",
        capture_output=True, text=True, timeout=60, env=jupyter_env(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "GNU bash" in p.stdout  # the banner from kernel_info
    assert "console-42" in p.stdout
    assert "hi-there" in p.stdout
    # the kernel is still there afterwards (the console kept it alive)
    _, r = k.execute("echo still-here")
    assert kutil.stream_text(r["iopub"]) == "still-here\n"


def test_nbclient_runs_notebook_through_kernelspec(tmp_path, monkeypatch):
    spec_dir = tmp_path / "jupyter" / "kernels" / "kmbash-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [kutil.binary("kernel-bash"), "-f", "{connection_file}", "--sandbox", SANDBOX],
        "display_name": "Bash (kernelmgr, test)",
        "language": "bash",
        "interrupt_mode": "signal",
    }))
    for k, v in jupyter_env(tmp_path, JUPYTER_PATH=str(tmp_path / "jupyter")).items():
        monkeypatch.setenv(k, v)
    work = tmp_path / "work"
    work.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x=20; cd sub 2>/dev/null || mkdir sub; echo start"),
        nbformat.v4.new_code_cell("echo $((x + 22)); echo oops >&2"),
        nbformat.v4.new_markdown_cell("just text"),
        nbformat.v4.new_code_cell("printf '<b>bold</b>' > t.html; display t.html"),
        nbformat.v4.new_code_cell("basename \"$PWD\""),
    ]
    client = NotebookClient(nb, kernel_name="kmbash-test", timeout=60, startup_timeout=30,
                            resources={"metadata": {"path": str(work)}})
    client.execute()
    outs = [c.outputs for c in nb.cells if c.cell_type == "code"]
    assert outs[0][0]["text"] == "start\n"
    assert [(o["name"], o["text"]) for o in outs[1]] == [("stdout", "42\n"), ("stderr", "oops\n")]
    assert outs[2][0]["output_type"] == "display_data"
    assert outs[2][0]["data"]["text/html"] == "<b>bold</b>"
    assert outs[3][0]["text"] == "work\n"  # the kernel starts in the notebook's directory
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == [1, 2, 3, 4]
    assert nb.metadata["language_info"]["name"] == "bash"


def test_nbclient_error_cell_raises(tmp_path, monkeypatch):
    from nbclient.exceptions import CellExecutionError
    spec_dir = tmp_path / "jupyter" / "kernels" / "kmbash-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [kutil.binary("kernel-bash"), "-f", "{connection_file}", "--sandbox", SANDBOX],
        "display_name": "Bash (kernelmgr, test)", "language": "bash"}))
    for k, v in jupyter_env(tmp_path, JUPYTER_PATH=str(tmp_path / "jupyter")).items():
        monkeypatch.setenv(k, v)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("echo fine"),
                nbformat.v4.new_code_cell("ls /definitely/not/here"),
                nbformat.v4.new_code_cell("echo never")]
    client = NotebookClient(nb, kernel_name="kmbash-test", timeout=60, startup_timeout=30,
                            resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as exc:
        client.execute()
    assert "ExitStatus" in str(exc.value)
    assert nb.cells[2].outputs == []
