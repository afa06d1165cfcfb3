"""The deployment files shipped in the tree: the container seccomp profile
(valid JSON, the runtime default plus sethostname/setdomainname, and what
gen-seccomp.py derives from the default when that is installed), the
Containerfile's shape, and the systemd units (systemd-analyze verify, with
the generated man pages their Documentation= names)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kutil

ROOT = kutil.ROOT
DEPLOY = ROOT / "deploy"
DEFAULT_PROFILE = Path("/usr/share/containers/seccomp.json")
ADDED = {"sethostname", "setdomainname"}


def test_seccomp_profile_is_the_default_plus_two_calls():
    prof = json.loads((DEPLOY / "container/seccomp.json").read_text())
    assert prof["defaultAction"] == "SCMP_ACT_ERRNO"
    assert {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"} <= {a["architecture"]
                                                          for a in prof["archMap"]}
    names = lambda r: set(r.get("names", []))  # noqa: E731
    unconditional = [r for r in prof["syscalls"] if r["action"] == "SCMP_ACT_ALLOW"
                     and not r.get("includes") and not r.get("excludes") and not r.get("args")]
    assert any(ADDED <= names(r) for r in unconditional)
    # no rule refuses them any more; the usual ones still allowed/refused as before
    assert not any(ADDED & names(r) for r in prof["syscalls"] if r["action"] != "SCMP_ACT_ALLOW")
    allowed = set().union(*(names(r) for r in unconditional))
    assert {"read", "write", "clone", "unshare", "mount"} <= allowed
    assert "kexec_load" not in allowed and "init_module" not in allowed


@pytest.mark.skipif(not DEFAULT_PROFILE.exists(),
                    reason=f"{DEFAULT_PROFILE} (golang-github-containers-common) is not installed")
def test_seccomp_profile_is_what_the_generator_derives():
    p = subprocess.run([sys.executable, str(DEPLOY / "container/gen-seccomp.py"),
                        str(DEFAULT_PROFILE)], capture_output=True, text=True, check=True)
    assert json.loads(p.stdout) == json.loads((DEPLOY / "container/seccomp.json").read_text())


def test_containerfile_installs_the_projects_deb_on_debian():
    text = (DEPLOY / "container/Containerfile").read_text()
    assert "ARG BASE=" in text and "debian:bookworm" in text and "FROM ${BASE}" in text
    assert "COPY kernelmgr.deb" in text and "apt-get install" in text
    assert "VOLUME /var/lib/kernelmgr" in text and '"/usr/bin/kernelmgr"' in text


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_units_verify(tmp_path):
    km = kutil.BUILD / "kernelmgr"
    man = kutil.BUILD / "man"
    if not (km.exists() and (man / "kernelmgr.1").exists()):
        pytest.skip("build the tree first (make)")
    (tmp_path / "man/man1").mkdir(parents=True)
    (tmp_path / "man/man5").mkdir()
    shutil.copy(man / "kernelmgr.1", tmp_path / "man/man1")
    shutil.copy(man / "kernelmgr.json.5", tmp_path / "man/man5")
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = dict(os.environ, MANPATH=str(tmp_path / "man"), XDG_RUNTIME_DIR=str(run))
    for kind, flags in (("system", []), ("user", ["--user"])):
        unit = tmp_path / kind / "kernelmgr.service"
        unit.parent.mkdir()
        unit.write_text((DEPLOY / f"systemd/{kind}/kernelmgr.service.in").read_text()
                        .replace("@BINDIR@", str(kutil.BUILD)))
        p = subprocess.run(["systemd-analyze", *flags, "verify", str(unit)], capture_output=True,
                           text=True, env=env, timeout=120)
        assert p.returncode == 0, (kind, p.stdout + p.stderr)
