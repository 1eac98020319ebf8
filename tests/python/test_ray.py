"""`tensile.ray` on a real multi-node Ray cluster (issue 22, part 2).

One `ray.cluster_utils.Cluster` on this host: a head without GPUs and two
nodes of two logical GPUs each, every node on 127.0.0.1
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`), with Ray's and the schedulers'
files under a short folder of the module's own. `tensile.ray.start()` runs
a real `tensile-scheduler` per (node, GPU). The proofs:

* eight `num_gpus=0.5` training tasks fill the four GPUs; each trains a
  small model through the hook against the scheduler of its own (node,
  GPU): the address it was given is that node's socket for the GPU Ray gave
  it (Ray's placement seen independently: the task's process is a child of
  its node's raylet, and Ray set its CUDA_VISIBLE_DEVICES), that scheduler
  lists its job and no other scheduler does, and the budgets on a GPU are
  half its memory each, adding up to at most the memory;
* one node is removed while its four tasks hold mid-run: its schedulers
  exit with it, the tasks are retried on the other node and register with
  the schedulers there, and every task's final parameters are bit-identical
  to plain training of the same model and seed without the hook;
* a node that joins later is covered by calling `start()` again, which
  keeps the running schedulers; `stop()` ends them, and a restart with
  `memory_mb` gives a quarter-GPU task a quarter of it;
* the errors: outside Ray, in the driver, in a task without a GPU, before
  `start()`, a missing binary, a socket path too long, other settings;
* cleanup leaves no `tensile-scheduler` process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Ray reads this when it is imported: with it, every node takes 127.0.0.1 as its address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import pytest  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import tensile  # noqa: E402
import tensile.ray  # noqa: E402

# The tasks below are shipped to Ray's workers by value: they cannot import this file.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: The harness's build; else the nodes find the binary themselves (PATH, the venv's scripts).
SCHEDULER = os.environ.get("TENSILE_SCHEDULER") or None
A6000_BYTES = 51_527_024_640  # the a6000 profile's memory
STEPS = 4
TASKS = 8

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------
# The training every task does, and plain training to compare with


def make_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + seed)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(STEPS)]


def train(model, optimizer, data, between=None) -> list[torch.Tensor]:
    for i, (x, y) in enumerate(data):
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if between is not None:
            between(i)
    return [p.detach().clone() for p in model.parameters()]


def plain(seed: int) -> list[torch.Tensor]:
    model, optimizer = make_model(seed)
    return train(model, optimizer, batches(seed))


def wait_for(what: str, check, timeout_s: float = 60.0, every_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def fractional_task(index: int, hold_dir: str) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """One training run on half a GPU: plans with its GPU's scheduler
    within its budget, trains through the hook as that scheduler's job,
    and after its first step writes a marker and holds until `hold_dir/go`
    exists."""
    torch.set_num_threads(1)
    context = ray.get_runtime_context()
    seen: dict[str, Any] = {
        "index": index,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "node": context.get_node_id(),
        "gpu": context.get_accelerator_ids()["GPU"],
        "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "address": tensile.ray.scheduler_address(),
        "budget_mb": tensile.ray.budget_mb(),
        "share": tensile.ray.gpu_share(),
    }
    model, optimizer = make_model(index)
    data = batches(index)
    plan = tensile.plan(
        model,
        optimizer,
        data[0],
        F.cross_entropy,
        server=seen["address"],
        budget_mb=seen["budget_mb"],
        workdir=Path(hold_dir, "plans", f"{index}-{os.getpid()}"),
    )
    with tensile.apply(plan, model, optimizer, name=f"task{index}") as hook:
        session = hook.session

        def between(i: int) -> None:
            if i != 0:
                return
            wait_for("the job's registration", lambda: session.job is not None)
            seen["job"] = session.job.id
            with tensile.Client(seen["address"], timeout_s=10) as client:
                seen["listed"] = sorted([j.job_id, j.name] for j in client.status().jobs)
            marker = Path(hold_dir, f"{index}-{os.getpid()}.json")
            marker.with_suffix(".tmp").write_text(json.dumps(seen))
            marker.with_suffix(".tmp").rename(marker)
            wait_for("the go file", lambda: Path(hold_dir, "go").exists(), timeout_s=300, every_s=0.05)

        params = train(model, optimizer, data, between)
    return seen, params


def quarter_task() -> tuple[str, int, float]:
    return tensile.ray.scheduler_address(), tensile.ray.budget_mb(), tensile.ray.gpu_share()


def address_task() -> str:
    return tensile.ray.scheduler_address()


# ---------------------------------------------------------------------------
# Processes


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def schedulers_under(root: str) -> list[int]:
    """Live tensile-scheduler processes whose command line names `root`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"tensile-scheduler")
            and any(root.encode() in a for a in argv)
            and alive(int(entry.name))
        ):
            found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------------
# Without a cluster


def test_outside_ray_every_call_says_ray_is_not_initialized():
    if ray.is_initialized():
        pytest.skip("Ray is connected in this process already")
    for call in (tensile.ray.scheduler_address, tensile.ray.budget_mb, tensile.ray.start, tensile.ray.stop):
        with pytest.raises(tensile.ray.TensileRayError, match=r"Ray is not initialized \(ray.init\(\) first\)"):
            call()


def test_the_binary_is_the_argument_else_the_environment_else_path(monkeypatch, tmp_path):
    fake = tmp_path / "bin" / "tensile-scheduler"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TENSILE_SCHEDULER_BIN", str(fake))
    assert tensile.ray.find_scheduler_binary() == str(fake)
    with pytest.raises(tensile.ray.TensileRayError, match=r"^binary=/nowhere/x is not an executable file$"):
        tensile.ray.find_scheduler_binary("/nowhere/x")
    monkeypatch.setenv("TENSILE_SCHEDULER_BIN", str(tmp_path))
    with pytest.raises(tensile.ray.TensileRayError, match="TENSILE_SCHEDULER_BIN=.* is not an executable file"):
        tensile.ray.find_scheduler_binary()
    monkeypatch.delenv("TENSILE_SCHEDULER_BIN")
    monkeypatch.setenv("PATH", str(fake.parent))
    assert tensile.ray.find_scheduler_binary() == str(fake)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(tensile.ray.sysconfig, "get_path", lambda name: str(tmp_path / "no-scripts"))
    with pytest.raises(tensile.ray.TensileRayError, match="tensile-scheduler not found: pass binary="):
        tensile.ray.find_scheduler_binary()


LAUNCHER = """
import sys, time
import tensile.ray as tr
procs = tr.launch_schedulers(sys.argv[1], ["0", "1"], sys.argv[2], device="a6000", budget_mb=1000)
print(" ".join(str(p.pid) for p in procs.values()), flush=True)
time.sleep(600)
"""


def test_launched_schedulers_die_with_the_process_that_launched_them(tmp_path):
    """What keeps a removed node from leaving schedulers behind: the
    launcher is killed with SIGKILL (no cleanup of its own runs) and its
    schedulers exit all the same."""
    binary = tensile.ray.find_scheduler_binary(SCHEDULER)
    folder = tempfile.mkdtemp(prefix="trl", dir="/tmp")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, binary, folder], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = [int(p) for p in launcher.stdout.readline().split()]
        assert len(pids) == 2
        wait_for("both sockets", lambda: all(Path(folder, f"gpu{g}.sock").exists() for g in "01"))
        assert all(alive(p) for p in pids)
        with tensile.Client(f"unix:{folder}/gpu1.sock", timeout_s=10) as client:
            assert client.status().memory.budget_bytes == 1000 * 10**6
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        wait_for("the schedulers to exit", lambda: not any(alive(p) for p in pids), timeout_s=20)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stdout.close()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        subprocess.run(["rm", "-rf", folder], check=False)


# ---------------------------------------------------------------------------
# The cluster


class RayCluster:
    """The cluster the remaining tests share, and where its files go."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="tr", dir="/tmp")  # short: Unix socket paths
        self.sockets = os.path.join(self.root, "s")
        if ray._private.ray_constants.ENABLE_RAY_CLUSTER:
            pytest.fail(
                "Ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set: the nodes would leave loopback"
            )
        self.saved = {"RAY_TMPDIR": os.environ.get("RAY_TMPDIR")}
        # Ray's files (ray_current_cluster too) in our folder, not a shared /tmp/ray.
        os.environ["RAY_TMPDIR"] = self.root
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "num_gpus": 0, "temp_dir": os.path.join(self.root, "ray")},
        )
        self.gpu_nodes = [self.cluster.add_node(num_cpus=2, num_gpus=2) for _ in range(2)]
        ray.init(address=self.cluster.address)

    def start(self, **kwargs: Any) -> list[tensile.ray.NodeSchedulers]:
        settings: dict[str, Any] = {"device": "a6000", "binary": SCHEDULER, "socket_root": self.sockets}
        return tensile.ray.start(**(settings | kwargs))

    def raylet_pids(self) -> dict[int, str]:
        """Each worker node's raylet process id: its tasks' processes are its children."""
        return {n.all_processes["raylet"][0].process.pid: n.node_id for n in self.cluster.worker_nodes}

    def shutdown(self) -> None:
        try:
            if ray.is_initialized():
                tensile.ray.stop()
        finally:
            ray.shutdown()
            self.cluster.shutdown()
            for k, v in self.saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="module")
def cluster():
    c = RayCluster()
    try:
        yield c
    finally:
        c.shutdown()
        # Nothing outlives the cluster: no scheduler under our folder is left.
        wait_for("every tensile-scheduler to exit", lambda: not schedulers_under(c.root), timeout_s=30)
        subprocess.run(["rm", "-rf", c.root], check=False)


def test_the_cluster_is_on_loopback(cluster):
    alive_nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive_nodes) == 3
    assert {n["NodeManagerAddress"] for n in alive_nodes} == {"127.0.0.1"}


def test_errors_name_what_is_wrong(cluster):
    tensile.ray.stop()
    with pytest.raises(
        tensile.ray.TensileRayError, match=r"scheduler_address\(\) runs inside a Ray task .*this is the driver"
    ):
        tensile.ray.scheduler_address()
    # Not started yet: the task is told to have the driver call start().
    with pytest.raises(
        tensile.ray.TensileRayError, match=r"no TENSILE schedulers on node [0-9a-f]+: call tensile.ray.start\(\)"
    ):
        ray.get(ray.remote(num_gpus=0.5, num_cpus=0, max_retries=0)(address_task).remote(), timeout=120)
    # A task without a GPU share.
    with pytest.raises(tensile.ray.TensileRayError, match="this task holds no GPU; ask Ray for a share of one"):
        ray.get(ray.remote(num_cpus=0, max_retries=0)(address_task).remote(), timeout=120)
    # Bad settings, and a binary the nodes do not have: nothing is left running.
    with pytest.raises(tensile.ray.TensileRayError, match="memory_mb must be a positive whole number"):
        cluster.start(memory_mb=0)
    with pytest.raises(
        tensile.ray.TensileRayError,
        match=r"node [0-9a-f]+: binary=/nowhere/tensile-scheduler is not an executable file",
    ):
        tensile.ray.start(binary="/nowhere/tensile-scheduler", socket_root=cluster.sockets)
    long_root = os.path.join(cluster.root, "x" * 90)
    with pytest.raises(tensile.ray.TensileRayError, match="is 1[0-9][0-9] bytes, over the 107 a Unix socket takes"):
        cluster.start(socket_root=long_root)
    assert not schedulers_under(cluster.root)
    try:
        started = cluster.start()
        assert len(started) == 2 and all(len(n.pids) == 2 for n in started)
        with pytest.raises(
            tensile.ray.TensileRayError, match=r"other settings \(device='a6000'\): call tensile.ray.stop\(\) first"
        ):
            cluster.start(device="h100")
    finally:
        tensile.ray.stop()
    assert not schedulers_under(cluster.root)


def test_stop_ends_the_schedulers_and_memory_mb_sets_each_gpus_memory(cluster):
    first = {n.node_id: n for n in cluster.start()}
    pids = [p for n in first.values() for p in n.pids.values()]
    assert all(alive(p) for p in pids) and len(pids) == 4
    assert sorted(tensile.ray.stop()) == sorted(first)
    wait_for("the stopped schedulers to exit", lambda: not any(alive(p) for p in pids), timeout_s=20)
    assert tensile.ray.nodes() == []
    assert not any(os.path.exists(n.socket_dir) for n in first.values())
    try:
        again = {n.node_id: n for n in cluster.start(memory_mb=8000)}
        assert set(again) == set(first)
        assert all(set(n.memory_bytes.values()) == {8000 * 10**6} for n in again.values())
        assert all(again[k].socket_dir != first[k].socket_dir for k in again)
        quarter = ray.remote(num_gpus=0.25, num_cpus=0, max_retries=0)(quarter_task)
        address, budget, share = ray.get(quarter.remote(), timeout=120)
        assert (budget, share) == (2000, 0.25)
        assert any(address in (n.address(g) for g in n.gpus) for n in again.values()), address

        # A node's schedulers killed: its tasks are told, and start() starts them again.
        node = next(iter(again.values()))
        for pid in node.pids.values():
            os.kill(pid, signal.SIGKILL)
        wait_for("the killed schedulers to exit", lambda: not any(alive(p) for p in node.pids.values()))
        pinned = ray.remote(num_gpus=0.5, num_cpus=0, max_retries=0)(address_task).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
        )
        with pytest.raises(
            tensile.ray.TensileRayError,
            match=rf"the scheduler of GPU [01] on node {node.node_id} has exited \(its log: \S+/gpu[01].log\); "
            r"tensile.ray.start\(\) starts it again",
        ):
            ray.get(pinned.remote(), timeout=120)
        restarted = {n.node_id: n for n in cluster.start(memory_mb=8000)}
        assert restarted[node.node_id].socket_dir == node.socket_dir
        assert all(alive(p) and p not in node.pids.values() for p in restarted[node.node_id].pids.values())
        assert all(dict(restarted[k].pids) == dict(again[k].pids) for k in again if k != node.node_id)
        assert ray.get(pinned.remote(), timeout=120).startswith(f"unix:{node.socket_dir}/gpu")
    finally:
        tensile.ray.stop()


def test_fractional_tasks_share_gpus_and_survive_a_node_removal(cluster, tmp_path):
    started = {n.node_id: n for n in cluster.start()}
    assert set(started) == {n.node_id for n in cluster.gpu_nodes}  # the head has no GPU: no schedulers
    for n in started.values():
        assert n.gpus == ("0", "1") and n.device == "a6000"
        assert dict(n.memory_bytes) == {"0": A6000_BYTES, "1": A6000_BYTES}
        assert all(Path(n.address(g)[len("unix:") :]).exists() for g in n.gpus)
    again = {n.node_id: n for n in cluster.start()}  # idempotent: the same processes
    assert {k: dict(v.pids) for k, v in again.items()} == {k: dict(v.pids) for k, v in started.items()}
    raylets = cluster.raylet_pids()
    expected = [plain(i) for i in range(TASKS)]

    task = ray.remote(num_gpus=0.5, num_cpus=0.5, max_retries=2)(fractional_task)
    hold = tmp_path / "hold"
    hold.mkdir()
    refs = [task.remote(i, str(hold)) for i in range(TASKS)]
    try:
        # All eight run at once (the four GPUs hold two halves each) and hold after their first step.
        markers = wait_for(
            "every task's first step",
            lambda: (m := sorted(hold.glob("*.json"))) and len(m) == TASKS and m,
            timeout_s=180,
        )
        first = [json.loads(p.read_text()) for p in markers]
        assert sorted(s["index"] for s in first) == list(range(TASKS))
        by_gpu: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for s in first:
            (gpu,) = s["gpu"]
            assert raylets[s["ppid"]] == s["node"], s  # Ray placed it on the node it says
            assert s["cuda_visible"] == gpu, s  # and gave it the GPU it says
            assert s["address"] == started[s["node"]].address(gpu)
            assert [s["job"], f"task{s['index']}"] in s["listed"], s
            by_gpu.setdefault((s["node"], gpu), []).append(s)
        assert len(by_gpu) == 4 and all(len(v) == 2 for v in by_gpu.values()), by_gpu
        for (node, gpu), tasks in by_gpu.items():
            memory_mb = started[node].memory_bytes[gpu] // 10**6
            assert all(t["share"] == 0.5 and t["budget_mb"] == A6000_BYTES // 2 // 10**6 for t in tasks)
            assert sum(t["budget_mb"] for t in tasks) <= memory_mb
            # The scheduler of this (node, GPU) lists exactly its two tasks' jobs; no other does.
            with tensile.Client(started[node].address(gpu), timeout_s=10) as client:
                names = sorted(j.name for j in client.status().jobs)
            assert names == sorted(f"task{t['index']}" for t in tasks)

        # Remove the second node while its four tasks hold mid-run.
        gone = cluster.gpu_nodes[1]
        kept = cluster.gpu_nodes[0].node_id
        on_gone = {s["index"]: s for s in first if s["node"] == gone.node_id}
        assert len(on_gone) == 4
        cluster.cluster.remove_node(gone)
        gone_schedulers = list(started[gone.node_id].pids.values())
        wait_for("the removed node's tasks to die", lambda: not any(alive(s["pid"]) for s in on_gone.values()))
        wait_for("the removed node's schedulers to exit", lambda: not any(alive(p) for p in gone_schedulers), 30)
        (hold / "go").touch()
        results = ray.get(refs, timeout=240)
    finally:
        (hold / "go").touch()

    for i, (seen, params) in enumerate(results):
        assert seen["index"] == i
        want = expected[i]
        assert len(params) == len(want)
        for k, (a, b) in enumerate(zip(want, params, strict=True)):
            assert torch.equal(a, b), f"task {i}: parameter {k} differs from plain training"
        (gpu,) = seen["gpu"]
        assert seen["address"] == started[seen["node"]].address(gpu)
        assert [seen["job"], f"task{i}"] in seen["listed"], seen
        if i in on_gone:
            # Retried on the node that is left, and registered with its scheduler there.
            assert seen["node"] == kept and seen["pid"] != on_gone[i]["pid"]
            assert len(list(hold.glob(f"{i}-*.json"))) == 2
        else:
            assert seen["pid"] == next(s["pid"] for s in first if s["index"] == i)
    assert {n.node_id for n in tensile.ray.nodes()} == {kept}

    # A node that joins later is covered by calling start() again; the running schedulers stay.
    joined = cluster.cluster.add_node(num_cpus=1, num_gpus=1)
    now = {n.node_id: n for n in cluster.start()}
    assert set(now) == {kept, joined.node_id}
    assert dict(now[kept].pids) == dict(started[kept].pids)
    assert now[joined.node_id].gpus == ("0",) and all(now[joined.node_id].pids.values())
    tensile.ray.stop()
    pids = [p for n in now.values() for p in n.pids.values()]
    wait_for("the stopped schedulers to exit", lambda: not any(alive(p) for p in pids), timeout_s=20)
