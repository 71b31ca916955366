// This user's local secret: made once, readable by the user only, the same for nodes that start
// together, and refused when its file could be read, or put in place, by anyone else.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <vector>

#include "cluster/node_identity.h"

namespace strata::cluster {
namespace {

namespace fs = std::filesystem;

class LocalSecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/strata-secret-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    home_ = pattern;
    const char* previous = std::getenv("XDG_STATE_HOME");
    previous_ = previous ? std::optional<std::string>(previous) : std::nullopt;
    ::setenv("XDG_STATE_HOME", home_.c_str(), 1);
  }
  void TearDown() override {
    if (previous_) {
      ::setenv("XDG_STATE_HOME", previous_->c_str(), 1);
    } else {
      ::unsetenv("XDG_STATE_HOME");
    }
    fs::remove_all(home_);
  }
  fs::path dir() const { return home_ / "strata"; }
  fs::path file() const { return dir() / "local-secret"; }
  static fs::perms mode(const fs::path& p) { return fs::symlink_status(p).permissions() & fs::perms::mask; }

  fs::path home_;
  std::optional<std::string> previous_;
};

TEST_F(LocalSecretTest, IsMadeOnceAndReadableByItsUserOnly) {
  const std::string secret = read_or_create_local_secret();
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << secret;
  EXPECT_EQ(mode(file()), fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(mode(dir()), fs::perms::owner_all);
  EXPECT_EQ(read_or_create_local_secret(), secret);
}

TEST_F(LocalSecretTest, NodesStartingTogetherAgreeOnOne) {
  std::vector<std::future<std::string>> secrets;
  for (int i = 0; i < 8; ++i) secrets.push_back(std::async(std::launch::async, read_or_create_local_secret));
  std::set<std::string> distinct;
  for (auto& s : secrets) distinct.insert(s.get());
  EXPECT_EQ(distinct.size(), 1u);
  EXPECT_FALSE(fs::exists(dir() / "node-id")) << "only the secret is made";
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir())) ++files;
  EXPECT_EQ(files, 1u) << "no partial file is left";
}

TEST_F(LocalSecretTest, RefusesAFileOthersMayRead) {
  read_or_create_local_secret();
  fs::permissions(file(), fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
  EXPECT_THROW(read_or_create_local_secret(), std::runtime_error);
}

TEST_F(LocalSecretTest, RefusesALinkInItsPlace) {
  fs::create_directories(dir());
  fs::permissions(dir(), fs::perms::owner_all);
  const fs::path elsewhere = home_ / "other";
  std::ofstream(elsewhere) << std::string(64, 'a') << "\n";
  fs::permissions(elsewhere, fs::perms::owner_read | fs::perms::owner_write);
  fs::create_symlink(elsewhere, file());
  EXPECT_THROW(read_or_create_local_secret(), std::runtime_error);
  fs::remove(file());
  fs::create_hard_link(elsewhere, file());
  EXPECT_THROW(read_or_create_local_secret(), std::runtime_error) << "a second name of some other file";
}

TEST_F(LocalSecretTest, RefusesADirectoryOthersMayWriteTo) {
  fs::create_directories(dir());
  fs::permissions(dir(), fs::perms::owner_all | fs::perms::group_all | fs::perms::others_all);
  EXPECT_THROW(read_or_create_local_secret(), std::runtime_error);
}

TEST_F(LocalSecretTest, RefusesWhatIsNotASecretOfItsOwn) {
  fs::create_directories(dir());
  fs::permissions(dir(), fs::perms::owner_all);
  std::ofstream(file()) << "-----BEGIN OPENSSH PRIVATE KEY-----\n";
  fs::permissions(file(), fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_THROW(read_or_create_local_secret(), std::runtime_error);
}

TEST_F(LocalSecretTest, RefusesAnotherUsersFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "only root can give a file to another user";
  read_or_create_local_secret();
  ASSERT_EQ(::chown(file().c_str(), 65534, 65534), 0);
  EXPECT_THROW(read_or_create_local_secret(), std::runtime_error);
}

}  // namespace
}  // namespace strata::cluster
