"""Paths the manager builds under its home are never truncated: a home too
long for them is refused by name and limit, and one just within the limit
works end to end (session directory, workspace, outputs)."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import mgrutil

KM_HOME_MAX = 2048  # kernelmgr/engine/km.h


def deep_dir(base, length):
    """A directory under base whose absolute path is exactly length bytes."""
    p = str(base)
    while len(p) < length:
        room = length - len(p) - 1
        p += "/" + "d" * min(200, room if room <= 200 or room - 200 > 1 else room - 2)
    assert len(p) == length, len(p)
    os.makedirs(p)
    return p


@pytest.fixture
def base():
    d = tempfile.mkdtemp(prefix="kmp", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def run(home, *args):
    cfg = {"sandbox": mgrutil.SANDBOX, "python": "/usr/bin/python3"}
    Path(home, "config.json").write_text(json.dumps(cfg))
    env = dict(os.environ, KERNELMGR_HOME=home)
    return subprocess.run([mgrutil.KM, "run", "--json", "--lang", "bash", "-c",
                           "echo hi > f.txt; pwd"], capture_output=True, text=True,
                          env=env, timeout=120)


def test_home_too_long_is_refused_by_its_limit(base):
    home = deep_dir(base, KM_HOME_MAX + 1)
    p = run(home)
    assert p.returncode != 0
    assert f"longer than {KM_HOME_MAX} bytes" in p.stderr, p.stderr
    # nothing made under it
    assert os.listdir(home) == ["config.json"]


def test_home_at_the_limit_works(base):
    home = deep_dir(base, KM_HOME_MAX)
    p = run(home)
    assert p.returncode == 0, p.stderr
    res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert res and res[0]["status"] == "ok", res
    assert [f["path"] for f in res[0]["files"]] == ["f.txt"], res[0]["files"]
    # the run left its outputs directory under the full-length home, and
    # nothing beside the path to it (a truncated home would be a sibling of
    # one of its components)
    assert os.path.isdir(os.path.join(home, "outputs"))
    d = str(base)
    while d != home:
        entries = os.listdir(d)
        assert len(entries) == 1, (d, entries)
        d = os.path.join(d, entries[0])
