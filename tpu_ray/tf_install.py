"""Which installed distributions provide the `tensorflow` package, and which libtpu: exactly one may.

`tensorflow` and `tensorflow-tpu` (and -cpu, -intel, tf-nightly...) are separate distributions that
write the same `tensorflow/` directory; pip installs both when asked (tf-keras requires the
distribution `tensorflow`), and then whichever was unpacked last is imported, silently. Read from
the installed metadata (importlib.metadata), never by importing TensorFlow: doctor runs this before
any TensorFlow loads, and on a TPU host importing it would take the chips.
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
from dataclasses import dataclass

from tpu_ray.accelerators import TPU_LIBTPU, TPU_TENSORFLOW

INSTALL_HINT = "pip install -e 'tpu-ray[tpu]', then deploy/tpu-finish-install.sh (docs/accelerators.md)"
TPU_BUILDS = ("tensorflow-tpu", "tf-nightly-tpu")  # distributions of TensorFlow built for TPUs only


@dataclass(frozen=True)
class TensorflowInstall:
    providers: tuple[str, ...]  # "tensorflow-tpu 2.19.1": every distribution that writes tensorflow/
    libtpu: str | None  # "libtpu 0.0.10", or None

    @property
    def describe(self) -> str:
        found = " + ".join(self.providers) or "no distribution"
        return f"tensorflow from {found}" + (f", {self.libtpu}" if self.libtpu else ", no libtpu")

    def problem(self, tpu: bool, gpu: bool = False) -> tuple[str, str] | None:
        """(what is wrong, the fix) for a host of this kind, None when the install is right.

        No provider and two providers are always wrong. On a TPU host the one provider must be
        tensorflow-tpu of TPU_TENSORFLOW with the libtpu that wheel pins (TPU_LIBTPU); on a GPU
        host it must not be a TPU build (tensorflow-tpu has no CUDA kernels: it would train on CPU)."""
        if not self.providers:
            extra = "tpu" if tpu else "gpu" if gpu else "cpu"
            return ("no TensorFlow installed (no distribution provides the tensorflow package)",
                    INSTALL_HINT if tpu else f"pip install -e 'tpu-ray[{extra}]'")
        if gpu and len(self.providers) == 1 and self.providers[0].split()[0] in TPU_BUILDS:
            return (f"{self.providers[0]} is a TPU build of TensorFlow: it has no CUDA kernels, so a GPU run "
                    "would train on the CPU",
                    f"pip uninstall -y {self.providers[0].split()[0]} libtpu; pip install -e 'tpu-ray[gpu]'")
        if len(self.providers) > 1:
            keep = "tensorflow-tpu" if tpu else "tensorflow"
            drop = " ".join(p.split()[0] for p in self.providers if p.split()[0] != keep)
            return (f"{len(self.providers)} distributions write the tensorflow package ({', '.join(self.providers)}): "
                    "which one is imported depends on install order",
                    f"pip uninstall -y {drop} {keep}; {INSTALL_HINT}" if tpu
                    else f"pip uninstall -y {drop}, then reinstall {keep}")
        if not tpu:
            return None
        want = (f"tensorflow-tpu {TPU_TENSORFLOW}", f"libtpu {TPU_LIBTPU}")
        if self.providers != want[:1] or self.libtpu != want[1]:
            return f"a TPU host needs {' + '.join(want)}, found {self.describe}", f"install with {INSTALL_HINT}"
        return None


def _providers(package: str) -> tuple[str, ...]:
    names = {re.sub(r"[-_.]+", "-", name).lower(): name for name in metadata.packages_distributions().get(package, [])}
    return tuple(f"{key} {metadata.version(names[key])}" for key in sorted(names))


def installed() -> TensorflowInstall:
    """What this Python environment would import as `tensorflow` and `libtpu`."""
    libtpu = _providers("libtpu")
    return TensorflowInstall(_providers("tensorflow"), " + ".join(libtpu) or None)


def main() -> int:
    """`python -m tpu_ray.tf_install [--tpu]`: the install scripts' last line; exit 1 on a wrong install."""
    import sys

    tpu = "--tpu" in sys.argv[1:]
    found = installed()
    problem = found.problem(tpu)
    if problem:
        print(f"tpu-ray: {problem[0]}; fix: {problem[1]}", file=sys.stderr)
        return 1
    print(f"tpu-ray: {found.describe}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
