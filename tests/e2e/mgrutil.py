"""Helpers for the manager's end-to-end tests: run build/kernelmgr with a
private KERNELMGR_HOME and parse its --json output."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import kutil

KM = kutil.binary("kernelmgr")
# One switch for every manager test: "none" until the strict sandbox works
# on the test host, then "strict".
SANDBOX = os.environ.get("KM_TEST_SANDBOX", "none")


def have_kernel(lang):
    return os.access(kutil.binary("kernel-" + lang), os.X_OK)


class Mgr:
    """A KERNELMGR_HOME (short path: it holds a unix socket) and its daemon."""

    def __init__(self, config=None):
        self.home = Path(tempfile.mkdtemp(prefix="km", dir="/tmp"))
        self.env = dict(os.environ, KERNELMGR_HOME=str(self.home))
        # Debian's python3 has numpy/pandas/matplotlib; `python3` on PATH may not
        cfg = {"sandbox": SANDBOX, "python": "/usr/bin/python3"}
        cfg.update(config or {})
        (self.home / "config.json").write_text(json.dumps(cfg))

    @property
    def run_dir(self):
        """Where the manager keeps its runtime files (kutil.run_dir)."""
        import pwd
        uid = pwd.getpwnam("nobody").pw_uid if getattr(self, "user", None) == "nobody" else None
        return kutil.run_dir(self.home, uid=uid, env=self.env)

    def run(self, *args, input=None, timeout=120, check_json=True):
        p = subprocess.run([KM, *args], input=input, capture_output=True, text=True,
                           env=self.env, timeout=timeout)
        return p

    def results(self, *args, **kw):
        """Runs with --json; returns (exit status, [result per block], process)."""
        p = self.run(*args, "--json", **kw)
        res = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        return p.returncode, res, p

    def exec(self, session, code, *args, **kw):
        return self.results("exec", "--session", session, "-c", code, *args, **kw)

    def daemon_pid(self):
        try:
            return int((self.home / "daemon.pid").read_text())
        except (OSError, ValueError):
            return None

    def close(self):
        try:
            self.run("serve", "--stop", timeout=30)
        except subprocess.TimeoutExpired:
            pid = self.daemon_pid()
            if pid:
                os.kill(pid, 9)
        shutil.rmtree(self.home, ignore_errors=True)
