"""kernelmgr in a container, where podman can run one: the build's own
binaries (the host's root filesystem as the container's, `--rootfs /`)
with the root-daemon flags docs/INSTALL.md documents, `kernelmgr doctor`
inside. Where podman is missing, or cannot run any container on this host
(crun refuses hybrid cgroups, or the host may not raise the rlimits podman
sets by default), the test skips with podman's own words: the measured
reason docs/MANY_MACHINES.md quotes."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mgrutil  # noqa: E402

PODMAN = shutil.which("podman")
# the root daemon's least privilege (docs/INSTALL.md "Containers")
FLAGS = ["--cap-drop", "ALL", "--cap-add", "SYS_ADMIN,SETUID,SETGID,KILL",
         "--security-opt", "unmask=/proc/*"]


# podman's default rlimits (RLIMIT_NOFILE, RLIMIT_NPROC) are ones a host
# that may not raise its own refuses; the container keeps the caller's
CONF_TEXT = "[containers]\ndefault_ulimits = []\n"
CONF = []


def podman_run(*args, timeout=120):
    env = dict(os.environ, CONTAINERS_CONF=str(CONF[0]))
    return subprocess.run([PODMAN, "run", "--rm", *FLAGS, "--rootfs", "/", *args],
                          capture_output=True, text=True, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONF_TEXT)
    CONF[:] = [conf]
    if not PODMAN:
        pytest.skip("podman is not installed (Debian's podman; not in DEB_PACKAGES: "
                    "see docs/MANY_MACHINES.md \"Containers\")")
    p = podman_run("/bin/true", timeout=60)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"podman cannot run a container on this host: {why}")
    return PODMAN


def test_doctor_in_a_container(podman):
    home = Path(tempfile.mkdtemp(prefix="kmct", dir="/tmp"))
    try:
        (home / "config.json").write_text(json.dumps({"python": "/usr/bin/python3"}))
        p = podman_run("-v", f"{home}:{home}", "-e", f"KERNELMGR_HOME={home}",
                       mgrutil.KM, "doctor", "--json", timeout=300)
        assert p.stdout.strip(), p.stderr
        report = json.loads(p.stdout)
        assert report["container"]["detected"] is True, report["container"]
        assert report["ok"] is True, json.dumps(report, indent=1)
    finally:
        shutil.rmtree(home, ignore_errors=True)
