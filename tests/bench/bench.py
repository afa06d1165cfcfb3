#!/usr/bin/python3
"""make bench: kernelmgr side by side with ipykernel, through the same client.

Benchmarks are measurements, not tests: nothing here fails on a slow number.
Each benchmark prints a table row; a row whose piece is missing (a kernel
binary, the manager, bubblewrap) says "skipped: <reason>", and a row whose
piece is broken says "error: <reason>" -- the run goes on either way.

Environment:
  BENCH_QUICK=1        few iterations (for working on the harness)
  BENCH_ONLY=1,3,6     run only these sections (9: start via jupyter_client,
                       10: one-shot `kernelmgr run`, 11: warm-session entry
                       points: CLI exec, daemon socket, MCP, long output;
                       12: the notebook corpus through nbclient;
                       13: `x = 1` through the gateway's kernel WebSocket;
                       14: the cost of a durable session.json write;
                       15: density: idle sessions' measured memory and
                       how many this host's memory budget admits, RSS per
                       idle session and the sessions a 24 GiB machine holds;
                       16: the debugger: start and per-cell cost without
                       debugpy, with it unused, with a debugger attached;
                       17: snapshots: take and restore, a fork's first
                       exec vs a cold start, a session moved between
                       two daemons; 18: the egress proxy's cost
                       per request; 19: a kernel start inside a session's
                       sandbox vs a new sandbox, idle memory; 20: a Python
                       kernel forked by its session's zygote vs cold: first
                       and later kernel, CPU per start, the zygote's memory,
                       and the same with --ipython on (the zygote preloads
                       IPython) vs ipykernel; 21: start_kernel
                       -> first execute_reply through the stock
                       jupyter_client, no wait_for_ready, and CPU per start)
  BUILD=DIR            build directory (default ./build)
  BENCH_PYTHON=PATH    interpreter our python kernel runs code with
                       (default /usr/bin/python3, the one ipykernel uses)

Output: the table on stdout, everything measured in BUILD/bench.json.
Run with Debian's /usr/bin/python3 (jupyter_client, ipykernel).
"""
import atexit
import importlib.util
import itertools
import json
import math
import os
import platform
import random
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import zmq
import zmq.asyncio
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("BUILD", ROOT / "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
ONLY = {s.strip() for s in os.environ.get("BENCH_ONLY", "").split(",") if s.strip()}
CODE_PYTHON = os.environ.get("BENCH_PYTHON", "/usr/bin/python3")
REF_PYTHON = "/usr/bin/python3"

# Iteration counts: (quick, full). The full run stays within a few minutes on
# a 2-core machine; medians need ~10 samples, p99 of latency needs hundreds.
N = {
    "cold": (3, 20),
    "rtt_jc": (50, 1000),
    "rtt_c": (200, 3000),
    "lines": (2, 8),
    "mem": (1, 3),
    "conc_sessions": (20, 100),
    "conc_seconds": (4, 20),
    "sbx_cold": (3, 15),
    "zygote": (4, 20),
    "sbx_cells": (2, 4),
    "pool": (3, 15),
    "jc_start": (3, 15),
    "jc_exec": (3, 20),
    "run": (3, 20),
    "entry": (30, 300),
    "entry_out": (1, 3),
    "corpus": (1, 3),
    "gw_rtt": (30, 500),
    "state_writes": (50, 500),
    "density": (4, 16),
    "dbg_cold": (3, 15),
    "dbg_cells": (30, 400),
}


def n_of(key):
    return N[key][0 if QUICK else 1]


LINES = 200_000
CELL_TIMEOUT = 120

# ---------------------------------------------------------------- helpers


def stats(xs):
    """Median, p99 (nearest rank), min, max, n of a list of numbers."""
    xs = sorted(xs)
    if not xs:
        return None
    k = max(0, math.ceil(0.99 * len(xs)) - 1)
    return {"n": len(xs), "median": statistics.median(xs), "p99": xs[k], "min": xs[0],
            "max": xs[-1], "mean": statistics.fmean(xs)}


def binary(name):
    p = BUILD / name
    return str(p) if os.access(p, os.X_OK) else None


class Skip(Exception):
    """A benchmark whose piece is missing: the row says so."""


_live = []  # Popen objects still running, killed at exit


def _proc_children():
    """{ppid: [pid, ...]} from /proc/*/stat."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(b")") + 2:].split()
        kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def tree_pids(root):
    """root and all its descendants (sandboxed ones too: the host sees them)."""
    kids = _proc_children()
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def pss_kb(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def stop_tree(proc, grace=5.0):
    """SIGTERM the process, wait, then SIGKILL whatever of its tree is left."""
    if proc is None:
        return
    pids = tree_pids(proc.pid) if proc.poll() is None else []
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        except OSError:
            pass
    for p in reversed(pids):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.kill()
    except OSError:
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if proc in _live:
        _live.remove(proc)


@atexit.register
def _cleanup():
    for p in list(_live):
        stop_tree(p, grace=2)


def _on_signal(sig, frame):
    _cleanup()
    sys.exit(128 + sig)


signal.signal(signal.SIGTERM, _on_signal)

WORK = Path(tempfile.mkdtemp(prefix="kmbench", dir="/tmp"))
atexit.register(lambda: shutil.rmtree(WORK, ignore_errors=True))
_seq = [0]


def workdir(tag):
    _seq[0] += 1
    d = WORK / f"{tag}{_seq[0]}"
    d.mkdir(parents=True)
    return d


# ZeroMQ retries a refused connect every 100 ms by default; a cold-start
# client connects before the kernel has bound, so that interval would be
# measured instead of the kernel. Both kernels get the same 2 ms.
ZCTX = zmq.asyncio.Context()
ZCTX.setsockopt(zmq.RECONNECT_IVL, 2)
ZCTX.setsockopt(zmq.LINGER, 0)

# ---------------------------------------------------------------- kernels


class KernelSpec:
    """How to start one kind of kernel: name, argv builder, transport."""

    def __init__(self, name, argv, transport="tcp", need=None):
        self.name = name
        self._argv = argv
        self.transport = transport
        self.need = need  # reason to skip, or None

    def argv(self, cf, ws):
        return self._argv(cf, ws)


def ours(lang, sandbox="strict", transport="tcp", wrap=None, name=None, python=None,
         ipython=False):
    exe = binary("kernel-" + lang)
    extra = ["--python", python or CODE_PYTHON] if lang == "python" else []
    if ipython:
        extra += ["--ipython", "on"]
    need = None if exe else f"build/kernel-{lang} not built"
    if wrap == "bwrap" and not shutil.which("bwrap"):
        need = "bwrap not installed (Debian bubblewrap)"

    def argv(cf, ws):
        cmd = [exe, "-f", cf, "--workspace", ws, "--sandbox", sandbox, *extra]
        if wrap == "bwrap":
            wd = str(Path(cf).parent)
            # the whole kernel (server + unsandboxed worker) in bubblewrap;
            # ipc sockets live in wd, the one writable host directory
            cmd = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                   "--tmpfs", "/tmp", "--bind", wd, wd, "--unshare-all", "--die-with-parent",
                   "--new-session", *cmd]
        return cmd

    label = name or f"kernel-{lang}" + ("" if sandbox == "strict" else f" --sandbox {sandbox}") \
        + (" in bwrap" if wrap else "")
    return KernelSpec(label, argv, transport, need)


def ipykernel(transport="tcp"):
    need = None
    if importlib.util.find_spec("ipykernel") is None:
        need = "ipykernel not installed (Debian python3-ipykernel)"
    return KernelSpec("ipykernel", lambda cf, ws: [REF_PYTHON, "-m", "ipykernel_launcher", "-f", cf],
                      transport, need)


class Kernel:
    """A kernel process and a BlockingKernelClient connected to it.

    The client is connected before the process starts, so start() measures
    spawn -> first execute_reply and nothing of the client's own setup."""

    def __init__(self, spec, tag="k"):
        if spec.need:
            raise Skip(spec.need)
        self.spec = spec
        self.wd = workdir(tag)
        self.ws = self.wd / "ws"
        self.ws.mkdir()
        self.cf = str(self.wd / "kernel.json")
        kw = {"ip": str(self.wd / "ipc")} if spec.transport == "ipc" else {}
        write_connection_file(self.cf, transport=spec.transport, **kw)
        self.kc = BlockingKernelClient(connection_file=self.cf, context=ZCTX)
        self.kc.load_connection_file()
        self.kc.start_channels()
        self.proc = None
        self.log_path = self.wd / "kernel.log"
        self.cold_s = None

    def start(self, timeout=60):
        """Spawns the kernel, runs a trivial cell; returns spawn -> reply in s."""
        env = dict(os.environ)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # pyc caching as users have it
        log = open(self.log_path, "wb")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.spec.argv(self.cf, str(self.ws)), stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.ws, env=env)
        _live.append(self.proc)
        log.close()
        mid = self.kc.execute("1" if "bash" not in self.spec.name else "true")
        deadline = t0 + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.name}: no first execute_reply "
                                   f"({'exited ' + str(self.proc.returncode) if self.proc.poll() is not None else 'timeout'}): "
                                   f"{self.log_tail()}")
            try:
                m = self.kc.get_shell_msg(timeout=min(left, 0.5))
            except Exception:
                continue
            if m["parent_header"].get("msg_id") == mid:
                break
        self.cold_s = time.perf_counter() - t0
        if m["content"].get("status") != "ok":
            raise RuntimeError(f"{self.spec.name}: first cell failed: {m['content']}")
        return self.cold_s

    def sync(self, timeout=30):
        """Makes sure iopub is subscribed (a SUB misses what came before) and
        drains what is queued: kernel_info_request until a status arrives."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            self.kc.kernel_info()
            try:
                self.kc.get_iopub_msg(timeout=0.2)
                break
            except Exception:
                continue
        else:
            raise RuntimeError(f"{self.spec.name}: iopub never answered")
        time.sleep(0.05)
        for ch in (self.kc.get_iopub_msg, self.kc.get_shell_msg):
            while True:
                try:
                    ch(timeout=0.05)
                except Exception:
                    break

    def cell(self, code, timeout=CELL_TIMEOUT):
        """Runs code; returns (seconds until reply and idle, stdout newlines, reply)."""
        t0 = time.perf_counter()
        mid = self.kc.execute(code)
        deadline = t0 + timeout
        newlines = 0
        while True:  # iopub until idle: output is what the caller waits for
            left = deadline - time.perf_counter()
            if left <= 0:
                raise RuntimeError(f"{self.spec.name}: no idle within {timeout}s")
            m = self.kc.get_iopub_msg(timeout=left)
            if m["parent_header"].get("msg_id") != mid:
                continue
            t = m["msg_type"]
            if t == "stream":
                newlines += m["content"]["text"].count("\n")
            elif t == "status" and m["content"]["execution_state"] == "idle":
                break
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise RuntimeError(f"{self.spec.name}: no execute_reply within {timeout}s")
            m = self.kc.get_shell_msg(timeout=left)
            if m["parent_header"].get("msg_id") == mid:
                break
        dt = time.perf_counter() - t0
        if m["content"].get("status") != "ok":
            raise RuntimeError(f"{self.spec.name}: cell failed: {m['content']}")
        return dt, newlines, m

    def detach(self):
        """Disconnects the Python client, before the C client takes over.
        Needed: our kernel's iopub is an XPUB with ZMQ_XPUB_NODROP, so a
        subscriber that stays connected but stops reading (this idle
        BlockingKernelClient) eventually blocks iopub for every client and
        the kernel stalls (found by this benchmark; see the report).
        ipykernel's PUB drops for the slow subscriber instead."""
        try:
            self.kc.stop_channels()
        except Exception:  # noqa: BLE001
            pass

    def pids(self):
        return tree_pids(self.proc.pid) if self.proc and self.proc.poll() is None else []

    def pss_kb(self):
        return sum(pss_kb(p) for p in self.pids())

    def log_tail(self, n=300):
        try:
            return self.log_path.read_text(errors="replace")[-n:].strip().replace("\n", " | ")
        except OSError:
            return ""

    def close(self):
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        stop_tree(self.proc)


def started(spec, tag="k"):
    k = Kernel(spec, tag)
    try:
        k.start()
        k.sync()
    except BaseException:
        k.close()
        raise
    return k


# ---------------------------------------------------------------- C client

RTT_BIN = BUILD / "bench" / "rtt_client"
_rtt_state = {"err": None, "built": False}


def rtt_client():
    """Builds build/bench/rtt_client from tests/bench/rtt_client.c and the
    protocol and common sources (only those layers are needed, so a
    half-built manager does not matter). Returns its path or raises Skip."""
    if _rtt_state["built"]:
        return str(RTT_BIN)
    if _rtt_state["err"]:
        raise Skip(_rtt_state["err"])
    src = ROOT / "tests" / "bench" / "rtt_client.c"
    # protocol/ and the common/ helpers it uses (the layer below it)
    proto = sorted(str(p) for d in ("protocol", "common") for p in (ROOT / d).glob("*.c"))
    try:
        flags = subprocess.run(["pkg-config", "--cflags", "--libs", "libzmq", "libsodium",
                                "jansson"], capture_output=True, text=True, check=True,
                               timeout=30).stdout.split()
        RTT_BIN.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["gcc", "-std=gnu11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror",
               "-Wno-unused-parameter", f"-I{ROOT}", f"-I{ROOT / 'protocol'}", "-o", str(RTT_BIN),
               str(src), *proto, *flags, "-lpthread"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode:
            raise RuntimeError(p.stderr.strip()[-400:])
    except Exception as e:  # noqa: BLE001
        _rtt_state["err"] = f"rtt_client does not build: {e}"
        raise Skip(_rtt_state["err"])
    _rtt_state["built"] = True
    return str(RTT_BIN)


def c_client(cf, code, iters, warmup=5, timeout=30):
    exe = rtt_client()
    p = subprocess.run([exe, cf, code, str(iters), str(warmup), str(timeout)],
                       capture_output=True, text=True, timeout=timeout * (iters + warmup) + 30)
    if p.returncode:
        raise RuntimeError(p.stderr.strip()[-300:])
    return json.loads(p.stdout)


# ---------------------------------------------------------------- results

ROWS = []  # (section, label, ours, ref, ratio, target, result)
DATA = {}


def fmt_ms(s):
    if s is None:
        return "-"
    return f"{s['median']:.1f} ms (p99 {s['p99']:.1f})"


def fmt_us(s):
    return f"{s['median']:.0f} µs (p99 {s['p99']:.0f})"


def row(section, label, ours="", ref="", ratio="", target="", result=""):
    ROWS.append((section, label, ours, ref, ratio, target, result))
    print(f"  [{section}] {label}: {ours} | {ref} | {ratio} | {target} {result}", flush=True)


def fx(r):
    """A ratio: two decimals below 10 so that 2.99x is not shown as 3.0x."""
    return f"{r:.2f}x" if r < 10 else f"{r:.1f}x"


def verdict(ok):
    return "PASS" if ok else "MISS"


def ms_list(secs):
    return [s * 1000 for s in secs]


def section(num, title, fn):
    if ONLY and str(num) not in ONLY:
        return
    print(f"== {num}. {title}", flush=True)
    t0 = time.perf_counter()
    try:
        fn(num)
    except Skip as e:
        row(num, title, f"skipped: {e}")
    except Exception as e:  # noqa: BLE001
        row(num, title, f"error: {str(e)[:200]}")
        DATA.setdefault("errors", {})[str(num)] = traceback.format_exc()
    DATA.setdefault("section_seconds", {})[str(num)] = round(time.perf_counter() - t0, 1)


def guarded(num, label, fn):
    """Runs one row's measurement; a missing or broken piece becomes the row."""
    try:
        return fn()
    except Skip as e:
        row(num, label, f"skipped: {e}")
    except Exception as e:  # noqa: BLE001
        row(num, label, f"error: {str(e)[:200]}")
        DATA.setdefault("errors", {})[f"{num} {label}"] = traceback.format_exc()
    return None


# ---------------------------------------------------------------- 1. cold start


def cold_samples(specs, n):
    """Interleaved cold starts: each round starts every spec once, in a
    shuffled order. Returns {name: [seconds]} and {name: reason} for skips."""
    out = {s.name: [] for s in specs}
    bad = {}
    for _ in range(n):
        order = [s for s in specs if s.name not in bad]
        random.shuffle(order)
        for s in order:
            try:
                k = Kernel(s, "cold")
            except Skip as e:
                bad[s.name] = f"skipped: {e}"
                continue
            try:
                out[s.name].append(k.start())
            except Exception as e:  # noqa: BLE001
                bad[s.name] = f"error: {str(e)[:200]}"
            finally:
                k.close()
    return out, bad


# the absolute targets for a strict cold start (ms)
COLD_TARGET_MS = {"python": 25, "bash": 12}


def bench_cold(num):
    ref = ipykernel()
    specs = [ours("python"), ours("python", "none"), ours("bash"), ours("bash", "none"), ref]
    ipy = ours("python", name="kernel-python --ipython on", ipython=True)
    specs.append(ipy)
    samples, bad = cold_samples(specs, n_of("cold"))
    st = {k: stats(ms_list(v)) for k, v in samples.items()}
    DATA["cold_start_ms"] = {"stats": st, "failed": bad,
                             "measures": "spawn of the kernel process -> execute_reply of a "
                                         "first cell (python `1`, bash `true`), client "
                                         "connected before the spawn; interleaved rounds"}
    ref_st = st.get(ref.name)
    if ref.name in bad:
        ref_st = None
    for s, target in zip(specs[:4], (15, 15, 50, 50)):
        lab = f"cold start {s.name} (spawn -> first execute_reply)"
        lang = "python" if "python" in s.name else "bash"
        if "--sandbox" not in s.name and s.name not in bad:
            o = st[s.name]
            row(num, f"cold start {s.name}, absolute", fmt_ms(o), "", "",
                f"<= {COLD_TARGET_MS[lang]} ms", verdict(o["median"] <= COLD_TARGET_MS[lang]))
        if s.name in bad:
            row(num, lab, bad[s.name])
            continue
        o = st[s.name]
        if not ref_st:
            row(num, lab, fmt_ms(o), bad.get(ref.name, "-"))
            continue
        r = ref_st["median"] / o["median"]
        strict = "--sandbox" not in s.name
        row(num, lab, fmt_ms(o), fmt_ms(ref_st), fx(r),
            f">= {target}x" if strict else "(info)",
            verdict(r >= target) if strict else "")
    # The `ipython` option on: every cell through IPython's shell, which a
    # cold worker imports and makes at start (the default, off: the stdlib
    # path above). The zygote section measures it forked.
    lab = f"cold start {ipy.name} (IPython path; spawn -> first execute_reply)"
    if ipy.name in bad:
        row(num, lab, bad[ipy.name])
    else:
        o = st[ipy.name]
        row(num, lab, fmt_ms(o), fmt_ms(ref_st) if ref_st else "-",
            fx(ref_st["median"] / o["median"]) if ref_st else "", "(info)", "")


# ---------------------------------------------------------------- 9. start via jupyter_client


def jc_kernelspecs():
    """JUPYTER_PATH holding kernelmgr-python/-bash as `kernelmgr kernelspec
    install` writes them (what a user has) and ipykernel's python3."""
    km = binary("kernelmgr")
    if not km:
        raise Skip("build/kernelmgr not built")
    d = workdir("jcspec")
    p = subprocess.run([km, "kernelspec", "install", "--prefix", str(d / "prefix")],
                       capture_output=True, text=True, timeout=60)
    if p.returncode:
        raise RuntimeError(f"kernelspec install: {p.stderr.strip()[-200:]}")
    share = d / "prefix" / "share" / "jupyter"
    # the same Python kernel with IPython loaded (kernelspec install --ipython on)
    ipy = json.loads((share / "kernels" / "kernelmgr-python" / "kernel.json").read_text())
    ipy["argv"] += ["--ipython", "on"]
    ipy["display_name"] += " (IPython)"
    k = share / "kernels" / "kernelmgr-python-ipython"
    k.mkdir(parents=True, exist_ok=True)
    (k / "kernel.json").write_text(json.dumps(ipy))
    # the floor: a "kernel" that does nothing, so start_kernel is only
    # jupyter_client's launcher (connection file, ports, Popen)
    k = share / "kernels" / "noop"
    k.mkdir(parents=True, exist_ok=True)
    (k / "kernel.json").write_text(json.dumps({
        "argv": ["/bin/sleep", "60"], "display_name": "no-op", "language": "none"}))
    if importlib.util.find_spec("ipykernel") is not None:
        k = share / "kernels" / "python3"
        k.mkdir(parents=True, exist_ok=True)
        (k / "kernel.json").write_text(json.dumps({
            "argv": [REF_PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "ipykernel", "language": "python"}))
    return d, share


def jc_start_once(name, rt):
    """One KernelManager.start_kernel + client.wait_for_ready, as nbclient,
    jupyter console and Notebook do. Returns (seconds to ready, seconds to
    the first kernel_info_reply followed by an IOPub message, i.e. without
    the client's fixed 0.2 s IOPub flush, kernel_info_requests sent, parts):
    parts splits ready into start_kernel (the launcher: connection file,
    Popen), kernel (start_kernel's return -> the kernel_info_reply and the
    first IOPub message after it: the kernel's own share, with the client's
    channel start-up) and flush (the rest: jupyter_client's
    `while True: get_msg(timeout=0.2)` IOPub flush that ends
    _async_wait_for_ready, 7.4.9 client.py), in seconds."""
    from jupyter_client import KernelManager
    km = KernelManager(kernel_name=name)
    kc = None
    sent = [0]
    marks = {}
    try:
        t0 = time.perf_counter()
        km.start_kernel(cwd=str(rt))
        t_started = time.perf_counter()
        kc = km.client()
        kc.start_channels()
        info, shell_get, iopub_get = kc.kernel_info, kc.shell_channel.get_msg, \
            kc.iopub_channel.get_msg

        def kernel_info(*a, **kw):
            sent[0] += 1
            return info(*a, **kw)

        async def sget(*a, **kw):
            m = await shell_get(*a, **kw)
            if m["msg_type"] == "kernel_info_reply":
                marks.setdefault("reply", time.perf_counter())
            return m

        async def iget(*a, **kw):
            m = await iopub_get(*a, **kw)
            if "reply" in marks:
                marks.setdefault("iopub", time.perf_counter())
            return m

        kc.kernel_info, kc.shell_channel.get_msg, kc.iopub_channel.get_msg = \
            kernel_info, sget, iget
        kc.wait_for_ready(timeout=60)
        t1 = time.perf_counter()
        t_iopub = marks.get("iopub", t1)
        parts = {"start_kernel": t_started - t0, "kernel": t_iopub - t_started,
                 "to_reply": marks.get("reply", t1) - t_started, "flush": t1 - t_iopub}
        return t1 - t0, t_iopub - t0, sent[0], parts
    finally:
        if kc is not None:
            kc.stop_channels()
        km.shutdown_kernel(now=True)


def bench_jc_start(num):
    d, share = jc_kernelspecs()
    old = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "JUPYTER_RUNTIME_DIR",
                                          "PYDEVD_DISABLE_FILE_VALIDATION")}
    os.environ.update(JUPYTER_PATH=str(share), JUPYTER_RUNTIME_DIR=str(d / "rt"),
                      PYDEVD_DISABLE_FILE_VALIDATION="1")
    names = ["kernelmgr-python", "kernelmgr-bash"]
    if (share / "kernels" / "python3").exists():
        names.append("python3")
    res = {n: {"ready": [], "ours": [], "requests": [], "start_kernel": [], "kernel": [],
               "to_reply": [], "flush": []} for n in names}
    bad = {}
    try:
        for n in names:  # untimed warm-up: caches, page cache, jupyter_client's imports
            try:
                jc_start_once(n, d)
            except Exception as e:  # noqa: BLE001
                bad[n] = f"error: {str(e)[:200]}"
        for _ in range(n_of("jc_start")):
            order = [n for n in names if n not in bad]
            random.shuffle(order)
            for n in order:
                try:
                    ready, kernel, reqs, parts = jc_start_once(n, d)
                except Exception as e:  # noqa: BLE001
                    bad[n] = f"error: {str(e)[:200]}"
                    continue
                res[n]["ready"].append(ready * 1000)
                res[n]["ours"].append(kernel * 1000)
                res[n]["requests"].append(reqs)
                for k, v in parts.items():
                    res[n][k].append(v * 1000)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    st = {n: {"ready": stats(r["ready"]), "kernel_share": stats(r["ours"]),
              "kernel_info_requests_max": max(r["requests"], default=None),
              "starts_with_retry": sum(1 for x in r["requests"] if x > 1),
              "parts": {k: stats(r[k]) for k in ("start_kernel", "kernel", "to_reply", "flush")}}
          for n, r in res.items()}
    DATA["jc_start_ms"] = {"stats": st, "failed": bad,
                           "note": "wait_for_ready ends with a fixed 0.2 s IOPub flush "
                                   "(jupyter_client), included in ready"}
    ref = st.get("python3") if "python3" not in bad else None
    for n in ("kernelmgr-python", "kernelmgr-bash"):
        lab = f"start -> ready via jupyter_client {n}"
        if n in bad:
            row(num, lab, bad[n])
            continue
        o = st[n]
        retries = f"; retries {o['starts_with_retry']}/{o['ready']['n']}"
        if not ref:
            row(num, lab, fmt_ms(o["ready"]) + retries, bad.get("python3", "-"))
        else:
            r = ref["ready"]["median"] / o["ready"]["median"]
            row(num, lab, fmt_ms(o["ready"]) + retries,
                fmt_ms(ref["ready"]) + f"; retries {ref['starts_with_retry']}/{ref['ready']['n']}",
                fx(r), "<= 60 ms", verdict(o["ready"]["median"] <= 60))
        lab = f"start -> kernel_info_reply + IOPub (without the client's 0.2 s flush) {n}"
        if ref:
            r = ref["kernel_share"]["median"] / o["kernel_share"]["median"]
            row(num, lab, fmt_ms(o["kernel_share"]), fmt_ms(ref["kernel_share"]), fx(r), "(info)")
        else:
            row(num, lab, fmt_ms(o["kernel_share"]), "-", "", "(info)")

        def split(x):
            p = x["parts"]
            return (f"start_kernel {p['start_kernel']['median']:.1f} + kernel "
                    f"{p['kernel']['median']:.1f} (kernel_info_reply at "
                    f"{p['to_reply']['median']:.1f}) + client flush {p['flush']['median']:.1f} ms")
        # medians of each part: they need not add up to the median total
        row(num, f"start -> ready split (medians) {n}: the kernel's own share against the "
            f"<= 60 ms target", split(o), split(ref) if ref else "-", "",
            "kernel <= 60 ms", verdict(o["parts"]["kernel"]["median"] <= 60))


def tree_cpu_s(pid):
    """CPU seconds pid's live process tree has used so far: each process's
    own (the sum of its threads' run time, /proc/PID/task/*/schedstat, in
    ns) and what the children it reaped used (cutime + cstime, in ticks). A
    kernel killed at shutdown reaps none of its descendants, so they never
    reach this process's RUSAGE_CHILDREN: the tree is read while it is
    alive. 0 for a pid that is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
            stat = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(stat[13]) + int(stat[14])) / tick  # cutime, cstime
        for t in tasks:
            try:
                total += int(open(f"/proc/{p}/task/{t}/schedstat").read().split()[0]) / 1e9
                todo += [int(c) for c in open(f"/proc/{p}/task/{t}/children").read().split()]
            except OSError:
                pass
    return total


def jc_exec_once(name, rt):
    """KernelManager.start_kernel, then the first execute as a script does it
    (no wait_for_ready): execute() right after start_channels(), with
    jupyter_client's own context (ZeroMQ's default 100 ms reconnect
    interval: a kernel that binds late is paid for here). Returns (seconds
    from start_kernel to the execute_reply, CPU seconds of the kernel's
    process tree from its spawn to that reply: tree_cpu_s)."""
    from jupyter_client import KernelManager
    km = KernelManager(kernel_name=name)
    kc = None
    try:
        t0 = time.perf_counter()
        km.start_kernel(cwd=str(rt), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kc = km.client()
        kc.start_channels()
        mid = kc.execute("true" if "bash" in name else "1")
        deadline = t0 + 60
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not km.is_alive():
                raise RuntimeError(f"{name}: no first execute_reply")
            try:
                m = kc.get_shell_msg(timeout=min(left, 0.5))
            except Exception:  # noqa: BLE001
                continue
            if m["parent_header"].get("msg_id") == mid:
                break
        t1 = time.perf_counter()
        cpu = tree_cpu_s(km.provisioner.process.pid)
        if m["content"].get("status") != "ok":
            raise RuntimeError(f"{name}: first cell failed: {m['content']}")
    finally:
        if kc is not None:
            kc.stop_channels()
        km.shutdown_kernel(now=True)
    return t1 - t0, cpu


def jc_noop_once(rt):
    """start_kernel of the no-op kernelspec alone: what the launcher costs
    before any kernel runs (seconds)."""
    from jupyter_client import KernelManager
    km = KernelManager(kernel_name="noop")
    t0 = time.perf_counter()
    km.start_kernel(cwd=str(rt), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = time.perf_counter() - t0
    km.shutdown_kernel(now=True)
    return t


# the targets through the stock client (ms): strict, Python with IPython
# loaded and bash
JC_EXEC_TARGET_MS = {"kernelmgr-python-ipython": 15, "kernelmgr-bash": 12}


def bench_jc_exec(num):
    d, share = jc_kernelspecs()
    old = {k: os.environ.get(k) for k in ("JUPYTER_PATH", "JUPYTER_RUNTIME_DIR",
                                          "PYDEVD_DISABLE_FILE_VALIDATION")}
    os.environ.update(JUPYTER_PATH=str(share), JUPYTER_RUNTIME_DIR=str(d / "rt"),
                      PYDEVD_DISABLE_FILE_VALIDATION="1")
    names = ["kernelmgr-python", "kernelmgr-python-ipython", "kernelmgr-bash"]
    if (share / "kernels" / "python3").exists():
        names.append("python3")
    res = {n: {"ms": [], "cpu_ms": []} for n in names}
    noop = []
    bad = {}
    try:
        for n in names:  # untimed warm-up: caches, page cache, jupyter_client's imports
            try:
                jc_exec_once(n, d)
            except Exception as e:  # noqa: BLE001
                bad[n] = f"error: {str(e)[:200]}"
        jc_noop_once(d)
        for _ in range(n_of("jc_exec")):
            order = [n for n in names if n not in bad] + ["noop"]
            random.shuffle(order)
            for n in order:
                if n == "noop":
                    noop.append(jc_noop_once(d) * 1000)
                    continue
                try:
                    t, cpu = jc_exec_once(n, d)
                except Exception as e:  # noqa: BLE001
                    bad[n] = f"error: {str(e)[:200]}"
                    continue
                res[n]["ms"].append(t * 1000)
                res[n]["cpu_ms"].append(cpu * 1000)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    st = {n: {"first_reply": stats(r["ms"]), "cpu": stats(r["cpu_ms"])} for n, r in res.items()}
    DATA["jc_exec_ms"] = {"stats": st, "failed": bad, "start_kernel_noop": stats(noop),
                          "measures": "KernelManager.start_kernel -> execute_reply of a first "
                                      "cell sent right after start_channels (no "
                                      "wait_for_ready, jupyter_client's default context); cpu: "
                                      "the kernel's process tree, spawn to that reply "
                                      "(read live from /proc)"}
    ref = st.get("python3") if "python3" not in bad else None
    row(num, "start_kernel alone of a kernel that does nothing (/bin/sleep): jupyter_client's "
        "launcher, the floor under every row below", fmt_ms(stats(noop)), "", "", "(info)")
    for n in ("kernelmgr-python", "kernelmgr-python-ipython", "kernelmgr-bash"):
        lab = f"start_kernel -> first execute_reply, stock jupyter_client, {n} (strict)"
        if n in bad:
            row(num, lab, bad[n])
            continue
        o = st[n]["first_reply"]
        tgt = JC_EXEC_TARGET_MS.get(n)
        target, result = (f"<= {tgt} ms", verdict(o["median"] <= tgt)) if tgt else ("(info)", "")
        if ref:
            row(num, lab, fmt_ms(o), fmt_ms(ref["first_reply"]),
                fx(ref["first_reply"]["median"] / o["median"]), target, result)
        else:
            row(num, lab, fmt_ms(o), bad.get("python3", "-"), "", target, result)
        lab = f"CPU per start (kernel process tree, spawn to first reply), {n}"
        c = st[n]["cpu"]
        if ref:
            row(num, lab, fmt_ms(c), fmt_ms(ref["cpu"]), fx(ref["cpu"]["median"] / c["median"])
                if c["median"] else "", "(info)")
        else:
            row(num, lab, fmt_ms(c), "-", "", "(info)")


# ---------------------------------------------------------------- 2. round trip


def bench_rtt(num):
    py = ours("python")
    bash = ours("bash")
    ref = ipykernel()
    ks = {}
    for spec in (py, bash, ref):
        k = guarded(num, f"start {spec.name}", lambda spec=spec: started(spec, "rtt"))
        if k:
            ks[spec.name] = k
    try:
        stmt = {py.name: "x = 1", bash.name: "x=1", ref.name: "x = 1"}
        n = n_of("rtt_jc")
        lat = {name: [] for name in ks}
        for name, k in ks.items():  # warm up: first cells compile, fill caches
            for _ in range(20):
                k.cell(stmt[name])
        for _ in range(n):  # interleaved, one cell each per round
            for name in random.sample(list(ks), len(ks)):
                lat[name].append(ks[name].cell(stmt[name])[0])
        st = {name: stats(ms_list(v)) for name, v in lat.items()}
        DATA["rtt_jupyter_client_ms"] = st
        ref_st = st.get(ref.name)
        for spec in (py, bash):
            if spec.name not in st:
                continue
            o = st[spec.name]
            lab = f"round trip via jupyter_client {spec.name}"
            if not ref_st:
                row(num, lab, fmt_ms(o), "no ipykernel")
                continue
            r = ref_st["median"] / o["median"]
            row(num, lab, fmt_ms(o), fmt_ms(ref_st), fx(r), ">= 3x", verdict(r >= 3))

        # Our C client: one run per kernel, alternating in chunks so that
        # machine noise hits both alike.
        for k in ks.values():
            k.detach()
        n = n_of("rtt_c")
        chunks = 5
        clat = {name: [] for name in ks}
        for _ in range(chunks):
            for name in random.sample(list(ks), len(ks)):
                per = n // chunks if name != ref.name else max(20, n // chunks // 4)
                res = guarded(num, f"C client {name}",
                              lambda name=name, per=per: c_client(ks[name].cf, stmt[name], per, 10))
                if not res:
                    return
                if res["status"] != "ok":
                    raise RuntimeError(f"{name}: a cell failed under the C client")
                clat[name].extend(res["lat_us"])
        cst = {name: stats(v) for name, v in clat.items()}
        DATA["rtt_c_client_us"] = cst
        for spec in (py, bash):
            if spec.name not in cst:
                continue
            o = cst[spec.name]
            refs = cst.get(ref.name)
            row(num, f"round trip via C client (jp.h) {spec.name}", fmt_us(o),
                fmt_us(refs) if refs else "-",
                fx(refs['median'] / o['median']) if refs else "",
                "<= 250 µs median", verdict(o["median"] <= 250))
    finally:
        for k in ks.values():
            k.close()


# ---------------------------------------------------------------- 3. throughput


def bench_lines(num):
    py = ours("python")
    bash = ours("bash")
    ref = ipykernel()
    code = {py.name: f"for i in range({LINES}): print(i)", bash.name: f"seq {LINES}",
            ref.name: f"for i in range({LINES}): print(i)"}
    ks = {}
    for spec in (py, bash, ref):
        k = guarded(num, f"start {spec.name}", lambda spec=spec: started(spec, "lines"))
        if k:
            ks[spec.name] = k
    try:
        n = n_of("lines")
        secs = {name: [] for name in ks}
        for name, k in ks.items():  # warm-up run (not timed)
            _, nl, _ = k.cell(code[name])
            if nl != LINES:
                raise RuntimeError(f"{name}: {nl} lines arrived, not {LINES}")
        for _ in range(n):
            for name in random.sample(list(ks), len(ks)):
                dt, nl, _ = ks[name].cell(code[name])
                if nl != LINES:
                    raise RuntimeError(f"{name}: {nl} lines arrived, not {LINES}")
                secs[name].append(dt)
        st = {name: stats(ms_list(v)) for name, v in secs.items()}
        DATA["lines_200k_jupyter_client_ms"] = st
        refs = st.get(ref.name)
        for spec in (py, bash):
            if spec.name not in st:
                continue
            o = st[spec.name]
            lab = f"{LINES} lines via jupyter_client {spec.name}"
            if refs:
                r = refs["median"] / o["median"]
                row(num, lab, fmt_ms(o), fmt_ms(refs), fx(r), ">= 5x", verdict(r >= 5))
            else:
                row(num, lab, fmt_ms(o), "no ipykernel")
        # the same through the C client: what the kernel itself can push
        cst = {}
        for k in ks.values():
            k.detach()
        for name, k in ks.items():
            res = guarded(num, f"{LINES} lines via C client {name}",
                          lambda k=k, name=name: c_client(k.cf, code[name], n, 0))
            if res:
                if res["newlines"] != LINES * n:
                    raise RuntimeError(f"{name}: C client saw {res['newlines']} lines")
                cst[name] = stats([u / 1000 for u in res["lat_us"]])
                cst[name]["iopub_msgs_per_run"] = res["iopub_msgs"] / n
        DATA["lines_200k_c_client_ms"] = cst
        refs = cst.get(ref.name)
        for spec in (py, bash):
            if spec.name in cst:
                o = cst[spec.name]
                row(num, f"{LINES} lines via C client {spec.name}", fmt_ms(o),
                    fmt_ms(refs) if refs else "-",
                    fx(refs['median'] / o['median']) if refs else "", "(info)")
    finally:
        for k in ks.values():
            k.close()


# ---------------------------------------------------------------- 4. memory


def bench_mem(num):
    ref = ipykernel()
    specs = [ours("python"), ours("python", "none"), ours("bash"), ours("bash", "none"), ref]
    kb = {s.name: [] for s in specs}
    procs = {}
    bad = {}
    for _ in range(n_of("mem")):
        for s in random.sample(specs, len(specs)):
            if s.name in bad:
                continue
            try:
                k = started(s, "mem")
            except Skip as e:
                bad[s.name] = f"skipped: {e}"
                continue
            except Exception as e:  # noqa: BLE001
                bad[s.name] = f"error: {str(e)[:200]}"
                continue
            try:
                k.cell("x = 1" if "bash" not in s.name else "x=1")
                time.sleep(1.0)  # idle: let lazy work (history writers etc.) settle
                kb[s.name].append(k.pss_kb())
                procs[s.name] = len(k.pids())
            finally:
                k.close()
    st = {n: stats([v / 1024 for v in x]) for n, x in kb.items() if x}
    DATA["idle_pss_mib"] = {"stats": st, "processes": procs, "failed": bad}
    refs = st.get(ref.name)
    for s in specs[:4]:
        lab = f"idle PSS {s.name}"
        if s.name in bad:
            row(num, lab, bad[s.name])
            continue
        o = st[s.name]
        ov = f"{o['median']:.1f} MiB ({procs[s.name]} procs)"
        if not refs:
            row(num, lab, ov, bad.get(ref.name, "-"))
            continue
        r = refs["median"] / o["median"]
        rv = f"{refs['median']:.1f} MiB ({procs[ref.name]} procs)"
        strict = "--sandbox" not in s.name
        row(num, lab, ov, rv, fx(r), ">= 3x" if strict else "(info)",
            verdict(r >= 3) if strict else "")


# ---------------------------------------------------------------- daemon


class Daemon:
    """build/kernelmgr serve with a private KERNELMGR_HOME."""

    def __init__(self, config, args=()):
        km = binary("kernelmgr")
        if not km:
            raise Skip("build/kernelmgr not built")
        self.km = km
        # short path: it holds a unix socket
        self.home = Path(tempfile.mkdtemp(prefix="kmb", dir="/tmp"))
        (self.home / "config.json").write_text(json.dumps(config))
        self.env = dict(os.environ, KERNELMGR_HOME=str(self.home))
        self.sock = str(self.home / "kernelmgr.sock")
        self.log = open(self.home / "bench-daemon.log", "wb")
        self.proc = subprocess.Popen([km, "serve", *args], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=self.env)
        _live.append(self.proc)
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kernelmgr serve exited {self.proc.returncode}: "
                                   f"{self.log_tail()}")
            try:
                c = DaemonConn(self.sock)
                r = c.call(rpc("ping"), timeout=5)
                c.close()
                if r.get("ok"):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("kernelmgr serve: socket never answered")
            time.sleep(0.05)

    def log_tail(self, n=300):
        try:
            return (self.home / "bench-daemon.log").read_text(errors="replace")[-n:].replace(
                "\n", " | ")
        except OSError:
            return ""

    def close(self):
        try:
            c = DaemonConn(self.sock)
            c.call(rpc("shutdown"), timeout=30)
            c.close()
            self.proc.wait(30)
        except Exception:  # noqa: BLE001
            pass
        stop_tree(self.proc)
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


_rpc_ids = itertools.count(1)


def rpc(method, params=None):
    """A request of the daemon's API (JSON-RPC 2.0, docs/API.md)."""
    return {"jsonrpc": "2.0", "id": next(_rpc_ids), "method": method,
            "params": {} if params is None else params}


def rpc_reply(o):
    """A response as the measurements read it: {"ok": True, **result} or
    {"ok": False, "error": ...}."""
    if "result" in o:
        return dict(o["result"], ok=True)
    return {"ok": False, "error": o.get("error")}


class DaemonConn:
    """One blocking connection to the daemon (JSON-RPC lines)."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(10)
        self.s.connect(path)
        self.buf = b""

    def call(self, req, timeout=CELL_TIMEOUT):
        self.s.settimeout(timeout)
        self.s.sendall(json.dumps(req).encode() + b"\n")
        while True:
            while b"\n" not in self.buf:
                chunk = self.s.recv(1 << 16)
                if not chunk:
                    raise OSError("daemon closed the connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            o = json.loads(line)
            if "method" not in o:
                return rpc_reply(o)

    def close(self):
        self.s.close()


def exec_ok(reply):
    if not reply.get("ok"):
        return f"daemon error: {reply.get('error')}"
    res = reply.get("results") or []
    if not res or any(r.get("status") != "ok" for r in res):
        return f"block failed: {json.dumps(res)[:200]}"
    return None


def daemon_langs():
    return [lang for lang in ("python", "bash") if binary("kernel-" + lang)]


def daemon_config(**kw):
    cfg = {"sandbox": "strict", "python": CODE_PYTHON, "max_kernels": 256,
           "idle_timeout": 3600, "languages": daemon_langs()}
    cfg.update(kw)
    return cfg


# ---------------------------------------------------------------- 5. concurrency


def load_loop(sock_path, sessions, code, seconds, interval=0.0, timeout=CELL_TIMEOUT):
    """One connection per session, for `seconds`. interval 0: each sends its
    next exec as soon as the last one answered (saturation: latency is then
    bounded below by sessions / throughput, Little's law). interval > 0: each
    session starts one exec every `interval` seconds (an agent that thinks
    between calls), from a random phase, or at once when it is late.
    Returns (latencies s, errors, wall s, client CPU s)."""
    sel = selectors.DefaultSelector()
    conns = []
    for name in sessions:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
        s.setblocking(False)
        st = {"sock": s, "name": name, "buf": b"", "t0": 0.0, "due": None}
        conns.append(st)
        sel.register(s, selectors.EVENT_READ, st)
    lat, errors = [], []
    def send(st):
        r = rpc("exec", {"code": code, "lang": "python", "session": st["name"]})
        st["t0"] = time.perf_counter()
        st["due"] = None
        st["sock"].setblocking(True)
        st["sock"].sendall(json.dumps(r).encode() + b"\n")
        st["sock"].setblocking(False)

    cpu0 = time.process_time()
    start = time.perf_counter()
    stop_at = start + seconds
    outstanding = 0
    for st in conns:
        if interval:
            st["due"] = start + random.uniform(0, interval)
        else:
            send(st)
            outstanding += 1
    hard_stop = stop_at + timeout
    while outstanding or any(st["due"] is not None for st in conns):
        now = time.perf_counter()
        if now > hard_stop:
            errors.append(f"{outstanding} requests unanswered at the deadline")
            break
        wait = 1.0
        for st in conns:
            if st["due"] is not None:
                if st["due"] <= now:
                    if now < stop_at:
                        send(st)
                        outstanding += 1
                    else:
                        st["due"] = None
                else:
                    wait = min(wait, st["due"] - now)
        for key, _ in sel.select(timeout=max(wait, 0)):
            st = key.data
            try:
                chunk = st["sock"].recv(1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                errors.append(f"{st['name']}: connection closed")
                sel.unregister(st["sock"])
                outstanding -= 1
                continue
            st["buf"] += chunk
            while b"\n" in st["buf"]:
                line, st["buf"] = st["buf"].split(b"\n", 1)
                o = json.loads(line)
                if "method" in o:
                    continue
                o = rpc_reply(o)
                now = time.perf_counter()
                lat.append(now - st["t0"])
                outstanding -= 1
                e = exec_ok(o)
                if e:
                    errors.append(f"{st['name']}: {e}")
                elif now < stop_at:
                    if interval:
                        st["due"] = max(now, st["t0"] + interval)
                    else:
                        send(st)
                        outstanding += 1
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    for st in conns:
        st["sock"].close()
    return lat, errors, wall, cpu


def bench_concurrency(num):
    nsess = n_of("conc_sessions")
    if not binary("kernelmgr"):
        return bench_concurrency_direct(num, nsess, "build/kernelmgr not built")
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    d = Daemon(daemon_config())
    try:
        names = [f"c{i}" for i in range(nsess)]

        def create(name):
            c = DaemonConn(d.sock)
            try:
                t0 = time.perf_counter()
                r = c.call(rpc("exec", {"session": name, "code": "x = 0", "lang": "python"}))
                return time.perf_counter() - t0, exec_ok(r)
            finally:
                c.close()

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=8) as ex:
            made = list(ex.map(create, names))
        setup_s = time.perf_counter() - t0
        errs = [e for _, e in made if e]
        if errs:
            raise RuntimeError(f"{len(errs)} sessions failed to start: {errs[0]} "
                               f"{d.log_tail()}")
        first = stats(ms_list([t for t, _ in made]))
        conc = {"via": "daemon (kernelmgr serve, unix socket, op exec)", "sessions": nsess,
                "session_first_result_ms": first, "setup_s": setup_s,
                "client": "one Python selectors loop, one unix-socket connection per session"}
        DATA["concurrency"] = conc
        row(num, f"{nsess} sessions via daemon: session start (8 at a time)", fmt_ms(first),
            "", "", "(info)")
        interval = 0.1
        for mode, iv in (("saturated", 0.0), (f"paced 1 exec/{interval:g}s each", interval)):
            lat, errors, wall, cpu = load_loop(d.sock, names, "x += 1", n_of("conc_seconds"), iv)
            st = stats(ms_list(lat))
            tput = len(lat) / wall
            conc[mode] = {"seconds": wall, "execs": len(lat), "throughput_per_s": tput,
                          "latency_ms": st, "client_cpu_share": cpu / wall,
                          "errors": errors[:20]}
            if errors:
                row(num, f"{nsess} sessions via daemon, {mode}",
                    f"error: {len(errors)} errors: {errors[0][:150]}")
                continue
            bound = f", >= {nsess / tput * 1000:.0f} ms mean by Little's law" if not iv else ""
            row(num, f"{nsess} sessions via daemon, {mode}: x += 1",
                f"{fmt_ms(st)}, {tput:.0f} exec/s (client {cpu / wall:.0%} CPU{bound})",
                "", "", "p99 <= 20 ms", verdict(st["p99"] <= 20))
    finally:
        d.close()


def bench_concurrency_direct(num, nsess, why):
    """No manager: one kernel per session, one C client process each."""
    spec = ours("python")
    if spec.need:
        raise Skip(f"{why}; {spec.need}")
    ks = []
    try:
        for i in range(nsess):
            ks.append(started(spec, "conc"))
        per = 50 if QUICK else 200
        t0 = time.perf_counter()
        procs = [subprocess.Popen([rtt_client(), k.cf, "x += 1", str(per), "2", "60"],
                                  stdout=subprocess.PIPE, text=True) for k in ks]
        lat = []
        for p in procs:
            out, _ = p.communicate(timeout=600)
            if p.returncode:
                raise RuntimeError("a C client failed")
            lat.extend(json.loads(out)["lat_us"])
        wall = time.perf_counter() - t0
        st = stats([u / 1000 for u in lat])
        DATA["concurrency"] = {"via": f"direct kernels + C clients ({why})",
                               "sessions": nsess, "execs": len(lat), "latency_ms": st,
                               "throughput_per_s": len(lat) / wall}
        row(num, f"{nsess} sessions, direct kernels ({why})",
            f"{fmt_ms(st)}, {len(lat) / wall:.0f} exec/s", "", "", "p99 <= 20 ms",
            verdict(st["p99"] <= 20))
    finally:
        for k in ks:
            k.close()


# ---------------------------------------------------------------- 6. sandbox


SBX_CELLS = {
    "python": [
        ("x = 1 (C client)", "x = 1", "c", 1000),
        ("CPU: sum(range(3e6))", "sum(range(3_000_000))", "c", 0),
        ("50 x fork+exec /bin/true",
         "import subprocess\nfor _ in range(50): subprocess.run(['/bin/true'])", "c", 0),
        ("1000 x open+stat", "import os\nfor i in range(1000):\n    open('f','w').close(); os.stat('f')",
         "c", 0),
        (f"{LINES} lines", f"for i in range({LINES}): print(i)", "c", 0),
    ],
    "bash": [
        ("x=1 (C client)", "x=1", "c", 1000),
        ("50 x fork+exec /bin/true", "for i in $(seq 50); do /bin/true; done", "c", 0),
        (f"{LINES} lines", f"seq {LINES}", "c", 0),
    ],
}


def bench_sandbox(num):
    for lang in ("python", "bash"):
        modes = {"strict": ours(lang, "strict", "ipc", name=f"{lang} strict"),
                 "none": ours(lang, "none", "ipc", name=f"{lang} none"),
                 "bwrap": ours(lang, "none", "ipc", wrap="bwrap", name=f"{lang} none in bwrap")}
        if modes["strict"].need:
            row(num, f"sandbox overhead {lang}", f"skipped: {modes['strict'].need}")
            continue
        specs = list(modes.values())
        samples, bad = cold_samples(specs, n_of("sbx_cold"))
        res = {"cold_start_ms": {s.name: stats(ms_list(samples[s.name]))
                                 for s in specs if s.name not in bad}, "failed": bad}

        def show(metric, vals, unit_fmt):
            base = vals.get("strict")
            parts = []
            for m in ("none", "bwrap"):
                v = vals.get(m)
                if v is None:
                    parts.append(f"{m}: " + bad.get(modes[m].name, "n/a")[:60])
                else:
                    parts.append(f"{m}: {unit_fmt(v)}")
            ratio = ""
            if base and vals.get("none"):
                ratio = f"{base['median'] / vals['none']['median']:.2f}x of none"
            if base and vals.get("bwrap"):
                ratio += f", {base['median'] / vals['bwrap']['median']:.2f}x of bwrap"
            row(num, f"sandbox {lang} {metric}",
                unit_fmt(base) if base else bad.get(modes["strict"].name, "n/a")[:80],
                "; ".join(parts), ratio, "(info)")

        show("cold start", {m: res["cold_start_ms"].get(s.name) for m, s in modes.items()},
             fmt_ms)
        ks = {}
        for m, s in modes.items():
            if s.name in bad:
                continue
            k = guarded(num, f"start {s.name}", lambda s=s: started(s, "sbx"))
            if k:
                k.detach()
                ks[m] = k
        try:
            for label, code, _, iters in SBX_CELLS[lang]:
                vals = {}
                reps = iters or n_of("sbx_cells")
                if iters and QUICK:
                    reps = 200
                for m, k in list(ks.items()):
                    r = guarded(num, f"sandbox {lang} {label} {m}",
                                lambda k=k, code=code, reps=reps: c_client(k.cf, code, reps, 2))
                    if not r:  # a stalled kernel would time out every later cell
                        k.close()
                        del ks[m]
                    if r:
                        vals[m] = stats(r["lat_us"]) if iters else stats(
                            [u / 1000 for u in r["lat_us"]])
                res[label] = vals
                show(label, vals, fmt_us if iters else fmt_ms)
        finally:
            for k in ks.values():
                k.close()
        DATA.setdefault("sandbox_overhead", {})[lang] = res


# ---------------------------------------------------------------- 7. warm pool


def wait_pool(d, want, timeout=90):
    c = DaemonConn(d.sock)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline:
            r = c.call(rpc("ping"), timeout=10)
            pool = r.get("pool")
            if pool is None:
                raise Skip("the daemon reports no warm pool (ping has no \"pool\")")
            if pool.get("ready", 0) >= want:
                return
            time.sleep(0.05)
        raise RuntimeError(f"warm pool not refilled to {want} in {timeout}s: {d.log_tail()}")
    finally:
        c.close()


def bench_pool(num):
    if not binary("kernelmgr"):
        raise Skip("build/kernelmgr not built")
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    size = 2
    dp = Daemon(daemon_config(), ["--pool", str(size)])
    dn = None
    try:
        dn = Daemon(daemon_config())
        wait_pool(dp, size)
        first = {"pool": [], "nopool": []}
        second = {"pool": [], "nopool": []}
        for i in range(n_of("pool")):
            for tag in random.sample(["pool", "nopool"], 2):
                d = dp if tag == "pool" else dn
                c = DaemonConn(d.sock)
                try:
                    name = f"w{i}"
                    t0 = time.perf_counter()
                    r = c.call(rpc("exec", {"session": name, "code": "1", "lang": "python"}))
                    first[tag].append(time.perf_counter() - t0)
                    e = exec_ok(r)
                    if e:
                        raise RuntimeError(f"{tag}: {e}")
                    t0 = time.perf_counter()
                    r = c.call(rpc("exec", {"session": name, "code": "1", "lang": "python"}))
                    second[tag].append(time.perf_counter() - t0)
                    c.call(rpc("close", {"session": name}))
                finally:
                    c.close()
            wait_pool(dp, size)  # each new session meets a full pool
        st = {k: stats(ms_list(v)) for k, v in first.items()}
        st2 = {k: stats(ms_list(v)) for k, v in second.items()}
        DATA["warm_pool"] = {"pool_size": size, "first_result_ms": st,
                             "second_result_ms": st2}
        r = st["nopool"]["median"] / st["pool"]["median"]
        row(num, "new session's first result, --pool 2 vs none", fmt_ms(st["pool"]),
            fmt_ms(st["nopool"]) + " (no pool)", fx(r), "<= 5 ms median",
            verdict(st["pool"]["median"] <= 5))
        row(num, "same session, second result (daemon exec floor)", fmt_ms(st2["pool"]),
            fmt_ms(st2["nopool"]) + " (no pool)", "", "(info)")
    finally:
        dp.close()
        if dn:
            dn.close()


# ---------------------------------------------------------------- 8. daemon under load


def daemon_rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def burst_sessions(num, d, n, langs, pool):
    """n clients at once, each an exec of a trivial cell in a new session of
    daemon d (whose warm pool holds `pool` sessions): its rows and DATA."""

    def create(i):
        lang = langs[i % len(langs)]
        code = "x = 1" if lang == "python" else "x=1"
        c = DaemonConn(d.sock)
        try:
            t0 = time.perf_counter()
            r = c.call(rpc("exec", {"session": f"l{i}", "code": code, "lang": lang,
                        "timeout": 600}), timeout=600)
            return time.perf_counter() - t0, exec_ok(r)
        finally:
            c.close()

    busy0, self0, mgr0 = machine_busy_s(), time.process_time(), proc_cpu_s(d.proc.pid)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as ex:
        made = list(ex.map(create, range(n)))
    wall = time.perf_counter() - t0
    # CPU of the burst: the whole machine's busy time, less this client's
    # own; the daemon's part from its /proc stat; the rest is the kernels'
    # process trees (servers, sandboxes, workers) and the kernel's work.
    busy = machine_busy_s() - busy0
    client = time.process_time() - self0
    mgr = proc_cpu_s(d.proc.pid) - mgr0
    errs = [e for _, e in made if e]
    st = stats(ms_list([t for t, _ in made]))
    cpu = {"machine_busy_s": busy, "bench_client_s": client, "daemon_s": mgr,
           "kernels_and_rest_s": busy - client - mgr, "cpus": os.cpu_count()}
    DATA["load_sessions_pool" if pool else "load_sessions"] = {
        "sessions": n, "pool": pool, "languages": langs, "first_result_ms": st, "wall_s": wall,
        "failed": len(errs), "errors": errs[:5], "cpu": cpu,
        "measures": "n clients at once, each an exec of a trivial cell in a new session: "
                    "request sent -> result received"}
    how = f"--pool {pool}, full" if pool else "no pool, default cap"
    row(num, f"{n} sessions created at once ({'+'.join(langs)}, {how}): "
        f"exec request of a new session -> its result",
        f"p50 {st['median'] / 1000:.2f} s, p99 {st['p99'] / 1000:.2f} s, "
        f"{n - len(errs)}/{n} ok, wall {wall:.2f} s", "", "", "all ok, p99 <= 1 s",
        verdict(not errs and st["p99"] <= 1000))
    row(num, f"CPU per new session during that burst ({how}; user+sys, {os.cpu_count()} "
        f"CPUs)",
        f"{(busy - client) / n * 1000:.0f} ms: daemon {mgr / n * 1000:.1f} ms, kernels' "
        f"trees and the OS {(busy - client - mgr) / n * 1000:.0f} ms "
        f"(machine busy {busy:.2f} s, this client {client:.2f} s)", "", "", "(info)")


def machine_busy_s():
    """Seconds of CPU time the whole machine spent busy (all CPUs, /proc/stat:
    everything but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid):
    """user+sys seconds of one process (its threads, not its children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def bench_load(num):
    if not binary("kernelmgr"):
        raise Skip("build/kernelmgr not built")
    langs = daemon_langs()
    # 100 sessions created at once with the defaults that matter: the
    # derived max_kernels and the interpreter detected (not configured);
    # then the same burst on a daemon whose warm pool holds 100 sessions
    n = 100
    cfg = daemon_config()
    for k in ("max_kernels", "python"):
        cfg.pop(k, None)
    for pool in (0, n):
        # a full pool holds a Python and a Bash kernel per entry: room for them
        d = Daemon(dict(cfg, max_kernels=4 * n) if pool else cfg,
                   ["--pool", str(pool)] if pool else [])
        try:
            if pool:
                wait_pool(d, pool, timeout=900)
            burst_sessions(num, d, n, langs, pool)
        finally:
            d.close()
    if not binary("kernel-bash"):
        raise Skip("build/kernel-bash not built")
    d = Daemon(daemon_config())
    try:
        env = dict(d.env)
        km = d.km
        subprocess.run([km, "exec", "--session", "burst", "--lang", "bash", "-c", "echo warm"],
                       env=env, stdout=subprocess.DEVNULL, timeout=120, check=True)
        pid = d.proc.pid
        before = daemon_rss_kb(pid)
        peak = [before]
        done = threading.Event()

        def watch():
            while not done.is_set():
                peak[0] = max(peak[0], daemon_rss_kb(pid))
                time.sleep(0.05)

        w = threading.Thread(target=watch)
        w.start()
        t0 = time.perf_counter()
        try:
            subprocess.run([km, "exec", "--session", "burst", "--lang", "bash", "--timeout",
                            "600", "-c", "yes | head -c 1G"], env=env,
                           stdout=subprocess.DEVNULL, timeout=900, check=True)
        finally:
            done.set()
            w.join()
        secs = time.perf_counter() - t0
        after = daemon_rss_kb(pid)
        deadline = time.time() + 30
        while after - before > 64 * 1024 and time.time() < deadline:
            time.sleep(0.1)
            after = daemon_rss_kb(pid)
        DATA["load_rss"] = {"before_kb": before, "peak_kb": peak[0], "after_kb": after,
                            "burst_seconds": secs}
        row(num, "daemon RSS before / after 1 GiB of output via `kernelmgr exec`",
            f"{before / 1024:.0f} -> {after / 1024:.0f} MiB (peak {peak[0] / 1024:.0f} MiB, "
            f"{1024 / secs:.0f} MiB/s)", "", "", "after <= before + 64 MiB",
            verdict(after - before <= 64 * 1024))
    finally:
        d.close()


# ---------------------------------------------------------------- 10. one-shot run


def run_once(argv, env, expect="1"):
    """Wall seconds of one process from spawn to exit (what a shell waits
    for); its stdout must be `expect`."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=120)
    dt = time.perf_counter() - t0
    if p.returncode or p.stdout.decode().strip() != expect:
        raise RuntimeError(f"{argv[0]} exited {p.returncode}: "
                           f"{(p.stdout + p.stderr).decode(errors='replace')[-200:]}")
    return dt


def bench_run(num):
    """`kernelmgr run -c 'print(1)'`: a fresh process, no daemon, no pool,
    strict sandbox; beside the floor of a sandboxed one-shot, the same code
    under bubblewrap (every namespace unshared) with the same interpreter.
    Shuffled rounds, so machine noise hits both alike."""
    km = binary("kernelmgr")
    if not km:
        raise Skip("build/kernelmgr not built")
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    home = workdir("r")
    (home / "config.json").write_text(json.dumps({"python": CODE_PYTHON}))
    env = dict(os.environ, KERNELMGR_HOME=str(home))
    ours_cfg = [km, "run", "-c", "print(1)"]
    home_d = workdir("d")
    env_d = dict(os.environ, KERNELMGR_HOME=str(home_d))
    bw = shutil.which("bwrap")
    ref = ([bw, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all",
            CODE_PYTHON, "-c", "print(1)"] if bw else None)
    # the first run in a fresh KERNELMGR_HOME (its directories created): shown
    # apart; the interpreter probe's cache is per user (~/.cache), not per home
    first = run_once(ours_cfg, env)
    first_d = run_once(ours_cfg, env_d)
    n = n_of("run")
    vals = {"ours": [], "detected": [], "bwrap": []}
    for _ in range(n):
        order = ["ours", "detected"] + (["bwrap"] if ref else [])
        random.shuffle(order)
        for k in order:
            if k == "ours":
                vals[k].append(run_once(ours_cfg, env))
            elif k == "detected":
                vals[k].append(run_once(ours_cfg, env_d))
            else:
                vals[k].append(run_once(ref, env))
    st = {k: stats(ms_list(v)) for k, v in vals.items() if v}
    DATA["run_oneshot"] = {"stats_ms": st, "first_run_ms": first * 1000,
                           "first_run_detected_ms": first_d * 1000, "python": CODE_PYTHON}
    ratio = (fx(st["ours"]["median"] / st["bwrap"]["median"]) + " the floor"
             if "bwrap" in st else "")
    row(num, f"`kernelmgr run -c 'print(1)'` one-shot, cold (python {CODE_PYTHON}); "
        f"first run in a fresh KERNELMGR_HOME {first * 1000:.0f} ms",
        fmt_ms(st["ours"]), ("bwrap + python: " + fmt_ms(st["bwrap"])) if "bwrap" in st
        else "skipped: bwrap not installed (Debian bubblewrap)", ratio, "<= 80 ms",
        verdict(st["ours"]["median"] <= 80))
    row(num, "the same, interpreter detected (no \"python\" configured; "
        f"first run {first_d * 1000:.0f} ms)", fmt_ms(st["detected"]), "", "", "<= 80 ms",
        verdict(st["detected"]["median"] <= 80))


# ---------------------------------------------------------------- 11. entry points, warm session


class McpStdio:
    """`kernelmgr mcp` driven by a raw JSON-RPC client on its stdio (one
    request line, read lines until the answer with our id): the transport
    every MCP client uses, without an SDK's own per-call cost."""

    def __init__(self, km, env):
        self.p = subprocess.Popen([km, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env, bufsize=0)
        _live.append(self.p)
        self.id = 0
        self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "bench", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized", "params": {}})

    def send(self, msg):
        self.p.stdin.write(json.dumps(msg).encode() + b"\n")

    def call(self, method, params):
        self.id += 1
        self.send({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError("kernelmgr mcp closed its stdout")
            o = json.loads(line)
            if o.get("id") == self.id:
                if "error" in o:
                    raise RuntimeError(f"MCP error: {o['error']}")
                return o["result"]

    def code_exec(self, session, code, lang):
        r = self.call("tools/call", {"name": "code_exec", "arguments": {
            "session": session, "code": code, "language": lang, "timeout_s": 600}})
        if r.get("isError") or (r.get("structuredContent") or {}).get("failed"):
            raise RuntimeError(f"code_exec failed: {json.dumps(r)[:300]}")
        return r

    def close(self):
        try:
            self.p.stdin.close()
            self.p.wait(10)
        except Exception:  # noqa: BLE001
            pass
        stop_tree(self.p)


def km_exec_cli(d, session, code, lang, stdout=subprocess.DEVNULL, timeout=CELL_TIMEOUT):
    """One `kernelmgr exec` process; returns its wall time in s."""
    t0 = time.perf_counter()
    p = subprocess.run([d.km, "exec", "--session", session, "--lang", lang, "-c", code],
                       env=d.env, stdout=stdout, stderr=subprocess.PIPE, timeout=timeout)
    dt = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"kernelmgr exec exited {p.returncode}: {p.stderr[-300:]!r}")
    return dt


def spawn_wait(argv, env):
    """posix_spawn (vfork: a Python fork would be timed too) with stdout and
    stderr on /dev/null; returns (wall s, exit status)."""
    fa = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
          (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
          (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0)]
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=fa)
    _, st = os.waitpid(pid, 0)
    return time.perf_counter() - t0, os.waitstatus_to_exitcode(st)


def bench_entry(num):
    if not binary("kernelmgr"):
        raise Skip("build/kernelmgr not built")
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    n = n_of("entry")
    d = Daemon(daemon_config())
    mcp = None
    out = DATA.setdefault("entry_points", {})
    try:
        sess, code = "warm", "x = 2"
        km_exec_cli(d, sess, code, "python")  # creates the session: not timed
        # the reference: the daemon socket itself, a connection per exec as
        # the CLI makes it, and one kept open (what a long-lived client does)
        c = DaemonConn(d.sock)
        req = rpc("exec", {"session": sess, "code": code, "lang": "python"})
        for _ in range(20):
            c.call(req)
        kept, fresh, cli, mcp_l = [], [], [], []
        mcp = McpStdio(d.km, d.env)
        for _ in range(20):
            mcp.code_exec(sess, code, "python")
        # the process floor: the same binary doing no work (`--help`)
        floor, true_floor = [], []
        for i in range(n):
            t0 = time.perf_counter()
            e = exec_ok(c.call(req))
            kept.append(time.perf_counter() - t0)
            if e:
                raise RuntimeError(e)
            t0 = time.perf_counter()
            c2 = DaemonConn(d.sock)
            e = exec_ok(c2.call(dict(req, stream=True)))
            c2.close()
            fresh.append(time.perf_counter() - t0)
            if e:
                raise RuntimeError(e)
            dt, rc = spawn_wait([d.km, "exec", "--session", sess, "--lang", "python", "-c",
                                 code], d.env)
            if rc:
                raise RuntimeError(f"kernelmgr exec exited {rc}")
            cli.append(dt)
            t0 = time.perf_counter()
            mcp.code_exec(sess, code, "python")
            mcp_l.append(time.perf_counter() - t0)
            if i % 4 == 0:
                floor.append(spawn_wait([d.km, "--help"], d.env)[0])
                true_floor.append(spawn_wait(["/bin/true"], d.env)[0])
        c.close()
        st = {k: stats(ms_list(v)) for k, v in (("daemon_socket_kept_conn", kept),
                                                ("daemon_socket_new_conn", fresh),
                                                ("kernelmgr_exec", cli), ("mcp_code_exec", mcp_l),
                                                ("process_floor_help", floor),
                                                ("spawn_floor_bin_true", true_floor))}
        out["latency_ms"] = st
        out["code"] = code
        out["mcp_client"] = "raw JSON-RPC over the server's stdio (bench.py McpStdio)"
        ref = st["daemon_socket_new_conn"]
        row(num, f"`kernelmgr exec --session S -c '{code}'` (warm), vs the daemon socket "
            "(connection per exec)", fmt_ms(st["kernelmgr_exec"]), fmt_ms(ref),
            fx(st["kernelmgr_exec"]["median"] / ref["median"]), "<= 5 ms median",
            verdict(st["kernelmgr_exec"]["median"] <= 5))
        row(num, "  of which: starting the binary (`kernelmgr --help`: exec + loading "
            "libzmq and its 20 libraries)", fmt_ms(st["process_floor_help"]),
            fmt_ms(st["spawn_floor_bin_true"]) + " (/bin/true)", "", "(info)")
        row(num, "daemon socket exec (connection kept open)", fmt_ms(st["daemon_socket_kept_conn"]),
            "", "", "<= 1 ms median", verdict(st["daemon_socket_kept_conn"]["median"] <= 1))
        row(num, "MCP tools/call code_exec (raw JSON-RPC stdio client), vs the daemon socket",
            fmt_ms(st["mcp_code_exec"]), fmt_ms(st["daemon_socket_kept_conn"]),
            fx(st["mcp_code_exec"]["median"] / st["daemon_socket_kept_conn"]["median"]),
            "<= 2 ms median", verdict(st["mcp_code_exec"]["median"] <= 2))

        # long output: bytes/s through the kernel alone (C client on a kernel
        # of the same build and sandbox), through `kernelmgr exec` (stdout to
        # /dev/null) and through MCP tools/call, interleaved
        mib = 20 if QUICK else 100
        loads = [("bash", f"yes | head -c {mib}M", mib << 20),
                 ("python", f"import sys\nfor i in range({mib * 50_000}): print(i)",
                  sum(len(str(i)) + 1 for i in range(mib * 50_000)))]
        rates = {}
        for lang, lcode, nbytes in loads:
            k = guarded(num, f"start kernel-{lang}", lambda lang=lang: started(ours(lang), "entry"))
            if not k:
                continue
            k.detach()
            try:
                secs = {"kernel": [], "cli": [], "mcp": []}
                km_exec_cli(d, sess, lcode, lang)  # warm-up, not timed
                for _ in range(n_of("entry_out")):
                    for way in random.sample(list(secs), 3):
                        if way == "kernel":
                            res = c_client(k.cf, lcode, 1, 0, timeout=600)
                            if res["stream_bytes"] != nbytes:
                                raise RuntimeError(f"C client got {res['stream_bytes']} bytes, "
                                                   f"not {nbytes}")
                            secs[way].append(res["lat_us"][0] / 1e6)
                        elif way == "cli":
                            secs[way].append(km_exec_cli(d, sess, lcode, lang, timeout=600))
                        else:
                            t0 = time.perf_counter()
                            mcp.code_exec(sess, lcode, lang)
                            secs[way].append(time.perf_counter() - t0)
            finally:
                k.close()
            med = {w: statistics.median(v) for w, v in secs.items()}
            mbs = {w: nbytes / s / 2**20 for w, s in med.items()}
            rates[lang] = {"bytes": nbytes, "code": lcode, "seconds": secs, "MiB_per_s": mbs}
            for way, label in (("cli", "`kernelmgr exec` > /dev/null"), ("mcp", "MCP code_exec")):
                r = mbs[way] / mbs["kernel"]
                row(num, f"long output ({lang}: {nbytes / 2**20:.0f} MiB) through {label} vs the "
                    "kernel alone (C client)", f"{mbs[way]:.0f} MiB/s", f"{mbs['kernel']:.0f} MiB/s",
                    f"{r:.2f}", ">= 0.80 of the kernel's rate", verdict(r >= 0.8))
        out["long_output"] = rates
    finally:
        if mcp:
            mcp.close()
        d.close()


# ---------------------------------------------------------------- 12. notebook corpus


def bench_corpus(num):
    """tests/notebooks/*.ipynb through nbclient (kernel start to shutdown, every
    cell), on our kernel (strict sandbox, /usr/bin/python3) and on ipykernel;
    each round runs every notebook on both, interleaved. The identical-cell
    share is the test's (tests/e2e/test_nb_corpus.py), shown for context."""
    path = ROOT / "tests" / "notebooks" / "corpus.py"
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    if importlib.util.find_spec("ipykernel") is None or \
            importlib.util.find_spec("nbclient") is None:
        raise Skip("ipykernel or nbclient not installed (Debian python3-ipykernel, "
                   "python3-nbclient)")
    spec = importlib.util.spec_from_file_location("km_corpus", path)
    corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(corpus)
    totals = {"ours": [], "ipykernel": []}
    pct, failed = [], []
    for _ in range(n_of("corpus")):
        c = corpus.Corpus(workdir("corpus"), sandbox="strict")
        totals["ours"].append(sum(o.seconds for o, _ in c.runs.values()))
        totals["ipykernel"].append(sum(r.seconds for _, r in c.runs.values()))
        pct.append(c.percent())
        failed += ["%s on %s: %s" % (n, who, run.failure[:200]) for n, (o, r) in c.runs.items()
                   for who, run in (("ours", o), ("ipykernel", r)) if run.failure]
    cells = len(c.all_cells())
    o, r = statistics.median(totals["ours"]), statistics.median(totals["ipykernel"])
    DATA["corpus"] = {"seconds": totals, "identical_percent": pct, "notebooks": len(c.runs),
                      "code_cells": cells, "failed": failed}
    row(num, f"notebook corpus ({len(c.runs)} notebooks, {cells} code cells) through nbclient, "
        f"total (median of {len(pct)})", f"{o:.1f} s", f"{r:.1f} s", fx(r / o), "(info)")
    row(num, "notebook corpus: code cells identical to ipykernel",
        " / ".join(f"{p:.1f} %" for p in pct) + (f"; failed: {failed}" if failed else ""),
        "", "", ">= 98 %", verdict(min(pct) >= 98))


# ---------------------------------------------------------------- 13. gateway WebSocket


def _p90(xs):
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.9 * len(xs)) - 1)]


def _fmt_p90(xs):
    return f"{statistics.median(xs):.2f} ms (p90 {_p90(xs):.2f})"


class KernelWS:
    """One kernel WebSocket (the JSON message form, or the v1 binary
    subprotocol) and the execute round trip a frontend sees."""

    def __init__(self, websocket, url, header=(), v1=False):
        kw = {"subprotocols": ["v1.kernel.websocket.jupyter.org"]} if v1 else {}
        self.ws = websocket.create_connection(url, header=list(header), timeout=CELL_TIMEOUT,
                                              **kw)
        self.v1 = v1
        self.timeout_exc = websocket.WebSocketTimeoutException

    def _msg(self, msg_type, content):
        import uuid
        return {"header": {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "session": "bench",
                           "username": "bench", "date": "2026-01-01T00:00:00Z",
                           "version": "5.3"},
                "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}

    def send(self, m):
        if not self.v1:
            self.ws.send(json.dumps(m))
            return
        parts = [json.dumps(m[k]).encode() for k in ("header", "parent_header", "metadata",
                                                     "content")]
        ch = m["channel"].encode()
        offs = [8 * (len(parts) + 3)]
        for p in [ch] + parts:
            offs.append(offs[-1] + len(p))
        self.ws.send_binary(b"".join([len(offs).to_bytes(8, "little")]
                                     + [o.to_bytes(8, "little") for o in offs] + [ch] + parts))

    def recv(self):
        raw = self.ws.recv()
        if not self.v1 or isinstance(raw, str):
            return json.loads(raw)
        n = int.from_bytes(raw[:8], "little")
        offs = [int.from_bytes(raw[8 * (i + 1):8 * (i + 2)], "little") for i in range(n)]
        out = {k: json.loads(raw[offs[i + 1]:offs[i + 2]])
               for i, k in enumerate(("header", "parent_header", "metadata", "content"))}
        out["channel"] = raw[offs[0]:offs[1]].decode()
        return out

    def ready(self, deadline=60):
        """kernel_info_request every 0.5 s until one is answered."""
        end = time.monotonic() + deadline
        self.ws.settimeout(0.5)
        try:
            while time.monotonic() < end:
                self.send(self._msg("kernel_info_request", {}))
                try:
                    while self.recv()["header"]["msg_type"] != "kernel_info_reply":
                        pass
                    return
                except self.timeout_exc:
                    pass
        finally:
            self.ws.settimeout(CELL_TIMEOUT)
        raise RuntimeError("no kernel_info_reply over the WebSocket")

    def cell(self, code):
        """execute_request -> execute_reply and status idle; seconds."""
        m = self._msg("execute_request", {"code": code, "silent": False,
                                          "store_history": True, "user_expressions": {},
                                          "allow_stdin": False, "stop_on_error": True})
        mid = m["header"]["msg_id"]
        t0 = time.perf_counter()
        self.send(m)
        reply = idle = False
        while not (reply and idle):
            r = self.recv()
            if r["parent_header"].get("msg_id") != mid:
                continue
            t = r["header"]["msg_type"]
            if t == "execute_reply":
                if r["content"].get("status") != "ok":
                    raise RuntimeError(f"{code!r} failed: {r['content']}")
                reply = True
            elif t == "status" and r["content"].get("execution_state") == "idle":
                idle = True
        return time.perf_counter() - t0

    def close(self):
        self.ws.close()


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _http_json(method, url, headers, body=None, timeout=60):
    import urllib.request
    r = urllib.request.Request(url, method=method, headers=headers,
                               data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(r, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def _wait_file_json(path, deadline=30):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"{path} never written")


NODELAY_CONFIG = """
# bench: TCP_NODELAY on the kernel WebSocket of jupyter_server (not its default)
from jupyter_server.services.kernels.handlers import ZMQChannelsHandler
_open = ZMQChannelsHandler.open


def open_nodelay(self, *args, **kwargs):
    self.set_nodelay(True)
    return _open(self, *args, **kwargs)


ZMQChannelsHandler.open = open_nodelay
"""


def _jupyter_server_kernel_ws(websocket, nodelay):
    """A `jupyter server` (no gateway) with one ipykernel (Debian's
    /usr/bin/python3) and a KernelWS on its kernel WebSocket: (proc, ws)."""
    wd = workdir("jsrv")
    spec = wd / "data" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [REF_PYTHON, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))
    (wd / "cfg").mkdir()
    if nodelay:
        (wd / "cfg" / "jupyter_server_config.py").write_text(NODELAY_CONFIG)
    port = _free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(wd / "cfg"),
               JUPYTER_DATA_DIR=str(wd / "data"), JUPYTER_RUNTIME_DIR=str(wd / "rt"),
               HOME=str(wd))
    srv = subprocess.Popen([REF_PYTHON, "-m", "jupyter_server", "--no-browser",
                            f"--port={port}", "--port-retries=0", "--ip=127.0.0.1",
                            "--ServerApp.token=benchtok", "--allow-root",
                            f"--ServerApp.root_dir={wd}"],
                           env=env, stdout=open(wd / "server.log", "w"),
                           stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _live.append(srv)
    try:
        base = f"http://127.0.0.1:{port}"
        sh = {"Authorization": "token benchtok"}
        end = time.monotonic() + 90
        while True:
            try:
                _http_json("GET", base + "/api", sh, timeout=5)
                break
            except OSError:
                if srv.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("jupyter server did not come up: "
                                       + (wd / "server.log").read_text()[-300:])
                time.sleep(0.05)
        k = _http_json("POST", base + "/api/kernels", sh, {"name": "python3"})
        return srv, KernelWS(websocket, f"ws://127.0.0.1:{port}/api/kernels/{k['id']}"
                                        f"/channels?token=benchtok")
    except BaseException:
        stop_tree(srv)
        raise


def bench_gateway(num):
    try:
        import websocket
    except ImportError:
        raise Skip("python3-websocket not installed")
    if importlib.util.find_spec("jupyter_server") is None:
        raise Skip("jupyter_server not installed (Debian python3-jupyter-server)")
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    n = n_of("gw_rtt")
    d = Daemon(daemon_config(http="127.0.0.1:0"))
    servers = []
    conns = {}
    try:
        c = DaemonConn(d.sock)
        e = exec_ok(c.call(rpc("exec", {"session": "bench", "code": "x = 0", "lang": "python"})))
        c.close()
        if e:
            raise RuntimeError(e)
        url = _wait_file_json(d.home / "http.json")["url"].rstrip("/")
        tok = (d.home / "http-token").read_text().strip()
        auth = {"Authorization": f"token {tok}"}
        kid = next(k["id"] for k in _http_json("GET", url + "/api/kernels", auth)
                   if k["kernelmgr"]["session"] == "bench")
        ws_url = url.replace("http", "ws", 1) + f"/api/kernels/{kid}/channels"
        gw_json, gw_v1 = "kernelmgr gateway (JSON)", "kernelmgr gateway (v1)"
        for name, v1 in ((gw_json, False), (gw_v1, True)):
            conns[name] = KernelWS(websocket, ws_url, [f"Authorization: token {tok}"], v1)

        # the reference: a plain `jupyter server` (no gateway) and its own
        # kernel WebSocket on ipykernel; stock, and with TCP_NODELAY on that
        # WebSocket (stock jupyter_server leaves Nagle on: with the client's
        # delayed ACK, ~40 ms of every round trip is waiting, not work)
        ref, ref_nd = "jupyter_server + ipykernel", "jupyter_server (TCP_NODELAY) + ipykernel"
        for name, nodelay in ((ref, False), (ref_nd, True)):
            srv, conns[name] = _jupyter_server_kernel_ws(websocket, nodelay)
            servers.append(srv)

        lat = {name: [] for name in conns}
        for c in conns.values():
            c.ready()
            for _ in range(20):  # warm up
                c.cell("x = 1")
        for _ in range(n):  # interleaved, one cell each per round
            for name in random.sample(list(conns), len(conns)):
                lat[name].append(conns[name].cell("x = 1") * 1000)
        DATA["gateway_ws_rtt_ms"] = {
            name: dict(stats(v), p90=_p90(v)) for name, v in lat.items()}
        for ours_, ref_ in ((gw_json, ref), (gw_json, ref_nd), (gw_v1, ref_nd)):
            o, r = lat[ours_], lat[ref_]
            row(num, f"`x = 1` round trip (reply + idle) through {ours_} vs {ref_} (JSON); n={n}",
                _fmt_p90(o), _fmt_p90(r), fx(statistics.median(r) / statistics.median(o)),
                "(info)")
        row(num, "Jupyter Kernel Gateway as the reference", "skipped: not packaged in Debian; "
            "jupyter_server's own kernel WebSocket instead")
    finally:
        for c in conns.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        for srv in servers:
            stop_tree(srv)
        d.close()


# ---------------------------------------------------------------- 14. durable state


def state_write(d, text, sync):
    """One session.json write as session_store.c makes it: temp file, write,
    fsync (sync >= 1), rename over the old one, fsync of the directory
    (sync 2)."""
    path, tmp = os.path.join(d, "session.json"), os.path.join(d, "session.json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text)
        if sync >= 1:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    if sync >= 2:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


STATE_WRITES = {
    0: "no fsync (before)",
    1: "file fsync (kernel start, cull, eviction: session_save)",
    2: "file + directory fsync (creation, repair: session_save_err)",
}


def bench_state(num):
    """What fsync costs a session.json write, on the file system of /tmp
    (where the tests' homes are). These writes happen when a session is
    created or repaired, when a kernel starts, restarts, is culled or
    evicted, and on close --keep: never per cell."""
    n = n_of("state_writes")
    d = Path(tempfile.mkdtemp(prefix="kmbench-state", dir="/tmp"))
    text = json.dumps({"name": "s", "workspace": str(d / "workspace"), "own_workspace": True,
                       "options": {"memory": 314572800, "env": {"A": "x" * 200}},
                       "kernels": {"python": {"pid": 1, "connection_file": "/x.json"}}},
                      indent=1).encode()
    res = {k: [] for k in STATE_WRITES}
    try:
        for _ in range(2):  # interleaved, so drift in the machine's load hits all
            for sync in STATE_WRITES:
                for _ in range(n // 2):
                    t = time.perf_counter()
                    state_write(str(d), text, sync)
                    res[sync].append((time.perf_counter() - t) * 1000)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    st = {k: stats(v) for k, v in res.items()}
    DATA["state_writes"] = {"bytes": len(text), "fs": "/tmp",
                            **{STATE_WRITES[k]: v for k, v in st.items()}}
    for sync in (1, 2):
        row(num, f"session.json write ({len(text)} B, n={n}): {STATE_WRITES[sync]}",
            fmt_ms(st[sync]), fmt_ms(st[0]) + " " + STATE_WRITES[0],
            fx(st[sync]["median"] / max(st[0]["median"], 1e-6)))


# ---------------------------------------------------------------- main


def machine():
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    vers = {}
    for mod in ("jupyter_client", "ipykernel", "zmq"):
        try:
            vers[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            vers[mod] = None
    vers["libzmq"] = zmq.zmq_version()
    vers["python (client, ipykernel)"] = platform.python_version()
    try:
        vers["python (our kernel's code)"] = subprocess.run(
            [CODE_PYTHON, "-c", "import platform; print(platform.python_version())"],
            capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    return {"nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "loadavg_at_start": os.getloadavg(),
            "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "versions": vers}


# ---------------------------------------------------------------- 15. density


def bench_density(num):
    """What admission counts per idle session (the daemon's own measurement:
    the sandboxes' memory cgroups, else the processes' anonymous memory; ping's
    kernels_memory) and how many idle sessions the default configuration's
    memory budget and cap admit on this host."""
    if not (binary("kernel-python") and binary("kernel-bash")):
        raise Skip("build/kernel-python and build/kernel-bash not built")
    cfg = daemon_config()
    cfg.pop("max_kernels", None)  # the default cap, the default budget
    d = Daemon(cfg)
    c = DaemonConn(d.sock)
    headroom = 64 << 20  # KM_ADMIT_HEADROOM (session_int.h)

    def measured():
        time.sleep(2.1)  # past KM_MEM_MAX_AGE: every kernel read again
        return c.call(rpc("ping"), timeout=30)["pool"]

    try:
        n = n_of("density")
        per = {}
        base = measured()["kernels_memory"]
        for lang, code in (("python", "x = 1"), ("bash", "x=1")):
            for i in range(n):
                e = exec_ok(c.call(rpc("exec", {"session": f"d{i}", "code": code,
                                                "lang": lang, "timeout": 300})))
                if e:
                    raise RuntimeError(f"{lang}: {e}")
            pool = measured()
            per[lang] = (pool["kernels_memory"] - base) / n
            base = pool["kernels_memory"]
        budget, cap = pool["memory_budget"], pool["max_kernels"]
        mib = 1 << 20
        # RSS and PSS of every session's process trees as the host sees them:
        # each kernel server, its sandbox's init and the worker with its
        # children (the daemon itself is shared by all and not counted)
        sess = c.call(rpc("sessions.list"), timeout=60)["sessions"]
        rss = pss = 0
        for sdesc in sess:
            for k in (sdesc.get("kernels") or {}).values():
                if k and k.get("pid"):
                    for pid in tree_pids(k["pid"]):
                        rss += rss_kb(pid)
                        pss += pss_kb(pid)
        per_rss = rss * 1024 / max(1, len(sess))
        per_pss = pss * 1024 / max(1, len(sess))
        machine_24g = 24 << 30
        proj_rss, proj_pss = int(machine_24g // per_rss), int(machine_24g // per_pss)
        py_only = min(cap, int((budget - headroom) // per["python"]))
        both = min(cap // 2, int((budget - headroom) // (per["python"] + per["bash"])))
        by_memory = int((budget - headroom) // per["python"])
        DATA["density"] = {"sessions": n, "python_idle_bytes": per["python"],
                           "bash_idle_bytes": per["bash"], "memory_budget": budget,
                           "max_kernels": cap, "idle_python_sessions_admitted": py_only,
                           "idle_python_sessions_by_memory_alone": by_memory,
                           "idle_python_bash_sessions_admitted": both,
                           "session_rss_bytes": per_rss, "session_pss_bytes": per_pss,
                           "idle_sessions_24gib_by_rss": proj_rss,
                           "idle_sessions_24gib_by_pss": proj_pss}
        row(num, "measured memory of an idle Python kernel", f"{per['python'] / mib:.1f} MiB",
            "", "", "(info)")
        row(num, "measured memory of an idle Bash kernel", f"{per['bash'] / mib:.1f} MiB",
            "", "", "(info)")
        row(num, "RSS (PSS) of an idle Python+Bash session, kernel servers included",
            f"{per_rss / mib:.1f} MiB ({per_pss / mib:.1f} MiB)", "", "", "(info)")
        row(num, "idle Python+Bash sessions a 24 GiB machine holds (by RSS / by PSS)",
            f"{proj_rss} / {proj_pss}", "", "", ">= 200", verdict(proj_rss >= 200))
        row(num, "idle sessions admitted by default (Python / Python+Bash)",
            f"{py_only} / {both}",
            f"budget {budget / (1 << 30):.1f} GiB ({by_memory} by memory alone), "
            f"max_kernels {cap}", "", ">= 200 Python",
            verdict(py_only >= 200))
    finally:
        c.close()
        d.close()


# ---------------------------------------------------------------- 17. snapshots


SNAP_CASES = (
    ("an empty session", "x = 1"),
    ("100 MB of numpy arrays", "import numpy as np\na = np.ones(100 * (1 << 20) // 8)\n"
     "b = a[:10].copy()"),
    ("a pandas DataFrame of 1 M rows", "import numpy as np, pandas as pd\n"
     "df = pd.DataFrame({'i': np.arange(1_000_000), 'f': np.random.rand(1_000_000), "
     "'s': np.random.choice(['a', 'b', 'c'], 1_000_000)})"),
)


def ms1(secs):
    return f"{secs * 1000:.1f} ms"


def bench_snapshot(num):
    """session.snapshot and session.restore (a live kernel loads) of the
    Python kernel, with their size; then the first exec of a fork (a kernel
    start plus the restore) against the first exec of a new session."""
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    d = Daemon(daemon_config(snapshot_max="1G"))
    c = DaemonConn(d.sock)
    mib = 1 << 20
    try:
        n = 1 if QUICK else 3
        for ci, (label, code) in enumerate(SNAP_CASES):
            sess = f"snap{ci}"
            e = exec_ok(c.call(rpc("exec", {"session": sess, "code": code, "lang": "python",
                                            "timeout": 300})))
            if e:
                raise RuntimeError(f"{label}: {e}")
            takes, loads, size = [], [], 0
            for i in range(n):
                t = time.perf_counter()
                man = c.call(rpc("session.snapshot", {"session": sess, "tag": "b"}),
                             timeout=600)
                takes.append(time.perf_counter() - t)
                if not man.get("ok"):
                    raise RuntimeError(f"{label}: snapshot: {man.get('error')}")
                size = man["bytes"]
                t = time.perf_counter()
                r = c.call(rpc("session.restore", {"session": sess, "tag": "b"}), timeout=600)
                loads.append(time.perf_counter() - t)
                if not r.get("ok"):
                    raise RuntimeError(f"{label}: restore: {r.get('error')}")
            DATA.setdefault("snapshot", {})[label] = {"bytes": size, "take_s": takes,
                                                      "restore_s": loads}
            row(num, f"snapshot of {label}", ms1(statistics.median(takes)),
                f"{size / mib:.1f} MiB", "", "(info)")
            row(num, f"restore of {label} (live kernel)", ms1(statistics.median(loads)),
                "", "", "(info)")
            # the fork's first exec: a fresh kernel that loads the state first
            t = time.perf_counter()
            c.call(rpc("session.fork", {"session": sess, "new_session": f"fork{ci}",
                                        "tag": "b"}), timeout=600)
            fork_s = time.perf_counter() - t
            t = time.perf_counter()
            e = exec_ok(c.call(rpc("exec", {"session": f"fork{ci}", "code": "1",
                                            "lang": "python", "timeout": 300})))
            restored_s = time.perf_counter() - t
            t = time.perf_counter()
            e2 = exec_ok(c.call(rpc("exec", {"session": f"cold{ci}", "code": "1",
                                             "lang": "python", "timeout": 300})))
            cold_s = time.perf_counter() - t
            if e or e2:
                raise RuntimeError(f"{label}: {e or e2}")
            DATA["snapshot"][label].update({"fork_s": fork_s, "first_exec_restored_s":
                                            restored_s, "first_exec_cold_s": cold_s})
            row(num, f"first exec after a restore of {label} vs a cold start",
                ms1(restored_s), ms1(cold_s), fx(restored_s / cold_s), "(info)")
    finally:
        c.close()
        d.close()
def bench_move(num):
    """A session moved between two daemons over the API (what `kernelmgr
    session export` / `import` do): the export (a snapshot taken now and the
    archive built), reading it in 1 MiB chunks, sending it in 4 MiB chunks
    with the import (checked, extracted, the workspace filled), and the new
    session's first exec (a kernel start that loads the state), for 100 MB
    of numpy arrays plus 50 files of 1 MiB in the workspace."""
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    import base64
    a = Daemon(daemon_config(snapshot_max="1G"))
    b = Daemon(daemon_config())
    ca, cb = DaemonConn(a.sock), DaemonConn(b.sock)
    mib = 1 << 20
    try:
        code = ("import numpy as np, os\na = np.ones(100 * (1 << 20) // 8)\n"
                "os.makedirs('data', exist_ok=True)\n"
                "for i in range(50):\n    open(f'data/f{i}', 'wb').write(os.urandom(1 << 20))")
        e = exec_ok(ca.call(rpc("exec", {"session": "m", "code": code, "lang": "python",
                                         "timeout": 300})))
        if e:
            raise RuntimeError(e)
        t = time.perf_counter()
        r = ca.call(rpc("session.export", {"session": "m"}), timeout=600)
        build_s = time.perf_counter() - t
        if not r.get("ok"):
            raise RuntimeError(f"export: {r.get('error')}")
        data = bytearray(base64.b64decode(r["data"]))
        while not r["eof"]:
            r = ca.call(rpc("session.export", {"session": "m", "archive": r["archive"],
                                               "offset": len(data)}), timeout=600)
            if not r.get("ok"):
                raise RuntimeError(f"export read: {r.get('error')}")
            data += base64.b64decode(r["data"])
        read_s = time.perf_counter() - t - build_s
        t = time.perf_counter()
        off = 0
        while True:
            part = bytes(data[off:off + 4 * mib])
            final = off + len(part) >= len(data)
            r = cb.call(rpc("session.import", {"session": "m", "offset": off, "final": final,
                                               "data": base64.b64encode(part).decode()}),
                        timeout=600)
            if not r.get("ok"):
                raise RuntimeError(f"import: {r.get('error')}")
            off += len(part)
            if final:
                break
        import_s = time.perf_counter() - t
        t = time.perf_counter()
        e = exec_ok(cb.call(rpc("exec", {"session": "m", "code": "print(a.size)",
                                         "lang": "python", "timeout": 300})))
        first_s = time.perf_counter() - t
        if e:
            raise RuntimeError(e)
        DATA["move"] = {"archive_bytes": len(data), "export_build_s": build_s,
                        "export_read_s": read_s, "import_s": import_s,
                        "first_exec_s": first_s}
        size = f"{len(data) / mib:.0f} MiB archive"
        row(num, "move: export (snapshot now + archive)", ms1(build_s), size, "", "(info)")
        row(num, "move: read the archive in 1 MiB chunks", ms1(read_s), "", "", "(info)")
        row(num, "move: import in 4 MiB chunks (checked, extracted)", ms1(import_s), "", "",
            "(info)")
        row(num, "move: the moved session's first exec (restore)", ms1(first_s), "", "",
            "(info)")
    finally:
        ca.close()
        cb.close()
        a.close()
        b.close()


def bench_egress(num):
    """Per-request cost of the egress proxy: a session with an allow-list
    fetches from a local HTTP server through the proxy (a new connection per
    request, as the proxy serves one request per connection), against the
    same client code on the host fetching directly."""
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    import http.server

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    n = 50 if QUICK else 500
    client = (f"import http.client, time\n"
              f"def one(host, port, path):\n"
              f"    c = http.client.HTTPConnection(host, port, timeout=30)\n"
              f"    c.request('GET', path)\n"
              f"    r = c.getresponse(); r.read(); c.close()\n"
              f"    assert r.status == 200, r.status\n"
              f"def run(host, port, path):\n"
              f"    for _ in range(20): one(host, port, path)\n"
              f"    t = time.perf_counter()\n"
              f"    for _ in range({n}): one(host, port, path)\n"
              f"    return (time.perf_counter() - t) / {n}\n")
    direct = subprocess.run([REF_PYTHON, "-c", client + f"print(run('127.0.0.1', {port}, '/'))"],
                            capture_output=True, text=True, timeout=300)
    if direct.returncode:
        raise RuntimeError(f"direct client: {direct.stderr[-300:]}")
    d_s = float(direct.stdout.strip())
    d = Daemon(daemon_config(network={"allow": [f"127.0.0.1:{port}"]}))
    c = DaemonConn(d.sock)
    try:
        code = client + f"print(run('127.0.0.1', 3128, 'http://127.0.0.1:{port}/'))"
        r = c.call(rpc("exec", {"session": "eg", "code": code, "lang": "python",
                                "timeout": 300}))
        e = exec_ok(r)
        if e:
            raise RuntimeError(e)
        p_s = float(r["results"][-1]["stdout"].strip())
        DATA["egress"] = {"requests": n, "proxied_s": p_s, "direct_s": d_s}
        row(num, "HTTP GET, new connection each: through the egress proxy vs direct",
            f"{p_s * 1e6:.0f} µs", f"{d_s * 1e6:.0f} µs direct", fx(p_s / d_s), "(info)",
            f"{(p_s - d_s) * 1e6:+.0f} µs a request")
    finally:
        c.close()
        d.close()
        srv.shutdown()
        srv.server_close()
# ---------------------------------------------------------------- 19. session sandbox


def bench_snapshot_interval(num):
    """What periodic snapshots (`snapshot_interval`) cost a cell: the round
    trip of `x = 1` on a warm Python kernel with the option off and with a
    snapshot due at every exec (interval 0.001 s: the worst case)."""
    if not binary("kernel-python"):
        raise Skip("build/kernel-python not built")
    n = 5 if QUICK else 20
    times = {}
    for label, interval in (("off", 0), ("every exec", 0.001)):
        d = Daemon(daemon_config(snapshot_interval=interval))
        c = DaemonConn(d.sock)
        try:
            e = exec_ok(c.call(rpc("exec", {"session": "iv", "code": "import numpy as np\n"
                                            "a = np.ones(1 << 17)", "lang": "python"})))
            if e:
                raise RuntimeError(e)
            ts = []
            for _ in range(n):
                t = time.perf_counter()
                e = exec_ok(c.call(rpc("exec", {"session": "iv", "code": "x = 1",
                                                "lang": "python"})))
                ts.append(time.perf_counter() - t)
                if e:
                    raise RuntimeError(e)
            times[label] = statistics.median(ts)
        finally:
            c.close()
            d.close()
    DATA.setdefault("snapshot", {})["interval"] = times
    row(num, "`x = 1` with snapshot_interval off vs a snapshot at every exec (1 MiB of state)",
        ms1(times["every exec"]), ms1(times["off"]), fx(times["every exec"] / times["off"]),
        "(info)")


def _holder(ws, extra=()):
    """A session sandbox's holder (kernelmgr-sandbox) on a socket in a fresh
    directory; returns (proc, socket path)."""
    exe = binary("kernelmgr-sandbox")
    d = workdir("sbxh")
    sock = str(d / "s.sbx")
    share = str((BUILD / "share" / "kernelmgr").resolve())
    proc = subprocess.Popen([exe, "--listen", sock, "--workspace", ws, "--ro-path", share,
                             *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not os.path.exists(sock) and time.monotonic() < deadline:
        time.sleep(0.005)
    return proc, sock


def joined(lang, sock, name, ipython=False):
    base = ours(lang, "strict", "ipc", name=name, ipython=ipython)
    inner = base._argv
    return KernelSpec(name, lambda cf, ws: [*inner(cf, ws), "--session-sandbox", sock],
                      "ipc", base.need)


def bench_session_sandbox(num):
    if not binary("kernelmgr-sandbox"):
        row(num, "session sandbox", "skipped: build/kernelmgr-sandbox not built")
        return
    ws = str(workdir("sbxws"))
    proc, sock = _holder(ws)
    res = {}
    try:
        # the session's sandbox exists once its first kernel started
        first = started(joined("bash", sock, "bash in the session sandbox"), "sbx1")
        try:
            for lang in ("python", "bash"):
                specs = [joined(lang, sock, f"{lang} in an existing session sandbox"),
                         ours(lang, "strict", "ipc", name=f"{lang} in a new sandbox")]
                if specs[1].need:
                    row(num, f"session sandbox {lang}", f"skipped: {specs[1].need}")
                    continue
                samples, bad = cold_samples(specs, n_of("sbx_cold"))
                a = stats(ms_list(samples[specs[0].name])) if specs[0].name not in bad else None
                b = stats(ms_list(samples[specs[1].name])) if specs[1].name not in bad else None
                res[lang] = {"existing": a, "new": b, "failed": bad}
                row(num, f"{lang} kernel start in the existing session sandbox",
                    fmt_ms(a) if a else bad.get(specs[0].name, "n/a")[:80],
                    f"new sandbox: {fmt_ms(b)}" if b else bad.get(specs[1].name, "n/a")[:60],
                    f"{a['median'] / b['median']:.2f}x" if a and b else "", "(info)")
        finally:
            first.close()
    finally:
        stop_tree(proc)
    # memory of an idle session: holder + monitor + init + both workers and
    # both kernel servers, against two kernels with a sandbox each
    ws = str(workdir("sbxws"))
    proc, sock = _holder(ws)
    try:
        ks = [started(joined(lang, sock, f"{lang} joined"), "sbxm") for lang in ("python", "bash")]
        try:
            pids = set(tree_pids(proc.pid)) | {q for k in ks for q in tree_pids(k.proc.pid)}
            shared_kb = sum(pss_kb(q) for q in pids)
            holder_kb = sum(pss_kb(q) for q in tree_pids(proc.pid)
                            if "sandbox" in open(f"/proc/{q}/comm").read() or q == proc.pid)
        finally:
            for k in ks:
                k.close()
    finally:
        stop_tree(proc)
    ks = [started(ours(lang, "strict", "ipc", name=f"{lang} own"), "sbxo")
          for lang in ("python", "bash")]
    try:
        own_kb = sum(pss_kb(q) for k in ks for q in tree_pids(k.proc.pid))
    finally:
        for k in ks:
            k.close()
    res["idle_session_pss_kb"] = {"session_sandbox": shared_kb, "holder_and_init": holder_kb,
                                  "sandbox_per_kernel": own_kb}
    row(num, "PSS of an idle Python+Bash session (session sandbox, the holder and init "
             "included)", f"{shared_kb / 1024:.1f} MiB",
        f"a sandbox per kernel: {own_kb / 1024:.1f} MiB", f"holder+monitor+init "
        f"{holder_kb / 1024:.1f} MiB", "(info)")
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    row(num, "idle Python+Bash sessions in 24 GiB at that PSS",
        f"{int((24 << 20) / max(shared_kb, 1))}", f"this machine: {int(mem / 1024 / max(shared_kb, 1))}",
        "", "(info)")
    DATA["session_sandbox"] = res



# ---------------------------------------------------------------- 20. zygote


def _tree_cpu_s(root):
    """CPU seconds of root's live tree, with what each reaped (cutime)."""
    tck = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in tree_pids(root):
        try:
            st = open(f"/proc/{p}/stat").read()
        except OSError:
            continue
        f = st[st.rindex(")") + 2:].split()
        total += sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    return total / tck


def _children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _zygote_pids(root):
    out = []
    for p in tree_pids(root):
        try:
            if b"kzygote.py" in open(f"/proc/{p}/cmdline", "rb").read():
                out.append(p)
        except OSError:
            pass
    return out


def bench_zygote(num):
    """A Python kernel forked by its session's zygote vs a cold one, both in
    a session sandbox, from the spawn of the kernel server to the first
    execute_reply (stock jupyter_client, no wait_for_ready): the first
    Python kernel of a new session (its zygote starts then), and a later one
    (a restart, another Python kernel: the zygote exists); the CPU of a
    start, the sandbox's and the kernel server's; the zygote's memory."""
    if not binary("kernelmgr-sandbox"):
        row(num, "zygote", "skipped: build/kernelmgr-sandbox not built")
        return
    n = n_of("zygote")
    res = {}

    def spec(sock, zyg, name, ipython=False):
        base = joined("python", sock, name, ipython)
        inner = base._argv
        return KernelSpec(name, lambda cf, ws: [*inner(cf, ws), "--zygote", str(zyg)],
                          "ipc", base.need)

    ref = ipykernel()
    # a later kernel: holders whose sandbox (and zygote) exist
    hz, hc = [_holder(str(workdir("zws"))) for _ in range(2)]
    try:
        # the first starts cold, the second starts the zygote
        for sock, zyg in ((hz[1], 64), (hz[1], 64), (hc[1], 0)):
            started(spec(sock, zyg, "warm-up"), "zw").close()
        specs = [spec(hz[1], 64, "python forked by the zygote"),
                 spec(hc[1], 0, "python cold, same session sandbox"), ref]
        samples, bad = cold_samples(specs, n)
        st = {k: stats(ms_list(v)) if v else None for k, v in samples.items()}
        res["later_kernel_ms"] = {"stats": st, "failed": bad}
        z, c, r = (st.get(s.name) for s in specs)
        row(num, "later Python kernel of a session: forked (spawn -> first execute_reply)",
            fmt_ms(z) if z else bad.get(specs[0].name, "n/a")[:80],
            f"ipykernel {fmt_ms(r)}" if r else "", fx(r["median"] / z["median"]) if z and r else "",
            "(info)")
        row(num, "later Python kernel of a session: cold, for comparison",
            fmt_ms(c) if c else bad.get(specs[1].name, "n/a")[:80],
            f"ipykernel {fmt_ms(r)}" if r else "", fx(r["median"] / c["median"]) if c and r else "",
            "(info)")
        if z and c:
            row(num, "later Python kernel: cold / forked", "", "", fx(c["median"] / z["median"]),
                "(info)")
        # CPU of one start (sequential, one mode at a time)
        cpu = {}
        for label, (proc, sock), zyg in (("forked", hz, 64), ("cold", hc, 0)):
            s0, k0 = _tree_cpu_s(proc.pid), _children_cpu_s()
            for _ in range(n):
                k = Kernel(spec(sock, zyg, f"cpu {label}"), "zc")
                try:
                    k.start()
                finally:
                    k.close()
            cpu[label] = {"sandbox_s": (_tree_cpu_s(proc.pid) - s0) / n,
                          "kernel_server_s": (_children_cpu_s() - k0) / n}
        res["cpu_per_start_s"] = cpu
        f, c2 = cpu["forked"], cpu["cold"]
        row(num, "CPU of a later Python kernel start: sandbox side (init, zygote, worker)",
            f"{f['sandbox_s'] * 1000:.1f} ms", f"cold {c2['sandbox_s'] * 1000:.1f} ms",
            fx(c2["sandbox_s"] / f["sandbox_s"]) if f["sandbox_s"] > 0 else "", "(info)")
        row(num, "CPU of a later Python kernel start: the kernel server (host)",
            f"{f['kernel_server_s'] * 1000:.1f} ms", f"cold {c2['kernel_server_s'] * 1000:.1f} ms",
            "", "(info)")
        zp = _zygote_pids(hz[0].pid)
        zkb = sum(pss_kb(p) for p in zp)
        zrss = sum(rss_kb(p) for p in zp)
        res["zygote_pss_kb"], res["zygote_rss_kb"] = zkb, zrss
        row(num, "the zygote's memory (PSS; RSS), charged to its session", f"{zkb / 1024:.1f} MiB",
            f"RSS {zrss / 1024:.1f} MiB", "", "(info)")
    finally:
        stop_tree(hz[0])
        stop_tree(hc[0])
    bench_zygote_ipython(num, spec, ref, n, res)
    # the 1st, 2nd and 3rd Python kernel of a new session sandbox: the first
    # starts cold either way, the zygote starts with the second
    seq = {m: [[], [], []] for m in ("forked", "cold")}
    for _ in range(n):
        for label, zyg in random.sample([("forked", 64), ("cold", 0)], 2):
            proc, sock = _holder(str(workdir("zws1")))
            try:
                for pos in range(3):
                    k = Kernel(spec(sock, zyg, f"{pos + 1}. {label}"), "z1")
                    try:
                        seq[label][pos].append(k.start())
                    finally:
                        k.close()
            finally:
                stop_tree(proc)
    res["nth_kernel_ms"] = {}
    for pos, what in enumerate(("1st (cold either way)", "2nd (the zygote starts)",
                                "3rd (forked)")):
        fz, fc = stats(ms_list(seq["forked"][pos])), stats(ms_list(seq["cold"][pos]))
        res["nth_kernel_ms"][pos + 1] = {"forked": fz, "cold": fc}
        row(num, f"{what} Python kernel of a new session sandbox, zygote on",
            fmt_ms(fz), f"zygote off {fmt_ms(fc)}", fx(fc["median"] / fz["median"]), "(info)")
    DATA["zygote"] = res


def bench_zygote_ipython(num, spec, ref, n, res):
    """The `ipython` option on: a later Python kernel of a session whose
    zygote preloaded IPython (forked: the shell is made, IPython is not
    imported) vs the same kernel cold (IPython imported at start), and
    ipykernel."""
    hz, hc = [_holder(str(workdir("zwsi"))) for _ in range(2)]
    try:
        for sock, zyg in ((hz[1], 64), (hz[1], 64), (hc[1], 0)):
            started(spec(sock, zyg, "warm-up ipython", True), "zwi").close()
        specs = [spec(hz[1], 64, "python --ipython on forked by the zygote", True),
                 spec(hc[1], 0, "python --ipython on cold, same session sandbox", True), ref]
        samples, bad = cold_samples(specs, n)
        st = {k: stats(ms_list(v)) if v else None for k, v in samples.items()}
        res["ipython_later_kernel_ms"] = {"stats": st, "failed": bad}
        z, c, r = (st.get(s.name) for s in specs)
        for label, o, s in (("forked", z, specs[0]), ("cold", c, specs[1])):
            row(num, f"later Python kernel of a session, ipython on: {label} "
                     "(spawn -> first execute_reply)",
                fmt_ms(o) if o else bad.get(s.name, "n/a")[:80],
                f"ipykernel {fmt_ms(r)}" if r else "",
                fx(r["median"] / o["median"]) if o and r else "", "(info)")
        if z and c:
            row(num, "later Python kernel, ipython on: cold / forked", "", "",
                fx(c["median"] / z["median"]), "(info)")
        zp = _zygote_pids(hz[0].pid)
        zkb = sum(pss_kb(p) for p in zp)
        res["ipython_zygote_pss_kb"] = zkb
        row(num, "the zygote's memory with IPython preloaded (PSS)", f"{zkb / 1024:.1f} MiB",
            "", "", "(info)")
    finally:
        stop_tree(hz[0])
        stop_tree(hc[0])


def print_table():
    head = ("#", "benchmark", "kernelmgr", "ipykernel / baseline", "ratio", "target", "result")
    rows = [head] + [tuple(str(c) for c in r) for r in ROWS]
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for r in rows[1:]:
        print("| " + " | ".join(c.replace("|", "/") for c in r) + " |")


# ---------------------------------------------------------------- 16. debugger


def dap(k, command, arguments=None, timeout=60):
    """One debug_request on control; the DAP response."""
    msg = k.kc.session.msg("debug_request", {"type": "request", "seq": 1, "command": command,
                                             "arguments": arguments or {}})
    k.kc.control_channel.send(msg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = k.kc.get_control_msg(timeout=0.1)
        except Exception:  # noqa: BLE001
            continue
        if r["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            return r["content"]
    raise RuntimeError(f"{k.spec.name}: no debug_reply to {command}")


def attach_debugger(k):
    for cmd, args in (("initialize", {"adapterID": "python", "pathFormat": "path",
                                      "linesStartAt1": True, "columnsStartAt1": True}),
                      ("attach", {}), ("configurationDone", {})):
        rep = dap(k, cmd, args)
        if not rep.get("success"):
            raise RuntimeError(f"{k.spec.name}: {cmd} failed: {rep.get('message')}")


def bench_debugger(num):
    """What the debugger costs: nothing unless used. A start with debugpy
    importable (the debug thread waits on its pipe) vs without (a venv
    without it); a trivial cell never debugged, after the first debug
    request (cells compiled under their Murmur2 names), and with a
    debugger attached (debugpy traces the cell), ipykernel alike."""
    venv = WORK / "nodebugpy"
    if not (venv / "bin" / "python").exists():
        subprocess.run([CODE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True,
                       capture_output=True)
    exe = binary("kernel-python")
    need = None if exe else "build/kernel-python not built"

    def argv_with(python):
        return lambda cf, ws: [exe, "-f", cf, "--workspace", ws, "--python", python]

    with_dbg = KernelSpec("kernel-python (debugpy importable)", argv_with(CODE_PYTHON), "tcp",
                          need)
    without = KernelSpec("kernel-python (no debugpy: venv)", argv_with(str(venv / "bin/python")),
                         "tcp", need)
    samples, bad = cold_samples([with_dbg, without], n_of("dbg_cold"))
    st = {k: stats(ms_list(v)) for k, v in samples.items() if v}
    DATA["debugger_cold_start_ms"] = {"stats": st, "failed": bad}
    for s in (with_dbg, without):
        row(num, f"cold start {s.name}", bad.get(s.name) or fmt_ms(st[s.name]))
    if with_dbg.name in st and without.name in st:
        d = st[with_dbg.name]["median"] - st[without.name]["median"]
        row(num, "start cost of the debugger's readiness (median difference)",
            f"{d:+.2f} ms", "", "", "~0 (noise)", "")
    n = n_of("dbg_cells")
    ref = ipykernel()
    cells = {}
    for spec in (ours("python"), ref):
        k = guarded(num, f"start {spec.name}", lambda spec=spec: started(spec, "dbg"))
        if not k:
            continue
        try:
            phases = [("never debugged", None), ("after debugInfo", "info"),
                      ("debugger attached", "attach")]
            for label, step in phases:
                if step == "info":
                    dap(k, "debugInfo")
                elif step == "attach":
                    attach_debugger(k)
                for _ in range(10):
                    k.cell("x = 1")
                lat = [k.cell("x = 1")[0] for _ in range(n)]
                cells[(spec.name, label)] = stats(ms_list(lat))
            dap(k, "disconnect", {"restart": False, "terminateDebuggee": False})
        finally:
            k.close()
    DATA["debugger_cell_ms"] = {f"{a} / {b}": v for (a, b), v in cells.items()}
    for label in ("never debugged", "after debugInfo", "debugger attached"):
        o = cells.get((ours("python").name, label))
        r = cells.get((ref.name, label))
        if o is None:
            continue
        row(num, f"`x = 1` round trip, {label}", fmt_ms(o), fmt_ms(r) if r else "-",
            fx(r["median"] / o["median"]) if r else "")


def main():
    t0 = time.perf_counter()
    m = machine()
    DATA["machine"] = m
    DATA["quick"] = QUICK
    DATA["started"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"kernelmgr bench{' (quick)' if QUICK else ''}: {m['nproc']} x {m['cpu']}, "
          f"Linux {m['kernel']}, our python kernel runs {CODE_PYTHON}", flush=True)
    section(1, "cold start (spawn -> first execute_reply)", bench_cold)
    section(2, "round trip of a trivial statement", bench_rtt)
    section(3, f"output throughput: {LINES} lines until idle", bench_lines)
    section(4, "idle memory: PSS of the kernel's process tree", bench_mem)
    section(5, "concurrency", bench_concurrency)
    section(6, "sandbox overhead: strict vs none vs bubblewrap", bench_sandbox)
    section(7, "warm pool", bench_pool)
    section(8, "daemon under load", bench_load)
    section(9, "start -> ready through jupyter_client (KernelManager + wait_for_ready)",
            bench_jc_start)
    section(10, "one-shot `kernelmgr run` (cold) vs bubblewrap + python", bench_run)
    section(11, "entry points on a warm session: CLI, daemon socket, MCP", bench_entry)
    section(12, "notebook corpus through nbclient vs ipykernel", bench_corpus)
    section(13, "`x = 1` through the gateway's kernel WebSocket vs jupyter_server + ipykernel",
            bench_gateway)
    section(14, "durable state: a session.json write with and without fsync", bench_state)
    section(15, "density: idle sessions' measured memory, sessions the budget admits",
            bench_density)
    section(16, "debugger: start and per-cell cost without and with it", bench_debugger)
    section(17, "snapshots: take, restore, a restored first exec vs a cold start",
            bench_snapshot)
    section(17, "snapshots: what snapshot_interval costs a cell", bench_snapshot_interval)
    section(17, "snapshots: a session moved between two daemons", bench_move)
    section(18, "egress allow-list: the filtering proxy's cost per request", bench_egress)
    section(19, "session sandbox: a kernel start inside it vs a new sandbox; idle memory",
            bench_session_sandbox)
    section(20, "zygote: a Python kernel forked in its session sandbox vs a cold start",
            bench_zygote)
    section(21, "start_kernel -> first execute_reply through the stock jupyter_client, "
            "CPU per start", bench_jc_exec)
    DATA["rows"] = [dict(zip(("section", "benchmark", "ours", "reference", "ratio", "target",
                              "result"), r)) for r in ROWS]
    DATA["seconds"] = round(time.perf_counter() - t0, 1)
    # a shared machine: other work running beside the benchmark shows here
    DATA["loadavg_at_end"] = os.getloadavg()
    print_table()
    misses = sum(1 for r in ROWS if r[6] == "MISS")
    passes = sum(1 for r in ROWS if r[6] == "PASS")
    print(f"\ntargets: {passes} PASS, {misses} MISS; {DATA['seconds']} s; "
          f"machine: {m['nproc']} x {m['cpu']}; load average at start "
          f"{m['loadavg_at_start'][0]:.2f}, at end {DATA['loadavg_at_end'][0]:.2f}")
    out = BUILD / "bench.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(DATA, indent=1))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
