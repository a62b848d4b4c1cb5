"""Assembles the platform wheel: the client package and the ``redb-limiter`` server binary.

The equivalent of maturin's ``bindings = "bin"`` for a binary built already (maturin would compile
the server once more): hatchling builds the pure wheel from pyproject.toml (so its metadata is
the client's own), then this adds the binary as ``<name>.data/scripts/redb-limiter`` (pip installs
it beside ``python``, on the virtual environment's PATH), marks the wheel platform-specific
(``Root-Is-Purelib: false``, the platform's tags) and rewrites RECORD with every file's hash.

Usage: build_wheel.py --binary PATH --target RUST_TARGET [--out DIR]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# The platform tags of a Rust target's binary. Linux with glibc: the binary is static
# (packaging/build-server.sh), so it needs no glibc at all; manylinux 2.17 is the oldest tag
# current pip accepts everywhere (manylinux2014 is its older spelling, for pip before 20.3).
PLATFORM_TAGS = {
    "x86_64-unknown-linux-gnu": ["manylinux_2_17_x86_64", "manylinux2014_x86_64"],
    "aarch64-unknown-linux-gnu": ["manylinux_2_17_aarch64", "manylinux2014_aarch64"],
    "x86_64-unknown-linux-musl": ["musllinux_1_2_x86_64"],
    "aarch64-unknown-linux-musl": ["musllinux_1_2_aarch64"],
    "x86_64-apple-darwin": ["macosx_10_12_x86_64"],
    "aarch64-apple-darwin": ["macosx_11_0_arm64"],
    "x86_64-pc-windows-msvc": ["win_amd64"],
}


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def pure_wheel(into: Path) -> Path:
    """The client's own wheel, as `pip install ./clients/python` builds it."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(into), str(HERE)],
        check=True,
    )
    (wheel,) = into.glob("redb_limiter-*-py3-none-any.whl")
    return wheel


def assemble(pure: Path, binary: Path, target: str, out: Path) -> Path:
    tags = PLATFORM_TAGS[target]
    exe = "redb-limiter.exe" if "windows" in target else "redb-limiter"
    name, version = pure.name.split("-")[:2]
    dist_info = f"{name}-{version}.dist-info"
    wheel = out / f"{name}-{version}-py3-none-{'.'.join(tags)}.whl"
    out.mkdir(parents=True, exist_ok=True)
    wheel.unlink(missing_ok=True)
    records: list[str] = []
    with zipfile.ZipFile(pure) as source, zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as sink:
        stamp = source.infolist()[0].date_time

        def add(path: str, data: bytes, mode: int = 0o644) -> None:
            info = zipfile.ZipInfo(path, stamp)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            sink.writestr(info, data)
            records.append(record_line(path, data))

        kept = [i for i in source.infolist() if i.filename not in (f"{dist_info}/WHEEL", f"{dist_info}/RECORD")]
        # The package, then the binary, then the metadata (RECORD last).
        for info in (i for i in kept if not i.filename.startswith(f"{dist_info}/")):
            add(info.filename, source.read(info))
        add(f"{name}-{version}.data/scripts/{exe}", binary.read_bytes(), 0o755)
        for info in (i for i in kept if i.filename.startswith(f"{dist_info}/")):
            add(info.filename, source.read(info))
        lines = ["Wheel-Version: 1.0", "Generator: redb-limiter build_wheel.py", "Root-Is-Purelib: false"]
        lines += [f"Tag: py3-none-{tag}" for tag in tags]
        add(f"{dist_info}/WHEEL", ("\n".join(lines) + "\n").encode())
        records.append(f"{dist_info}/RECORD,,")
        sink.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", stamp), "\n".join(records) + "\n")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, required=True, help="the server binary built for --target")
    parser.add_argument("--target", required=True, choices=sorted(PLATFORM_TAGS), help="its Rust target")
    parser.add_argument("--out", type=Path, default=HERE / "dist", help="where the wheel goes (dist/)")
    args = parser.parse_args()
    if not args.binary.is_file():
        parser.error(f"--binary {args.binary}: no such file")
    with tempfile.TemporaryDirectory() as scratch:
        print(assemble(pure_wheel(Path(scratch)), args.binary, args.target, args.out))


if __name__ == "__main__":
    main()
