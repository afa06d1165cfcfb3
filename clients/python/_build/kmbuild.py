"""A PEP 517 build backend for the kernelmgr client, standard library only.

It writes a pure-Python wheel (py3-none-any) of src/kernelmgr with its
.dist-info (METADATA from pyproject.toml's [project], WHEEL, RECORD with
sha256 digests) and an sdist (.tar.gz with PKG-INFO), so that pip's
isolated build needs nothing from an index (`requires = []`). Also the
PEP 660 editable hooks (a .pth pointing at src/). Files are written in a
fixed order with a fixed date ($SOURCE_DATE_EPOCH, else 2020-01-01), so
two builds of one tree are byte-identical.
"""
from __future__ import annotations

import base64
import hashlib
import importlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import IO, Any, Dict, List, Optional, Tuple, cast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "kernelmgr"
SRC = os.path.join(ROOT, "src")
SDIST_FILES = ["pyproject.toml", "README.md", "_build/kmbuild.py"]
EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "1577836800"))


def _toml_project(text: str) -> Dict[str, Any]:
    """[project] of pyproject.toml: tomllib where there is one (3.11+), else
    the subset this file uses (strings and one-line arrays of strings)."""
    try:
        tomllib = importlib.import_module("tomllib")
        return dict(tomllib.loads(text).get("project", {}))
    except ImportError:
        pass
    out: Dict[str, Any] = {}
    table = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"\[([^\]]+)\]", line)
        if m:
            table = m.group(1).strip()
            continue
        if table != "project" or "=" not in line:
            continue
        key, val = (x.strip() for x in line.split("=", 1))
        if val.startswith("["):
            out[key] = re.findall(r'"((?:[^"\\]|\\.)*)"', val)
        elif val.startswith('"'):
            out[key] = val[1:val.rindex('"')]
    return out


def _project() -> Dict[str, Any]:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        p = _toml_project(f.read())
    for key in ("name", "version"):
        if not isinstance(p.get(key), str):
            raise ValueError(f"pyproject.toml: [project] has no {key}")
    return p


def _metadata(p: Dict[str, Any]) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {p['name']}", f"Version: {p['version']}"]
    if p.get("description"):
        lines.append(f"Summary: {p['description']}")
    if p.get("requires-python"):
        lines.append(f"Requires-Python: {p['requires-python']}")
    if p.get("keywords"):
        lines.append("Keywords: " + ",".join(p["keywords"]))
    for c in p.get("classifiers") or []:
        lines.append(f"Classifier: {c}")
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str):
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
        lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + body


def _dist(p: Dict[str, Any]) -> str:
    return f"{re.sub(r'[-_.]+', '_', p['name'])}-{p['version']}"


def _package_files() -> List[Tuple[str, str]]:
    """(archive name, path) of every file of the package, sorted."""
    out = []
    top = os.path.join(SRC, PACKAGE)
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith((".pyc", ".pyo")):
                continue
            full = os.path.join(d, f)
            out.append((os.path.relpath(full, SRC).replace(os.sep, "/"), full))
    return out


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _dist_info(p: Dict[str, Any]) -> List[Tuple[str, bytes]]:
    di = _dist(p) + ".dist-info"
    wheel = ("Wheel-Version: 1.0\nGenerator: kmbuild (kernelmgr)\nRoot-Is-Purelib: true\n"
             "Tag: py3-none-any\n")
    return [(f"{di}/METADATA", _metadata(p).encode("utf-8")),
            (f"{di}/WHEEL", wheel.encode("ascii")),
            (f"{di}/top_level.txt", (PACKAGE + "\n").encode("ascii"))]


def _write_wheel(directory: str, members: List[Tuple[str, bytes]], p: Dict[str, Any]) -> str:
    name = _dist(p) + "-py3-none-any.whl"
    record_name = _dist(p) + ".dist-info/RECORD"
    members = members + _dist_info(p)
    record = "\n".join([_record_line(n, d) for n, d in members] + [f"{record_name},,"]) + "\n"
    members.append((record_name, record.encode("utf-8")))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, name + ".part")
    date = time.gmtime(max(EPOCH, 315532800))[:6]
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in members:
            info = zipfile.ZipInfo(n, date_time=date)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, d)
    os.replace(tmp, os.path.join(directory, name))
    return name


# ------------------------------------------------------------ PEP 517 hooks


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(
        config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, Any]] = None) -> str:
    p = _project()
    di = _dist(p) + ".dist-info"
    for n, d in _dist_info(p):
        path = os.path.join(metadata_directory, n)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(d)
    return di


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    p = _project()
    return _write_wheel(wheel_directory, [(n, _read(f)) for n, f in _package_files()], p)


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    p = _project()
    pth = (SRC + "\n").encode("utf-8")
    return _write_wheel(wheel_directory, [(f"__editable__.{_dist(p)}.pth", pth)], p)


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    p = _project()
    base = _dist(p)
    name = base + ".tar.gz"
    files = [(f, os.path.join(ROOT, f)) for f in SDIST_FILES]
    files += [("src/" + n, f) for n, f in _package_files()]
    os.makedirs(sdist_directory, exist_ok=True)
    tmp = os.path.join(sdist_directory, name + ".part")
    with open(tmp, "wb") as raw:
        import gzip
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=EPOCH) as gz:
            with tarfile.open(fileobj=cast(IO[bytes], gz), mode="w", format=tarfile.PAX_FORMAT) as tar:
                def add(arcname: str, data: bytes) -> None:
                    ti = tarfile.TarInfo(f"{base}/{arcname}")
                    ti.size = len(data)
                    ti.mtime = EPOCH
                    ti.mode = 0o644
                    ti.uname = ti.gname = ""
                    tar.addfile(ti, io.BytesIO(data))
                add("PKG-INFO", _metadata(p).encode("utf-8"))
                for arc, full in sorted(files):
                    add(arc, _read(full))
    os.replace(tmp, os.path.join(sdist_directory, name))
    return name
