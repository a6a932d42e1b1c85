"""Where ntk_attention's forward spends its time beyond SDPA's, stage by stage, at (B, H, L, d) (default the
bench's small shape 8, 12, 128, 64): each stage adds one step of the forward to the one before, all timed in
interleaved rounds. Run: .venv/bin/python scripts/profile_attention.py [B H L d]"""

import sys

import torch
import torch.nn.functional as F

from ntkcli.attention import attention_lse, elu, ntk_attention, ntk_combine
from ntkcli.bench import _inputs, timings
from ntkcli.runs import tune_malloc


def stages(q, k, v, Z, kvec):
    """Cumulative prefixes of the forward: the input attention, + φ(√s·Q), + φ(Q)[Z | k], + the combination
    (ntk_combine, which holds the matmul too)."""
    root = q.shape[-1] ** -0.25
    W = torch.cat([Z, kvec.unsqueeze(-1)], dim=-1)

    def upto(n: int):
        def call():
            mean, lse = attention_lse(q, k, v)
            if n > 0:
                f, c = elu(q, root)
            if n == 2:
                f @ W
            if n == 3:
                ntk_combine(mean, lse, f, c, Z, kvec)
        return call

    return {"attention_lse": upto(0), "+ features": upto(1), "+ φ(Q)[Z|k]": upto(2), "+ combination": upto(3)}


def main(B: int, H: int, L: int, d: int) -> None:
    tune_malloc()  # as the ntk command does
    q, k, v, Z, kvec = _inputs(B, H, L, d, "cpu")
    calls = {"SDPA": lambda: F.scaled_dot_product_attention(q, k, v), **stages(q, k, v, Z, kvec),
             "ntk_attention": lambda: ntk_attention(q, k, v, Z, kvec)}
    with torch.inference_mode():
        found = timings(*calls.values(), repeats=21)
    base = found[0].median
    for name, t in zip(calls, found):
        print(f"{name:15s} {1e3 * t.median:8.2f} ms  ({t.median / base:.2f}× SDPA)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]) if len(sys.argv) > 4 else (8, 12, 128, 64))
