"""The Rust crate (clients/rust, docs/EMBEDDING.md): `cargo test --offline`
with KERNELMGR_BIN=build/kernelmgr runs its unit tests (the JSON parser,
base64, results) and its integration tests against real daemons (each test
a home of its own); then its example runs against a daemon of a temporary
home. The target directory is build/cargo, so the tree stays clean.
Skipped where no cargo is installed."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CRATE = ROOT / "clients" / "rust"


def find_cargo():
    c = shutil.which("cargo")
    if c:
        return c
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    c = home / "bin" / "cargo"
    return str(c) if os.access(c, os.X_OK) else None


CARGO = find_cargo()

pytestmark = [
    pytest.mark.skipif(CARGO is None, reason="cargo is not installed (Debian: apt-get install cargo)"),
    pytest.mark.skipif(not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
                       reason="needs both kernels"),
]


def cargo_env(**extra):
    env = dict(os.environ, CARGO_TARGET_DIR=str(kutil.BUILD.resolve() / "cargo"),
               KERNELMGR_BIN=mgrutil.KM, KM_TEST_SANDBOX=mgrutil.SANDBOX,
               CARGO_TERM_COLOR="never")
    # rustup's cargo finds its toolchain through PATH
    env["PATH"] = str(Path(CARGO).parent) + os.pathsep + env.get("PATH", "")
    env.pop("KERNELMGR_HOME", None)
    env.update(extra)
    return env


def tree_state():
    p = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "clients/rust"],
                       capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else None


def test_cargo_test_against_the_daemon():
    before = tree_state()
    p = subprocess.run([CARGO, "test", "--offline"], cwd=CRATE, env=cargo_env(),
                       capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    assert "SKIPPED" not in out, out[-3000:]
    # the unit tests and the integration tests ran, none failed
    results = [line for line in out.splitlines() if line.startswith("test result:")]
    assert len(results) >= 2 and all(" 0 failed" in r for r in results), results
    assert "test interrupts_a_running_cell ... ok" in out
    assert "test json::tests::refuses_what_is_not_json ... ok" in out
    assert tree_state() == before, "cargo test left files in clients/rust"


def test_example_runs(make_mgr):
    mgr = make_mgr()
    p = subprocess.run([CARGO, "run", "--offline", "--quiet", "--example", "code_exec"],
                       cwd=CRATE, env=cargo_env(KERNELMGR_HOME=str(mgr.home)),
                       capture_output=True, text=True, timeout=900)
    out = p.stdout
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert "[stream] python line 0" in out
    assert "result: 42" in out
    assert "stdout: hello from bash" in out
    assert "file created: note.txt" in out
    assert "error: ZeroDivisionError: division by zero" in out
    assert out.rstrip().endswith("closed")
