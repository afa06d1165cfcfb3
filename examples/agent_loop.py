#!/usr/bin/env python3
"""A minimal agent-side client of the kernelmgr daemon (stdlib only).

The daemon speaks JSON-RPC 2.0, one message per line, over
$KERNELMGR_HOME/kernelmgr.sock (docs/API.md).
Start it with `kernelmgr serve` (or let any `kernelmgr exec` start it), then:

    python3 examples/agent_loop.py            # runs a scripted "agent"
    python3 examples/agent_loop.py -          # reads Markdown steps from stdin,
                                              # separated by lines "---"
"""
import json
import os
import socket
import sys


def socket_path():
    home = os.environ.get("KERNELMGR_HOME") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "kernelmgr")
    return os.path.join(home, "kernelmgr.sock")


class Kernelmgr:
    def __init__(self, path=None):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path or socket_path())
        self.f = self.sock.makefile("rw", encoding="utf-8")
        self.next_id = 0

    def call(self, method, on_event=None, **params):
        """Sends one request; returns its result (event notifications go to
        on_event)."""
        self.next_id += 1
        self.f.write(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method,
                                 "params": params}) + "\n")
        self.f.flush()
        for line in self.f:
            msg = json.loads(line)
            if "method" in msg:
                if on_event:
                    on_event(msg["params"])
                continue
            if "error" in msg:
                raise RuntimeError(msg["error"]["message"])
            return msg["result"]
        raise ConnectionError("daemon closed the connection")

    def code_exec(self, session, code, **opts):
        return self.call("exec", session=session, code=code, **opts)["results"]


def show(result):
    """What an agent would feed back to its model: compact, structured."""
    out = {k: result[k] for k in ("language", "status", "exit_code", "stdout", "stderr")}
    if result["error"]:
        out["error"] = f'{result["error"]["name"]}: {result["error"]["value"]}'
    if result["result"]:
        out["result"] = result["result"].get("text/plain")
    if result["files"]:
        out["files"] = [f'{f["change"]} {f["path"]}' for f in result["files"]]
    if not result["kernel"]["state_preserved"]:
        out["kernel"] = result["kernel"]["reason"]
    return out


SCRIPT = [
    "```python\nnums = [3, 1, 4, 1, 5, 9, 2, 6]\nopen('nums.txt', 'w').write('\\n'.join(map(str, nums)))\n```",
    "```bash\nsort -n nums.txt | tail -n 3\n```",
    "```python\nsum(nums) / len(nums)\n```",
    "```python\nundefined_name + 1\n```",
]


def main():
    km = Kernelmgr()
    steps = SCRIPT
    if sys.argv[1:] == ["-"]:
        steps = [s for s in sys.stdin.read().split("\n---\n") if s.strip()]
    for step in steps:
        for r in km.code_exec("agent-demo", step, timeout=30):
            print(json.dumps(show(r)))
    print(json.dumps(km.call("files.list", session="agent-demo")["files"]))
    km.call("close", session="agent-demo")


if __name__ == "__main__":
    main()
