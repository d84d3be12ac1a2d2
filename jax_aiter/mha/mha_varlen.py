"""Upstream's module path jax_aiter.mha.mha_varlen: the same flash_attn_varlen as jax_aiter.mha (an alias, no
logic)."""
from jax_aiter.mha import flash_attn_varlen

__all__ = ["flash_attn_varlen"]
