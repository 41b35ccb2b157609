"""Per-thread arrays left in memory, found without a GPU: the IR of kernels compiled on Vulkan.

A kernel's per-thread array that is indexed at run time (or written with static indices and read back in a
runtime loop) stays a tensor ``alloca`` in Taichi's final IR: on CUDA that is local memory, a load or store
to memory per access. :func:`scan` runs a piece of Python in a subprocess with
``tinn.init(arch=ti.vulkan, print_ir=True, log_level=ti.INFO)`` (the device path; Taichi's offline cache off,
since a kernel loaded from it is not compiled and prints no IR), reads the IR dumps
Taichi prints (``[ir_printer.cpp:operator()@NNN] [kernel_name.pass] pass name:`` then the statements) and
returns, per kernel, the sizes of the non-shared tensor allocas of ``min_elements`` or more elements in
the kernel's last dump. Shared arrays (``ti.simt.block.SharedArray``) print as shared allocas and are not
counted.

    found = scan("model = ...; model.trainer.training_step(x, y)")   # {kernel name: [sizes]}
"""
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRELUDE = ("import taichi as ti\nimport tinn\n"
           "tinn.init(arch=ti.vulkan, print_ir=True, log_level=ti.INFO, offline_cache=False)\n")
HEADER = re.compile(r"\[ir_printer\.cpp:operator\(\)@\d+\] \[([^\]]+)\] (.*):\s*$")
ALLOCA = re.compile(r"<\*\[Tensor \((\d+)(?:, (\d+))?\) \w+\]> \$\d+ = alloca\s*$")
KERNEL_SUFFIX = re.compile(r"_c\d+_\d+$")


def kernel_name(task: str) -> str:
    """``run_scatter_c144_0.simplify`` -> ``run_scatter_c144_0`` (Taichi's name: the Python function's, a
    counter and an instance)."""
    return task.split(".")[0]


def python_name(kernel: str) -> str:
    """``run_scatter_c144_0`` -> ``run_scatter``."""
    return KERNEL_SUFFIX.sub("", kernel)


def parse(lines, min_elements: int = 16) -> dict:
    """{kernel: [element counts of its non-shared tensor allocas >= min_elements in its last IR dump]}."""
    last, current = {}, None
    for line in lines:
        m = HEADER.search(line)
        if m:
            current = []
            last[kernel_name(m.group(1))] = current
            continue
        if current is not None:
            a = ALLOCA.search(line)
            if a:
                n = int(a.group(1)) * int(a.group(2) or 1)
                if n >= min_elements:
                    current.append(n)
    return last


def scan(script: str, min_elements: int = 16, timeout: float = 900) -> dict:
    """Run ``script`` (Python; ``ti``, ``tinn`` imported, Taichi initialised on Vulkan with IR printing)
    in a subprocess from the project's root, then :func:`parse` its output. Raises ``RuntimeError`` with
    the output's tail if the script fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.pop("TINN_ARCH", None)
    with tempfile.TemporaryDirectory(prefix="irscan_") as tmp, tempfile.TemporaryFile("w+", errors="replace") as out:
        path = os.path.join(tmp, "scanned.py")          # a file: Taichi reads the kernels' source
        with open(path, "w") as f:
            f.write(PRELUDE + script)
        proc = subprocess.run([sys.executable, path], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True)
        out.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"the scanned script failed ({proc.returncode}):\n{out.read()[-4000:]}")
        found = parse(out)
    if not found:
        raise RuntimeError("no IR printed: is Taichi's Vulkan backend available?")
    return found


def kernels_in(*paths) -> set:
    """Python names of the Taichi kernels defined in the given source files (relative to the project's
    root): functions decorated with ``@ti.kernel`` or ``@arena_kernel``."""
    names = set()
    for path in paths:
        with open(os.path.join(ROOT, path)) as f:
            names |= set(re.findall(r"@(?:ti\.kernel|arena_kernel)\s*\n\s*def (\w+)\(", f.read()))
    return names


def kept_arrays(found: dict, names: set) -> dict:
    """The kernels of ``found`` whose Python name is in ``names`` and that keep at least one array."""
    return {k: sizes for k, sizes in found.items() if python_name(k) in names and sizes}


if __name__ == "__main__":      # python tests/irscan.py SCRIPT.py [MIN]: every kernel's arrays
    with open(sys.argv[1]) as f:
        result = scan(f.read(), int(sys.argv[2]) if len(sys.argv) > 2 else 16)
    for kernel, sizes in sorted(result.items()):
        print(f"{kernel}: {sizes}")
