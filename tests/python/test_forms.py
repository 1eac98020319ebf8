"""The table of op forms (``tensile/hook/forms.py``): the traced form and
the form eager runs are the same op, and a really different op is not."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import tensile
from tensile.hook import forms

SAME = [
    # (traced, ran, form)
    (("aten::lift_fresh_copy", "default"), ("aten::lift_fresh", "default"), "view copy"),
    (("aten::view_copy", "default"), ("aten::view", "default"), "view copy"),
    (("aten::transpose_copy", "int"), ("aten::transpose", "int"), "view copy"),
    (("aten::select_copy", "int"), ("aten::select", "int"), "view copy"),
    (("aten::relu_", "default"), ("aten::relu", "default"), "in place"),
    (("aten::add", "Tensor"), ("aten::add_", "Tensor"), "in place"),
    (("aten::_unsafe_view", "default"), ("aten::view", "default"), "renamed view"),
    (("aten::view_copy", "default"), ("aten::_unsafe_view", "default"), "view copy"),
]

DIFFERENT = [
    (("aten::relu_", "default"), ("aten::gelu", "default")),  # another activation
    (("aten::add_", "Tensor"), ("aten::sub", "Tensor")),
    (("aten::index_copy", "default"), ("aten::index", "Tensor")),  # index is not a view
    (("aten::bernoulli_", "float"), ("aten::bernoulli", "p")),  # another overload
    (("aten::view", "default"), ("aten::reshape", "default")),  # reshape may copy
    (("aten::lift_fresh_copy", "default"), ("aten::clone", "default")),
    (("aten::_to_copy", "default"), ("aten::to", "dtype")),
    (("aten::mm", "default"), ("aten::mm_", "default")),  # no such in-place op
]


@pytest.mark.parametrize("traced, ran, form", SAME)
def test_forms_of_the_same_op_match(traced, ran, form):
    assert forms.same_op(traced, ran) and forms.same_op(ran, traced)
    assert forms.form_of(traced, ran) == form


@pytest.mark.parametrize("traced, ran", DIFFERENT)
def test_different_ops_do_not_match(traced, ran):
    assert not forms.same_op(traced, ran)
    assert forms.form_of(traced, ran) is None


def test_every_form_is_named_in_the_table():
    names = {f.name for f in forms.FORMS}
    assert {form for _, _, form in SAME} == names


def test_an_op_is_its_own_plain_form():
    assert forms.what(("aten::lift_fresh_copy", "default")) == ("aten::lift_fresh", "default")
    assert forms.what(("aten::mm", "default")) == ("aten::mm", "default")
    assert forms.what(("custom::thing_copy", "default")) == ("custom::thing_copy", "default")


class Cached(nn.Module):
    """A constant made in forward (``torch.tensor``), as a key/value cache
    starts: traced as lift_fresh_copy, run as lift_fresh."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = torch.tensor([])
        h = torch.cat([start, self.a(x).flatten()]).view_as(x)
        return self.head(torch.relu(h))


class CachedGelu(Cached):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = torch.tensor([])
        h = torch.cat([start, self.a(x).flatten()]).view_as(x)
        return self.head(F.gelu(h))


def test_the_hook_matches_a_constant_by_form_and_still_refuses_another_op(tmp_path):
    torch.manual_seed(0)
    model, reference = Cached(), Cached()
    reference.load_state_dict(model.state_dict())
    batch = (torch.randn(4, 8), torch.tensor([0, 1, 2, 0]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = tensile.plan(model, optimizer, batch, F.cross_entropy, workdir=tmp_path)
    assert [op["type"] for op in plan.ops].count("aten::lift_fresh_copy") == 1
    for m, opt, hook in ((reference, torch.optim.AdamW(reference.parameters(), lr=1e-2), None), (model, optimizer, plan)):
        applier = None
        ctx = tensile.apply(hook, m, opt) if hook is not None else None
        if ctx is not None:
            applier = ctx.__enter__()
        for _ in range(3):
            F.cross_entropy(m(batch[0]), batch[1]).backward()
            opt.step()
            opt.zero_grad()
        if ctx is not None:
            ctx.__exit__(None, None, None)
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters()))
    assert applier.stats[0].other_forms == {"view copy": 1}  # the checked step's count
    changed = CachedGelu()
    changed.load_state_dict(model.state_dict())
    optimizer = torch.optim.AdamW(changed.parameters(), lr=1e-2)
    with pytest.raises(tensile.PlanMismatchError, match=r"the plan expects aten::relu .*the model ran aten::gelu"):
        with tensile.apply(plan, changed, optimizer):
            F.cross_entropy(changed(batch[0]), batch[1]).backward()
