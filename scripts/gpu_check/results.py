#!/usr/bin/env python3
"""The GPU check's results folder: one file per step, written as it goes.

* ``STEP.rows.jsonl``: the step's rows, appended as each one ends (an id
  each; a rerun of an unfinished step skips the ids already there).
* ``STEP.json``: the step's result, written when it ends (ok, failed or
  skipped, with a reason). Its presence marks the step done.
* ``meta.json``: the machine, the commit and the mode (a dry run or a GPU
  run), so that a dry run's results are never mixed with a GPU run's.

Used by the other scripts here (``import results``) and from bash:

    results.py row DIR STEP ID [--status S] [--reason R] [--set KEY=VALUE ...]
    results.py has DIR STEP ID          # exit 0 when the row exists
    results.py finish DIR STEP --seconds S [--error MESSAGE]
    results.py status DIR STEP          # prints ok / failed / skipped / absent
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def rows_path(root: Path, step: str) -> Path:
    return root / f"{step}.rows.jsonl"


def result_path(root: Path, step: str) -> Path:
    return root / f"{step}.json"


def read_rows(root: Path, step: str) -> list[Row]:
    path = rows_path(root, step)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a kill: that row is run again
    return rows


def has_row(root: Path, step: str, row_id: str) -> bool:
    return any(r.get("id") == row_id for r in read_rows(root, step))


def row_of(root: Path, step: str, row_id: str) -> Row | None:
    found = [r for r in read_rows(root, step) if r.get("id") == row_id]
    return found[-1] if found else None


def add_row(root: Path, step: str, row: Row) -> None:
    """Appends one row, flushed to disk at once (a kill loses nothing before it)."""
    if "id" not in row:
        raise ValueError("a row needs an id")
    row.setdefault("status", "ok")
    root.mkdir(parents=True, exist_ok=True)
    with rows_path(root, step).open("a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_result(root: Path, step: str) -> Row | None:
    path = result_path(root, step)
    if not path.exists():
        return None
    return json.loads(path.read_text())


def finish(root: Path, step: str, seconds: float, error: str | None = None) -> Row:
    """Writes ``STEP.json`` from the rows: failed when ``error`` is given or
    any row failed, skipped when every row was skipped (or there are none),
    else ok."""
    rows = read_rows(root, step)
    statuses = {r.get("status", "ok") for r in rows}
    if error:
        status, reason = "failed", error
    elif "failed" in statuses:
        failed = [r for r in rows if r.get("status") == "failed"]
        status, reason = "failed", "; ".join(f"{r['id']}: {r.get('reason', 'failed')}" for r in failed)
    elif not rows or statuses == {"skipped"}:
        reasons = sorted({r.get("reason", "") for r in rows} - {""})
        status, reason = "skipped", "; ".join(reasons) or "nothing to run"
    else:
        skipped = [r for r in rows if r.get("status") == "skipped"]
        status = "ok"
        reason = "; ".join(f"{r['id']} skipped: {r.get('reason', '')}" for r in skipped)
    result = {
        "step": step,
        "status": status,
        "reason": reason,
        "seconds": round(seconds, 1),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    tmp = result_path(root, step).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    tmp.replace(result_path(root, step))
    return result


def deadline() -> float:
    """When this run must stop (``GPU_CHECK_DEADLINE``, Unix seconds)."""
    return float(os.environ.get("GPU_CHECK_DEADLINE", "inf"))


def time_left() -> float:
    return deadline() - time.time()


class OutOfTime(Exception):
    """Too little of this run's time is left to start the next row."""


def need_time(seconds: float, what: str) -> None:
    """Raises :class:`OutOfTime` when less than ``seconds`` are left."""
    left = time_left()
    if left < seconds:
        raise OutOfTime(f"{left:.0f} s left, {what} needs about {seconds:.0f} s: rerun to resume")


#: Exit status of a step that stopped for want of time (rerun to resume).
INCOMPLETE = 3


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row")
    r.add_argument("dir", type=Path)
    r.add_argument("step")
    r.add_argument("id")
    r.add_argument("--status", default="ok", choices=["ok", "failed", "skipped"])
    r.add_argument("--reason", default="")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    h = sub.add_parser("has")
    h.add_argument("dir", type=Path)
    h.add_argument("step")
    h.add_argument("id")
    f = sub.add_parser("finish")
    f.add_argument("dir", type=Path)
    f.add_argument("step")
    f.add_argument("--seconds", type=float, required=True)
    f.add_argument("--error")
    s = sub.add_parser("status")
    s.add_argument("dir", type=Path)
    s.add_argument("step")
    a = p.parse_args(argv)
    if a.cmd == "row":
        row: Row = {"id": a.id, "status": a.status}
        if a.reason:
            row["reason"] = a.reason
        for kv in a.set:
            key, sep, value = kv.partition("=")
            if not sep:
                p.error(f"--set {kv!r}: expected KEY=VALUE")
            row[key] = _value(value)
        add_row(a.dir, a.step, row)
        return 0
    if a.cmd == "has":
        return 0 if has_row(a.dir, a.step, a.id) else 1
    if a.cmd == "finish":
        result = finish(a.dir, a.step, a.seconds, a.error)
        print(result["status"] + (f": {result['reason']}" if result["reason"] else ""))
        return 0
    result = read_result(a.dir, a.step)
    print("absent" if result is None else result["status"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
