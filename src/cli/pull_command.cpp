#include <cstdio>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/option_checks.h"
#include "hub/hub.h"

namespace strata::cli {
namespace {

struct PullCommandOptions {
  std::string model;
  std::string cache_dir;
  int retries = 3;
};

int pull(const PullCommandOptions& o) {
  const std::optional<hub::ModelRef> ref = hub::parse_model_ref(o.model);
  if (!ref) throw std::invalid_argument("'" + o.model + "' is not a model name of the form OWNER/REPO[:FILE]");
  hub::PullOptions options = hub::options_from_environment();
  if (!o.cache_dir.empty()) options.cache_dir = o.cache_dir;
  options.attempts = o.retries + 1;
  // The path alone goes to stdout, so that a script can take it: -m "$(strata pull ...)".
  std::printf("%s\n", hub::pull(*ref, options).c_str());
  return 0;
}

}  // namespace

void add_pull_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<PullCommandOptions>();
  CLI::App* cmd = app.add_subcommand("pull", "Download a GGUF model from Hugging Face into the cache; prints its path");
  cmd->add_option("model", o->model,
                  "OWNER/REPO[:FILE]; without FILE, the repo's only .gguf or its only Q4_K_M one")
      ->required();
  cmd->add_option("--cache-dir", o->cache_dir,
                  "Where models are kept (default: $STRATA_CACHE, $XDG_CACHE_HOME/strata or ~/.cache/strata)");
  cmd->add_option("--retries", o->retries, "Times a transfer that broke off is resumed before giving up")
      ->check(non_negative_number())->capture_default_str();
  cmd->callback([o, &action] { action = [o] { return pull(*o); }; });
}

}  // namespace strata::cli
