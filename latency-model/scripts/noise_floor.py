#!/usr/bin/env python3
"""How much of the latency models' held-out error is measurement noise.

Standard library only. Three subcommands:

  seed PROFILE HELDOUT OUT
      Writes to OUT every sample of PROFILE that is not in HELDOUT (the
      training rows). `tensile-latency profile --out OUT` then skips
      them as already done and re-times only the held-out shapes, with the
      same grid, loads and repeats as the shipped profile. The new rows are
      the lines after the seeded ones: `tail -n +N`.

  roofline-dir MODELS OUT
      A copy of the model directory MODELS without its ONNX models, so that
      `tensilectl latency eval --models OUT` scores every op type with the
      calibrated roofline (roofline.json) instead.

  table HELDOUT [RETIMED ...]
      Per op type, the disagreement of two medians of the same shape:
      the two load levels of one profile run (measured one after the
      other), the shipped held-out samples against each re-timing, and the
      re-timings against each other. Each cell is "pair / floor": pair is
      the mean absolute percentage error of one median used as the
      prediction of the other (averaged over both directions); floor
      estimates the MAPE of a predictor that knew each shape's true time,
      by shrinking the log difference of the pair by sqrt(2) (two
      independent errors of the same size add up to sqrt(2) times one).
"""

import json
import math
import shutil
import sys
from collections import defaultdict
from pathlib import Path


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def key(s):
    # The shape (every feature but the utilization) and the load level.
    return (s["op_type"], tuple(s["features"][1:]), s["load"])


def seed(profile, heldout, out):
    held = {key(s) for s in read(heldout)}
    n = 0
    with open(profile) as src, open(out, "w") as dst:
        for line in src:
            if line.strip() and key(json.loads(line)) not in held:
                dst.write(line)
                n += 1
    print(f"{n} training rows -> {out}; re-timed rows start at line {n + 1}")


def roofline_dir(models, out):
    models, out = Path(models), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((models / "manifest.json").read_text())
    manifest["models"] = []
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    for name in ("roofline", "heldout"):
        shutil.copy(models / manifest[name], out / manifest[name])
    print(f"{out}: the roofline of {models} alone")


def pair_stats(pairs):
    if not pairs:
        return None
    pair = floor = 0.0
    for a, b in pairs:
        pair += (abs(b / a - 1) + abs(a / b - 1)) / 2
        d = math.log(a / b) / math.sqrt(2)
        floor += (abs(math.exp(d) - 1) + abs(math.exp(-d) - 1)) / 2
    return 100 * pair / len(pairs), 100 * floor / len(pairs)


def table(heldout, retimed):
    runs = [{key(s): max(1, s["ns"]) for s in read(heldout)}]
    runs += [{key(s): max(1, s["ns"]) for s in read(p)} for p in retimed]
    shipped = runs[0]
    by_type = defaultdict(list)
    for k in shipped:
        by_type[k[0]].append(k)
    heads = ["load 0 vs 1, same run"]
    heads += [f"shipped vs re-time {i + 1}" for i in range(len(retimed))]
    heads += [
        f"re-time {i + 1} vs {j + 1}"
        for i in range(len(retimed))
        for j in range(i + 1, len(retimed))
    ]
    print("| op type | shapes | " + " | ".join(heads) + " |")
    print("| --- | ---: |" + " ---: |" * len(heads))
    for op in sorted(by_type):
        keys = by_type[op]
        cells = []
        loads = [
            (shipped[k], shipped[(k[0], k[1], 1)])
            for k in keys
            if k[2] == 0 and (k[0], k[1], 1) in shipped
        ]
        cells.append(pair_stats(loads))
        for run in runs[1:]:
            cells.append(pair_stats([(shipped[k], run[k]) for k in keys if k in run]))
        for i in range(1, len(runs)):
            for j in range(i + 1, len(runs)):
                cells.append(
                    pair_stats(
                        [(runs[i][k], runs[j][k]) for k in keys if k in runs[i] and k in runs[j]]
                    )
                )
        shapes = len({k[1] for k in keys})
        text = ["-" if c is None else f"{c[0]:.1f} / {c[1]:.1f}" for c in cells]
        print(f"| {op.removeprefix('aten::')} | {shapes} | " + " | ".join(text) + " |")


def main(argv):
    if len(argv) == 4 and argv[0] == "seed":
        seed(*argv[1:])
    elif len(argv) == 3 and argv[0] == "roofline-dir":
        roofline_dir(*argv[1:])
    elif len(argv) >= 2 and argv[0] == "table":
        table(argv[1], argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
