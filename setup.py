"""Maps the import name `vllm_srun` onto the `src/` tree of the design card.

`src/domain` imports as `vllm_srun.domain`, `src/adapters` as `vllm_srun.adapters`, and so on,
so that the generic folder names never collide in site-packages.
"""

from setuptools import find_packages, setup

setup(
    packages=["vllm_srun"] + [f"vllm_srun.{name}" for name in find_packages("src")],
    package_dir={"vllm_srun": "src"},
)
