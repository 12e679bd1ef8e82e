"""benchmarks/gpu_wheels.py: a wheel rewritten without the folders left out keeps every other file
and its RECORD names no file that is gone."""

from __future__ import annotations

import zipfile

from tests.benchmarks import benchmark_module


def test_strip_wheel_leaves_out_the_folders_and_their_record_lines(tmp_path):
    src, dst = tmp_path / "pkg-1.0-py3-none-any.whl", tmp_path / "out" / "pkg-1.0-py3-none-any.whl"
    dst.parent.mkdir()
    files = {"ray/__init__.py": "x = 1\n", "ray/jars/big.jar": "java", "ray/util/a.py": "a = 2\n",
             "ray/dashboard/client/build/index.html": "<html>", "ray/dashboard/modules/m.py": "m = 3\n"}
    record = "".join(f"{name},sha256=abc,1\n" for name in files) + "ray-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(src, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("ray-1.0.dist-info/RECORD", record)
    with benchmark_module("gpu_wheels") as gw:
        dropped = gw.strip_wheel(src, dst, ("ray/jars/", "ray/dashboard/client/"))
    assert dropped == 2
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        assert names == {"ray/__init__.py", "ray/util/a.py", "ray/dashboard/modules/m.py", "ray-1.0.dist-info/RECORD"}
        assert z.read("ray/util/a.py") == b"a = 2\n"
        recorded = {line.split(",")[0] for line in z.read("ray-1.0.dist-info/RECORD").decode().splitlines()}
    assert recorded == names
