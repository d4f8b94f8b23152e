// FA2 forward kernels for sm_80+: the one header the instantiation units (fa2_fwd_hdim*.cu)
// include. The code is split by role, as FlashAttention-3's hopper/ tree is:
//   fa2_traits.cuh          tile geometry (KernelTraits, TraitsFor) and the pack-GQA row mapping
//   fa2_load.cuh            global -> shared cp.async tile loaders                   (generic)
//   fa2_gemm.cuh            warp GEMMs S = Q K^T and O += P V on mma.sync             (generic)
//   fa2_epilogue.cuh        O / LSE / split-KV partial stores                         (generic)
//   fa2_mainloop.cuh        the K/V pipeline over one CTA's key tiles            (forward-only)
//   fa2_tile_scheduler.cuh  grid shape, CTA -> work, a split's key tiles         (forward-only)
//   fa2_fwd_kernel.cuh      the __global__ forward kernel that assembles them    (forward-only)
//   fa2_launch.cuh          host launchers launch_fwd / launch_hdim              (forward-only)
// "Generic": templated on KernelTraits only, with no forward-pipeline state, so that a backward or
// another forward variant reuses them (the epilogue's destinations still come from Params). The
// masking and online softmax steps are shared with FA3 (device/mask.cuh, device/online_softmax.cuh);
// the split-KV combine kernel is fa2_merge.cu. Each head dim is one unit so that the build
// parallelises; all of them include this file and call launch_hdim<D>. The backward pass is
// fa2_bwd_* (its own units from fa2_bwd_hdim.cu.in; it reuses gemm_qk and the loaders' addressing).
#pragma once

#include "backends/cuda/fa2/fa2_launch.cuh"
