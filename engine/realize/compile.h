// The compile driver: nvcc in parallel (one job per core by default) into a content-addressed
// kernel cache. The cache key is the SHA-256 of the source, the flags, nvcc's version, CUTLASS's
// version and the arch -- not the problem sizes, so one binary serves every shape it can
// implement. A failed compile keeps its log and is reported per kernel; the run goes on.
#pragma once

#include <chrono>
#include <functional>
#include <filesystem>
#include <string>
#include <vector>

namespace fact::realize {

// Seconds one compile may take before it is stopped: $FACT_COMPILE_TIMEOUT, else 1800 (an sm90
// CUTLASS kernel takes one to two minutes on one core).
double default_compile_timeout();

struct CompileOptions {
  std::string nvcc = "nvcc";
  std::string cutlass_dir;  // holds include/ and tools/util/include/
  std::string cache_dir;    // default: $FACT_CACHE_DIR or ~/.cache/fact/kernels
  std::string arch = "sm90";
  int jobs = 0;             // 0: default_compile_jobs
  bool quiet = false;
  double timeout_s = default_compile_timeout();  // per compile; 0: none
};

struct CompileJob {
  std::string name;
  std::string source;
};

struct CompileResult {
  std::string name;
  std::string key;
  bool ok = false;
  bool cached = false;
  std::string library;  // path of the .so in the cache
  std::string log;      // path of the build log
  std::string error;    // first lines of the compiler's complaint, when !ok
  // ptxas's performance advisories from the build log (see ptxas_advisories), for a built kernel.
  std::vector<std::string> advisories;
  double seconds = 0;
};

// ptxas's "Potential Performance Loss" advisories in a build log, one per code, in the order
// they appear, without the mangled function name: "C7511: wgmma.mma_async instructions are
// serialized due to insufficient register resources for the wgmma pipeline". A kernel that
// draws one builds and verifies, but its WGMMAs wait on each other or on injected fences: the
// FMHA variants with such serialization ran 13-40 % slower (bench/README.md, "three more levers").
std::vector<std::string> ptxas_advisories(const std::string& log);

// Where CUTLASS lives: `hint`, else $CUTLASS_DIR. UserError when neither is set or the directory
// does not hold CUTLASS's headers.
std::string find_cutlass(const std::string& hint);
std::string cutlass_version(const std::string& cutlass_dir);
// Empty when a cache entry's kernel.so has the size and SHA-256 its meta.json recorded when it
// was built; otherwise what is wrong with it (truncated, altered, no record).
std::string check_cached_library(const std::filesystem::path& entry);

// `fact-engine cache verify|clean`: every entry of the kernel cache checked (check_cached_library);
// with `clean`, damaged entries, failed builds' folders and abandoned builds removed.
struct CacheReport {
  int ok = 0, damaged = 0, removed = 0;
  std::string text;  // a line per damaged entry, then a summary
};
CacheReport check_cache(const std::string& cache_dir, bool clean);
// A digest of every file under the given folders (relative paths and contents), computed once
// per process and folder set: what a kernel compiled against those headers depends on.
std::string tree_digest(const std::vector<std::filesystem::path>& roots);
std::string nvcc_version(const std::string& nvcc);
std::string default_cache_dir();
std::vector<std::string> nvcc_flags(const CompileOptions& opt);
std::string sha256_hex(const std::string& data);

// Removes the private build folders (".tmp-KEY-PID") that compiles killed mid-way left in the
// cache: those whose process is gone from this machine and that nothing wrote to for `min_age`
// (a cache shared between machines may hold another host's live build). Returns how many.
int sweep_abandoned_builds(const std::string& cache_dir, std::chrono::seconds min_age);

// Compile every job (cached ones are reused); results in job order. Progress goes to stderr.
// Sweeps abandoned builds older than an hour first.
std::vector<CompileResult> compile_all(const std::vector<CompileJob>& jobs, const CompileOptions& opt);

// Parallel compiles when CompileOptions::jobs is 0: every kernel at once up to one and a half
// times `cores` (equal, indivisible compiles finish sooner sharing the cores than in a second
// round), else one a core.
int default_compile_jobs(size_t kernels, unsigned cores);

}  // namespace fact::realize
