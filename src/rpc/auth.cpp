#include "rpc/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <charconv>
#include <stdexcept>

namespace strata::rpc {
namespace {

std::string hex(const unsigned char* bytes, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return out;
}

std::string signed_text(std::string_view sender, std::string_view method, std::string_view time,
                        std::string_view nonce) {
  std::string text;
  for (std::string_view part : {sender, method, time, nonce}) {
    text += part;
    text += '\n';
  }
  return text;
}

}  // namespace

ClusterKey::ClusterKey(std::string key) : key_(std::move(key)) {
  if (key_.empty()) throw std::invalid_argument("a cluster key cannot be empty");
}

std::string ClusterKey::mac(std::string_view message) const {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest, &length) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return hex(digest, length);
}

const LinkSecurity& ClusterKey::links() const {
  std::call_once(links_made_, [this] { links_ = std::make_unique<LinkSecurity>(key_); });
  return *links_;
}

void ClusterKey::sign(grpc::ClientContext& context, std::string_view sender_id, std::string_view method) const {
  context.AddMetadata("x-strata-sender", std::string(sender_id));
  const std::string nonce = fresh_nonce();
  const std::string time = std::to_string(unix_time_ms());
  context.AddMetadata("x-strata-time", time);
  context.AddMetadata("x-strata-nonce", nonce);
  context.AddMetadata("x-strata-mac", mac(signed_text(sender_id, method, time, nonce)));
}

std::optional<std::string> ClusterKey::refusal(const grpc::ServerContext& context, std::string_view method) {
  const std::string sender = metadata(context, "x-strata-sender");
  const std::string time = metadata(context, "x-strata-time");
  const std::string nonce = metadata(context, "x-strata-nonce");
  const std::string given = metadata(context, "x-strata-mac");
  if (given.empty()) return "the call carries no cluster-key proof (does the peer have --cluster-key?)";
  const std::string expected = mac(signed_text(sender, method, time, nonce));
  if (given.size() != expected.size() || CRYPTO_memcmp(given.data(), expected.data(), given.size()) != 0) {
    return "the call's cluster-key proof is wrong (the peer has another key)";
  }
  int64_t sent = 0;
  const auto [end, error] = std::from_chars(time.data(), time.data() + time.size(), sent);
  if (time.empty() || error != std::errc() || end != time.data() + time.size()) {
    return "the call's time is not a number";
  }
  const int64_t now = unix_time_ms();
  if (sent < now - kClockSkewMs || sent > now + kClockSkewMs) {
    return "the call's time is more than a minute from this node's clock";
  }
  std::lock_guard lock(mutex_);
  seen_nonces_.erase(seen_nonces_.begin(), seen_nonces_.lower_bound(now - 2 * kClockSkewMs));
  for (auto [it, end] = seen_nonces_.equal_range(sent); it != end; ++it) {
    if (it->second == nonce) return "the call is a replay";
  }
  seen_nonces_.emplace(sent, nonce);
  return std::nullopt;
}

std::string fresh_nonce() {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("no random bytes for a nonce");
  return hex(bytes, sizeof bytes);
}

std::string sha256_hex(std::span<const uint8_t> bytes) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(bytes.data(), bytes.size(), digest);
  return hex(digest, sizeof digest);
}

int64_t unix_time_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string metadata(const grpc::ServerContext& context, std::string_view name) {
  const auto& entries = context.client_metadata();
  const auto found = entries.find(grpc::string_ref(name.data(), name.size()));
  return found == entries.end() ? std::string() : std::string(found->second.data(), found->second.size());
}

}  // namespace strata::rpc
