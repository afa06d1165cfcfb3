"""Class 4 of the security issue: every byte sandboxed code can make the host
store is bounded. Each test is an attack through the real manager (daemon,
kernel server, Python worker): it asserts the bound held, the result says so
(and where the rest went), and the session still works afterwards.

Nothing here measures time: waits are polls with deadlines."""
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402

pytestmark = pytest.mark.skipif(not mgrutil.have_kernel("python"),
                                reason="build/kernel-python not built")

KiB = 1024
MiB = 1024 * 1024


def poll(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def one(mgr, session, code, *args, **kw):
    rc, res, p = mgr.exec(session, code, "--lang", "python", *args, **kw)
    assert res, p.stderr
    return res[0]


def assert_works(mgr, session):
    r = one(mgr, session, "print(6 * 7)")
    assert r["status"] == "ok", r
    assert r["stdout"].strip() == "42"


def tree_bytes(path):
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def vm(pid, key):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * KiB
    raise AssertionError(f"no {key} for {pid}")


# ------------------------------------------------------------------ kernel log


def test_malformed_event_flood_keeps_kernel_log_small(make_mgr):
    cap = 64 * KiB
    mgr = make_mgr({"kernel_log_max": cap})
    log = mgr.home / "sessions" / "s" / "python.log"
    # one burst of 200k malformed lines on the worker's event fd, then a
    # second one later: before, every line was logged (~100 MiB in 6 s)
    code = ("import os\n"
            "for _ in range(4):\n"
            "    os.write(4, b'garbage-not-json\\n' * 50000)\n"
            "print('flooded')")
    r = one(mgr, "s", code)
    assert r["status"] == "ok", r
    text = poll(lambda: "suppressed" in log.read_text(errors="replace") and log.read_text(
        errors="replace"), what="a 'suppressed' summary in the kernel log")
    assert "similar messages suppressed" in text
    assert text.count("ignoring malformed event") <= 40, "the rate limit did not hold"
    r = one(mgr, "s", "import os\nos.write(4, b'{bad\\n' * 100000)\nprint('again')")
    assert r["status"] == "ok"
    assert log.stat().st_size <= cap + 1024
    assert_works(mgr, "s")


def test_kernel_log_hard_cap_and_rotation(make_mgr):
    cap = 4096  # the smallest allowed: a handful of lines reach it
    mgr = make_mgr({"kernel_log_max": cap})
    log = mgr.home / "sessions" / "s" / "python.log"
    # distinct worker "log" events (a class of their own) and malformed lines
    code = ("import os, json, time\n"
            "for i in range(3):\n"
            "    os.write(4, b'x' * 70 + b'\\n' * 1 + b'y' * 70 + b'\\n')\n"
            "    os.write(4, (json.dumps({'type': 'log', 'message': 'm' * 200}) + '\\n').encode() * 30)\n"
            "    os.write(4, (json.dumps({'type': 'nonsense-event'}) + '\\n').encode() * 30)\n"
            "print('ok')")
    for _ in range(3):
        assert one(mgr, "s", code)["status"] == "ok"
    text = poll(lambda: "size limit" in log.read_text(errors="replace") and log.read_text(
        errors="replace"), what="the log's final line")
    assert log.stat().st_size <= cap + 512, log.stat().st_size
    assert "--log-max" in text
    # a restart rotates the full log once: the new kernel logs again
    assert mgr.run("restart", "--session", "s").returncode == 0
    assert (log.parent / "python.log.1").exists()
    assert log.stat().st_size < cap
    assert_works(mgr, "s")


# ------------------------------------------------------------------ spill files


def test_huge_stdout_spill_is_capped_and_says_so(make_mgr):
    mgr = make_mgr({"output_cap": "4K", "spill_max": "1M"})
    r = one(mgr, "s", "import sys\nfor _ in range(20):\n    sys.stdout.write('x' * (1 << 18))\n")
    assert r["status"] == "ok"
    t = r["truncated"]["stdout"]
    assert t["total_bytes"] == 20 * (1 << 18)
    assert t["spill"] and os.path.getsize(t["spill"]) == 1 * MiB == t["spill_bytes"]
    assert "spill truncated at 1 MiB (spill_max)" == t["spill_truncated"]
    assert "spill truncated at 1 MiB (spill_max)" in r["stdout"]
    assert len(r["stdout"]) < 8 * KiB
    assert tree_bytes(mgr.home / "outputs") <= 1 * MiB + 64 * KiB
    assert_works(mgr, "s")


def test_session_outputs_total_is_capped(make_mgr):
    mgr = make_mgr({"output_cap": "4K", "spill_max": "1M", "session_outputs_max": "1536K"})
    code = "import sys\nsys.stdout.write('y' * (3 << 20))\nsys.stderr.write('z' * (3 << 20))"
    seen = []
    for _ in range(3):
        r = one(mgr, "s", code)
        assert r["status"] == "ok"
        seen += [r["truncated"][k].get("spill_truncated") or "" for k in ("stdout", "stderr")]
    assert any("session_outputs_max" in s for s in seen), seen
    assert tree_bytes(mgr.home / "outputs" / "s") <= 1536 * KiB
    assert_works(mgr, "s")


# ------------------------------------------------------------------ displays and images

DISPLAY_FLOOD = """
import base64, os
png = base64.b64encode(b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(768 * 1024)).decode()
for i in range(150):
    display({'image/png': png, 'text/plain': 'img %d' % i}, raw=True)
    clear_output()
print('done')
"""


@pytest.mark.flood
def test_display_flood_with_clear_output_is_bounded(make_mgr):
    dmax = 4 * MiB
    mgr = make_mgr({"display_max": dmax})
    assert_works(mgr, "s")
    pid = mgr.daemon_pid()
    assert pid
    base = vm(pid, "VmRSS")
    r = one(mgr, "s", DISPLAY_FLOOD, timeout=300)
    assert r["status"] == "ok", r
    t = r["truncated"]["displays"]
    assert t["kept_bytes"] <= dmax
    assert t["total_bytes"] >= 150 * MiB  # counted as received
    assert t["omitted"] >= 140
    assert "display_max" in t["limit"]
    # saved images: only what display_max let through (clear_output did not reset it)
    assert tree_bytes(mgr.home / "outputs") <= dmax
    assert len(json.dumps(r)) <= 2 * dmax
    # the manager did not keep the flood: 150 MiB came through it
    grown = vm(pid, "VmHWM") - base
    print(f"daemon RSS {base >> 20} MiB, peak growth {grown >> 20} MiB")
    assert grown < 4 * dmax + 32 * MiB, f"daemon grew by {grown >> 20} MiB"
    hist = mgr.home / "sessions" / "s" / "history.jsonl"
    assert hist.stat().st_size <= 8 * MiB
    assert_works(mgr, "s")


def test_big_traceback_and_error_value_are_capped(make_mgr):
    mgr = make_mgr({"output_cap": "16K"})
    code = ("def f(n):\n"
            "    if n == 0:\n"
            "        raise ValueError('v' * (8 << 20))\n"
            "    return f(n - 1)\n"
            "f(150)")
    r = one(mgr, "s", code)
    assert r["status"] == "error"
    e = r["error"]
    assert e["name"] == "ValueError"
    assert len(e["value"].encode()) <= 16 * KiB
    assert e["value_omitted_bytes"] > 0
    assert sum(len(s.encode()) for s in e["traceback"]) <= 16 * KiB + 200
    assert "omitted (output_cap)" in e["traceback"][-1]
    assert len(json.dumps(r)) < 128 * KiB
    assert_works(mgr, "s")


# ------------------------------------------------------------------ history


def test_history_files_stay_under_history_max(make_mgr):
    hmax = 64 * KiB
    mgr = make_mgr({"history_max": hmax})
    filler = "#" + "h" * 4000 + "\n"
    for i in range(40):
        r = one(mgr, "s", filler + f"print({i})")
        assert r["status"] == "ok" and r["stdout"].strip() == str(i)
    sess_hist = mgr.home / "sessions" / "s" / "history.jsonl"
    assert sess_hist.stat().st_size <= hmax
    kernel_hist = glob.glob(str(mgr.run_dir / "*.history.jsonl"))
    assert kernel_hist
    for h in kernel_hist:
        assert os.path.getsize(h) <= hmax
        for line in Path(h).read_text().splitlines():
            json.loads(line)  # compaction never leaves a torn record
    lines = sess_hist.read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    assert recs[-1]["code"].endswith("print(39)")  # the newest are kept
    p = mgr.run("export", "--session", "s", "-o", str(mgr.home / "s.ipynb"))
    assert p.returncode == 0, p.stderr
    assert_works(mgr, "s")


def test_history_torn_record_is_recovered(make_mgr):
    mgr = make_mgr()
    assert_works(mgr, "s")
    hist = mgr.home / "sessions" / "s" / "history.jsonl"
    with open(hist, "a") as f:
        f.write('{"language": "python", "code": "tor')  # a crash mid-append
    assert_works(mgr, "s")
    for line in hist.read_text().splitlines():
        json.loads(line)


# ------------------------------------------------------------------ pruning


def test_finished_run_leaves_no_history_or_packages(make_mgr):
    mgr = make_mgr()
    rc, res, p = mgr.results("run", "--lang", "python", "-c", "print('hi')")
    assert rc == 0 and res[0]["stdout"].strip() == "hi", p.stderr
    assert not glob.glob(str(mgr.run_dir / "*.history.jsonl"))
    assert not [d for d in glob.glob(str(mgr.home / "packages" / "*"))], \
        "a finished run left its package directory"
    assert not glob.glob(str(mgr.home / "sessions" / "run-*"))
    # a closed session leaves nothing either
    assert_works(mgr, "s")
    assert mgr.run("close", "--session", "s").returncode == 0
    assert not (mgr.home / "sessions" / "s").exists()
    assert not (mgr.home / "packages" / "s").exists()
    assert not (mgr.home / "outputs" / "s").exists()
    assert not glob.glob(str(mgr.run_dir / "*.history.jsonl"))


# ------------------------------------------------------------------ full state filesystem


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_full_state_filesystem_gives_clear_errors_and_corrupts_nothing(make_mgr):
    mgr = make_mgr({"output_cap": "4K"})
    cfg = (mgr.home / "config.json").read_text()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs",
                        str(mgr.home)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    try:
        (mgr.home / "config.json").write_text(cfg)
        assert_works(mgr, "s")
        filler = mgr.home / "filler"
        # fill the state filesystem from the host side
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (256 * KiB))
                    f.flush()
            except OSError:
                pass
        r = one(mgr, "s", "import sys\nsys.stdout.write('q' * (2 << 20))\nprint('end')")
        t = r["truncated"]["stdout"]
        assert t["spill"] is None
        assert "No space left on device" in t["spill_error"]
        assert str(mgr.home / "outputs") in t["spill_error"]
        assert "No space left on device" in r["stdout"]  # the marker says why
        # nothing half-written was left
        for f in (mgr.home / "outputs").rglob("*"):
            assert f.stat().st_size == 0 or f.suffix != ".stdout", f
        filler.unlink()
        assert_works(mgr, "s")
        json.loads((mgr.home / "sessions" / "s" / "session.json").read_text())
        for line in (mgr.home / "sessions" / "s" / "history.jsonl").read_text().splitlines():
            json.loads(line)
    finally:
        mgr.close_daemon_only = True
        mgr.run("serve", "--stop", timeout=30)
        poll(lambda: subprocess.run(["umount", str(mgr.home)]).returncode == 0, timeout=30,
             what="the tmpfs to unmount")
