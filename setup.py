"""Builds the native extension `runtime._native` from `native/`.

Everything else about the package lives in pyproject.toml; setuptools still needs
`ext_modules` from code. The build is optional: on a machine without a C compiler the
package installs without it and `runtime.sampling.kernels` falls back to numpy (and says so).
"""

from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            print(f"warning: native extension not built ({exc}); numpy fallback will be used")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} not built ({exc}); numpy fallback will be used")


setup(
    ext_modules=[
        Extension(
            "runtime._native",
            sources=["native/outrider_native.c", "native/stepper.c"],
            depends=sorted(glob("native/*.h")),
            extra_compile_args=["-O3", "-std=c11"],
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
