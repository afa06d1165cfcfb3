"""kernelmgr Python worker: snapshots of the interpreter's state.

Called by driver.py for the worker protocol's `snapshot` request (see
kernels/WORKER_PROTOCOL.md, "Snapshots"). Runs inside the sandbox, on the
thread that reads requests, between cells. The host never reads what is
written here beyond copying the files (it never unpickles them).

A snapshot is a directory the host made empty for it:
  state.json  what was saved: modules, cwd, the cells' changes to the
              environment and sys.path (not what the start was given), In,
              execution count, the serializer, the names lost and why
  ns.pkl      the namespace: records of (name, pickled bytes), each pickled
              on its own by one Pickler whose memo is shared (objects shared
              between names stay shared) and restored before a failure, so
              one bad object never sinks the rest

Everything that fails is listed (name, type, reason): never a silent drop,
never an exception out of save() or load().
"""

import os
import struct
import sys
import types

_VERSION = 1
# Names of __main__ that are the driver's, not the user's.
_SKIP = {"__builtins__", "__name__", "__doc__", "__loader__", "__spec__", "__package__",
         "In", "Out", "_ih", "_oh", "exit", "quit", "get_ipython"}
_HEADER = struct.Struct(">BI")  # kind (0 value, 1 module, 2 Out entry), name length


class TooLarge(Exception):
    pass


def _serializer():
    try:
        import dill  # noqa: F401

        return "dill"
    except Exception:
        return "pickle"


def _pickler(name, f):
    if name == "dill":
        import dill

        p = dill.Pickler(f, protocol=4, byref=False, recurse=True)
        return p
    import pickle

    return pickle.Pickler(f, protocol=4)


def _unpickler(name, f):
    if name == "dill":
        import dill

        return dill.Unpickler(f)
    import pickle

    return pickle.Unpickler(f)


def _why(e):
    s = "%s: %s" % (type(e).__name__, e)
    return s if len(s) <= 300 else s[:297] + "..."


def _typename(v):
    t = type(v)
    mod = getattr(t, "__module__", "") or ""
    return t.__qualname__ if mod in ("builtins", "__main__") else "%s.%s" % (mod, t.__qualname__)


def _records(ns, out):
    for name in list(ns):
        if name in _SKIP or name.startswith("_i") and name[2:].isdigit() or name in ("_i", "_ii", "_iii"):
            continue
        if name.startswith("_") and name[1:].isdigit():
            continue  # _N: an Out entry, saved with Out
        yield 0, name, ns[name]
    if isinstance(out, dict):
        for k, v in list(out.items()):
            yield 2, str(k), v


def save(path, max_bytes, ns, in_hist, out_hist, count, base_modules, base_env=None,
         base_path=None):
    """Writes the snapshot into the directory path. Returns the reply event."""
    import io
    import json
    import warnings

    lost = []
    ser = _serializer()
    total = 0
    try:
        max_bytes = int(max_bytes)
    except ValueError:
        max_bytes = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tmp = os.path.join(path, "ns.pkl.tmp")
            with open(tmp, "wb") as f:
                buf = io.BytesIO()
                p = _pickler(ser, buf)
                saved = 0
                for kind, name, value in _records(ns, out_hist):
                    label = "Out[%s]" % name if kind == 2 else name
                    if kind == 0 and isinstance(value, types.ModuleType):
                        data = value.__name__.encode()
                        kind = 1
                    else:
                        memo = p.memo.copy()
                        buf.seek(0)
                        buf.truncate()
                        try:
                            p.dump(value)
                            data = buf.getvalue()
                        except BaseException as e:  # noqa: B902 - a pickle hook may raise anything
                            if isinstance(e, KeyboardInterrupt):
                                raise
                            p.memo = memo
                            lost.append({"name": label, "type": _typename(value), "reason": _why(e)})
                            continue
                    nb = name.encode("utf-8", "surrogatepass")
                    total += _HEADER.size + len(nb) + 8 + len(data)
                    if max_bytes and total > max_bytes:
                        raise TooLarge(label)
                    f.write(_HEADER.pack(kind, len(nb)))
                    f.write(nb)
                    f.write(struct.pack(">Q", len(data)))
                    f.write(data)
                    saved += 1
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, os.path.join(path, "ns.pkl"))
        cwd = cwd_rel = None
        try:
            cwd = os.getcwd()
        except OSError:
            pass
        # the staging directory is made in the workspace: below it, the cwd
        # is kept relative too, so that a fork or an imported session (another
        # workspace path) comes back to the same directory of its own
        ws = os.path.dirname(os.path.abspath(path))
        if cwd and (cwd == ws or cwd.startswith(ws + os.sep)):
            cwd_rel = os.path.relpath(cwd, ws)
        modules = [m for m in list(sys.modules) if m not in base_modules and m != "__main__"
                   and sys.modules.get(m) is not None]
        state = {
            "version": _VERSION,
            "language": "python",
            "serializer": ser,
            "python": sys.version.split()[0],
            "execution_count": count,
            "cwd": cwd,
            "cwd_rel": cwd_rel,
            # the cells' changes to the environment and sys.path, not what
            # the start was given (package directories name the session)
            "environ_set": {k: v for k, v in os.environ.items()
                            if (base_env or {}).get(k) != v},
            "environ_unset": [k for k in (base_env or {}) if k not in os.environ],
            "sys_path": list(sys.path),
            "sys_path_base": list(base_path or []),
            "modules": modules,
            "in": list(in_hist) if in_hist is not None else [],
            "names": saved,
            "lost": lost,
        }
        data = json.dumps(state, ensure_ascii=False).encode("utf-8", "surrogatepass")
        total += len(data)
        if max_bytes and total > max_bytes:
            raise TooLarge("state.json")
        with open(os.path.join(path, "state.json.tmp"), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(os.path.join(path, "state.json.tmp"), os.path.join(path, "state.json"))
    except TooLarge as e:
        _clean(path)
        return {"type": "snapshot_reply", "status": "error", "ename": "SnapshotTooLarge",
                "evalue": "the python state is larger than snapshot_max=%d bytes (at %s)"
                % (max_bytes, e.args[0]), "lost": lost}
    except Exception as e:
        _clean(path)
        return {"type": "snapshot_reply", "status": "error", "ename": "SnapshotFailed",
                "evalue": "saving the python state failed: %s" % _why(e), "lost": lost}
    return {"type": "snapshot_reply", "status": "ok", "bytes": total, "names": saved,
            "serializer": ser, "lost": lost, "execution_count": count}


def _clean(path):
    for n in ("ns.pkl", "ns.pkl.tmp", "state.json", "state.json.tmp"):
        try:
            os.unlink(os.path.join(path, n))
        except OSError:
            pass


def _restore_env(state):
    """The cells' changes to the environment, applied to this start's."""
    env_set, env_unset = state.get("environ_set"), state.get("environ_unset")
    if not (isinstance(env_set, dict) and isinstance(env_unset, list)):
        env_set = state.get("environ")  # a snapshot of an earlier version: all of it
        if not isinstance(env_set, dict):
            return
        env_unset = [k for k in os.environ if k not in env_set]
    for k in env_unset:
        if isinstance(k, str) and k in os.environ:
            try:
                del os.environ[k]
            except Exception:
                pass
    for k, v in env_set.items():
        if isinstance(k, str) and isinstance(v, str) and os.environ.get(k) != v:
            try:
                os.environ[k] = v
            except Exception:
                pass


def load(path, ns, in_hist, out_hist, log):
    """Loads the snapshot in directory path into ns. Returns the reply event."""
    import importlib
    import json
    import warnings

    lost = []
    try:
        with open(os.path.join(path, "state.json"), "rb") as f:
            state = json.loads(f.read().decode("utf-8", "surrogatepass"))
        if not isinstance(state, dict) or state.get("version") != _VERSION:
            raise ValueError("not a version %d python snapshot" % _VERSION)
    except Exception as e:
        return {"type": "snapshot_reply", "status": "error", "ename": "SnapshotCorrupt",
                "evalue": "the python snapshot cannot be read: %s" % _why(e), "lost": []}
    ser = state.get("serializer")
    if ser == "dill" and _serializer() != "dill":
        return {"type": "snapshot_reply", "status": "error", "ename": "SnapshotCorrupt",
                "evalue": "the snapshot was saved with dill, which this interpreter cannot import",
                "lost": []}
    ser = "dill" if ser == "dill" else "pickle"
    for n in state.get("lost") or []:
        if isinstance(n, dict):
            lost.append({"name": str(n.get("name")), "type": str(n.get("type")),
                         "reason": "not saved: %s" % n.get("reason")})
    _restore_env(state)
    cwd = state.get("cwd")
    rel = state.get("cwd_rel")
    if isinstance(rel, str) and not os.path.isabs(rel) and ".." not in rel.split(os.sep):
        cwd = os.path.join(os.path.dirname(os.path.abspath(path)), rel)
    if isinstance(cwd, str):
        try:
            os.chdir(cwd)
        except OSError as e:
            log("snapshot: cwd %s not restored: %s" % (cwd, e))
    sp = state.get("sys_path")
    base = state.get("sys_path_base")
    base = set(x for x in base if isinstance(x, str)) if isinstance(base, list) else set()
    if isinstance(sp, list):
        for i, p in enumerate(x for x in sp if isinstance(x, str)):
            if p not in sys.path and p not in base:  # added by a cell
                sys.path.insert(min(i, len(sys.path)), p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in state.get("modules") or []:
            if not isinstance(m, str) or m in sys.modules:
                continue
            try:
                importlib.import_module(m)
            except BaseException as e:  # noqa: B902
                if isinstance(e, KeyboardInterrupt):
                    raise
                if "." not in m:
                    log("snapshot: module %s not re-imported: %s" % (m, _why(e)))
        loaded = 0
        try:
            f = open(os.path.join(path, "ns.pkl"), "rb")
        except OSError as e:
            return {"type": "snapshot_reply", "status": "error", "ename": "SnapshotCorrupt",
                    "evalue": "the python snapshot has no namespace: %s" % _why(e), "lost": lost}
        with f:
            import io

            buf = io.BytesIO()
            u = None
            while True:
                head = f.read(_HEADER.size)
                if not head:
                    break
                try:
                    if len(head) != _HEADER.size:
                        raise ValueError("truncated record")
                    kind, nlen = _HEADER.unpack(head)
                    name = f.read(nlen).decode("utf-8", "surrogatepass")
                    (dlen,) = struct.unpack(">Q", f.read(8))
                    data = f.read(dlen)
                    if len(name.encode("utf-8", "surrogatepass")) != nlen or len(data) != dlen:
                        raise ValueError("truncated record")
                except Exception as e:
                    lost.append({"name": "(rest of the snapshot)", "type": "",
                                 "reason": "corrupt: %s" % _why(e)})
                    break
                label = "Out[%s]" % name if kind == 2 else name
                try:
                    if kind == 1:
                        value = importlib.import_module(data.decode())
                    else:
                        buf.seek(0)
                        buf.truncate()
                        buf.write(data)
                        buf.seek(0)
                        if u is None:
                            u = _unpickler(ser, buf)
                        value = u.load()
                except BaseException as e:  # noqa: B902
                    if isinstance(e, KeyboardInterrupt):
                        raise
                    lost.append({"name": label, "type": "", "reason": "not loaded: %s" % _why(e)})
                    continue
                if kind == 2:
                    try:
                        out_hist[int(name)] = value
                        ns["_" + name] = value
                    except Exception:
                        pass
                else:
                    ns[name] = value
                loaded += 1
    hist = state.get("in")
    if isinstance(hist, list) and in_hist is not None:
        in_hist[:] = [h if isinstance(h, str) else "" for h in hist] or [""]
    count = state.get("execution_count")
    return {"type": "snapshot_reply", "status": "ok", "names": loaded, "lost": lost,
            "serializer": ser,
            "execution_count": count if isinstance(count, int) and count >= 0 else 0}
