"""Environment and terminal attacks, through the real manager and kernels.

Class 2 (environment leaks): whatever is in the environment of whoever
starts `kernelmgr run`, the daemon or a kernel binary (cloud keys, tokens,
LD_PRELOAD, PYTHONPATH, BASH_ENV, PROMPT_COMMAND, ENV, its PATH) never reaches
the sandbox; the sandbox gets a fixed PATH, HOME=/tmp (writable), LANG/LC_*/
TERM/TZ, and exactly the variables passed explicitly (--env, config "env",
daemon and MCP "env"), bounded and validated.

Class 6 (terminal injection): the CLI's readable output on a terminal shows
control characters from the sandbox escaped (colour SGR sequences kept), file
names are always escaped, --json is unchanged.

Each runs as the invoking user and, when that is root, also as nobody.
"""
import json
import os
import pty
import re
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import apiutil
import kutil
import mgrutil
import sbxutil

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
HOST_PATH_MARK = "/opt/km-h5-host-path-mark/bin"
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "AKIA-h5-secret-PWNED",
    "GITHUB_TOKEN": "ghp_h5_secret_PWNED",
    "OPENAI_API_KEY": "sk-h5-PWNED",
    "LD_PRELOAD": "/nonexistent/km-h5-PWNED.so",
    "LD_LIBRARY_PATH": "/nonexistent/km-h5-PWNED",
    "PYTHONPATH": "/nonexistent/km-h5-PWNED",
    "PYTHONSTARTUP": "/nonexistent/km-h5-PWNED.py",
    "BASH_ENV": "/nonexistent/km-h5-PWNED.sh",
    "ENV": "/nonexistent/km-h5-PWNED.sh",
    "PROMPT_COMMAND": "echo PWNED-prompt",
    "VIRTUAL_ENV_H5": "PWNED",
}
PASSED = {"LANG": "C.UTF-8", "LC_MESSAGES": "C", "TZ": "UTC", "TERM": "xterm-256color"}



class KM:
    """A KERNELMGR_HOME owned by user, the CLI run as user, a daemon to stop."""

    def __init__(self, user, config=None):
        if user == "nobody" and not sbxutil.IS_ROOT:
            pytest.skip("the nobody variant needs root to switch users (the invoker variant "
                        "already runs unprivileged)")
        self.user = user
        self.prefix = sbxutil.SETPRIV if user == "nobody" else []
        self.bin = sbxutil.kernelmgr_for(user)
        self.home = Path(tempfile.mkdtemp(prefix="kmh5", dir="/tmp"))
        cfg = {"sandbox": mgrutil.SANDBOX, "python": "/usr/bin/python3"}
        cfg.update(config or {})
        (self.home / "config.json").write_text(json.dumps(cfg))
        if user == "nobody":
            for p in (self.home, self.home / "config.json"):
                os.chown(p, sbxutil.NOBODY, sbxutil.NOBODY)
        # the caller's environment: its PATH carries a marker, plus secrets
        path = os.environ.get("PATH", "/usr/bin:/bin")
        self.env = dict(os.environ, KERNELMGR_HOME=str(self.home), HOME=str(self.home),
                        PATH=HOST_PATH_MARK + ":" + path, **SECRETS, **PASSED)
        self.env.pop("LC_ALL", None)

    def argv(self, *args):
        return [*self.prefix, self.bin, *args]

    def run(self, *args, input=None, timeout=120, env=None):
        return subprocess.run(self.argv(*args), input=input, capture_output=True, text=True,
                              env=env or self.env, timeout=timeout)

    def results(self, *args, **kw):
        p = self.run(*args, "--json", **kw)
        res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return p.returncode, res, p

    def close(self):
        try:
            self.run("serve", "--stop", timeout=30)
        except subprocess.TimeoutExpired:
            pass
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(params=sbxutil.USERS)
def km(request):
    for lang in ("bash", "python"):
        if not mgrutil.have_kernel(lang):
            pytest.fail(f"build/kernel-{lang} is missing")
    k = KM(request.param)
    yield k
    k.close()


DUMP_PY = r"""
import json, os
raw = open('/proc/self/environ', 'rb').read().split(b'\0')
proc = dict(e.decode(errors='replace').split('=', 1) for e in raw if b'=' in e)
home_ok = False
try:
    p = os.path.join(os.environ.get('HOME', '/nonexistent'), '.km-h5-probe')
    open(p, 'w').write('x'); os.unlink(p); home_ok = True
except OSError as e:
    home_ok = str(e)
print('ENVDUMP' + json.dumps({'environ': dict(os.environ), 'proc': proc, 'home_ok': home_ok}))
"""

DUMP_BASH = r"""
env -0 | base64 -w0 | sed 's/^/BASHENV /'; echo
printf 'HOMEW %s\n' "$( (touch "$HOME/.km-h5-probe" && rm "$HOME/.km-h5-probe" && echo yes) 2>&1)"
printf 'VARS [%s][%s]\n' "${PROMPT_COMMAND-unset}" "${BASH_ENV-unset}"
"""


def py_dump(text):
    line = next(ln for ln in text.splitlines() if ln.startswith("ENVDUMP"))
    return json.loads(line[len("ENVDUMP"):])


def bash_dump(text):
    import base64
    line = next(ln for ln in text.splitlines() if ln.startswith("BASHENV "))
    raw = base64.b64decode(line.split(" ", 1)[1])
    env = dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)
    homew = next(ln for ln in text.splitlines() if ln.startswith("HOMEW "))
    return env, homew[6:].strip()


def assert_clean(env, what, extra=()):
    """No host secret or host PATH entry; the fixed PATH (+ extra dirs first)."""
    for k, v in SECRETS.items():
        # (PYTHONPATH is the manager's own package directory, not the host's)
        assert env.get(k) != v, f"{what}: {k} leaked into the sandbox: {env}"
    for k, v in env.items():
        assert "PWNED" not in v and "h5_secret" not in v, f"{what}: {k}={v}"
    assert HOST_PATH_MARK not in env.get("PATH", ""), f"{what}: host PATH leaked: {env['PATH']}"
    parts = env["PATH"].split(":")
    assert ":".join(parts[-3:]) == SANDBOX_PATH, f"{what}: PATH {env['PATH']}"
    for p in parts[:-3]:
        assert any(p.startswith(x) for x in extra), f"{what}: unexpected PATH entry {p}"
    assert env["HOME"] == "/tmp", f"{what}: HOME {env.get('HOME')}"
    for k, v in PASSED.items():
        if k == "TERM" and env.get("TERM") == "dumb":
            continue  # the bash kernel sets TERM=dumb itself
        assert env.get(k) == v, f"{what}: {k} not passed: {env.get(k)}"


def check_block_envs(km, results, session_dirs):
    by_lang = {r["language"]: r for r in results}
    assert set(by_lang) == {"python", "bash"}, results
    assert all(r["status"] == "ok" for r in results), results
    d = py_dump(by_lang["python"]["stdout"])
    extra = ("/usr/bin", "/usr/local/bin", "/bin") + tuple(session_dirs)
    assert_clean(d["environ"], "python os.environ", extra)
    assert_clean(d["proc"], "python /proc/self/environ", extra)
    assert d["home_ok"] is True, d
    env, homew = bash_dump(by_lang["bash"]["stdout"])
    assert_clean(env, "bash env", extra)
    assert homew == "yes", homew
    assert "VARS [unset][unset]" in by_lang["bash"]["stdout"]
    assert "PWNED" not in by_lang["bash"]["stdout"] + by_lang["bash"]["stderr"]


def blocks(extra_py="", extra_bash=""):
    return (f"```python\n{DUMP_PY}{extra_py}\n```\n\n```bash\n{DUMP_BASH}{extra_bash}\n```\n")


# ------------------------------------------------------------------ class 2: leaks


def test_run_does_not_pass_host_secrets(km):
    rc, res, p = km.results("run", "-", input=blocks())
    assert rc == 0, p.stderr
    check_block_envs(km, res, [str(km.home)])
    # HOME is writable, so matplotlib has a config dir and says nothing
    rc, res, p = km.results("run", "--lang", "python", "-c",
                            "import matplotlib, matplotlib.pyplot as plt\n"
                            "plt.plot([1, 2]); plt.savefig('p.png'); print('mpl ok')")
    assert rc == 0, (p.stderr, res)
    assert "mpl ok" in res[0]["stdout"], res
    # (with --sandbox none, HOME=/tmp is the host's shared /tmp, where another
    # user's ~/.config may already exist: only a private /tmp is checked)
    if mgrutil.SANDBOX == "strict":
        assert "writable" not in res[0]["stderr"] and "cache" not in res[0]["stderr"], res[0]


def test_daemon_does_not_pass_host_secrets_and_keeps_explicit_env(km):
    # the daemon is started by this exec, with the secrets in its environment
    rc, res, p = km.results("exec", "--session", "s1", "--env", "MY_SETTING=a b=c",
                            "--env", "EMPTY=", "-", input=blocks())
    assert rc == 0, p.stderr
    check_block_envs(km, res, [str(km.home)])
    env = py_dump(res[0]["stdout"])["environ"]
    assert env["MY_SETTING"] == "a b=c" and env["EMPTY"] == ""
    # the session's state file keeps the variables, readable by the user only
    sj = km.home / "sessions" / "s1" / "session.json"
    assert (sj.stat().st_mode & 0o077) == 0 and (sj.parent.stat().st_mode & 0o077) == 0
    assert json.loads(sj.read_text())["options"]["env"]["MY_SETTING"] == "a b=c"
    # another env for the existing session: ignored with a warning naming no value
    rc, res, p = km.results("exec", "--session", "s1", "--env", "MY_SETTING=other", "--lang",
                            "bash", "-c", 'echo "[$MY_SETTING]"')
    assert rc == 0 and res[0]["stdout"] == "[a b=c]\n", (p.stderr, res)
    assert "--env MY_SETTING was ignored" in p.stderr, p.stderr
    assert "other" not in p.stderr
    # a restarted daemon gives the session its variables back
    pid = int((km.home / "daemon.pid").read_text())
    assert km.run("serve", "--stop").returncode == 0
    deadline = time.monotonic() + 60  # --stop returns once the socket is gone
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    rc, res, p = km.results("exec", "--session", "s1", "--lang", "bash", "-c",
                            'echo "[$MY_SETTING][${GITHUB_TOKEN-none}]"')
    assert rc == 0 and res[0]["stdout"] == "[a b=c][none]\n", (p.stderr, res)


def test_config_env_and_limits(km):
    cfgp = km.home / "config.json"
    cfg = json.loads(cfgp.read_text())
    cfg["env"] = {"FROM_CONFIG": "cfg-value", "SHARED": "config"}
    cfgp.write_text(json.dumps(cfg))
    rc, res, p = km.results("run", "--env", "SHARED=cli", "--lang", "bash", "-c",
                            'echo "[$FROM_CONFIG][$SHARED][${AWS_SECRET_ACCESS_KEY-none}]"')
    assert rc == 0 and res[0]["stdout"] == "[cfg-value][cli][none]\n", (p.stderr, res)

    big = "x" * (32 * 1024 + 1)
    cases = [
        (["--env", "1BAD=x"], "invalid variable name '1BAD'"),
        (["--env", "BAD-NAME=x"], "invalid variable name"),
        (["--env", "NOEQUALS"], "expected NAME=VALUE"),
        (["--env", "KERNELMGR_EVT_FD=9"], "set by the kernel itself"),
        (["--env", "BIG=" + big], "limit 32768 bytes per value"),
        ([a for i in range(65) for a in ("--env", f"V{i}=1")], "too many variables (limit 64)"),
        ([a for i in range(9) for a in ("--env", f"V{i}=" + "y" * 32000)],
         "more than 262144 bytes"),
    ]
    for args, want in cases:
        for cmd in (["run"], ["exec", "--session", "lim"]):
            p = km.run(*cmd, *args, "--lang", "bash", "-c", "echo hi")
            assert p.returncode == 2, (cmd, args[:2], p.stdout, p.stderr)
            assert want in p.stderr, (want, p.stderr)
    # the same through the daemon's protocol (what other clients send)
    for env, want in [({"1X": "a"}, "invalid variable name"), ({"A": 1}, "must be a string"),
                      ([], "must be an object"),
                      ({f"V{i}": "1" for i in range(65)}, "limit 64")]:
        rep = daemon_exec(km, apiutil.request("exec", {"session": "lim", "code": "echo hi",
                                                       "lang": "bash", "env": env}))
        assert "error" in rep and want in rep["error"]["message"], (env, rep)
    # an invalid config env is refused with the key
    for bad, want in [({"env": {"A B": "x"}}, "env: invalid variable name"),
                      ({"env": {"A": ["x"]}}, "must be a string"),
                      ({"env": "A=1"}, "env: must be an object")]:
        cfgp.write_text(json.dumps(dict(cfg, **bad)))
        p = km.run("run", "--lang", "bash", "-c", "echo hi")
        assert p.returncode == 2 and "invalid configuration" in p.stderr and want in p.stderr, \
            p.stderr
    cfgp.write_text(json.dumps(cfg))
    # config (2) + 63 session variables exceed the limit together
    rc, res, p = km.results("run", *[a for i in range(63) for a in ("--env", f"W{i}=1")],
                            "--lang", "bash", "-c", "echo hi")
    assert rc == 2 and "limit 64" in p.stderr, p.stderr
    # after every refusal the sessions still work, with their variables
    rc, res, p = km.results("exec", "--session", "lim", "--env", "OK=1", "--lang", "bash",
                            "-c", 'echo "[$OK][$FROM_CONFIG]"')
    assert rc == 0 and res[0]["stdout"] == "[1][cfg-value]\n", (p.stderr, res)


def daemon_exec(km, req):
    """One request on the daemon's socket (started by a first exec)."""
    import socket
    sock_path = km.home / "kernelmgr.sock"
    if not sock_path.exists():
        assert km.run("exec", "--session", "boot", "--lang", "bash", "-c", ":").returncode == 0
    s = socket.socket(socket.AF_UNIX)
    if km.user == "nobody":
        # only the daemon's uid may connect: ask through a nobody helper
        p = subprocess.run([*km.prefix, sbxutil.PY, "-c",
                            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
                            "s.connect(sys.argv[1]); s.sendall(sys.argv[2].encode()+b'\\n')\n"
                            "f=s.makefile()\nprint(f.readline())", str(sock_path),
                            json.dumps(req)], capture_output=True, text=True, timeout=60)
        return json.loads(p.stdout)
    s.connect(str(sock_path))
    s.sendall(json.dumps(req).encode() + b"\n")
    line = s.makefile().readline()
    s.close()
    return json.loads(line)


def test_mcp_env_on_session_creation(km):
    p = subprocess.Popen(km.argv("mcp"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=km.env, text=True)

    def ask(i, method, params):
        p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": i, "method": method,
                                  "params": params}) + "\n")
        p.stdin.flush()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r, _, _ = select.select([p.stdout], [], [], deadline - time.monotonic())
            assert r, "no answer from the MCP server"
            msg = json.loads(p.stdout.readline())
            if msg.get("id") == i:
                return msg
        pytest.fail("no answer from the MCP server")

    def text(msg):
        return "\n".join(c.get("text", "") for c in msg["result"]["content"])

    try:
        ask(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "t", "version": "1"}})
        p.stdin.write('{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        p.stdin.flush()
        m = ask(2, "tools/call", {"name": "code_exec", "arguments": {
            "session": "m1", "language": "bash", "env": {"FROM_MCP": "mcp-value"},
            "code": 'echo "[$FROM_MCP][${GITHUB_TOKEN-none}][$PATH]"'}})
        assert not m["result"].get("isError"), m
        assert "[mcp-value][none][" in text(m) and HOST_PATH_MARK not in text(m), m
        assert f"{SANDBOX_PATH}]" in text(m), m
        for i, env, want in [(3, {"1X": "a"}, "invalid variable name"),
                             (4, {"A": 5}, "must be a string"),
                             (5, {"KERNELMGR_REQ_FD": "1"}, "set by the kernel itself")]:
            m = ask(i, "tools/call", {"name": "code_exec", "arguments": {
                "session": "m2", "language": "bash", "env": env, "code": "echo hi"}})
            assert m["result"].get("isError") and want in text(m), m
        m = ask(6, "tools/call", {"name": "code_exec", "arguments": {
            "session": "m1", "language": "bash", "code": 'echo "again [$FROM_MCP]"'}})
        assert "again [mcp-value]" in text(m), m
    finally:
        p.stdin.close()
        p.wait(30)
        p.stdout.close()
        p.stderr.close()


@pytest.mark.parametrize("lang", ["bash", "python"])
def test_kernel_binary_env(kernel_factory, lang, tmp_path):
    env = dict(os.environ, PATH=HOST_PATH_MARK + ":" + os.environ.get("PATH", ""), **SECRETS,
               **PASSED)
    args = ["--sandbox", mgrutil.SANDBOX, "--env", "EXPLICIT=yes"]
    if lang == "python":
        args += ["--python", "/usr/bin/python3"]
    k = kernel_factory(lang, args=args, env=env)
    code = DUMP_PY if lang == "python" else DUMP_BASH
    _, r = k.execute(code, timeout=60)
    out = kutil.stream_text(r["iopub"])
    if lang == "python":
        e = py_dump(out)["environ"]
        assert py_dump(out)["home_ok"] is True
    else:
        e, homew = bash_dump(out)
        assert homew == "yes"
    assert e["EXPLICIT"] == "yes"
    assert_clean(e, f"kernel-{lang}", ("/usr/bin", "/usr/local/bin", "/bin"))
    # bad --env values are usage errors naming the limit
    for bad, want in [("1X=a", "invalid variable name"), ("X", "expected NAME=VALUE"),
                      ("KERNELMGR_REQ_FD=1", "set by the kernel itself"),
                      ("X=" + "v" * 40000, "limit 32768 bytes per value")]:
        p = subprocess.run([kutil.binary("kernel-" + lang), "-f", str(tmp_path / "none.json"),
                            "--env", bad], capture_output=True, text=True, timeout=30)
        assert p.returncode == 2 and want in p.stderr, (bad[:20], p.stderr)
    p = subprocess.run([kutil.binary("kernel-" + lang), "-f", str(tmp_path / "none.json"),
                        *[a for i in range(73) for a in ("--env", f"V{i}=1")]],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "too many variables (limit 72)" in p.stderr, p.stderr
    _, r = k.execute("print(6*7)" if lang == "python" else "echo $((6*7))", timeout=30)
    assert "42" in kutil.stream_text(r["iopub"])


# ------------------------------------------------- class 2: never on a command line
#
# /proc/PID/cmdline is readable by every user of the host: the manager hands a
# session's variables to its kernels in a 0600 file (--env-file), never as
# arguments.


def all_cmdlines():
    """{pid: raw /proc/PID/cmdline} of every process we can see."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "cmdline").read_bytes()
            except OSError:
                pass
    return out


def kernels_of(home):
    """{pid: argv} of the kernel servers started for KERNELMGR_HOME home."""
    found = {}
    for pid, raw in all_cmdlines().items():
        argv = raw.split(b"\0")
        if argv and os.path.basename(argv[0]) in (b"kernel-python", b"kernel-bash") and \
                str(home).encode() in raw:
            found[pid] = argv
    return found


def assert_nowhere_on_a_command_line(*values):
    for pid, raw in all_cmdlines().items():
        for v in values:
            assert v.encode() not in raw, f"pid {pid} has {v!r} on its command line: {raw!r}"


def assert_env_file_argv(km, argv, session_dir):
    """The kernel got --env-file session_dir/env (0600, the caller's) and no --env."""
    assert b"--env" not in argv, argv
    assert argv.count(b"--env-file") == 1, argv
    path = Path(argv[argv.index(b"--env-file") + 1].decode())
    assert path == session_dir / "env", (path, session_dir)
    return path


def test_session_env_never_on_a_command_line(km):
    secret = "f1-cmdline-" + os.urandom(8).hex()
    other = "two words " + os.urandom(4).hex()
    show_py = "\nprint('SEEN', os.environ.get('SECRET_ONE'), os.environ.get('OTHER_ONE'))"
    show_bash = '\necho "SEEN [$SECRET_ONE][$OTHER_ONE]"'
    rc, res, p = km.results("exec", "--session", "s1", "--env", "SECRET_ONE=" + secret,
                            "--env", "OTHER_ONE=" + other, "-",
                            input=blocks(show_py, show_bash))
    assert rc == 0, p.stderr
    check_block_envs(km, res, [str(km.home)])
    by_lang = {r["language"]: r for r in res}
    assert f"SEEN {secret} {other}\n" in by_lang["python"]["stdout"], res
    assert f"SEEN [{secret}][{other}]\n" in by_lang["bash"]["stdout"], res
    # the CLI has exited; the daemon and both kernels run on
    sdir = km.home / "sessions" / "s1"
    kernels = kernels_of(km.home)
    assert {os.path.basename(a[0]) for a in kernels.values()} == \
        {b"kernel-python", b"kernel-bash"}, kernels
    for argv in kernels.values():
        path = assert_env_file_argv(km, argv, sdir)
    assert_nowhere_on_a_command_line(secret, other)
    st = path.lstat()
    uid = sbxutil.NOBODY if km.user == "nobody" else os.geteuid()
    assert st.st_uid == uid and (st.st_mode & 0o7777) == 0o600, oct(st.st_mode)
    data = path.read_bytes()
    assert (b"SECRET_ONE=%s\0" % secret.encode()) in data
    assert (b"OTHER_ONE=%s\0" % other.encode()) in data
    # a restart writes it anew (a fresh temporary file renamed over it)
    assert km.run("restart", "s1").returncode == 0
    rc, res, p = km.results("exec", "--session", "s1", "--lang", "bash", "-c",
                            'echo "again [$SECRET_ONE]"')
    assert rc == 0 and res[0]["stdout"] == f"again [{secret}]\n", (p.stderr, res)
    assert not list(sdir.glob(".env-*")), list(sdir.iterdir())
    assert (path.lstat().st_mode & 0o7777) == 0o600
    for argv in kernels_of(km.home).values():
        assert_env_file_argv(km, argv, sdir)
    assert_nowhere_on_a_command_line(secret, other)
    # the file goes with the session
    assert km.run("close", "s1").returncode == 0
    assert not path.exists() and not sdir.exists()
    deadline = time.monotonic() + 30
    while kernels_of(km.home) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not kernels_of(km.home)
    # and the manager still works
    rc, res, p = km.results("exec", "--session", "s2", "--lang", "bash", "-c", "echo $((6*7))")
    assert rc == 0 and res[0]["stdout"] == "42\n", (p.stderr, res)


def test_run_env_never_on_a_command_line(km):
    # `run` (no daemon): looked at while its kernel runs a block that waits
    secret = "f1-run-" + os.urandom(8).hex()
    proc = subprocess.Popen(km.argv("run", "--json", "--env", "RUN_SECRET=" + secret,
                                    "--lang", "bash", "-c",
                                    'echo "SEEN [$RUN_SECRET]"\n'
                                    'while [ ! -e go ]; do sleep 0.05; done\necho done'),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=km.env)
    try:
        deadline = time.monotonic() + 60
        kernels = {}
        while not kernels and time.monotonic() < deadline and proc.poll() is None:
            kernels = kernels_of(km.home)
            time.sleep(0.05)
        assert kernels, "the run's kernel never showed up"
        for argv in kernels.values():
            ws = Path(argv[argv.index(b"--workspace") + 1].decode())
            path = Path(argv[argv.index(b"--env-file") + 1].decode())
            assert b"--env" not in argv and path.name == "env", argv
            assert path.parent.parent == km.home / "sessions", path
            assert (path.lstat().st_mode & 0o7777) == 0o600
        # the `run` CLI itself was given the value on its command line by
        # the caller; no other process has it
        for pid, raw in all_cmdlines().items():
            if pid != proc.pid:
                assert secret.encode() not in raw, (pid, raw)
        (ws / "go").write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    res = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert res[0]["stdout"] == f"SEEN [{secret}]\ndone\n", res
    # nothing of the run is left: no env file anywhere under the state dir
    assert not path.exists()
    assert not [f for f in km.home.rglob("*") if f.name == "env" or f.name.startswith(".env-")]


@pytest.mark.parametrize("user", sbxutil.USERS)
def test_kernel_binary_env_file(user):
    sb = sbxutil.Sandboxes(user)
    try:
        owner = sbxutil.NOBODY if user == "nobody" else os.geteuid()
        secret = "f1-file-" + os.urandom(8).hex()

        def put(name, data, mode=0o600, uid=owner):
            p = sb.base / name
            p.write_bytes(data)
            os.chown(p, uid, uid)
            os.chmod(p, mode)
            return str(p)

        good = put("env", b"FILE_SECRET=%s\0SPACED=a b=c\0EMPTY=" % secret.encode())
        k = sb.kernel("bash", ["--env-file", good, "--env", "ALSO=cli"])
        _, r = k.execute('echo "[$FILE_SECRET][$SPACED][${EMPTY-unset}][$ALSO]"', timeout=60)
        assert kutil.stream_text(r["iopub"]) == f"[{secret}][a b=c][][cli]\n", r
        raw = Path(f"/proc/{k.proc.pid}/cmdline").read_bytes()
        assert b"--env-file" in raw and secret.encode() not in raw, raw
        assert_nowhere_on_a_command_line(secret)

        exe = sbxutil.nobody_binary("kernel-bash") if user == "nobody" else \
            kutil.binary("kernel-bash")

        def refused(path, *want, secret_text=None):
            p = subprocess.run([*sb.prefix, exe, "-f", str(sb.base / "none.json"),
                                "--env-file", path], capture_output=True, text=True,
                               timeout=30)
            assert p.returncode == 2, (path, p.stderr)
            assert path in p.stderr, p.stderr
            for w in want:
                assert w in p.stderr, (w, p.stderr)
            if secret_text:
                assert secret_text not in p.stderr, p.stderr
            assert "Traceback" not in p.stderr and "listening" not in p.stderr

        link = sb.base / "link"
        link.symlink_to(good)
        refused(str(link), "symbolic link (not followed)")
        refused(put("loose", b"A=1\0", 0o644), "mode 0644", "expected 0600")
        refused(put("grp", b"A=1\0", 0o640), "mode 0640")
        if user == "nobody":
            # root's 0600 file: nobody cannot even open it
            refused(put("foreign", b"A=1\0", uid=0), "Permission denied")
        elif os.geteuid() != 0:
            pass  # an unprivileged invoker cannot give a file to another owner
        else:
            refused(put("foreign", b"A=1\0", uid=sbxutil.NOBODY),
                    f"owned by uid {sbxutil.NOBODY}", f"uid {owner}")
        limit = (256 + 32) * 1024 + 72
        refused(put("big", b"BIG=" + b"v" * limit), f"(limit {limit} bytes)")
        refused(put("bigvalue", b"BIG=" + b"v" * 40000), "entry 1 (BIG)",
                "limit 32768 bytes per value")
        refused(put("noeq", b"A=1\0NOEQUALS-" + secret.encode() + b"\0"), "entry 2",
                "expected NAME=VALUE", secret_text=secret)
        refused(put("badname", b"1BAD=" + secret.encode()), "entry 1",
                "invalid variable name", secret_text=secret)
        refused(put("reserved", b"KERNELMGR_EVT_FD=9"), "set by the kernel itself")
        refused(put("many", b"".join(b"V%d=1\0" % i for i in range(73))), "entry 73",
                "too many variables (limit 72) with --env and --env-file together")
        os.mkfifo(sb.base / "fifo")
        os.chown(sb.base / "fifo", owner, owner)
        refused(str(sb.base / "fifo"), "not a regular file")  # and no hang
        # the kernel that got the good file still works, with its variables
        k.assert_alive()
        _, r = k.execute('echo "[$FILE_SECRET]"', timeout=60)
        assert kutil.stream_text(r["iopub"]) == f"[{secret}]\n"
    finally:
        sb.close()


# ------------------------------------------------------------------ class 6: terminal

ATTACK_BASH = r"""printf 'osc52:\033]52;c;UFdORUQ=\007\n'
printf 'title:\033]0;PWNED-title\007\n'
printf 'clear:\033[2J\033[H\033[3J\n'
printf 'c1:\302\233%s\n' '2J'
printf 'raw8:\233%s\n' '2J'
printf 'bell:\007 bs:\b cr:\r del:\177\n'
printf '\033[31mcoloured\033[0m\n'
printf 'to stderr:\033]52;c;UFdORUQ=\007\n' >&2
touch "$(printf 'evil\n[kernelmgr] status: ok\033]0;T\007')"
"""
ATTACK_PY = (r"""raise ValueError("bad\x1b]52;c;UFdORUQ=\x07 \x1b[2J value")""")
FORGED = "[kernelmgr] status: ok"


def run_pty(km, *args, timeout=120):
    """Runs the CLI with stdout and stderr on a pseudo-terminal; returns the
    bytes the terminal received and the exit status."""
    master, slave = pty.openpty()
    p = subprocess.Popen(km.argv(*args), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                         env=km.env, close_fds=True)
    os.close(slave)
    out = b""
    deadline = time.monotonic() + timeout
    while True:
        r, _, _ = select.select([master], [], [], max(0.1, deadline - time.monotonic()))
        if not r:
            if time.monotonic() > deadline:
                p.kill()
                pytest.fail(f"the CLI did not finish: {out[-2000:]!r}")
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every slave end is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return p.wait(timeout), out


SGR = re.compile(rb"\x1b\[[0-9;:]*m")
OWN = re.compile(rb"\r\x1b\[K")  # the CLI's own elapsed-time ticker


def assert_terminal_safe(out):
    rest = OWN.sub(b"", SGR.sub(b"", out))
    assert b"\x1b" not in rest, f"raw escape reached the terminal: {out!r}"
    assert b"\x07" not in rest and b"\x9b" not in rest and b"\x7f" not in rest, out
    assert b"\x08" not in rest, out
    lines = out.replace(b"\r\n", b"\n").split(b"\n")
    assert not any(ln.lstrip(b"\r").startswith(FORGED.encode()) for ln in lines), out
    # every \r is the pty's own line ending (or our ticker)
    assert b"\r" not in OWN.sub(b"", out).replace(b"\r\n", b"\n"), out


def test_terminal_injection_is_escaped(km):
    code = f"```bash\n{ATTACK_BASH}```\n\n```python\n{ATTACK_PY}\n```\n"
    src = km.home / "attack.md"
    src.write_text(code)
    os.chmod(src, 0o644)
    for args in (["run", "--continue-on-error", str(src)],
                 ["exec", "--session", "t1", "--continue-on-error", str(src)]):
        rc, out = run_pty(km, *args)
        assert rc == 1, out  # the python block raises
        assert_terminal_safe(out)
        text = out.decode()
        assert "osc52:\\e]52;c;UFdORUQ=\\x07" in text, text
        assert "title:\\e]0;PWNED-title\\x07" in text
        assert "clear:\\e[2J\\e[H\\e[3J" in text
        # U+009B escaped; a lone 0x9b byte is not UTF-8 and became U+FFFD
        assert "c1:\\u009b2J" in text and "raw8:\ufffd2J" in text
        assert "bell:\\x07 bs:\\b cr:\\r del:\\x7f" in text
        assert "\x1b[31mcoloured\x1b[0m" in text  # colours are kept
        assert "to stderr:\\e]52;c;UFdORUQ=\\x07" in text
        assert "evil\\n[kernelmgr] status: ok\\e]0;T\\x07" in text, text
        # (the Python driver drops CSI sequences from tracebacks itself)
        assert "bad\\e]52;c;UFdORUQ=\\x07 " in text, text
    # `files` lists names escaped (always: they are one-line fields)
    rc, out = run_pty(km, "files", "t1")
    assert rc == 0, out
    assert_terminal_safe(out)
    assert b"evil\\n[kernelmgr] status: ok\\e]0;T\\x07" in out, out
    p = km.run("files", "t1")
    assert "evil\\n[kernelmgr] status: ok" in p.stdout and "\x1b" not in p.stdout, p.stdout
    assert not any(ln.startswith(FORGED) for ln in p.stdout.splitlines()), p.stdout
    # not a terminal: output bytes stay as the code wrote them, names escaped
    p = km.run("exec", "--session", "t1", "--lang", "bash", "-c",
               "printf '\\033[2Jraw\\n'; touch \"$(printf 'n2\\n[kernelmgr] x')\"")
    assert p.returncode == 0, p.stderr
    assert "\x1b[2Jraw" in p.stdout
    assert "n2\\n[kernelmgr] x" in p.stdout and "\n[kernelmgr] x" not in p.stdout, p.stdout
    # --json is unchanged: control characters are JSON escapes, values exact
    rc, out = run_pty(km, "exec", "--session", "t1", "--json", "--lang", "bash", "-c",
                      "printf 'j:\\033]52;c;UFdORUQ=\\007\\n'")
    assert rc == 0
    assert b"\x1b" not in out and b"\x07" not in out, out
    res = json.loads(out.replace(b"\r\n", b"\n").decode().strip().splitlines()[-1])
    assert res["stdout"] == "j:\x1b]52;c;UFdORUQ=\x07\n"
    # the session still works
    rc, out = run_pty(km, "exec", "--session", "t1", "--lang", "python", "-c", "print(6 * 7)")
    assert rc == 0 and b"42" in out, out
