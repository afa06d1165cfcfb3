#!/usr/bin/env python3
"""A minimal agent loop over kernelmgr, with the Python client (clients/python,
`pip install ./clients/python`; run from the tree it is found there).

The client finds the daemon as the CLI does ($KERNELMGR_HOME ...) and
starts one when none runs (`kernelmgr` from $KERNELMGR_BIN or PATH):

    python3 examples/agent_loop.py            # runs a scripted "agent"
    python3 examples/agent_loop.py -          # reads Markdown steps from stdin,
                                              # separated by lines "---"

Each step is what a model would send to a `code_exec` tool; what it prints
per block is what the agent would feed back: compact and structured.
"""
import json
import os
import sys

try:
    import kernelmgr
except ImportError:  # not installed: the client of this tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "clients", "python", "src"))
    import kernelmgr


def show(block):
    """One block's result (the daemon's JSON, docs/CLI.md "The result"),
    as an agent would give it to its model."""
    out = {k: block[k] for k in ("language", "status", "exit_code", "stdout", "stderr")}
    if block["error"]:
        out["error"] = f'{block["error"]["name"]}: {block["error"]["value"]}'
    if block["result"]:
        out["result"] = block["result"].get("text/plain")
    if block["files"]:
        out["files"] = [f'{f["change"]} {f["path"]}' for f in block["files"]]
    if not block["kernel"]["state_preserved"]:
        out["kernel"] = block["kernel"]["reason"]
    return out


SCRIPT = [
    "```python\nnums = [3, 1, 4, 1, 5, 9, 2, 6]\nopen('nums.txt', 'w').write('\\n'.join(map(str, nums)))\n```",
    "```bash\nsort -n nums.txt | tail -n 3\n```",
    "```python\nsum(nums) / len(nums)\n```",
    "```python\nundefined_name + 1\n```",
]


def main():
    steps = SCRIPT
    if sys.argv[1:] == ["-"]:
        steps = [s for s in sys.stdin.read().split("\n---\n") if s.strip()]
    # the session and its workspace are removed when the block ends
    with kernelmgr.Session("agent-demo") as session:
        for step in steps:
            # lang=None: Markdown fences (or a heuristic) route each block
            execution = session.run(step, timeout=30)
            for block in execution.blocks:
                print(json.dumps(show(block)))
        print(json.dumps([f.raw for f in session.files.list()]))


if __name__ == "__main__":
    main()
