"""Tracing the path eager PyTorch takes, not the one a library keeps for tracers.

``tensile.apply`` checks the ops eager PyTorch runs against the traced ones,
so the trace must take the path eager mode takes. Two things steer a model
elsewhere under fake tensors:

* **Libraries that ask whether they are traced.** Hugging Face transformers
  skips its data-dependent fast paths when a tensor is a ``FakeTensor``
  (``transformers.utils.import_utils.is_tracing``): with an attention mask
  of ones, or no mask, eager mode reads the mask (``padding_mask.all()``) or
  the positions (``find_packed_sequence_indices``) and leaves the mask out
  (SDPA's ``is_causal``), while a tracer gets an explicit mask built from
  some twenty ops that eager never runs. :func:`eager_library_paths` makes
  such checks see eager mode while the tracer runs.
* **Values the model reads.** Taking eager's path means reading what eager
  reads, which a fake tensor has no data for. :class:`Shadows` computes, on
  real tensors beside the fake ones, every value that derives only from the
  example batch's real values, from real constants and from factories
  (``arange``, ``ones``...): ``.item()``, ``bool()``, ``torch.equal`` of
  such a tensor get the value eager mode would get for this batch. Anything
  that depends on a parameter, on randomness, or on a tensor above
  :data:`LIMIT` elements has no shadow, and reading it stays the tracer's
  one-line refusal (data-dependent control flow).

A plan traced this way holds for batches that take the same path (a batch
with padding where the example had none takes another, and the hook then
refuses it naming the first op that differs). Shadows are computed with
every dispatch mode off, never on the user's tensors (the batch is cloned),
and never run a random op, so tracing draws nothing from the user's RNG.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakTensorKeyDictionary

#: Tensors with more elements than this get no shadow: the values models
#: branch on are masks, positions and counts, and a shadow costs real memory.
LIMIT = 1 << 22

#: Ops that hand a tensor's value to Python.
_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
}


@contextlib.contextmanager
def eager_library_paths() -> Iterator[None]:
    """Libraries' "am I traced?" checks answer as in eager mode while tracing.

    Hugging Face transformers asks ``is_fake_tensor`` inside its
    ``is_tracing``; the module global is looked up at each call, so
    replacing it for the duration of the trace is enough. Libraries not
    imported are left alone."""
    hf = sys.modules.get("transformers.utils.import_utils")
    original = getattr(hf, "is_fake_tensor", None)
    if original is None:
        yield
        return
    hf.is_fake_tensor = _never_fake  # type: ignore[union-attr]
    try:
        yield
    finally:
        hf.is_fake_tensor = original  # type: ignore[union-attr]


def _never_fake(x: Any) -> bool:
    return False


class Shadows(TorchDispatchMode):
    """Real values beside fake tensors, for the values a model reads (see module docs)."""

    def __init__(self) -> None:
        super().__init__()
        self.values: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        #: Fake storages written by an op without a shadow: their shadows are stale.
        self.stale: set[int] = set()
        #: Reads answered from shadows (for the tracer's tests and messages).
        self.reads = 0

    def give(self, fake: torch.Tensor, real: torch.Tensor) -> None:
        """``real`` (cloned) is the value of ``fake``, an input of the trace."""
        if real.numel() <= LIMIT and real.shape == fake.shape and real.dtype == fake.dtype:
            with _disable_current_modes():
                self.values[fake] = real.detach().clone()

    def shadow(self, t: torch.Tensor) -> torch.Tensor | None:
        if not isinstance(t, FakeTensor):
            return t  # a real constant (torch.tensor(...) before it is lifted)
        real = self.values.get(t)
        if real is None or _storage_key(t) in self.stale:
            return None
        return real

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _READS:
            real = self._real_args(args, kwargs)
            if real is not None:
                self.reads += 1
                with _disable_current_modes():
                    return func(*real[0], **real[1])
        out = func(*args, **kwargs)
        self._follow(func, args, kwargs, out)
        return out

    def _follow(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        written = _written(func, args, kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, FakeTensor)]
        real = None
        if (
            torch.Tag.nondeterministic_seeded not in func.tags
            and all(isinstance(t, FakeTensor) for t in written)
            and all(t.numel() <= LIMIT for t in outs)
        ):
            real = self._real_args(args, kwargs)
        if real is None:
            for t in written:
                if isinstance(t, FakeTensor):
                    self.stale.add(_storage_key(t))
            return
        try:
            with _disable_current_modes():
                real_out = func(*real[0], **real[1])
        except Exception:  # noqa: BLE001 - no shadow then; a later read is refused as before
            for t in written:
                self.stale.add(_storage_key(t))
            return
        pairs = zip(tree_flatten(out)[0], tree_flatten(real_out)[0])
        for fake, value in pairs:
            if isinstance(fake, FakeTensor) and isinstance(value, torch.Tensor):
                self.values[fake] = value

    def _real_args(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """The call's arguments with each tensor replaced by its shadow, or
        None when a tensor has none."""
        missing = False

        def real(x: Any) -> Any:
            nonlocal missing
            if isinstance(x, torch.Tensor):
                s = self.shadow(x)
                if s is None:
                    missing = True
                return s
            return x

        mapped = tree_map(real, (args, kwargs))
        return None if missing else mapped


def _written(func: Any, args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensor arguments an op writes (``Tensor(a!)``, ``out=``)."""
    found = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        found += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
    return found


def _storage_key(t: torch.Tensor) -> int:
    # Compared while the tensor is alive; a reused address can only make a
    # shadow look stale (a read then refused), never give a wrong value.
    return t.untyped_storage()._cdata
