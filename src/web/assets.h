// The dashboard's files (web/ in the source tree), built into the binary so that a node serves
// them with nothing to install and nothing fetched from elsewhere.
#pragma once

#include <string_view>
#include <vector>

namespace strata::web {

struct Asset {
  std::string_view path;  // "/index.html", "/app.js", ...
  std::string_view content_type;
  std::string_view bytes;
};

// Every file, as src/web/embed.cmake wrote them.
const std::vector<Asset>& embedded_assets();

// The file served at `path` ("/" is "/index.html"), or null.
const Asset* find_asset(std::string_view path);

}  // namespace strata::web
