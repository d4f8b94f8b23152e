// FA1 forward kernels of compiled head dim 32. Tiles: one tile on every device: BR 32 x BC 256, 47 KB of shared memory.
#include "backends/cuda/fa1/fa1_kernel.cuh"

namespace flashattn {
namespace fa1 {

using Large32 = Tile<32, 32, 64, false>;

FA1_DEFINE_HDIM(32, Large32, Large32)

}  // namespace fa1
}  // namespace flashattn
