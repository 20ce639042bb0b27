"""Build hook for the optional C scanner (frscope/records/_frscan.c); everything else is in pyproject.toml.

The extension only makes reading large dump sets faster (frscope.records.scan). Where it cannot be built (no
compiler or no Python headers) the install goes on without it and frscope reads every dump with the
pure-Python reference path: a build failure is a warning, never an install failure. The released wheels and
the image are built where it can be (cibuildwheel, the Dockerfile's build stage) and check that it is in.
"""

from __future__ import annotations

import sys

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


setup(
    ext_modules=[Extension("frscope.records._frscan", ["frscope/records/_frscan.c"],
                           depends=["frscope/records/_frscan_fields.h"], optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
