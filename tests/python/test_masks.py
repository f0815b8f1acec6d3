"""Attention masks made of constants (fact.masks): built the way Hugging Face's models build
them (index arithmetic: arange, comparisons, `&`, expand; or a vmapped mask function), a causal
mask becomes SDPA's is_causal, an all-true one no mask, and every other mask (another diagonal,
a sliding window, one that depends on an input or on the model's state) stays as it is. The
rewritten program must compute what the model does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fact
from fact import masks
from fact.tracer import export_module

SDPA = torch.ops.aten.scaled_dot_product_attention.default
B, H, S, D = 2, 4, 16, 8


def _index_mask(q_len: int, kv_len: int, window: int | None = None) -> torch.Tensor:
    """HF's sdpa_mask without vmap: bottom-right aligned, key j kept for query i when
    j <= i + (kv_len - q_len) (and j > that - window)."""
    q = torch.arange(q_len) + (kv_len - q_len)
    kv = torch.arange(kv_len)
    keep = torch.ones((), dtype=torch.bool) & (kv[None, :] <= q[:, None])
    if window is not None:
        keep = keep & (kv[None, :] > q[:, None] - window)
    return keep[None, None].expand(B, 1, q_len, kv_len)


class Attention(nn.Module):
    """SDPA over a projection, with a mask of a given kind."""

    def __init__(self, kind: str, q_len: int = S):
        super().__init__()
        self.kind, self.q_len = kind, q_len
        self.proj = nn.Linear(D, D)
        self.register_buffer("causal", torch.ones(S, S, dtype=torch.bool).tril())

    def mask(self, keys: torch.Tensor | None):
        q_len = self.q_len
        if self.kind == "causal":
            return _index_mask(q_len, S)
        if self.kind == "sliding":
            return _index_mask(q_len, S, window=4)
        if self.kind == "all":
            return torch.ones(B, 1, q_len, S, dtype=torch.bool)
        if self.kind == "additive":  # eager's form: 0 or finfo.min
            keep = _index_mask(q_len, S)
            return torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
        if self.kind == "padding":  # from an input: keys the caller masks
            return _index_mask(q_len, S) & keys.bool()[:, None, None, :]
        if self.kind == "buffer":  # from the model's state
            return self.causal[None, None, -q_len:, :]
        raise AssertionError(self.kind)

    def forward(self, x: torch.Tensor, keys: torch.Tensor):
        q = self.proj(x)[:, :, -self.q_len :]
        return F.scaled_dot_product_attention(q, x, x, attn_mask=self.mask(keys))


class VmappedMask(nn.Module):
    """The mask from a vmapped mask function (torch.func), as HF's vmap path makes it."""

    def forward(self, x: torch.Tensor, keys: torch.Tensor):
        def keep(b, h, i, j):
            return j <= i

        fn = keep
        for dims in [(None, None, None, 0), (None, None, 0, None), (None, 0, None, None)]:
            fn = torch.vmap(fn, in_dims=dims)
        fn = torch.vmap(fn, in_dims=(0, None, None, None))
        mask = fn(torch.arange(B), torch.arange(1), torch.arange(S), torch.arange(S))
        return F.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def _export(model: nn.Module):
    x = torch.randn(B, H, S, D)
    keys = torch.ones(B, S, dtype=torch.long)
    keys[0, :3] = 0
    with torch.no_grad():
        program = export_module(model.eval(), [x, keys])
    return program, (x, keys)


def _sdpa_args(program) -> tuple:
    (node,) = [n for n in program.graph.nodes if n.target is SDPA]
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    causal = node.args[5] if len(node.args) > 5 else node.kwargs.get("is_causal", False)
    return mask, causal


@pytest.mark.parametrize(
    "kind, q_len, expect",
    [
        ("causal", S, "causal"),
        ("additive", S, "causal"),
        ("all", S, "none"),
        ("causal", S // 2, "mask"),  # a diagonal offset: not SDPA's top-left is_causal
        ("sliding", S, "mask"),
        ("padding", S, "mask"),
        ("buffer", S, "mask"),
    ],
)
def test_constant_masks_become_flags_and_others_stay(kind, q_len, expect):
    model = Attention(kind, q_len)
    program, args = _export(model)
    lines = masks.rewrite(program)
    mask, causal = _sdpa_args(program)
    if expect == "causal":
        assert mask is None and causal is True and len(lines) == 1, lines
        assert "is_causal=True" in lines[0]
    elif expect == "none":
        assert mask is None and not causal and "no mask" in lines[0]
    else:
        assert mask is not None and not causal and lines == []
    with torch.no_grad():
        want = model(*args)
        got = program.module()(*args)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)


def test_the_mask_computation_leaves_the_graph():
    program, _ = _export(Attention("causal"))
    masks.rewrite(program)
    left = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert not any(op in t for t in left for op in ("arange", "le.", "expand", "__and__")), left


def test_a_vmapped_mask_function_evaluates_and_leaves_vmap_as_it_was():
    model = VmappedMask()
    program, args = _export(model)
    lines = masks.rewrite(program)
    assert len(lines) == 1 and "is_causal=True" in lines[0], lines
    assert torch._C._functorch.maybe_current_level() is None  # no vmap level left open
    with torch.no_grad():
        assert torch.allclose(program.module()(*args), model(*args), atol=1e-5)


def test_classify():
    tril = torch.ones(4, 6, dtype=torch.bool).tril()
    assert masks.classify(tril, 4, 6) == "causal"
    assert masks.classify(torch.ones(1, 1, 4, 6, dtype=torch.bool), 4, 6) == "all"
    assert masks.classify(torch.zeros(4, 6), 4, 6) == "all"
    assert masks.classify(torch.ones(4, 6, dtype=torch.bool).tril(2), 4, 6) == "other"
    assert masks.classify(torch.where(tril, 0.0, -1.0), 4, 6) == "other"  # a soft bias
    assert masks.classify(torch.where(tril, 0.0, float("-inf")), 4, 6) == "causal"
    per_batch = torch.stack([tril, torch.ones(4, 6, dtype=torch.bool)])
    assert masks.classify(per_batch[:, None], 4, 6) == "other"
    assert masks.classify(torch.ones(4, 6, dtype=torch.long), 4, 6) == "other"


def test_the_plan_runs_hugging_face_llama_attention_as_causal(engine_available):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    llama = transformers.LlamaModel(config).eval()

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = llama

        def forward(self, ids):
            return self.model(input_ids=ids, use_cache=False).last_hidden_state

    plan = fact.discover(Wrapped().eval(), [torch.randint(0, 100, (2, 16))])
    attention = [p for p in plan["patterns"] if p["family"] == "attention"]
    assert len(attention) == 2 and all(p["attrs"]["causal"] for p in attention), attention
