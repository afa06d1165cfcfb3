"""Our kernels under the real Jupyter tools: `kernelmgr kernelspec install`,
then `jupyter kernelspec list`, `jupyter console`, `jupyter nbconvert
--execute` and nbclient start kernelmgr-python / kernelmgr-bash; and
`kernelmgr export` notebooks re-run with our kernels.

Needs Debian's jupyter-client (jupyter-kernelspec), jupyter-console and
jupyter-nbconvert (python3-nbconvert) besides python3-nbclient."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
from mgrutil import Mgr  # noqa: E402

JUPYTER = "/usr/bin/jupyter"

pytestmark = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="build/kernel-python and build/kernel-bash not built")


def need_tool(sub, package):
    if not os.access(f"/usr/bin/jupyter-{sub}", os.X_OK):
        pytest.skip(f"`jupyter {sub}` missing: install the Debian package {package}")


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    """kernelspecs installed under a temporary prefix; env finds only those."""
    root = tmp_path_factory.mktemp("jup")
    prefix = root / "prefix"
    env = dict(os.environ, JUPYTER_PATH=str(prefix / "share" / "jupyter"),
               JUPYTER_DATA_DIR=str(root / "data"), JUPYTER_RUNTIME_DIR=str(root / "rt"),
               JUPYTER_CONFIG_DIR=str(root / "cfg"), IPYTHONDIR=str(root / "ipy"),
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    p = subprocess.run([mgrutil.KM, "kernelspec", "install", "--prefix", str(prefix),
                        "--sandbox", mgrutil.SANDBOX, "--python", "/usr/bin/python3", "--json"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    installed = json.loads(p.stdout)["installed"]
    return {"prefix": prefix, "env": env, "installed": installed, "root": root}


@pytest.fixture
def jupyter_env(specs, monkeypatch):
    """The same environment for in-process jupyter_client / nbclient."""
    for k in ("JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_CONFIG_DIR"):
        monkeypatch.setenv(k, specs["env"][k])
    return specs["env"]


# ------------------------------------------------------------------ install

def test_kernelspec_install_is_listed_by_jupyter(specs):
    need_tool("kernelspec", "jupyter-client")
    names = {e["name"]: e for e in specs["installed"]}
    assert set(names) == {"kernelmgr-python", "kernelmgr-bash"}
    p = subprocess.run([JUPYTER, "kernelspec", "list", "--json"], env=specs["env"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    ks = json.loads(p.stdout)["kernelspecs"]
    kernels = specs["prefix"] / "share" / "jupyter" / "kernels"
    for lang in ("python", "bash"):
        spec = ks[f"kernelmgr-{lang}"]
        assert Path(spec["resource_dir"]) == kernels / f"kernelmgr-{lang}"
        argv = spec["spec"]["argv"]
        assert argv[0] == os.path.realpath(kutil.binary(f"kernel-{lang}"))
        assert argv[1:3] == ["-f", "{connection_file}"]
        assert argv[argv.index("--sandbox") + 1] == mgrutil.SANDBOX
        assert spec["spec"]["language"] == lang
        assert spec["spec"]["interrupt_mode"] == "message"
    assert "--python" in ks["kernelmgr-python"]["spec"]["argv"]
    assert "--python" not in ks["kernelmgr-bash"]["spec"]["argv"]


def test_kernelspec_install_user_and_bad_usage(tmp_path):
    env = dict(os.environ, JUPYTER_DATA_DIR=str(tmp_path / "data"))
    p = subprocess.run([mgrutil.KM, "kernelspec", "install", "--user"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    for lang in ("python", "bash"):
        spec = json.loads((tmp_path / "data" / "kernels" / f"kernelmgr-{lang}" /
                           "kernel.json").read_text())
        assert spec["argv"][0].endswith(f"kernel-{lang}")
        assert "--sandbox" not in spec["argv"]  # the kernel's own default: strict
    for args, needle in ((["--user", "--prefix", str(tmp_path)], "not both"),
                         (["--prefix", "relative/dir"], "absolute"),
                         ([], None)):
        cmd = [mgrutil.KM, "kernelspec", *(["install"] if needle else ["remove"]), *args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        assert p.returncode != 0
        if needle:
            assert needle in p.stderr
    # no kernels to point at: refused with the reason, nothing half-written
    p = subprocess.run([mgrutil.KM, "kernelspec", "install", "--prefix", str(tmp_path / "p2")],
                       env=dict(env, KERNELMGR_KERNEL_DIR=str(tmp_path / "nowhere")),
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 6 and "kernel-python" in p.stderr
    assert not (tmp_path / "p2" / "share" / "jupyter" / "kernels" / "kernelmgr-python" /
                "kernel.json").exists()


def test_kernelspec_install_cpu_options_and_configured_languages(tmp_path):
    """--cpus / --cpu-time reach every kernelspec's argv like --memory; a
    configured backend language gets its own kernelspec, a kernelspec
    language none (it already has one)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.json").write_text(json.dumps({"kernels": {
        "sh": {"backend": "kernel-bash", "display_name": "POSIX sh (kernelmgr sandbox)"},
        "ipy": "python3"}}))
    env = dict(os.environ, KERNELMGR_HOME=str(home))
    prefix = tmp_path / "p"
    p = subprocess.run([mgrutil.KM, "kernelspec", "install", "--prefix", str(prefix),
                        "--cpus", "1.5", "--cpu-time", "30", "--memory", "512M",
                        "--ipython", "on", "--json"],
                       env=env, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    names = [e["name"] for e in json.loads(p.stdout)["installed"]]
    assert names == ["kernelmgr-python", "kernelmgr-bash", "kernelmgr-sh"]
    kernels = prefix / "share" / "jupyter" / "kernels"
    for name in names:
        spec = json.loads((kernels / name / "kernel.json").read_text())
        argv = spec["argv"]
        assert argv[argv.index("--cpus") + 1] == "1.5", argv
        assert argv[argv.index("--cpu-time") + 1] == "30", argv
        assert argv[argv.index("--memory") + 1] == "512M", argv
    sh = json.loads((kernels / "kernelmgr-sh" / "kernel.json").read_text())
    assert sh["argv"][0] == os.path.realpath(kutil.binary("kernel-bash"))
    assert sh["language"] == "sh" and sh["display_name"] == "POSIX sh (kernelmgr sandbox)"
    assert "--python" not in sh["argv"] and "--ipython" not in sh["argv"]
    # --ipython on: the Python kernelspec's kernel runs every cell through IPython
    py = json.loads((kernels / "kernelmgr-python" / "kernel.json").read_text())["argv"]
    assert py[py.index("--ipython") + 1] == "on", py
    assert not (kernels / "kernelmgr-ipy").exists()


# ------------------------------------------------------------------ jupyter console

@pytest.mark.parametrize("lang,code,expect", [
    ("python", "x = 6 * 7\nprint(f'answer={x}')\n", "answer=42"),
    ("bash", "x=6\necho answer=$((x * 7))\n", "answer=42"),
])
def test_jupyter_console_runs_code(specs, tmp_path, lang, code, expect):
    need_tool("console", "jupyter-console")
    p = subprocess.Popen([JUPYTER, "console", "--kernel", f"kernelmgr-{lang}", "--simple-prompt",
                          "--ZMQTerminalInteractiveShell.kernel_timeout=60"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=specs["env"], cwd=tmp_path, text=True)
    hung = False
    try:
        out, err = p.communicate(code, timeout=120)
    except subprocess.TimeoutExpired:
        hung = True
        # the kernel is in a process group of its own: end it with the console
        for pid in reversed(kutil.descendants(p.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.kill()
        out, err = p.communicate()
    if hung:  # everything the console and the kernel said, not pytest's cut repr
        pytest.fail(f"jupyter console hung:\n--- stdout\n{out}\n--- stderr\n{err}")
    assert expect in out, (out, err)
    assert "Traceback" not in out


# ------------------------------------------------------------------ nbconvert / nbclient

def _notebook(cells, kernel, language):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel, "display_name": kernel, "language": language}
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    return nb


def test_nbconvert_executes_notebook_with_kernelmgr_python(specs, tmp_path):
    need_tool("nbconvert", "jupyter-nbconvert")
    import nbformat
    nb = _notebook(["x = 6 * 7\nprint(x)",
                    "x * 2",
                    "open('made-by-nb.txt', 'w').write('hi')\nimport os\nsorted(os.listdir('.'))",
                    "!echo shell-$((1 + 1))",
                    "1 / 0",
                    "import sys\n'ipykernel' in sys.modules"], "python3", "python")
    src = tmp_path / "in.ipynb"
    nbformat.write(nb, str(src))
    p = subprocess.run([JUPYTER, "nbconvert", "--to", "notebook", "--execute", "--allow-errors",
                        "--ExecutePreprocessor.kernel_name=kernelmgr-python",
                        "--ExecutePreprocessor.timeout=60", "--output", "out.ipynb", str(src)],
                       env=specs["env"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=180)
    assert p.returncode == 0, p.stderr
    out = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    nbformat.validate(out)
    assert out.metadata["language_info"]["name"] == "python"
    c = out.cells
    assert c[0].outputs[0]["output_type"] == "stream" and c[0].outputs[0]["text"] == "42\n"
    assert c[1].outputs[0]["data"]["text/plain"] == "84"
    assert "'made-by-nb.txt'" in c[2].outputs[0]["data"]["text/plain"]
    assert (tmp_path / "made-by-nb.txt").read_text() == "hi"  # the notebook's dir is the cwd
    assert "shell-2" in "".join(o.get("text", "") for o in c[3].outputs)
    assert c[4].outputs[0]["output_type"] == "error"
    assert c[4].outputs[0]["ename"] == "ZeroDivisionError"
    # our kernel ran it, not ipykernel (the notebook's own kernelspec)
    assert c[5].outputs[0]["data"]["text/plain"] == "False"
    assert [cell.execution_count for cell in c] == [1, 2, 3, 4, 5, 6]


def test_nbclient_runs_bash_notebook_with_kernelmgr_bash(jupyter_env, tmp_path):
    import nbclient
    nb = _notebook(["x=5\ncd sub 2>/dev/null || { mkdir sub; cd sub; }",
                    "echo $((x * 2)); basename \"$PWD\"",
                    "printf 'a\\nb\\n' > lines.txt; wc -l < lines.txt",
                    "false"], "kernelmgr-bash", "bash")
    client = nbclient.NotebookClient(nb, timeout=60, allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    c = nb.cells
    # one shell for the whole notebook: variables and cwd carry over
    assert "".join(o["text"] for o in c[1].outputs if o["output_type"] == "stream") == "10\nsub\n"
    assert "".join(o["text"] for o in c[2].outputs if o["output_type"] == "stream").strip() == "2"
    assert (tmp_path / "sub" / "lines.txt").is_file()
    assert any(o["output_type"] == "error" for o in c[3].outputs)


# ------------------------------------------------------------------ export re-runs on our kernels

@pytest.fixture
def mgr():
    m = Mgr()
    yield m
    m.close()


def test_export_bash_session_reruns_with_kernelmgr_bash(mgr, jupyter_env, tmp_path):
    import nbclient
    import nbformat
    mgr.exec("b", "n=3\ncd /tmp", "--lang", "bash")
    rc, res, _ = mgr.exec("b", "echo $((n + 1)) in $PWD", "--lang", "bash")
    assert res[0]["stdout"] == "4 in /tmp\n"
    out = tmp_path / "b.ipynb"
    p = mgr.run("export", "b", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "warning" not in p.stderr
    nb = nbformat.read(str(out), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "kernelmgr-bash"
    assert nb.metadata["kernelspec"]["language"] == "bash"
    assert not any(c.source.startswith("%%bash") for c in nb.cells)
    recorded = [o["text"] for o in nb.cells[1].outputs]
    for c in nb.cells:
        c.outputs = []
    nbclient.NotebookClient(nb, timeout=60,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    # the same shell state as in the session: the re-run reproduces its output
    assert [o["text"] for o in nb.cells[1].outputs] == recorded == ["4 in /tmp\n"]


def test_export_python_session_reruns_with_kernelmgr_python(mgr, jupyter_env, tmp_path):
    import nbclient
    import nbformat
    mgr.exec("p", "vals = [1, 4, 9]\nprint(sum(vals))")
    mgr.exec("p", "vals[-1] * 2")
    out = tmp_path / "p.ipynb"
    p = mgr.run("export", "p", "-o", str(out), "--kernel", "kernelmgr-python")
    assert p.returncode == 0, p.stderr
    nb = nbformat.read(str(out), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "kernelmgr-python"
    for c in nb.cells:
        c.outputs = []
    nbclient.NotebookClient(nb, timeout=60,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    assert nb.cells[0].outputs[0]["text"] == "14\n"
    assert nb.cells[1].outputs[0]["data"]["text/plain"] == "18"


def test_export_mixed_session_says_how_it_reruns(mgr, jupyter_env, tmp_path):
    import nbformat
    mgr.exec("m", "print('py')")
    mgr.exec("m", "echo sh", "--lang", "bash")
    # default: ipykernel's python3 with %%bash cells, caveat stated
    out = tmp_path / "m.ipynb"
    p = mgr.run("export", "m", "-o", str(out))
    assert p.returncode == 0, p.stderr
    nb = nbformat.read(str(out), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert nb.cells[1].source.startswith("%%bash\n")
    assert "own bash process" in p.stderr
    assert nb.metadata["kernelmgr"]["warnings"]
    # our Python kernel runs %%bash cells too (one bash process per cell)
    p = mgr.run("export", "m", "-o", str(out), "--kernel", "kernelmgr-python")
    assert p.returncode == 0
    assert "own bash process" in p.stderr
    nb = nbformat.read(str(out), as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "kernelmgr-python"
    assert nb.cells[1].source.startswith("%%bash\n")
    # a bash kernel cannot run Python cells: refused as a usage error
    p = mgr.run("export", "m", "-o", str(tmp_path / "x.ipynb"), "--kernel", "kernelmgr-bash")
    assert p.returncode == 2 and "Python cell" in p.stderr
    assert not (tmp_path / "x.ipynb").exists()
