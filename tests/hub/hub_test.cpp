// Model names, the cache's layout and the choice of a repo's GGUF; downloads are tested against
// a local hub by pull_test.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "hub/hub.h"
#include "hub/progress.h"

namespace {

namespace fs = std::filesystem;
using strata::hub::ModelRef;

TEST(ModelRef, ParsesRepoAndFile) {
  const auto ref = strata::hub::parse_model_ref("TheBloke/TinyLlama-1.1B-GGUF:tinyllama.Q4_K_M.gguf");
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->owner, "TheBloke");
  EXPECT_EQ(ref->repo, "TinyLlama-1.1B-GGUF");
  EXPECT_EQ(ref->file, "tinyllama.Q4_K_M.gguf");
  EXPECT_EQ(ref->name(), "TheBloke/TinyLlama-1.1B-GGUF:tinyllama.Q4_K_M.gguf");
}

TEST(ModelRef, FileIsOptionalAndMayBeInAFolder) {
  const auto bare = strata::hub::parse_model_ref("owner/repo_name.v2");
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->file, "");
  EXPECT_EQ(bare->name(), "owner/repo_name.v2");
  const auto nested = strata::hub::parse_model_ref("o/r:Q4_K_M/model-00001-of-00002.gguf");
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->file, "Q4_K_M/model-00001-of-00002.gguf");
}

TEST(ModelRef, PathsAreNotRepoNames) {
  for (const char* text : {"model.gguf", "/abs/model.gguf", "./models/x", "../shared/models", "a/b/c",
                           "models/llama.gguf", "owner/", "/repo", "", "own er/repo", "-x/repo", "o/..", ".hidden/r"}) {
    EXPECT_FALSE(strata::hub::parse_model_ref(text)) << text;
  }
}

TEST(ModelRef, FileNamesThatLeaveTheCacheAreRefused) {
  for (const char* text : {"o/r:", "o/r:../x.gguf", "o/r:/etc/passwd", "o/r:a//b.gguf", "o/r:a/./b.gguf", "o/r:a/"}) {
    EXPECT_THROW(strata::hub::parse_model_ref(text), std::invalid_argument) << text;
  }
}

TEST(Cache, PathIsOwnerRepoFile) {
  ModelRef ref{"o", "r", "sub/m.gguf"};
  EXPECT_EQ(strata::hub::cached_path("/c", ref), fs::path("/c/o/r/sub/m.gguf"));
  ref.file.clear();
  EXPECT_THROW(strata::hub::cached_path("/c", ref), std::logic_error);
}

class Environment : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kNames) {
      if (const char* value = std::getenv(name)) saved_.emplace_back(name, value);
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kNames) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

 private:
  static constexpr const char* kNames[] = {"STRATA_CACHE", "XDG_CACHE_HOME", "HOME", "HF_ENDPOINT", "HF_TOKEN"};
  std::vector<std::pair<std::string, std::string>> saved_;
};

TEST_F(Environment, CacheDirectoryByPrecedence) {
  ::setenv("HOME", "/home/u", 1);
  EXPECT_EQ(strata::hub::default_cache_dir(), fs::path("/home/u/.cache/strata"));
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(strata::hub::default_cache_dir(), fs::path("/xdg/strata"));
  ::setenv("STRATA_CACHE", "/models", 1);
  EXPECT_EQ(strata::hub::default_cache_dir(), fs::path("/models"));
}

TEST_F(Environment, EndpointAndToken) {
  EXPECT_EQ(strata::hub::options_from_environment().endpoint, "https://huggingface.co");
  EXPECT_EQ(strata::hub::options_from_environment().token, "");
  ::setenv("HF_ENDPOINT", "http://127.0.0.1:9/mirror//", 1);
  ::setenv("HF_TOKEN", "hf_abc", 1);
  EXPECT_EQ(strata::hub::options_from_environment().endpoint, "http://127.0.0.1:9/mirror");
  EXPECT_EQ(strata::hub::options_from_environment().token, "hf_abc");
}

TEST(ChooseGguf, TheOnlyGguf) {
  EXPECT_EQ(strata::hub::choose_gguf({"README.md", "config.json", "model.GGUF"}, "o/r"), "model.GGUF");
}

TEST(ChooseGguf, TheOnlyQ4KM) {
  EXPECT_EQ(strata::hub::choose_gguf({"m.Q8_0.gguf", "m.q4_k_m.gguf", "m.Q4_K_S.gguf"}, "o/r"), "m.q4_k_m.gguf");
}

TEST(ChooseGguf, NamesTheChoicesWhenItCannotChoose) {
  try {
    strata::hub::choose_gguf({"b.Q8_0.gguf", "a.F16.gguf", "notes.txt"}, "o/r");
    FAIL() << "chose a file";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "o/r has 2 .gguf files and no Q4_K_M one; name one as o/r:FILE: a.F16.gguf, b.Q8_0.gguf");
  }
  EXPECT_THROW(strata::hub::choose_gguf({"x-Q4_K_M-00001-of-00002.gguf", "x-Q4_K_M-00002-of-00002.gguf"}, "o/r"),
               std::runtime_error);
  EXPECT_THROW(strata::hub::choose_gguf({"README.md"}, "o/r"), std::runtime_error);
}

TEST(FindCached, NamedFileOrTheRepoOnlyGguf) {
  const fs::path cache = fs::temp_directory_path() / ("strata_hub_test_" + std::to_string(::getpid()));
  fs::remove_all(cache);
  const ModelRef bare{"o", "r", ""};
  EXPECT_FALSE(strata::hub::find_cached(cache, bare));
  fs::create_directories(cache / "o" / "r" / "sub");
  std::ofstream(cache / "o" / "r" / "sub" / "a.gguf") << "x";
  std::ofstream(cache / "o" / "r" / "b.gguf.partial") << "x";
  EXPECT_EQ(strata::hub::find_cached(cache, bare), cache / "o" / "r" / "sub" / "a.gguf");
  EXPECT_EQ(strata::hub::find_cached(cache, ModelRef{"o", "r", "sub/a.gguf"}), cache / "o" / "r" / "sub" / "a.gguf");
  EXPECT_FALSE(strata::hub::find_cached(cache, ModelRef{"o", "r", "b.gguf"}));
  std::ofstream(cache / "o" / "r" / "c.gguf") << "x";
  EXPECT_FALSE(strata::hub::find_cached(cache, bare)) << "two cached files: the hub must choose";
  fs::remove_all(cache);
}

TEST(Progress, PlainLinesEveryTenth) {
  char* text = nullptr;
  size_t size = 0;
  std::FILE* out = ::open_memstream(&text, &size);
  strata::hub::Progress progress(out, "m.gguf", 1000);
  progress.start(0);
  for (uint64_t have = 0; have <= 1000; have += 10) progress.update(have);
  progress.finish(1000);
  std::fclose(out);
  const std::string lines(text, size);
  std::free(text);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 10) << lines;
  EXPECT_NE(lines.find("strata: m.gguf: 500 B of 1000 B (50%)"), std::string::npos) << lines;
  EXPECT_EQ(lines.find('\r'), std::string::npos) << lines;
}

}  // namespace
