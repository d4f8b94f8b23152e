// FA1 forward kernels of compiled head dim 128. Tiles: large: BR 32 x BC 128 with Q inside the reduction buffer, 113 KB (two CTAs per SM on sm_90); small: BR 16 x BC 64, 60.5 KB (sm_75, sm_86 / sm_89).
#include "backends/cuda/fa1/fa1_kernel.cuh"

namespace flashattn {
namespace fa1 {

using Large128 = Tile<128, 32, 32, true>;
using Small128 = Tile<128, 16, 16, false>;

FA1_DEFINE_HDIM(128, Large128, Small128)

}  // namespace fa1
}  // namespace flashattn
