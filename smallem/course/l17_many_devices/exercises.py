"""Lesson 17, many devices: the ring all-reduce over simulated devices (graded against the plain
sum, then diagnosed with gradients that say who arrived: device r holds 2ʳ, so every partial sum
is a set of devices written in binary), and the bytes of AdamW's state each rank keeps under
ZeRO, graded against the package's own AdamW."""

from __future__ import annotations

import numpy as np

from ..common.graders import Wrong, call, compare, number, parts
from ..common.grading import exercise
from .ring import Wire, chunk_bounds, naive_allreduce, ring_bytes, ring_reference


# planted wrong answers (the tests feed them to the graders) ----------------------------------
def _ring(shift: int = 0, gather: bool = True, add_in_gather: bool = False, step: int = 1):
    """A ring with one thing changed: the reduce-scatter's chunk index shifted, the all-gather
    left out or adding instead of replacing, or every message sent to device r − 1."""
    def ring_allreduce(grads, send):
        n = len(grads)
        parts = [np.array_split(np.array(g, dtype=np.float64), n) for g in grads]
        for s in range(n - 1):
            moved = [(r, (r - s + shift) % n, send(r, (r + step) % n, parts[r][(r - s + shift) % n]))
                     for r in range(n)]
            for r, c, chunk in moved:
                parts[(r + step) % n][c] = parts[(r + step) % n][c] + chunk
        for s in range(n - 1) if gather else ():
            moved = [(r, (r + 1 - s) % n, send(r, (r + step) % n, parts[r][(r + 1 - s) % n]))
                     for r in range(n)]
            for r, c, chunk in moved:
                parts[(r + step) % n][c] = parts[(r + step) % n][c] + chunk if add_in_gather else chunk
        return [np.concatenate(p) for p in parts]
    return ring_allreduce


def _no_messages(grads, send):
    total = np.sum(grads, axis=0)
    return [total.copy() for _ in grads]


def _devices(bits: int) -> str:
    names = [str(r) for r in range(32) if bits >> r & 1]
    return ("device " if len(names) == 1 else "devices ") + (", ".join(names) or "none")


def _who_arrived(out: list[np.ndarray], n: int, length: int, log: list, on: str) -> None:
    """The answer on gradients 2ʳ: name the first element that is not 2ᴺ − 1 by the devices
    whose gradients it holds (a Wrong), or return when every element is the sum."""
    full = 2 ** n - 1
    bounds = chunk_bounds(length, n)
    right = [[bool(np.all(out[d][a:b] == full)) for a, b in bounds] for d in range(n)]
    values = np.concatenate(out)
    twice = np.flatnonzero((values > full) | (values != np.round(values)) | (values < 0))
    if twice.size:
        d, i = divmod(int(twice[0]), length)
        c = next(k for k, (a, b) in enumerate(bounds) if a <= i < b)
        raise Wrong(f"device {d}'s element [{i}] (in chunk {c}, {on}; device r's gradient is 2ʳ) is "
                    f"{out[d][i]:g}, more than the sum {full}: some gradient is counted twice. In the "
                    "all-gather a device replaces its chunk with the finished one it receives; it adds "
                    "nothing, the sums are already complete.")
    if n > 1 and all(sum(row) == 1 for row in right):
        d0 = right[0].index(True)
        raise Wrong(f"each device ends holding the sum in one chunk only (device 0 in chunk {d0}, {on}): "
                    "that is where the reduce-scatter leaves it; the all-gather must then pass each "
                    "finished chunk on around the ring, N − 1 more steps, each device replacing its "
                    "chunk with the one it receives.")
    bad = [(d, i) for d in range(n) for i in np.flatnonzero(out[d] != full)]
    if not bad:
        return
    d, i = bad[0]
    c = next(k for k, (a, b) in enumerate(bounds) if a <= i < b)
    where = f"device {d}'s element [{i}] (in chunk {c}, {on}; device r's gradient is 2ʳ)"
    have = int(out[d][i])
    backwards = n > 2 and all(dst == (src - 1) % n for src, dst, _ in log)
    why = (" Your messages go to device r − 1, while chunk (r − s) mod N is the one the next device, "
           "(r + 1) mod N, is summing: send each chunk forward around the ring." if backwards else
           " Check the chunk each device sends at step s: in the reduce-scatter device r sends chunk "
           "(r − s) mod N, the one it has just added into; in the all-gather, chunk (r + 1 − s) mod N.")
    raise Wrong(f"{where} holds the gradients of {_devices(have)} only, without "
                f"{_devices(full & ~have)}.{why}")


def _check_messages(sent: list[int], log: list, n: int, length: int, on: str) -> None:
    if n > 1 and not log:
        raise Wrong(f"your devices exchanged nothing through send ({on}): a device sees only its own "
                    "gradient and what arrives through send(src, dst, chunk), so the sum must travel.")
    far = next(((src, dst) for src, dst, _ in log if dst not in ((src + 1) % n, (src - 1) % n)), None)
    if far:
        raise Wrong(f"device {far[0]} sends to device {far[1]}, which is not its neighbour ({on}): in a "
                    "ring each device sends only to the next one, (r + 1) mod N, one chunk per step.")
    allowed = max(ring_bytes(length, n)) + 16  # a ring turning the other way skips other chunks
    worst = int(np.argmax(sent))
    if sent[worst] > allowed:
        raise Wrong(f"device {worst} sends {sent[worst]:,} bytes ({on}), where a ring sends 2(N − 1)/N "
                    f"of the gradient's {8 * length:,} bytes, {max(ring_bytes(length, n)):,}: N − 1 chunks "
                    "in each half, one chunk per step, never the whole gradient.")
    turns = {(dst - src) % n for src, dst, _ in log}
    if n > 2 and len(turns) > 1:  # (with 2 devices both ways are the same neighbour)
        raise Wrong(f"your messages go both ways round the ring ({on}): some from device r to r + 1, "
                    "others from r to r − 1. A ring turns one way: in send(src, dst, chunk) src is the "
                    "device that holds the chunk and dst = (src + 1) mod N, in both halves.")


def _one_array(result, device: int, length: int, on: str) -> np.ndarray:
    """A device's result as one flat float array of `length`, or a Wrong saying what it was."""
    try:
        a = np.asarray(result, dtype=np.float64)
    except (TypeError, ValueError):  # a list of chunks of different lengths, say
        a = None
    if a is None or a.shape != (length,):
        shape = "a list of pieces" if a is None else f"shape {list(a.shape)}"
        raise Wrong(f"device {device}'s result has {shape} where it should be one array of shape "
                    f"[{length}] ({on}): each device ends with the whole summed gradient "
                    "(np.concatenate its chunks).")
    return a


RING_CASES = [(2, 10), (3, 7), (4, 12), (5, 23), (3, 2), (8, 1001), (1, 5)]


def _declared_backwards(grads, send):
    """The right sums, but reduce-scatter's messages declared from r + 1 to r (send's src and dst
    swapped): on real ranks the device named as sender does not hold the chunk."""
    n, calls = len(grads), [0]

    def swapped(src, dst, chunk):
        calls[0] += 1
        return send(dst, src, chunk) if calls[0] <= n * (n - 1) else send(src, dst, chunk)

    return ring_reference(grads, swapped)


@exercise("17.ring_allreduce", title="the ring all-reduce: reduce-scatter, then all-gather",
          hints=("Cut each device's gradient into N chunks, np.array_split(g, N). In the reduce-scatter, "
                 "at step s = 0 … N − 2, device r sends one chunk to device (r + 1) mod N, which adds it "
                 "into its own copy of that chunk.",
                 "Device r sends chunk (r − s) mod N: the one it received and added into at the step "
                 "before. After N − 1 steps, device r holds the whole sum of chunk (r + 1) mod N.",
                 "The all-gather is the same walk without the adding: at step s device r sends chunk "
                 "(r + 1 − s) mod N, and the next device replaces its chunk with it. Collect a step's "
                 "messages before applying them, then return [np.concatenate(p) for p in parts]."),
          answer="ring_allreduce",
          mistakes={"off-by-one chunk index": (_ring(shift=-1), "holds the gradients of"),
                    "all-gather skipped": (_ring(gather=False), "all-gather must then pass"),
                    "summing twice": (_ring(add_in_gather=True), "counted twice"),
                    "wrong direction": (_ring(step=-1), "device r − 1"),
                    "src and dst swapped in one half": (_declared_backwards, "both ways round the ring"),
                    "gather to one": (naive_allreduce, "never the whole gradient"),
                    "no messages": (_no_messages, "exchanged nothing")},
          alternate_cell='''
# Exercise 17.ring_allreduce · every device ends with the sum of all N gradients
def ring_allreduce(grads, send):
    n = len(grads)
    cuts = np.array_split(np.arange(len(grads[0])), n)     # the element indices of each chunk
    data = [np.array(g, dtype=np.float64) for g in grads]  # each device's own copy
    for s in range(2 * (n - 1)):                           # reduce-scatter, then all-gather
        gather = s >= n - 1
        out = []
        for r in range(n):
            c = (r + 1 - (s - n + 1)) % n if gather else (r - s) % n
            out.append(((r + 1) % n, c, send(r, (r + 1) % n, data[r][cuts[c]])))
        for dst, c, chunk in out:
            data[dst][cuts[c]] = chunk if gather else data[dst][cuts[c]] + chunk
    return data
''', solution_cell='''
# Exercise 17.ring_allreduce · every device ends with the sum of all N gradients
def ring_allreduce(grads, send):
    """grads: N arrays, device r's gradient. send(src, dst, chunk) returns what dst receives.
    Return N arrays, each the sum of all N gradients."""
    n = len(grads)
    parts = [np.array_split(np.array(g, dtype=np.float64), n) for g in grads]  # each device's chunks
    for s in range(n - 1):                                   # reduce-scatter: add as it passes
        moved = [(r, (r - s) % n, send(r, (r + 1) % n, parts[r][(r - s) % n])) for r in range(n)]
        for r, c, chunk in moved:                            # all sent first, then received
            parts[(r + 1) % n][c] = parts[(r + 1) % n][c] + chunk
    for s in range(n - 1):                                   # all-gather: pass the finished chunks on
        moved = [(r, (r + 1 - s) % n, send(r, (r + 1) % n, parts[r][(r + 1 - s) % n])) for r in range(n)]
        for r, c, chunk in moved:
            parts[(r + 1) % n][c] = chunk                    # replace: it is already the whole sum
    return [np.concatenate(p) for p in parts]
''')
def ring_allreduce(answer):
    for n, length in RING_CASES:  # first the devices that say who arrived, then random gradients
        on = f"N = {n} devices, gradients of {length} numbers"
        wire = Wire(n)
        out = call(answer, [np.full(length, 2.0 ** r) for r in range(n)], wire.send, on=on)
        out = parts(out, n, f"ring_allreduce returns one array per device, here {n} ({on})")
        out = [_one_array(o, d, length, on) for d, o in enumerate(out)]
        _who_arrived(out, n, length, wire.log, on)
        _check_messages(wire.sent, wire.log, n, length, on)
    rng = np.random.default_rng(17)
    for n, length in RING_CASES:
        on = f"N = {n} random gradients of {length} numbers"
        grads = [rng.normal(size=length) for _ in range(n)]
        want = np.sum(grads, axis=0)
        wire = Wire(n)
        out = parts(call(answer, [g.copy() for g in grads], wire.send, on=on), n,
                    f"ring_allreduce returns one array per device, here {n} ({on})")
        for d, o in enumerate(out):
            compare(f"device {d}'s sum", o, want, on=on, source="the plain sum is", tolerance=1e-12)
        _check_messages(wire.sent, wire.log, n, length, on)
    return ("every device ends with the plain sum, for N from 1 to 8 and lengths N does not divide, "
            "each sending 2(N − 1)/N of the gradient")


# -- 17.zero_state -----------------------------------------------------------------------------

def _state(moments: int = 2, sharded: bool = True, floor: bool = False, default: int = 4):
    def adamw_bytes_per_rank(P, N, itemsize=default):
        if not sharded:
            return [moments * itemsize * P] * N
        if floor:
            return [moments * itemsize * (P // N)] * N
        return [moments * itemsize * len(s) for s in np.array_split(np.arange(P), N)]
    return adamw_bytes_per_rank


ZERO_CASES = [(471_041, 1), (471_041, 2), (471_041, 8), (10, 4), (3, 8), (1_000_003, 3)]


def adamw_state_bytes(model) -> int:
    """Bytes of the package's AdamW state (m and v) after one step of `model` on a random batch."""
    from ...autodiff.tape import Tape
    from ...optim import AdamW

    rng = np.random.default_rng(0)
    context = model.config.context
    x = rng.integers(0, 256, size=(2, context))
    y = rng.integers(0, 256, size=(2, context))
    backend = model.parameters()[0].backend
    tape = Tape(backend)
    grads = tape.backward(model.loss(tape, x, y))
    optimizer = AdamW()
    optimizer.step(model.parameters(), grads)
    return sum(int(np.asarray(backend.to_numpy(t)).nbytes)
               for table in (optimizer.m, optimizer.v) for t in table.values())


@exercise("17.zero_state", title="ZeRO: the bytes of AdamW's state each rank keeps",
          hints=("AdamW keeps two numbers per parameter, m and v, each `itemsize` bytes. Without ZeRO "
                 "every rank keeps them for all P parameters.",
                 "ZeRO cuts the P parameters into N shards, as np.array_split does: the first P mod N "
                 "ranks hold one parameter more; each rank keeps m and v for its shard only.",
                 "[2 * itemsize * len(shard) for shard in np.array_split(np.arange(P), N)], or the "
                 "same sizes from P // N and P % N."),
          answer="adamw_bytes_per_rank",
          mistakes={"one moment only": (_state(moments=1), "m and v"),
                    "not sharded": (_state(sharded=False), "every rank keeps the whole state"),
                    "the remainder lost": (_state(floor=True), "are lost"),
                    "the weights counted too": (_state(moments=3), "only m and v"),
                    "float64 by default": (_state(default=8), "the default itemsize is 4")},
          alternate_cell='''
# Exercise 17.zero_state · AdamW's m and v, sharded over N ranks: bytes on each rank
def adamw_bytes_per_rank(P, N, itemsize=4):
    share, extra = divmod(P, N)
    return [2 * itemsize * (share + (rank < extra)) for rank in range(N)]
''', solution_cell='''
# Exercise 17.zero_state · AdamW's m and v, sharded over N ranks: bytes on each rank
def adamw_bytes_per_rank(P, N, itemsize=4):
    """P parameters, N ranks. Return N numbers: the bytes of m and v that each rank keeps."""
    shards = np.array_split(np.arange(P), N)          # the first P % N ranks hold one more
    return [2 * itemsize * len(shard) for shard in shards]   # m and v for its own shard only
''')
def zero_state(answer):
    from ...models.transformer import Transformer, TransformerConfig

    for (p, n), itemsize in zip(ZERO_CASES + [(12, 5)], [4] * len(ZERO_CASES) + [8]):
        on = f"P = {p:,} parameters on N = {n} rank{'s' if n != 1 else ''}, {itemsize} bytes a number"
        out = parts(call(answer, p, n, itemsize, on=on), n, f"adamw_bytes_per_rank returns one number "
                    f"per rank, here {n} ({on})")
        got = [number(x, f"rank {r}'s bytes") for r, x in enumerate(out)]
        shards = [len(s) for s in np.array_split(np.arange(p), n)]
        want = [2 * itemsize * s for s in shards]
        if got == want:
            continue
        if n > 1 and all(g == 2 * itemsize * p for g in got):
            raise Wrong(f"every rank keeps the whole state ({on}): ZeRO shards it, each rank keeps m "
                        "and v for its own 1/N of the parameters and updates only those.")
        if got == [itemsize * s for s in shards] or got == [itemsize * p] * n:
            raise Wrong(f"rank 0 keeps {got[0]:,.0f} bytes where it should be {want[0]:,} ({on}): that is "
                        "one moment; AdamW keeps two numbers per parameter, m and v.")
        if got in ([3 * itemsize * s for s in shards], [4 * itemsize * s for s in shards]):
            raise Wrong(f"rank 0 keeps {got[0]:,.0f} bytes where it should be {want[0]:,} ({on}): the "
                        "weights (or the gradients) are counted too; the optimizer's state is only m and v.")
        if sum(got) < sum(want):
            raise Wrong(f"the ranks keep {sum(got):,.0f} bytes together where m and v of all P parameters "
                        f"take {sum(want):,} ({on}): m and v of {p % n} parameters (P mod N) are lost; "
                        "the first P mod N ranks hold one parameter more.")
        bad = next(r for r in range(n) if got[r] != want[r])
        raise Wrong(f"rank {bad} keeps {got[bad]:,.0f} bytes where it should be {want[bad]:,} ({on}).")
    p, n = ZERO_CASES[1]  # as the lesson calls it: itemsize left to its default, float32's 4 bytes
    out = parts(call(answer, p, n, on=f"P = {p:,}, N = {n}, itemsize left out"), n,
                f"adamw_bytes_per_rank returns one number per rank, here {n}")
    want = [8 * len(s) for s in np.array_split(np.arange(p), n)]
    got = [number(x, "a rank's bytes") for x in out]
    if got != want:
        raise Wrong(f"called without itemsize (P = {p:,}, N = {n}), rank 0 keeps {got[0]:,.0f} bytes "
                    f"where it should be {want[0]:,}: the default itemsize is 4, the bytes of a "
                    "float32, which the lesson's model holds.")
    small = Transformer(TransformerConfig(layers=1, width=16, heads=2, context=8), "cpu", seed=0)
    real = adamw_state_bytes(small)
    p = small.parameter_count()
    compare("the bytes at N = 1", number(parts(call(answer, p, 1, 4, on=f"P = {p}"), 1,
                                                   "adamw_bytes_per_rank returns one number per rank")[0],
                                             "the bytes at N = 1"),
            real, on=f"a small Transformer of {p:,} float32 parameters", tolerance=0,
            source="the package's AdamW keeps")
    return ("your shards hold m and v of every parameter once, the first P mod N ranks one more, and "
            "at N = 1 the bytes of the package's own AdamW")
