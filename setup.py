"""Build hook for the optional C scanner (frscope/records/_frscan.c), and README.md as PyPI's page with absolute
links; everything else is in pyproject.toml.

The extension only makes reading large dump sets faster (frscope.records.scan). Where it cannot be built (no
compiler or no Python headers) the install goes on without it and frscope reads every dump with the
pure-Python reference path: a build failure is a warning, never an install failure. The released wheels and
the image are built where it can be (cibuildwheel, the Dockerfile's build stage) and check that it is in.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all (distutils raises its own error types)
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc)

    @staticmethod
    def _skip(exc: Exception) -> None:
        print(f"warning: the optional C scanner was not built ({exc}); frscope reads dumps with its "
              "pure-Python path", file=sys.stderr)


# README.md links to the repository's files relatively (right on GitHub, in a checkout); on PyPI the same links
# point nowhere. The package's long description has them absolute: files on GitHub, images from raw content.
REPOSITORY = "https://github.com/frscope/frscope"
_LINK = re.compile(r"(!?)\[([^\]]*)\]\((?!https?://|mailto:)([^)\s]*)\)")


def absolute_links(markdown: str) -> str:
    """'[a](docs/x.md)' -> '[a](https://github.com/frscope/frscope/blob/main/docs/x.md)'; '![i](p.png)' -> raw
    content; '[s](#part)' -> the README's section on GitHub (PyPI's page has no anchors of its own)."""

    def rewrite(m: re.Match[str]) -> str:
        image, text, target = m.group(1), m.group(2), m.group(3)
        if target.startswith("#"):
            url = f"{REPOSITORY}/blob/main/README.md{target}"
        elif image:
            url = f"https://raw.githubusercontent.com/frscope/frscope/main/{target}"
        else:
            url = f"{REPOSITORY}/{'tree' if target.endswith('/') else 'blob'}/main/{target}"
        return f"{image}[{text}]({url})"

    return _LINK.sub(rewrite, markdown)


setup(
    long_description=absolute_links(Path(__file__).with_name("README.md").read_text(encoding="utf-8")),
    long_description_content_type="text/markdown",
    ext_modules=[Extension("frscope.records._frscan", ["frscope/records/_frscan.c", "frscope/records/_frscan_groups.c",
                                                         "frscope/records/_frscan_json.c"],
                           depends=["frscope/records/_frscan_fields.h", "frscope/records/_frscan_arena.h"],
                           optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
