"""Plant defects in copies of real artefacts: rewrite a wheel's members, patch an ELF dynamic string in place."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import zipfile
from pathlib import Path

from jatools.wheel.runpath import RunpathError, set_dynamic_string

IDENTITY = "jax_aiter/_build_identity.json"


def rewrite_wheel(src: Path, dst: Path, drop: tuple[str, ...] = (), put: dict[str, bytes] | None = None,
                  fix_record: bool = True, repin: bool = False) -> Path:
    """Copy wheel `src` to `dst` without `drop`, with `put` members replaced or added; RECORD rewritten to match
    unless fix_record is False (then the old RECORD is kept, as a tamperer would leave it). `repin`: the build
    identity's pins name the libraries put, as if the wheel had been built with them (a defect of the build, not
    a change after it)."""
    put = dict(put or {})
    with zipfile.ZipFile(src) as zin:
        names = [n for n in zin.namelist() if n not in drop]
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        data = {n: zin.read(n) for n in names}
    data.update(put)
    if repin:
        ident = json.loads(data[IDENTITY])
        new = {n.rsplit("/", 1)[-1]: b for n, b in put.items() if n.endswith(".so")}
        for pin in ident["pins"]:
            if pin["name"] in new:
                pin.update(size=len(new[pin["name"]]), sha256=hashlib.sha256(new[pin["name"]]).hexdigest())
        data[IDENTITY] = json.dumps(ident, indent=2, sort_keys=True).encode() + b"\n"
    order = [n for n in names if n != record_name] + [n for n in put if n not in names] + [record_name]
    if fix_record:
        out = io.StringIO()
        w = csv.writer(out, lineterminator="\n")
        for n in order[:-1]:
            digest = base64.urlsafe_b64encode(hashlib.sha256(data[n]).digest()).rstrip(b"=").decode()
            w.writerow([n, f"sha256={digest}", len(data[n])])
        w.writerow([record_name, "", ""])
        data[record_name] = out.getvalue().encode()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for n in order:
            info = zipfile.ZipInfo(n, (2023, 11, 14, 22, 13, 20))
            info.external_attr = (0o100755 if n.endswith(".so") else 0o100644) << 16
            zout.writestr(info, data[n], zipfile.ZIP_DEFLATED)
    return dst


def patch_dynamic_string(path: Path, tag: str, old: str, new: str, as_linked: bool = False) -> None:
    """Overwrite the .dynstr string that dynamic entry `tag` (DT_RUNPATH, DT_NEEDED...) points at and that
    equals `old` with `new` (NUL-padded; must not be longer), as chrpath does, in place (the wheel build's own
    rewrite: jatools/wheel/runpath.py). `as_linked`: record the new bytes in the folder's build record, as make
    does after a link (the defect came from the link line)."""
    data = bytearray(path.read_bytes())
    try:
        set_dynamic_string(data, tag, old, new, str(path))
    except RunpathError as e:
        raise ValueError(str(e)) from None
    path.write_bytes(bytes(data))
    if as_linked:
        from jax_aiter.integrity import record_files

        record_files([path])
