// FA1 forward kernels of compiled head dim 256. Tiles: one tile, BR 16 x BC 64 with Q inside the reduction buffer, 112.5 KB: devices with that much shared memory per block (sm_80, sm_90).
#include "backends/cuda/fa1/fa1_kernel.cuh"

namespace flashattn {
namespace fa1 {

using Large256 = Tile<256, 16, 16, true>;

FA1_DEFINE_HDIM(256, Large256, Large256)

}  // namespace fa1
}  // namespace flashattn
