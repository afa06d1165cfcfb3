"""`kernelmgr mcp install`: the MCP client configuration with the absolute
path of this kernelmgr and a pinned interpreter, merged into the client's
file without touching other entries, refusing (and never overwriting) a
file that is not JSON — and the entry it writes really starts a server
whose Python kernel is the pinned interpreter."""
import json
import os
import select
import shutil
import stat
import subprocess

import pytest

import mgrutil

KM_REAL = os.path.realpath(mgrutil.KM)


def install(tmp_path, *args, cwd=None, env_extra=None):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8"}
    env.update(env_extra or {})
    return subprocess.run([mgrutil.KM, "mcp", "install", *args], capture_output=True, text=True,
                          env=env, cwd=cwd or tmp_path, timeout=60)


def entry_of(doc, key="mcpServers", name="kernelmgr"):
    return doc[key][name]


def test_claude_file_written_with_absolute_paths(tmp_path):
    p = install(tmp_path, "--client", "claude", "--python", "/usr/bin/python3")
    assert p.returncode == 0, p.stderr
    f = tmp_path / "home/.config/Claude/claude_desktop_config.json"
    e = entry_of(json.loads(f.read_text()))
    assert e == {"command": KM_REAL, "args": ["mcp"],
                 "env": {"KERNELMGR_PYTHON": "/usr/bin/python3"}}
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert "added" in p.stderr and str(f) in p.stderr
    # XDG_CONFIG_HOME wins
    p = install(tmp_path, "--client", "claude", "--python", "/usr/bin/python3",
                env_extra={"XDG_CONFIG_HOME": str(tmp_path / "xdg")})
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "xdg/Claude/claude_desktop_config.json").exists()


def test_merge_keeps_other_entries_and_replaces_ours(tmp_path):
    f = tmp_path / "home/.cursor/mcp.json"
    f.parent.mkdir(parents=True)
    other = {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/x"],
             "env": {"TOKEN": "secret"}}
    f.write_text(json.dumps({"mcpServers": {"fs": other, "kernelmgr": {"command": "old"}},
                             "theme": "dark"}))
    os.chmod(f, 0o640)
    p = install(tmp_path, "--client", "cursor", "--python", "/usr/bin/python3")
    assert p.returncode == 0, p.stderr
    doc = json.loads(f.read_text())
    assert doc["theme"] == "dark" and doc["mcpServers"]["fs"] == other
    assert entry_of(doc)["command"] == KM_REAL and "replaced" in p.stderr
    assert stat.S_IMODE(f.stat().st_mode) == 0o640  # the file's mode is kept
    assert [x.name for x in f.parent.iterdir()] == ["mcp.json"]  # no temporary left


def test_vscode_workspace_file_has_stdio_servers(tmp_path):
    ws = tmp_path / "project"
    ws.mkdir()
    al = tmp_path / "allow.json"
    al.write_text("{}")
    p = install(tmp_path, "--client", "vscode", "--python", "/usr/bin/python3",
                "--allowlist", str(al), "--name", "km", cwd=ws)
    assert p.returncode == 0, p.stderr
    doc = json.loads((ws / ".vscode/mcp.json").read_text())
    e = entry_of(doc, "servers", "km")
    assert e["type"] == "stdio" and e["command"] == KM_REAL
    assert e["args"] == ["mcp", "--allowlist", str(al)]


def test_invalid_json_is_refused_and_left_alone(tmp_path):
    f = tmp_path / "home/.cursor/mcp.json"
    f.parent.mkdir(parents=True)
    for bad in (b'{"mcpServers": {"fs": {}},, }', b"[1, 2]", b'{"mcpServers": [1]}'):
        f.write_bytes(bad)
        p = install(tmp_path, "--client", "cursor", "--python", "/usr/bin/python3")
        assert p.returncode == 2, p.stderr
        assert "not changed" in p.stderr and str(f) in p.stderr or "mcpServers" in p.stderr, \
            p.stderr
        assert f.read_bytes() == bad
    f.write_bytes(b'{"x": 1,')
    p = install(tmp_path, "--client", "cursor", "--python", "/usr/bin/python3")
    assert p.returncode == 2 and "is not valid JSON (line 1" in p.stderr, p.stderr


def test_print_and_generic_write_nothing(tmp_path):
    p = install(tmp_path, "--client", "generic", "--python", "/usr/bin/python3")
    assert p.returncode == 0, p.stderr
    assert entry_of(json.loads(p.stdout))["command"] == KM_REAL
    p = install(tmp_path, "--client", "claude", "--print", "--python", "/usr/bin/python3")
    assert p.returncode == 0 and entry_of(json.loads(p.stdout))["args"] == ["mcp"]
    assert not (tmp_path / "home").exists()
    # generic --file merges like the others
    g = tmp_path / "g.json"
    g.write_text('{"mcpServers": {"a": {"command": "a"}}}')
    p = install(tmp_path, "--client", "generic", "--python", "/usr/bin/python3",
                "--file", "g.json")
    assert p.returncode == 0, p.stderr
    assert set(json.loads(g.read_text())["mcpServers"]) == {"a", "kernelmgr"}


def test_default_interpreter_is_the_one_found_here(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    p = install(tmp_path, "--client", "generic", env_extra={"VIRTUAL_ENV": str(venv)})
    assert p.returncode == 0, p.stderr
    assert entry_of(json.loads(p.stdout))["env"]["KERNELMGR_PYTHON"] == f"{venv}/bin/python"


def test_usage_errors(tmp_path):
    for args, why in ((["--client", "emacs"], "unknown client"), ([], "--client is required"),
                      (["--client", "claude", "--python", "/nonexistent/python3"],
                       "/nonexistent/python3"),
                      (["--client", "claude", "extra"], "unexpected argument")):
        p = install(tmp_path, *args)
        assert p.returncode == 2 and why in p.stderr, (args, p.stderr)
    assert not (tmp_path / "home").exists()


def test_the_written_entry_runs_the_pinned_interpreter(tmp_path):
    """Start the server exactly as a client would from the file (command,
    args, env and nothing of our PATH), run a cell: its sys.executable is the
    pinned interpreter."""
    if not mgrutil.have_kernel("python"):
        pytest.skip("the python kernel is not built")
    m = mgrutil.Mgr({"python": None})  # nothing but the entry's env pins it
    try:
        p = install(tmp_path, "--client", "generic", "--python", "/usr/bin/python3",
                    env_extra={"KERNELMGR_HOME": str(m.home)})
        assert p.returncode == 0, p.stderr
        e = entry_of(json.loads(p.stdout))
        assert e["env"]["KERNELMGR_HOME"] == str(m.home)
        env = {"HOME": str(tmp_path), **e["env"]}  # a client's bare environment
        srv = subprocess.Popen([e["command"], *e["args"]], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               cwd="/")
        try:
            def ask(msg, timeout=120):
                srv.stdin.write((json.dumps(msg) + "\n").encode())
                srv.stdin.flush()
                if "id" not in msg:
                    return None
                r, _, _ = select.select([srv.stdout], [], [], timeout)
                assert r, "no answer from the server"
                return json.loads(srv.stdout.readline())
            ask({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                            "clientInfo": {"name": "t", "version": "0"}}})
            ask({"jsonrpc": "2.0", "method": "notifications/initialized"})
            r = ask({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "code_exec",
                                "arguments": {"code": "import sys; print(sys.executable)",
                                              "language": "python", "session": "pin"}}})
            text = "".join(c.get("text", "") for c in r["result"]["content"])
            assert "/usr/bin/python3" in text, r
        finally:
            srv.stdin.close()
            srv.wait(30)
            srv.stdout.close()
            srv.stderr.close()
    finally:
        m.close()
