"""`kernelmgr doctor`: the interpreter every entry point uses and what it
imports, the warning when `make demo`'s interpreter is another one, a real
trial start of each kernel (never "ok" when kernels cannot start), the
capabilities a root daemon needs, the container and the cgroup situation."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import mgrutil

needs_kernels = pytest.mark.skipif(
    not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
    reason="the kernels are not built")
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="dropping a capability of root needs root")


def doctor(mgr, *args, env=None, prefix=()):
    p = subprocess.run([*prefix, mgrutil.KM, "doctor", "--json", *args], capture_output=True,
                       text=True, env=env or mgr.env, timeout=600)
    return p, json.loads(p.stdout)


def can_import(py, mod):
    return subprocess.run([py, "-E", "-s", "-c", f"import {mod}"],
                          capture_output=True).returncode == 0


@needs_kernels
def test_doctor_starts_every_kernel_and_names_the_interpreter(make_mgr, tmp_path):
    mgr = make_mgr()
    rc, _, p = mgr.exec("d", "1", "--lang", "python")  # a running daemon
    assert rc == 0, p.stderr
    p, d = doctor(mgr)
    assert p.returncode == 0 and d["ok"] is True, (d["problems"], p.stderr)
    for lang in ("python", "bash"):
        assert d["trials"][lang]["ok"] is True, d["trials"]
    py = d["python"]
    assert py["interpreter"] == "/usr/bin/python3" and py["used_by"] == ["exec", "mcp", "serve"]
    for mod in ("numpy", "pandas", "matplotlib"):
        assert py["packages"][mod]["ok"] is can_import("/usr/bin/python3", mod), mod
    assert py["demo"] == {"interpreter": "/usr/bin/python3", "same": True}
    assert py["daemon"]["pid"] == mgr.daemon_pid()
    assert py["daemon"]["interpreter"] == "/usr/bin/python3"
    pr = d["privileges"]
    assert pr["identity"] in ("root", "unprivileged", "userns-root")
    assert set(pr["capabilities"]) == {"SYS_ADMIN", "SETUID", "SETGID", "KILL"}
    assert d["cgroup"]["version"] in ("v1", "v2", "hybrid", "none")
    assert d["cgroup"]["memory"] in ("cgroup", "rlimit")
    assert isinstance(d["container"]["detected"], bool)
    # the trial's private home (in TMPDIR) is removed afterwards
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    p = subprocess.run([mgrutil.KM, "doctor"], capture_output=True, text=True, timeout=600,
                       env=dict(mgr.env, TMPDIR=str(tmp)))
    assert list(tmp.iterdir()) == []
    assert p.returncode == 0
    assert "trial python  ok" in p.stdout and "trial bash    ok" in p.stdout, p.stdout
    assert "used by exec, mcp and serve" in p.stdout
    assert "— ok (kernels started)" in p.stdout


@needs_kernels
def test_doctor_warns_when_the_default_interpreter_is_not_the_demos(make_mgr, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    mgr = make_mgr({"python": None})
    env = dict(mgr.env, PATH=f"{venv}/bin:/usr/bin:/bin")
    env.pop("VIRTUAL_ENV", None)
    env.pop("KERNELMGR_PYTHON", None)
    p, d = doctor(mgr, env=env)
    py = d["python"]
    assert py["interpreter"] == f"{venv}/bin/python3", py
    assert py["demo"]["same"] is False
    assert any("`make demo` runs /usr/bin/python3" in w and str(venv) in w
               for w in d["warnings"]), d["warnings"]
    assert py["packages"]["numpy"]["ok"] is False  # a venv without system site-packages
    if can_import("/usr/bin/python3", "numpy"):
        assert py["demo"]["packages"]["numpy"]["ok"] is True
    assert any("cannot import numpy" in w for w in d["warnings"])
    # a warning, not a failure: the kernels do start with that interpreter
    assert d["trials"]["python"]["ok"] is True, d["trials"]
    assert p.returncode == 0, d["problems"]


def test_doctor_fails_when_the_kernels_cannot_start(make_mgr, tmp_path):
    """Helpers missing (a broken installation): every trial fails, doctor
    says so and exits 1 — even though the sandbox itself is available."""
    mgr = make_mgr()
    empty = tmp_path / "no-helpers"
    empty.mkdir()
    p, d = doctor(mgr, env=dict(mgr.env, KERNELMGR_KERNEL_DIR=str(empty)))
    assert p.returncode == 1 and d["ok"] is False
    for lang in ("python", "bash"):
        t = d["trials"][lang]
        # the first helper the trial needs that is not there is named: the
        # session sandbox's holder, or the kernel itself
        assert t["ok"] is False and any(
            str(empty / h) in t["error"] for h in (f"kernel-{lang}", "kernelmgr-sandbox")), t
    assert any("cannot run a cell" in x for x in d["problems"])
    p = subprocess.run([mgrutil.KM, "doctor"], capture_output=True, text=True, timeout=600,
                       env=dict(mgr.env, KERNELMGR_KERNEL_DIR=str(empty)))
    assert p.returncode == 1 and "NOT OK" in p.stdout and "— ok" not in p.stdout, p.stdout


@needs_kernels
@root_only
@pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv (util-linux) is not installed")
def test_doctor_fails_for_root_without_sys_admin(make_mgr):
    """The default container case: root without CAP_SYS_ADMIN passes the
    sandbox's static check, but no kernel starts. doctor tries, and fails."""
    mgr = make_mgr({"sandbox": "strict"})
    drop = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--"]
    p, d = doctor(mgr, prefix=drop)
    assert p.returncode == 1 and d["ok"] is False
    assert d["privileges"]["capabilities"]["SYS_ADMIN"] is False
    assert any("CAP_SYS_ADMIN" in x for x in d["problems"]), d["problems"]
    assert d["trials"]["python"]["ok"] is False and d["trials"]["bash"]["ok"] is False


@needs_kernels
@root_only
@pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv (util-linux) is not installed")
def test_doctor_fails_for_root_without_kill(make_mgr):
    """Kernels start without CAP_KILL, but interrupts and close cannot reach
    them: a problem, not ok."""
    mgr = make_mgr({"sandbox": "strict"})
    p, d = doctor(mgr, prefix=["setpriv", "--bounding-set=-kill", "--inh-caps=-kill", "--"])
    assert p.returncode == 1 and d["ok"] is False
    assert d["privileges"]["missing"] == ["KILL"]
    assert any("CAP_KILL" in x and "interrupts fail" in x for x in d["problems"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
