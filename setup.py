"""The build's one step beyond pyproject.toml: the course's notebooks (notebooks/*.ipynb, at the
top of a clone and of the sdist) go into the wheel as package data, smallem/notebooks/, where
`smallem notebooks DEST` copies them from. A clone's editable install reads notebooks/ itself.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithNotebooks(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "smallem" / "notebooks"
        self.mkpath(str(target))
        for notebook in sorted(Path(__file__).resolve().parent.joinpath("notebooks").glob("*.ipynb")):
            self.copy_file(str(notebook), str(target / notebook.name))


setup(cmdclass={"build_py": BuildWithNotebooks})
