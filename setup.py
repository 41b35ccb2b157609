"""Everything is declared in pyproject.toml; this adds the one field it cannot hold, the ``Home-page`` that
``pip show`` prints (pip before 24.1 does not fall back to the ``Homepage`` project URL)."""
from setuptools import setup

setup(url="https://github.com/tinn-authors/tinn")
