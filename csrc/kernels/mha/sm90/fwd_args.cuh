// The Hopper (sm_90a) attention forward's parameters and tiles (sm90/fwd_kernel.cuh says how the kernel runs):
// the features it takes, its traits (tile sizes, shared-memory layouts, TMA loads, pipeline), the consumer
// warpgroups' named barriers and the softcap kernels' share of exp2 on the FMA pipe.
#pragma once
#include "ja/kernels/mha.h"
#include "ja/kernels/mha_features.h"
#include "mha/sm90/common.cuh"
#include "mha/sm90/dims.h"

namespace ja {
namespace mha_sm90 {

// The features (ja::MhaFeature) the Hopper forward handles; it declines a call with any other (bias,
// dropout: the mma.sync kernels' path).
constexpr uint32_t kFwdFeatures = kMhaHeadDimV | kMhaRows | kMhaSoftcap | kMhaAlibi;

// D: head dim of q and k (the instance's); DV: of v and o.
template <typename Element_, int D, int DV = D>
struct Traits {
  using Element = Element_;
  static constexpr int kHeadDim = D;
  static constexpr int kHeadDimV = DV;
  static constexpr int kBlockM = 128;  // query rows per block: 2 consumer warpgroups x 64
  // Keys per tile: what fits two stages of K and V beside Q (227 KB).
  static constexpr int kBlockN = (D <= 128 && DV <= 128) ? 128 : (D <= 192 && DV <= 128) ? 128 : D <= 192 ? 112 : 80;
  static constexpr int kStages = 2;
  static constexpr int kConsumers = 2;  // consumer warpgroups
  static constexpr int kMmaThreads = 128 * kConsumers;
  static constexpr int kThreads = kMmaThreads + 128;
  static_assert(D % 16 == 0 && DV % 16 == 0, "wgmma needs head dims that are multiples of 16");

  using TileShape = Shape<Int<kBlockM>, Int<kBlockN>, Int<D>>;
  using AtomLayout = Layout<Shape<Int<kConsumers>, _1, _1>>;
  using MmaAtom0 = decltype(ss_atom<Element, kBlockM, kBlockN, D>());
  static_assert(atom_n<MmaAtom0>() == kBlockN,
                "S = Q K^T should be one wgmma wide along the key tile (a narrower atom re-reads Q per slice)");
  using TiledMma0 = decltype(make_tiled_mma(MmaAtom0{}, AtomLayout{}));
  using MmaAtom1 = decltype(rs_atom<Element, kBlockM, DV, kBlockN, GMMA::Major::K, GMMA::Major::MN>());
  static_assert(atom_n<MmaAtom1>() == DV, "O += P V should be one wgmma wide along the head dim");
  using TiledMma1 = decltype(make_tiled_mma(MmaAtom1{}, AtomLayout{}));

  using SmemLayoutQ = decltype(tile_to_shape(SmemAtomK<Element, D>{}, Shape<Int<kBlockM>, Int<D>>{}));
  using SmemLayoutK = decltype(tile_to_shape(SmemAtomK<Element, D>{}, Shape<Int<kBlockN>, Int<D>, Int<kStages>>{}));
  using SmemLayoutV = decltype(tile_to_shape(SmemAtomK<Element, DV>{}, Shape<Int<kBlockN>, Int<DV>, Int<kStages>>{}));
  // V^T as the B operand of O += P V: a view of the same bytes, (DV, kBlockN, stage).
  using SmemLayoutVt = decltype(composition(SmemLayoutV{}, make_layout(Shape<Int<DV>, Int<kBlockN>, Int<kStages>>{},
                                                                       Stride<Int<kBlockN>, _1, Int<kBlockN * DV>>{})));

  using ShapeQKV = Shape<int32_t, int32_t, int32_t, int32_t>;  // (seq, head_dim, heads, batch)
  using StrideQKV = Stride<int64_t, _1, int64_t, int64_t>;
  using GmemQKV = decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), ShapeQKV{}, StrideQKV{}));
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemQKV{}, SmemLayoutQ{}, Shape<Int<kBlockM>, Int<D>>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemQKV{}, take<0, 2>(SmemLayoutK{}),
                                      Shape<Int<kBlockN>, Int<D>>{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemQKV{}, take<0, 2>(SmemLayoutV{}),
                                      Shape<Int<kBlockN>, Int<DV>>{}, _1{}));

  using Pipeline = cutlass::PipelineTmaAsync<kStages>;
  using PipelineState = typename Pipeline::PipelineState;

  // Bytes each box lands (the full box: the columns and rows TMA fills with zeros count too).
  static constexpr uint32_t kBytesQ = uint32_t(size(SmemLayoutQ{}) * sizeof(Element));
  static constexpr uint32_t kBytesK = uint32_t(size(take<0, 2>(SmemLayoutK{})) * sizeof(Element));
  static constexpr uint32_t kBytesV = uint32_t(size(take<0, 2>(SmemLayoutV{})) * sizeof(Element));

  struct SharedStorage {
    array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cutlass::arch::ClusterTransactionBarrier barrier_q;
    typename Pipeline::SharedStorage pipeline_k;
    typename Pipeline::SharedStorage pipeline_v;
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "MHA forward (sm90) tiles exceed shared memory");

  struct Params {
    TmaQ tma_q;
    TmaK tma_k;
    TmaV tma_v;
    ShapeQKV shape_q, shape_k, shape_v;
    Element* o;
    float* lse;
    int64_t o_row_stride, o_batch_stride;  // elements; o is [batch, seq_q, heads_q, dv]
    int32_t dv, heads_q, group;            // group: query heads per kv head
    float s2;       // the exponent's factor: u log2(e), u = softcap (SOFTCAP) or scale
    float tanh_in;  // SOFTCAP: x = tanh(q.k * tanh_in), tanh_in = scale / softcap
    const float* alibi;  // ALIBI: slopes [., heads_q]
    int64_t alibi_batch_stride;
    float alibi_mul;  // ALIBI: 1 / u
    JaMhaProblem pr;  // the call's problem (sm90_row reads its mask)
    int64_t chunk;  // causal: (head, batch) pairs per chunk of the block order (causal_chunk)
    const Element *q, *k, *v;  // the inputs, for rows computed again (exact_fwd_row)
  };
};

// Named barriers (ids after cutlass's reserved ones): the consumer warpgroups' turns.
enum : int { kBarrierWG1 = 1, kBarrierWG2 = 2 };

// The softcap kernels' share of exp2 on the FMA pipe: every kSoftcapEmu-th column of a thread's scores.
// On the H200 (bf16, d128, softcap 50; benchmarks/gpu/check_mha_fwd_sm90.cu's "emu" rows time every 2nd,
// 3rd, 4th column and none) every 3rd was the fastest causal and close to the best without a mask;
// every 2nd moves too much onto the FMA pipe, none leaves all of it on the multifunction unit. At
// d128 the softcap kernel stays slower than the plain one: the multifunction unit's two operations a
// score (tanh, exp2) and the FMA pipe's extra work together outlast the tensor cores' part of the tile.
constexpr int kSoftcapEmu = 3;

}  // namespace mha_sm90
}  // namespace ja
