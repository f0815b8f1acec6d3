"""fact.layouts' rewrites on every target: linears before and between permutes, and SDPA reading Q,
K and V in place, where the exported graph copied them (nn.MultiheadAttention, batch first);
the layout algebra under them (chain_layout, view_ops); and what they leave alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fact import layouts
from fact.layouts import _NotAView, view_chain, view_ops
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
    dim); the heads merged after it (`merge`) or the attention returned as it is."""

    def __init__(self, dim=32, heads=4, merge=True):
        super().__init__()
        self.heads, self.qkv, self.merge = heads, nn.Linear(dim, 3 * dim), merge

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = (
            t.view(b, s, self.heads, e // self.heads).transpose(1, 2).contiguous()
            for t in self.qkv(x).chunk(3, dim=-1)
        )
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return y.transpose(1, 2).reshape(b, s, e) * 2 if self.merge else y


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


def rewrite(program):
    return layouts.rewrite(program, torch.float32, "highest", "sm90")


def same_function(program, before, shape):
    """The rewritten program computes what the exported one did: the same sums, up to the
    rounding of a GEMM that blocks its rows otherwise (PyTorch's CPU kernels by shape)."""
    with torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            y = torch.randn(shape)
            torch.testing.assert_close(program.module()(y), before(y), rtol=1e-5, atol=1e-6)


def graph_targets(program):
    return [n.target for n in program.graph_module.graph.nodes if n.op == "call_function"]


def copies(program):
    return [t for t in graph_targets(program) if t in COPIES]


def test_multihead_attention_runs_without_copies():
    """The exported nn.MultiheadAttention (batch first) projects the transposed query (PyTorch
    copies it, and adds the bias in a kernel of its own), copies its packed projection so that
    it can view each part as (seq, batch * heads, head_dim), and projects the output in (seq,
    batch) row order, transposed back afterwards. Rewritten: the projection reads the query as
    it is, SDPA reads each part as a view of the projection, the output projection reads the
    attention's rows in (batch, seq) order and the residual add reads its result directly. No
    copy is left, and the module computes exactly what the exported one did."""
    torch.manual_seed(0)
    model, x = PackedMha().eval(), torch.randn(3, 5, 32)
    program = export_module(model, [x])
    before = program.module()
    assert copies(program) and aten.transpose.int in graph_targets(program)

    lines = rewrite(program)

    assert lines == [
        "linear projects x before its permute [1, 0, 2]",
        "scaled_dot_product_attention reads q from linear, k from linear, v from linear in "
        "place (no copy)",
        "linear_1 reads its rows from scaled_dot_product_attention in the order of its result "
        "[3, 5, 32]",
    ]
    assert not copies(program) and aten.transpose.int not in graph_targets(program)
    g = program.graph
    (sdpa,) = (n for n in g.nodes if n.target is SDPA)
    (reshape,) = {view_chain(arg)[1][0] for arg in sdpa.args[:3]}  # one, shared
    assert reshape.meta["val"].shape == (3, 5, 3, 4, 8)  # (batch, seq, part, heads, head_dim)
    for pos, arg in enumerate(sdpa.args[:3]):
        source, chain = view_chain(arg)
        assert source.name == "linear" and source.args[0].name == "x"
        assert [op.target for op in chain] == [
            aten.reshape.default, aten.select.int, aten.permute.default
        ]  # fmt: skip
        assert chain[1].args[1:] == (2, pos)
        assert arg.meta["val"].stride() == (5 * 96, 8, 96, 1)
    (out_proj,) = (n for n in g.nodes if n.name == "linear_1")
    assert view_chain(out_proj.args[0])[0] is sdpa
    assert out_proj.meta["val"].is_contiguous()
    (add,) = (n for n in g.nodes if n.target is aten.add.Tensor)
    assert add.args[1] is out_proj
    same_function(program, before, (3, 5, 32))


def test_heads_made_contiguous_are_read_in_place():
    """Hugging Face's `.contiguous()` heads: read in place, Q's memory order (and so SDPA's
    output's) becomes (batch, seq, heads, dim); the graph's values are traced again, and the
    heads merge after it is a view."""
    model, x = ContiguousHeads().eval(), torch.randn(2, 6, 32)
    program = export_module(model, [x])
    before = program.module()
    assert copies(program)
    (line,) = rewrite(program)
    assert line == (
        "scaled_dot_product_attention reads q from getitem, k from getitem_1, v from getitem_2 "
        "in place (no copy)"
    )
    assert not copies(program)
    (sdpa,) = (n for n in program.graph.nodes if n.target is SDPA)
    assert sdpa.args[0].meta["val"].stride() == (6 * 96, 8, 96, 1)
    assert sdpa.meta["val"].stride() == (6 * 32, 8, 32, 1)  # traced again
    assert not copies(program)
    same_function(program, before, (2, 6, 32))


def test_an_output_keeps_its_layout():
    """The attention returned as it is: read in place, its layout would change, so the output is
    copied back to the contiguous one it was traced with (a user may view it)."""
    model, x = ContiguousHeads(merge=False).eval(), torch.randn(2, 6, 32)
    program = export_module(model, [x])
    before = program.module()
    (line,) = rewrite(program)
    (out,) = (n for n in program.graph.nodes if n.op == "output")
    (last,) = out.all_input_nodes
    assert last.target is aten.clone.default and last.args[0].target is SDPA
    assert last.meta["val"].is_contiguous()
    with torch.no_grad():
        assert program.module()(x).is_contiguous()
    same_function(program, before, (2, 6, 32))


class SeqFirstProjection(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x.transpose(0, 1))


def test_a_projected_output_keeps_its_layout():
    """linear(x.transpose(0, 1)) as the module's output: projected before the transpose, then
    copied back to the contiguous layout it was traced with."""
    model, x = SeqFirstProjection().eval(), torch.randn(3, 5, 8)
    program = export_module(model, [x])
    before = program.module()
    (line,) = rewrite(program)
    assert line == "linear projects x before its permute [1, 0, 2]"
    with torch.no_grad():
        assert program.module()(x).is_contiguous()
    same_function(program, before, (3, 5, 8))


class ClsDropped(nn.Module):
    """Slices without a step (export leaves it out; the rewrites raised on them once): a packed
    projection's first part as Q, and the class token dropped before a (seq, batch) projection
    and back."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, s, e = x.shape
        q = self.qkv(x)[..., :e].view(b, s, self.heads, e // self.heads).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q.contiguous(), q, q)
        y = y.transpose(1, 2).reshape(b, s, e)
        return self.out(y[:, 1:].transpose(0, 1).contiguous()).transpose(0, 1)


def test_slices_without_a_step():
    model, x = ClsDropped().eval(), torch.randn(2, 6, 32)
    program = export_module(model, [x])
    before = program.module()
    lines = rewrite(program)
    # Q read in place; the out projection's rows skip the class token, a slice view_ops does
    # not spell (reshape, select and permute only), so it stays as traced
    assert [line.split()[0] for line in lines] == ["scaled_dot_product_attention"]
    same_function(program, before, (2, 6, 32))


class Unusual(nn.Module):
    """What the rewrites leave alone: a `torch.no_grad()` block (a higher-order op the values
    cannot be traced again through) and a linear with a 1-D weight."""

    def __init__(self, vector_only=False):
        super().__init__()
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.v = nn.Parameter(torch.randn(32))
        self.vector_only = vector_only

    def forward(self, x):
        if self.vector_only:
            return torch.nn.functional.linear(x.transpose(0, 1), self.v)
        y = self.mha(x, x, x, need_weights=False)[0]
        with torch.no_grad():
            z = y * 2 + 1
        return torch.nn.functional.linear(z.transpose(0, 1), self.v)


class LastDimMoved(nn.Module):
    """A linear over a transpose that moves the features: not a rearrangement of rows."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 8)

    def forward(self, x):  # x: (batch, 6, seq=6)
        return self.proj(x.transpose(1, 2)).transpose(1, 2)


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (Unusual(), (2, 5, 32)),  # a no_grad block: values not traced again through it
        (Unusual(vector_only=True), (2, 5, 32)),  # a linear with a vector weight
        (LastDimMoved(), (2, 6, 6)),  # a linear over moved features
        (Scrambled(), (2, 5, 32)),  # a chain that is no strided view of its source
    ],
    ids=["no_grad_block", "vector_weight", "moved_features", "no_strided_view"],
)
def test_left_as_traced(model, shape):
    program = export_module(model.eval(), [torch.randn(shape)])
    before = graph_targets(program)
    assert rewrite(program) == []
    assert graph_targets(program) == before


def test_view_ops_spell_a_strided_view_as_reshape_select_permute():
    """ViT-B/16's K at batch 64: the (seq, batch, 3 * dim) projection read as (batch, heads,
    seq, head_dim) at offset 768 (the second part)."""
    layout = [(64, 2304), (12, 64), (197, 64 * 2304), (64, 1)]
    assert view_ops((197, 64, 2304), [[a] for a in layout], 768) == [
        (aten.reshape.default, ([197, 64, 3, 12, 64],)),
        (aten.select.int, (2, 1)),
        (aten.permute.default, ([1, 2, 0, 3],)),
    ]
    # a unit dim: the source reshaped to the sizes
    assert view_ops((4, 6), [[(4, 6)], [(1, 0)], [(6, 1)]], 0) == [
        (aten.reshape.default, ([4, 1, 6],))
    ]
    # a dim of two atoms (heads and head_dim of (batch, heads, seq, dim), merged after the
    # seq): permuted, then merged by a reshape (a view where the source is laid out (b, s, h, d))
    assert view_ops((2, 3, 5, 4), [[(2, 60)], [(5, 4)], [(3, 20), (4, 1)]], 0) == [
        (aten.permute.default, ([0, 2, 1, 3],)),
        (aten.reshape.default, ([2, 5, 12],)),
    ]
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
        view_ops((4, 6), [[a] for a in layout], offset)
