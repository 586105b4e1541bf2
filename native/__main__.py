"""python -m envd.native --include: print the directory of envd.h, for building
a plugin with one line:

    cc -shared -fPIC -O2 -I "$(python -m envd.native --include)" myenv.c -o libmyenv.so
"""
import argparse
from pathlib import Path

INCLUDE_DIR = Path(__file__).resolve().parent / "include"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envd.native", allow_abbrev=False,
                                     description="Build information for envd plugins.")
    parser.add_argument("--include", action="store_true",
                        help="print the directory that holds envd.h")
    args = parser.parse_args(argv)
    if not args.include:
        parser.print_help()
        return 2
    print(INCLUDE_DIR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
