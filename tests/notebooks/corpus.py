#!/usr/bin/python3
"""The notebook corpus: runs tests/notebooks/*.ipynb through
nbclient on our Python kernel and on ipykernel, normalises what legitimately
differs and compares the outputs cell by cell.

Used by tests/e2e/test_nb_corpus.py and tests/bench/bench.py; also runs on its
own (/usr/bin/python3, which has nbclient and ipykernel):

    BUILD=build KM_TEST_SANDBOX=strict /usr/bin/python3 tests/notebooks/corpus.py \
        [--report FILE] [--ipython on|off] [NOTEBOOK-NAME ...]

Our kernel runs with `--ipython on` (every cell through IPython's shell, the
path meant to match ipykernel) unless --ipython off or KM_CORPUS_IPYTHON=off
(the stdlib path, the kernel's default).

What is normalised, and why (everything else must be identical):
  * memory addresses `0x7f...` -> `0x…` (differ between any two runs);
  * `%time` / `%timeit` figures -> `<T>` (timings);
  * the notebook's working directory -> `<WS>` (a fresh temporary directory
    per run);
  * the name of the cell's code object in warnings and SyntaxError values:
    ipykernel's `/tmp/ipykernel_PID/HASH.py`, our `/tmp/kernelmgr-cells-UID/HASH.py`
    (warnings) and `<cell-N>` (SyntaxError values) -> `<cell>`
    (the kernel may keep its own, better name);
  * "\\r\\n" (and "\\r\\r\\n") -> "\\n" in streams: ipykernel runs `!cmd` on a
    pty, which turns every "\\n" of the command's output into "\\r\\n"; a
    frontend renders them the same;
  * consecutive stream outputs are merged per stream name (stdout, stderr):
    how a stream is cut into messages, and the interleaving of stdout with
    stderr, is not defined even between two runs of ipykernel; the order of
    streams relative to displays, results and errors is compared;
  * text/html: runs of white space -> one space;
  * image/png: compared by pixel dimensions (exact) and decoded size (within
    2 %), never by bytes; its metadata (retina width/height) exactly;
  * errors: ename and evalue exactly; the traceback's formatting is the
    kernel's own (ipykernel's is ANSI-coloured IPython text) and not compared.
"""
import base64
import difflib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SYS_PY = "/usr/bin/python3"
OURS = "km-corpus-ours"
REF = "km-corpus-ipykernel"
TARGET = 98.0
CELL_TIMEOUT = 120


def notebooks():
    """Paths of the corpus's notebooks, sorted: the project's own, then the
    public set (public/, SOURCES.md says where each file comes from)."""
    return sorted(HERE.glob("*.ipynb")) + sorted((HERE / "public").glob("*.ipynb"))


# Public notebooks run by `make bench` (the whole corpus) but not by
# tests/e2e/test_nb_corpus.py, which keeps to a representative subset so that
# its time stays as it was.
BENCH_ONLY = {"nbsphinx_code_cells"}


def test_names():
    """The stems tests/e2e/test_nb_corpus.py runs."""
    return [p.stem for p in notebooks() if p.stem not in BENCH_ONLY]


def baseline():
    """{notebook: [code cell index]}: the cells that were identical on both
    kernels in two consecutive runs of the whole corpus when baseline.json
    was last written; they must stay identical (add to it as the kernel
    matches more)."""
    return json.loads((HERE / "baseline.json").read_text())


def build_dir():
    b = Path(os.environ.get("BUILD", ROOT / "build"))
    return b if b.is_absolute() else ROOT / b


def kernel_binary():
    return str(build_dir() / "kernel-python")


def ipython_default():
    return os.environ.get("KM_CORPUS_IPYTHON", "on")


class Kernelspecs:
    """A JUPYTER_PATH with our kernel (the sandbox level of
    KM_TEST_SANDBOX, default strict; --ipython on unless ipython is "off")
    and ipykernel, both on /usr/bin/python3.

    ipykernel gets a clean environment like ours gets (HOME a fresh
    directory, the host's LANG and TERM, a system PATH) so that neither the
    host user's HOME (a matplotlibrc, IPython profile) nor the variables of
    the test runner change the reference; its matplotlib cache is built once
    beforehand so that "building the font cache" is not a cell output."""

    def __init__(self, base, sandbox=None, ipython=None):
        self.base = Path(base)
        self.sandbox = sandbox or os.environ.get("KM_TEST_SANDBOX", "strict")
        self.ipython = ipython or ipython_default()
        self.jupyter_path = self.base / "jp"
        home = self.base / "ref-home"
        mplcfg = self.base / "ref-mpl"
        home.mkdir(parents=True, exist_ok=True)
        mplcfg.mkdir(parents=True, exist_ok=True)
        self.ref_env = {
            "HOME": str(home), "MPLCONFIGDIR": str(mplcfg),
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TERM": os.environ.get("TERM", "xterm"),
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
        }
        subprocess.run([SYS_PY, "-c", "import matplotlib.font_manager"],
                       env=self.ref_env, capture_output=True, timeout=300, check=False)
        specs = {
            OURS: [kernel_binary(), "-f", "{connection_file}", "--sandbox", self.sandbox,
                   "--python", SYS_PY, "--ipython", self.ipython],
            REF: ["/usr/bin/env", "-i", *("%s=%s" % kv for kv in self.ref_env.items()),
                  SYS_PY, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        }
        for name, argv in specs.items():
            d = self.jupyter_path / "kernels" / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "kernel.json").write_text(json.dumps({
                "argv": argv, "display_name": name, "language": "python"}))

    def environ(self):
        """Variables for the process running nbclient."""
        return {"JUPYTER_PATH": str(self.jupyter_path),
                "JUPYTER_RUNTIME_DIR": str(self.base / "rt"),
                "JUPYTER_DATA_DIR": str(self.base / "data"),
                "JUPYTER_CONFIG_DIR": str(self.base / "cfg"),
                "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


class Run:
    """One notebook executed on one kernel: the executed notebook (or None),
    the working directory, the wall time and the exception that stopped it."""

    def __init__(self, nb, ws, seconds, failure):
        self.nb, self.ws, self.seconds, self.failure = nb, ws, seconds, failure


def run_notebook(path, kernel_name, specs):
    """Executes the notebook at path on kernel_name in a fresh directory."""
    import nbclient
    import nbformat
    from jupyter_client import KernelManager
    nb = nbformat.read(str(path), as_version=4)
    ws = Path(tempfile.mkdtemp(prefix=f"{path.stem}-", dir=specs.base))
    res = path.parent / "resources"  # files the public notebooks read (images)
    if path.parent != HERE and res.is_dir():
        shutil.copytree(res, ws, dirs_exist_ok=True)
    old = {k: os.environ.get(k) for k in specs.environ()}
    os.environ.update(specs.environ())
    failure = None
    km = None
    log_path = specs.base / ("%s-%s.log" % (ws.name, kernel_name))
    t0 = time.perf_counter()
    try:
        # the kernel's own stdout/stderr (banners, its log) go to a file
        with open(log_path, "wb") as log:
            # ipc, not tcp: a free tcp port jupyter_client picked can be
            # taken by another kernel starting at the same moment (the
            # suite runs in parallel) before this kernel binds it; the sockets sit beside a
            # connection file of this run's own (a relative ip would put
            # them in the shared working directory)
            km = KernelManager(kernel_name=kernel_name, transport="ipc",
                               connection_file=str(specs.base / ("%s-%s.json" % (ws.name,
                                                                                 kernel_name))))
            nbclient.NotebookClient(nb, km=km, kernel_name=kernel_name, timeout=CELL_TIMEOUT,
                                    startup_timeout=60, allow_errors=True,
                                    resources={"metadata": {"path": str(ws)}}).execute(
                                        stdout=log, stderr=subprocess.STDOUT)
    except Exception as e:  # noqa: BLE001 -- reported as the run's failure
        tail = log_path.read_text(errors="replace")[-1500:] if log_path.exists() else ""
        failure = "%s: %s\nkernel log: %s" % (type(e).__name__, str(e)[:2000], tail)
    finally:
        seconds = time.perf_counter() - t0
        # nbclient shuts down only a kernel manager it made itself
        try:
            if km is not None and km.has_kernel:
                km.shutdown_kernel()
        except Exception:  # noqa: BLE001 -- a kernel that is gone is what we want
            pass
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Run(nb, ws, seconds, failure)


# ---------------------------------------------------------------- normalising

_ADDR = re.compile(r"0x[0-9a-fA-F]{4,}")
_CRLF = re.compile(r"\r+\n")
_CELLNAME = re.compile(r"/tmp/ipykernel_\d+/\d+\.py|[^\s'\"(]*/kernelmgr-cells-\d+/\d+\.py"
                       r"|<cell-\d+>|\b\d{6,}\.py\b")
_UNIT = r"[\d.]+ ?(?:ns|µs|us|ms|s|min|h)"
_TIMES = [
    (re.compile(r"^CPU times: .*$", re.M), "CPU times: <T>"),
    (re.compile(r"^Wall time: .*$", re.M), "Wall time: <T>"),
    (re.compile(r"^%s ± %s per loop" % (_UNIT, _UNIT), re.M), "<T> ± <T> per loop"),
    (re.compile(r"^%s per loop" % _UNIT, re.M), "<T> per loop"),
]


def norm_text(s, ws):
    if isinstance(s, list):
        s = "".join(s)
    for p in {str(ws), os.path.realpath(str(ws))}:
        s = s.replace(p, "<WS>")
    s = _ADDR.sub("0x…", s)
    s = _CELLNAME.sub("<cell>", s)
    for rx, rep in _TIMES:
        s = rx.sub(rep, s)
    return s


def png_info(b64):
    """(width, height, decoded bytes) of a base64 PNG, or None if it is not one."""
    try:
        raw = base64.b64decode(b64 if isinstance(b64, str) else "".join(b64))
    except ValueError:
        return None
    if raw[:8] != b"\x89PNG\r\n\x1a\n" or len(raw) < 24:
        return None
    w, h = struct.unpack(">II", raw[16:24])
    return (w, h, len(raw))


def canonical(outputs, ws):
    """The cell's outputs as comparable items: ("stream", {name: text}) per run
    of consecutive streams, ("display_data"|"execute_result", {...}),
    ("error", {...})."""
    items = []
    for o in outputs:
        t = o["output_type"]
        if t == "stream":
            text = _CRLF.sub("\n", norm_text(o.get("text", ""), ws))
            if items and items[-1][0] == "stream":
                d = items[-1][1]
                d[o["name"]] = d.get(o["name"], "") + text
            else:
                items.append(("stream", {o["name"]: text}))
        elif t in ("display_data", "execute_result"):
            data = {}
            for mime, v in o.get("data", {}).items():
                if mime == "image/png":
                    data[mime] = png_info(v) or ("not a PNG", norm_text(v, ws)[:80])
                elif mime == "text/html":
                    data[mime] = re.sub(r"\s+", " ", norm_text(v, ws)).strip()
                elif isinstance(v, (dict, list)) and mime.endswith("json"):
                    data[mime] = json.loads(norm_text(json.dumps(v, sort_keys=True), ws))
                else:
                    data[mime] = norm_text(v, ws)
            d = {"data": data, "metadata": dict(o.get("metadata", {}))}
            if t == "execute_result":
                d["execution_count"] = o.get("execution_count")
            items.append((t, d))
        elif t == "error":
            items.append(("error", {"ename": o.get("ename"),
                                    "evalue": norm_text(o.get("evalue", ""), ws)}))
        else:
            items.append((t, dict(o)))
    return items


def _png_same(a, b):
    if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == 3 and len(b) == 3):
        return a == b
    return a[:2] == b[:2] and abs(a[2] - b[2]) <= max(64, 0.02 * max(a[2], b[2]))


def differences(ours, ref):
    """What differs between two canonical output lists (empty: identical)."""
    out = []
    kinds_o, kinds_r = [i[0] for i in ours], [i[0] for i in ref]
    if kinds_o != kinds_r:
        out.append("output sequence: ours %s, ipykernel %s" % (kinds_o, kinds_r))
    for n, (o, r) in enumerate(zip(ours, ref)):
        if o[0] != r[0]:
            continue
        where = "output %d (%s)" % (n, o[0])
        if o[0] in ("display_data", "execute_result"):
            od, rd = o[1]["data"], r[1]["data"]
            if sorted(od) != sorted(rd):
                out.append("%s: mime types ours %s, ipykernel %s" % (where, sorted(od),
                                                                   sorted(rd)))
            for mime in sorted(set(od) & set(rd)):
                same = _png_same(od[mime], rd[mime]) if mime == "image/png" \
                    else od[mime] == rd[mime]
                if not same:
                    out.append("%s: %s differs" % (where, mime))
            if o[1]["metadata"] != r[1]["metadata"]:
                out.append("%s: metadata ours %s, ipykernel %s" % (
                    where, json.dumps(o[1]["metadata"]), json.dumps(r[1]["metadata"])))
            if o[1].get("execution_count") != r[1].get("execution_count"):
                out.append("%s: execution_count ours %s, ipykernel %s" % (
                    where, o[1].get("execution_count"), r[1].get("execution_count")))
        elif o[1] != r[1]:
            out.append("%s differs" % where)
    return out


def render(items):
    """Readable lines of canonical outputs, for diffs."""
    lines = []
    for kind, d in items:
        if kind == "stream":
            for name in sorted(d):
                lines.append("[stream %s]" % name)
                lines += ["  " + ln for ln in d[name].split("\n")]
        elif kind in ("display_data", "execute_result"):
            head = "[%s%s]" % (kind, " %s" % d["execution_count"]
                               if kind == "execute_result" else "")
            if d["metadata"]:
                head += " metadata " + json.dumps(d["metadata"], sort_keys=True)
            lines.append(head)
            for mime in sorted(d["data"]):
                v = d["data"][mime]
                if mime == "image/png" and isinstance(v, tuple) and len(v) == 3:
                    lines.append("  %s: %dx%d px, %d bytes" % (mime, *v))
                    continue
                v = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
                vl = v.split("\n")
                lines.append("  %s: %s" % (mime, vl[0]))
                lines += ["    " + ln for ln in vl[1:]]
        elif kind == "error":
            lines.append("[error] %s: %s" % (d["ename"], d["evalue"]))
        else:
            lines.append("[%s] %s" % (kind, json.dumps(d, sort_keys=True)))
    return lines


class CellResult:
    def __init__(self, notebook, index, cell, ours, ref, diffs, ref_errored):
        self.notebook, self.index, self.cell = notebook, index, cell
        self.ours, self.ref, self.diffs = ours, ref, diffs
        self.ref_errored = ref_errored

    @property
    def identical(self):
        return not self.diffs

    @property
    def tags(self):
        return list(self.cell.get("metadata", {}).get("tags", []))


def compare(name, ours_run, ref_run):
    """[CellResult] for every code cell of one notebook."""
    res = []
    ocells = ours_run.nb.cells if ours_run.nb is not None else []
    rcells = ref_run.nb.cells
    for i, rc in enumerate(rcells):
        if rc.cell_type != "code":
            continue
        oc = ocells[i] if i < len(ocells) else {"outputs": [], "execution_count": None}
        o = canonical(oc.get("outputs", []), ours_run.ws)
        r = canonical(rc.get("outputs", []), ref_run.ws)
        d = differences(o, r)
        if oc.get("execution_count") != rc.get("execution_count"):
            d.append("cell execution_count ours %s, ipykernel %s" % (
                oc.get("execution_count"), rc.get("execution_count")))
        res.append(CellResult(name, i, rc, o, r, d, any(k == "error" for k, _ in r)))
    return res


class Corpus:
    """The whole corpus run on both kernels: runs[name] = (ours, ref),
    cells[name] = [CellResult]."""

    def __init__(self, base, names=None, sandbox=None, ipython=None):
        self.specs = Kernelspecs(base, sandbox, ipython)
        self.runs, self.cells = {}, {}
        for p in notebooks():
            if names and p.stem not in names:
                continue
            ref = run_notebook(p, REF, self.specs)
            ours = run_notebook(p, OURS, self.specs)
            self.runs[p.stem] = (ours, ref)
            self.cells[p.stem] = compare(p.stem, ours, ref)

    def all_cells(self):
        return [c for cs in self.cells.values() for c in cs]

    def percent(self, cells=None):
        cells = self.all_cells() if cells is None else cells
        return 100.0 * sum(c.identical for c in cells) / max(1, len(cells))

    def summary(self):
        lines = ["| notebook | code cells | identical | % | ours s | ipykernel s |",
                 "|---|---|---|---|---|---|"]
        for name, cs in self.cells.items():
            o, r = self.runs[name]
            lines.append("| %s | %d | %d | %.1f | %.1f | %.1f |" % (
                name, len(cs), sum(c.identical for c in cs), self.percent(cs),
                o.seconds, r.seconds))
        cs = self.all_cells()
        lines.append("| **total** | %d | %d | **%.1f** | %.1f | %.1f |" % (
            len(cs), sum(c.identical for c in cs), self.percent(),
            sum(o.seconds for o, _ in self.runs.values()),
            sum(r.seconds for _, r in self.runs.values())))
        return "\n".join(lines)

    def regressions(self, base):
        """Cells named by base ({notebook: [index]}) that are not identical."""
        return [c for name, cs in self.cells.items() for c in cs
                if c.index in base.get(name, ()) and not c.identical]

    def report(self, base=None):
        """Markdown: the summary, regressions against base, run failures,
        then every divergent cell with its source, what differs and a diff of
        the normalised outputs."""
        out = ["# Notebook corpus: our kernel vs ipykernel", "",
               "Sandbox %s, ipython %s; target >= %.0f %% of code cells identical; measured "
               "**%.1f %%**." % (self.specs.sandbox, self.specs.ipython, TARGET, self.percent()),
               "", self.summary(), ""]
        if base is not None:
            reg = self.regressions(base)
            out += ["**Regressions** (identical in baseline.json, divergent now): %s" % (
                ", ".join("%s cell %d" % (c.notebook, c.index) for c in reg) or "none"), ""]
        for name, (o, r) in self.runs.items():
            for who, run in (("ours", o), ("ipykernel", r)):
                if run.failure:
                    out += ["**%s on %s stopped:** `%s`" % (name, who, run.failure), ""]
        div = [c for c in self.all_cells() if not c.identical]
        out += ["## %d divergent cells" % len(div), ""]
        for c in div:
            out += ["### %s, cell %d" % (c.notebook, c.index), "", "```python", c.cell.source,
                    "```", ""]
            out += ["* " + d for d in c.diffs]
            out += ["", "```diff"]
            out += list(difflib.unified_diff(render(c.ref), render(c.ours), "ipykernel", "ours",
                                             lineterm="", n=3))
            out += ["```", ""]
        return "\n".join(out)


def main(argv):
    report = None
    ipython = None
    names = []
    it = iter(argv)
    for a in it:
        if a == "--report":
            report = next(it)
        elif a == "--ipython":
            ipython = next(it)
        else:
            names.append(a[:-6] if a.endswith(".ipynb") else a)
    base = tempfile.mkdtemp(prefix="km-corpus-")
    try:
        c = Corpus(base, names, ipython=ipython)
        print(c.summary())
        text = c.report(baseline())
        if report:
            Path(report).write_text(text)
            print("written:", report)
        else:
            print(text)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
