// FA1 forward kernels of compiled head dim 64. Tiles: large: BR 32 x BC 256, 93 KB (two CTAs per SM on sm_80 / sm_90); small: BR 32 x BC 128, 61 KB (sm_75).
#include "backends/cuda/fa1/fa1_kernel.cuh"

namespace flashattn {
namespace fa1 {

using Large64 = Tile<64, 32, 64, false>;
using Small64 = Tile<64, 32, 32, false>;

FA1_DEFINE_HDIM(64, Large64, Small64)

}  // namespace fa1
}  // namespace flashattn
