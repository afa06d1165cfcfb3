"""install_packages through `kernelmgr mcp` (driven by the official MCP SDK
client): the allowlist, the refusals that happen before anything runs, the
dependency policy, and real installs — pip from a local index the tests serve
on loopback (wheels built here with zipfile from tiny packages, no network),
npm from the npm registry."""
import base64
import hashlib
import http.server
import json
import threading
import zipfile
from pathlib import Path

import pytest

import mgrutil
from test_mcp import call, need_kernel, ok_result, sdk, text_of


# ------------------------------------------------------------------ a local index


def build_wheel(outdir, name, version, module_src, requires=()):
    """A minimal, valid py3-none-any wheel (PEP 427) built with zipfile."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": module_src.encode(),
        f"{dist}/METADATA": ("Metadata-Version: 2.1\n"
                             f"Name: {name}\nVersion: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kernelmgr-tests\n"
                         b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    whl = Path(outdir) / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return whl


class Index:
    """A PEP 503 simple index on 127.0.0.1, recording every request."""

    def __init__(self, root):
        self.root = Path(root)
        (self.root / "files").mkdir(parents=True)
        self.requests = []
        pkgs = {
            "tinypkg": [build_wheel(self.root / "files", "tinypkg", "1.0",
                                    "VALUE = 42\n")],
            "depwant": [build_wheel(self.root / "files", "depwant", "1.0",
                                    "import notlisted\n", requires=["notlisted"])],
            "notlisted": [build_wheel(self.root / "files", "notlisted", "1.0", "X = 1\n")],
        }
        simple = self.root / "simple"
        simple.mkdir()
        links = []
        for name, wheels in pkgs.items():
            (simple / name).mkdir()
            anchors = "".join(
                f'<a href="../../files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}"'
                f">{w.name}</a>\n" for w in wheels)
            (simple / name / "index.html").write_text(f"<html><body>{anchors}</body></html>")
            links.append(f'<a href="{name}/">{name}</a>')
        (simple / "index.html").write_text("<html><body>" + "".join(links) + "</body></html>")
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(index.root), **kw)

            def log_message(self, fmt, *args):
                index.requests.append(self.path)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/simple/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def index(tmp_path):
    idx = Index(tmp_path / "index")
    yield idx
    idx.close()


@pytest.fixture
def mgr():
    m = mgrutil.Mgr()
    yield m
    m.close()


def allowlist_file(mgr, index):
    path = mgr.home / "allowlist.json"
    path.write_text(json.dumps({
        "pip": {"index_url": index.url,
                "packages": {"tinypkg": "", "depwant": ">=1.0"}},
        "npm": {"registry": "https://registry.npmjs.org/",
                "packages": {"is-number": "^7.0.0"}},
    }))
    return str(path)


def install(session, manager, packages):
    return call("install_packages", {"session": session, "manager": manager,
                                     "packages": packages}, timeout_ms=600000)


# ------------------------------------------------------------------ refusals


def test_nothing_installable_without_an_allowlist(mgr):
    out = sdk(mgr, [install("s", "pip", ["tinypkg"]), install("s", "npm", ["is-number"])])
    for st in out["steps"]:
        r = ok_result(st)
        assert r["isError"] is True
        assert "allowlist" in text_of(r) and "nothing was installed" in text_of(r)


BAD_PIP = [
    (["numpy"], "not on the pip allowlist"),
    (["tinypkg", "numpy"], "not on the pip allowlist"),
    (["https://files.example/tinypkg-1.0-py3-none-any.whl"], "URLs are not allowed"),
    (["--index-url", "http://127.0.0.1:1/simple/"], "options and flags"),
    (["--index-url=http://evil.example/simple/", "tinypkg"], "options and flags"),
    (["--extra-index-url", "http://evil.example/simple/"], "options and flags"),
    (["-e", "."], "options and flags"),
    (["-e", "git+https://github.com/example/tinypkg"], "options and flags"),
    (["git+https://github.com/example/tinypkg"], "VCS links"),
    (["tinypkg @ https://evil.example/tinypkg.whl"], "direct references"),
    (["./tinypkg"], "local paths"),
    (["/tmp/tinypkg-1.0-py3-none-any.whl"], "local paths"),
    (["tinypkg[extra]"], "extras"),
    (["tinypkg==1.0 --pre"], "not a plain version"),
]


def test_pip_refusals_happen_before_anything_runs(mgr, index):
    al = allowlist_file(mgr, index)
    out = sdk(mgr, [install("ref", "pip", pk) for pk, _ in BAD_PIP]
              + [install("ref", "cargo", ["x"]), install("ref", "pip", [])],
              server_args=["--allowlist", al])
    for (pk, why), st in zip(BAD_PIP, out["steps"]):
        r = ok_result(st)
        assert r["isError"] is True, (pk, text_of(r))
        assert why in text_of(r), (pk, text_of(r))
        assert "nothing was installed" in text_of(r)
    assert ok_result(out["steps"][-2])["isError"] is True
    assert ok_result(out["steps"][-1])["isError"] is True
    # Refused before anything ran: the index never heard of it, and no
    # package directory got anything.
    assert index.requests == []
    pkgdir = mgr.home / "packages" / "ref" / "python"
    assert not pkgdir.exists() or not any(pkgdir.iterdir())


def test_npm_unlisted_refused(mgr, index):
    al = allowlist_file(mgr, index)
    out = sdk(mgr, [install("n", "npm", ["is-odd"]),
                    install("n", "npm", ["is-number@latest"]),
                    install("n", "npm", ["github:jonschlinkert/is-number"]),
                    install("n", "npm", ["--ignore-scripts=false", "is-number"])],
              server_args=["--allowlist", al])
    whys = ["not on the npm allowlist", "not a plain version", "host shortcuts",
            "options and flags"]
    for why, st in zip(whys, out["steps"]):
        r = ok_result(st)
        assert r["isError"] is True and why in text_of(r), text_of(r)


# ------------------------------------------------------------------ installs


def test_pip_allowlisted_package_installs_and_imports(mgr, index):
    need_kernel("python")
    al = allowlist_file(mgr, index)
    out = sdk(mgr, [
        call("code_exec", {"code": "before = 1", "language": "python", "session": "pip"}),
        install("pip", "pip", ["tinypkg"]),
        call("code_exec", {"code": "import tinypkg\nprint('value', tinypkg.VALUE, before)",
                           "language": "python", "session": "pip"}),
    ], server_args=["--allowlist", al])
    r = ok_result(out["steps"][1])
    assert r["isError"] is False, text_of(r)
    sc = r["structuredContent"]
    assert {"name": "tinypkg", "version": "1.0"} in sc["installed"]
    assert "tinypkg 1.0" in text_of(r)
    assert any("tinypkg" in p for p in index.requests)
    # Importable in the running kernel, whose state survived the install.
    r = ok_result(out["steps"][2])
    assert "value 42 1" in text_of(r), text_of(r)
    if mgrutil.SANDBOX == "strict":
        r = sdk(mgr, [call("code_exec", {
            "code": "import os, tinypkg\nopen(os.path.join(os.path.dirname(tinypkg.__file__),"
                    " 'x'), 'w')", "language": "python", "session": "pip"})])
        assert ok_result(r["steps"][0])["isError"] is True  # read-only for the kernel


def test_pip_dependency_policy(mgr, index):
    """depwant is listed but needs notlisted, which is not: refused, and the
    refusal names it; nothing lands in the package directory."""
    al = allowlist_file(mgr, index)
    out = sdk(mgr, [install("dep", "pip", ["depwant"])], server_args=["--allowlist", al])
    r = ok_result(out["steps"][0])
    assert r["isError"] is True
    assert "notlisted" in text_of(r), text_of(r)
    pkgdir = mgr.home / "packages" / "dep" / "python"
    assert not pkgdir.exists() or not any(p.name.startswith("depwant")
                                          for p in pkgdir.iterdir())


def test_kernel_has_no_network(mgr, index):
    need_kernel("python")
    if mgrutil.SANDBOX != "strict":
        pytest.skip("kernels run unsandboxed in this configuration (KM_TEST_SANDBOX=none)")
    code = ("import socket\n"
            "try:\n    s = socket.socket()\n    s.settimeout(3)\n"
            f"    s.connect(('127.0.0.1', {index.port}))\n    print('REACHED')\n"
            "except OSError as e:\n    print('blocked', type(e).__name__)\n")
    out = sdk(mgr, [call("code_exec", {"code": code, "language": "python", "session": "net"})])
    t = text_of(ok_result(out["steps"][0]))
    assert "blocked" in t and "REACHED" not in t, t
    assert index.requests == []


def test_npm_allowlisted_package_installs_with_scripts_disabled(mgr, index):
    need_kernel("bash")
    al = allowlist_file(mgr, index)
    out = sdk(mgr, [
        install("npm", "npm", ["is-number"]),
        call("code_exec", {"code": "node -e 'console.log(\"isnum\", require(\"is-number\")(42))'",
                           "language": "bash", "session": "npm"}),
        call("code_exec", {"code": 'case ":$PATH:" in *"/npm/node_modules/.bin:"*) echo binpath;; '
                                   'esac; test -w "$NODE_PATH" || echo readonly',
                           "language": "bash", "session": "npm"}),
    ], server_args=["--allowlist", al], timeout=600)
    r = ok_result(out["steps"][0])
    assert r["isError"] is False, text_of(r)
    inst = r["structuredContent"]["installed"]
    assert any(p["name"] == "is-number" and p["version"].startswith("7.") for p in inst), inst
    assert "ignore-scripts" in r["structuredContent"]["policy"]
    r = ok_result(out["steps"][1])
    assert "isnum true" in text_of(r), text_of(r)
    # node_modules/.bin is on PATH; the packages are read-only for the kernel
    t = text_of(ok_result(out["steps"][2]))
    assert "binpath" in t, t
    if mgrutil.SANDBOX == "strict":
        assert "readonly" in t, t


# ------------------------------------------------------------------ the installer's reach


def far_package(index, tmp_path):
    """A second loopback server (not the index) that hosts the wheel of
    `farpkg`; the index's page for farpkg links there, the way PyPI's pages
    link to files.pythonhosted.org."""
    far = Index(tmp_path / "far")
    whl = build_wheel(far.root / "files", "farpkg", "1.0", "WHERE = 'far'\n")
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    page = index.root / "simple" / "farpkg"
    page.mkdir()
    (page / "index.html").write_text(
        f'<html><body><a href="http://127.0.0.1:{far.port}/files/{whl.name}#sha256={digest}">'
        f"{whl.name}</a></body></html>")
    return far


def far_allowlist(mgr, index, far, allowed_hosts):
    path = mgr.home / "allowlist.json"
    pip = {"index_url": index.url, "packages": {"farpkg": "", "tinypkg": ""}}
    if allowed_hosts is not None:
        pip["allowed_hosts"] = [f"127.0.0.1:{far.port}"] if allowed_hosts else []
    path.write_text(json.dumps({"pip": pip}))
    return str(path)


NET_PROBE = r'''
import socket
res = []
for port in (INDEX, FAR, 3128):
    try:
        s = socket.socket(); s.settimeout(3); s.connect(("127.0.0.1", port))
        res.append((port, "REACHED"))
    except OSError as e:
        res.append((port, "blocked " + type(e).__name__))
print(res)
'''


def test_installer_reaches_only_the_index(mgr, index, tmp_path):
    """The installer's sandbox reaches the index and nothing else: a file on
    another loopback server is refused by the proxy (and that server never
    hears of it) until the allowlist names its host:port in allowed_hosts.
    The session's kernel still has no network after an install."""
    need_kernel("python")
    far = far_package(index, tmp_path)
    try:
        al = far_allowlist(mgr, index, far, allowed_hosts=False)
        out = sdk(mgr, [install("far", "pip", ["farpkg"])], server_args=["--allowlist", al])
        r = ok_result(out["steps"][0])
        assert r["isError"] is True, text_of(r)
        assert "install proxy refused" in text_of(r), text_of(r)
        assert f"127.0.0.1:{far.port}" in text_of(r), text_of(r)
        assert far.requests == []
        assert any("farpkg" in p for p in index.requests)
        pkgdir = mgr.home / "packages" / "far" / "python"
        assert not pkgdir.exists() or not any(p.name.startswith("farpkg")
                                              for p in pkgdir.iterdir())

        al = far_allowlist(mgr, index, far, allowed_hosts=True)
        probe = (NET_PROBE.replace("INDEX", str(index.port)).replace("FAR", str(far.port)))
        out = sdk(mgr, [
            install("far", "pip", ["farpkg"]),
            call("code_exec", {"code": "import farpkg\nprint('where', farpkg.WHERE)",
                               "language": "python", "session": "far"}),
            call("code_exec", {"code": probe, "language": "python", "session": "far"}),
        ], server_args=["--allowlist", al])
        r = ok_result(out["steps"][0])
        assert r["isError"] is False, text_of(r)
        assert {"name": "farpkg", "version": "1.0"} in r["structuredContent"]["installed"]
        assert any("farpkg" in p for p in far.requests)
        assert "where far" in text_of(ok_result(out["steps"][1]))
        if mgrutil.SANDBOX == "strict":
            far_seen, index_seen = len(far.requests), len(index.requests)
            t = text_of(ok_result(out["steps"][2]))
            assert "REACHED" not in t and t.count("blocked") == 3, t
            assert (len(far.requests), len(index.requests)) == (far_seen, index_seen)
    finally:
        far.close()


def test_allowlist_with_bad_allowed_hosts_installs_nothing(mgr, index):
    path = mgr.home / "allowlist.json"
    path.write_text(json.dumps({"pip": {"index_url": index.url, "packages": ["tinypkg"],
                                        "allowed_hosts": ["https://files.example/"]}}))
    out = sdk(mgr, [install("bad", "pip", ["tinypkg"])], server_args=["--allowlist", str(path)])
    r = ok_result(out["steps"][0])
    assert r["isError"] is True
    assert "allowed_hosts" in text_of(r), text_of(r)
    assert index.requests == []


def test_warm_pool_sessions_see_their_packages(mgr, index):
    """A warm-pool kernel starts before its session has a name; its package
    directory becomes the session's at hand-out, so installs made afterwards
    are importable in it. A name that already has packages does not take a
    pool entry (its fresh kernel sees them)."""
    need_kernel("python")
    from test_mgr_lifecycle import ask, poll, sessions, start_daemon
    al = allowlist_file(mgr, index)
    daemon = start_daemon(mgr, "--pool", "1")
    try:
        poll(lambda: ask(mgr, "ping")["pool"], lambda p: p["ready"] == 1, 120)
        out = sdk(mgr, [
            call("code_exec", {"code": "before = 1", "language": "python", "session": "pooled"}),
            install("pooled", "pip", ["tinypkg"]),
            call("code_exec", {"code": "import tinypkg\nprint('value', tinypkg.VALUE, before)",
                               "language": "python", "session": "pooled"}),
        ], server_args=["--allowlist", al])
        assert sessions(mgr)["pooled"]["from_pool"] is True
        assert ok_result(out["steps"][1])["isError"] is False, text_of(ok_result(out["steps"][1]))
        assert "value 42 1" in text_of(ok_result(out["steps"][2])), out["steps"][2]

        poll(lambda: ask(mgr, "ping")["pool"], lambda p: p["ready"] == 1, 120)
        out = sdk(mgr, [
            install("early", "pip", ["tinypkg"]),
            call("code_exec", {"code": "import tinypkg\nprint('value', tinypkg.VALUE)",
                               "language": "python", "session": "early"}),
        ], server_args=["--allowlist", al])
        assert ok_result(out["steps"][0])["isError"] is False, text_of(ok_result(out["steps"][0]))
        assert "value 42" in text_of(ok_result(out["steps"][1])), out["steps"][1]
        assert sessions(mgr)["early"]["from_pool"] is False
    finally:
        mgr.run("serve", "--stop", timeout=30)
        daemon.wait(timeout=30)


def test_cli_install(mgr, index, tmp_path):
    """`kernelmgr install` is the same API call as install_packages: the
    same refusals, and packages the session's running kernel imports."""
    need_kernel("python")
    p = mgr.run("install", "--session", "cli", "tinypkg")
    assert p.returncode == 2 and "nothing was installed" in p.stderr, p.stderr
    p = mgr.run("install", "--session", "cli", "--manager", "cargo", "x")
    assert p.returncode == 2 and "--manager" in p.stderr, p.stderr
    p = mgr.run("install", "--session", "cli")
    assert p.returncode == 2 and "package" in p.stderr, p.stderr
    al = allowlist_file(mgr, index)
    rc, res, p = mgr.exec("cli", "before = 1", "--lang", "python")
    assert rc == 0, p.stderr
    p = mgr.run("install", "--session", "cli", "--allowlist", al, "notlisted")
    assert p.returncode == 2 and "notlisted" in p.stderr and "nothing was installed" in p.stderr, \
        p.stderr
    p = mgr.run("install", "--session", "cli", "--allowlist", al, "--json", "tinypkg",
                timeout=600)
    assert p.returncode == 0, p.stderr
    assert {"name": "tinypkg", "version": "1.0"} in json.loads(p.stdout)["installed"]
    rc, res, p = mgr.exec("cli", "import tinypkg\nprint('value', tinypkg.VALUE, before)",
                          "--lang", "python")
    assert rc == 0 and res[0]["stdout"] == "value 42 1\n", (p.stderr, res)
    # close takes the packages with the session
    assert mgr.run("close", "cli").returncode == 0
    assert not (mgr.home / "packages" / "cli").exists()
