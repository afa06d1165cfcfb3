"""The notebook corpus (tests/notebooks/*.ipynb) run through nbclient
on build/kernel-python and on ipykernel, compared cell by cell.

How outputs are normalised before the comparison is described in
tests/notebooks/corpus.py. With KM_CORPUS_REPORT=FILE set, the summary and a
diff of every divergent cell are written to FILE (CI leaves it unset).
"""
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

import kutil

pytest.importorskip("nbclient")
if importlib.util.find_spec("ipykernel") is None:
    pytest.skip("ipykernel not installed (Debian python3-ipykernel)", allow_module_level=True)

pytestmark = pytest.mark.skipif(not os.path.exists(kutil.binary("kernel-python")),
                                reason="build/kernel-python not built")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))
import corpus  # noqa: E402

# The cells that must stay identical (tests/notebooks/baseline.json).
BASELINE = corpus.baseline()


@pytest.fixture(scope="module")
def runs():
    base = tempfile.mkdtemp(prefix="km-corpus-")
    try:
        c = corpus.Corpus(base, names=corpus.test_names())
        report = os.environ.get("KM_CORPUS_REPORT")
        if report:
            Path(report).write_text(c.report(BASELINE))
        yield c
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _divergent(cells):
    lines = []
    for c in cells:
        lines.append("%s cell %d: %s\n    %s" % (c.notebook, c.index, c.cell.source[:200],
                                               "\n    ".join(c.diffs)))
    return "\n".join(lines)


def test_corpus_is_big_enough():
    nbs = corpus.notebooks()
    import nbformat
    cells = [c for p in nbs for c in nbformat.read(str(p), as_version=4).cells
             if c.cell_type == "code"]
    assert len(nbs) >= 8 and len(cells) >= 150, (len(nbs), len(cells))


def test_every_notebook_ran_to_the_end_on_both_kernels(runs):
    """No cell timed out and no kernel died, on either kernel."""
    failed = {name: (o.failure, r.failure) for name, (o, r) in runs.runs.items()
              if o.failure or r.failure}
    assert not failed, failed
    assert sorted(runs.runs) == sorted(corpus.test_names())


def test_reference_raises_exactly_in_tagged_cells(runs):
    """The corpus says what it is: on ipykernel, a cell gives an error
    output if and only if it is tagged raises-exception."""
    wrong = [c for c in runs.all_cells()
             if c.ref_errored != ("raises-exception" in c.tags)]
    assert not wrong, "\n".join("%s cell %d (tags %s): %s" % (c.notebook, c.index, c.tags,
                                                             c.cell.source[:120]) for c in wrong)


def test_identical_cells_reach_the_target(runs):
    """The target: >= 98 % of code cells give identical outputs."""
    pct = runs.percent()
    div = [c for c in runs.all_cells() if not c.identical]
    assert pct >= corpus.TARGET, "%.1f %% identical (target %.0f %%)\n%s\n\n%s" % (
        pct, corpus.TARGET, runs.summary(), _divergent(div))


@pytest.mark.parametrize("notebook", sorted(BASELINE))
def test_no_regression_on_cells_that_match(runs, notebook):
    """Per category (one notebook each): the cells that matched stay identical."""
    by_index = {c.index: c for c in runs.cells[notebook]}
    missing = [i for i in BASELINE[notebook] if i not in by_index]
    assert not missing, "baseline names cells that are not code cells: %s" % missing
    bad = [by_index[i] for i in BASELINE[notebook] if not by_index[i].identical]
    assert not bad, _divergent(bad)


def _order(items):
    """The sequence of outputs without stderr (warnings are compared elsewhere):
    a run of streams counts once if it has stdout; displays with their
    text/plain ('d0' vs 'd1'), results by their mime types."""
    seq = []
    for kind, d in items:
        if kind == "stream":
            if "stdout" in d:
                seq.append(("stream", d["stdout"]))
        elif kind == "error":
            seq.append(("error", d["ename"]))
        elif kind == "display_data":
            seq.append((kind, sorted(d["data"]), d["data"].get("text/plain")))
        else:  # an execute_result's text is the pretty printer's (compared elsewhere)
            seq.append((kind, sorted(d["data"])))
    return seq


def test_output_order_in_progress_loops(runs):
    """display / clear_output / update_display / print loops: the saved
    notebook has the same outputs in the same order as ipykernel's, in each
    of several runs on our kernel (the order was racy)."""
    name = "08_display_progress"
    path = [p for p in corpus.notebooks() if p.stem == name][0]
    _, ref = runs.runs[name]
    refcells = {c.index: c for c in runs.cells[name]}
    for attempt in range(5):
        run = runs.runs[name][0] if attempt == 0 else corpus.run_notebook(
            path, corpus.OURS, runs.specs)
        assert run.failure is None, run.failure
        for c in corpus.compare(name, run, ref):
            assert _order(c.ours) == _order(refcells[c.index].ref), (
                "run %d, cell %d:\n%s\nours:      %s\nipykernel: %s" % (
                    attempt, c.index, c.cell.source, _order(c.ours),
                    _order(refcells[c.index].ref)))


def test_comparison_catches_what_it_must(runs):
    """The comparison itself: a copy of ipykernel's own outputs is identical;
    swapped outputs, changed text, a result missing, a differently sized
    image and a changed error each make the cell divergent."""
    import copy
    for name, (_, ref) in runs.runs.items():
        assert all(c.identical for c in corpus.compare(name, ref, ref)), name

    def cell_with(name, pred):
        _, ref = runs.runs[name]
        for i, c in enumerate(ref.nb.cells):
            if c.cell_type == "code" and pred(c.outputs):
                return ref, i
        raise AssertionError("no such cell in %s" % name)

    def diverges(name, pred, mutate):
        ref, i = cell_with(name, pred)
        mine = copy.deepcopy(ref.nb)
        mutate(mine.cells[i].outputs)
        fake = corpus.Run(mine, ref.ws, 0.0, None)
        return [c for c in corpus.compare(name, fake, ref) if c.index == i][0].diffs

    def swap(outs):
        outs[0], outs[1] = outs[1], outs[0]

    def two_kinds(outs):
        return len({o.output_type for o in outs[:2]}) == 2

    def has(kind):
        return lambda outs: any(o.output_type == kind for o in outs)

    assert diverges("08_display_progress", two_kinds, swap)

    def retext(outs):
        r = [o for o in outs if o.output_type == "execute_result"][0]
        r.data["text/plain"] += " "

    assert diverges("10_pretty_printing", has("execute_result"), retext)
    assert diverges("10_pretty_printing", has("execute_result"), lambda outs: outs.clear())

    def has_png(outs):
        return any("image/png" in o.get("data", {}) for o in outs)

    def shrink(outs):
        import base64
        import struct
        o = [o for o in outs if "image/png" in o.get("data", {})][0]
        raw = bytearray(base64.b64decode(o.data["image/png"]))
        raw[16:20] = struct.pack(">I", struct.unpack(">I", raw[16:20])[0] + 1)
        o.data["image/png"] = base64.b64encode(bytes(raw)).decode()

    assert diverges("04_matplotlib_basics", has_png, shrink)

    def other_error(outs):
        [o for o in outs if o.output_type == "error"][0].evalue += "!"

    assert diverges("09_errors_warnings", has("error"), other_error)
