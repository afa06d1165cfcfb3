"""The docs' configuration table and the code's table of options agree.

`kernelmgr config --doc` prints the table generated from config.c's
kmcfg_opts; the docs' table (docs/CONFIGURATION.md, or README.md's
"### Configuration" until it moves there) must name the same keys, and
docs/CONFIGURATION.md's table is exactly that output (generated, not
written by hand). Regenerate it with `kernelmgr config --doc` when this
fails. Likewise docs/API.md's "Session options" table is exactly
`kernelmgr config --doc session-options` (dtier.c's dtier_sessopts)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
HEADER = re.compile(r"^\|\s*key\s*\|\s*default\s*\|\s*meaning\s*\|\s*$")
SESSOPT_HEADER = re.compile(
    r"^\|\s*field\s*\|\s*type\s*\|\s*default\s*\|\s*meaning\s*\|\s*$")


def keys_of_table(lines):
    """The keys named in the first cell of each row of a markdown table."""
    keys = set()
    for line in lines:
        if not line.startswith("|"):
            break
        first = line.split("|")[1]
        keys.update(re.findall(r"`([a-z_]+)`", first))
    return keys


def docs_tables():
    """(file, keys) of every key/default/meaning table in the docs."""
    found = []
    for name in ("docs/CONFIGURATION.md", "README.md"):
        path = ROOT / name
        if not path.exists():
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if HEADER.match(line):
                found.append((name, keys_of_table(lines[i + 2:])))
    return found


def code_keys():
    r = subprocess.run([str(kutil.binary("kernelmgr")), "config", "--doc"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert HEADER.match(lines[0]), lines[0]
    keys = keys_of_table(lines[2:])
    assert len(keys) == len(lines) - 2, "one row per key"
    return keys


def test_docs_table_names_every_key():
    code = code_keys()
    assert "memory" in code and "http_host" in code
    tables = docs_tables()
    assert tables, "no configuration table (| key | default | meaning |) in README.md " \
                   "or docs/CONFIGURATION.md"
    # the table with the most keys is the configuration table
    name, docs = max(tables, key=lambda t: len(t[1]))
    assert not code - docs, f"{name} lacks {sorted(code - docs)} (kernelmgr config --doc)"
    assert not docs - code, f"{name} names {sorted(docs - code)}, which are no keys"


def test_configuration_md_table_is_the_generated_one():
    r = subprocess.run([str(kutil.binary("kernelmgr")), "config", "--doc"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    gen = r.stdout.rstrip("\n").splitlines()
    lines = (ROOT / "docs/CONFIGURATION.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if HEADER.match(line))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    assert lines[start:end] == gen, \
        "docs/CONFIGURATION.md's table differs from `kernelmgr config --doc`: regenerate it"


def test_config_without_doc_is_a_usage_error():
    r = subprocess.run([str(kutil.binary("kernelmgr")), "config"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert "config takes --doc" in r.stderr


def docs_table(name, header):
    """The lines of the first table of docs file name whose header matches."""
    lines = (ROOT / name).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if header.match(line))
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def test_config_doc_keys_is_the_default():
    km = str(kutil.binary("kernelmgr"))
    plain = subprocess.run([km, "config", "--doc"], capture_output=True, text=True, timeout=30)
    keys = subprocess.run([km, "config", "--doc", "keys"], capture_output=True, text=True,
                          timeout=30)
    assert plain.returncode == 0 and keys.returncode == 0, plain.stderr + keys.stderr
    assert keys.stdout == plain.stdout


def test_api_md_session_options_table_is_the_generated_one():
    r = subprocess.run([str(kutil.binary("kernelmgr")), "config", "--doc", "session-options"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    gen = r.stdout.rstrip("\n").splitlines()
    assert SESSOPT_HEADER.match(gen[0]), gen[0]
    names = [re.match(r"^\| `([a-z_]+)` \|", line).group(1) for line in gen[2:]]
    assert {"network", "memory", "python", "workspace", "sandbox", "env", "cpus",
            "zygote"} <= set(names)
    assert len(set(names)) == len(names), "one row per session option"
    assert docs_table("docs/API.md", SESSOPT_HEADER) == gen, \
        "docs/API.md's session-options table differs from " \
        "`kernelmgr config --doc session-options`: regenerate it"


@pytest.mark.parametrize("args", [["--doc", "nonsense"], ["--doc", "keys", "extra"],
                                  ["--docs", "keys"]])
def test_config_doc_bad_argument_is_a_usage_error(args):
    r = subprocess.run([str(kutil.binary("kernelmgr")), "config", *args], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    if args[:2] == ["--doc", "nonsense"]:
        assert "keys" in r.stderr and "session-options" in r.stderr
        assert '"nonsense"' in r.stderr
    else:
        assert "config takes --doc" in r.stderr
