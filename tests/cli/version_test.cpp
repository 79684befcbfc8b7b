#include <gtest/gtest.h>

#include <string>

#include "support/test_util.h"

namespace metro {
namespace {

TEST(VersionCli, NamesVersionCommitBuildTypeAndKernels) {
  for (const char* flag : {"--version", "version", "-V"}) {
    auto r = testing::run_metro({flag});
    ASSERT_EQ(r.exit_code, 0) << flag << ": " << r.err;
    EXPECT_EQ(r.out.rfind("metro ", 0), 0u) << r.out;
    for (const char* part : {"commit ", " build", "kernels "}) {
      EXPECT_NE(r.out.find(part), std::string::npos) << flag << ": " << r.out;
    }
  }
  // The command list names it.
  auto help = testing::run_metro({"--help"});
  EXPECT_NE(help.out.find("version"), std::string::npos);
}

}  // namespace
}  // namespace metro
