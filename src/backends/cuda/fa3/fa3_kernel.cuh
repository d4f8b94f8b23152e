// FA3 forward kernels (sm_90a): the one header the instantiation units include. The kernel is
// split by role:
//   fa3_traits.cuh          tile traits, shared-memory layout, barriers, pipeline phases
//   fa3_tile_scheduler.cuh  the persistent tile scheduler and TMA coordinates
//   fa3_producer.cuh        the TMA load warp
//   fa3_gather.cuh          the cp.async load warpgroup of paged caches and seqused_k
//   fa3_mainloop.cuh        the consumer's key-tile loop (S GEMM, mask, online softmax, P.V)
//   fa3_epilogue.cuh        O and LSE stores
//   fa3_fwd_kernel.cuh      the __global__ kernel (warpgroup roles, setmaxnreg)
//   fa3_launch.cuh          the host launcher (launch_fwd)
#pragma once

#include "backends/cuda/fa3/fa3_launch.cuh"
