"""Jit functions for tests/test_precompile.py's key test: two kernels over a chain of helpers,
each helper reading a global constant of its own."""

from __future__ import annotations

import triton.language as tl
from triton.runtime.jit import JITFunction

SCALE: tl.constexpr = tl.constexpr(3)
SHIFT: tl.constexpr = tl.constexpr(5)


def inner(x):
    return x * SCALE


def middle(x):
    return inner(x) + SHIFT


def kernel_a(p):
    tl.store(p, middle(tl.load(p)))


def kernel_b(p):
    tl.store(p, inner(tl.load(p)))


# JITFunction directly (not triton.jit): a compiled kernel's object under TRITON_INTERPRET too
inner = JITFunction(inner)
middle = JITFunction(middle)
kernel_a = JITFunction(kernel_a)
kernel_b = JITFunction(kernel_b)
FUNCTIONS = (inner, middle, kernel_a, kernel_b)
