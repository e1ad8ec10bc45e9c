"""The optional C part of dl2 (everything else is in pyproject.toml).

``dl2._speedups`` runs the recorder's two hottest steps for the common case: the walk of
the user's stack at each recorded call, and the stream encoder's op record of a
collective in a training loop's steady state (see the file's comment).  It is optional:
where no C compiler is found the build goes on without it and the recorder runs the same
steps in Python.
"""

from setuptools import Extension
from setuptools import setup

setup(
    ext_modules=[
        Extension("dl2._speedups", ["src/dl2/_speedups.c"], optional=True),
    ]
)
