// Golden-file comparison for emitted kernel sources (test_emit*.cpp).
//
// Update the files after an intended change with FACT_UPDATE_GOLDEN=1 ctest -R Emit.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "families/gemm/emit.h"

namespace fact::test {

inline void expect_golden(const realize::EmittedKernel& k, const std::string& file) {
  const auto path = std::filesystem::path(FACT_TEST_DATA) / ".." / "golden" / file;
  if (std::getenv("FACT_UPDATE_GOLDEN")) {
    std::ofstream(path) << k.source;
    GTEST_SKIP() << "updated " << path;
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << path << " missing: run with FACT_UPDATE_GOLDEN=1";
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  EXPECT_EQ(k.source, os.str()) << "emitted source differs from " << path
                                << " (FACT_UPDATE_GOLDEN=1 to accept an intended change)";
}

}  // namespace fact::test
