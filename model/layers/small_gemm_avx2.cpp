// small_gemm_kernel.inc compiled for avx2 (its -m flags: model/CMakeLists.txt).
#define AC_SG_NAME small_linear_f32_avx2
#include "model/layers/small_gemm_kernel.inc"
