"""The one piece of build configuration pyproject.toml cannot say (the rest is there).

The shipped recipes have one home, the top-level ``recipes/`` (#42): the wheel carries them as the
package ``ggufmtp.data.recipes`` mapped onto that folder, so nothing is copied by hand, and an
editable install (``pip install -e``) maps the same package name onto the same folder.
``[tool.setuptools.packages.find]`` cannot add a package from another folder, so the package list is
made here: every package under ``ggufmtp/`` plus that one.
"""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["ggufmtp", "ggufmtp.*"]), "ggufmtp.data.recipes"],
      package_dir={"ggufmtp.data.recipes": "recipes"})
