#include "web/assets.h"

namespace strata::web {

const Asset* find_asset(std::string_view path) {
  if (path == "/") path = "/index.html";
  for (const Asset& asset : embedded_assets()) {
    if (asset.path == path) return &asset;
  }
  return nullptr;
}

}  // namespace strata::web
