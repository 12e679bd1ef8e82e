"""The Python packages a lent GPU machine lacks for the GPU checks, as wheels to carry there.

The lent machines (an H100 or H200 with torch, transformers and peft, no internet) have no Ray
and none of the small packages agentrl imports beside torch. This downloads, for the machine's
Python (3.12, manylinux x86-64), the versions this checkout's virtual environment has of:
pydantic (and pydantic-core, annotated-types, typing-inspection), dill, gymnasium (and
farama-notifications), and Ray with jsonschema (and referencing, rpds-py,
jsonschema-specifications). Ray's wheel (about 79 MB) is larger than what one call carries
(64 MiB with the working tree), so it is rewritten without what the checks never import: its
Java jars, RLlib, Data, Serve, Tune, Train, its LLM library and the dashboard's web client
(about 40 MB left). A local Ray cluster, actors, placement groups and GPU accounting work
without them (benchmarks/RESULTS.md, "The second H100 run").

    .venv/bin/python benchmarks/gpu_wheels.py            # writes .whl/ (ignored by git)
    echo /.whl/ >> .git/info/exclude

Then, on the device, with ``.whl`` carried (docs/retool.md, "Never run on a GPU")::

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD RAY_AUTH_MODE=disabled
    python3 benchmarks/gpu_learner_check.py --out $OUT/learner.json
    python3 benchmarks/gpu_colocated_check.py --out $OUT/colocated.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "dill", "gymnasium",
            "farama-notifications", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "ray")
"""What the GPU checks import that the lent machines lack (the versions are this venv's)."""

RAY_LEFT_OUT = ("ray/jars/", "ray/rllib/", "ray/data/", "ray/serve/", "ray/tune/", "ray/train/", "ray/llm/",
                "ray/dashboard/client/")
"""Folders of Ray's wheel the checks never import, left out so that the wheel fits a call."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")


def strip_wheel(src: Path, dst: Path, left_out: tuple[str, ...]) -> int:
    """``src`` rewritten to ``dst`` without the files under ``left_out`` (nor their RECORD lines);
    how many files were left out."""
    dropped = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename.startswith(left_out):
                dropped += 1
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line + "\n" for line in data.decode().splitlines() if not line.startswith(left_out)).encode()
            zout.writestr(info, data)
    return dropped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / ".whl"), help="folder for the wheels (default: .whl in the checkout)")
    ap.add_argument("--python-version", default="3.12", help="the lent machine's Python")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in PACKAGES]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", args.python_version, "--implementation", "cp", "--dest", tmp,
               *[a for p in PLATFORMS for a in ("--platform", p)], *pins]
        subprocess.run(cmd, check=True)
        for wheel in sorted(Path(tmp).glob("*.whl")):
            if wheel.name.startswith("ray-"):
                dropped = strip_wheel(wheel, out / wheel.name, RAY_LEFT_OUT)
                print(f"{wheel.name}: {wheel.stat().st_size / 1e6:.1f} MB -> {(out / wheel.name).stat().st_size / 1e6:.1f} MB "
                      f"({dropped} files left out)")
            else:
                (out / wheel.name).write_bytes(wheel.read_bytes())
                print(wheel.name)
    total = sum(f.stat().st_size for f in out.glob("*.whl"))
    print(f"{out}: {total / 2**20:.1f} MiB of wheels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
