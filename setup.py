"""Build hook: the wheel carries the course (learner notebooks, traces, the tiny model).

The repository keeps them in top-level folders (labs/, assets/), outside the package, so they
are copied into the built package as ``kvlab/_bundled/`` with the same layout, where
``kvlab.core.files`` finds them. Everything else is in pyproject.toml; MANIFEST.in puts the
same folders in the sdist, so a wheel built from it has the course too.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
BUNDLE = Path("kvlab", "_bundled")
# what the course reads at run time; solutions/ (the answer key) never ships
COURSE_FILES = ("labs/[0-9][0-9]_*.ipynb", "assets/traces/*.csv", "assets/tiny_model/*")


class build_py_with_course(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own folders
        bundle = Path(self.build_lib) / BUNDLE
        shutil.rmtree(bundle, ignore_errors=True)  # no stale lab from an earlier build
        for pattern in COURSE_FILES:
            found = sorted(p for p in HERE.glob(pattern) if p.is_file())
            if not found:
                raise SystemExit(f"kvlab build: no {pattern} in {HERE}: the course is incomplete")
            for source in found:
                target = bundle / source.relative_to(HERE)
                self.mkpath(str(target.parent))
                self.copy_file(str(source), str(target))


setup(cmdclass={"build_py": build_py_with_course})
