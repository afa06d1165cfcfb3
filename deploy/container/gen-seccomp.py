#!/usr/bin/python3
"""gen-seccomp.py [DEFAULT] — deploy/container/seccomp.json from a container
runtime's default seccomp profile (DEFAULT, default
/usr/share/containers/seccomp.json of Debian's golang-github-containers-common,
the profile podman uses): the same profile, except that sethostname and
setdomainname are allowed without CAP_SYS_ADMIN. An unprivileged kernelmgr
daemon (no capabilities) gives each sandbox its own UTS namespace and names
it; the default profile only allows those two calls to holders of
CAP_SYS_ADMIN. Nothing else changes. The result goes to stdout.

    deploy/container/gen-seccomp.py > deploy/container/seccomp.json
"""
import copy
import json
import sys

ADDED = ["sethostname", "setdomainname"]


def derive(default):
    prof = copy.deepcopy(default)
    rules = []
    for rule in prof["syscalls"]:
        names = rule.get("names", [])
        # a rule that refuses them to callers without CAP_SYS_ADMIN: drop them from it
        if rule.get("action") != "SCMP_ACT_ALLOW" and any(n in names for n in ADDED):
            rule = dict(rule, names=[n for n in names if n not in ADDED])
            if not rule["names"]:
                continue
        rules.append(rule)
    rules.append({"names": ADDED, "action": "SCMP_ACT_ALLOW", "args": [],
                  "comment": "kernelmgr: sandboxes name their own UTS namespace "
                             "(unprivileged daemon, no CAP_SYS_ADMIN)",
                  "includes": {}, "excludes": {}})
    prof["syscalls"] = rules
    return prof


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/containers/seccomp.json"
    with open(src) as f:
        default = json.load(f)
    json.dump(derive(default), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
