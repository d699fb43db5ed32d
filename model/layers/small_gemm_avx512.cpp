// small_gemm_kernel.inc compiled for avx512 (its -m flags: model/CMakeLists.txt).
#define AC_SG_NAME small_linear_f32_avx512
#include "model/layers/small_gemm_kernel.inc"
