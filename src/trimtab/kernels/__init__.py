"""Triton kernels, one file per family, each beside the reference it must match.

Kernels are leaves (design invariant 8): nothing here imports a trimtab module outside
``kernels/``; state arrives as tensors in a layout each module declares. ``import trimtab``
imports nothing here; the torch-only layout modules (``ema_layout``, ``optim_layout``,
``_table``) may be imported by the references, and a module that imports Triton is imported only
once :func:`trimtab._impl.resolve_impl` has chosen ``"triton"``.
"""
