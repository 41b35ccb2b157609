"""``python -m tinn.deploy --cflags --libs``: the flags to build a C or C++ program that includes ``tinn_model.h``."""
import argparse
import sys

from ._flags import cflags, libs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tinn.deploy", description=__doc__)
    parser.add_argument("--cflags", action="store_true", help="the include flags (tinn_model.h, the Taichi C API)")
    parser.add_argument("--libs", action="store_true", help="the linker flags (-ltaichi_c_api and its rpath)")
    args = parser.parse_args(argv)
    if not (args.cflags or args.libs):
        parser.error("give --cflags, --libs or both")
    print(" ".join(([cflags()] if args.cflags else []) + ([libs()] if args.libs else [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
