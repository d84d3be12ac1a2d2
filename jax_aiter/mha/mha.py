"""Upstream's module path jax_aiter.mha.mha: the same flash_attn_func as jax_aiter.mha (an alias, no logic)."""
from jax_aiter.mha import flash_attn_func

__all__ = ["flash_attn_func"]
