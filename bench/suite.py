"""The whole comparison in one run: the same as `envd bench` (see src/envd/tools/bench.py).

    python bench/suite.py [--quick] [--out DIR] [--seconds S] [--rounds R] [--sizes N ...]
"""
import sys

from envd.tools.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
