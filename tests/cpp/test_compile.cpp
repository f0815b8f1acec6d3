// The compile driver's cache housekeeping (compiling itself needs nvcc: tests/python/test_realize.py).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "realize/compile.h"

namespace fs = std::filesystem;
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
