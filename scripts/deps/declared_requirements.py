"""Print the requirements a wheel declares, for this interpreter, less some packages.

An engine venv installs the engine ``--no-deps`` and then exactly what its wheel declares
(``Requires-Dist``, markers evaluated here, no extras), so the scheduler-path imports the
engine's servers use are all there; only packages named on the command line are left out
(vLLM's CPU build declares torchaudio / torchvision / torchcodec, which a text model does
not use and whose registry builds expect a CUDA torch).

Usage: python declared_requirements.py WHEEL [--without NAME ...] > requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import zipfile

from packaging.requirements import Requirement


def declared(wheel: str, without: set[str]) -> list[str]:
    """The wheel's unconditional requirements that apply here, markers dropped."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    wanted = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = Requirement(line.split(":", 1)[1].strip())
        if re.sub(r"[-_.]+", "-", requirement.name).lower() in without:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        requirement.marker = None
        wanted.append(str(requirement))
    return wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel")
    parser.add_argument("--without", nargs="*", default=[])
    args = parser.parse_args()
    without = {re.sub(r"[-_.]+", "-", name).lower() for name in args.without}
    sys.stdout.write("".join(f"{line}\n" for line in declared(args.wheel, without)))


if __name__ == "__main__":
    main()
