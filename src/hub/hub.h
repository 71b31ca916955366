// Getting GGUF files from the Hugging Face hub (or a mirror of its URL layout) into a local
// cache: resumable, and checked against the size and SHA-256 the hub reports before use.
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace strata::hub {

// `owner/repo` or `owner/repo:file`; an empty `file` means "the repo's GGUF", chosen by
// choose_gguf from the repo's file list.
struct ModelRef {
  std::string owner;
  std::string repo;
  std::string file;
  std::string name() const;  // owner/repo[:file], as given
};

// nullopt when `text` is not shaped like a repo name. A repo part ending in ".gguf" is taken
// for a mistyped file path, not a repo, so a missing file is reported as one.
std::optional<ModelRef> parse_model_ref(std::string_view text);

// $STRATA_CACHE, else $XDG_CACHE_HOME/strata, else ~/.cache/strata.
std::filesystem::path default_cache_dir();

// Where a downloaded file lives: <cache>/<owner>/<repo>/<file>; `ref.file` must be set.
std::filesystem::path cached_path(const std::filesystem::path& cache_dir, const ModelRef& ref);

// The file to take from a repo's list: its one .gguf, else its one Q4_K_M .gguf. Throws,
// naming the candidates, when neither exists.
std::string choose_gguf(const std::vector<std::string>& repo_files, const std::string& repo_name);

struct PullOptions {
  std::filesystem::path cache_dir = default_cache_dir();
  std::string endpoint = "https://huggingface.co";
  std::string token;  // sent as a bearer token when set
  // Attempts after a transfer that broke off (each resumes where the last stopped).
  int attempts = 4;
  std::FILE* progress = stderr;  // a redrawn bar on a terminal, periodic lines otherwise
};

// Endpoint and token from HF_ENDPOINT and HF_TOKEN, the rest defaults.
PullOptions options_from_environment();

// Downloads `ref` into the cache unless it is there already, and returns its path. Throws on
// any failure, keeping a partial download for the next call to resume.
std::filesystem::path pull(const ModelRef& ref, const PullOptions& options);

// The cached file for `ref` without any network access: its named file if downloaded, or
// without a file name the repo's only cached .gguf; nullopt otherwise.
std::optional<std::filesystem::path> find_cached(const std::filesystem::path& cache_dir, const ModelRef& ref);

}  // namespace strata::hub
