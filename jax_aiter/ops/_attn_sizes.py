"""The sizes of the attention FFI calls' workspaces, which the op computes at trace time (before any library is
loaded): the forward's split-KV workspace and the deterministic backward's sync words. The kernels' constants they
use are mirrored here (tests/build/test_abi_constants.py holds each to its C header)."""
from __future__ import annotations

# The GPU's split-KV decode path (csrc/kernels/mha/decode/fwd.cuh) keeps each
# split's partial output in a float32 workspace, an extra result of the forward FFI call
# that XLA allocates and this module drops. Its size only caps the number of splits the
# kernel may choose (it picks them from the device's multiprocessors); the kernel never
# needs more, and with none it runs one split. The first three mirror the kernel's defaults
# (csrc/kernels/mha/decode/sizes.h; tests/build/test_abi_constants.py holds them equal); the last two are
# this module's own cap on the workspace.
DECODE_MAX_ROWS = 64      # JA_MHA_DECODE_MAX_ROWS: query rows per kv head (group x seq_q) that take the path
DECODE_TILE_KEYS = 64     # 16 x JA_MHA_DECODE_WARPS: keys per tile
DECODE_MIN_TILES = 4      # JA_MHA_DECODE_MIN_TILES: fewest tiles per split
DECODE_BLOCKS = 2048      # blocks worth room for: 4 waves of 2 blocks on 256 multiprocessors
DECODE_MAX_SPLITS = 256


# JA_MHA_SYNC_TILE_ROWS (csrc/include/ja/kernels/mha.h): query rows per word of the backward's sync workspace.
SYNC_TILE_ROWS = 64


def decode_workspace_shape(batch, seq_q, seq_k, heads_q: int, heads_kv: int, head_dim_v: int) -> tuple:
    """(batch, n): the forward's float32 workspace; n = 0 where the split-KV path cannot split, or where
    the batch or a sequence length is symbolic (jax.export): the kernel then runs one split."""
    if heads_q == 0 or not all(isinstance(n, int) for n in (batch, seq_q, seq_k)):
        return (batch, 0)
    rows = heads_q // heads_kv * seq_q
    if rows > DECODE_MAX_ROWS or batch == 0:
        return (batch, 0)
    blocks_per_batch = heads_kv * -(-rows // 16)  # one per kv head and 16 query rows, per split
    splits = min(DECODE_MAX_SPLITS, -(-DECODE_BLOCKS // (batch * blocks_per_batch)),
                 -(-seq_k // DECODE_TILE_KEYS) // DECODE_MIN_TILES)
    if splits <= 1:
        return (batch, 0)
    return (batch, blocks_per_batch * splits * 16 * (head_dim_v + 1))
