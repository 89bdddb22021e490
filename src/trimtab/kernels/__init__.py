"""Triton kernels, one file per family, each beside the reference it must match.

Nothing here is imported by ``import trimtab``: the public entries import a kernel module only
once :func:`trimtab._impl.resolve_impl` has chosen ``"triton"``.
"""
