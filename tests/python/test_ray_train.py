"""The hook under Ray Train: a `TorchTrainer` of two CPU workers whose
training loop wraps its model with `ray.train.torch.prepare_model`
(DistributedDataParallel over gloo) and applies a `tensile.plan` to it, as a
user would, ends with parameters bit-identical to the same trainer without
the hook, on both workers. Ray runs in a process of its own (it is
initialized once per process, and the cluster tests start their own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = sys.argv[1]

    def loop(config):
        import hashlib
        import ray.train
        import torch, torchvision
        from torch.nn import functional as F
        from ray.train.torch import prepare_model
        import tensile

        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = prepare_model(torchvision.models.resnet18(num_classes=10))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        rank = ray.train.get_context().get_world_rank()
        g = torch.Generator().manual_seed(10 + rank)
        data = [(torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(3)]
        hook = None
        ctx = None
        if config["hooked"]:
            plan = tensile.plan(model, optimizer, data[0], F.cross_entropy)
            ctx = tensile.apply(plan, model, optimizer)
            hook = ctx.__enter__()
        for x, y in data:
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
        row = {"digest": digest, "modes": [s.mode for s in hook.stats] if hook else [],
               "swaps": [s.swap_outs for s in hook.stats] if hook else []}
        with open(os.path.join(config["out"], f"{int(config['hooked'])}-{rank}.json"), "w") as f:
            json.dump(row, f)

    ray.init(num_cpus=2, include_dashboard=False)
    for hooked in (False, True):
        TorchTrainer(
            loop,
            train_loop_config={"hooked": hooked, "out": out},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(storage_path=tempfile.mkdtemp(), name=f"hooked{int(hooked)}"),
        ).fit()
    ray.shutdown()
    """
)


def test_a_ray_train_job_through_prepare_model_trains_bit_identically_with_the_hook(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TENSILECTL": os.environ.get("TENSILECTL", str(ROOT / "target" / "debug" / "tensilectl"))}
    run = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = {(h, r): json.loads((tmp_path / f"{h}-{r}.json").read_text()) for h in (0, 1) for r in (0, 1)}
    for rank in (0, 1):
        assert rows[(1, rank)]["modes"] == ["checked", "fast", "fast"], rows[(1, rank)]
        assert all(n > 0 for n in rows[(1, rank)]["swaps"]), "a step moved nothing: the hook was tested on nothing"
        assert rows[(1, rank)]["digest"] == rows[(0, rank)]["digest"], f"rank {rank} differs with the hook"
    # The all-reduce ran: both workers hold the same parameters.
    assert rows[(1, 0)]["digest"] == rows[(1, 1)]["digest"]
