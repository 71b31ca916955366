// The cluster key: the secret every node of a cluster holds (--cluster-key, or on one machine
// its user's local secret). Node links are TLS bound to it (rpc/tls.h): a caller without it
// is refused in the handshake, and nobody on the network reads or alters what the links
// carry. Inside a link every call carries besides its sender, a time, a fresh nonce and an
// HMAC-SHA256 of them and the method under the key; the receiver refuses a wrong or missing
// MAC, a time more than a minute away from its own, and a nonce it has already seen.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "rpc/tls.h"

namespace strata::rpc {

class ClusterKey {
 public:
  // Throws std::invalid_argument for an empty key: every node has one (rpc/tls.h), its user's
  // local secret when no cluster key is given.
  explicit ClusterKey(std::string key);

  // Adds the sender's id and its proof to an outgoing call.
  void sign(grpc::ClientContext& context, std::string_view sender_id, std::string_view method) const;
  // Why an incoming call is refused, or nullopt when it is accepted.
  std::optional<std::string> refusal(const grpc::ServerContext& context, std::string_view method);

  // HMAC-SHA256 of `message` under the key, as lowercase hex.
  std::string mac(std::string_view message) const;

  // This process's TLS identity under the key, made on first use (it costs a key stretch).
  const LinkSecurity& links() const;

 private:
  std::string key_;
  mutable std::once_flag links_made_;
  mutable std::unique_ptr<LinkSecurity> links_;
  std::mutex mutex_;
  std::multimap<int64_t, std::string> seen_nonces_;  // by time, pruned past the window
};

// 16 random bytes as lowercase hex, for a message that must differ from every other.
std::string fresh_nonce();

// SHA-256 of `bytes`, as lowercase hex.
std::string sha256_hex(std::span<const uint8_t> bytes);

// Milliseconds since the Unix epoch, the time signed messages carry.
int64_t unix_time_ms();
// How far a signed message's time may be from the receiver's clock.
inline constexpr int64_t kClockSkewMs = 60'000;

// The metadata value of `name` on an incoming call, empty when absent.
std::string metadata(const grpc::ServerContext& context, std::string_view name);

}  // namespace strata::rpc
