#!/usr/bin/env python3
"""The test executable in ``cargo test --no-run --message-format=json``'s
output (stdin): the one artifact built as a test. Exits 1 when there is
not exactly one."""

from __future__ import annotations

import json
import sys


def main() -> int:
    found = []
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("profile", {}).get("test") and msg.get("executable"):
            found.append(msg["executable"])
    if len(found) != 1:
        print(f"expected one test executable, cargo built {len(found)}: {found}", file=sys.stderr)
        return 1
    print(found[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
