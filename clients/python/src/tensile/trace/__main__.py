"""``python -m tensile.trace``: trace one training iteration to a graph file.

    python -m tensile.trace --model torchvision:resnet50 --batch 16 --optimizer adam -o graph.json
    python -m tensile.trace --model tensile.trace.models:transformer_encoder \\
        --input-shape 128 --input-dtype i64 --batch 8 -o encoder.json

Exit status 0 on success, 1 with a one-line reason on stderr when the model
cannot be traced.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from tensile.trace import OPTIMIZERS, InputSpec, TraceError, trace_training_step
from tensile.trace.models import default_resolution, resolve

_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i64": torch.int64, "i32": torch.int32}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tensile.trace", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="torchvision:NAME or module:function returning an nn.Module")
    p.add_argument("--batch", type=int, default=16, help="batch size (default 16)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam", help="default adam, lr 0.001")
    p.add_argument("--lr", type=float, help="learning rate (default: the optimizer's in OPTIMIZERS)")
    p.add_argument("--resolution", type=int, help="image side (default 224, 299 for inception_v3)")
    p.add_argument(
        "--input-shape",
        help="per-sample input shape, comma-separated (default 3,R,R); e.g. 128 for 128 token ids",
    )
    p.add_argument("--input-dtype", choices=sorted(_DTYPES), default="f32")
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cpu",
        help="device whose ATen ops are recorded (default cpu; cuda needs a CUDA device for autograd, "
        "tensors stay fake and allocate nothing)",
    )
    p.add_argument("--name", help="graph name (default MODEL_bB_OPTIMIZER)")
    p.add_argument("-o", "--output", help="output file (default: stdout)")
    p.add_argument("--compact", action="store_true", help="one-line JSON")
    args = p.parse_args(argv)
    if args.batch < 1:
        p.error("--batch must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        name, factory = resolve(args.model, args.resolution)
        if args.input_shape:
            sample = tuple(int(d) for d in args.input_shape.split(","))
        else:
            r = args.resolution or default_resolution(name)
            sample = (3, r, r)
        inputs = [InputSpec("input", (args.batch, *sample), _DTYPES[args.input_dtype])]
        opt_cls, opt_kwargs = OPTIMIZERS[args.optimizer]
        opt_kwargs = dict(opt_kwargs)
        if args.lr is not None:
            opt_kwargs["lr"] = args.lr
        graph_name = args.name or f"{name}_b{args.batch}_{args.optimizer}"
        graph = trace_training_step(
            factory, opt_cls, inputs, optimizer_kwargs=opt_kwargs, name=graph_name, device=args.device
        )
    except TraceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(graph, separators=(",", ":")) if args.compact else json.dumps(graph, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    elapsed = time.perf_counter() - start
    produced = {t for op in graph["ops"] for t in op["outputs"]}
    params = [t for t in graph["tensors"] if t["kind"] == "parameter" and t["id"] not in produced]
    print(
        f"traced {graph_name}: {len(graph['ops'])} ops, {len(graph['tensors'])} tensors, "
        f"{len(params)} parameters in {elapsed:.1f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
