"""Hard-link into this venv the requirements that another venv already holds at a version that fits
(scripts/torch-venv runs it with the new venv's python, before `pip install` of the same requirements,
which then finds them installed and fetches only the rest).

    python torch_venv_link.py ROOT DONORS REQUIREMENT...

ROOT: the directory of the per-version venvs (each finished one has .frscope-ready); DONORS: more venv
directories, colon-separated (may be empty). Only venvs of the same Python minor version are used (some
of the wheels are built for one CPython ABI). A requirement's own requirements follow it, extras
included (cuda-toolkit[cublas,...] pulls in nvidia-cublas and the others). Files are linked as the
donor's RECORD lists them; one that cannot be linked (another file system) is copied.

Standard library plus pip's vendored `packaging` (every venv has pip; nothing else is installed yet).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name


def donor_sites(root: Path, donors: str) -> list[Path]:
    here = Path(sys.prefix).resolve()
    lib = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    venvs = [Path(d) for d in donors.split(os.pathsep) if d]
    venvs += sorted(p for p in root.iterdir() if (p / ".frscope-ready").is_file())
    sites = []
    for venv in venvs:
        site = venv / "lib" / lib / "site-packages"
        if venv.resolve() != here and site.is_dir() and site not in sites:
            sites.append(site)
    return sites


def link_files(dist: md.Distribution, site: Path, target: Path) -> tuple[int, int]:
    count = size = 0
    for entry in dist.files or []:
        rel = Path(str(entry))
        if rel.is_absolute() or ".." in rel.parts:
            continue  # console scripts and the like live outside site-packages
        src, dst = site / rel, target / rel
        if not src.is_file() or dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        count += 1
        size += src.stat().st_size
    return count, size


def main(argv: list[str]) -> int:
    root, donors, *wanted = argv
    target = Path(sysconfig.get_paths()["purelib"])
    held: dict[str, list[tuple[md.Distribution, Path]]] = {}
    for site in donor_sites(Path(root), donors):
        for dist in md.distributions(path=[str(site)]):
            held.setdefault(canonicalize_name(dist.metadata["Name"]), []).append((dist, site))
    installed = {canonicalize_name(d.metadata["Name"]) for d in md.distributions(path=[str(target)])}

    linked: dict[str, md.Distribution] = {}
    followed: set[tuple[str, str]] = set()  # (name, extra) whose requirements were queued
    queue = [Requirement(text) for text in wanted]
    files = total = 0
    while queue:
        req = queue.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # e.g. platform_system == "Windows"; a queued requirement's marker is evaluated already
        name = canonicalize_name(req.name)
        dist = linked.get(name)
        if dist is None:
            if name in installed:
                continue  # torch itself, installed first
            fits = [(d, s) for d, s in held.get(name, []) if req.specifier.contains(d.version, prereleases=True)]
            if not fits:
                continue  # pip fetches it
            dist, site = fits[0]
            count, size = link_files(dist, site, target)
            files, total = files + count, total + size
            linked[name] = dist
        for extra in {"", *req.extras}:
            if (name, extra) in followed:
                continue
            followed.add((name, extra))
            for text in dist.requires or []:
                sub = Requirement(text)
                if sub.marker is None or sub.marker.evaluate({"extra": extra}):
                    sub.marker = None
                    queue.append(sub)
    names = ", ".join(f"{d.metadata['Name']}=={d.version}" for d in linked.values())
    print(f"torch-venv: linked {len(linked)} distributions ({files} files, {total / 2**30:.1f} GiB) from other venvs"
          + (f": {names}" if names else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
