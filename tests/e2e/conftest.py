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
