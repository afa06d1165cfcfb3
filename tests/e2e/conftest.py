import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402


@pytest.fixture
def kernel_factory(tmp_path):
    """kernel_factory(lang, args=(), **kw) -> kutil.Kernel; all closed at teardown."""
    made = []

    def make(lang, args=(), **kw):
        k = kutil.Kernel(lang, tmp_path / f"k{len(made)}", args=args, **kw)
        made.append(k)
        return k

    yield make
    for k in made:
        k.close()


@pytest.fixture
def make_mgr():
    """make_mgr(config=None) -> mgrutil.Mgr (its own KERNELMGR_HOME); every
    manager made is closed (daemon stopped, home removed) at teardown."""
    import mgrutil
    made = []

    def make(config=None):
        m = mgrutil.Mgr(config)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


# ---------------------------------------------------------------- running in parallel
# tests/run.sh runs the suite with pytest-xdist (-n N --dist loadgroup -m
# "not serial"), then the tests marked serial in a second, serial pass. The
# conventions that keep a test file parallel-safe without anything to do:
#   * everything a test makes is its own: tmp_path, a home from
#     tempfile.mkdtemp, ports from bind(("127.0.0.1", 0)), processes found by
#     a path of its own (its home, its tmp_path), never by name alone;
#   * tests of a file that share a fixture wider than one test (scope
#     "module" or "class", e.g. one kernel for the file) run on one worker,
#     so it is made once (the xdist_group below); everything else is handed
#     out test by test;
#   * a test that floods a kernel or the daemon flat out (as fast as the
#     CPU lets it, for seconds) gets @pytest.mark.flood: those run one
#     after another on one worker (one xdist group), in parallel with the
#     rest; several floods at once on two cores took minutes each;
#   * a test that measures the machine (CPU shares, timings against an
#     idle host) or loads all of it gets @pytest.mark.serial.

def pytest_configure(config):
    config.addinivalue_line(
        "markers", "serial: needs the machine to itself (measures CPU shares or timing, "
        "or loads every core); tests/run.sh runs these after the parallel pass (-m serial)")
    config.addinivalue_line(
        "markers", "flood: floods a kernel or the daemon flat out; under pytest-xdist all of "
        "these run on one worker, one after another")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    grouped = set()
    for item in items:
        if item.get_closest_marker("flood") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("flood"))
        if item.get_closest_marker("xdist_group"):
            grouped.add(item.nodeid)
            continue
        fi = getattr(item, "_fixtureinfo", None)
        if fi is None:
            continue
        for name in fi.names_closure:
            defs = fi.name2fixturedefs.get(name) or ()
            if any(d.scope in ("module", "class", "package") for d in defs):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
                grouped.add(item.nodeid)
                break
    # Groups are the largest pieces of work one worker must do alone: they
    # are handed out first, so none starts last and ends the run late (the
    # order of the tests within a file is kept).
    items.sort(key=lambda i: i.nodeid not in grouped)
