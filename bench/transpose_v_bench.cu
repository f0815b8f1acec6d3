// Microbenchmark (GPU machine): V (b, s, h, d) fp32 inside a fused QKV buffer -> V^T (b, h, d,
// s), as the TF32 FMHA's transpose_v (engine/realize/templates/attention_sm90.cu.in) does, at the
// MiniGPT shape, for several tile shapes and block sizes, and a cudaMemcpy of as many bytes for
// the bandwidth ceiling. Prints a markdown table: us per call (median of 20, L2 flushed by a
// 256 MB memset before each) and TB/s counting the read and the write. The kernel here is a copy
// of the template's with the tile as template parameters.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o transpose_v_bench bench/transpose_v_bench.cu
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cstdint>

template <int kTileS, int kTileD, int kThreads>
__global__ void __launch_bounds__(kThreads) transpose_v(const float* __restrict__ v, float* __restrict__ vt,
    int kv_heads, int seq, int dim, int64_t row, int64_t stride_b, int64_t stride_h, int64_t stride_s) {
  constexpr int kVec = 4;
  struct alignas(16) Vec { float x[4]; };
  __shared__ float tile[kTileD][kTileS + 1];
  const int bh = blockIdx.x, b = bh / kv_heads, h = bh % kv_heads;
  const int s0 = blockIdx.y * kTileS, d0 = blockIdx.z * kTileD;
  const float* src = v + b * stride_b + h * stride_h;
  for (int i = threadIdx.x; i < kTileS * (kTileD / kVec); i += kThreads) {
    const int r = i / (kTileD / kVec), c = i % (kTileD / kVec) * kVec;
    const int s = s0 + r, d = d0 + c;
    Vec x = {{0, 0, 0, 0}};
    if (s < seq && d < dim) x = *reinterpret_cast<const Vec*>(src + s * stride_s + d);
    for (int j = 0; j < kVec; ++j) tile[c + j][r] = x.x[j];
  }
  __syncthreads();
  float* dst = vt + static_cast<int64_t>(bh) * dim * row;
  for (int i = threadIdx.x; i < kTileD * (kTileS / kVec); i += kThreads) {
    const int r = i / (kTileS / kVec), c = i % (kTileS / kVec) * kVec;
    const int d = d0 + r, s = s0 + c;
    if (d >= dim || s >= row) continue;
    Vec y;
    for (int j = 0; j < kVec; ++j) y.x[j] = tile[r][c + j];
    *reinterpret_cast<Vec*>(dst + d * row + s) = y;
  }
}

constexpr int B = 128, S = 512, H = 8, D = 96;
float *qkv, *vt; char* flush;

template <int TS, int TD, int T>
void run(const char* name) {
  const int64_t row = S, sb = int64_t(S) * 3 * H * D, sh = D, ss = 3 * H * D;
  const float* v = qkv + 2 * H * D;
  dim3 grid(B * H, (S + TS - 1) / TS, (D + TD - 1) / TD);
  cudaEvent_t a, e; cudaEventCreate(&a); cudaEventCreate(&e);
  std::vector<float> t;
  for (int i = 0; i < 23; ++i) {
    cudaMemsetAsync(flush, i, 256 << 20);
    cudaEventRecord(a);
    transpose_v<TS, TD, T><<<grid, T>>>(v, vt, H, S, D, row, sb, sh, ss);
    cudaEventRecord(e); cudaEventSynchronize(e);
    float ms; cudaEventElapsedTime(&ms, a, e); if (i >= 3) t.push_back(ms * 1e3f);
  }
  std::sort(t.begin(), t.end());
  const double bytes = 2.0 * B * S * H * D * 4;
  printf("| %s | %d x %d, %d threads | %.1f | %.2f |\n", name, TS, TD, T, t[t.size() / 2], bytes / (t[t.size() / 2] * 1e-6) / 1e12);
  cudaError_t err = cudaGetLastError(); if (err) printf("error %s\n", cudaGetErrorString(err));
}

int main() {
  cudaMalloc(&qkv, size_t(B) * S * 3 * H * D * 4); cudaMalloc(&vt, size_t(B) * H * D * S * 4); cudaMalloc(&flush, 256 << 20);
  cudaMemset(qkv, 0, size_t(B) * S * 3 * H * D * 4);
  printf("| variant | tile (keys x dims) | us | TB/s (read + write) |\n| --- | --- | --- | --- |\n");
  run<64, 32, 256>("current");
  run<64, 32, 128>("a");
  run<32, 32, 256>("b");
  run<128, 32, 256>("c");
  run<64, 96, 256>("d");
  run<32, 96, 256>("e");
  run<64, 96, 512>("f");
  run<128, 96, 512>("g");
  run<64, 64, 256>("h");
  run<64, 32, 256>("current again");
  // a plain copy of the same bytes for the bandwidth ceiling
  cudaEvent_t a, e; cudaEventCreate(&a); cudaEventCreate(&e); std::vector<float> t;
  for (int i = 0; i < 23; ++i) { cudaMemsetAsync(flush, i, 256 << 20); cudaEventRecord(a);
    cudaMemcpyAsync(vt, qkv, size_t(B) * H * D * S * 4, cudaMemcpyDeviceToDevice); cudaEventRecord(e); cudaEventSynchronize(e);
    float ms; cudaEventElapsedTime(&ms, a, e); if (i >= 3) t.push_back(ms * 1e3f); }
  std::sort(t.begin(), t.end());
  printf("| cudaMemcpy of as many bytes | - | %.1f | %.2f |\n", t[10], 2.0 * B * S * H * D * 4 / (t[10] * 1e-6) / 1e12);
}
