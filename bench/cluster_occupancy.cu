// How many thread-block clusters of each size a GPU runs at once, for a kernel shaped like FACT's
// sm90 GEMMs (384 threads, one CTA per SM by shared memory): cudaOccupancyMaxActiveClusters.
// The SMs a persistent GEMM with that cluster shape can use are clusters x cluster size; the
// rest idle. CUTLASS's own estimate (no query) assumes 18 SMs per GPC.
//
//   nvcc -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/cluster_occupancy.cu -o cluster_occupancy
//   ./cluster_occupancy      # on the GPU machine
#include <cuda_runtime.h>

#include <cstdio>

__global__ void busy(int* out) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0 && out) out[blockIdx.x] = smem[blockDim.x - 1];
}

int main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  const int smem = 200 * 1024;  // more than half an SM's 228 KB: one CTA per SM
  cudaFuncSetAttribute(busy, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(busy, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("%s: %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("cluster  max active clusters  SMs used\n");
  for (int size : {1, 2, 4, 8, 16}) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = size;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(size, 1, 1);
    config.blockDim = dim3(384, 1, 1);
    config.dynamicSmemBytes = smem;
    config.attrs = &attr;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, busy, &config);
    if (err != cudaSuccess) {
      std::printf("%7d  %s\n", size, cudaGetErrorString(err));
      cudaGetLastError();
      continue;
    }
    std::printf("%7d  %19d  %8d\n", size, clusters, clusters * size);
  }
  return 0;
}
