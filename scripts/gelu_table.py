#!/usr/bin/env python3
"""The table of `simd::avx512::gelu16`: Q(u) = Φ(−u) = erfc(u/√2)/2 on 15 intervals of 0.4
from u = 0 (the 16th, u ≥ 6, is 0: Q(6) = 1e-9), each as a degree-4 polynomial in t = u − 0.4·i
through Q's values at the interval's Chebyshev nodes (near the minimax fit; in f32 Horner the
worst error is ~2e-7). Prints the Rust constants: one row per power of t, one lane per interval.

    python3 scripts/gelu_table.py   (numpy)
"""
import math

import numpy as np

WIDTH, INTERVALS, DEGREE = 0.4, 16, 4


def q(u):
    return 0.5 * math.erfc(u / math.sqrt(2.0))


coef = np.zeros((DEGREE + 1, INTERVALS))
for i in range(INTERVALS - 1):
    a = i * WIDTH
    k = np.arange(DEGREE + 1)
    nodes = (np.cos(np.pi * (k + 0.5) / (DEGREE + 1)) + 1.0) / 2.0 * WIDTH
    c = np.polyfit(nodes, [q(a + t) for t in nodes], DEGREE)  # highest power first
    coef[:, i] = c[::-1]
print(f"const GELU_Q: [[f32; 16]; {DEGREE + 1}] = [")
for power in range(DEGREE + 1):
    # The shortest decimal that reads back as the same f32 (numpy's repr of a float32).
    row = [np.format_float_scientific(np.float32(v), unique=True).replace(".e", ".0e") for v in coef[power]]
    print("    [" + ", ".join(row) + "],")
print("];")
