"""The capstone's second part (notebook 13): a small Transformer assembled from the learner's
pieces of lessons 11-12 (softmax's rule, the causal mask, the head split and merge, the pre-LN
block) on the engine of part one (their accumulate, unbroadcast, clipping, AdamW, cross-entropy
and embedding rules), trained beside the package's Transformer on the same batches. Each 11-12
piece is also checked alone on the model's own shapes, so a wrong one is named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...autodiff.gradcheck import check_gradients
from ...autodiff.operations import cross_entropy, softmax
from ...autodiff.tape import Tape
from ...data import CONTEXT, SequenceSampler, load_corpus
from ...errors import SmallemError
from ...models.transformer import Transformer, TransformerConfig
from ..common.graders import Wrong, compare
from ..common.progress import answers
from ..common.references import as_boolean_mask
from .capstone import SETTINGS, PackageEngine, Race, YourEngine, run
from .diagnosis import Finding
from .pieces import ROLES, Piece, as_rule, guard, your_pieces

# The MLP's window, so that part two reads what part one read: 42,689 parameters.
CONFIG = TransformerConfig(layers=2, width=32, heads=4, context=CONTEXT)
HELD_OUT = 32  # held-out sequences the race scores (512 targets): the lesson's CPU budget
ROLES_11_12 = {
    "11.softmax_backward": "the rule of softmax (every head's attention weights)",
    "11.causal_mask": "every head's mask (−∞ added where it says False)",
    "11.split_heads": "splitting q, k, v into heads, and merging the heads' outputs",
    "12.block": "every block's forward (its residuals and LayerNorms)",
}
ENGINE = ("02.accumulate", "03.unbroadcast", "08.clip_by_global_norm", "06.adamw_step",
          "09.dlogits", "09.embedding_backward")  # part one's pieces that a Transformer uses
TRANSFORMER_ROLES = {**ROLES_11_12, **{eid: ROLES[eid] for eid in ENGINE}}
RULES = {"09.dlogits": "cross_entropy", "09.embedding_backward": "gather_rows"}


class _BlockView:
    """A block as the learner's block_forward sees it: its LayerNorms and MLP, and an
    attention built from their split, merge and mask."""

    def __init__(self, block: Any, attention: Callable) -> None:
        self.attention_norm, self.mlp_norm, self.mlp = block.attention_norm, block.mlp_norm, block.mlp
        self.attention = attention


def _attention(by: dict[str, Piece], att: Any) -> Callable:
    """softmax(q kᵀ/√D + mask) v over H heads, with the learner's split, merge and mask."""
    split, merge = ((guard(Piece("11.split_heads", "", by["11.split_heads"].fn[k])) for k in (0, 1))
                    if by["11.split_heads"].yours else (None, None))
    mask = guard(by["11.causal_mask"]) if by["11.causal_mask"].yours else None

    def forward(tape: Tape, x: Any) -> Any:
        b, t, c = x.shape
        parts = [lin(tape, x) for lin in (att.query, att.key, att.value)]
        q, k, v = [split(tape, p, att.heads) if split else att.split(tape, p) for p in parts]  # (B, H, T, D)
        scores = tape.mul(q @ tape.transpose(k, -2, -1), att.scale(tape, c))  # (B, H, T, T)
        if mask is None:
            weights = softmax(tape, scores, causal=True)
        else:
            allowed = np.asarray(mask(t), dtype=bool)
            weights = softmax(tape, scores + tape.constant(np.where(allowed, 0.0, -np.inf)))
        mixed = weights @ v  # (B, H, T, D)
        merged = merge(tape, mixed) if merge else tape.reshape(tape.transpose(mixed, 1, 2), (b, t, c))
        return att.output(tape, merged)
    return forward


def transformer_loss(by: dict[str, Piece]) -> Callable:
    """The package Transformer's mean cross-entropy, computed through the learner's pieces."""
    block_forward = guard(by["12.block"]) if by["12.block"].yours else None

    def loss(tape: Tape, model: Transformer, inputs: np.ndarray, targets: np.ndarray) -> Any:
        x = model.token(tape, inputs) + model.position.weight.var(tape)  # (B, T, C)
        for block in model.blocks:
            view = _BlockView(block, _attention(by, block.attention))
            x = (block_forward(tape, view, x) if block_forward else
                 x + view.attention(tape, block.attention_norm(tape, x)))
            if not block_forward:
                x = x + block.mlp(tape, block.mlp_norm(tape, x))
        logits = model.head(tape, model.final_norm(tape, x))  # (B, T, V)
        b, t, v = logits.shape  # two dimensions, as lesson 9's rule takes them
        return cross_entropy(tape, tape.reshape(logits, (b * t, v)), np.reshape(targets, -1))
    return loss


# -- each 11-12 piece alone, on the model's shapes ----------------------------------------------

def _finding(piece: Piece, check: Callable) -> Finding:
    try:
        with np.errstate(all="ignore"):
            check()
    except Wrong as wrong:
        return Finding(piece, False, True, f"your {piece.id} is wrong as {piece.role}: {wrong}")
    except Exception as error:  # noqa: BLE001
        return Finding(piece, False, False, f"your {piece.id} raised {type(error).__name__} "
                                            f"({str(error)[:120]}) as {piece.role}")
    return Finding(piece, True)


def diagnose(pieces: list[Piece], model: Transformer, inputs: np.ndarray, seed: int = 0) -> list[Finding]:
    """The learner's 11-12 pieces, each alone on the shapes this model gives them: the softmax
    rule against finite differences of the causal softmax, the mask, split and merge against
    their definitions, the block's values and gradients against the model's own block."""
    rng = np.random.default_rng(seed)
    c = model.config
    b, t = inputs.shape
    d = c.width // c.heads
    by = {p.id: p for p in pieces}
    findings = []

    def softmax_rule() -> None:
        x, g = rng.normal(size=(2, c.heads, t, t)), rng.normal(size=(2, c.heads, t, t))
        s = np.exp(np.where(np.tril(np.ones((t, t), bool)), x, -np.inf) - x.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        want = check_gradients(lambda tape, v: softmax(tape, v, causal=True), [x], weights=g).numeric[0]
        got = by["11.softmax_backward"].fn(s.copy(), g.copy())
        compare("dx", got, want, on=f"causal weights (2, {c.heads}, {t}, {t})",
                source="finite differences give")

    def mask() -> None:
        got = np.asarray(as_boolean_mask(by["11.causal_mask"].fn)(t))
        compare(f"causal_mask({t})", got, np.tril(np.ones((t, t))), on=f"T = {t}",
                source="j ≤ i gives")

    def split_merge() -> None:
        split, merge = by["11.split_heads"].fn
        x = rng.normal(size=(b, t, c.width))
        tape = Tape("cpu64")
        got = np.asarray(split(tape, tape.constant(x), c.heads).value)
        compare("split_heads(x)", got, x.reshape(b, t, c.heads, d).transpose(0, 2, 1, 3),
                on=f"x ({b}, {t}, {c.width}), {c.heads} heads", source="x[b, t, h·D:(h+1)·D] gives")
        y = rng.normal(size=(b, c.heads, t, d))
        got = np.asarray(merge(tape, tape.constant(y)).value)
        compare("merge_heads(y)", got, y.transpose(0, 2, 1, 3).reshape(b, t, c.width),
                on=f"y ({b}, {c.heads}, {t}, {d})", source="the heads side by side give")

    def block() -> None:
        x, w = rng.normal(size=(b, t, c.width)), rng.normal(size=(b, t, c.width))
        blk = model.blocks[0]
        results = []
        for fn in (by["12.block"].fn, lambda tape, view, h: blk(tape, h)):
            tape = Tape("cpu64")
            xv = tape.leaf(x)
            out = fn(tape, _BlockView(blk, lambda tp, h: blk.attention(tp, h)), xv)
            grads = tape.backward(tape.sum(out * tape.constant(w)))
            results.append((np.asarray(out.value), grads[xv], [p.grad(grads) for p in blk.parameters()]))
        (v, gx, gp), (v0, gx0, gp0) = results
        on = f"block 0, x ({b}, {t}, {c.width})"
        compare("the block's output", v, v0, on=on, source="the model's block gives")
        compare("the gradient of x", gx, gx0, on=on, source="the model's block gives")
        for (name, _), got, want in zip(blk.named_parameters(), gp, gp0):
            if got is None:
                raise Wrong(f"no gradient reaches {name} ({on}): it was used off the tape")
            compare(f"the gradient of {name}", got, want, on=on, source="the model's block gives")

    checks = {"11.softmax_backward": softmax_rule, "11.causal_mask": mask, "11.split_heads": split_merge,
              "12.block": block}
    for eid, check in checks.items():
        if by[eid].yours:
            findings.append(_finding(by[eid], check))
    return findings


def race(sources: dict[str, str] | None = None, *, steps: int = 60, batch: int = 8, eval_every: int = 20,
         seed: int = 0, corpus: Any = None, config: TransformerConfig | None = None,
         progress_bar: bool = True, log: Callable | None = print,
         plant: dict[str, str] | None = None) -> Race:
    """Train two copies of one small Transformer (same weights, same batches): one through the
    learner's pieces on their engine, one the package's (model.loss, AdamW); `log` gets a line at
    each evaluation. `sources`: the pieces' sources (default: the progress store's); `plant`
    replaces some of them."""
    if not (isinstance(steps, int) and steps >= 1):
        raise SmallemError(f"the race needs a whole number of steps, at least 1; got {steps!r}")
    settings, config = dict(SETTINGS), config or CONFIG
    corpus = corpus if corpus is not None else load_corpus()
    pieces = your_pieces({**(answers() if sources is None else sources), **(plant or {})},
                         roles=TRANSFORMER_ROLES)
    by = {p.id: p for p in pieces}
    models = [Transformer(config, backend="cpu64", seed=seed) for _ in range(2)]
    sampler = SequenceSampler(corpus.train, batch=batch, context=config.context, seed=seed)
    held = SequenceSampler(corpus.held_out, batch=HELD_OUT, context=config.context, seed=seed + 1).next()
    first = sampler.next()
    result = Race(pieces, diagnose(pieces, models[0], first[0], seed), what="a Transformer")
    broken = [f for f in result.findings if not f.runs]
    if broken:
        result.stopped = broken[0].sentence
        return result
    rules = {RULES[p.id]: as_rule(p) for p in pieces if p.id in RULES and p.yours}
    if by["11.softmax_backward"].yours:
        rule = guard(by["11.softmax_backward"])
        rules["softmax"] = lambda be, grad, out, x, op: (rule(out, grad),)
    yours = YourEngine(pieces, models[0], settings, loss=transformer_loss(by), rules=rules)
    package = PackageEngine(models[1], settings)
    return run(result, yours, package, lambda step: first if step == 1 else sampler.next(), models, [held],
               steps=steps, eval_every=eval_every, log=log, progress_bar=progress_bar,
               desc="the Transformer race")
