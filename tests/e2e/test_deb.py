"""The Debian packages, as a user gets them: built from a copy of the tree
(`git ls-files`, dpkg-buildpackage -us -uc -b: kernelmgr, libkernelmgr0,
libkernelmgr-dev), lintian clean of errors, hardened binaries, installed
with dpkg -i; then cells, the quickstart, `kernelmgr doctor`, the C example
built with `pkg-config kernelmgr`, the Python client's agent loop and (where
cargo is) the Rust crate's example against the installed files only, and a
purge that leaves nothing behind. Root only (it installs a package). Heavy
(a full build) but parallel-safe: its build is a copy of the tree, and the
other tests run the build tree's binaries, which find their files beside
themselves (never under /usr), and compile against the build tree's headers
and library (-I, PKG_CONFIG_PATH and rpath of build/), so the package being
installed under them changes nothing they see; a shared cargo target
directory is locked by cargo. Skipped when kernelmgr is already installed
(it would be replaced)."""
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import kutil

ROOT = kutil.ROOT


def sh(*args, timeout=900, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)


def skip_reason():
    if os.geteuid() != 0:
        return "installs a Debian package: needs root"
    for tool in ("dpkg-buildpackage", "dh", "dpkg", "git", "lintian", "readelf"):
        if not shutil.which(tool):
            return f"{tool} is not installed (make deps installs dpkg-dev, debhelper, lintian)"
    if not (ROOT / ".git").exists():
        return "not a git checkout: the package is built from `git ls-files`"
    q = sh("dpkg-query", "-W", "-f=${Status}", "kernelmgr")
    if q.returncode == 0 and "installed" in q.stdout and "not-installed" not in q.stdout:
        return "a kernelmgr package is installed on this machine: not replacing it"
    return None


def copy_tree(dest):
    ls = sh("git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
            "--exclude-standard")
    assert ls.returncode == 0, ls.stderr
    for rel in filter(None, ls.stdout.split("\0")):
        src = ROOT / rel
        if rel.startswith("tests/node/node_modules/") or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


def test_deb_builds_installs_runs_and_purges(tmp_path):
    why = skip_reason()
    if why:
        pytest.skip(why)
    t0 = time.monotonic()
    src = tmp_path / "src"
    copy_tree(src)
    # every core, no debug-symbol package: the build is most of this test's time
    env = dict(os.environ, DEB_BUILD_OPTIONS=f"parallel={os.cpu_count() or 1} noautodbgsym")
    # niced like the suite's other builds: its compilers must not starve the
    # kernels the tests beside it start
    b = sh("nice", "-n", "10", "dpkg-buildpackage", "-us", "-uc", "-b", cwd=src, env=env,
           timeout=1800)
    assert b.returncode == 0, b.stdout[-4000:] + b.stderr[-4000:]
    debs = list(tmp_path.glob("kernelmgr_*.deb"))
    assert len(debs) == 1, list(tmp_path.iterdir())
    deb = debs[0]
    libs = sorted(tmp_path.glob("libkernelmgr*.deb"))
    assert [p.name.split("_")[0] for p in libs] == ["libkernelmgr-dev", "libkernelmgr0"], libs
    # the distribution's flags reached the compiler and the linker
    assert "-fstack-protector-strong" in b.stdout and "-Wl,-z,relro" in b.stdout
    li = sh("lintian", "--fail-on", "error", str(deb), *map(str, libs))
    assert li.returncode == 0, li.stdout + li.stderr

    inst = sh("dpkg", "-i", str(deb), *map(str, libs))
    try:
        assert inst.returncode == 0, inst.stdout + inst.stderr
        files = [f for f in sh("dpkg", "-L", "kernelmgr").stdout.splitlines() if f]
        for f in ("/usr/bin/kernelmgr", "/usr/libexec/kernelmgr/kernel-python",
                  "/usr/libexec/kernelmgr/kernel-bash", "/usr/libexec/kernelmgr/kernelmgr-gateway",
                  "/usr/libexec/kernelmgr/kernelmgr-sandbox", "/usr/share/kernelmgr/python/kdebug.py",
                  "/usr/share/kernelmgr/python/ksnap.py",
                  "/usr/share/kernelmgr/python/driver.py", "/usr/share/man/man1/kernelmgr.1.gz",
                  "/usr/share/man/man5/kernelmgr.json.5.gz", "/lib/systemd/system/kernelmgr.service",
                  "/usr/lib/systemd/user/kernelmgr.service"):
            assert f in files, f
        # bytecode compiled at installation, not shipped
        assert not any("__pycache__" in f for f in files)
        assert list(Path("/usr/share/kernelmgr/python/__pycache__").glob("driver.*.pyc"))
        elf = sh("readelf", "-d", "-l", "-h", "/usr/bin/kernelmgr").stdout
        assert "DYN" in elf and "GNU_RELRO" in elf and "BIND_NOW" in elf, elf[:2000]

        home = tmp_path / "h"
        home.mkdir()
        work = tmp_path / "w"
        work.mkdir()
        shutil.copy(ROOT / "examples/quickstart.md", work / "quickstart.md")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KERNELMGR_HOME": str(home),
               "LANG": "C.UTF-8"}

        def km(*args, timeout=300):
            return sh("/usr/bin/kernelmgr", *args, env=env, cwd=work, timeout=timeout)
        try:
            p = km("exec", "--session", "deb", "--json", "--lang", "python", "-c",
                   "import sys; print(sys.executable)")
            assert p.returncode == 0, p.stderr
            assert json.loads(p.stdout.splitlines()[-1])["stdout"] == "/usr/bin/python3\n"
            p = km("exec", "--session", "deb", "--json", "--lang", "bash", "-c", "echo $((6*7))")
            assert p.returncode == 0, p.stderr
            assert json.loads(p.stdout.splitlines()[-1])["stdout"] == "42\n"
            p = km("run", "--python", "/usr/bin/python3", "--json", "quickstart.md")
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr
            res = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
            assert res and all(r["status"] == "ok" for r in res), res
            p = km("doctor", "--json", timeout=600)
            d = json.loads(p.stdout)
            assert p.returncode == 0 and d["ok"] is True, d["problems"]
            assert d["kernels"]["python"]["path"] == "/usr/libexec/kernelmgr/kernel-python"
            assert d["trials"]["python"]["ok"] and d["trials"]["bash"]["ok"]
            assert sh("man", "-w", "kernelmgr.json").returncode in (0, 16)  # man may be absent
            # the C example, built against the installed library only
            flags = sh("pkg-config", "--cflags", "--libs", "kernelmgr", env=env)
            assert flags.returncode == 0, flags.stderr
            exe = tmp_path / "code_exec"
            cc = sh("cc", "-o", str(exe), str(ROOT / "examples/c/code_exec.c"),
                    *flags.stdout.split(), env=env)
            assert cc.returncode == 0, cc.stderr
            ldd = sh("ldd", str(exe)).stdout
            # the installed library (merged /usr: /lib is /usr/lib), not the tree's
            assert re.search(r"libkernelmgr\.so\.0 => /(usr/)?lib/", ldd), ldd
            p = sh(str(exe), "-s", "deb-c", env=env, cwd=work, timeout=300)
            assert p.returncode == 0, p.stdout + p.stderr
            assert "libkernelmgr" in p.stdout, p.stdout
            # the Python client, installed offline into a venv, and the
            # agent loop example on it, against the installed daemon
            venv = tmp_path / "venv"
            assert sh("/usr/bin/python3", "-m", "venv", str(venv)).returncode == 0
            pip = sh(str(venv / "bin/pip"), "install", "--no-index", "-q",
                     str(ROOT / "clients/python"), env=dict(env, PIP_NO_CACHE_DIR="1"))
            assert pip.returncode == 0, pip.stdout + pip.stderr
            p = sh(str(venv / "bin/python"), str(ROOT / "examples/agent_loop.py"),
                   env=dict(env, KERNELMGR_BIN="/usr/bin/kernelmgr"), cwd=work, timeout=300)
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
            assert '"status": "ok"' in p.stdout, p.stdout[-2000:]
            # the Rust crate's example, on the installed kernelmgr (where
            # cargo is: its target directory is the build tree's, so a
            # crate built by the Rust tests is reused)
            cargo = shutil.which("cargo") or next(
                (str(c) for c in [Path.home() / ".cargo/bin/cargo"] if os.access(c, os.X_OK)),
                None)
            if cargo:
                renv = dict(env, KERNELMGR_BIN="/usr/bin/kernelmgr", CARGO_TERM_COLOR="never",
                            CARGO_TARGET_DIR=str(kutil.BUILD.resolve() / "cargo"),
                            PATH=str(Path(cargo).parent) + ":/usr/bin:/bin")
                # HOME is the test's: rustup's toolchain is found where it is
                renv["CARGO_HOME"] = os.environ.get("CARGO_HOME", str(Path.home() / ".cargo"))
                renv["RUSTUP_HOME"] = os.environ.get("RUSTUP_HOME", str(Path.home() / ".rustup"))
                p = sh(cargo, "run", "--offline", "--quiet", "--example", "code_exec",
                       cwd=ROOT / "clients/rust", env=renv, timeout=900)
                assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
                assert "result: 42" in p.stdout and p.stdout.rstrip().endswith("closed")
        finally:
            km("serve", "--stop", timeout=60)
    finally:
        purge = sh("dpkg", "--purge", "libkernelmgr-dev", "libkernelmgr0", "kernelmgr")
    assert purge.returncode == 0, purge.stdout + purge.stderr
    left = [f for f in files if f.startswith(("/usr/libexec/kernelmgr", "/usr/share/kernelmgr",
                                              "/usr/bin/kernelmgr", "/usr/share/doc/kernelmgr"))
            and os.path.lexists(f)]
    assert not left, left
    for d in ("/usr/libexec/kernelmgr", "/usr/share/kernelmgr", "/usr/share/doc/kernelmgr"):
        assert not os.path.exists(d), d
    print(f"\ntest_deb: {time.monotonic() - t0:.0f} s")
