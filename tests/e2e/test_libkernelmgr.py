"""libkernelmgr, the C client library (docs/EMBEDDING.md), against a real
daemon: the example built with pkg-config against the build tree's shared
library and against the static one, the library's cases
(tests/e2e/clib/klib_cases.c: bad options named by the daemon, a missing
session, interrupting a running cell from a thread and from the callback,
files, rich outputs, threads, connecting), no leaks under valgrind, only
kernelmgr_* exported, and install-lib / uninstall-lib."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402
import mgrutil  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LIBDIR = kutil.BUILD.resolve() / "lib"
SO = LIBDIR / "libkernelmgr.so.0.1.0"
HEADER = ROOT / "libkernelmgr" / "kernelmgr.h"
CC = os.environ.get("CC", "cc")
VALGRIND = ["valgrind", "-q", "--leak-check=full", "--show-leak-kinds=definite,indirect",
            "--errors-for-leak-kinds=definite,indirect", "--error-exitcode=99"]

pytestmark = [
    pytest.mark.skipif(not SO.exists(), reason="build/lib/libkernelmgr.so.0.1.0 not built (make)"),
    pytest.mark.skipif(not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")),
                       reason="needs both kernels"),
]

ALL_CASES = ["badopt", "missing", "interrupt-thread", "interrupt-callback", "reentry", "files",
             "rich", "threads", "connect", "snapshot"]


def pkgconfig(*args):
    env = dict(os.environ, PKG_CONFIG_PATH=str(LIBDIR))
    out = subprocess.run(["pkg-config", *args, "kernelmgr"], env=env, capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def compile_c(src, out, static):
    """Builds src against the build tree's library: shared with pkg-config
    (the uninstalled .pc), or the static archive and its private libs."""
    cflags = pkgconfig("--cflags")
    if static:
        libs = [str(LIBDIR / "libkernelmgr.a"),
                *subprocess.run(["pkg-config", "--libs", "jansson"], capture_output=True,
                                text=True, check=True).stdout.split(), "-lpthread"]
    else:
        libs = pkgconfig("--libs") + ["-lpthread", f"-Wl,-rpath,{LIBDIR}"]
    cmd = [CC, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-g", "-O1", *cflags, "-o", str(out),
           str(src), *libs]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, (cmd, p.stderr)
    return out


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    d = tmp_path_factory.mktemp("klib")
    ex = ROOT / "examples" / "c" / "code_exec.c"
    cases = ROOT / "tests" / "e2e" / "clib" / "klib_cases.c"
    return {
        "example": compile_c(ex, d / "code_exec", False),
        "example_static": compile_c(ex, d / "code_exec_static", True),
        "cases": compile_c(cases, d / "klib_cases", False),
        "cases_static": compile_c(cases, d / "klib_cases_static", True),
    }


@pytest.fixture
def home(make_mgr):
    """A home of its own; the library starts its daemon (KERNELMGR_BIN)."""
    m = make_mgr()
    m.env["KERNELMGR_BIN"] = mgrutil.KM
    return m


def run(home, argv, timeout=300):
    return subprocess.run(argv, env=home.env, capture_output=True, text=True, timeout=timeout)


def check_example(out):
    assert "session c-example (created)" in out
    # streamed as it arrived, then the result
    assert "[stream stdout] python line 0" in out
    assert re.search(r"block 0: language=python status=ok exit_code=0", out)
    assert "result: text/plain = 42" in out
    assert "stderr: a warning" in out
    assert "hello from bash, x is not here: unset" in out
    assert re.search(r"language=bash status=error exit_code=1", out)
    assert "file created: note.txt" in out
    assert "error: ZeroDivisionError: division by zero" in out
    assert "note.txt (16 bytes): written by bash" in out
    assert "session c-example closed" in out


@pytest.mark.parametrize("which", ["example", "example_static"])
def test_example(binaries, home, which):
    p = run(home, [str(binaries[which])])
    assert p.returncode == 0, p.stdout + p.stderr
    check_example(p.stdout)
    # the daemon the library started serves the CLI too
    assert home.run("sessions", "--json").returncode == 0


def test_example_built_by_make(home):
    p = run(home, [str(kutil.BUILD.resolve() / "examples" / "code_exec")])
    assert p.returncode == 0, p.stdout + p.stderr
    check_example(p.stdout)


def test_static_links_no_shared_library(binaries):
    d = subprocess.run(["readelf", "-d", str(binaries["example_static"])], capture_output=True,
                       text=True, check=True).stdout
    assert "libkernelmgr" not in d
    d = subprocess.run(["readelf", "-d", str(binaries["example"])], capture_output=True,
                       text=True, check=True).stdout
    assert "libkernelmgr.so.0" in d


def test_example_bad_option_named(binaries, home):
    p = run(home, [str(binaries["example"]), "-o", "memory=lots"])
    assert p.returncode == 2, p.stdout + p.stderr
    assert 'field "memory"' in p.stderr and "code 2" in p.stderr, p.stderr
    p = run(home, [str(binaries["example"]), "-o", "cpus=-3"])
    assert p.returncode == 2 and '"cpus"' in p.stderr, p.stderr


def test_cases(binaries, home):
    p = run(home, [str(binaries["cases"]), *ALL_CASES])
    assert p.returncode == 0, p.stdout + p.stderr
    for c in ALL_CASES:
        assert f"ok {c}\n" in p.stdout, p.stdout
    assert 'field "memory"' in p.stdout
    assert "interrupted: KeyboardInterrupt" in p.stdout


@pytest.mark.skipif(not shutil.which("valgrind"), reason="valgrind not installed")
def test_no_leaks_under_valgrind(binaries, home):
    p = run(home, [*VALGRIND, str(binaries["example_static"]), "-s", "vg"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "session vg closed" in p.stdout
    # the cases that are not mostly waiting or bulk bytes (those run above)
    cases = ["badopt", "missing", "reentry", "rich", "connect"]
    p = run(home, [*VALGRIND, str(binaries["cases_static"]), *cases])
    assert p.returncode == 0, p.stdout + p.stderr
    for c in cases:
        assert f"ok {c}\n" in p.stdout, p.stdout


@pytest.mark.skipif(not shutil.which("clang"), reason="clang not installed")
def test_cases_under_asan_and_ubsan(home, tmp_path):
    """The library's sources and the cases built with AddressSanitizer,
    LeakSanitizer and UBSan: any report fails."""
    src = [*sorted((ROOT / "libkernelmgr").glob("*.c")), ROOT / "kernelmgr/engine/kmhome.c",
           ROOT / "kernelmgr/engine/kmfs.c", ROOT / "kernelmgr/engine/kmerr.c",
           ROOT / "tests/e2e/clib/klib_cases.c"]
    exe = tmp_path / "klib_cases_asan"
    jansson = subprocess.run(["pkg-config", "--cflags", "--libs", "jansson"], capture_output=True,
                             text=True, check=True).stdout.split()
    p = subprocess.run(["clang", "-std=gnu11", "-D_GNU_SOURCE", "-O1", "-g",
                        "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                        f"-I{ROOT}", f"-I{HEADER.parent}", "-o", str(exe), *map(str, src),
                        *jansson, "-lpthread"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    env = dict(home.env, ASAN_OPTIONS="detect_leaks=1:halt_on_error=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    # the cases that are not mostly waiting for kernels (all run above)
    cases = [c for c in ALL_CASES if c not in ("threads", "interrupt-thread")]
    p = subprocess.run([str(exe), *cases], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "runtime error" not in p.stderr, p.stdout + p.stderr
    for c in cases:
        assert f"ok {c}\n" in p.stdout, p.stdout


def header_functions():
    text = HEADER.read_text()
    return set(re.findall(r"KERNELMGR_API[^;{]*?\b(kernelmgr_\w+)\s*\(", text, re.S))


def test_exports_only_the_header():
    out = subprocess.run(["nm", "-D", "--defined-only", str(SO)], capture_output=True, text=True,
                         check=True).stdout
    names = {line.split()[-1] for line in out.splitlines() if line.strip()}
    names = {n.split("@")[0] for n in names}
    assert names, out
    assert all(n.startswith("kernelmgr_") for n in names), sorted(
        n for n in names if not n.startswith("kernelmgr_"))
    assert names == header_functions(), (names ^ header_functions())
    soname = subprocess.run(["readelf", "-d", str(SO)], capture_output=True, text=True,
                            check=True).stdout
    assert "Library soname: [libkernelmgr.so.0]" in soname
    assert os.readlink(LIBDIR / "libkernelmgr.so.0") == "libkernelmgr.so.0.1.0"
    assert os.readlink(LIBDIR / "libkernelmgr.so") == "libkernelmgr.so.0"


@pytest.mark.parametrize("lang,std", [("c", "-std=c99"), ("c++", "-std=c++11")])
def test_header_stands_alone(tmp_path, lang, std):
    """kernelmgr.h needs nothing before it, in strict C99 and in C++."""
    compiler = CC if lang == "c" else shutil.which("g++") or shutil.which("clang++")
    if not compiler:
        pytest.skip("no C++ compiler")
    src = tmp_path / "h.c"
    src.write_text("#include <kernelmgr.h>\nint main(void) { return kernelmgr_version()[0] != '0'; }\n")
    p = subprocess.run([compiler, "-x", lang, std, "-pedantic", "-Wall", "-Wextra", "-Werror",
                        f"-I{HEADER.parent}", "-fsyntax-only", str(src)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_install_lib_and_uninstall(tmp_path):
    dest = tmp_path / "dest"
    build = tmp_path / "build"  # its own build: PREFIX changes what the library is built with
    args = ["make", "-s", "--no-print-directory", "-C", str(ROOT), f"BUILD={build}",
            f"DESTDIR={dest}", "PREFIX=/opt/km", "LIBDIR=/opt/km/lib64",
            "INCLUDEDIR=/opt/km/include"]
    p = subprocess.run([*args, "install-lib"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    lib = dest / "opt/km/lib64"
    assert (lib / "libkernelmgr.so.0.1.0").is_file()
    assert os.readlink(lib / "libkernelmgr.so.0") == "libkernelmgr.so.0.1.0"
    assert os.readlink(lib / "libkernelmgr.so") == "libkernelmgr.so.0"
    assert (lib / "libkernelmgr.a").is_file()
    assert (dest / "opt/km/include/kernelmgr.h").read_text() == HEADER.read_text()
    pc = (lib / "pkgconfig/kernelmgr.pc").read_text()
    assert "prefix=/opt/km\n" in pc and "libdir=/opt/km/lib64\n" in pc, pc
    assert "includedir=/opt/km/include\n" in pc and "Requires.private: jansson" in pc
    # the installed library starts the kernelmgr of its own BINDIR by default
    assert b"/opt/km/bin" in (lib / "libkernelmgr.so.0.1.0").read_bytes()
    # a program builds against the installed files with pkg-config
    env = dict(os.environ, PKG_CONFIG_PATH=str(lib / "pkgconfig"),
               PKG_CONFIG_SYSROOT_DIR=str(dest))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "kernelmgr"], env=env,
                           capture_output=True, text=True, check=True).stdout.split()
    exe = tmp_path / "code_exec"
    p = subprocess.run([CC, "-o", str(exe), str(ROOT / "examples/c/code_exec.c"), *flags],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([*args, "uninstall-lib"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    left = [str(f.relative_to(dest)) for f in dest.rglob("*") if not f.is_dir()]
    assert left == [], left


def test_autostart_from_a_host_with_stdin_closed_leaks_no_fd(binaries, home, tmp_path):
    """The daemon the library starts holds none of the host program's fds,
    also when the host has closed its stdin (so the library's own fds may
    be 0)."""
    marker = tmp_path / "host-secret"
    marker.write_text("x")
    fd = os.open(marker, os.O_RDONLY)
    try:
        p = subprocess.run([str(binaries["example"])], env=home.env, capture_output=True,
                           text=True, timeout=300, pass_fds=(fd,),
                           preexec_fn=lambda: os.close(0))
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stdout + p.stderr
    check_example(p.stdout)
    pid = home.daemon_pid()
    assert pid, "no daemon.pid"
    fds = Path(f"/proc/{pid}/fd")
    targets = [os.readlink(f) for f in fds.iterdir()]
    assert str(marker) not in targets, targets
    # its stdin is /dev/null and its output goes to the home's daemon.log
    assert os.readlink(fds / "0") == "/dev/null"
    assert os.readlink(fds / "2") == str(home.home / "daemon.log")
