"""Build script for what pyproject.toml cannot say alone.

* The one compiled part: the bulk log scanner (``diagnoser/engines/sglang/_scan.c``). The extension is
  optional: when no C compiler is available the install still succeeds and the log reader uses its
  pure-Python path (same results, slower on big logs).
* ``docs/sglang.md`` (how diagnoser reads SGLang) is copied into the package as
  ``diagnoser/web/docs/sglang.md``, so that ``diagnose serve`` can serve it at ``/docs/sglang`` from an
  installed wheel; a checkout (editable install) serves ``docs/`` itself.
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGED_DOCS = ["sglang.md"]


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        for name in PACKAGED_DOCS:
            src = HERE / "docs" / name
            if src.is_file():
                dst = Path(self.build_lib) / "diagnoser" / "web" / "docs" / name
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, dst)


setup(
    cmdclass={"build_py": BuildPy},
    ext_modules=[
        Extension(
            "diagnoser.engines.sglang._scan",
            ["diagnoser/engines/sglang/_scan.c"],
            optional=True,
            extra_compile_args=["-O2", "-fno-fast-math"],
        )
    ],
)
