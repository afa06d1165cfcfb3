"""`make install` / `make uninstall` into a DESTDIR: the layout, and the
installed copy working on its own — moved elsewhere, run from another
directory with a PATH that has no build tree on it, the helpers and support
files found relative to the binary."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import kutil
import mgrutil

ROOT = kutil.ROOT
PREFIX = "/usr"
# what `make install PREFIX=/usr` must install (pyc names depend on the
# interpreter: checked separately)
EXPECTED = {
    "usr/bin/kernelmgr",
    "usr/libexec/kernelmgr/kernel-python",
    "usr/libexec/kernelmgr/kernel-bash",
    "usr/libexec/kernelmgr/kernelmgr-gateway",
    "usr/libexec/kernelmgr/kernelmgr-sandbox",
    "usr/share/kernelmgr/python/driver.py",
    "usr/share/kernelmgr/python/kdebug.py",
    "usr/share/kernelmgr/python/kipython.py",
    "usr/share/kernelmgr/python/ksnap.py",
    "usr/share/kernelmgr/python/kzygote.py",
    "usr/share/kernelmgr/bash/bootstrap.sh",
    "usr/share/kernelmgr/bash/cell.sh",
    "usr/share/man/man1/kernelmgr.1",
    "usr/share/man/man5/kernelmgr.json.5",
    "usr/share/bash-completion/completions/kernelmgr",
    "usr/lib/systemd/system/kernelmgr.service",
    "usr/lib/systemd/user/kernelmgr.service",
}


def make(*args, **kw):
    return subprocess.run(["make", "-s", "--no-print-directory", "-C", str(ROOT),
                           f"BUILD={kutil.BUILD}", f"PREFIX={PREFIX}", *args],
                          capture_output=True, text=True, timeout=600, **kw)


def files_under(d):
    return {str(p.relative_to(d)) for p in Path(d).rglob("*") if not p.is_dir()}


def run_installed(km, home, *args, cwd, timeout=120):
    # No build tree anywhere: not on PATH, not the cwd, no KERNELMGR_* but HOME.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "KERNELMGR_HOME": str(home),
           "LANG": "C.UTF-8"}
    return subprocess.run([str(km), *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)


@pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")
def test_install_layout_runs_moved_and_uninstalls(tmp_path):
    if not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")):
        pytest.skip("the kernels are not built")
    dest = tmp_path / "dest"
    p = make("install", f"DESTDIR={dest}")
    assert p.returncode == 0, p.stdout + p.stderr
    got = files_under(dest)
    assert EXPECTED <= got, sorted(EXPECTED - got)
    pyc = {f for f in got if "/__pycache__/" in f}
    # the driver's and kipython.py's (the IPython path, `ipython` on, loads it at start)
    assert pyc and all(f.startswith(("usr/share/kernelmgr/python/__pycache__/driver.",
                                     "usr/share/kernelmgr/python/__pycache__/kipython."))
                       for f in pyc), pyc
    # nothing but those (and files of other install fragments: libraries,
    # headers, pkg-config; none of ours elsewhere)
    ours = {f for f in got - EXPECTED - pyc if "kernelmgr" in f and "/lib" not in f
            and "/include/" not in f and "/pkgconfig/" not in f}
    assert not ours, ours
    # helpers are not commands
    assert not (dest / "usr/bin/kernel-python").exists()
    for b in ("usr/bin/kernelmgr", "usr/libexec/kernelmgr/kernel-python"):
        assert os.access(dest / b, os.X_OK)
    unit = (dest / "usr/lib/systemd/user/kernelmgr.service").read_text()
    assert "ExecStart=/usr/bin/kernelmgr serve" in unit
    assert ".TH KERNELMGR.JSON 5" in (dest / "usr/share/man/man5/kernelmgr.json.5").read_text()
    assert "memory_budget" in (dest / "usr/share/man/man5/kernelmgr.json.5").read_text()
    assert "complete -F _kernelmgr kernelmgr" in \
        (dest / "usr/share/bash-completion/completions/kernelmgr").read_text()

    # Moved: the copy works wherever it lands, from any cwd.
    moved = tmp_path / "elsewhere" / "root"
    moved.parent.mkdir()
    dest.rename(moved)
    km = moved / "usr/bin/kernelmgr"
    home = Path(mgrutil.tempfile.mkdtemp(prefix="kmi", dir="/tmp"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    try:
        (home / "config.json").write_text(json.dumps({"sandbox": mgrutil.SANDBOX,
                                                      "python": "/usr/bin/python3"}))
        p = run_installed(km, home, "exec", "--session", "t", "--json", "--lang", "python",
                          "-c", "import sys, os\nprint('py', os.getcwd() != %r)" % str(ROOT),
                          cwd=cwd)
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout.splitlines()[-1])
        assert r["stdout"] == "py True\n", r
        p = run_installed(km, home, "exec", "--session", "t", "--json", "--lang", "bash",
                          "-c", "echo bash $((6*7))", cwd=cwd)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.splitlines()[-1])["stdout"] == "bash 42\n"
        # the daemon is the installed gateway binary from the moved copy
        pid = int((home / "daemon.pid").read_text())
        exe = os.readlink(f"/proc/{pid}/exe")
        assert exe == str(moved / "usr/libexec/kernelmgr/kernelmgr-gateway"), exe
        # the kernelspecs point at the installed helpers
        p = run_installed(km, home, "kernelspec", "install", "--prefix", str(tmp_path / "ks"),
                          "--json", cwd=cwd)
        assert p.returncode == 0, p.stderr
        spec = json.loads((tmp_path / "ks/share/jupyter/kernels/kernelmgr-python/kernel.json")
                          .read_text())
        assert spec["argv"][0] == str(moved / "usr/libexec/kernelmgr/kernel-python"), spec
        p = run_installed(km, home, "doctor", "--json", cwd=cwd, timeout=300)
        d = json.loads(p.stdout)
        assert d["kernels"]["python"]["path"] == str(moved / "usr/libexec/kernelmgr/kernel-python")
        assert p.returncode == 0, p.stdout + p.stderr
    finally:
        run_installed(km, home, "serve", "--stop", cwd=cwd, timeout=60)
        shutil.rmtree(home, ignore_errors=True)
    moved.rename(dest)

    # uninstall removes everything install put there
    p = make("uninstall", f"DESTDIR={dest}")
    assert p.returncode == 0, p.stdout + p.stderr
    left = files_under(dest)
    assert not (left & (EXPECTED | pyc)), sorted(left & (EXPECTED | pyc))
    assert not (dest / "usr/libexec/kernelmgr").exists()
    assert not (dest / "usr/share/kernelmgr").exists()


@pytest.mark.skipif(not shutil.which("make"), reason="make is not installed")
def test_cppflags_and_ldflags_reach_the_compiler_and_linker(tmp_path):
    """A distribution's flags (dpkg-buildflags) are not dropped: CPPFLAGS
    on every compile, LDFLAGS on every link (a dry run into a fresh BUILD)."""
    p = subprocess.run(["make", "-n", "-C", str(ROOT), f"BUILD={tmp_path}/b",
                        "CPPFLAGS=-DKM_FLAG_PROBE=1", "LDFLAGS=-Wl,-z,now",
                        f"{tmp_path}/b/kernelmgr", f"{tmp_path}/b/kernel-python"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    compiles = [x for x in p.stdout.splitlines() if " -c " in x]
    links = [x for x in p.stdout.splitlines() if " -o " in x and " -c " not in x
             and x.split()[0] in ("cc", "gcc", "clang")]
    assert compiles and all("-DKM_FLAG_PROBE=1" in x for x in compiles)
    assert len(links) == 2 and all("-Wl,-z,now" in x for x in links), links
