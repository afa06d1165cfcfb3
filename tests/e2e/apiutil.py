"""The daemon's API (docs/API.md) as tests speak it: JSON-RPC 2.0, one
message per line on $KERNELMGR_HOME/kernelmgr.sock."""
import itertools
import json

_ids = itertools.count(1)


def request(method, params=None, id=None):
    """A request object (a fresh integer id unless one is given)."""
    return {"jsonrpc": "2.0", "id": next(_ids) if id is None else id, "method": method,
            "params": {} if params is None else params}


def line(method, params=None, id=None):
    return json.dumps(request(method, params, id)) + "\n"


def is_response(msg):
    """A response (the end of a request's answer), not an event notification."""
    return "method" not in msg


def unwrap(msg):
    """The result of a response, or the response itself when it is an error
    (so callers can test "error" in it)."""
    return msg["result"] if "result" in msg else msg
