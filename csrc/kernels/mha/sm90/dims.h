// Which head dims the sm_90a (wgmma + TMA) attention kernels run, and in which generated instance: one home
// for that rule, read by the dispatch (dispatch.h, to pick the instance) and by the kernels
// (sm90/fwd_kernel.cuh, sm90/bwd_kernel*.cuh, to decline what they cannot run). A plain C++ header: the
// host-compiled dispatch includes it.
//
// A kernel of head dim D runs head dims d (of q and k) and d_v (of v and o) up to D that are multiples of
// 8: the TMA unit loads boxes of D columns and fills the columns past the tensor's d with zeros (they add
// 0 to Q K^T, and the extra columns of P V are never stored), so no copy is made. A multiple of 8 is what
// TMA needs (every stride of a [batch, seq, heads, d] tensor a multiple of 16 bytes). Other head dims are
// declined here, and the mma.sync / SIMT kernels take them.
//
// The forward has a kernel of head dim 80, held by the 96 instance: a call of head dim 80 padded to 96 does
// 1.2 times the products. The backward has none (its 96 kernel runs those calls, padded): each of its
// warpgroups takes half of dQ's columns, and 40 columns are tiled by no swizzle atom. The forward has a kernel
// of head dim 160, held by the 256 instance (as 192 is); the backward runs those calls on its 192 kernel, padded
// (a split-head-dim kernel at 160, dQ in five slices of 32 columns, timed slower than the 192 kernel on the
// H200; the commit that added the forward's 160 kernel gives the times).
#pragma once
#include <cstdint>

namespace ja {
namespace mha_sm90 {

// The head dims of the sm_90a kernels, ascending: the forward's, and the backward's.
constexpr int kSm90FwdKernelDims[] = {64, 80, 96, 128, 160, 192, 256};
constexpr int kSm90BwdKernelDims[] = {64, 96, 128, 192, 256};

// The smallest of dims >= both head dims (d, d_v), or 0 where none is (too large, or not a multiple of 8).
template <int N>
constexpr int sm90_smallest_dim(const int (&dims)[N], int64_t d, int64_t d_v) {
  if (d <= 0 || d_v <= 0 || d % 8 != 0 || d_v % 8 != 0) return 0;
  const int64_t need = d > d_v ? d : d_v;
  for (int D : dims)
    if (need <= D) return D;
  return 0;
}

// The kernel head dim that runs a problem of head dims (d, d_v) forward, and backward.
constexpr int sm90_fwd_kernel_head_dim(int64_t d, int64_t d_v) { return sm90_smallest_dim(kSm90FwdKernelDims, d, d_v); }
constexpr int sm90_bwd_kernel_head_dim(int64_t d, int64_t d_v) { return sm90_smallest_dim(kSm90BwdKernelDims, d, d_v); }

// The generated instance (the head_dim axis value of jax_aiter/jit/optCompilerConfig.json's mha modules)
// whose sm_90a entries run those kernels (both directions: the backward's kernel is the instance's own): the
// backward kernel's head dim, except 192, which the 256 instance holds (the axis has no 192), or 0.
constexpr int sm90_instance_head_dim(int64_t d, int64_t d_v) {
  const int k = sm90_bwd_kernel_head_dim(d, d_v);
  return k == 192 ? 256 : k;
}

}  // namespace mha_sm90
}  // namespace ja
