"""The one-shot `kernelmgr run`: it starts only the kernels its
blocks need, starts the kernels of several languages at the same time, says
which start failed on the block that needed it, and exits only once every
kernel it started is gone (nothing left in KERNELMGR_HOME, no process).
Real CLI, real kernels; nothing here measures time (waits are polls with
generous deadlines)."""
import os
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402
from mgrutil import Mgr  # noqa: E402

needs_both = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="build/kernel-python and build/kernel-bash needed")


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def _alive(pid):
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return st.rsplit(")", 1)[1].split()[0] != "Z"


def home_processes(home):
    """Live processes of kernelmgr in home: a command line naming a path in
    it (kernel servers: their connection file) or a cwd in it."""
    roots = [str(home), str(kutil.run_dir(home))]
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(d / "cwd")
        except OSError:
            cwd = ""
        cmd = _cmdline(int(d.name))
        if any(r in cmd or cwd.startswith(r) for r in roots) and _alive(int(d.name)):
            out.append(int(d.name))
    return out


def kernel_servers(home):
    ks = [p for p in home_processes(home) if "/kernel-" in _cmdline(p).split(" ")[0]]
    return [p for p in ks
            if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) not in ks]


def leftovers(home):
    """Files a finished run must not leave: the run directory (connection
    files, sockets, pid files, owner locks; kutil.run_dir) and sessions/."""
    out = []
    for sub, d in (("run", kutil.run_dir(home)), ("sessions", Path(home) / "sessions")):
        if d.is_dir():
            out += [f"{sub}/{p.name}" for p in d.iterdir()]
    return sorted(out)


@pytest.fixture
def mgr():
    m = Mgr()
    yield m
    m.close()


MIXED = """```python
x = 6 * 7
print("py", x)
```

```bash
y=from-bash
echo "sh $y"
```

```python
print("py again", x)
```

```bash
echo "sh again $y"
```
"""


@needs_both
def test_run_mixed_blocks_then_nothing_left(mgr):
    rc, res, p = mgr.results("run", "-", input=MIXED)
    assert rc == 0, p.stderr + p.stdout
    assert [r["language"] for r in res] == ["python", "bash", "python", "bash"]
    assert [r["stdout"] for r in res] == ["py 42\n", "sh from-bash\n", "py again 42\n",
                                          "sh again from-bash\n"]
    # each kernel was started once and kept its state across the blocks
    assert all(r["status"] == "ok" and not r["kernel"]["restarted"] for r in res)
    # the run exits once its kernels are gone: checked at once, no wait
    assert home_processes(mgr.home) == []
    assert leftovers(mgr.home) == []
    # and the next run works
    rc, res, p = mgr.results("run", "-", input=MIXED)
    assert rc == 0 and len(res) == 4, p.stderr


@needs_both
def test_run_failed_start_reported_on_its_block_once():
    """The bash kernel (a kernelspec that does not exist) cannot start while
    python starts beside it: the python blocks run, each bash block says
    why, nothing is left."""
    m = Mgr({"kernels": {"bash": "kernelmgr-test-no-such-kernelspec"}})
    try:
        rc, res, p = m.results("run", "--continue-on-error", "-", input=MIXED)
        assert rc == 1, p.stderr + p.stdout
        assert [r["language"] for r in res] == ["python", "bash", "python", "bash"]
        assert res[0]["status"] == "ok" and res[0]["stdout"] == "py 42\n"
        assert res[2]["status"] == "ok" and res[2]["stdout"] == "py again 42\n"
        for r in (res[1], res[3]):
            assert r["status"] == "error", r
            assert r["error"]["name"] == "KernelStartError", r
            assert "kernelmgr-test-no-such-kernelspec" in r["error"]["value"], r
        assert home_processes(m.home) == []
        assert leftovers(m.home) == []
        # without --continue-on-error the run stops at the first failed block
        rc, res, p = m.results("run", "-", input=MIXED)
        assert rc == 1 and len(res) == 2 and res[1]["error"]["name"] == "KernelStartError"
        assert home_processes(m.home) == [] and leftovers(m.home) == []
    finally:
        m.close()


@needs_both
@pytest.mark.parametrize("lang", ["python", "bash"])
def test_run_starts_only_the_language_it_needs(mgr, lang):
    """While a one-language run's cell runs, exactly one kernel server is
    up (no kernel of the other language is started for nothing). The cell
    waits for a file the test writes into its workspace."""
    if lang == "python":
        code = ("import os, time\nprint('started', flush=True)\nt = time.time() + 120\n"
                "while not os.path.exists('go') and time.time() < t:\n"
                "    time.sleep(0.05)\nprint('done')")
    else:
        code = ("echo started; for i in $(seq 2400); do [ -e go ] && break; "
                "sleep 0.05; done; echo done")
    out = {}

    def go():
        out["p"] = mgr.run("run", "--lang", lang, "-c", code, timeout=180)

    t = threading.Thread(target=go)
    t.start()
    deadline = time.monotonic() + 120
    servers, ws = [], []
    while time.monotonic() < deadline and t.is_alive():
        servers = kernel_servers(mgr.home)
        ws = list((mgr.home / "sessions").glob("run-*/workspace"))
        if servers and ws:
            break
        time.sleep(0.05)
    try:
        # the kernel is up (its cell may already wait): one server, this language
        assert len(servers) == 1, servers
        assert f"/kernel-{lang}" in _cmdline(servers[0]).split(" ")[0]
    finally:
        for w in ws:
            (w / "go").write_text("")
        t.join(180)
    p = out["p"]
    assert p.returncode == 0 and "done" in p.stdout, p.stderr + p.stdout
    assert home_processes(mgr.home) == [] and leftovers(mgr.home) == []
