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
