// Host cost of the driver calls a CUTLASS 3 sm90 GEMM makes on every initialize(): the
// entry-point lookup CUTLASS does before each TMA descriptor (without
// CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL), the descriptor encode itself, cudaFuncSetAttribute,
// and a plain launch, each timed 2000 times (median, us). Issue 31, item 1.
//   nvcc -O2 -arch=sm_90a bench/percall_driver.cu -lcuda -o /tmp/percall_driver
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

__global__ void empty_kernel(int) {}

template <class F>
double median_us(F&& f, int reps = 2000) {
  std::vector<double> t(reps);
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    auto b = std::chrono::steady_clock::now();
    t[i] = std::chrono::duration<double, std::micro>(b - a).count();
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

int main() {
  cudaFree(nullptr);
  void* buf = nullptr;
  cudaMalloc(&buf, 64 << 20);
  cudaDriverEntryPointQueryResult q;
  void* pfn = nullptr;
  auto lookup = [&] {
    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &pfn, 12000, cudaEnableDefault, &q);
  };
  lookup();
  auto encode = reinterpret_cast<decltype(&cuTensorMapEncodeTiled)>(pfn);
  CUtensorMap map;
  cuuint64_t dims[2] = {8192, 1024}, strides[1] = {8192 * 2};
  cuuint32_t box[2] = {64, 128}, estr[2] = {1, 1};
  auto enc = [&] {
    encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, buf, dims, strides, box, estr,
           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  auto attr = [&] {
    cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  };
  auto launch = [&] { empty_kernel<<<1, 32>>>(0); };
  int dev = 0, sms = 0;
  auto sm = [&] { cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev); };
  auto last = [&] { (void)cudaGetLastError(); };
  printf("driver call                          median us\n");
  printf("cudaGetDriverEntryPointByVersion     %8.3f\n", median_us(lookup));
  printf("cuTensorMapEncodeTiled               %8.3f\n", median_us(enc));
  printf("cudaFuncSetAttribute (smem)          %8.3f\n", median_us(attr));
  printf("cudaDeviceGetAttribute (SM count)    %8.3f\n", median_us(sm));
  printf("cudaGetLastError                     %8.3f\n", median_us(last));
  printf("empty kernel launch                  %8.3f\n", median_us(launch));
  cudaDeviceSynchronize();
  return 0;
}
