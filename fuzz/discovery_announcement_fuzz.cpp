// Arbitrary bytes as a discovery datagram: judging must give a verdict, never crash, hang or
// throw. A MAC cannot be guessed, so half the inputs are signed first: a JSON object in them
// reaches the checks of the fields behind the MAC.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cluster/discovery.h"
#include "rpc/auth.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  static const rpc::ClusterKey key("fuzz");
  static const cluster::Announcement self{.node_id = "self", .host = "10.0.0.2", .node_port = 8081,
                                          .model_hash = "abc", .protocol_version = 1};
  constexpr int64_t kNow = 1'700'000'000'000;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) {
    cluster::judge_announcement(rest, "10.0.0.2", self, key, kNow);
    return 0;
  }
  const nlohmann::json message = nlohmann::json::parse(rest, nullptr, false);
  if (!message.is_object()) return 0;
  cluster::judge_announcement(cluster::sign_announcement(message, key), "10.0.0.2", self, key, kNow);
  return 0;
}
