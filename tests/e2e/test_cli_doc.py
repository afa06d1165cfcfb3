"""The command line is one table of commands and one of options (cli.c):
`kernelmgr --help` is generated from them, docs/CLI.md's Commands block is
exactly that output, and every option is parsed and checked in one place, so
a bad value names the option and its range, and an unknown or incomplete
option is a usage error (exit 2) that names it. No kernel is started here."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kutil  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- kernelmgr --help -->"
END = "<!-- end kernelmgr --help -->"


def km(*args, home):
    env = dict(os.environ, KERNELMGR_HOME=str(home))
    return subprocess.run([kutil.binary("kernelmgr"), *args], capture_output=True,
                          text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


def help_lists(home):
    """--help up to its footer: the commands and the options."""
    r = km("--help", home=home)
    assert r.returncode == 0, r.stderr
    return r.stdout[: r.stdout.index("\nState lives in")]


def test_docs_commands_block_is_the_help_output(tmp_path):
    text = (ROOT / "docs/CLI.md").read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "docs/CLI.md lacks the generated --help block"
    block = text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip()
    assert block.startswith("```") and block.endswith("```")
    documented = block[3:-3].lstrip("\n")
    assert documented == help_lists(tmp_path), (
        "docs/CLI.md's Commands block differs from `kernelmgr --help`: regenerate it")


def test_every_option_is_named_in_help_and_docs(tmp_path):
    """Options of one command appear in its synopsis, the others under
    Options; the docs name every one of them."""
    out = help_lists(tmp_path)
    opts = set(re.findall(r"--[a-z][a-z-]+", out))
    assert {"--timeout", "--network", "--memory", "--cpus", "--cpu-time", "--session",
            "--keep", "--repair", "--kernel", "--pool", "--http", "--tls-cert",
            "--manager", "--allowlist", "--env", "--json", "--help"} <= opts
    docs = (ROOT / "docs/CLI.md").read_text(encoding="utf-8")
    assert not {o for o in opts if o not in docs}


@pytest.mark.parametrize("args,says", [
    (["--timeout", "abc"], "--timeout must be a positive number of seconds"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds"),
    (["--cpus", "0"], "--cpus must be a number of CPUs from 0.01 to 4096"),
    (["--cpu-time", "-1"], "--cpu-time must be a number of seconds from 0.001"),
    (["--memory", "1K"], "--memory must be a size of at least 16M"),
    (["--network", "maybe"], "--network must be"),
    (["--sandbox", "loose"], "--sandbox must be strict or none"),
    (["--pool", "129"], "--pool must be an integer 0..128"),
    (["--python", "python3"], "--python must be an absolute path"),
    (["--tls-cert", "cert.pem"], "--tls-cert must be an absolute path"),
    (["--env", "=x"], "--env"),
    (["--lang", ""], "--lang must be"),
    (["--bogus"], 'unknown option "--bogus"'),
    (["-z"], 'unknown option "-z"'),
    (["--timeout"], "option --timeout needs a value"),
])
def test_bad_option_is_a_usage_error_naming_it(tmp_path, args, says):
    r = km("sessions", *args, home=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert says in r.stderr, r.stderr
    assert "Try 'kernelmgr --help'." in r.stderr


def test_help_and_version_anywhere(tmp_path):
    for args in (["--help"], ["-h"], ["help"], ["sessions", "--help"], ["exec", "-h"]):
        r = km(*args, home=tmp_path)
        assert r.returncode == 0 and r.stdout.startswith("Usage: kernelmgr"), (args, r.stderr)
    r = km("--version", home=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("kernelmgr "), r.stderr
