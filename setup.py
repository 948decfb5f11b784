"""Build script for the one compiled part: the bulk log scanner (``diagnoser/engines/sglang/_scan.c``).

Everything else is configured in pyproject.toml. The extension is optional: when no C compiler is
available the install still succeeds and the log reader uses its pure-Python path (same results,
slower on big logs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "diagnoser.engines.sglang._scan",
            ["diagnoser/engines/sglang/_scan.c"],
            optional=True,
            extra_compile_args=["-O2", "-fno-fast-math"],
        )
    ]
)
