"""What a CUDA process holds on its device beyond its tensors, measured.

Every CUDA process holds device memory no tensor accounts for: its CUDA
context, library workspaces (cuBLAS, cuDNN), and the caching allocator's
blocks reserved but not allocated. On an H200 that was 0.9 to 1.5 GB a
training process, where a device profile's constant says 671 MB. The hook
measures it over one step after its first ones, and again a few steps
after each plan switch (with the allocator's cache given back first, so
that blocks an earlier plan reserved do not count): the device memory the
driver counts for this process (NVML's per-process figure, through
``cuda.bindings``, which PyTorch's CUDA wheels install) less the most its
tensors held at the step's points, and reports it so that the scheduler
plans that figure inside the budget instead of the profile's.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def process_device_bytes(device: torch.device, nvml: Any = None) -> tuple[int | None, str]:
    """The bytes this process uses on ``device`` as the driver counts them,
    and why not when it cannot say (``None``): no NVML (no driver library, no
    ``cuda.bindings``), or the process not listed on that device.
    ``nvml`` stands in for ``cuda.bindings.nvml`` in tests."""
    if nvml is None:
        try:
            from cuda.bindings import nvml as found
        except ImportError as e:
            return None, f"cuda.bindings is not installed ({e})"
        nvml = found
    try:
        nvml.init_v2()
    except Exception as e:  # the driver's library is missing or refuses: said, never raised
        return None, f"NVML is not available ({type(e).__name__}: {e})"
    try:
        props = torch.cuda.get_device_properties(device)
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        handle = nvml.device_get_handle_by_pci_bus_id_v2(bus)
        infos = nvml.device_get_compute_running_processes_v3(handle)
        pid = os.getpid()
        for p, used in zip(_column(infos, "pid"), _column(infos, "used_gpu_memory")):
            if int(p) == pid:
                return int(used), ""
        return None, f"NVML lists no compute process {pid} on the device at {bus}"
    except Exception as e:
        return None, f"NVML could not say ({type(e).__name__}: {e})"
    finally:
        try:
            nvml.shutdown()
        except Exception:
            pass


def _column(infos: Any, field: str) -> list[Any]:
    """One field of NVML's process records: an array of them or a single one."""
    value = getattr(infos, field)
    try:
        return list(value)
    except TypeError:
        return [value]


def base_bytes(device: torch.device, nvml: Any = None) -> tuple[int | None, str]:
    """The process's device memory outside its tensors: what the driver
    counts for it less what PyTorch's allocator has allocated (the
    allocator's reserved slack, the context and workspaces stay in)."""
    used, why = process_device_bytes(device, nvml)
    if used is None:
        return None, why
    return max(0, used - torch.cuda.memory_allocated(device)), ""
