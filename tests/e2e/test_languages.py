"""Languages as data (kernelmgr/engine/lang.h): a language the configuration's
"kernels" adds runs beside python and bash with no code change, either as a
kernel-server backend (sandboxed like the built-ins) or as a Jupyter
kernelspec; bad entries are refused naming the key and the reason."""
import json
import os
import time
from pathlib import Path

import pytest

import mgrutil
from test_mcp import call, need_sdk, ok_result, sdk, text_of

SH = {"sh": {"backend": "kernel-bash", "aliases": ["posix"], "file_extension": ".sh",
             "cell_magic": "%%bash"}}


def need_kernels():
    for lang in ("python", "bash"):
        if not mgrutil.have_kernel(lang):
            pytest.fail(f"build/kernel-{lang} is missing")


def sessions(mgr):
    p = mgr.run("sessions", "--json")
    assert p.returncode == 0, p.stderr
    return {s["name"]: s for s in json.loads(p.stdout)}


def pid_gone(pid, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return True
        time.sleep(0.05)
    return False


def test_configured_backend_language(make_mgr, tmp_path):
    need_kernels()
    mgr = make_mgr({"kernels": SH})
    marker = mgr.home / "host-marker.txt"
    marker.write_text("host secret")
    # three live kernels in one session, separate state
    md = ("```python\nx = 'py'\nprint(x)\n```\n"
          "```bash\nB=bashval; echo \"bash $B\"\n```\n"
          "```posix\nS=shval; echo \"sh $S [$B]\"\n```\n")
    rc, res, p = mgr.exec("s", md)
    assert rc == 0, p.stderr
    assert [r["language"] for r in res] == ["python", "bash", "sh"]
    assert res[1]["stdout"] == "bash bashval\n"
    assert res[2]["stdout"] == "sh shval []\n"  # bash's variable is not in sh
    rc, res, p = mgr.exec("s", 'echo "[$S] [$B]"', "--lang", "sh")
    assert rc == 0 and res[0]["language"] == "sh" and res[0]["stdout"] == "[shval] []\n", p.stderr
    rc, res, _ = mgr.exec("s", 'echo "[$S] [$B]"', "--lang", "bash")
    assert res[0]["stdout"] == "[] [bashval]\n"
    # its kernel is sandboxed like the built-ins: the host's files are not there
    rc, res, _ = mgr.exec("s", f"test -e {marker} && echo visible || echo absent", "--lang", "sh")
    assert res[0]["stdout"] == "absent\n"
    info = sessions(mgr)["s"]
    assert set(info["kernels"]) == {"python", "bash", "sh"}
    assert all(info["kernels"][k] for k in ("python", "bash", "sh"))
    p = mgr.run("sessions")
    assert "python:live" in p.stdout and "bash:live" in p.stdout and "sh:live" in p.stdout
    # export: python3 notebook, sh cells as %%bash with a warning naming them
    out = tmp_path / "s.ipynb"
    p = mgr.run("export", "s", "-o", str(out))
    assert p.returncode == 0, p.stderr
    nb = json.loads(out.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    sh_cells = [c for c in nb["cells"] if c["metadata"]["kernelmgr"]["language"] == "sh"]
    assert len(sh_cells) == 3 and all("".join(c["source"]).startswith("%%bash\n")
                                      for c in sh_cells)
    assert any("3 sh cell(s)" in w for w in nb["metadata"]["kernelmgr"]["warnings"])
    # restart replaces it, close stops it: no process left
    pid = info["kernels"]["sh"]["pid"]
    assert mgr.run("restart", "s").returncode == 0
    assert pid_gone(pid)
    info = sessions(mgr)["s"]
    pid2 = info["kernels"]["sh"]["pid"]
    assert pid2 != pid
    assert mgr.run("close", "s").returncode == 0
    assert pid_gone(pid2) and pid_gone(info["kernels"]["bash"]["pid"])


def test_configured_language_only_session_exports_on_its_kernel(make_mgr, tmp_path):
    need_kernels()
    mgr = make_mgr({"kernels": SH})
    rc, res, p = mgr.exec("o", "V=1\necho $V", "--lang", "sh")
    assert rc == 0, p.stderr
    out = tmp_path / "o.ipynb"
    assert mgr.run("export", "o", "-o", str(out)).returncode == 0
    nb = json.loads(out.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "kernelmgr-sh"
    assert nb["metadata"]["language_info"] == {"name": "sh", "file_extension": ".sh"}
    assert "".join(nb["cells"][0]["source"]) == "V=1\necho $V"


def test_max_kernels_counts_configured_language(make_mgr):
    need_kernels()
    mgr = make_mgr({"kernels": SH, "max_kernels": 2})
    rc, res, p = mgr.exec("m", "```python\nprint(1)\n```\n```bash\necho 2\n```\n")
    assert rc == 0, p.stderr
    # the cap is reached: another session's sh kernel counts, and the idle
    # session m gives way (as a whole: a session's own kernels are never
    # stopped for its other languages)
    rc, res, p = mgr.exec("n", "echo 3", "--lang", "sh")
    assert rc == 0 and res[0]["stdout"] == "3\n", p.stderr
    ss = sessions(mgr)
    assert not any(ss["m"]["kernels"].values()), ss["m"]
    live = [k for k, v in ss["n"]["kernels"].items() if v]
    assert live == ["sh"], live


def test_configured_kernelspec_language(make_mgr):
    need_kernels()
    if not Path("/usr/share/jupyter/kernels/python3/kernel.json").exists():
        pytest.fail("Debian's ipykernel kernelspec python3 is missing (make deps)")
    mgr = make_mgr({"kernels": {"ipy": "python3"}})
    rc, res, p = mgr.exec("k", "```ipy\nimport sys\nprint('ipykernel' in sys.modules)\n```\n"
                               "```python\nimport sys\nprint('ipykernel' in sys.modules)\n```\n")
    assert rc == 0, p.stderr
    assert [r["language"] for r in res] == ["ipy", "python"]
    assert res[0]["stdout"] == "True\n"   # ipykernel runs it
    assert res[1]["stdout"] == "False\n"  # our kernel runs python
    # a cell of a language without a cell magic is never dropped from an export
    p = mgr.run("export", "k", "-o", "/dev/null")
    assert p.returncode == 2 and "1 ipy cell(s)" in p.stderr, p.stderr
    # the stop's automatic snapshot does not wait for ipykernel, which has
    # no snapshot request to answer (it waited its 30 s limit): the python
    # kernel's state is saved, the ipy one's named lost at once
    t0 = time.monotonic()
    p = mgr.run("serve", "--stop", timeout=60)
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - t0 < 20, time.monotonic() - t0
    man = json.loads((mgr.home / "sessions/k/snapshots/auto/manifest.json").read_text())
    assert "python" in man["kernels"] and "ipy" not in man["kernels"], man
    assert "not one of kernelmgr's" in man["failed"]["ipy"], man


@pytest.mark.parametrize("kernels,needle", [
    ({"sh": {"backend": "kernel-bash", "colour": "red"}}, "kernels.sh.colour: unknown key"),
    ({"sh": {"backend": "kernel-bash", "kernelspec": "python3"}}, "kernels.sh: needs exactly one"),
    ({"foo": {"backend": "kernel-bash", "aliases": ["py"]}},
     "kernels.foo.aliases: \"py\" is already a name or alias of another language"),
    ({"Bad Name": "python3"}, "kernels.Bad Name: not a language name"),
    ({"auto": "python3"}, "kernels.auto: \"auto\" is reserved"),
])
def test_bad_language_configs_refused(make_mgr, kernels, needle):
    mgr = make_mgr({"kernels": kernels})
    p = mgr.run("exec", "--session", "x", "-c", "1")
    assert p.returncode == 2, p.stderr
    assert "invalid configuration" in p.stderr and needle in p.stderr, p.stderr


def test_missing_backend_named_at_kernel_start(make_mgr):
    need_kernels()
    mgr = make_mgr({"kernels": {"gone": {"backend": "kernel-nosuch"}}})
    rc, res, p = mgr.exec("g", "echo hi", "--lang", "gone")
    assert rc != 0
    assert res[0]["error"]["name"] == "KernelStartError", res
    assert "kernel-nosuch" in res[0]["error"]["value"]
    assert "No such file" in res[0]["error"]["value"]
    rc, res, _ = mgr.exec("g", "print(6 * 7)", "--lang", "python")
    assert rc == 0 and res[0]["stdout"] == "42\n"


def test_unknown_lang_lists_the_daemons_languages(make_mgr):
    need_kernels()
    mgr = make_mgr({"kernels": SH})
    rc, res, _ = mgr.exec("u", "X=1", "--lang", "sh")
    assert rc == 0
    p = mgr.run("exec", "--session", "u", "--lang", "cobol", "-c", "1")
    assert p.returncode == 2
    assert "unknown language \"cobol\"" in p.stderr and "python, bash, sh" in p.stderr, p.stderr
    rc, res, _ = mgr.exec("u", "echo $X", "--lang", "sh")
    assert res[0]["stdout"] == "1\n"  # the session still works
    # the one-shot run (an in-process manager) says the same
    p = mgr.run("run", "--lang", "cobol", "-c", "1")
    assert p.returncode == 2 and "python, bash, sh" in p.stderr, p.stderr


def test_mcp_code_exec_configured_language(make_mgr):
    need_kernels()
    need_sdk()
    mgr = make_mgr({"kernels": SH})
    out = sdk(mgr, [
        {"op": "list_tools"},
        call("code_exec", {"code": "Y=7; echo $((Y * 6))", "language": "sh", "session": "mc"}),
        call("code_exec", {"code": "1", "language": "cobol", "session": "mc"}),
        call("code_exec", {"code": "echo $Y", "language": "sh", "session": "mc"}),
    ])
    tools = {t["name"]: t for t in ok_result(out["steps"][0])["tools"]}
    lang = tools["code_exec"]["inputSchema"]["properties"]["language"]
    assert "enum" not in lang  # the daemon knows the languages, not the schema
    assert all(w in lang["description"] for w in ("python", "bash", "auto"))
    r = ok_result(out["steps"][1])
    assert r["isError"] is False, text_of(r)
    assert r["structuredContent"]["blocks"][0]["language"] == "sh"
    assert r["structuredContent"]["blocks"][0]["stdout"] == "42\n"
    bad = ok_result(out["steps"][2])
    assert bad["isError"] is True
    assert "cobol" in text_of(bad) and "python, bash, sh" in text_of(bad), text_of(bad)
    r = ok_result(out["steps"][3])
    assert r["structuredContent"]["blocks"][0]["stdout"] == "7\n"
