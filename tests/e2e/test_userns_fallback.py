"""A root daemon inside a user namespace that maps only its own uid (a
rootless container, `unshare --user --map-root-user`) cannot give each
sandbox its own host uid: the sandbox falls back to the unprivileged mode
(nobody inside, mapped to that root) instead of failing with `idmap: map
uid 0`. Works as root and as an unprivileged user (both make such a
namespace)."""
import json
import shutil
import subprocess

import pytest

import mgrutil


def in_userns(mgr, *args):
    return subprocess.run(["unshare", "--user", "--map-root-user", mgrutil.KM, *args],
                          capture_output=True, text=True, env=mgr.env, timeout=180)


@pytest.mark.skipif(not shutil.which("unshare"), reason="unshare (util-linux) is not installed")
def test_root_of_a_small_user_namespace_runs_kernels_unprivileged(make_mgr):
    if not (mgrutil.have_kernel("python") and mgrutil.have_kernel("bash")):
        pytest.skip("the kernels are not built")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "id", "-u"],
                           capture_output=True, text=True)
    if probe.returncode or probe.stdout.strip() != "0":
        pytest.skip(f"this host does not allow user namespaces: {probe.stderr.strip()}")
    mgr = make_mgr({"sandbox": "strict"})
    p = in_userns(mgr, "run", "--json", "--lang", "python", "-c",
                  "import os\nprint(os.getuid(), open('x', 'w').write('ok'))")
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["status"] == "ok" and r["stdout"] == "65534 2\n", r
    p = in_userns(mgr, "run", "--json", "--lang", "bash", "-c", "id -u; echo $((6*7))")
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["stdout"] == "65534\n42\n", r
    # still a sandbox: the host's root-only files stay out of reach
    p = in_userns(mgr, "run", "--json", "--lang", "bash", "-c", "cat /etc/shadow")
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["status"] == "error" and "root:" not in r["stdout"], r
