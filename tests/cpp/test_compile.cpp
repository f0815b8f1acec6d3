// The compile driver: cache housekeeping and ptxas's advisories (compiling with the real nvcc:
// tests/python/test_realize.py; here a stand-in script plays nvcc).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "realize/compile.h"

namespace fs = std::filesystem;
using fact::realize::compile_all;
using fact::realize::CompileJob;
using fact::realize::CompileOptions;
using fact::realize::ptxas_advisories;
using fact::realize::sweep_abandoned_builds;

namespace {

// A process id that has just exited (and was reaped): no such process now.
pid_t dead_pid() {
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

fs::path build_folder(const fs::path& cache, pid_t pid, char fill, bool old) {
  const fs::path dir = cache / (".tmp-" + std::string(64, fill) + "-" + std::to_string(pid));
  fs::create_directories(dir);
  std::ofstream(dir / "kernel.cu") << "// half a build\n";
  if (old) {
    const auto past = fs::file_time_type::clock::now() - std::chrono::hours(2);
    fs::last_write_time(dir / "kernel.cu", past);
    fs::last_write_time(dir, past);
  }
  return dir;
}

}  // namespace

TEST(CompileCache, SweepsOnlyOldBuildsOfGoneProcesses) {
  const fs::path cache = fs::path(testing::TempDir()) / ("fact-sweep-" + std::to_string(getpid()));
  fs::remove_all(cache);
  const pid_t gone = dead_pid();
  const auto abandoned = build_folder(cache, gone, 'a', true);
  const auto fresh = build_folder(cache, gone, 'b', false);     // its process may be a moment gone
  const auto running = build_folder(cache, getpid(), 'c', true);  // this process is alive
  const fs::path entry = cache / std::string(64, 'd');            // a published kernel
  fs::create_directories(entry);
  const fs::path odd = cache / ".tmp-not-a-build-1";
  fs::create_directories(odd);
  const fs::path huge_pid = cache / (".tmp-" + std::string(64, 'e') + "-123456789012345678901234");
  fs::create_directories(huge_pid);

  EXPECT_EQ(sweep_abandoned_builds(cache.string(), std::chrono::hours(1)), 1);
  EXPECT_FALSE(fs::exists(abandoned));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_TRUE(fs::exists(running));
  EXPECT_TRUE(fs::exists(entry));
  EXPECT_TRUE(fs::exists(odd));
  EXPECT_TRUE(fs::exists(huge_pid));  // no such pid: not a build folder of this scheme
  EXPECT_EQ(sweep_abandoned_builds((cache / "missing").string(), std::chrono::hours(1)), 0);
  fs::remove_all(cache);
}

TEST(PtxasAdvisories, OnePerCodeWithoutTheFunction) {
  const std::string log =
      "kernel.cu(12): warning #177-D: variable \"x\" was declared but never referenced\n"
      "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
      "insufficient register resources for the wgmma pipeline in the function '_ZN7cutlass13device_kernelI1AEEvNT_6ParamsE'\n"
      "ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
      "insufficient register resources for the wgmma pipeline in the function '_ZN7cutlass13device_kernelI1BEEvNT_6ParamsE'\n"
      "ptxas info    : (C7519) Potential Performance Loss: warpgroup.arrive injected.\r\n"
      "ptxas info    : Used 168 registers\n";
  const auto a = ptxas_advisories(log);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0],
            "C7511: wgmma.mma_async instructions are serialized due to insufficient register resources for the "
            "wgmma pipeline");
  EXPECT_EQ(a[1], "C7519: warpgroup.arrive injected");
  EXPECT_TRUE(ptxas_advisories("ptxas info    : Used 168 registers\n").empty());
  EXPECT_TRUE(ptxas_advisories("").empty());
}

// compile_all reports the advisories of a fresh build and, from the cached build log, of a
// cached one; a clean build reports none. The stand-in nvcc prints an advisory for sources
// that ask for one.
TEST(PtxasAdvisories, ReportedFreshAndCached) {
  const fs::path root = fs::path(testing::TempDir()) / ("fact-advisories-" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "cutlass" / "include" / "cutlass");
  std::ofstream(root / "cutlass" / "include" / "cutlass" / "cutlass.h") << "// stand-in\n";
  const fs::path nvcc = root / "nvcc";
  std::ofstream(nvcc) << "#!/bin/sh\n"
                         "[ \"$1\" = --version ] && { echo 'stand-in nvcc, release 0.0'; exit 0; }\n"
                         "out=''; src=''; prev=''\n"
                         "for a in \"$@\"; do [ \"$prev\" = -o ] && out=$a; case $a in *.cu) src=$a;; esac; prev=$a; done\n"
                         "grep -q SERIALIZE \"$src\" && echo \"ptxas info    : (C7511) Potential Performance Loss: "
                         "wgmma.mma_async instructions are serialized due to insufficient register resources for the "
                         "wgmma pipeline in the function '_Z1kv'\"\n"
                         "echo so > \"$out\"\n";
  fs::permissions(nvcc, fs::perms::owner_all);
  CompileOptions opt;
  opt.nvcc = nvcc.string();
  opt.cutlass_dir = (root / "cutlass").string();
  opt.cache_dir = (root / "cache").string();
  opt.jobs = 1;
  opt.quiet = true;
  const std::vector<CompileJob> jobs = {{"slow", "// SERIALIZE\n"}, {"clean", "// fine\n"}};
  for (const bool cached : {false, true}) {
    const auto r = compile_all(jobs, opt);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_TRUE(r[0].ok && r[1].ok);
    EXPECT_EQ(r[0].cached, cached);
    ASSERT_EQ(r[0].advisories.size(), 1u) << "cached: " << cached;
    EXPECT_EQ(r[0].advisories[0].substr(0, 7), "C7511: ");
    EXPECT_TRUE(r[1].advisories.empty());
  }
  fs::remove_all(root);
}

TEST(CompileJobs, EveryKernelAtOnceUpToOneAndAHalfTimesTheCores) {
  using fact::realize::default_compile_jobs;
  EXPECT_EQ(default_compile_jobs(21, 16), 21);  // MiniGPT's cold compile on the GPU machine
  EXPECT_EQ(default_compile_jobs(24, 16), 24);
  EXPECT_EQ(default_compile_jobs(25, 16), 16);  // beyond: one a core, in rounds
  EXPECT_EQ(default_compile_jobs(3, 2), 3);
  EXPECT_EQ(default_compile_jobs(4, 2), 2);
  EXPECT_EQ(default_compile_jobs(5, 16), 5);
  EXPECT_EQ(default_compile_jobs(0, 16), 1);
  EXPECT_EQ(default_compile_jobs(4, 0), 1);  // hardware_concurrency() may not know: one at a time
}
