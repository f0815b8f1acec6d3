"""fact.layouts.attention_inputs_in_place: SDPA reads Q, K and V as views of the tensor they were
cut from where the exported graph copied them on the way (nn.MultiheadAttention's packed
projection), and leaves alone what it cannot read in place or would change the layout of."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fact.layouts import _NotAView, attention_inputs_in_place, view_chain, view_ops
from fact.tracer import export_module

aten = torch.ops.aten
SDPA = aten.scaled_dot_product_attention.default
COPIES = {aten.contiguous.default, aten.clone.default}


class PackedMha(nn.Module):
    """ViT's attention: nn.MultiheadAttention, batch first, one packed QKV projection."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x):
        return x + self.attn(x, x, x, need_weights=False)[0]


class ContiguousHeads(nn.Module):
    """Hugging Face's CLIP and BART: each head split made `.contiguous()` before SDPA, which
    changes the query's memory order from (batch, seq, heads, dim) to (batch, heads, seq,
    dim)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.qkv = heads, nn.Linear(dim, 3 * dim)

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = (
            t.view(b, s, self.heads, e // self.heads).transpose(1, 2).contiguous()
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


class Scrambled(nn.Module):
    """Heads cut from a transposed copy of the projection: (batch, dim, seq) flattened and read
    back as (batch, heads, seq, head_dim), which no strided view of the projection is."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.proj = heads, nn.Linear(dim, dim)

    def forward(self, x):
        b, s, e = x.shape
        t = self.proj(x).transpose(1, 2).contiguous().view(b, e * s)
        q = t.view(b, self.heads, s, e // self.heads)
        return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def graph_targets(program):
    return [n.target for n in program.graph_module.graph.nodes if n.op == "call_function"]


def copies(program):
    return [t for t in graph_targets(program) if t in COPIES]


def test_multihead_attention_reads_its_packed_projection_in_place():
    """The exported nn.MultiheadAttention copies its packed projection (`.contiguous()` of the
    (3, seq, batch, dim) view) so that it can view each part as (seq, batch * heads, head_dim).
    Rewritten, SDPA reads each part as a view of the projection: the copy is gone, the memory
    order of Q, K and V (and so of SDPA's output) is the one traced, and the module computes
    exactly what the exported one did."""
    torch.manual_seed(0)
    model, x = PackedMha().eval(), torch.randn(3, 5, 32)
    program = export_module(model, [x])
    before = program.module()
    assert copies(program)
    old = [a.meta["val"] for a in next(n for n in program.graph.nodes if n.target is SDPA).args]

    (line,) = attention_inputs_in_place(program)

    assert "reads q from linear, k from linear, v from linear in place" in line
    assert not copies(program)
    (sdpa,) = (n for n in program.graph.nodes if n.target is SDPA)
    (reshape,) = {view_chain(arg)[1][0] for arg in sdpa.args[:3]}  # one, shared
    assert reshape.meta["val"].shape == (5, 3, 3, 4, 8)  # (seq, batch, part, heads, head_dim)
    for pos, (arg, val) in enumerate(zip(sdpa.args[:3], old, strict=True)):
        source, chain = view_chain(arg)
        assert source.target is aten.linear.default
        assert [op.target for op in chain] == [
            aten.reshape.default, aten.select.int, aten.permute.default
        ]  # fmt: skip
        assert chain[1].args[1:] == (2, pos)
        new = arg.meta["val"]
        assert new.shape == val.shape
        assert sorted(range(4), key=lambda d: -new.stride(d)) == sorted(
            range(4), key=lambda d: -val.stride(d)
        )
    with torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            y = torch.randn(3, 5, 32)
            assert torch.equal(program.module()(y), before(y))


def test_heads_made_contiguous_are_left_as_traced():
    """Read in place, Q would be in (batch, seq, heads, dim) order where the traced graph had
    (batch, heads, seq, dim), and SDPA's output follows its query's order on the GPU: the ops
    after it were traced on the old one, so nothing is rewritten."""
    model, x = ContiguousHeads().eval(), torch.randn(2, 6, 32)
    program = export_module(model, [x])
    before = graph_targets(program)
    assert copies(program)
    assert attention_inputs_in_place(program) == []
    assert graph_targets(program) == before


def test_a_chain_that_is_no_strided_view_is_left_as_traced():
    model, x = Scrambled().eval(), torch.randn(2, 5, 32)
    program = export_module(model, [x])
    before = graph_targets(program)
    assert attention_inputs_in_place(program) == []
    assert graph_targets(program) == before


def test_view_ops_spell_a_strided_view_as_reshape_select_permute():
    """ViT-B/16's K at batch 64: the (seq, batch, 3 * dim) projection read as (batch, heads,
    seq, head_dim) at offset 768 (the second part)."""
    layout = [(64, 2304), (12, 64), (197, 64 * 2304), (64, 1)]
    assert view_ops((197, 64, 2304), layout, 768) == [
        (aten.reshape.default, ([197, 64, 3, 12, 64],)),
        (aten.select.int, (2, 1)),
        (aten.permute.default, ([1, 2, 0, 3],)),
    ]
    # a unit dim is unsqueezed where the view has it; nothing to reshape or permute
    assert view_ops((4, 6), [(4, 6), (1, 0), (6, 1)], 0) == [(aten.unsqueeze.default, (1,))]
    src = torch.arange(197 * 64 * 2304).view(197, 64, 2304)
    t = src.reshape(197, 64, 3, 12, 64).select(2, 1).permute(1, 2, 0, 3)
    assert t.stride() == tuple(s for _, s in layout) and t.storage_offset() == 768


@pytest.mark.parametrize(
    ("layout", "offset"),
    [
        ([(4, 5), (5, 1)], 0),  # strides that do not nest (5 * 5 > the span of 4 rows of 6)
        ([(4, 6), (3, 1)], 4),  # an offset inside a walked digit
        ([(2, 0), (6, 1)], 0),  # a broadcast dim
    ],
)
def test_view_ops_refuse_what_is_no_view_of_the_source(layout, offset):
    with pytest.raises(_NotAView):
        view_ops((4, 6), layout, offset)
